"""Dates for retrieval: the day a stored fact was said (from its ``time``) and the days a question names.

A question that names a date ("What did Maria donate in December 2023?", "... on 7 July, 2023?") is asking about
what was said then; neither the dense ranking (the query's vector) nor BM25 (every label carries a year, and a day's
number matches any other day's) finds those facts reliably. ``question_span`` reads the span a question names and
evomem adds a ranking of the facts said within it (``MemoryStore.hybrid``'s ``span``). Only explicit calendar
dates count: a day (with a week either side: "the week before August 3, 2023"), a month of a year (and the week
after it, when a month is often told about), a month alone ("camping in June": that month of any year). Relative
words ("last week") need the date of the question, which a benchmark question does not carry.
"""

from __future__ import annotations

import datetime as dt
import functools
import re
from dataclasses import dataclass

import numpy as np

from memstate.prompts import date_of

MONTHS = ("january", "february", "march", "april", "may", "june", "july", "august", "september", "october",
          "november", "december")  # fmt: skip
_MONTH = r"(" + "|".join(MONTHS) + r"|jan|feb|mar|apr|jun|jul|aug|sept?|oct|nov|dec)\.?"
_DAY = r"(\d{1,2})(?:st|nd|rd|th)?"
_YEAR = r"((?:19|20)\d\d)"
NEAR_DAYS = 7  # a named day also finds what was said within a week of it


def _month(name: str) -> int:
    name = name.lower().rstrip(".")
    return next(i for i, m in enumerate(MONTHS, 1) if m.startswith(name[:3]))


def _date(year: str, month: int, day: str) -> dt.date | None:
    try:
        return dt.date(int(year), month, int(day))
    except ValueError:
        return None


_DAY_MONTH_YEAR = re.compile(rf"\b{_DAY}\s+(?:of\s+)?{_MONTH},?\s+{_YEAR}\b", re.IGNORECASE)
_MONTH_DAY_YEAR = re.compile(rf"\b{_MONTH}\s+{_DAY},?\s+{_YEAR}\b", re.IGNORECASE)
_ISO = re.compile(r"(?<!\d)((?:19|20)\d\d)-(\d\d)-(\d\d)(?!\d)")
_MONTH_YEAR = re.compile(rf"\b{_MONTH},?\s+(?:of\s+)?{_YEAR}\b", re.IGNORECASE)
_MONTH_ALONE = re.compile(rf"\b(?:in|during|of|early|late|mid|since|until)\s+{_MONTH}\b(?!\s*\d)", re.IGNORECASE)


def parse_day(text: str) -> dt.date | None:
    """The first calendar day written in ``text`` (``8 May, 2023``, ``May 8, 2023``, ``2023-05-08``), if any.

    >>> parse_day("1:56 pm on 8 May, 2023"), parse_day("2023-05-08T13:56:00Z"), parse_day("Sept. 3rd, 2022")
    (datetime.date(2023, 5, 8), datetime.date(2023, 5, 8), datetime.date(2022, 9, 3))
    >>> parse_day("sometime in May") is None
    True
    """
    if m := _ISO.search(text):
        return _date(m[1], int(m[2]), m[3]) if 1 <= int(m[2]) <= 12 else None
    if m := _DAY_MONTH_YEAR.search(text):
        return _date(m[3], _month(m[2]), m[1])
    if m := _MONTH_DAY_YEAR.search(text):
        return _date(m[3], _month(m[1]), m[2])
    return None


@functools.lru_cache(maxsize=4096)  # a session's facts share one time
def fact_day(time: str | None) -> int:
    """A stored fact's day as a proleptic ordinal (``date.toordinal``), 0 when its ``time`` has none."""
    day = parse_day(date_of(time)) if time else None
    return day.toordinal() if day else 0


@dataclass(frozen=True)
class DateSpan:
    """Days ``first``..``last`` (ordinals, inclusive), or a ``month`` of any year."""

    first: int = 0
    last: int = 0
    month: int = 0

    def mask(self, days: np.ndarray, months: np.ndarray) -> np.ndarray:
        """Which of the facts (their ``fact_day`` ordinals and months, 0: unknown) were said within the span."""
        if self.month:
            return months == self.month
        return (days >= self.first) & (days <= self.last) & (days > 0)


def question_span(text: str) -> DateSpan | None:
    """The span of days ``text`` names: a day ± ``NEAR_DAYS``; a month of a year to ``NEAR_DAYS`` after it; a month
    alone; None when it names no calendar date.

    >>> s = question_span("What did John do the week before August 3, 2023?")
    >>> dt.date.fromordinal(s.first), dt.date.fromordinal(s.last)
    (datetime.date(2023, 7, 27), datetime.date(2023, 8, 10))
    >>> s = question_span("What setback did Melanie face in October 2023?")
    >>> dt.date.fromordinal(s.first), dt.date.fromordinal(s.last)
    (datetime.date(2023, 10, 1), datetime.date(2023, 11, 7))
    >>> question_span("When did Melanie go camping in June?"), question_span("When did Ana move to Oslo?")
    (DateSpan(first=0, last=0, month=6), None)
    """
    if day := parse_day(text):
        return DateSpan(day.toordinal() - NEAR_DAYS, day.toordinal() + NEAR_DAYS)
    if m := _MONTH_YEAR.search(text):
        month, year = _month(m[1]), int(m[2])
        first = dt.date(year, month, 1)
        after = dt.date(year + month // 12, month % 12 + 1, 1)
        return DateSpan(first.toordinal(), after.toordinal() - 1 + NEAR_DAYS)
    if m := _MONTH_ALONE.search(text):
        return DateSpan(month=_month(m[1]))
    return None
