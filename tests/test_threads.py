"""memstate.threads: cores from affinity, cgroup quota and local processes; the user's variables respected; and in a
fresh interpreter, torch and libgomp actually running with what was exported."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from memstate.threads import THREAD_VARS, cgroup_cpu_quota, configure_threads, usable_cores

ROOT = Path(__file__).resolve().parents[1]


def cgroup_v2(tmp_path: Path, cpu_max: str, own: str | None = None) -> tuple[Path, Path]:
    root = tmp_path / "cgroup"
    root.mkdir()
    (root / "cpu.max").write_text(cpu_max + "\n")
    proc = tmp_path / "proc-self-cgroup"
    proc.write_text("0::/\n")
    if own is not None:  # this process in a child cgroup with its own limit
        (root / "job").mkdir()
        (root / "job" / "cpu.max").write_text(own + "\n")
        proc.write_text("0::/job\n")
    return root, proc


def cgroup_v1(tmp_path: Path, quota: str, period: str = "100000", mount: str = "cpu,cpuacct") -> tuple[Path, Path]:
    root = tmp_path / "cgroup"
    (root / mount).mkdir(parents=True)
    (root / mount / "cpu.cfs_quota_us").write_text(quota + "\n")
    (root / mount / "cpu.cfs_period_us").write_text(period + "\n")
    proc = tmp_path / "proc-self-cgroup"
    proc.write_text("4:memory:/x\n2:cpu,cpuacct:/\n0::/\n")
    return root, proc


def plan(tmp_path, env, affinity, cgroup=None):
    root, proc = cgroup or (tmp_path / "none", tmp_path / "none-proc")
    return configure_threads(env, affinity=affinity, cgroup_root=root, proc_self_cgroup=proc, import_torch=False)


def test_quota_smaller_than_affinity_caps_threads(tmp_path):
    env: dict[str, str] = {}
    p = plan(tmp_path, env, affinity=16, cgroup=cgroup_v2(tmp_path, "200000 100000"))
    assert (p.quota, p.cores, p.threads) == (2.0, 2, 2)
    assert env["OMP_NUM_THREADS"] == env["MKL_NUM_THREADS"] == "2"
    assert env["OMP_WAIT_POLICY"] == "PASSIVE"


def test_fractional_quota_rounds_up(tmp_path):
    assert plan(tmp_path, {}, affinity=8, cgroup=cgroup_v2(tmp_path, "150000 100000")).cores == 2


def test_max_quota_means_affinity(tmp_path):
    p = plan(tmp_path, {}, affinity=4, cgroup=cgroup_v2(tmp_path, "max 100000"))
    assert (p.quota, p.cores) == (None, 4)


def test_own_cgroup_tighter_than_root(tmp_path):
    p = plan(tmp_path, {}, affinity=8, cgroup=cgroup_v2(tmp_path, "max 100000", own="300000 100000"))
    assert (p.quota, p.cores) == (3.0, 3)


def test_v1_files(tmp_path):
    p = plan(tmp_path, {}, affinity=8, cgroup=cgroup_v1(tmp_path, "300000"))
    assert (p.quota, p.cores) == (3.0, 3)


def test_v1_no_limit(tmp_path):
    p = plan(tmp_path, {}, affinity=8, cgroup=cgroup_v1(tmp_path, "-1", mount="cpu"))
    assert (p.quota, p.cores) == (None, 8)


def test_no_cgroup_files(tmp_path):
    assert cgroup_cpu_quota(tmp_path / "missing", tmp_path / "missing-proc") is None


def test_local_world_size_divides(tmp_path):
    env = {"LOCAL_WORLD_SIZE": "2"}
    p = plan(tmp_path, env, affinity=8)
    assert (p.local_processes, p.cores) == (2, 4)
    assert env["OMP_NUM_THREADS"] == "4"


def test_at_least_one(tmp_path):
    env = {"LOCAL_WORLD_SIZE": "4"}
    p = plan(tmp_path, env, affinity=2, cgroup=cgroup_v2(tmp_path, "10000 100000"))
    assert (p.cores, p.threads) == (1, 1)
    assert env["OMP_NUM_THREADS"] == "1"
    assert env["TOKENIZERS_PARALLELISM"] == "false"
    assert usable_cores(0, None) == 1


def test_user_env_respected(tmp_path):
    user = {
        "OMP_NUM_THREADS": "3",
        "OMP_WAIT_POLICY": "ACTIVE",
        "GOMP_SPINCOUNT": "1000",
        "TOKENIZERS_PARALLELISM": "0",
    }
    env = dict(user)
    p = plan(tmp_path, env, affinity=2)
    assert {k: env[k] for k in user} == user  # nothing the user set was changed
    assert p.threads == 3 and p.kept == user
    assert env["MKL_NUM_THREADS"] == "3"  # the other pools follow the user's count
    assert set(p.exported) == {"MKL_NUM_THREADS", "RAYON_NUM_THREADS"}


def test_exports_only_thread_variables(tmp_path):
    env: dict[str, str] = {"PATH": "/bin"}
    plan(tmp_path, env, affinity=2)
    assert set(env) - {"PATH"} <= set(THREAD_VARS)


def fresh_interpreter(code: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    base = {k: v for k, v in os.environ.items() if k not in THREAD_VARS and k != "LOCAL_WORLD_SIZE"}
    return subprocess.run(
        [sys.executable, "-c", code], env=base | env, capture_output=True, text=True, timeout=120, cwd=ROOT
    )


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs 2 CPUs to tell 1 thread from the default")
def test_fresh_interpreter_torch_and_libgomp_follow(tmp_path):
    """LOCAL_WORLD_SIZE=2 on this machine's cores: torch runs with half of them, and libgomp (which torch loads
    after configure_threads) shows the passive wait policy, i.e. spin count 0 (OMP_DISPLAY_ENV, on stderr)."""
    code = (
        "import json, os\n"
        "from memstate.threads import configure_threads\n"
        "plan = configure_threads()\n"
        "import torch\n"
        "print(json.dumps({'torch': torch.get_num_threads(), 'threads': plan.threads,"
        " 'env': {k: os.environ.get(k) for k in ('OMP_NUM_THREADS', 'OMP_WAIT_POLICY', 'TOKENIZERS_PARALLELISM')}}))\n"
    )
    proc = fresh_interpreter(code, {"LOCAL_WORLD_SIZE": "2", "OMP_DISPLAY_ENV": "VERBOSE"})
    assert proc.returncode == 0, proc.stderr
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    expected = max(1, len(os.sched_getaffinity(0)) // 2)
    assert got["torch"] == got["threads"] == expected
    assert got["env"]["OMP_NUM_THREADS"] == str(expected)
    assert got["env"]["OMP_WAIT_POLICY"] == "PASSIVE"
    assert "GOMP_SPINCOUNT = '0'" in proc.stderr, proc.stderr[-2000:]


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs 2 CPUs to tell 1 thread from the default")
def test_fresh_interpreter_torch_imported_first():
    """torch already imported (with all cores): its thread count is still brought down."""
    code = (
        "import torch\n"
        "before = torch.get_num_threads()\n"
        "from memstate.threads import configure_threads\n"
        "plan = configure_threads()\n"
        "print(before, torch.get_num_threads(), plan.threads, plan.torch_imported_before)\n"
    )
    n = len(os.sched_getaffinity(0))
    proc = fresh_interpreter(code, {"LOCAL_WORLD_SIZE": str(n)})
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == [str(n), "1", "1", "True"]
