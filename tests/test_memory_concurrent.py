"""Several processes on one memory store at once (issue 45): 4 processes ingest different sessions into the same
SQLite file while 4 others run retrieval queries against it, all opening it at the same moment (the first creates
it). Afterwards every session is there once and whole, no fact is lost or doubled, SQLite's and FTS5's integrity
checks pass, and no process saw an error (a "database is locked" would reach the user as one)."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from memstate.memory import MemoryStore

ROOT = Path(__file__).resolve().parents[1]
WRITERS, READERS, SESSIONS, FACTS = 4, 4, 6, 3

CHILD = textwrap.dedent(
    """
    import json, sys, time
    from pathlib import Path
    from memstate.memory import HashEmbedder, MemoryStore, RuleExtractor, Turn, retrieve

    path, start, role, k, out = sys.argv[1], Path(sys.argv[2]), sys.argv[3], int(sys.argv[4]), Path(sys.argv[5])
    sessions, per = int(sys.argv[6]), int(sys.argv[7])
    while not start.exists():  # all processes open the (not yet created) store at once
        time.sleep(0.005)
    report = {"role": role, "k": k, "errors": [], "committed": 0, "queries": 0, "hits": 0}

    def word(w, n, i):  # a made-up word per writer, session and fact
        return "".join("bcdfghjklm"[int(c)] for c in f"{w}{n:02d}{i}") + "ux"

    try:
        store = MemoryStore(path, HashEmbedder(64))
        if role == "writer":
            for n in range(sessions):
                turns = [Turn("user", f"I love {word(k, n, i)} and {word(k, n, i)}a.") for i in range(per)]
                status = store.ingest_session(turns, RuleExtractor(), session_id=f"w{k}-s{n}").status
                report["committed"] += status == "committed"
        else:
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline and not Path(out.parent / "writers-done").exists():
                for w in range(4):
                    found = retrieve(store, f"I love {word(w, 0, 0)}", k=5).store_ids
                    report["queries"] += 1
                    report["hits"] += bool(found)
        store.close()
    except Exception as e:
        import traceback
        report["errors"].append(traceback.format_exc())
    out.write_text(json.dumps(report))
    """
)


def test_four_writers_and_four_readers_on_one_store(tmp_path):
    path, start = tmp_path / "shared.db", tmp_path / "start"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    roles = [("writer", k) for k in range(WRITERS)] + [("reader", k) for k in range(READERS)]
    procs = {
        (role, k): subprocess.Popen(
            [
                sys.executable,
                "-c",
                CHILD,
                str(path),
                str(start),
                role,
                str(k),
                str(tmp_path / f"{role}{k}.json"),
                str(SESSIONS),
                str(FACTS),
            ],
            cwd=ROOT,
            env=env,
        )  # fmt: skip
        for role, k in roles
    }
    time.sleep(3)  # the interpreters are up and waiting; then all open the store together
    start.touch()
    try:
        for (role, _), proc in procs.items():
            if role == "writer":
                assert proc.wait(timeout=180) == 0
        (tmp_path / "writers-done").touch()
        for proc in procs.values():
            assert proc.wait(timeout=180) == 0
    finally:
        for proc in procs.values():
            proc.kill()
    reports = [json.loads((tmp_path / f"{role}{k}.json").read_text()) for role, k in roles]
    assert [r["errors"] for r in reports] == [[]] * len(roles), reports
    assert [r["committed"] for r in reports if r["role"] == "writer"] == [SESSIONS] * WRITERS
    readers = [r for r in reports if r["role"] == "reader"]
    assert all(r["queries"] > 0 for r in readers), readers
    assert sum(r["hits"] for r in readers) > 0, readers  # the readers saw the writers' commits while they ran

    with MemoryStore(path) as store:
        assert sorted(store.sessions()) == sorted(f"w{k}-s{n}" for k in range(WRITERS) for n in range(SESSIONS))
        facts = store.facts()
        assert len(facts) == WRITERS * SESSIONS * FACTS == len(store)
        assert len({f.text for f in facts}) == len(facts)  # none doubled
        assert len({f.id for f in facts}) == len(facts)
    with sqlite3.connect(path) as db:
        assert db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        assert db.execute("SELECT COUNT(*) FROM fact_vectors").fetchone()[0] == len(facts)
        assert db.execute("SELECT COUNT(*) FROM facts_fts_docsize").fetchone()[0] == len(facts)
        db.execute("INSERT INTO facts_fts (facts_fts) VALUES ('integrity-check')")  # raises if the index differs
