"""Ingest readers (dialogue JSONL, MemSyco-Bench rows, PersonaMem shared contexts) and end to end runs: MemSyco rows
ingested with the rule extractor and retrieved as valid Instances, once with the real MiniLM embedder."""

from __future__ import annotations

import hashlib
import json
import shutil
from dataclasses import replace
from pathlib import Path

import pytest
from shipped_data import MEMSYCO

from memstate.data_build import personamem as pm_build
from memstate.errors import InputError
from memstate.evaluate.memsyco.data import to_instance
from memstate.memory import (
    HashEmbedder,
    IngestError,
    MemoryStore,
    RuleExtractor,
    Turn,
    default_embedder,
    memsyco_file_sessions,
    memsyco_sessions,
    personamem_sessions,
    read_dialogue_jsonl,
    read_sessions,
    retrieve,
)
from memstate.prompts import policy_messages, responder_messages
from memstate.schema import Instance
from memstate.sources.memsyco import load_memsyco
from memstate.sources.personamem import ContextError, SharedContextFile, parse_context_line
from memstate.sources.skips import SKIP_DUPLICATE, SKIP_INVALID, DataError, SkipLog

ROOT = Path(__file__).resolve().parents[1]
PERSONAMEM = ROOT / "tests" / "fixtures" / "personamem" / "shared_contexts_32k.jsonl"


def write_lines(path: Path, lines: list) -> Path:
    path.write_text("\n".join(x if isinstance(x, str) else json.dumps(x) for x in lines) + "\n", encoding="utf-8")
    return path


def test_dialogue_jsonl_groups_turns_by_session(tmp_path):
    path = write_lines(
        tmp_path / "d.jsonl",
        [
            {"role": "user", "content": "I love green tea with honey and lemon.", "time": "2024-01-01", "session": "a"},
            {"role": "assistant", "content": "Noted.", "session": "a"},
            "",
            {"role": "user", "content": "I no longer love green tea with honey and lemon.", "session": "b"},
            {"role": "user", "content": "No session field."},
        ],
    )
    sessions = list(read_dialogue_jsonl(path))
    assert [(s.id, len(s.turns), s.where) for s in sessions] == [
        ("a", 2, f"{path}:1"),
        ("b", 1, f"{path}:4"),
        (None, 1, f"{path}:5"),
    ]
    assert sessions[0].turns[0].time == "2024-01-01"
    with MemoryStore(tmp_path / "s.db", HashEmbedder(64)) as store:
        reports = store.ingest(sessions, RuleExtractor())
        assert [r.status for r in reports] == ["committed"] * 3
        assert store.relations() == [("m2", "SUPERSEDES", "m1")]
        assert [r.status for r in store.ingest(read_dialogue_jsonl(path), RuleExtractor())] == ["duplicate"] * 3


@pytest.mark.parametrize(
    "line, message",
    [
        ("{oops", ":2: (line): invalid JSON"),
        ('{"role": "robot", "content": "hi"}', ":2: role: 'robot' is not one of"),
        ('{"role": "user", "content": ""}', ":2: content: must be a non-empty string"),
        ('{"role": "user", "content": "hi", "time": 5}', ":2: time: must be a string or null"),
        ('{"role": "user", "content": "hi", "speaker": "me"}', ":2: speaker: not a field of a dialogue turn"),
        ("[1, 2]", ":2: (line): expected a JSON object"),
    ],
)
def test_dialogue_jsonl_errors_name_file_line_and_field(tmp_path, line, message):
    path = write_lines(tmp_path / "bad.jsonl", ['{"role": "user", "content": "fine"}', line])
    with pytest.raises(IngestError, match=message.replace("(", r"\(").replace(")", r"\)")) as err:
        list(read_dialogue_jsonl(path))
    assert str(err.value).startswith(f"{path}:2: ")


def test_personamem_contexts_become_sessions(tmp_path):
    contexts = list(personamem_sessions(PERSONAMEM, turns_per_session=6))
    assert len(contexts) == 2
    cid, sessions = contexts[0]
    turns = [t for s in sessions for t in s.turns]
    assert all(t.role in ("user", "assistant") for t in turns)  # the persona card (system) is left out
    assert not any(t.content.lower().startswith(("user:", "assistant:")) for t in turns)
    assert all(len(s.turns) <= 6 for s in sessions) and sessions[0].id == f"pm:{cid[:16]}#0"
    assert turns[0].content.startswith("I love spicy food") and turns[0].time == "turn 1"
    with MemoryStore(tmp_path / "pm.db", HashEmbedder(256)) as store:
        reports = store.ingest(sessions, RuleExtractor())
        assert all(r.status == "committed" for r in reports) and len(store) > 3
        assert retrieve(store, "spicy food").facts
    only = list(personamem_sessions(PERSONAMEM, context_ids={contexts[1][0]}))
    assert [c for c, _ in only] == [contexts[1][0]]
    bad = write_lines(tmp_path / "pm_bad.jsonl", [{"ctx": [{"role": "user", "content": 3}]}])
    with pytest.raises(IngestError, match=r"pm_bad.jsonl:1: ctx\[0\].content: must be a string"):
        list(personamem_sessions(bad))


def test_personamem_readers_agree_on_the_turns():
    """data_build (instances) and memory (ingest) read shared contexts with the one core reader: the same user turns,
    message indices and texts; memory keeps the assistant turns too."""
    core = {c.id: c for c in SharedContextFile(PERSONAMEM)}
    assert len(core) == 2
    log = SkipLog()
    built, n_read, n_parsed, sha = pm_build.read_contexts(PERSONAMEM, log, wanted=set(core))
    assert (n_read, n_parsed, log.records) == (2, 2, []) and sha == hashlib.sha256(PERSONAMEM.read_bytes()).hexdigest()
    ingested = {cid: [t for s in sessions for t in s.turns] for cid, sessions in personamem_sessions(PERSONAMEM)}
    assert set(built) == set(ingested) == set(core)
    lines = PERSONAMEM.read_text(encoding="utf-8").splitlines()
    for cid, ctx in core.items():
        assert parse_context_line(lines[ctx.line - 1], ctx.file, ctx.line) == ctx
        (raw,) = json.loads(lines[ctx.line - 1]).values()
        assert ctx.n_messages == len(raw) == built[cid].n_messages
        user = [(t.index, t.text) for t in ctx.of_role("user")]
        assert user == list(zip(built[cid].indices, built[cid].texts, strict=True))
        assert [(int(t.time.removeprefix("turn ")), t.content) for t in ingested[cid] if t.role == "user"] == user
        assert [(t.role, t.content, t.time) for t in ingested[cid]] == [
            (t.role, t.text, f"turn {t.index}") for t in ctx.of_role("user", "assistant")
        ]
        assert all(raw[t.index]["role"] == t.role for t in ctx.turns)
        assert all(not t.text.lower().startswith(("user:", "assistant:")) for t in ctx.turns)


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ('{"abc": [{"role": "user", "content": "User: cut off"', "(line): invalid JSON (Expecting"),
        ('[{"role": "user", "content": "User: no id"}]', "(line): is a JSON list, expected an object with one key"),
        ('{"a": [], "b": []}', "(line): is an object with 2 keys, expected an object with one key"),
        ('{"def": [{"role": "narrator", "content": "Once"}]}', "def[0].role: 'narrator' is not one of"),
        ('{"def": [{"role": "user", "content": 3}]}', "def[0].content: must be a string, got 3"),
    ],
)
def test_a_malformed_context_line_names_file_line_and_field_in_both_paths(tmp_path, line, message):
    """The same FILE:LINE: field: reason from the core reader, memory's ingest and data_build's strict build; data_build
    with skip_invalid skips the line with the same reason."""
    path = tmp_path / "contexts.jsonl"
    path.write_text(PERSONAMEM.read_text(encoding="utf-8") + line + "\n", encoding="utf-8")
    where = f"{path}:3: {message}"
    with pytest.raises(ContextError) as core_err:
        list(SharedContextFile(path))
    with pytest.raises(IngestError) as ingest_err:
        list(personamem_sessions(path))
    with pytest.raises(DataError) as data_err:
        pm_build.read_contexts(path, SkipLog(skip_invalid=False), wanted=set())
    assert isinstance(core_err.value, InputError) and isinstance(ingest_err.value, InputError)
    for err in (core_err, ingest_err, data_err):
        assert str(err.value).startswith(where) and "\n" not in str(err.value)
    assert str(ingest_err.value) == str(core_err.value)
    assert str(data_err.value) == f"{core_err.value} (rerun with --skip-invalid to skip it)"
    log = SkipLog(skip_invalid=True)
    contexts, n_read, n_parsed, _ = pm_build.read_contexts(path, log, wanted={"abc", "def"})
    assert (len(contexts), n_read, n_parsed) == (0, 3, 2)
    assert [(s.file, s.line, s.kind, s.reason) for s in log.records] == [
        (str(path), 3, SKIP_INVALID, core_err.value.detail)
    ]


def test_personamem_blank_and_repeated_lines(tmp_path):
    """memory skips blank lines (as in its other formats); data_build counts them as bad records. A repeated context
    id stops both (data_build: skipped as a duplicate with skip_invalid)."""
    first, second = PERSONAMEM.read_text(encoding="utf-8").splitlines()
    path = write_lines(tmp_path / "blank.jsonl", [first, "", second])
    assert [cid for cid, _ in personamem_sessions(path)] == [c.id for c in SharedContextFile(PERSONAMEM)]
    log = SkipLog(skip_invalid=True)
    assert pm_build.read_contexts(path, log, wanted=set())[1:3] == (3, 2)
    assert [(s.line, s.reason) for s in log.records] == [(2, "(line): empty line")]
    path = write_lines(tmp_path / "repeat.jsonl", [first, second, first])
    cid = next(iter(json.loads(first)))
    with pytest.raises(IngestError, match=rf"repeat.jsonl:3: shared_context_id: '{cid}' repeats line 1$"):
        list(personamem_sessions(path))
    log = SkipLog(skip_invalid=True)
    assert len(pm_build.read_contexts(path, log, wanted={cid})[0]) == 1
    assert [(s.line, s.kind) for s in log.records] == [(3, SKIP_DUPLICATE)]


def row_instance(row, ret) -> Instance:
    """The row's Instance with the retrieved memory state in place of its gold memory (as ``evaluate
    --memory-backend`` builds it)."""
    return replace(to_instance(row), facts=ret.facts, relations=ret.relations)


def memsyco_rows(n: int):
    return [row for name in sorted(MEMSYCO.glob("*.jsonl")) for row in load_memsyco(name)[:n]]


@pytest.mark.parametrize("backend", ["evomem", "naive"])
def test_memsyco_rows_ingest_and_retrieve_end_to_end(tmp_path, backend):
    rows = memsyco_rows(3)
    assert {r.task for r in rows} == {"memory_evidence_conflict", "valid_memory_selection"}
    for row in rows:
        with MemoryStore(tmp_path / f"{backend}-{row.id}.db", HashEmbedder(384)) as store:  # one store per sample
            reports = store.ingest(memsyco_sessions(row, turns_per_session=4), RuleExtractor())
            assert all(r.status == "committed" for r in reports) and len(store) > 0
            dialogue = " ".join(t["content"] for t in row.dialogue)
            assert all(f.quote in dialogue for f in store.facts())
            ret = retrieve(store, row.question, k=5, backend=backend)
            inst = row_instance(row, ret)
            assert Instance.from_dict(inst.to_dict()) == inst and 1 <= len(inst.facts) <= 15
            assert policy_messages(inst)[1]["content"].count("[F") == len(inst.facts)
            assert "Memories:" in responder_messages(inst)[1]["content"]


def test_memsyco_end_to_end_with_minilm(tmp_path):
    embedder = default_embedder()
    row = next(r for r in memsyco_rows(12) if r.task == "valid_memory_selection" and "prefer" in str(r.dialogue))
    with MemoryStore(tmp_path / "minilm.db", embedder) as store:
        reports = store.ingest(memsyco_sessions(row, turns_per_session=4), RuleExtractor())
        assert all(r.status == "committed" for r in reports)
        ret = retrieve(store, row.question, k=5)
        assert 1 <= len(ret.facts) and max(ret.scores) > 0.2  # a real model finds related memories
        Instance.from_dict(row_instance(row, ret).to_dict())
    with MemoryStore(tmp_path / "minilm.db") as store:  # reopened with the recorded MiniLM
        assert store.embedder is embedder and retrieve(store, row.question, k=5).store_ids == ret.store_ids


def test_minilm_finds_the_old_preference_by_meaning_and_traversal_adds_the_new(tmp_path):
    """The hashing embedder knows no synonyms: "scary films" shares no word with "horror movies". The extractor
    relates the two preferences by meaning too (cosine 0.63 >= 0.55; they share only three topic words)."""
    with MemoryStore(tmp_path / "para.db", default_embedder()) as store:
        ex = RuleExtractor(store.embedder)
        old = store.ingest_session([Turn("user", "I love watching horror movies late at night.")], ex).fact_ids[0]
        store.ingest_session([Turn("user", "My sister lives in Lisbon and works as a nurse.")], ex)
        later = "These days I prefer watching cheerful romantic comedies late at night."
        new = store.ingest_session([Turn("user", later)], ex).fact_ids[0]
        assert (new, "SUPERSEDES", old) in store.relations()
        ret = retrieve(store, "scary films", k=1)
        assert ret.store_ids[0] == old and new in ret.store_ids


def test_read_sessions_reads_every_format(tmp_path):
    dialogue = write_lines(tmp_path / "d.jsonl", [{"role": "user", "content": "I love tea.", "session": 7}])
    assert list(read_sessions(dialogue)) == [("7", [Turn("user", "I love tea.")])]
    pm = list(read_sessions(PERSONAMEM, "personamem"))
    assert len(pm) > 2 and all(sid.startswith("pm:") for sid, _ in pm)
    row = json.loads((MEMSYCO / "valid_memory_selection.jsonl").read_text(encoding="utf-8").splitlines()[0])
    rows = write_lines(tmp_path / "rows.jsonl", [row, {**row, "id": 7}])
    shutil.copy(MEMSYCO / "schema.json", tmp_path / "schema.json")  # as released: the schema beside the rows
    with pytest.raises(IngestError, match=r"rows.jsonl:2: field id: 7 is not of type"):  # validated before any session
        next(read_sessions(rows, "memsyco"))
    write_lines(rows, [row])
    ((sid, turns),) = read_sessions(rows, "memsyco")
    assert sid == f"{row['id']}#0" and turns == [Turn(t["role"], t["content"]) for t in row["dialogue"]]
    with pytest.raises(ValueError, match="format 'csv'"):
        list(read_sessions(rows, "csv"))


def test_memsyco_file_sessions_match_the_validated_rows():
    path = MEMSYCO / "memory_evidence_conflict.jsonl"
    rows = load_memsyco(path)
    sessions = list(memsyco_file_sessions(path))
    assert [s.id for s in sessions] == [f"{r.id}#0" for r in rows]
    assert sessions[0].turns == tuple(Turn(t["role"], t["content"]) for t in rows[0].dialogue)
