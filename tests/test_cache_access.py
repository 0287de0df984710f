"""Training's access to the baseline cache file (GitHub issue 40): read-write (SQLite WAL) only for processes of one
host on a local filesystem; otherwise a read-only node-local copy of the precomputed file, misses kept in memory."""

import hashlib
import json
import logging
import os
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from memstate.errors import ConfigError
from memstate.filesystem import Mount, network_mount
from memstate.reward.answer_flow import AnswerFlowCache
from memstate.reward.cache import (
    BaselineCache,
    CacheKey,
    choose_access,
    node_local_copy,
    open_training_cache,
    request_digest,
)
from memstate.reward.counterfactual import CounterfactualGainReward, RewardConfig
from memstate.reward.responder_score import Judgement

N_PRE = 20  # precomputed baselines
N_FLOW = 3  # precomputed answer-flow probabilities


def key(name: str) -> CacheKey:
    return CacheKey(request_digest({"request": name}), name, "resp", "v1", "likelihood")


def flow_row(name: str, p: float) -> tuple:
    return (request_digest({"flow": name}), name, "resp", True, (p, 1 - p))


def precomputed(path: Path) -> Path:
    """A cache file as precompute-baselines leaves it (plus an answer-flow table, as a read-write run adds one)."""
    cache = BaselineCache(path)
    flow = AnswerFlowCache(path)
    cache.put_many({key(f"pre-{i}"): Judgement(i / N_PRE, i % 2 == 0, "A") for i in range(N_PRE)})
    flow.put_many([flow_row(f"pre-{i}", 0.1 * i) for i in range(N_FLOW)])
    flow.close()
    cache.close(self_contained=True)
    return path


def local_mounts(*extra: str) -> Callable[[], str]:
    """An injected mount table: the root on ext4, plus ``extra`` lines."""
    return lambda: "\n".join(["/dev/sda1 / ext4 rw,relatime 0 0", *extra]) + "\n"


def fingerprint(path: Path) -> tuple:
    st = path.stat()
    return hashlib.sha256(path.read_bytes()).hexdigest(), st.st_size, st.st_mtime_ns


def side_files(path: Path) -> list[str]:
    return sorted(p.name for p in path.parent.iterdir() if p.name.startswith(path.name) and p != path)


NODE = textwrap.dedent(
    """
    import json, os, sys, time
    from pathlib import Path
    from memstate.reward.answer_flow import AnswerFlowCache
    from memstate.reward.cache import CacheKey, open_training_cache, request_digest
    from memstate.reward.responder_score import Judgement

    def key(name):
        return CacheKey(request_digest({"request": name}), name, "resp", "v1", "likelihood")

    path, node, other, barrier = sys.argv[1:5]
    Path(barrier, node).touch()  # both "nodes" open the file at the same time
    deadline = time.time() + 120
    while not Path(barrier, other).exists():
        assert time.time() < deadline, "the other node never started"
        time.sleep(0.01)
    cache = open_training_cache(path, "auto", None, world_size=2, local_world_size=1)  # two nodes, one rank each
    flow = AnswerFlowCache(cache.path, read_only=cache.read_only)  # as CounterfactualGainReward opens it
    pre = [key(f"pre-{i}") for i in range(%(n_pre)d)]
    mine = {key(f"{node}-{i}"): Judgement(0.25, None) for i in range(30)}
    out = {"read_only": cache.read_only, "copy": str(cache.path)}
    for _ in range(20):  # lookups and writes interleaved with the other node's
        out["pre_hits"] = len(cache.get_many(pre))
        missed = len(mine) - len(cache.get_many(list(mine)))
        out.setdefault("first_misses", missed)
        cache.put_many(mine)
        out["mine_after"] = len(cache.get_many(list(mine)))
        out["other"] = len(cache.get_many([key(f"{other}-{i}") for i in range(30)]))
        flow_digest = request_digest({"flow": "pre-1"})
        out["flow_hit"] = list(flow.get_many([flow_digest]).get(flow_digest, ()))
        flow.put_many([(request_digest({"flow": node}), node, "resp", True, (0.5, 0.5))])
        time.sleep(0.01)
    out["len"], out["flow_len"] = len(cache), len(flow)
    out["hits"], out["misses"] = cache.hits, cache.misses
    print(json.dumps(out))
    """
) % {"n_pre": N_PRE}


def test_two_nodes_read_one_precomputed_file_without_touching_it(tmp_path):
    shared = precomputed(tmp_path / "shared" / "baselines.sqlite")
    before, listing = fingerprint(shared), sorted(os.listdir(shared.parent))
    assert side_files(shared) == []  # precompute left the file self-contained
    barrier = tmp_path / "barrier"
    barrier.mkdir()
    procs = {}
    for node, other in (("node0", "node1"), ("node1", "node0")):
        env = {k: v for k, v in os.environ.items() if k not in ("SLURM_TMPDIR", "LOCAL_WORLD_SIZE", "LOCAL_SIZE")}
        env["TMPDIR"] = str(tmp_path / f"{node}-local")  # each node's own local disk
        procs[node] = subprocess.Popen(
            [sys.executable, "-c", NODE, str(shared), node, other, str(barrier)],
            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        assert side_files(shared) == []
    results = {}
    for node, proc in procs.items():
        out, err = proc.communicate(timeout=240)
        assert proc.returncode == 0, err[-3000:]
        results[node] = json.loads(out.strip().splitlines()[-1])
    for node, r in results.items():
        assert r["read_only"] and Path(r["copy"]).is_relative_to(tmp_path / f"{node}-local")
        assert r["pre_hits"] == N_PRE  # every precomputed baseline is served
        assert r["first_misses"] == 30 and r["mine_after"] == 30  # its own misses, kept in its memory
        assert r["other"] == 0  # the other node's misses never reach it: nothing went through the shared file
        assert r["flow_hit"] == pytest.approx([0.1, 0.9])  # the answer-flow table is read from the copy too
        assert r["len"] == N_PRE + 30 and r["flow_len"] == N_FLOW + 1
        assert r["hits"] == 20 * N_PRE + 19 * 30 + 20 * 30 and r["misses"] == 30 + 20 * 30  # counted as before
    assert fingerprint(shared) == before  # bytes and modification time
    assert sorted(os.listdir(shared.parent)) == listing and side_files(shared) == []  # no -wal, -shm, -journal


def test_a_network_filesystem_is_refused_read_write_and_copied_in_auto(tmp_path, caplog):
    shared = precomputed(tmp_path / "shared" / "baselines.sqlite")
    mounts = local_mounts(f"server:/export {shared.parent.resolve()} nfs4 rw,relatime,vers=4.2 0 0")
    assert network_mount(shared, mounts) == Mount("server:/export", str(shared.parent.resolve()), "nfs4")
    with pytest.raises(ConfigError) as refused:
        open_training_cache(shared, "read-write", tmp_path / "local", world_size=1, mount_table=mounts)
    message = str(refused.value)
    assert "network filesystem (nfs4 at" in message and "\n" not in message
    assert "copy it to node-local disk, or use baseline_cache_access: read-only" in message

    with caplog.at_level(logging.INFO, logger="memstate.reward"):
        cache = open_training_cache(shared, "auto", tmp_path / "local", world_size=1, mount_table=mounts)
    assert cache.read_only and cache.path.parent == tmp_path / "local"
    assert "read-only (auto: on a network filesystem (nfs4" in caplog.text and str(cache.path) in caplog.text
    assert len(cache.get_many([key("pre-3")])) == 1 and len(cache) == N_PRE
    cache.put_many({key("new"): Judgement(0.5, True, "B")})
    assert cache.get_many([key("new")]) and len(cache) == N_PRE + 1 and cache.hits == 2
    assert side_files(shared) == []
    # read-only needs no locks: the copy may itself sit on a network filesystem, with a warning
    remote_local = local_mounts(f"server:/scratch {(tmp_path / 'local').resolve()} lustre rw 0 0")
    with caplog.at_level(logging.INFO, logger="memstate.reward"):
        assert open_training_cache(shared, "read-only", tmp_path / "local", mount_table=remote_local).read_only
    assert "baseline_cache_local_dir" in caplog.text and "lustre" in caplog.text
    # precompute-baselines writes in WAL mode too: refused there, with the way that works
    from memstate.reward.precompute import refuse_network_filesystem

    with pytest.raises(ConfigError, match=r"on a network filesystem \(nfs4 at .*--precompute-baselines"):
        refuse_network_filesystem(shared, mounts)
    refuse_network_filesystem(tmp_path / "local" / "b.sqlite", mounts)  # node-local: fine


def test_a_single_local_process_keeps_read_write(tmp_path, caplog):
    path = tmp_path / "baselines.sqlite"  # need not exist: read-write creates it, as before
    with caplog.at_level(logging.INFO, logger="memstate.reward"):
        cache = open_training_cache(path, "auto", tmp_path / "local", world_size=1, mount_table=local_mounts())
    assert not cache.read_only and cache.path == path and "read-write" in caplog.text
    cache.put_many({key("a"): Judgement(1.0, True, "A")})
    assert len(BaselineCache(path)) == 1  # written through to the file, visible to another process
    assert not (tmp_path / "local").exists()
    assert open_training_cache(None, "read-write", world_size=8).path is None  # no file: memory, any access


def test_choose_access():
    nfs = Mount("srv:/x", "/mnt/x", "nfs4")
    assert choose_access("auto", None, 1, None, "c")[0] == "read-write"
    assert choose_access("auto", None, 2, 2, "c") == ("read-only", "auto: 2 processes")
    assert choose_access("auto", nfs, 1, 1, "c")[0] == "read-only"
    assert choose_access("read-only", None, 1, 1, "c")[0] == "read-only"
    assert choose_access("read-write", None, 8, 8, "c")[0] == "read-write"  # several processes of one node
    with pytest.raises(ConfigError, match="16 processes on 2 nodes: SQLite's WAL mode needs all processes on one"):
        choose_access("read-write", None, 16, 8, "c")
    with pytest.raises(ConfigError, match="unknown number of nodes"):
        choose_access("read-write", None, 4, None, "c")
    with pytest.raises(ConfigError, match="or use baseline_cache_access: read-only"):
        choose_access("read-write", nfs, 1, 1, "c")
    with pytest.raises(ConfigError, match="is not one of"):
        choose_access("rw", None, 1, 1, "c")


def test_an_unfinished_or_missing_source_is_refused(tmp_path):
    path = precomputed(tmp_path / "baselines.sqlite")
    writer = BaselineCache(path)  # a precompute still running: its -wal holds rows the file lacks
    writer.put_many({key("late"): Judgement(0.5, True, "A")})
    assert (tmp_path / "baselines.sqlite-wal").exists()
    with pytest.raises(ConfigError, match=r"baselines.sqlite-wal is there, so the file is not complete on its own"):
        open_training_cache(path, "read-only", tmp_path / "local")
    writer.close(self_contained=True)  # finished: the late row is in the file itself
    cache = open_training_cache(path, "read-only", tmp_path / "local")
    assert cache.get_many([key("late")]) and side_files(path) == []
    with pytest.raises(ConfigError, match="no such file; fill it first with `memstate reward precompute-baselines`"):
        open_training_cache(tmp_path / "missing.sqlite", "read-only", tmp_path / "local")


def test_the_copy_is_made_once_and_follows_the_source(tmp_path, caplog):
    path = precomputed(tmp_path / "baselines.sqlite")
    local = tmp_path / "local"
    with caplog.at_level(logging.INFO, logger="memstate.reward"):
        first = open_training_cache(path, "read-only", local)
        second = open_training_cache(path, "read-only", local)
    assert first.path == second.path and "copied now" in caplog.text and "already there" in caplog.text
    writer = BaselineCache(path)
    writer.put_many({key("added"): Judgement(0.5, True, "A")})
    writer.close(self_contained=True)
    os.utime(path, ns=(time.time_ns(), time.time_ns() + 10**9))  # a new modification time, whatever the clock
    third = open_training_cache(path, "read-only", local)
    assert third.path != first.path and third.get_many([key("added")]) and not first.get_many([key("added")])
    assert not [p for p in local.iterdir() if p.suffix == ".part"]  # no temporary copy left behind


def test_the_answer_flow_cache_follows_the_baseline_cache(tmp_path):
    class Responder:
        identity = name = "stub"

    path = precomputed(tmp_path / "baselines.sqlite")
    on = RewardConfig(answer_flow_check=True)
    ro = CounterfactualGainReward(Responder(), on, open_training_cache(path, "read-only", tmp_path / "local"))
    assert ro.answer_flow.cache.read_only and ro.answer_flow.cache.path == ro.cache.path != path
    assert len(ro.answer_flow.cache) == N_FLOW
    rw = CounterfactualGainReward(Responder(), on, BaselineCache(path))  # existing callers: unchanged
    assert not rw.answer_flow.cache.read_only and rw.answer_flow.cache.path == path
    assert CounterfactualGainReward(Responder()).answer_flow.cache.path is None


def test_a_read_only_file_without_the_answer_flow_table_serves_from_memory(tmp_path):
    path = tmp_path / "old.sqlite"
    cache = BaselineCache(path)  # no answer-flow table: written before it existed, or never with the check on
    cache.put_many({key("a"): Judgement(1.0, True, "A")})
    cache.close(self_contained=True)
    copy = open_training_cache(path, "read-only", tmp_path / "local")
    flow = AnswerFlowCache(copy.path, read_only=True)
    row = flow_row("x", 0.3)
    assert flow.get_many([row[0]]) == {} and len(flow) == 0
    flow.put_many([row])
    assert flow.get_many([row[0]]) == {row[0]: (0.3, 0.7)} and len(flow) == 1
    (tmp_path / "junk.sqlite").write_bytes(b"not a database at all" * 100)
    with pytest.raises(ConfigError, match="not a readable SQLite cache file"):
        open_training_cache(tmp_path / "junk.sqlite", "read-only", tmp_path / "local")


def test_the_ranks_of_one_node_copy_the_file_once(tmp_path):
    path = precomputed(tmp_path / "baselines.sqlite")
    barrier = threading.Barrier(4)

    def rank(_: int) -> tuple[Path, bool]:
        barrier.wait()
        return node_local_copy(path, tmp_path / "local")

    with ThreadPoolExecutor(4) as pool:  # flock excludes separate opens of the lock file, threads included
        results = list(pool.map(rank, range(4)))
    assert len({copy for copy, _ in results}) == 1 and sorted(made for _, made in results) == [False] * 3 + [True]
    assert len(BaselineCache(results[0][0], read_only=True)) == N_PRE
