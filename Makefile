# One set-up path for the README's two commands and for CI.
# On CPU machines torch==2.13.0 (a CPU wheel) must be installed before anything that depends on torch;
# otherwise pip resolves a multi-GB CUDA build. GPU machines: `make setup TORCH_SPEC=torch` (or your CUDA build).
PYTHON ?= python3
VENV ?= .venv
TORCH_SPEC ?= torch==2.13.0
BIN := $(VENV)/bin

.PHONY: setup demo test lint

$(BIN)/memstate: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet "$(TORCH_SPEC)"
	$(BIN)/pip install --quiet -e ".[dev]"
	touch $@

setup: $(BIN)/memstate

# The main job on the embedded default: tiny random models, FEVER fixtures, GRPO on CPU, evaluation.
demo: setup
	$(BIN)/memstate tiny-models --out runs/tiny-models
	$(BIN)/memstate build-data --config configs/data/fever_fixture.yaml --out runs/data/fever_fixture
	$(BIN)/memstate train --config configs/train/tiny_cpu.yaml
	# Sampled as in training (T=1.0): under the serve default (T=0.3) the tiny policy degenerates ("the the the").
	$(BIN)/memstate eval --checkpoint runs/train/tiny_cpu --split test --temperature 1.0

test: setup
	$(BIN)/python -m pytest

lint: setup
	$(BIN)/ruff check . && $(BIN)/ruff format --check .
