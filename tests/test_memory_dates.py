"""Dates in retrieval (issue 57): the day each stored fact was said, the span a question names, and evomem's third
ranking of the facts said within it."""

from __future__ import annotations

import datetime as dt

import pytest

from memstate.memory import MemoryStore, Turn, retrieve
from memstate.memory.dates import DateSpan, fact_day, parse_day, question_span
from memstate.memory.evomem import EvomemSettings
from memstate.memory.turn_extractor import TurnExtractor
from tests.test_memory_clag import AxisEmbedder


def _day(y: int, m: int, d: int) -> int:
    return dt.date(y, m, d).toordinal()


@pytest.mark.parametrize(
    ("text", "day"),
    [
        ("1:56 pm on 8 May, 2023", (2023, 5, 8)),
        ("10:37 am on 27 June, 2023", (2023, 6, 27)),
        ("May 8, 2023 at 1:56pm", (2023, 5, 8)),
        ("2023-05-08T13:56:00Z", (2023, 5, 8)),
        ("Sept. 3rd, 2022", (2022, 9, 3)),
        ("the 21st of March 2024", (2024, 3, 21)),
        ("31 February, 2023", None),  # not a day
        ("2023-13-01", None),
        ("8 May", None),  # no year: which May?
        ("", None),
    ],
)
def test_a_day_is_read_from_the_formats_dialogues_carry(text, day):
    assert parse_day(text) == (dt.date(*day) if day else None)
    assert fact_day(text or None) == (_day(*day) if day else 0)


@pytest.mark.parametrize(
    ("question", "span"),
    [
        ("What dish did Nate make on 9 November, 2022?", DateSpan(_day(2022, 11, 2), _day(2022, 11, 16))),
        ("What did Maria do last weekend before April 10, 2023?", DateSpan(_day(2023, 4, 3), _day(2023, 4, 17))),
        ("What did Maria donate in December 2023?", DateSpan(_day(2023, 12, 1), _day(2024, 1, 7))),
        ("When did Melanie go camping in June?", DateSpan(month=6)),
        ("What may Ana like?", None),  # "may" is not a month here
        ("When did Ana move to Oslo?", None),
        ("How many times has Melanie gone to the beach in 2023?", None),  # a whole year narrows nothing
    ],
)
def test_the_span_a_question_names(question, span):
    assert question_span(question) == span


def _say(store: MemoryStore, time: str, *texts: str) -> list[str]:
    turns = [Turn("user", t, time, "Ana" if i % 2 == 0 else "Ben") for i, t in enumerate(texts)]
    return list(store.ingest_session(turns, TurnExtractor()).fact_ids)


def test_a_question_naming_a_date_ranks_what_was_said_then(tmp_path):
    with MemoryStore(tmp_path / "d.db", AxisEmbedder()) as store:
        (dated,) = _say(store, "2:00 pm on 9 November, 2022", "I cooked something new this week.")
        for i, time in enumerate(("1:00 pm on 2 March, 2022", "3:00 pm on 5 May, 2023", "9:00 am on 1 July, 2023")):
            _say(store, time, f"I cooked a new dish {i} this week, a great dish.", f"Cooking dish {i} is fun.")
        question = "What dish did Ana cook on 9 November, 2022?"
        plain = retrieve(store, question, k=2, depth=0, settings=EvomemSettings(dates=False, replies=0))
        dated_first = retrieve(store, question, k=2, depth=0, settings=EvomemSettings(replies=0))
        assert dated not in plain.store_ids  # the other sessions' words match better
        assert dated in dated_first.store_ids
        assert dated_first.trace["dates"] == {"first": _day(2022, 11, 2), "last": _day(2022, 11, 16), "month": 0}
        # a question without a date is searched as before
        undated = retrieve(store, "What dish did Ana cook?", k=2, depth=0, settings=EvomemSettings(replies=0))
        assert "dates" not in undated.trace
        assert undated.store_ids == retrieve(store, "What dish did Ana cook?", k=2, depth=0,
                                             settings=EvomemSettings(dates=False, replies=0)).store_ids  # fmt: skip


def test_a_fact_without_a_date_never_matches_a_span(tmp_path):
    with MemoryStore(tmp_path / "d.db", AxisEmbedder()) as store:
        store.ingest_session([Turn("user", "I cooked a dish.", None, "Ana")], TurnExtractor())
        _say(store, "8 May, 2023", "I cooked a dish too.")
        idx = store._index
        assert list(idx.days[: idx.n]) == [0, _day(2023, 5, 8)] and list(idx.months[: idx.n]) == [0, 5]
        assert list(DateSpan(month=5).mask(idx.days[: idx.n], idx.months[: idx.n])) == [False, True]
        assert list(DateSpan(0, _day(2030, 1, 1)).mask(idx.days[: idx.n], idx.months[: idx.n])) == [False, True]
