"""LoCoMo ingest (issue 18): the release's JSON array read sample by sample, both speakers' turns stored with their
speaker, session date, image caption and ``dia_id``; broken evidence ids counted and listed; one store per sample;
nothing lost to the per-session cap; a failed ingest leaves no store behind. Stores use the hashing embedder."""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

import pytest
from shipped_data import LOCOMO, MEMSYCO

from memstate.cli import main
from memstate.errors import ServerUnavailable
from memstate.memory import HashEmbedder, MemoryStore, Turn, locomo_sessions
from memstate.memory.turn_extractor import TurnExtractor
from memstate.sources.locomo import LocomoError, read_locomo

FIXTURE = Path(__file__).resolve().parent / "fixtures" / "locomo" / "locomo_sample.json"


@pytest.fixture(autouse=True)
def hashing_embedder(monkeypatch):
    monkeypatch.setattr("memstate.memory.store.default_embedder", lambda: HashEmbedder(64))


def test_the_reader_keeps_both_speakers_dates_captions_and_turn_ids():
    data = read_locomo(FIXTURE)
    assert [s.id for s in data.samples] == ["conv-t1", "conv-t2"]
    one = data.samples[0]
    assert one.speakers == ("Ana", "Ben") and [s.id for s in one.sessions] == ["conv-t1:session_1", "conv-t1:session_2"]
    turns = [t for s in locomo_sessions(one) for t in s.turns]  # as a memory store is given them
    assert [(t.speaker, t.source) for t in turns] == [
        ("Ana", "D1:1"), ("Ben", "D1:2"), ("Ana", "D1:3"), ("Ben", "D2:1"), ("Ben", "D2:2"), ("Ana", "D2:3"),
    ]  # fmt: skip
    assert turns[4] == Turn("user", "Here it is. [shares an image: a painting of a lighthouse at dusk]",
                            "6:30 pm on 12 April, 2023", "Ben")  # fmt: skip
    assert [q.evidence for q in one.qa] == [("D1:2",), ("D2:2", "D2:3"), ("D1:3",), ()]
    assert one.qa[3].answer == "a beagle" and one.qa[3].category == 5
    assert data.skipped == [
        f"{FIXTURE}: sample conv-t1: qa[2].evidence[1]: 'D' is not a dialogue id D<session>:<turn>",
        f"{FIXTURE}: sample conv-t1: qa[3].evidence[0]: 'D9:1' names no turn of the conversation",
    ]


def test_the_shipped_conversations_read_whole_with_their_broken_evidence_ids_listed():
    """third_party/data/locomo: LoCoMo's first five conversations as released; the reader keeps every turn and
    question and lists, not drops silently, the release's three malformed or dangling evidence ids."""
    data = read_locomo(LOCOMO)
    assert [s.id for s in data.samples] == ["conv-26", "conv-30", "conv-41", "conv-42", "conv-43"]
    assert sum(len(s.qa) for s in data.samples) == 999
    assert sum(len(session.turns) for s in data.samples for session in s.sessions) == 2760
    assert [line.split(": ", 1)[1] for line in data.skipped] == [
        "sample conv-42: qa[58].evidence[6]: 'D10:19' names no turn of the conversation",
        "sample conv-42: qa[88].evidence[1]: 'D' is not a dialogue id D<session>:<turn>",
        "sample conv-43: qa[18].evidence[4]: 'D:11:26' is not a dialogue id D<session>:<turn>",
    ]


@pytest.mark.parametrize(
    "edit, message",
    [
        (lambda d: d[0]["conversation"]["session_1"][1].pop("text"), "sample conv-t1: conversation.session_1[1].text"),
        (lambda d: d[0]["conversation"]["session_2"][0].update(speaker="Zoe"), "session_2[0].speaker: 'Zoe'"),
        (lambda d: d[1].update(sample_id="conv-t1"), "sample[1].sample_id: 'conv-t1'"),
        (lambda d: d[0]["qa"][0].update(category="2"), "sample conv-t1: qa[0].category"),
    ],
)
def test_a_malformed_record_names_file_sample_and_field(tmp_path, edit, message):
    data = json.loads(FIXTURE.read_text(encoding="utf-8"))
    edit(data)
    path = tmp_path / "locomo10.json"
    path.write_text(json.dumps(data, indent=2), encoding="utf-8")
    with pytest.raises(LocomoError, match=r"locomo10\.json: ") as e:
        read_locomo(path)
    assert message in str(e.value)


def test_cli_ingest_writes_one_store_per_sample_with_every_turn(tmp_path, capsys, caplog):
    out = tmp_path / "stores"
    with caplog.at_level(logging.WARNING, "memstate.memory"):
        assert main(["memory", "ingest", "--store-dir", str(out), "--format", "locomo", str(FIXTURE)]) == 0
    totals = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert totals == {"stores": 2, "sessions": 3, "split": 0, "facts": 7, "relations": 0, "rejected": 0, "skipped": 2}
    assert sum("qa[2].evidence[1]: 'D'" in r.getMessage() for r in caplog.records) == 1  # each skip is listed
    assert sorted(p.name for p in out.iterdir()) == ["conv-t1.sqlite", "conv-t2.sqlite"]
    with MemoryStore(out / "conv-t1.sqlite") as store:
        facts = store.facts()
    assert [f.source for f in facts] == ["D1:1", "D1:2", "D1:3", "D2:1", "D2:2", "D2:3"]
    assert {f.speaker for f in facts} == {"Ana", "Ben"}
    assert facts[1].text == "Ben (3 March, 2023): Busy, but good. Did you end up adopting that cat last week?"
    assert "lighthouse at dusk" in facts[4].text and facts[4].time == "6:30 pm on 12 April, 2023"


def test_several_samples_need_a_store_dir_and_nothing_is_created(tmp_path, capsys):
    store = tmp_path / "one.sqlite"
    assert main(["--log-level", "ERROR", "memory", "ingest", "--store", str(store), "--format", "locomo",
                 str(FIXTURE)]) == 2  # fmt: skip
    err = capsys.readouterr().err
    assert "locomo_sample.json: 2 samples (conv-t1, conv-t2)" in err and "give --store-dir DIR" in err
    assert not store.exists()


def test_memsyco_rows_get_one_store_each(tmp_path, capsys):
    rows = tmp_path / "rows.jsonl"
    dialogue = [{"role": "user", "content": "I love tea."}, {"role": "assistant", "content": "<information>Tea "
                "contains caffeine.</information>"}]  # fmt: skip
    row = json.loads((MEMSYCO / "valid_memory_selection.jsonl").read_text(encoding="utf-8").splitlines()[0])
    rows.write_text("\n".join(json.dumps({**row, "id": i, "dialogue": dialogue}) for i in ("r1", "r2")) + "\n")
    shutil.copy(MEMSYCO / "schema.json", tmp_path / "schema.json")  # as released: the schema beside the rows
    assert main(["memory", "ingest", "--store-dir", str(tmp_path / "s"), "--format", "memsyco", str(rows)]) == 0
    assert sorted(p.name for p in (tmp_path / "s").iterdir()) == ["r1.sqlite", "r2.sqlite"]
    with MemoryStore(tmp_path / "s" / "r2.sqlite") as store:  # the assistant's evidence is stored too
        assert [(f.text, f.source) for f in store.facts()] == [
            ("user: I love tea.", "r2:0"),
            ("assistant: <information>Tea contains caffeine.</information>", "r2:1"),
        ]


def test_a_failed_ingest_leaves_no_store_behind(tmp_path, monkeypatch, capsys):
    calls = []

    def propose(self, turns, context):
        calls.append(turns)
        if len(calls) == 3:  # the second sample, after the first store was written
            raise ServerUnavailable("extractor down")
        return original(self, turns, context)

    original = TurnExtractor.propose
    monkeypatch.setattr(TurnExtractor, "propose", propose)
    out = tmp_path / "stores"
    argv = ["--log-level", "ERROR", "memory", "ingest", "--store-dir", str(out), "--format", "locomo", str(FIXTURE)]
    assert main(argv) == 2 and len(calls) == 3
    assert not out.exists()
    existing = tmp_path / "kept"  # a directory the user made, and a store already in it, are left alone
    existing.mkdir()
    with MemoryStore(existing / "conv-t1.sqlite") as store:
        store.ingest_session([Turn("user", "Earlier words.")], TurnExtractor())
    calls.clear()
    assert main([*argv[:5], str(existing), *argv[6:]]) == 2
    assert sorted(p.name for p in existing.iterdir() if p.suffix == ".sqlite") == ["conv-t1.sqlite"]


def test_the_turn_extractor_loses_nothing_to_the_cap(tmp_path):
    turns = [Turn("assistant" if i % 2 else "user", f"Line {i} of a long session.", None, None, f"D1:{i}")
             for i in range(45)]  # fmt: skip
    turns += [Turn("system", "You are helpful."), Turn("user", "A long turn. " * 200, source="D1:45")]
    with MemoryStore(tmp_path / "s.sqlite", HashEmbedder(64)) as store:
        report = store.ingest_session(turns, TurnExtractor(), session_id="s")
        facts = store.facts()
    assert report.parts and not report.rejected
    assert [f.source for f in facts[:45]] == [f"D1:{i}" for i in range(45)]  # every turn, both roles, in order
    long = [f for f in facts if f.source == "D1:45"]
    assert len(long) == 3 and all(len(f.text) <= 1000 for f in long)  # cut into pieces, not truncated
    assert " ".join(f.quote for f in long).split() == ("A long turn. " * 200).split()
    assert not any("helpful" in f.text for f in facts)
