"""Hostile input to the memory commands (issue 56): a store's meta is validated on open, stored text is printed with
its control characters escaped, and ingest's records are bounded (size, nesting, text that is not Unicode)."""

from __future__ import annotations

import hashlib
import io
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from memstate.cli import main
from memstate.data import read_lines
from memstate.errors import ConfigError
from memstate.memory.embed import HashEmbedder
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
