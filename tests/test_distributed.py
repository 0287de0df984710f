"""Two processes under DeepSpeed on CPU: ``accelerate launch`` of ``memstate train`` on the tiny config.

Deselected by default (marker ``distributed``): needs DeepSpeed (``make deepspeed``); run with
``.venv/bin/python -m pytest -m distributed``. The first run JIT-compiles DeepSpeed's shared-memory communication op
(~1 min on 2 cores) into ``TORCH_EXTENSIONS_DIR``, here ``.venv/torch_extensions`` unless set: a cache per venv, since
checkouts on one machine sharing ~/.cache/torch_extensions rebuild the op for each other in turn. Later launches
take ~30 s each.

Two launches: ZeRO-2 as configured in configs/accelerate/zero2_cpu_2proc.yaml, and the same file switched to ZeRO-3
the way the GPU configs use it (zero3_init_flag, zero3_save_16bit_model): weights sharded at load, gathered at save.
What it checks is the distributed plumbing, not learning: the launch completes, checkpoint-2 and final/ hold
consolidated weights that ``from_pretrained`` loads, and two ranks took part (one RNG state per process and one ZeRO
optimizer shard per rank in the checkpoint). A third launch, LoRA under ZeRO-3, checks that the merged
export in final/ is whole (the adapters are merged onto a freshly loaded base model, not onto ZeRO-3 placeholders).
The ZeRO-2 launch also runs the format warm-up first (a first Trainer in the same processes; accelerate state is
reset between the two).
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

from memstate.data import load_split
from memstate.threads import child_thread_env

pytestmark = pytest.mark.distributed

ROOT = Path(__file__).resolve().parents[1]
ACCELERATE_CONFIG = ROOT / "configs" / "accelerate" / "zero2_cpu_2proc.yaml"
TRAIN_CONFIG = ROOT / "configs" / "train" / "tiny_cpu.yaml"
WORLD_SIZE = 2
# Launcher flags on top of the config file (accelerate's command line overrides its deepspeed_config fields).
STAGES = {
    "zero2": [],
    "zero3": ["--zero_stage", "3", "--zero3_init_flag", "true", "--zero3_save_16bit_model", "true"],
}
MAX_STEPS, SAVE_STEPS = 4, 2
TIMEOUT_S = 1200  # the first launch compiles a DeepSpeed op (~1 min on 2 cores); a launch itself is ~30 s
OUTPUT_TAIL = 15_000


def launch_command(
    stage: str, policy: Path, responder: Path, data_dir: Path, output_dir: Path, *extra: str
) -> list[str]:
    return [
        sys.executable,
        "-m",
        "accelerate.commands.launch",
        "--config_file",
        str(ACCELERATE_CONFIG),
        *STAGES[stage],
        "-m",
        "memstate.cli",
        "train",
        "--config",
        str(TRAIN_CONFIG),
        "--policy_model",
        str(policy),
        "--responder_model",
        str(responder),
        "--data_dir",
        str(data_dir),
        "--output_dir",
        str(output_dir),
        "--max_steps",
        str(MAX_STEPS),
        "--save_steps",
        str(SAVE_STEPS),
        "--eval_steps",  # validation on both ranks before every save, each its shard, gathered
        str(SAVE_STEPS),
        "--save_total_limit",
        "3",
        "--format_warmup_steps",
        "0",
        "--max_completion_length",  # the plumbing is under test: short completions keep two CPU processes quick
        "64",
        # 4 completions per process x 2 processes = 8 per step = 2 prompts x G=4: TRL needs the global generation
        # batch divisible by num_generations. Set here so the test does not depend on tiny_cpu.yaml's batch.
        "--per_device_train_batch_size",
        "4",
        "--num_generations",
        "4",
        "--logging_steps",
        "1",
        "--report_to",
        "none",
        *extra,
    ]


def launch(cmd: list[str], output_dir: Path) -> subprocess.CompletedProcess:
    if importlib.util.find_spec("deepspeed") is None:
        message = "DeepSpeed is not installed: run `make deepspeed`"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    # The ranks share this machine's cores: each gets its share of threads and OpenMP waits passively instead of
    # spinning against the other rank (accelerate exports OMP_NUM_THREADS for CPU launches itself, from the physical
    # core count; it does not touch the wait policy). Whatever the environment already sets is kept.
    env = os.environ | child_thread_env(WORLD_SIZE)
    env |= {
        "WANDB_MODE": "disabled",
        "TOKENIZERS_PARALLELISM": "false",
        "TORCH_EXTENSIONS_DIR": os.environ.get("TORCH_EXTENSIONS_DIR", str(Path(sys.prefix) / "torch_extensions")),
    }
    try:
        proc = subprocess.run(
            cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=TIMEOUT_S
        )
    except subprocess.TimeoutExpired as exc:
        output = exc.stdout.decode(errors="replace") if isinstance(exc.stdout, bytes) else (exc.stdout or "")
        pytest.fail(f"accelerate launch ran past {TIMEOUT_S} s\n$ {' '.join(cmd)}\n{output[-OUTPUT_TAIL:]}")
    (output_dir.parent / "launch.log").write_text(proc.stdout)
    return proc


@pytest.fixture(scope="module", params=sorted(STAGES))
def run(request, tiny_models, fever_data, tmp_path_factory):
    output_dir = tmp_path_factory.mktemp(f"distributed-{request.param}") / "train"
    # ZeRO-2 also runs the format warm-up (a first Trainer in the same processes) before GRPO.
    # ZeRO-3 derives its accumulation from completions_per_step (16 / (4 per process x 2 processes) = 2), so
    # DeepSpeed's batch arithmetic (filled from the Trainer's "auto" values) must agree with the rebuilt config.
    # ZeRO-3 runs the shared-prefix path's no-gradient forwards (old-policy, reference) through a FlexAttention block
    # mask, its parameters gathered per layer (on CPU the gradient pass keeps the dense mask: no flex backward).
    # ZeRO-2 also checks the shared-prefix path's gradients against TRL's on the live batch (parameters are whole).
    extra = ("--format_warmup_steps", "2", "--shared_prefix_check", "gradients") if request.param == "zero2" else (
        "--completions_per_step", "16")  # fmt: skip
    extra += ("--shared_prefix_attention", "flex") if request.param == "zero3" else ()
    cmd = launch_command(request.param, tiny_models["policy"], tiny_models["responder"], fever_data, output_dir, *extra)
    return launch(cmd, output_dir), cmd, output_dir


def explain(proc, cmd) -> str:
    return f"exit {proc.returncode}\n$ {' '.join(cmd)}\n--- output (tail) ---\n{proc.stdout[-OUTPUT_TAIL:]}"


def test_launch_completes(run):
    proc, cmd, output_dir = run
    assert proc.returncode == 0, explain(proc, cmd)
    assert f"final model: {output_dir / 'final'}" in proc.stdout, explain(proc, cmd)
    if "--shared_prefix_check" in cmd:  # the gradient check ran under DeepSpeed, and passed
        assert "shared-prefix check: gradients worst relative difference" in proc.stdout, explain(proc, cmd)
        assert "first-use check failed" not in proc.stdout, explain(proc, cmd)


def test_checkpoints_record_the_shape_a_resume_must_match(run):
    """memstate.json says which world size and ZeRO stage partitioned the optimizer (train/resume.py); the dry run
    of a resume on another process count is refused in one line before anything loads."""
    proc, cmd, output_dir = run
    stage = int(cmd[cmd.index("--zero_stage") + 1]) if "--zero_stage" in cmd else 2  # zero2_cpu_2proc.yaml's
    metadata = json.loads((output_dir / f"checkpoint-{MAX_STEPS}" / "memstate.json").read_text())
    assert (metadata["world_size"], metadata["zero_stage"]) == (WORLD_SIZE, stage), explain(proc, cmd)
    train_args = cmd[cmd.index("train") + 1 :]
    dry = [sys.executable, "-m", "memstate.cli", "train", *train_args, "--dry-run", "--resume", "auto"]
    refused = subprocess.run([*dry, "--world-size", "4"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert refused.returncode == 2, refused.stdout + refused.stderr
    assert f"saved by {WORLD_SIZE} processes under DeepSpeed ZeRO-{stage}, this launch has 4" in refused.stderr


@pytest.mark.parametrize("name", [f"checkpoint-{SAVE_STEPS}", f"checkpoint-{MAX_STEPS}", "final", "best"])
def test_saved_model_loads(run, tiny_models, name):
    proc, cmd, output_dir = run
    model_dir = output_dir / name
    assert (model_dir / "model.safetensors").is_file(), f"{model_dir}: no model.safetensors\n{explain(proc, cmd)}"
    assert (model_dir / "memstate.json").is_file(), f"{model_dir}: no memstate.json"
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    reference = AutoModelForCausalLM.from_pretrained(tiny_models["policy"]).state_dict()
    state = model.state_dict()
    # Consolidated weights: every tensor of the policy, full shape (not ZeRO placeholders), finite.
    assert state.keys() == reference.keys()
    for key, tensor in state.items():
        assert tensor.shape == reference[key].shape, key
        assert torch.isfinite(tensor).all(), key
    # And the file itself holds real tensors (a ZeRO-3 save without 16-bit gathering writes empty ones).
    assert all(t.numel() > 0 for t in load_file(model_dir / "model.safetensors").values())


def test_two_processes_took_part(run):
    proc, cmd, output_dir = run
    ckpt = output_dir / f"checkpoint-{SAVE_STEPS}"
    assert ckpt.is_dir(), explain(proc, cmd)
    # The Trainer saves one RNG state per process ...
    rng_states = sorted(p.name for p in ckpt.glob("rng_state_*.pth"))
    assert rng_states == [f"rng_state_{rank}.pth" for rank in range(WORLD_SIZE)], rng_states
    # ... and DeepSpeed one optimizer-state shard per data-parallel rank (ZeRO-2 and ZeRO-3 alike).
    tag = (ckpt / "latest").read_text().strip()
    shards = sorted(p.name for p in (ckpt / tag).glob("zero_pp_rank_*_optim_states.pt"))
    assert shards == [f"zero_pp_rank_{rank}_mp_rank_00_optim_states.pt" for rank in range(WORLD_SIZE)], shards


def test_accumulation_derived_from_completions_per_step_is_what_the_trainer_ran(run):
    proc, cmd, output_dir = run
    # ZeRO-2 keeps the YAML's accumulation (1: one round of 8 completions a step); ZeRO-3 derives 2 from 16 per step.
    accumulation = 2 if "--completions_per_step" in cmd else 1
    args = torch.load(output_dir / f"checkpoint-{SAVE_STEPS}" / "training_args.bin", weights_only=False)
    assert (args.gradient_accumulation_steps, args.steps_per_generation) == (accumulation, accumulation)
    assert args.generation_batch_size == 8 * accumulation
    metadata = json.loads((output_dir / "final" / "memstate.json").read_text())
    assert metadata["grpo_config"]["gradient_accumulation_steps"] == accumulation


def test_shared_prefix_path_ran_on_both_ranks(run):
    """The default shared-prefix log-prob path under ZeRO: its first-use check passed on both ranks (any failure on
    either turns it off on both) and every step encoded each group's prompt once."""
    proc, cmd, output_dir = run
    state = json.loads((output_dir / "shared_prefix.json").read_text())
    assert state["active"], explain(proc, cmd)
    assert state["attention"] == ("flex" if "flex" in cmd else "split")  # auto is split on CPU
    assert proc.stdout.count("shared-prefix check: log-probs mean") == WORLD_SIZE, explain(proc, cmd)
    history = json.loads((output_dir / "log_history.json").read_text())
    assert all(e["shared_prefix/token_ratio"] > 2 for e in history if "reward" in e)


def test_validation_ran_on_both_ranks_and_chose_best(run, fever_data):
    """Validation under two processes: each rank evaluated its shard of the validation split and the figures logged
    are of all of it (gathered), at every save and at the end; best/ was chosen by them."""
    proc, cmd, output_dir = run
    n_valid = len(load_split(fever_data, "validation"))
    history = json.loads((output_dir / "log_history.json").read_text())
    figures = {e["step"]: e for e in history if "eval_gain" in e}
    assert sorted(figures) == list(range(SAVE_STEPS, MAX_STEPS + 1, SAVE_STEPS)), explain(proc, cmd)
    for e in figures.values():
        # 4 states per instance; every instance counted once although each rank saw only its shard
        assert e["eval_instances"] == n_valid and e["eval_completions"] >= 4 * n_valid, e
    audit = sorted(p.name for p in (output_dir / "audit" / "validation").glob("*.parquet"))
    assert audit == [f"step-{s:06d}-rank{r}.parquet" for s in sorted(figures) for r in range(WORLD_SIZE)], audit
    best = json.loads((output_dir / "best.json").read_text())
    assert best["selected_by"] == "validation_gain"
    assert best["best"]["score"] == max(figures[int(s)]["eval_gain"] for s in best["scores"])


def test_lora_under_zero3_exports_a_merged_model(tiny_models, fever_data, tmp_path_factory):
    output_dir = tmp_path_factory.mktemp("distributed-zero3-lora") / "train"
    cmd = launch_command(
        "zero3", tiny_models["policy"], tiny_models["responder"], fever_data, output_dir, "--use_peft", "true"
    )
    proc = launch(cmd, output_dir)
    assert proc.returncode == 0, explain(proc, cmd)
    assert (output_dir / "final-adapter" / "adapter_model.safetensors").is_file()
    state = load_file(output_dir / "final" / "model.safetensors")
    reference = load_file(tiny_models["policy"] / "model.safetensors")
    empty = sorted(key for key, tensor in state.items() if tensor.numel() == 0)
    assert not empty, f"final/ holds ZeRO-3 placeholders: {empty}"
    best = load_file(output_dir / "best" / "model.safetensors")  # merged too, from the best checkpoint's adapter
    assert best.keys() == state.keys() and all(t.numel() > 0 for t in best.values())
    assert {k: t.shape for k, t in state.items() if k in reference} == {k: t.shape for k, t in reference.items()}
