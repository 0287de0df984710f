"""The SQLite baseline cache shared by several processes (one per training rank)."""

import multiprocessing as mp

from reward.cache import BaselineCache
from reward.judge import Judgement


def _writer(path: str, worker: int, n: int) -> None:
    cache = BaselineCache(path)
    for start in range(0, n, 50):  # overlapping keys: every worker writes the shared ones too
        batch = {
            (f"shared-{i}", "resp", "v1", "likelihood"): Judgement(0.5, True, "A") for i in range(start, start + 50)
        }
        batch |= {(f"w{worker}-{i}", "resp", "v1", "likelihood"): Judgement(0.1 * worker, None) for i in range(50)}
        cache.put_many(batch)
        cache.get_many(list(batch))
    cache.close()


def test_concurrent_processes_share_one_cache(tmp_path):
    path = str(tmp_path / "baselines.sqlite")
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=_writer, args=(path, w, 500)) for w in range(3)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=120)
    assert [p.exitcode for p in procs] == [0, 0, 0]
    cache = BaselineCache(path)
    assert len(cache) == 500 + 3 * 50
    got = cache.get_many([("shared-7", "resp", "v1", "likelihood"), ("w2-3", "resp", "v1", "likelihood")])
    assert got[("shared-7", "resp", "v1", "likelihood")] == Judgement(0.5, True, "A")
    assert got[("w2-3", "resp", "v1", "likelihood")].score == 0.2 and cache.hits == 2


def test_first_write_wins_and_misses_are_counted(tmp_path):
    cache = BaselineCache(tmp_path / "c.sqlite")
    key = ("i", "r", "v", "exact")
    cache.put_many({key: Judgement(1.0, True, "B")})
    cache.put_many({key: Judgement(0.0, False, "C")})
    assert BaselineCache(tmp_path / "c.sqlite").get_many([key])[key] == Judgement(1.0, True, "B")
    assert cache.get_many([key])[key] == Judgement(1.0, True, "B")
    assert cache.get_many([("other", "r", "v", "exact")]) == {} and cache.misses == 1
