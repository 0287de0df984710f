"""The baseline cache: content-addressed keys, and the SQLite file shared by processes, runs and dataset builds."""

import json
import multiprocessing as mp
import shutil
import sqlite3
from contextlib import closing
from dataclasses import replace
from pathlib import Path

import pytest

from memstate.data import SPLITS, load_split
from memstate.data_build.build import build_data, load_data_config
from memstate.prompts import responder_messages
from memstate.responders import ContinuationLogprob
from memstate.responders.local import TransformersResponder
from memstate.reward.cache import BaselineCache, CacheKey, baseline_key, request_digest
from memstate.reward.precompute import precompute_baselines
from memstate.reward.responder_score import Judgement, judge, responder_request
from memstate.schema import option_letters

TINY = Path(__file__).resolve().parents[1] / "configs" / "data" / "tiny.yaml"


def key(name: str) -> CacheKey:
    return CacheKey(request_digest({"request": name}), name, "resp", "v1", "likelihood")


def _writer(path: str, worker: int, n: int) -> None:
    cache = BaselineCache(path)
    for start in range(0, n, 50):  # overlapping keys: every worker writes the shared ones too
        batch = {key(f"shared-{i}"): Judgement(0.5, True, "A") for i in range(start, start + 50)}
        batch |= {key(f"w{worker}-{i}"): Judgement(0.1 * worker, None) for i in range(50)}
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
    got = cache.get_many([key("shared-7"), key("w2-3")])
    assert got[key("shared-7")] == Judgement(0.5, True, "A")
    assert got[key("w2-3")].score == 0.2 and cache.hits == 2


def test_first_write_wins_and_misses_are_counted(tmp_path):
    cache = BaselineCache(tmp_path / "c.sqlite")
    cache.put_many({key("i"): Judgement(1.0, True, "B")})
    cache.put_many({key("i"): Judgement(0.0, False, "C")})
    assert BaselineCache(tmp_path / "c.sqlite").get_many([key("i")])[key("i")] == Judgement(1.0, True, "B")
    assert cache.get_many([key("i")])[key("i")] == Judgement(1.0, True, "B")
    assert cache.get_many([key("other")]) == {} and cache.misses == 1


def test_lookup_is_by_digest_only(tmp_path):
    cache = BaselineCache(tmp_path / "c.sqlite")
    cache.put_many({key("i"): Judgement(0.7, True, "A")})
    same_request = key("i")._replace(instance_id="other-id", responder="label", prompt_version="v9")
    assert BaselineCache(tmp_path / "c.sqlite").get_many([same_request]) == {same_request: Judgement(0.7, True, "A")}
    assert cache.get_many([CacheKey(key("j").digest, "i", "resp", "v1", "likelihood")]) == {}


class Recorder:
    """Records what the judges send; answers with constant log-probs / text."""

    name = identity = "recorder"

    def __init__(self):
        self.sent = []

    def answer_logprob(self, prompts, continuations):
        self.sent += [{"messages": p, "continuations": c} for p, c in zip(prompts, continuations, strict=True)]
        return [[ContinuationLogprob(-1.0, 1) for _ in c] for c in continuations]

    def answer(self, prompts, max_new_tokens=32):
        self.sent += [{"messages": p, "max_new_tokens": max_new_tokens} for p in prompts]
        return ["A"] * len(prompts)


def free_text(inst):
    return replace(inst, answer_kind="free", labels=(), options=(), answer="the answer")


def test_key_request_is_what_the_judges_send(fever_train):
    for inst in (fever_train[0], free_text(fever_train[0])):
        rec = Recorder()
        judge(rec, [inst], [None], "likelihood")
        judge(rec, [inst], [None], "exact")
        likely, exact = responder_request(inst, None, "likelihood").key(), responder_request(inst, None, "exact").key()
        assert rec.sent[0] == {"messages": likely["messages"], "continuations": likely["continuations"]}
        assert rec.sent[1] == {"messages": exact["messages"], "max_new_tokens": exact["decoding"]["max_new_tokens"]}


def digest(inst, mode: str = "likelihood", identity: str = "resp") -> str:
    return baseline_key(inst, mode, identity).digest


def test_key_changes_with_the_request_and_only_with_it(fever_train):
    inst = fever_train[0]
    free = free_text(inst)
    other_label = next(label for label in inst.labels if label != inst.answer)
    changed = {
        "messages": digest(replace(inst, question=inst.question + "?")),
        "options shown and continuations": digest(replace(inst, labels=(*inst.labels, "maybe"))),
        "reference letter": digest(replace(inst, answer=other_label)),
        "mode": digest(inst, mode="exact"),
        "identity": digest(inst, identity="resp|bfloat16"),
    }
    assert all(d != digest(inst) for d in changed.values()), changed
    assert digest(replace(free, answer="another answer")) != digest(free)  # the free-text continuation
    hidden_role = replace(inst.facts[0], role="distractor" if inst.facts[0].role != "distractor" else "gold")
    same = [
        replace(inst, id="rebuilt-id"),
        replace(inst, meta={"group": "elsewhere"}),
        replace(inst, facts=(hidden_role, *inst.facts[1:])),  # roles are never shown
    ]
    assert [digest(i) for i in same] == [digest(inst)] * 3
    assert baseline_key(same[0], "likelihood", "resp").instance_id == "rebuilt-id"  # the label follows the instance


@pytest.fixture(scope="module")
def tiny_builds(tmp_path_factory) -> dict[int, Path]:
    """The tiny dataset built with seeds 0 and 1: many shared instance ids, mostly different prompts. FEVER and
    SciFact are capped (a seeded subset) to keep the responder's CPU time down; PersonaMem, whose requests partly
    survive a reseed, is whole."""
    builds = {}
    for seed in (0, 1):
        config = load_data_config(TINY, seed=seed, caps={"fever": 24, "scifact": 12})
        config.progress = False
        builds[seed] = tmp_path_factory.mktemp(f"tiny-seed{seed}")
        build_data(config, builds[seed])
    return builds


def request_bytes(inst) -> str:
    """The responder request, computed without reward.cache; the reference answer too, since it sets the score."""
    continuations = option_letters(len(inst.candidates)) if inst.candidates else [inst.answer]
    return json.dumps([responder_messages(inst, None), continuations, inst.answer], sort_keys=True)


def test_a_rebuilt_dataset_reuses_only_identical_requests(tiny_models, tiny_builds, tmp_path):
    responder = TransformersResponder(str(tiny_models["responder"]), batch_size=32)
    cache_path = str(tmp_path / "baselines.sqlite")
    old = [i for s in SPLITS for i in load_split(tiny_builds[0], s)]
    new = [i for s in SPLITS for i in load_split(tiny_builds[1], s)]
    shared_ids = {i.id for i in old} & {i.id for i in new}
    old_requests = {request_bytes(i) for i in old}
    identical = [i for i in new if request_bytes(i) in old_requests]

    first = precompute_baselines(responder, str(tiny_builds[0]), list(SPLITS), cache_path, "likelihood")
    second = precompute_baselines(responder, str(tiny_builds[1]), list(SPLITS), cache_path, "likelihood")

    assert first["cached_before"] == 0 and first["unscorable"] == second["unscorable"] == 0
    # An id-keyed cache would have served every shared id: the test tells the two apart.
    assert 0 < len(identical) < len(shared_ids)
    assert second["cached_before"] == len(identical)
    assert second["scored"] == len(new) - len(identical)
    cache = BaselineCache(cache_path)
    served = cache.get_many([baseline_key(i, "likelihood", responder.identity) for i in identical])
    fresh = judge(responder, identical, [None] * len(identical), "likelihood")
    assert len(served) == len(identical)
    assert [j.score for j in served.values()] == pytest.approx([j.score for j in fresh], abs=1e-6)
    assert [(j.correct, j.answer) for j in served.values()] == [(j.correct, j.answer) for j in fresh]
    cache.close()


def test_precompute_leaves_a_file_complete_on_its_own(fever_data, tmp_path):
    """No -wal next to it (training refuses one) and rollback-journal mode in its header, so a byte copy read with
    ``immutable=1`` (no lock, no WAL) is the whole cache; a read-write opener turns WAL on again."""
    path = tmp_path / "shared" / "baselines.sqlite"
    splits = ["train", "test"]
    counts = precompute_baselines(Recorder(), str(fever_data), splits, str(path), "likelihood", batch_size=16)
    assert counts["unscorable"] == 0 and counts["scored"] > 0
    assert sorted(p.name for p in path.parent.iterdir()) == ["baselines.sqlite"]
    assert path.read_bytes()[18:20] == b"\x01\x01"  # file format read/write versions 1: not WAL
    keys = [baseline_key(i, "likelihood", Recorder.identity) for s in splits for i in load_split(fever_data, s)]
    copy = tmp_path / "copy.sqlite"
    shutil.copyfile(path, copy)
    with closing(sqlite3.connect(f"{copy.as_uri()}?mode=ro&immutable=1", uri=True)) as db:
        assert db.execute("SELECT COUNT(*) FROM baseline_scores").fetchone()[0] == len({k.digest for k in keys})
    served = BaselineCache(copy, read_only=True)
    assert len(served.get_many(keys)) == len(keys) and served.misses == 0
    reopened = BaselineCache(path)
    assert reopened._db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    reopened.close()


def test_an_interrupted_precompute_still_leaves_no_wal(fever_data, tmp_path):
    class Failing(Recorder):
        def answer_logprob(self, prompts, continuations):
            if self.sent:
                raise RuntimeError("responder died")
            return super().answer_logprob(prompts, continuations)

    path = tmp_path / "baselines.sqlite"
    with pytest.raises(RuntimeError, match="responder died"):
        precompute_baselines(Failing(), str(fever_data), ["train"], str(path), "likelihood", batch_size=4)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["baselines.sqlite"]
    with closing(sqlite3.connect(f"{path.as_uri()}?mode=ro&immutable=1", uri=True)) as db:
        assert db.execute("SELECT COUNT(*) FROM baseline_scores").fetchone()[0] == 4  # the batch done before
