"""Hostile input to the memory commands (issue 56): a store's meta is validated on open, stored text is printed with
its control characters escaped, and ingest's records are bounded (size, nesting, text that is not Unicode)."""

from __future__ import annotations

import hashlib
import io
import re
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from memstate.cli import main
from memstate.data import read_lines
from memstate.errors import ConfigError
from memstate.memory.embed import EmbedderUnavailable, HashEmbedder
from memstate.memory.extract import make_extractor
from memstate.memory.ingest import IngestError, read_samples
from memstate.memory.records import Turn
from memstate.memory.store import MemoryStore, StoreError

ROOT = Path(__file__).resolve().parents[1]


def _store(path: Path, texts: list[str] = ()) -> Path:
    with MemoryStore(path, HashEmbedder(64)) as store:
        if texts:
            store.ingest_session([Turn("user", t) for t in texts], make_extractor("turns", None, None))
    return path


@pytest.mark.parametrize(
    ("name", "reason"),
    [
        ("hash-0", "dimension must be 1 to 65536, got 0"),
        ("hash-100000000000", "dimension must be 1 to 65536, got 100000000000"),
        ("hash-", "is not hash-N"),
        ("hash-1e9", "is not hash-N"),
        ("", "is not an embedder name"),
        ("model\x1b[2J", "is not an embedder name"),
    ],
)
def test_a_store_whose_meta_names_an_impossible_embedder_is_refused_on_open(tmp_path, name, reason):
    path = _store(tmp_path / "s.sqlite", ["I like tea."])
    with sqlite3.connect(path) as db:
        db.execute("UPDATE meta SET value = ? WHERE key = 'embedder'", (name,))
    with pytest.raises(StoreError, match=f"^{path}: meta.embedder: .*{reason}"):
        MemoryStore(path)


def test_a_store_with_damaged_vectors_is_refused_on_open(tmp_path):
    path = _store(tmp_path / "s.sqlite", ["I like tea.", "I live in Oslo."])
    with sqlite3.connect(path) as db:
        db.execute("DROP TRIGGER IF EXISTS fact_vectors_no_update")
        triggers = [r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type = 'trigger'")]
        for trigger in triggers:  # the store refuses UPDATE; a damaged file has no such scruples
            db.execute(f"DROP TRIGGER {trigger}")
        db.execute("UPDATE fact_vectors SET vec = x'00' WHERE rowid = (SELECT MIN(rowid) FROM fact_vectors)")
    with pytest.raises(StoreError, match=f"^{path}: fact_vectors: vectors of \\[1, 256\\] bytes"):
        MemoryStore(path)


def _random_bytes(path: Path) -> None:
    path.write_bytes(b"SQLite format 3\x00" + bytes(range(256)) * 256)  # a header, then no database


def _truncated(path: Path) -> None:
    _store(path, [f"I like tea number {i}." for i in range(40)])
    with MemoryStore(path) as store:
        store.checkpoint()
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 3])


def _fts_dropped(path: Path) -> None:
    _store(path, ["I like tea."])
    db = sqlite3.connect(path)
    db.executescript("DROP TRIGGER facts_fts_insert; DROP TABLE facts_fts;")
    db.close()


@pytest.mark.parametrize(
    ("damage", "reason"),
    [
        (_random_bytes, "not a readable memstate store: file is not a database"),
        (_truncated, "not a readable memstate store: database disk image is malformed"),
        (_fts_dropped, "not a readable memstate store: no table facts_fts"),
        (lambda p: p.write_bytes(b""), r"not a memstate store \(an empty file"),
        (lambda p: sqlite3.connect(p).executescript("CREATE TABLE t (x); INSERT INTO t VALUES (1);"),
         r"not a memstate store \(a SQLite file without its tables"),
    ],
    ids=["random-bytes", "truncated", "fts-dropped", "empty-file", "other-database"],
)  # fmt: skip
def test_a_file_that_is_no_readable_store_is_refused_by_ask_and_left_as_it_was(tmp_path, capsys, damage, reason):
    path = tmp_path / "s.sqlite"
    damage(path)
    before = path.read_bytes()
    capsys.readouterr()
    code = main(["memory", "ask", "--store", str(path), "Where do I live?", "--responder_model", "x", "--no-state"])
    err = capsys.readouterr().err
    assert code == 2 and len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert re.search(f"memstate memory ask: error: {re.escape(str(path))}: {reason}", err), err
    assert path.read_bytes() == before  # never initialised, repaired or rewritten
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s.sqlite"]


@pytest.mark.parametrize("damage", [_random_bytes, _fts_dropped], ids=["random-bytes", "fts-dropped"])
def test_ingest_into_a_damaged_store_is_one_line_and_leaves_the_file(tmp_path, capsys, damage):
    path, dialogue = tmp_path / "s.sqlite", tmp_path / "d.jsonl"
    dialogue.write_text('{"role": "user", "content": "I like tea."}\n')
    damage(path)
    before = path.read_bytes()
    capsys.readouterr()
    assert main(["memory", "ingest", "--store", str(path), str(dialogue), "--extractor", "turns"]) == 2
    err = capsys.readouterr().err
    assert f"{path}: not a readable memstate store" in err and len(err.splitlines()) == 1, err
    assert path.read_bytes() == before


def test_a_python_caller_gets_the_same_refusals_and_a_missing_file_stays_missing(tmp_path):
    path = tmp_path / "s.sqlite"
    path.write_bytes(b"")
    with pytest.raises(StoreError, match="an empty file"):
        MemoryStore(path, create=False)
    assert path.read_bytes() == b""
    with MemoryStore(path, HashEmbedder(8)) as store:  # create=True (ingest): an empty file is a new store
        assert len(store) == 0
    with pytest.raises(StoreError, match="no such memory store"):
        MemoryStore(tmp_path / "missing.sqlite", create=False)
    assert not (tmp_path / "missing.sqlite").exists()


def test_a_locked_store_is_not_called_damaged():
    from memstate.memory.store import _unreadable

    assert not _unreadable(sqlite3.OperationalError("database is locked"))
    assert not _unreadable(sqlite3.OperationalError("database or disk is full"))
    assert not _unreadable(sqlite3.IntegrityError("UNIQUE constraint failed: sessions.id"))
    assert _unreadable(sqlite3.DatabaseError("file is not a database"))
    assert _unreadable(sqlite3.OperationalError("no such table: facts_fts"))


def test_a_local_path_that_is_no_model_is_one_line_when_first_used(tmp_path):
    """A store's meta may name a local directory (an offline node's model); one that is not a model is the store's
    one-line error when the embedder first loads, not a traceback."""
    path = _store(tmp_path / "s.sqlite", ["I like tea."])
    not_a_model = tmp_path / "not-a-model"
    not_a_model.mkdir()
    with sqlite3.connect(path) as db:
        db.execute("UPDATE meta SET value = ? WHERE key = 'embedder'", (str(not_a_model),))
    with MemoryStore(path) as store, pytest.raises(EmbedderUnavailable, match=f"^{path}: meta.embedder: cannot load"):
        store.embed_query("tea")


def test_an_embedder_that_cannot_load_is_one_line_naming_the_store(tmp_path, monkeypatch, capsys):
    path = _store(tmp_path / "s.sqlite", ["I like tea."])
    with sqlite3.connect(path) as db:
        db.execute("UPDATE meta SET value = 'no-such-org/no-such-model' WHERE key = 'embedder'")

    def offline(name, device=None):  # what huggingface_hub says offline, without asking the network
        raise OSError(f"We couldn't connect to 'https://huggingface.co' to load the files of {name}.\nCheck ...")

    monkeypatch.setattr("memstate.memory.embed.load_sentence_transformer", offline)
    monkeypatch.setattr("memstate.memory.cli.make_responder", lambda config: _Responder())
    capsys.readouterr()
    code = main(["memory", "ask", "--store", str(path), "What tea?", "--responder_model", "x", "--no-state"])
    err = capsys.readouterr().err
    assert code == 2 and len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert f"{path}: meta.embedder: cannot load 'no-such-org/no-such-model' (We couldn't connect to" in err


def test_ask_refuses_a_question_over_the_bound_and_search_reads_only_its_start(tmp_path, capsys):
    from memstate.memory.search import MAX_QUERY_CHARS

    path = _store(tmp_path / "s.sqlite", ["I like green tea.", "I live in Oslo."])
    capsys.readouterr()
    long = "pasta " * 17_000
    code = main(["memory", "ask", "--store", str(path), long, "--responder_model", "x", "--no-state"])
    err = capsys.readouterr().err
    assert code == 2 and len(err.splitlines()) == 1, err
    assert f"question: 102000 characters, over the {MAX_QUERY_CHARS} a question may have" in err
    with MemoryStore(path) as store:  # a library caller is bounded too: the start is what counts
        query = "Where do I live? Oslo. " + "x" * MAX_QUERY_CHARS + " green tea"
        assert [ref for ref, _ in store.lexical(query, 5)] == ["m2"]
        assert (store.embed_query(query) == store.embed_query(query[:MAX_QUERY_CHARS])).all()


class _Responder:
    def answer(self, batches, max_new_tokens=128):
        return ["Tea.\x1b[31m red\nsecond line\x07" for _ in batches]


def test_ask_prints_stored_escape_sequences_escaped(tmp_path, capsys, monkeypatch):
    texts = ["I like tea\x1b[2J and clear screens.", "I like tea\x1b]0;pwned\x07 in my title.", "Tea\x9b31m\tand\rme."]
    store = _store(tmp_path / "s.sqlite", texts)
    monkeypatch.setattr("memstate.memory.cli.make_responder", lambda config: _Responder())
    capsys.readouterr()
    assert main(["memory", "ask", "--store", str(store), "What tea do I like?", "--responder_model", "x",
                 "--no-state"]) == 0  # fmt: skip
    out = capsys.readouterr().out
    assert not {"\x1b", "\x07", "\x9b", "\r"} & set(out), repr(out)
    assert "I like tea\\x1b[2J and clear screens." in out
    assert "I like tea\\x1b]0;pwned\\x07 in my title." in out
    assert "Tea\\x9b31m\tand\\x0dme." in out  # a tab is kept
    assert out.endswith("answer: Tea.\\x1b[31m red\nsecond line\\x07\n")  # the answer keeps its newlines


def test_ask_refuses_a_question_that_is_not_utf8_from_a_real_argv(tmp_path):
    store = _store(tmp_path / "s.sqlite", ["I like tea."])
    argv = [sys.executable, "-m", "memstate.cli", "memory", "ask", "--store", str(store), b"caf\xe9 ?",
            "--responder_model", "x", "--no-state"]  # fmt: skip
    done = subprocess.run(argv, capture_output=True, cwd=ROOT)
    err = done.stderr.decode()
    assert done.returncode == 2 and "Traceback" not in err and len(err.splitlines()) == 1, err
    assert "question: byte 0xe9 at character 4 is not valid UTF-8" in err


@pytest.mark.parametrize(
    ("line", "reason"),
    [
        (b'{"role": "user", "content": "a \\ud800 b"}', "dialogue.jsonl:2: content: lone surrogate U+D800"),
        (b'{"role": "user", "content": "ok", "time": "\\udc00"}', "dialogue.jsonl:2: time: lone surrogate U+DC00"),
        (b"[" * 2_000 + b"]" * 2_000, "dialogue.jsonl:2: (line): invalid JSON: nested too deeply"),
        (b'{"role": "user", "content": "caf\xe9"}', "dialogue.jsonl:2: (line): not valid UTF-8"),
        (b'{"role": "user", "content": "' + b"x" * 5000 + b'"}',
         "dialogue.jsonl:2: (line): line of 5032 bytes is over the 4096-byte limit of one record (raise it with "
         "MEMSTATE_MAX_RECORD_BYTES)"),
    ],
)  # fmt: skip
def test_ingest_names_the_line_and_field_of_a_hostile_record(tmp_path, monkeypatch, line, reason):
    monkeypatch.setenv("MEMSTATE_MAX_RECORD_BYTES", "4096")
    path = tmp_path / "dialogue.jsonl"
    path.write_bytes(b'{"role": "user", "content": "hello"}\n' + line + b"\n")
    with pytest.raises(IngestError) as e:
        read_samples(path)
    assert str(e.value).startswith(f"{tmp_path / reason}"), str(e.value)


def test_a_lone_surrogate_in_another_format_names_the_session_and_field(tmp_path):
    locomo = tmp_path / "locomo10.json"
    conversation = {"speaker_a": "Caroline", "speaker_b": "Melanie", "session_1_date_time": "1 May 2023",
                    "session_1": [{"speaker": "Caroline", "dia_id": "D1:1", "text": "Hey \\udbff Mel!"}]}  # fmt: skip
    body = '[{"sample_id": "conv-26", "conversation": ' + str(conversation).replace("'", '"') + ', "qa": []}]'
    locomo.write_text(body.replace("\\\\udbff", "\\udbff"), encoding="utf-8")
    with pytest.raises(IngestError, match=r": session 0: turn 0 content: lone surrogate U\+DBFF at character 5"):
        read_samples(locomo, "locomo")


class _Recording(io.BytesIO):
    """Records the longest read the reader asked for."""

    longest = 0

    def readline(self, size=-1):
        line = super().readline(size)
        self.longest = max(self.longest, len(line))
        return line


def test_a_line_over_the_limit_is_never_held_whole():
    data = b"short\n" + b"x" * (5 << 20) + b"\n" + b"last"
    f = _Recording(data)
    digest = hashlib.sha256()
    lines = list(read_lines(f, 1000, digest.update))
    assert lines == [(1, b"short\n", 6), (2, None, (5 << 20) + 1), (3, b"last", 4)]
    assert f.longest <= 1 << 20  # read in chunks of at most 1 MiB
    assert digest.hexdigest() == hashlib.sha256(data).hexdigest()  # every byte still reaches a running sha256


def test_a_record_limit_from_the_environment_must_be_a_positive_number(monkeypatch):
    from memstate.data import max_record_bytes

    monkeypatch.setenv("MEMSTATE_MAX_RECORD_BYTES", "1e6")
    with pytest.raises(ConfigError, match="MEMSTATE_MAX_RECORD_BYTES='1e6': not a whole number of bytes"):
        max_record_bytes()
    monkeypatch.setenv("MEMSTATE_MAX_RECORD_BYTES", "0")
    with pytest.raises(ConfigError, match="at least 1 byte"):
        max_record_bytes()
    monkeypatch.delenv("MEMSTATE_MAX_RECORD_BYTES")
    assert max_record_bytes() == 4 << 20 and max_record_bytes("context") == 64 << 20
