"""Memory seeds of a query for MemSearch-o1 (``memory.memsearch``): noun chunks, verb lemmas and date expressions.

The paper's released code (``memory_adv.py``, ``_extract_key_entities_from_query``) runs spaCy's ``en_core_web_sm``
and takes ``doc.noun_chunks``, the ``lemma_`` of every token whose ``pos_`` is ``VERB``, and the entities labelled
``DATE``. That trained pipeline is distributed from GitHub, not from PyPI (PyPI has only unofficial re-uploads, which
this project does not install), and nothing may be downloaded at run time. So the seeds come from whichever of these
is available, and ``SeedExtractor.name`` says which:

- ``en_core_web_sm``: if a spaCy package of that name is installed, it is used exactly as the released code does.
- ``spacy-blank-en+lookups+rules`` (the default here): spaCy's rule-based English tokenizer (``spacy.blank("en")``,
  no model) and its stop words; lemmas from the English lookup table of ``spacy-lookups-data``; part-of-speech
  *guesses* from that package's WordNet-derived lemma index (noun / verb / adjective / adverb word lists) plus
  context rules (after a subject pronoun, "to" or an auxiliary a noun/verb word is a verb; after a determiner or a
  possessive it is a noun; an inflected form of a verb-only or ambiguous word is a verb); words in no list are taken
  as nouns (names, rare words). Noun chunks are maximal runs of adjectives / nouns / numbers ending in a noun;
  dates are regular expressions (ISO and numeric dates, month and weekday names with day and year, years after
  "in/since/until", "last/next/this week…", "yesterday", "N days ago", seasons).
- ``regex+rules``: without spaCy, a regular-expression tokenizer, lowercased words as lemmas, the same rules.

Differences from the released code in every mode: chunks consisting only of pronouns ("I", "you") and the
determiners/possessives that open a chunk are dropped (they match every sentence); seeds are de-duplicated,
case-insensitively, in query order.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

_MONTH = (r"(?:jan(?:uary)?|feb(?:ruary)?|mar(?:ch)?|apr(?:il)?|may|june?|july?|aug(?:ust)?|sep(?:t(?:ember)?)?|"
          r"oct(?:ober)?|nov(?:ember)?|dec(?:ember)?)")  # fmt: skip
_WEEKDAY = r"(?:mon|tues|wednes|thurs|fri|satur|sun)day"
_UNIT = r"(?:second|minute|hour|day|week|weekend|fortnight|month|year|decade|summer|winter|spring|autumn|fall|" \
        r"morning|afternoon|evening|night|semester|term|quarter)"  # fmt: skip
_NUMWORD = r"(?:\d+|a|an|one|two|three|four|five|six|seven|eight|nine|ten|a few|several|couple of)"
_DATE = re.compile(
    "|".join(
        [
            r"\b\d{4}-\d{2}-\d{2}\b",
            r"\b\d{1,2}/\d{1,2}(?:/\d{2,4})?\b",
            rf"\b{_MONTH}\.?\s+\d{{1,2}}(?:st|nd|rd|th)?(?:,?\s+\d{{4}})?\b",
            rf"\b\d{{1,2}}(?:st|nd|rd|th)?\s+(?:of\s+)?{_MONTH}\b(?:,?\s+\d{{4}})?",
            rf"\b{_MONTH}\s+(?:of\s+)?\d{{4}}\b",
            rf"\b(?:last|next|this|every|past|coming|previous)\s+(?:{_UNIT}|{_WEEKDAY}|{_MONTH})s?\b",
            rf"\b{_NUMWORD}\s+{_UNIT}s?\s+(?:ago|later|from now|before|earlier)\b",
            rf"\b(?:the\s+)?(?:{_UNIT}|day)\s+(?:before|after)\s+(?:yesterday|tomorrow)\b",
            rf"\b{_WEEKDAY}s?\b",
            r"\b(?:yesterday|today|tonight|tomorrow)\b",
            rf"\b{_MONTH}\b(?=\s+(?:\d|last|next|this)|[.,!?]|$)",
            r"\b(?:in|since|until|till|by|from|during|before|after)\s+((?:19|20)\d{2}s?)\b",  # group 1: the year
            r"\b(?:spring|summer|autumn|fall|winter)\s+(?:of\s+)?(?:19|20)\d{2}\b",
        ]
    ),
    re.IGNORECASE,
)
_NOMINAL = ("ADJ", "NOUN", "PROPN", "NUM")
_REGEX_TOKEN = re.compile(r"[A-Za-z]+(?:'[A-Za-z]+)?|\d+(?:[.,]\d+)*|[^\sA-Za-z\d]")
_PRONOUNS = frozenset("i me my mine myself you your yours yourself he him his she her hers it its we us our ours "
                      "they them their theirs this that these those who whom what which".split())  # fmt: skip
_OPENERS = frozenset("a an the my your his her its our their this that these those some any each every no".split())
_VERB_BEFORE = frozenset("i you he she we they it to will would can could should must might may shall do did does "
                         "don't didn't doesn't won't wouldn't can't couldn't never not 'll 'd".split())  # fmt: skip
_AUX = frozenset("to will would can could should must might may shall do did does don't didn't doesn't won't".split())
_NOUN_BEFORE = _OPENERS | frozenset("of for in on with about at from into by".split())
_MINI_STOP = frozenset("a an the and or but if of to in on at by for with about from into as is am are was were be "
                       "been being do does did done have has had having get gets got i you he she it we they me him "
                       "her us them my your his its our their this that these those what which who whom when where "
                       "why how not no so than then there here can could will would shall should may might must all "
                       "some any many much more most other such very too also just only still even really please now "
                       "again soon later once "
                       "'s 's n't 'm 're 've 'll 'd".split())  # fmt: skip
_ADVERBS = frozenset("still also just never always often usually really even already sometimes not n't ever "
                     "actually probably".split())  # fmt: skip


@dataclass(frozen=True)
class Seed:
    """A memory seed: ``text`` as it stands in the query (a verb: its lemma), ``kind`` noun / verb / date, and the
    lemmas a sentence must contain to grow a fragment from it (``head``: the noun chunk's last lemma)."""

    text: str
    kind: str
    head: str


@dataclass(frozen=True)
class _Tok:
    text: str
    start: int
    lower: str
    lemma: str
    stop: bool
    punct: bool
    num: bool


def _tokens_regex(text: str) -> list[_Tok]:
    return [
        _Tok(m.group(), m.start(), m.group().lower(), m.group().lower(), m.group().lower() in _MINI_STOP,
             not m.group()[0].isalnum(), m.group()[0].isdigit())
        for m in _REGEX_TOKEN.finditer(text)
    ]  # fmt: skip


@functools.cache
def _lookups() -> tuple[Any, dict[str, frozenset[str]]] | None:
    try:
        from spacy.lookups import load_lookups

        tables = load_lookups("en", ["lemma_lookup", "lemma_index"])
    except Exception:  # spacy-lookups-data missing or unreadable: lowercased forms as lemmas, no word lists
        return None
    index = tables.get_table("lemma_index")
    return tables.get_table("lemma_lookup"), {p: frozenset(index[p]) for p in ("noun", "verb", "adj", "adv")}


class SeedExtractor:
    """``extractor(text)`` → seeds in query order; ``name`` says which pipeline made them (module docstring)."""

    def __init__(self) -> None:
        self._nlp: Any = None
        self._tagger: Callable[[str], list[_Tok]] = _tokens_regex
        self.name = "regex+rules"
        try:
            import spacy
        except ImportError:
            spacy = None
        if spacy is not None and spacy.util.is_package("en_core_web_sm"):
            self._nlp = spacy.load("en_core_web_sm")
            self.name = "en_core_web_sm"
            return
        if spacy is not None:
            blank = spacy.blank("en")
            lookups = _lookups()
            self.name = "spacy-blank-en" + ("+lookups" if lookups else "") + "+rules"

            def tokens(text: str) -> list[_Tok]:
                out = []
                for t in blank(text):
                    lemma = t.lower_ if lookups is None else str(lookups[0].get(t.lower_, t.lower_)).lower()
                    out.append(_Tok(t.text, t.idx, t.lower_, lemma, t.is_stop, t.is_punct or t.is_space, t.like_num))
                return out

            self._tagger = tokens

    def lemmas(self, text: str) -> set[str]:
        """The lowercased lemmas (and forms) of ``text``'s words, for matching seeds to sentences."""
        if self._nlp is not None:
            return {w for t in self._nlp(text) for w in (t.lemma_.lower(), t.lower_)}
        return {w for t in self._tagger(text) for w in (t.lemma, t.lower)}

    def __call__(self, text: str) -> list[Seed]:
        seeds = self._spacy(text) if self._nlp is not None else self._rules(text)
        out, seen = [], set()
        for s in seeds:
            key = (s.kind, s.text.lower())
            if s.text.strip() and key not in seen:
                seen.add(key)
                out.append(s)
        return out

    def _spacy(self, text: str) -> list[Seed]:
        doc = self._nlp(text)
        nouns = []
        for chunk in doc.noun_chunks:
            words = [t for t in chunk if t.lower_ not in _OPENERS]
            if words and not all(t.lower_ in _PRONOUNS for t in words):
                span = text[words[0].idx : words[-1].idx + len(words[-1])]
                nouns.append(Seed(span, "noun", words[-1].lemma_.lower()))
        verbs = [Seed(t.lemma_.lower(), "verb", t.lemma_.lower()) for t in doc if t.pos_ == "VERB"]
        dates = [Seed(e.text, "date", e.text.lower()) for e in doc.ents if e.label_ == "DATE"]
        return nouns + verbs + dates

    def _rules(self, text: str) -> list[Seed]:
        dates = [m.span(1) if m.group(1) else m.span() for m in _DATE.finditer(text)]
        toks = [t for t in self._tagger(text) if not any(a <= t.start < b for a, b in dates)]
        tags = [self._pos(toks, i) for i in range(len(toks))]
        nouns: list[Seed] = []
        run: list[int] = []

        def flush() -> None:
            while run and tags[run[-1]] not in ("NOUN", "PROPN"):
                run.pop()
            if run:
                first, last = toks[run[0]], toks[run[-1]]
                nouns.append(Seed(text[first.start : last.start + len(last.text)], "noun", last.lemma))

        for i, tag in enumerate(tags):
            if run:  # adjacent in the text: only spaces between (a date or punctuation breaks the chunk)
                prev = toks[run[-1]]
                adjacent = not text[prev.start + len(prev.text) : toks[i].start].strip()
            if tag in _NOMINAL and (not run or adjacent):
                run.append(i)
                continue
            flush()
            run = [i] if tag in _NOMINAL else []
        flush()
        verbs = [Seed(t.lemma, "verb", t.lemma) for t, tag in zip(toks, tags, strict=True) if tag == "VERB"]
        date_seeds = [Seed(text[a:b], "date", text[a:b].lower()) for a, b in dates]
        return nouns + verbs + date_seeds

    def _pos(self, toks: list[_Tok], i: int) -> str:
        t = toks[i]
        if t.punct:
            return "PUNCT"
        if t.num:
            return "NUM"
        if t.lower in _MINI_STOP or t.lower in _PRONOUNS or t.lower in _OPENERS or not t.text[0].isalpha():
            return "FUNC"
        lookups = _lookups() if self.name != "regex+rules" else None
        if lookups is None:
            cands = set()
        else:
            index = lookups[1]
            cands = {p for p in ("noun", "verb", "adj", "adv") if t.lemma in index[p] or t.lower in index[p]}
        if not cands:
            return "PROPN" if t.text[:1].isupper() and i > 0 else "NOUN"
        if cands == {"adv"}:
            return "ADV"
        prev = next((toks[j] for j in range(i - 1, -1, -1)
                     if not (toks[j].lower.endswith("ly") or toks[j].lower in _ADVERBS)), None)  # fmt: skip
        after_subject = prev is not None and prev.lower in _VERB_BEFORE
        # "did my sister move": an auxiliary a few words back, with only its subject in between
        after_subject = after_subject or (not (prev is not None and prev.lower in _NOUN_BEFORE) and any(
            toks[j].lower in _AUX for j in range(max(0, i - 4), i)))  # fmt: skip
        after_opener = prev is not None and prev.lower in _NOUN_BEFORE
        if "verb" in cands:
            if after_subject or cands <= {"verb", "adv"}:
                return "VERB"
            if t.lower != t.lemma and not after_opener:  # an inflected form (bought, mentioned, running)
                return "VERB"
        if "adj" in cands:  # trailing adjectives are trimmed from chunks ("coffee bad" → "coffee")
            return "ADJ"
        return "NOUN" if "noun" in cands else "VERB"


@functools.cache
def default_seed_extractor() -> SeedExtractor:
    """One extractor per process (spaCy's tokenizer and the lookup tables load once)."""
    return SeedExtractor()


def seed_matches(seed: Seed, sentence_lemmas: set[str], sentence_lower: str) -> bool:
    """A sentence grows a fragment from ``seed`` when it holds the seed's head lemma (noun chunk), its lemma (verb)
    or the date expression.

    >>> seed_matches(Seed("green tea", "noun", "tea"), {"i", "drink", "tea"}, "i drink tea.")
    True
    >>> seed_matches(Seed("last Monday", "date", "last monday"), {"monday"}, "on monday i left.")
    False
    """
    if seed.kind == "date":
        return seed.head in sentence_lower
    return seed.head in sentence_lemmas
