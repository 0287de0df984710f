"""The cluster launch files: shell scripts in configs/slurm parse and pass shellcheck; the sbatch script, run with stub
``scontrol``/``srun``/``curl``, starts the responder, waits for it, launches one accelerate per training node with
the right ranks and stops the responder; the accelerate configs load as accelerate reads them.

shellcheck is optional on a developer machine (the test skips without it) but required in CI: with the ``CI``
environment variable set, a missing shellcheck fails the test (``.ci/run`` installs it).
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
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
    proc = subprocess.run(["shellcheck", "--shell=bash", str(script)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


# --- a dry run of the sbatch script on stub SLURM commands ----------------------------------------------------------

STUB_SCONTROL = """#!/usr/bin/env bash
# scontrol show hostnames LIST: the stub allocation is always node1..node3
[[ $1 == show && $2 == hostnames ]] && printf 'node1\\nnode2\\nnode3\\n'
"""

# srun: log the request; the responder step "serves" until SIGTERM; the training step runs its command once per node
# of --nodelist with the SLURM_NODEID / SLURMD_NODENAME that srun would set.
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
if [[ "$*" == *vllm.entrypoints.openai.api_server* ]]; then
  sleep 300 & child=$!
  touch "$STUB_LOG.responder-up"
  wait $child
  exit 0
fi
i=0
IFS=, read -ra nodes <<<"$nodelist"
for node in "${nodes[@]}"; do
  SLURM_NODEID=$i SLURMD_NODENAME=$node "$@"
  i=$((i + 1))
done
"""

# curl: answers (or not) once the stub responder is up, so the SIGTERM of the script's trap always finds it serving.
STUB_CURL = """#!/usr/bin/env bash
for _ in $(seq 100); do [[ -e $STUB_LOG.responder-up ]] && break; sleep 0.05; done
echo "curl $*" >>"$STUB_LOG"
[[ -z ${STUB_CURL_FAIL:-} ]]
"""

STUB_ACCELERATE = """#!/usr/bin/env bash
echo "accelerate $*" >>"$STUB_LOG"
"""


def write_exe(path: Path, text: str) -> Path:
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return path


@pytest.fixture
def stub_env(tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    write_exe(bin_dir / "scontrol", STUB_SCONTROL)
    write_exe(bin_dir / "srun", STUB_SRUN)
    write_exe(bin_dir / "curl", STUB_CURL)
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    write_exe(venv / "bin" / "accelerate", STUB_ACCELERATE)
    write_exe(venv / "bin" / "python", "#!/usr/bin/env bash\n")
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
    }
    return env, log


def run_sbatch(env: dict, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(SBATCH), *args], env=env, capture_output=True, text=True, timeout=60)


def test_sbatch_dry_run(stub_env):
    env, log = stub_env
    proc = run_sbatch(env, "--max_steps", "7")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = log.read_text().splitlines()
    responder = next(line for line in lines if "vllm.entrypoints.openai.api_server" in line)
    assert "nodelist=node1 " in responder and "--model Qwen/Qwen3-8B" in responder and "--port 8000" in responder
    assert any(line.startswith("curl") and "http://node1:8000/health" in line for line in lines)
    launches = [line for line in lines if line.startswith("accelerate launch")]
    assert len(launches) == 2, lines
    for rank, line in enumerate(launches):
        assert f"--machine_rank {rank} " in line
        assert "--num_machines 2 --num_processes 16 " in line
        assert "--main_process_ip node2 --main_process_port 29500 " in line
        assert "--config_file configs/accelerate/zero3_multinode.yaml " in line
        assert "-m memstate.cli train --config configs/train/qwen3_4b_8gpu.yaml " in line
        assert line.endswith("--responder_url http://node1:8000 --responder_model Qwen/Qwen3-8B --max_steps 7")
    # The responder is stopped after training, by the EXIT trap.
    assert lines[-1] == "responder stopped", lines


def test_sbatch_fails_clearly_when_the_responder_never_gets_healthy(stub_env):
    env, log = stub_env
    proc = run_sbatch(env | {"STUB_CURL_FAIL": "1", "HEALTH_TIMEOUT_S": "0"})
    assert proc.returncode == 1
    assert "did not answer http://node1:8000/health within 0s" in proc.stderr
    lines = log.read_text().splitlines()
    assert not any(line.startswith("accelerate") for line in lines), "training must not start"
    assert lines[-1] == "responder stopped", lines


def test_sbatch_needs_two_nodes(stub_env, tmp_path):
    env, _ = stub_env
    write_exe(Path(env["PATH"].split(":")[0]) / "scontrol", "#!/usr/bin/env bash\necho node1\n")
    proc = run_sbatch(env)
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
