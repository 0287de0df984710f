"""Thread counts and OpenMP's wait policy that follow the cores this process really has.

Call :func:`configure_threads` once at process start, before ``import torch`` where possible.

Why: the CPU torch wheel (2.13.0+cpu) parallelises with GNU OpenMP (its bundled ``torch/lib/libgomp.so.1``; MKL
runs on the same libgomp threads). Defaults, each on its own:

- torch: intra-op threads = ``OMP_NUM_THREADS`` if set, else the CPUs in the affinity mask (``at::get_num_threads``);
  inter-op pool = ``std::thread::hardware_concurrency()`` (threads that block, never spin; created lazily).
- libgomp: ``OMP_NUM_THREADS`` threads per team, and a worker that finishes its share of a parallel region spins
  ``GOMP_SPINCOUNT`` iterations (default 300,000, ~0.1–1 ms) before sleeping on a futex. The "throttled" short spin
  (1,000) only applies when libgomp's own threads outnumber the CPUs *of this process*; it cannot see a second
  process. ``OMP_WAIT_POLICY=PASSIVE`` makes the spin count 0 (sleep at once); an explicit ``GOMP_SPINCOUNT``
  overrides the policy. libgomp reads both once, when it is loaded (at ``import torch``): set later, they only
  reach child processes.
- tokenizers (Rust): a rayon pool of ``RAYON_NUM_THREADS`` threads, else ``available_parallelism()`` (affinity and
  cgroup quota, not other processes); ``TOKENIZERS_PARALLELISM`` switches it on/off, and when unset a fork after
  parallel use prints a warning and disables it in the child.

Two torch processes on 2 cores (the demo next to a test run; the 2-process DeepSpeed launch; vLLM next to the test
process) thus run 2 + 2 OpenMP threads on 2 cores; each small op ends in a barrier at which the threads that
arrived first spin while the one they wait for is descheduled behind the other process's spinners. Tiny GRPO steps
(thousands of small ops) take about 3x as long on an otherwise idle 2-core machine (more when other jobs load it;
a small LM step on 16 cores took 91x). With threads = the cores this process can count on, and passive waiting, two
processes cost about 1.5x; a lone process loses little (the figures: ``benchmarks/bench_threads.py``).

What is computed: CPUs in ``os.sched_getaffinity(0)``, capped by the cgroup CPU quota (v2 ``cpu.max``, v1
``cpu.cfs_quota_us / cpu.cfs_period_us``, rounded up), divided by the processes sharing them on this node when a
launcher says so (``LOCAL_WORLD_SIZE`` from torchrun / accelerate, or the MPI local size), at least 1. Variables the
user (or a launcher: torchrun and ``accelerate launch`` export ``OMP_NUM_THREADS``) already set are left alone.

Why not the installed libraries' own (checked 2026-12, joblib 1.6 / threadpoolctl 3.8): ``loky.cpu_count()`` (joblib)
is as fast (74 vs 166 µs, once per process) but reads only the root cgroup (``/sys/fs/cgroup/cpu.max``,
``cpu/cpu.cfs_quota_us``), so it misses a quota set on the process's own cgroup when the container has no cgroup
namespace (``systemd-run -p CPUQuota=…``, nested slices), which ``/proc/self/cgroup`` names
(``tests/test_threads.py: test_own_cgroup_tighter_than_root``). threadpoolctl limits pools after their libraries loaded
and has no wait policy; libgomp reads ``OMP_WAIT_POLICY`` only when it loads, so the variables must be set first.
"""

from __future__ import annotations

import logging
import math
import os
import sys
from collections.abc import Mapping, MutableMapping
from dataclasses import dataclass, field
from pathlib import Path

logger = logging.getLogger("memstate.threads")

CGROUP_ROOT = Path("/sys/fs/cgroup")
PROC_SELF_CGROUP = Path("/proc/self/cgroup")
# What configure_threads may export (GOMP_SPINCOUNT only read: set by the user, it overrides the wait policy).
THREAD_VARS = (
    "OMP_NUM_THREADS",
    "MKL_NUM_THREADS",
    "OMP_WAIT_POLICY",
    "GOMP_SPINCOUNT",
    "RAYON_NUM_THREADS",
    "TOKENIZERS_PARALLELISM",
)
# Launchers' "processes on this node": torchrun (accelerate launch goes through it), then MPI flavours.
LOCAL_SIZE_VARS = ("LOCAL_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS", "MV2_COMM_WORLD_LOCAL_SIZE")


@dataclass
class ThreadPlan:
    """What :func:`configure_threads` found and decided."""

    cores: int  # cores this process can count on (affinity, quota, local processes)
    affinity: int  # CPUs in the affinity mask
    quota: float | None  # cgroup CPU quota in CPUs; None: no limit
    local_processes: int  # processes sharing the cores (launcher's local world size)
    threads: int  # torch intra-op threads (OMP_NUM_THREADS if the user set it, else ``cores``)
    exported: dict[str, str] = field(default_factory=dict)  # variables this call set
    kept: dict[str, str] = field(default_factory=dict)  # variables already set, left alone
    torch_imported_before: bool = False  # libgomp already loaded: its wait policy is fixed for this process
    torch_threads: int | None = None  # torch.get_num_threads() afterwards; None without torch
    torch_interop_threads: int | None = None

    def summary(self) -> str:
        quota = "none" if self.quota is None else f"{self.quota:g}"
        return (
            f"threads: {self.threads} (affinity {self.affinity}, cgroup quota {quota}, "
            f"{self.local_processes} local process(es)); set {self.exported or '{}'}; kept {self.kept or '{}'}"
            + (
                f"; torch {self.torch_threads} intra-op / {self.torch_interop_threads} inter-op"
                if self.torch_threads
                else ""
            )
        )


def parse_cpu_max(text: str) -> float | None:
    """CPUs allowed by a cgroup v2 ``cpu.max`` ("QUOTA PERIOD", or "max PERIOD" for no limit).

    >>> parse_cpu_max("max 100000")
    >>> parse_cpu_max("150000 100000")
    1.5
    >>> parse_cpu_max("50000 100000\\n")
    0.5
    >>> parse_cpu_max("")
    """
    parts = text.split()
    if not parts or parts[0] == "max":
        return None
    period = int(parts[1]) if len(parts) > 1 else 100_000
    quota = int(parts[0])
    return quota / period if quota > 0 and period > 0 else None


def parse_cfs(quota_us: str, period_us: str) -> float | None:
    """CPUs allowed by cgroup v1 ``cpu.cfs_quota_us`` / ``cpu.cfs_period_us`` (quota -1: no limit).

    >>> parse_cfs("-1", "100000")
    >>> parse_cfs("200000", "100000")
    2.0
    >>> parse_cfs("25000\\n", "100000\\n")
    0.25
    """
    quota, period = int(quota_us), int(period_us)
    return quota / period if quota > 0 and period > 0 else None


def _read(path: Path) -> str | None:
    try:
        return path.read_text()
    except OSError:
        return None


def _cgroup_paths(proc_self_cgroup: Path) -> dict[str, str]:
    """Controller → this process's cgroup path, from ``/proc/self/cgroup`` ("" for v2's unified line)."""
    paths: dict[str, str] = {}
    for line in (_read(proc_self_cgroup) or "").splitlines():
        _, controllers, path = (line.split(":", 2) + ["", ""])[:3]
        for controller in controllers.split(",") if controllers else [""]:
            paths[controller] = path.strip()
    return paths


def cgroup_cpu_quota(root: Path = CGROUP_ROOT, proc_self_cgroup: Path = PROC_SELF_CGROUP) -> float | None:
    """The tightest CPU quota (in CPUs) found for this process under ``root``; None when there is none.

    Looks at the cgroup root (what a container sees as its own cgroup) and this process's own cgroup as named in
    ``/proc/self/cgroup``: v2 ``cpu.max``; v1 ``cpu.cfs_quota_us`` under ``cpu/``, ``cpu,cpuacct/`` or
    ``cpuacct,cpu/``.
    """
    paths = _cgroup_paths(proc_self_cgroup)
    quotas: list[float] = []
    for rel in {"", paths.get("", "").lstrip("/")}:
        text = _read(root / rel / "cpu.max")
        if text is not None and (q := parse_cpu_max(text)) is not None:
            quotas.append(q)
    for mount in ("cpu", "cpu,cpuacct", "cpuacct,cpu"):
        for rel in {"", paths.get("cpu", "").lstrip("/")}:
            quota, period = (
                _read(root / mount / rel / "cpu.cfs_quota_us"),
                _read(root / mount / rel / "cpu.cfs_period_us"),
            )
            if quota is not None and period is not None and (q := parse_cfs(quota, period)) is not None:
                quotas.append(q)
    return min(quotas, default=None)


def local_processes(env: Mapping[str, str]) -> int:
    """Processes sharing this node's cores, as the launcher exported it (1 when not launched by one).

    >>> local_processes({"LOCAL_WORLD_SIZE": "2"})
    2
    >>> local_processes({})
    1
    >>> local_processes({"LOCAL_WORLD_SIZE": "junk", "OMPI_COMM_WORLD_LOCAL_SIZE": "4"})
    4
    """
    for name in LOCAL_SIZE_VARS:
        try:
            return max(1, int(env[name]))
        except (KeyError, ValueError):
            continue
    return 1


def usable_cores(affinity: int, quota: float | None, local: int = 1) -> int:
    """Cores one process can count on: affinity capped by the quota (rounded up), shared by ``local`` processes.

    >>> usable_cores(2, None)
    2
    >>> usable_cores(8, 2.0)
    2
    >>> usable_cores(8, 1.5)
    2
    >>> usable_cores(8, None, local=2)
    4
    >>> usable_cores(2, None, local=2)
    1
    >>> usable_cores(2, 0.25, local=4)
    1
    """
    cores = affinity if quota is None else min(affinity, math.ceil(quota))
    return max(1, cores // max(1, local))


def _int_or(value: str | None, default: int) -> int:
    try:
        return max(1, int(value))  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return default


def thread_env(cores: int, env: Mapping[str, str]) -> tuple[dict[str, str], dict[str, str]]:
    """(variables to set, variables the user already set) for ``cores`` cores; ``env`` is not changed.

    A thread count the user gave in ``OMP_NUM_THREADS`` is the one the other pools follow.

    >>> thread_env(1, {})[0]
    {'OMP_NUM_THREADS': '1', 'MKL_NUM_THREADS': '1', 'OMP_WAIT_POLICY': 'PASSIVE', 'RAYON_NUM_THREADS': '1', \
'TOKENIZERS_PARALLELISM': 'false'}
    >>> new, kept = thread_env(1, {"OMP_NUM_THREADS": "4", "GOMP_SPINCOUNT": "1000"})
    >>> new
    {'MKL_NUM_THREADS': '4', 'OMP_WAIT_POLICY': 'PASSIVE', 'RAYON_NUM_THREADS': '4', 'TOKENIZERS_PARALLELISM': 'true'}
    >>> kept
    {'OMP_NUM_THREADS': '4', 'GOMP_SPINCOUNT': '1000'}
    """
    threads = _int_or(env.get("OMP_NUM_THREADS"), cores)
    wanted = {
        "OMP_NUM_THREADS": str(threads),
        "MKL_NUM_THREADS": str(threads),
        # libgomp: spin count 0, a waiting thread sleeps at once. GOMP_SPINCOUNT, when the user set it, overrides.
        "OMP_WAIT_POLICY": "PASSIVE",
        # tokenizers' rayon pool; with one core it only competes with torch, and explicitly set, the fork warning
        # goes away.
        "RAYON_NUM_THREADS": str(threads),
        "TOKENIZERS_PARALLELISM": "true" if threads > 1 else "false",
    }
    new = {k: v for k, v in wanted.items() if k not in env}
    kept = {k: env[k] for k in (*wanted, "GOMP_SPINCOUNT") if k in env}
    return new, kept


def configure_threads(
    env: MutableMapping[str, str] | None = None,
    *,
    affinity: int | None = None,
    cgroup_root: Path = CGROUP_ROOT,
    proc_self_cgroup: Path = PROC_SELF_CGROUP,
    import_torch: bool = True,
) -> ThreadPlan:
    """Set thread counts and the OpenMP wait policy for this process (and its children); return what was decided.

    ``env`` defaults to ``os.environ`` (the process's environment, inherited by children). Variables already set
    are kept. Then torch's intra-op threads are set (``torch.set_num_threads``), and its inter-op threads while
    torch still allows it: torch is imported for this when it is installed (after the variables are exported, so
    libgomp loads with them), unless ``import_torch=False``, in which case only an already imported torch is set.
    If torch was imported before this call, libgomp has already read its wait policy: the policy exported here
    reaches only child processes (logged).
    """
    env = os.environ if env is None else env
    torch_imported_before = "torch" in sys.modules
    n_affinity = affinity if affinity is not None else len(os.sched_getaffinity(0))
    quota = cgroup_cpu_quota(cgroup_root, proc_self_cgroup)
    local = local_processes(env)
    cores = usable_cores(n_affinity, quota, local)
    new, kept = thread_env(cores, env)
    env.update(new)
    plan = ThreadPlan(
        cores=cores,
        affinity=n_affinity,
        quota=quota,
        local_processes=local,
        threads=_int_or(env.get("OMP_NUM_THREADS"), cores),
        exported=new,
        kept=kept,
        torch_imported_before=torch_imported_before,
    )
    if import_torch or torch_imported_before:
        _set_torch_threads(plan)
    if torch_imported_before and "OMP_WAIT_POLICY" in new:
        logger.info("torch was imported before configure_threads(): OMP_WAIT_POLICY reaches child processes only")
    logger.debug(plan.summary())  # every command would print it; --log-level DEBUG shows it
    return plan


def child_thread_env(
    processes: int,
    env: Mapping[str, str] | None = None,
    *,
    affinity: int | None = None,
    cgroup_root: Path = CGROUP_ROOT,
    proc_self_cgroup: Path = PROC_SELF_CGROUP,
) -> dict[str, str]:
    """Variables to add to the environment of ``processes`` torch processes that will share this process's cores
    (e.g. the ranks of a launch), for those ``env`` (default ``os.environ``) does not already set.

    >>> no_cgroup = {"cgroup_root": Path("/nonexistent"), "proc_self_cgroup": Path("/nonexistent")}
    >>> child_thread_env(2, {}, affinity=2, **no_cgroup)["OMP_NUM_THREADS"]
    '1'
    >>> child_thread_env(2, {"OMP_NUM_THREADS": "2"}, affinity=8, **no_cgroup)
    {'MKL_NUM_THREADS': '2', 'OMP_WAIT_POLICY': 'PASSIVE', 'RAYON_NUM_THREADS': '2', 'TOKENIZERS_PARALLELISM': 'true'}
    """
    env = os.environ if env is None else env
    n_affinity = affinity if affinity is not None else len(os.sched_getaffinity(0))
    cores = usable_cores(n_affinity, cgroup_cpu_quota(cgroup_root, proc_self_cgroup), processes)
    return thread_env(cores, env)[0]


def _set_torch_threads(plan: ThreadPlan) -> None:
    try:
        import torch
    except ImportError:
        return
    torch.set_num_threads(plan.threads)
    try:
        torch.set_num_interop_threads(plan.threads)
    except RuntimeError:  # only once, and only before inter-op work started
        pass
    plan.torch_threads = torch.get_num_threads()
    plan.torch_interop_threads = torch.get_num_interop_threads()
