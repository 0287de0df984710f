"""Retrieval on dialogue within a token budget (issue 45): a turn's fact is labelled with its day, not its time of
day; its vector leaves the date out and carries the fact before it, so a reply is found by what it answers; evomem
brings the reply to its best seeds; ``retrieve(budget_tokens=...)`` takes facts in order while they fit."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from memstate.memory import MemoryStore, Turn, retrieve
from memstate.memory.commit import CONTEXT_WEIGHT, fact_vectors
from memstate.memory.embed import normalize
from memstate.memory.evomem import with_replies
from memstate.memory.records import FactProposal
from memstate.memory.tokens import token_counter
from memstate.memory.turn_extractor import TurnExtractor
from memstate.prompts import format_fact
from tests.test_memory_clag import AxisEmbedder
from tests.test_memory_hybrid import Recorder

DAY = "1:56 pm on 8 May, 2023"


def _turn(speaker: str, text: str, time: str | None = DAY) -> Turn:
    return Turn("user", text, time, speaker)


def test_a_fact_vector_is_its_undated_text_plus_half_the_fact_before_it():
    embedder = Recorder()
    turns = [_turn("Ana", "Do you like jazz?"), _turn("Ben", "Yes, every Sunday!")]
    facts = [FactProposal(f"n{i}", f"{t.speaker} (8 May, 2023): {t.content}", "fact", "global", t.content, i)
             for i, t in enumerate(turns)]  # fmt: skip
    vecs = fact_vectors(embedder, facts, turns)
    assert embedder.seen == ["Ana: Do you like jazz?", "Ben: Yes, every Sunday!"]  # the date left out
    own = AxisEmbedder().encode(embedder.seen)
    np.testing.assert_allclose(vecs[0], own[0], atol=1e-6)  # nothing before the first
    np.testing.assert_allclose(vecs[1], normalize(own[1:] + CONTEXT_WEIGHT * own[:1])[0], atol=1e-6)
    jazz = AxisEmbedder().encode(["jazz"])[0]
    assert vecs[1] @ jazz > own[1] @ jazz + 0.3  # the reply now points at what it answers


def test_the_reply_to_a_turn_is_found_by_the_question_it_answers(tmp_path):
    with MemoryStore(tmp_path / "m.db", AxisEmbedder()) as store:
        store.ingest_session([_turn("Ana", "Do you still play jazz?"), _turn("Ben", "Yes, every Sunday!"),
                              _turn("Ana", "My car broke down.")], TurnExtractor())  # fmt: skip
        store.ingest_session([_turn("Ana", "Nice weather."), _turn("Ben", "Indeed.")], TurnExtractor())
        facts = store.facts()
        assert facts[0].text == "Ana (8 May, 2023): Do you still play jazz?" and facts[0].time == DAY
        ids = [f.id for f in facts]
        # the next fact of the same session; the session's last fact has none (never the next session's first)
        assert store.following(ids) == {ids[0]: ids[1], ids[1]: ids[2], ids[3]: ids[4]}
        assert with_replies(store, [ids[0], ids[3]], 1) == [ids[0], ids[1], ids[3]]
        assert with_replies(store, [ids[1], ids[0]], 2) == [ids[1], ids[2], ids[0]]  # a reply placed once
        got = retrieve(store, "Does Ben play jazz on Sundays?", k=1, depth=0)
        assert got.store_ids[:2] == (ids[0], ids[1]) or got.store_ids[:2] == (ids[1], ids[2])
        assert ids[1] in got.store_ids


@pytest.mark.parametrize("budget", [20, 40, 100])
def test_a_budget_takes_facts_in_the_backends_order_while_they_fit(tmp_path, budget):
    with MemoryStore(tmp_path / "m.db", AxisEmbedder()) as store:
        for i in range(6):
            store.ingest_session([_turn("Ana", f"Jazz note {i}: " + "long " * (3 * i)),
                                  _turn("Ben", f"Tea {i}.")], TurnExtractor())  # fmt: skip
        everything = retrieve(store, "jazz notes", k=50, depth=0, backend="naive")
        got = retrieve(store, "jazz notes", budget_tokens=budget, depth=0, backend="naive")
    expected, used = [], 0
    for ref, fact in zip(everything.store_ids, everything.facts, strict=True):  # greedy, passing over what won't fit
        shown = format_fact(dataclasses.replace(fact, id=f"F{len(expected) + 1}"))  # counted as the prompt shows it
        size = token_counter().count_text(shown)
        assert size > token_counter().count_text(fact.text)  # the id is counted too
        if used + size <= budget:
            expected.append(ref)
            used += size
    assert list(got.store_ids) == expected and 0 < used <= budget
    assert [f.id for f in got.facts] == [f"F{i}" for i in range(1, len(expected) + 1)]


def test_a_budget_can_be_counted_in_the_responders_own_tokens(tmp_path, tiny_models):
    from transformers import AutoTokenizer

    from memstate.errors import ConfigError
    from memstate.memory.tokens import TokenCounter

    path = str(tiny_models["responder"])
    bpe = token_counter(path)
    assert bpe.newline >= 1 and token_counter().newline == 0  # a BPE counts the line break, WordPiece does not
    own = AutoTokenizer.from_pretrained(path)
    text = "Ana (8 May, 2023): I play jazz every Sunday."
    assert bpe.count_text(text) == len(own(text, add_special_tokens=False)["input_ids"])
    assert bpe(["a", "b", "c"]) == bpe.count_text("a\nb\nc")
    with MemoryStore(tmp_path / "m.db", AxisEmbedder()) as store:
        for i in range(6):
            store.ingest_session([_turn("Ana", f"Jazz note {i}: " + "long " * (3 * i))], TurnExtractor())
        everything = retrieve(store, "jazz notes", k=50, depth=0, backend="naive")
        taken = {}
        for counter, tokenizer in ((bpe, path), (token_counter(), None)):
            got = retrieve(store, "jazz notes", budget_tokens=60, depth=0, backend="naive", tokenizer=tokenizer)
            assert 0 < counter([format_fact(f) for f in got.facts]) <= 60
            expected, used = [], 0  # greedy in that tokenizer's tokens, a line break after each line
            for ref, fact in zip(everything.store_ids, everything.facts, strict=True):
                size = counter.count_text(format_fact(dataclasses.replace(fact, id=f"F{len(expected) + 1}")))
                if used + size + counter.newline <= 60:
                    expected.append(ref)
                    used += size + counter.newline
            assert list(got.store_ids) == expected
            taken[tokenizer] = expected
        assert len(taken[path]) < len(taken[None])  # the tiny BPE spends more tokens on the same lines
    with pytest.raises(ConfigError, match="--tokenizer"):
        TokenCounter(str(tmp_path / "nowhere"))
