"""The cluster launch files: shell scripts in configs/slurm parse and pass shellcheck; the sbatch script, run with stub
``scontrol``/``srun``/``curl``, starts the responder, waits for it, launches one accelerate per training node with
the right ranks and stops the responder; the accelerate configs load as accelerate reads them.

shellcheck is optional on a developer machine (the test skips without it) but required in CI: with the ``CI``
environment variable set, a missing shellcheck fails the test (``.ci/run`` installs it).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
from accelerate.commands.config.config_args import load_config_from_file

ROOT = Path(__file__).resolve().parents[1]
SLURM_DIR = ROOT / "configs" / "slurm"
ACCELERATE_DIR = ROOT / "configs" / "accelerate"
SBATCH = SLURM_DIR / "train_qwen3_4b.sbatch"


def shell_scripts() -> list[Path]:
    """Every file in configs/slurm that is a shell script (by extension or shebang)."""
    scripts = []
    for path in sorted(SLURM_DIR.iterdir()):
        if not path.is_file():
            continue
        first = path.read_text(errors="replace").split("\n", 1)[0]
        if path.suffix in {".sh", ".sbatch", ".bash"} or (first.startswith("#!") and "sh" in first):
            scripts.append(path)
    return scripts


def test_there_are_scripts():
    assert SBATCH in shell_scripts()


@pytest.mark.parametrize("script", shell_scripts(), ids=lambda p: p.name)
def test_bash_parses(script):
    proc = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


@pytest.mark.parametrize("script", shell_scripts(), ids=lambda p: p.name)
def test_shellcheck(script):
    if shutil.which("shellcheck") is None:
        message = "shellcheck is not installed (apt-get install shellcheck)"
        if os.environ.get("CI"):
            pytest.fail(f"{message}; CI must run it")
        pytest.skip(message)
    # -x follows `source configs/slurm/watch.sh` (resolved from the repository root, where the scripts run).
    proc = subprocess.run(["shellcheck", "-x", "--shell=bash", str(script)], capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout + proc.stderr


# --- the sbatch script on stub SLURM commands ----------------------------------------------------------------------

STUB_SCONTROL = """#!/usr/bin/env bash
# scontrol show hostnames LIST: the stub allocation is node1..node$STUB_NODES (3 unless told), or $STUB_HOSTNAMES
if [[ $1 == show && $2 == hostnames ]]; then
  if [[ -n ${STUB_HOSTNAMES:-} ]]; then printf '%s\n' $STUB_HOSTNAMES; else
    for i in $(seq "${STUB_NODES:-3}"); do echo "node$i"; done
  fi
fi
# scontrol requeue JOB: logged
[[ $1 == requeue ]] && echo "scontrol requeue $2" >>"$STUB_LOG"
exit 0
"""

# srun: log the request; the responder step "serves" until SIGTERM (or dies after STUB_RESPONDER_LIFE_S); the training
# step runs its command once per node of --nodelist with the SLURM_NODEID / SLURMD_NODENAME that srun would set.
STUB_SRUN = """#!/usr/bin/env bash
set -euo pipefail
child=""
trap '[[ -n $child ]] && kill $child; echo "responder stopped" >>"$STUB_LOG"; exit 0' TERM
nodelist=""
while [[ $1 == --* ]]; do
  case $1 in --nodelist=*) nodelist=${1#--nodelist=} ;; esac
  shift
done
echo "srun nodelist=$nodelist cmd=$*" >>"$STUB_LOG"
if [[ "$*" == *"vllm.entrypoints.cli.main serve"* ]]; then
  sleep "${STUB_RESPONDER_LIFE_S:-300}" & child=$!
  touch "$STUB_LOG.responder-up"
  wait $child
  echo "responder died" >>"$STUB_LOG"
  exit 1
fi
i=0
IFS=, read -ra nodes <<<"$nodelist"
for node in "${nodes[@]}"; do
  SLURM_NODEID=$i SLURMD_NODENAME=$node "$@"
  i=$((i + 1))
done
"""

# curl: answers (or not) once the stub responder is up, and only while it lives.
STUB_CURL = """#!/usr/bin/env bash
for _ in $(seq 100); do [[ -e $STUB_LOG.responder-up ]] && break; sleep 0.05; done
echo "curl $*" >>"$STUB_LOG"
[[ -z ${STUB_CURL_FAIL:-} ]] && ! grep -q "responder died" "$STUB_LOG"
"""

# accelerate: the trainer. With STUB_TRAIN_UNTIL_STOP it trains until the stop file appears, then exits as
# `memstate train` does after its checkpoint (status 2).
STUB_ACCELERATE = """#!/usr/bin/env bash
echo "accelerate $*" >>"$STUB_LOG"
if [[ -n ${STUB_TRAIN_UNTIL_STOP:-} ]]; then
  for _ in $(seq 600); do
    [[ -e $STOP_FILE ]] && { echo "trainer stopped on $STOP_FILE" >>"$STUB_LOG"; exit 2; }
    sleep 0.05
  done
  exit 9
fi
"""


def write_exe(path: Path, text: str) -> Path:
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return path


@pytest.fixture
def stub_env(tmp_path, tiny_models, fever_data):
    """SLURM, curl and accelerate stubbed; the dry run is the real `memstate train --dry-run` on the tiny policy and
    the fixture data (passed as extra train arguments, which the script hands to the dry run and to training)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    write_exe(bin_dir / "scontrol", STUB_SCONTROL)
    write_exe(bin_dir / "srun", STUB_SRUN)
    write_exe(bin_dir / "curl", STUB_CURL)
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    write_exe(venv / "bin" / "accelerate", STUB_ACCELERATE)
    write_exe(venv / "bin" / "python", "#!/usr/bin/env bash\n")
    write_exe(venv / "bin" / "memstate", f'#!/usr/bin/env bash\nexec "{sys.executable}" -m memstate.cli "$@"\n')
    log = tmp_path / "stub.log"
    env = {
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "HOME": str(tmp_path),
        "STUB_LOG": str(log),
        "SLURM_SUBMIT_DIR": str(ROOT),
        "SLURM_JOB_ID": "42",
        "SLURM_JOB_NODELIST": "node[1-3]",
        "SLURM_CPUS_PER_TASK": "64",
        "VENV": str(venv),
        "LOG_DIR": str(tmp_path / "logs"),
        "HF_HOME": str(tmp_path / "hf"),
        "HF_HUB_OFFLINE": "1",
        "MONITOR_INTERVAL_S": "0.2",
    }
    # The nodes are offline (the scripts' default): the responder's Hub id resolves from HF_HOME's cache, laid out as
    # huggingface_hub lays out a download (refs/main -> snapshots/<commit>/), its files copied from the tiny responder
    cache_hub_model(Path(env["HF_HOME"]), "Qwen/Qwen3-8B", tiny_models["responder"])
    # Every baseline the run needs is in its cache already (as a served Qwen3-8B gave them): nothing to precompute.
    cache = tmp_path / "baselines.sqlite"
    fill_cache(cache, fever_data, "Qwen/Qwen3-8B|{}")
    tiny = ("--policy_model", str(tiny_models["policy"]), "--data_dir", str(fever_data), "--baseline_cache", str(cache))
    return env, log, tiny


def fill_cache(path: Path, data_dir: Path, responder: str) -> None:
    from memstate.data import load_split
    from memstate.reward.cache import BaselineCache, CacheKey
    from memstate.reward.responder_score import Judgement

    cache = BaselineCache(path)
    instances = [*load_split(data_dir, "train"), *load_split(data_dir, "validation")]
    cache.put_many(
        {CacheKey(inst.id, inst.id, responder, "v", "likelihood"): Judgement(0.5, True) for inst in instances}
    )
    cache.close(self_contained=True)


def cache_hub_model(hf_home: Path, repo_id: str, files: Path) -> Path:
    commit = "0" * 40
    repo = hf_home / "hub" / f"models--{repo_id.replace('/', '--')}"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(commit)
    shutil.copytree(files, repo / "snapshots" / commit)
    return repo


def test_a_model_missing_from_the_offline_cache_is_refused_before_anything_starts(stub_env):
    env, log, tiny = stub_env
    shutil.rmtree(Path(env["HF_HOME"]) / "hub")
    proc = run_sbatch(env, *tiny)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    error = proc.stderr.strip().splitlines()
    assert len(error) == 1 and "HF_HUB_OFFLINE is set and responder Qwen/Qwen3-8B is not in" in error[0], error
    assert "huggingface-cli download Qwen/Qwen3-8B" in error[0]
    assert not log.exists() or "srun" not in log.read_text(), "nothing may start"


def run_sbatch(env: dict, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(SBATCH), *args], env=env, capture_output=True, text=True, timeout=timeout)


# accelerate for the first-day test: the real trainer, in one process (the launcher's own flags dropped).
REAL_TRAINER = """#!/usr/bin/env bash
echo "accelerate $*" >>"$STUB_LOG"
while [[ $# -gt 0 && $1 != -m ]]; do shift; done
shift
exec "$STUB_PYTHON" -m "$@"
"""


def test_the_first_day_of_a_run_with_the_real_trainer(stub_env, tmp_path):
    """The first day on stub SLURM with the real trainer and a vLLM-compatible responder: no baseline cache -> the
    launch fills it once the responder is up and training runs to its end; a save cut off, the job resubmitted ->
    --resume auto sets the broken checkpoint aside and continues from the last complete one; the responder then
    hangs (accepts connections, never answers) -> the run checkpoints and stops within the round budget, exit 3,
    stopped.json naming the cause."""
    from fake_openai_server import FaultyOpenAIServer

    env, log, tiny = stub_env
    write_exe(Path(env["VENV"]) / "bin" / "accelerate", REAL_TRAINER)
    cache_hub_model(Path(env["HF_HOME"]), "fake-responder", Path(tiny[1]).parent / "responder")
    run, cache = tmp_path / "run", tmp_path / "shared" / "baselines.sqlite"
    args = [*tiny[: tiny.index("--baseline_cache")], "--baseline_cache", str(cache), "--output_dir", str(run),
            "--baseline_cache_local_dir", str(tmp_path / "node-local"),
            "--save_steps", "1", "--logging_steps", "1", "--report_to", "none", "--eval_strategy", "no",
            "--responder_timeout", "30", "--responder_max_retries", "1", "--responder_deadline", "30",
            "--responder_round_deadline", "3", "--shared_prefix_check", "off",
            # enough warm-up for most states to pass the format gate, so rounds need the responder
            "--format_warmup_steps", "20", "--format_warmup_lr_scheduler_type", "constant",
            "--temperature", "0.7"]  # fmt: skip
    with FaultyOpenAIServer() as server:
        env |= {"STUB_HOSTNAMES": "127.0.0.1 node2", "GPUS_PER_NODE": "1", "RESPONDER_PORT": str(server.port),
                "RESPONDER_MODEL": "fake-responder", "TRAIN_CONFIG": "configs/train/tiny_cpu.yaml",
                "STUB_PYTHON": sys.executable, "WANDB_MODE": "disabled"}  # fmt: skip
        day = run_sbatch(env, *args, "--max_steps", "3", timeout=300)
        assert day.returncode == 0, day.stdout[-3000:] + day.stderr[-3000:]
        # the dry run counted them, the batch host scored them once /health answered, then training started
        out = day.stdout
        total = int(re.search(r"^baseline_cache_missing +(\d+)$", out, re.M)[1])
        assert out.index("responder healthy") < out.index(f"baseline_cache lacks {total} baselines: precomputing")
        assert f'"instances": {total}, "scored": {total}' in out and total > 100
        assert cache.is_file() and not list(cache.parent.glob("*-wal")) and not list(cache.parent.glob(".*part"))
        assert not list((tmp_path / "node-local").glob("*.sqlite")), "the node-local copy is removed"
        assert (run / "final" / "memstate.json").is_file() and (run / "checkpoint-3" / "trainer_state.json").is_file()
        # The job was killed while saving step 3: its weights are there, trainer_state.json is not.
        (run / "checkpoint-3" / "trainer_state.json").unlink()
        complete = max(int(p.parent.name.split("-")[1]) for p in run.glob("checkpoint-*/trainer_state.json"))
        env |= {"LOG_DIR": str(tmp_path / "logs-2")}
        proc = subprocess.Popen(["bash", str(SBATCH), *args, "--max_steps", "8"], env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)  # fmt: skip
        deadline = time.monotonic() + 240
        while not (run / "checkpoint-4" / "trainer_state.json").is_file():  # resumed, and a step past it done
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
            time.sleep(0.1)
        server.stall, server.stall_s = 1.0, 600.0  # hung: connections accepted, no reply
        hung = time.monotonic()
        out, err = proc.communicate(timeout=240)
        stopped_within = time.monotonic() - hung
    assert proc.returncode == 3, out[-3000:] + err[-3000:]
    assert re.search(r"^baseline_cache_missing +0$", out, re.M) and "precomputing" not in out  # filled on day one
    assert (run / "incomplete-checkpoint-3" / "model.safetensors").is_file()  # set aside, not resumed from
    assert re.search(rf"^resume +from {re.escape(str(run / f'checkpoint-{complete}'))},", out, re.M), out[:3000]
    assert stopped_within < 60, stopped_within  # the round's 3 s budget, not 30 s per request and pass
    stopped = json.loads((run / "stopped.json").read_text())
    assert "3 s round deadline" in stopped["reason"] and stopped["step"] >= 4, stopped
    assert (run / f"checkpoint-{stopped['step']}" / "trainer_state.json").is_file()


def test_a_job_resubmitted_on_another_node_count_is_refused_before_anything_starts(stub_env, tmp_path):
    """The run's last checkpoint was saved by 2 training nodes (16 processes, ZeRO-3): the same job on 4 training nodes
    is refused by the dry run in one line naming both ways on; on 2 it continues from it (--resume auto)."""
    from memstate.checkpoint import CheckpointMetadata

    env, log, tiny = stub_env
    run = tmp_path / "run"
    checkpoint = run / "checkpoint-50"
    checkpoint.mkdir(parents=True)
    (checkpoint / "trainer_state.json").write_text("{}")
    CheckpointMetadata("v", "p", "Qwen/Qwen3-8B", "likelihood", 8192, 512, "data", world_size=16,
                       zero_stage=3).write(checkpoint)  # fmt: skip
    args = [*tiny, "--output_dir", str(run)]
    refused = run_sbatch(env | {"STUB_NODES": "5"}, *args)
    assert refused.returncode == 2, refused.stdout + refused.stderr
    error = refused.stderr.strip().splitlines()
    assert len(error) == 1 and "saved by 16 processes under DeepSpeed ZeRO-3, this launch has 32" in error[0], error
    assert f"--policy_model {checkpoint} --output_dir" in error[0]
    assert not log.exists() or "srun" not in log.read_text(), "nothing may start"
    resumed = run_sbatch(env, *args)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert f"resume                                from {checkpoint}, saved by 16 processes" in resumed.stdout


def test_sbatch_starts_the_responder_then_one_accelerate_per_training_node(stub_env, tmp_path):
    env, log, tiny = stub_env
    proc = run_sbatch(env, "--max_steps", "7", *tiny)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "gradient_accumulation_steps           4" in proc.stdout  # the dry run's arithmetic, in the job log
    lines = log.read_text().splitlines()
    responder = next(line for line in lines if "vllm.entrypoints.cli.main serve" in line)
    assert "nodelist=node1 " in responder and "serve Qwen/Qwen3-8B " in responder and "--port 8000" in responder
    assert "--data-parallel-size 8 --api-server-count 8 " in responder
    assert any(line.startswith("curl") and "http://node1:8000/health" in line for line in lines)
    launches = [line for line in lines if line.startswith("accelerate launch")]
    assert len(launches) == 2, lines
    stop_file = tmp_path / "logs" / "stop-requested"
    for rank, line in enumerate(launches):
        assert f"--machine_rank {rank} " in line
        assert "--num_machines 2 --num_processes 16 " in line
        assert "--main_process_ip node2 --main_process_port 29500 " in line
        assert "--config_file configs/accelerate/zero3_multinode.yaml " in line
        assert "-m memstate.cli train --config configs/train/qwen3_4b_8gpu.yaml " in line
        assert line.endswith(
            f"--responder_url http://node1:8000 --responder_model Qwen/Qwen3-8B --stop_file {stop_file} "
            f"--resume auto --max_steps 7 {' '.join(tiny)}"
        )
    # The responder is stopped after training, by the EXIT trap.
    assert lines[-1] == "responder stopped", lines


def test_sbatch_arithmetic_for_2_to_9_nodes(stub_env, tmp_path):
    """1 responder node + (nodes - 1) training nodes of 8 GPUs: 1, 2, 4 or 8 training nodes keep 1,024 completions per
    optimizer step (accumulation 8/n); any other count is refused by the dry run before the responder starts. The
    eight allocations run at once (each is mostly a dry run's imports)."""
    env, _, tiny = stub_env
    runs = {}
    for nodes in range(2, 10):
        log = tmp_path / f"stub-{nodes}.log"
        run_env = env | {"STUB_NODES": str(nodes), "STUB_LOG": str(log), "LOG_DIR": str(tmp_path / f"logs-{nodes}")}
        proc = subprocess.Popen(["bash", str(SBATCH), *tiny], env=run_env, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)  # fmt: skip
        runs[nodes] = (proc, log)
    for nodes, (proc, log) in runs.items():
        out, err = proc.communicate(timeout=300)
        training = nodes - 1
        lines = log.read_text().splitlines() if log.exists() else []
        if training in (1, 2, 4, 8):
            assert proc.returncode == 0, (nodes, out + err)
            assert f"gradient_accumulation_steps           {8 // training}\n" in out, nodes
            assert "completions_per_optimizer_step        1024\n" in out, nodes
            launches = [line for line in lines if line.startswith("accelerate launch")]
            assert len(launches) == training, (nodes, lines)
            assert all(f"--num_machines {training} --num_processes {8 * training} " in line for line in launches)
        else:
            assert proc.returncode == 2, (nodes, out + err)
            error = err.strip().splitlines()
            assert len(error) == 1 and f"= {8 * training} processes" in error[0], (nodes, err)
            assert "the dry run refused the launch" in error[0], (nodes, err)
            assert "use 1, 2, 4, 8, 16, 32, 64 processes" in error[0], (nodes, err)
            assert not any("srun" in line for line in lines), f"{nodes} nodes: nothing may start"


def test_sbatch_fails_clearly_when_the_responder_never_gets_healthy(stub_env):
    env, log, tiny = stub_env
    proc = run_sbatch(env | {"STUB_CURL_FAIL": "1", "HEALTH_TIMEOUT_S": "0"}, *tiny)
    assert proc.returncode == 1
    assert "did not answer http://node1:8000/health within 0s" in proc.stderr
    lines = log.read_text().splitlines()
    assert not any(line.startswith("accelerate") for line in lines), "training must not start"
    assert lines[-1] == "responder stopped", lines


def test_sbatch_stops_training_with_a_checkpoint_when_the_responder_dies(stub_env, tmp_path):
    env, log, tiny = stub_env
    env |= {"STUB_RESPONDER_LIFE_S": "2", "STUB_TRAIN_UNTIL_STOP": "1"}
    proc = run_sbatch(env, *tiny)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "the responder is gone" in proc.stderr and "asking the trainer to checkpoint and stop" in proc.stderr
    # The grace is the dry run's stop_grace_s: the production config's 900 s round deadline + 900 s step and save
    assert "stop_grace_s                          1800\n" in proc.stdout and "(up to 1800s)" in proc.stderr
    lines = log.read_text().splitlines()
    assert f"trainer stopped on {tmp_path / 'logs' / 'stop-requested'}" in lines
    assert not any("requeue" in line for line in lines), "only the time limit requeues"


@pytest.mark.parametrize("requeue", ["1", "0"])
def test_sbatch_checkpoints_before_the_time_limit_and_requeues(stub_env, requeue):
    """SLURM's pre-time-limit signal (#SBATCH --signal=B:USR1@...) reaches the script: the trainer is asked to
    checkpoint and stop; then the job requeues itself (the next run continues: --resume auto), or with REQUEUE=0
    ends with the trainer's status and a pointer to --resume."""
    env, log, tiny = stub_env
    proc = subprocess.Popen(["bash", str(SBATCH), *tiny], env=env | {"STUB_TRAIN_UNTIL_STOP": "1", "REQUEUE": requeue},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
    deadline = time.monotonic() + 90
    while not (log.exists() and "accelerate launch" in log.read_text()):
        assert time.monotonic() < deadline and proc.poll() is None, proc.communicate()
        time.sleep(0.1)
    proc.send_signal(signal.SIGUSR1)
    out, err = proc.communicate(timeout=60)
    lines = log.read_text().splitlines()
    assert "time limit near" in out and any(line.startswith("trainer stopped on") for line in lines)
    if requeue == "1":
        assert proc.returncode == 0, out + err
        assert "scontrol requeue 42" in lines and "job 42 requeued" in err
    else:
        assert proc.returncode == 2, out + err
        assert "--resume continues" in err and not any("requeue" in line for line in lines)


def test_sbatch_needs_two_nodes(stub_env):
    env, _, tiny = stub_env
    proc = run_sbatch(env | {"STUB_NODES": "1"}, *tiny)
    assert proc.returncode == 2 and "need at least 2 nodes" in proc.stderr


# --- accelerate configs ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("path", sorted(ACCELERATE_DIR.glob("*.yaml")), ids=lambda p: p.name)
def test_accelerate_config_loads(path):
    """accelerate's own loader (unknown keys are errors); the fields the training setup relies on."""
    config = load_config_from_file(str(path))
    ds = config.deepspeed_config
    assert config.distributed_type == "DEEPSPEED"
    # Left to the training YAML: a literal value that differs from it is a Trainer mismatch error.
    assert ds["gradient_accumulation_steps"] == "auto" and ds["gradient_clipping"] == "auto"
    assert ds["offload_optimizer_device"] == "none" and ds["offload_param_device"] == "none"
    if ds["zero_stage"] == 3:
        assert ds["zero3_save_16bit_model"] is True  # a consolidated final/ for vLLM
        assert ds["zero3_init_flag"] is True
    if config.use_cpu:
        assert config.mixed_precision == "no" and config.num_processes == 2 and ds["zero_stage"] == 2
    else:
        assert config.mixed_precision == "bf16"
    if config.num_machines > 1:
        assert ds["deepspeed_multinode_launcher"] == "standard"  # torchrun per node, no pdsh/ssh


def test_deepspeed_json_for_torchrun():
    """configs/accelerate/deepspeed_zero3.json (torchrun --deepspeed): ZeRO-3 as in the YAML configs."""
    config = json.loads((ACCELERATE_DIR / "deepspeed_zero3.json").read_text())
    zero = config["zero_optimization"]
    assert zero["stage"] == 3 and zero["stage3_gather_16bit_weights_on_model_save"] is True
    assert zero["offload_optimizer"]["device"] == "none" and zero["offload_param"]["device"] == "none"
    auto = ("gradient_accumulation_steps", "gradient_clipping", "train_batch_size", "train_micro_batch_size_per_gpu")
    for key in auto:
        assert config[key] == "auto", key
    assert config["bf16"]["enabled"] == "auto"


# --- the one-node recipe ----------------------------------------------------------------------------------------------

ONE_NODE = SLURM_DIR / "train_1node.sh"

STUB_VLLM_PYTHON = """#!/usr/bin/env bash
echo "responder CUDA_VISIBLE_DEVICES=$CUDA_VISIBLE_DEVICES cmd=$*" >>"$STUB_LOG"
trap 'echo "responder stopped" >>"$STUB_LOG"; exit 0' TERM
touch "$STUB_LOG.responder-up"
sleep 300 & wait $!
"""


@pytest.fixture
def one_node_env(stub_env):
    env, log, tiny = stub_env
    venv = Path(env["VENV"])
    write_exe(venv / "bin" / "python", STUB_VLLM_PYTHON)
    stub_accelerate = 'echo "accelerate CUDA_VISIBLE_DEVICES=$CUDA_VISIBLE_DEVICES $*" >>"$STUB_LOG"\n'
    write_exe(venv / "bin" / "accelerate", stub_accelerate)
    return env, log, tiny


def test_one_node_recipe_splits_the_gpus_between_training_and_the_responder(one_node_env):
    env, log, tiny = one_node_env
    proc = subprocess.run(["bash", str(ONE_NODE), *tiny], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    # The dry run for 4 training processes keeps 1,024 completions per step with 16 accumulation steps.
    assert "gradient_accumulation_steps           16\n" in proc.stdout
    assert "completions_per_optimizer_step        1024\n" in proc.stdout
    lines = log.read_text().splitlines()
    responder = next(line for line in lines if line.startswith("responder CUDA"))
    assert responder.startswith("responder CUDA_VISIBLE_DEVICES=4,5,6,7 cmd=-m vllm.entrypoints.cli.main serve")
    assert "--host 127.0.0.1 --port 8000 --data-parallel-size 4 --api-server-count 4 " in responder
    launch = next(line for line in lines if line.startswith("accelerate"))
    assert launch.startswith("accelerate CUDA_VISIBLE_DEVICES=0,1,2,3 launch")
    assert "--num_machines 1 --num_processes 4 " in launch
    assert "--responder_url http://127.0.0.1:8000 --responder_model Qwen/Qwen3-8B --stop_file " in launch
    assert lines[-1] == "responder stopped", lines


def test_one_node_split_that_does_not_divide_is_refused_before_anything_starts(one_node_env):
    env, log, tiny = one_node_env
    env = env | {"TRAIN_GPUS": "0,1,2,3,4,5", "RESPONDER_GPUS": "6,7"}
    proc = subprocess.run(["bash", str(ONE_NODE), *tiny], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    error = proc.stderr.strip().splitlines()
    assert len(error) == 1 and "refused the launch on 6 training GPUs (0,1,2,3,4,5)" in error[0]
    assert "96 completions per micro-batch do not divide completions_per_step 1024" in error[0]
    assert not log.exists() or "responder" not in log.read_text()
