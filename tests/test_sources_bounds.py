"""The released-format readers (memstate.sources) within the record bounds of memstate.data (issue 56): a line over
the limit is refused without being read whole, JSON nested past the parser is invalid JSON, never a traceback."""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

import pytest
from shipped_data import MEMSYCO

from memstate.sources.fever import scan_wiki
from memstate.sources.locomo import LocomoError, read_locomo
from memstate.sources.memsyco import MemSycoError, load_memsyco
from memstate.sources.personamem import ContextError, SharedContextFile
from memstate.sources.skips import SKIP_INVALID, DataError, SkipLog

FIXTURES = Path(__file__).resolve().parent / "fixtures"
DEEP = b"[" * 5000 + b"]" * 5000


def test_wiki_pages_over_the_limit_or_too_deep_are_unreadable_pages(tmp_path, monkeypatch):
    monkeypatch.setenv("MEMSTATE_MAX_RECORD_BYTES", "20000")
    wiki = tmp_path / "wiki-pages"
    shutil.copytree(FIXTURES / "fever" / "wiki-pages", wiki)
    path = wiki / "wiki-001.jsonl"
    with open(path, "ab") as f:
        f.write(b'{"id": "Big", "lines": "' + b"x" * 30000 + b'"}\n')
        f.write(b'{"id": "Deep", "lines": ' + DEEP + b"}\n")
    log = SkipLog(skip_invalid=True)
    scan = scan_wiki(wiki, {"Tokyo", "Big", "Deep"}, log, progress=False)
    reasons = [(s.kind, s.reason) for s in log.records]
    assert reasons[0][0] == SKIP_INVALID and "line of 30027 bytes is over the 20000-byte limit" in reasons[0][1]
    assert reasons[1] == (SKIP_INVALID, "unreadable page: JSONDecodeError: nested too deeply: line 1 column 1 (char 0)")
    assert "Tokyo" in scan.pages
    assert scan.digests[str(path)][0] == hashlib.sha256(path.read_bytes()).hexdigest()  # dropped bytes are hashed
    with pytest.raises(DataError, match="wiki-001.jsonl:[0-9]+: unreadable page: line of 30027 bytes"):
        scan_wiki(wiki, {"Tokyo"}, SkipLog(), progress=False)


def test_a_personamem_context_over_its_limit_names_the_line(tmp_path, monkeypatch):
    monkeypatch.setenv("MEMSTATE_MAX_CONTEXT_BYTES", "1000")
    path = tmp_path / "shared_contexts.jsonl"
    path.write_bytes(b'{"ctx": [{"role": "user", "content": "' + b"x" * 2000 + b'"}]}\n')
    with pytest.raises(ContextError, match=r"shared_contexts.jsonl:1: \(line\): line of 2043 bytes .* "
                                           r"MEMSTATE_MAX_CONTEXT_BYTES"):  # fmt: skip
        list(SharedContextFile(path))
    path.write_bytes(b'{"ctx": ' + DEEP + b"}\n")
    monkeypatch.delenv("MEMSTATE_MAX_CONTEXT_BYTES")
    with pytest.raises(ContextError, match=r"shared_contexts.jsonl:1: \(line\): invalid JSON \(nested too deeply"):
        list(SharedContextFile(path))


def test_memsyco_and_locomo_refuse_json_nested_past_the_parser(tmp_path):
    rows = tmp_path / "rows.jsonl"
    rows.write_bytes(b'{"id": ' + DEEP + b"}\n")
    shutil.copy(MEMSYCO / "schema.json", tmp_path / "schema.json")
    with pytest.raises(MemSycoError, match=r"rows.jsonl:1: invalid JSON: nested too deeply"):
        load_memsyco(rows)
    locomo = tmp_path / "locomo10.json"
    locomo.write_bytes(DEEP)
    with pytest.raises(LocomoError, match=r"locomo10.json:1: \(file\): invalid JSON: nested too deeply"):
        read_locomo(locomo)
