"""Crash safety: a process ingesting sessions is SIGKILLed — between two sessions, and inside a session's write
transaction — and the reopened store holds exactly the committed sessions, whole, and nothing of the one in flight:
facts, their vectors and their lexical (FTS5) index entries alike."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from memstate.memory import HashEmbedder, MemoryStore, RuleExtractor, Turn, retrieve

ROOT = Path(__file__).resolve().parents[1]
SESSIONS = 6
FACTS_PER_SESSION = 3

CHILD = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    from memstate.memory import HashEmbedder, MemoryStore, RuleExtractor, Turn

    path, ready, mode = sys.argv[1], Path(sys.argv[2]), sys.argv[3]
    stop_after, sessions, per = map(int, sys.argv[4:7])
    store = MemoryStore(path, HashEmbedder(64))
    in_flight = [0]

    def trace(sql):
        # Inside the transaction of session stop_after + 1, after its facts were written, before COMMIT.
        if mode == "mid" and in_flight[0] == stop_after + 1 and sql.startswith("INSERT INTO relations"):
            signal_parent("mid")
            time.sleep(120)

    def word(n, i):  # a made-up word per fact, so no two facts share a topic unless meant to
        return "".join("bcdfghjklm"[int(c)] for c in f"{n:02d}{i}") + "ux"

    def words(n, i):  # four topic words of fact i alone
        return " ".join(word(n, i) + end for end in ("", "a", "e", "o"))

    def signal_parent(text):  # whole or not at all: the parent reads the file as soon as it exists
        tmp = ready.with_name(ready.name + ".tmp")
        tmp.write_text(text)
        tmp.rename(ready)

    store._db.set_trace_callback(trace)
    for n in range(sessions):
        if mode == "between" and n == stop_after:
            signal_parent("between")
            time.sleep(120)
        in_flight[0] = n + 1
        turns = [Turn("user", f"I love {words(n, i)}.") for i in range(per)]
        # supersedes fact 0: a stated change about the same thing (its 4 topic words, memory/relation_rule.py)
        turns.append(Turn("user", f"These days I prefer {words(n, 0)} {word(n, 9)}."))
        store.ingest_session(turns, RuleExtractor(), session_id=f"s{n}")
    signal_parent("done")
    """
)


def run_and_kill(tmp_path: Path, mode: str, stop_after: int) -> Path:
    path, ready = tmp_path / "crash.db", tmp_path / "ready"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(
        [
            sys.executable,
            "-c",
            CHILD,
            str(path),
            str(ready),
            mode,
            *map(str, (stop_after, SESSIONS, FACTS_PER_SESSION)),
        ],
        cwd=ROOT,
        env=env,
    )
    try:
        deadline = time.monotonic() + 60
        while not ready.exists():
            assert proc.poll() is None, f"child exited early with {proc.returncode}"
            assert time.monotonic() < deadline, "child never signalled"
            time.sleep(0.02)
        assert ready.read_text() == mode
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.kill()
        proc.wait()
    assert proc.returncode == -signal.SIGKILL
    return path


@pytest.mark.parametrize("mode", ["between", "mid"])
def test_killed_ingest_leaves_only_whole_sessions(tmp_path, mode):
    committed = 3
    path = run_and_kill(tmp_path, mode, committed)
    with MemoryStore(path) as store:
        assert store.sessions() == [f"s{n}" for n in range(committed)]
        facts = store.facts()
        # Each session: FACTS_PER_SESSION preferences + one update superseding one of them.
        assert len(facts) == committed * (FACTS_PER_SESSION + 1) == len(store)
        assert {f.session for f in facts} == set(store.sessions())
        assert len(store.relations()) == committed
        with sqlite3.connect(path) as db:
            assert db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
            assert db.execute("SELECT COUNT(*) FROM fact_vectors").fetchone()[0] == len(facts)
            orphans = db.execute("SELECT COUNT(*) FROM concept_facts WHERE fact NOT IN (SELECT num FROM facts)")
            assert orphans.fetchone()[0] == 0
            # the lexical index holds one entry per committed fact and agrees with the facts' texts
            assert db.execute("SELECT COUNT(*) FROM facts_fts_docsize").fetchone()[0] == len(facts)
            db.execute("INSERT INTO facts_fts (facts_fts) VALUES ('integrity-check')")  # raises if they differ
        # every committed fact is found by its own made-up word; the killed session's words are nowhere
        for f in facts[:FACTS_PER_SESSION]:
            assert store.lexical(f.text.split()[-1].rstrip("."), 1)[0][0] == f.id
        killed = ["".join("bcdfghjklm"[int(c)] for c in f"{committed:02d}{i}") + "ux" for i in range(3)]
        assert store.lexical(" ".join(killed), 5) == []
        # The store goes on: the interrupted session can be ingested now, and retrieval sees it.
        turns = [Turn("user", "I love quokka stew.")]
        assert store.ingest_session(turns, RuleExtractor(), session_id=f"s{committed}").status == "committed"
        assert retrieve(store, "quokka stew", k=1).store_ids == (f"m{len(facts) + 1}",)


def test_store_opened_by_two_processes_sees_new_commits(tmp_path):
    path = tmp_path / "shared.db"
    reader = MemoryStore(path, HashEmbedder(64))
    with MemoryStore(path, HashEmbedder(64)) as writer:
        writer.ingest_session([Turn("user", "I love mint tea in the evening.")], RuleExtractor())
    assert retrieve(reader, "mint tea evening").store_ids == ("m1",)  # refreshed on retrieval
    reader.close()
