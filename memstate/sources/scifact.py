"""SciFact, as released by its maintainers: the claim files and ``corpus.jsonl``, read and validated.

Claim files (``claims_{train,dev,test}.jsonl``) hold one JSON claim per line: ``id``, ``claim``, ``evidence``
(keyed by the doc id as a *string*; ``{}`` for a NOT ENOUGH INFO claim) and ``cited_doc_ids`` (ints); test claims
carry only ``id`` and ``claim``::

    {"id": 13, "claim": "…", "evidence": {"1150": [{"sentences": [2], "label": "SUPPORT"}]}, "cited_doc_ids": [1150]}

The corpus holds one abstract per line: ``doc_id``, ``title``, ``abstract`` (a list of sentences), ``structured``.

``read_corpus`` reads the corpus (bad lines go to a ``SkipLog`` with file, 1-based line and reason);
``decode_line`` + ``parse_claim`` check one claim line, raising ``Skip`` naming the field. Which claims become
instances, and with which sentences, is the data build's (``memstate.data_build.scifact``).
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from memstate.data import loads_record, max_record_bytes, over_limit_reason, read_lines
from memstate.sources.labels import normalize_label
from memstate.sources.skips import SKIP_DUPLICATE, SKIP_INVALID, SkipLog

_CLAIM_LABELS = ("supported", "refuted")  # what a rationale may say; NEI is the absence of rationales
_DOC_KEY = re.compile(r"0|[1-9][0-9]*")  # an evidence key as SciFact writes it: str(doc_id)


class Skip(Exception):
    """A record that is read but not used; ``reason`` names the field or the missing reference."""

    def __init__(self, reason: str, kind: str = SKIP_INVALID):
        super().__init__(reason)
        self.reason, self.kind = reason, kind


@dataclass(frozen=True)
class Doc:
    """One corpus abstract, whitespace-normalized."""

    doc_id: int
    title: str
    sentences: tuple[str, ...]

    def fact(self, i: int) -> str:
        """Sentence ``i`` as a fact text. SciFact titles often end with a period, which would read "….: …"."""
        title = self.title[:-1] if self.title.endswith(".") and not self.title.endswith("..") else self.title
        return f"{title}: {self.sentences[i]}"


@dataclass(frozen=True)
class Rationale:
    """One rationale set: sentences of one abstract that together decide the claim."""

    doc_id: int
    sentences: tuple[int, ...]  # as annotated, duplicates removed
    label: str  # normalized: supported | refuted


@dataclass(frozen=True)
class ClaimRecord:
    """A well-formed labeled claim, before its rationales are looked up in the corpus."""

    claim_id: int
    claim: str
    cited: tuple[int, ...]
    rationales: tuple[Rationale, ...]  # in file order: doc by doc, then set by set; empty = NOT ENOUGH INFO

    @property
    def doc_ids(self) -> list[int]:
        """Docs with rationales, in file order."""
        return list(dict.fromkeys(r.doc_id for r in self.rationales))


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _clean(text: str) -> str:
    return " ".join(text.split())


def _no_duplicate_keys(pairs: list[tuple[str, object]]) -> dict:
    # json.loads keeps the last of two equal keys; for an evidence object that would drop a doc's rationales.
    obj: dict = {}
    for key, value in pairs:
        if key in obj:
            raise Skip(f"duplicate key {key!r} in a JSON object")
        obj[key] = value
    return obj


def decode_line(raw: bytes, lineno: int) -> object:
    """One JSONL line → its JSON value; raises Skip for an undecodable line."""
    try:
        text = raw.decode("utf-8-sig" if lineno == 1 else "utf-8")
    except UnicodeDecodeError as e:
        raise Skip(f"line is not valid UTF-8 ({e.reason} at byte {e.start})") from None
    if not text.strip():
        raise Skip("empty line")
    try:
        return loads_record(text.rstrip("\r\n"), object_pairs_hook=_no_duplicate_keys)
    except json.JSONDecodeError as e:
        raise Skip(f"invalid JSON ({e.msg}, column {e.colno})") from None


def record_id(record: object, name: str) -> int | None:
    """The record's id for the skip list, when it has a readable one (``record``: a decoded object or a raw line)."""
    if isinstance(record, bytes):
        try:
            record = loads_record(record)
        except (json.JSONDecodeError, UnicodeDecodeError):
            return None
    value = record.get(name) if isinstance(record, dict) else None
    return value if _is_int(value) else None


def _require(obj: object, names: Sequence[str]) -> dict:
    if not isinstance(obj, dict):
        raise Skip(f"record is a JSON {type(obj).__name__}, expected an object")
    missing = [repr(n) for n in names if n not in obj]
    if len(missing) == 1:
        raise Skip(f"field {missing[0]} is missing")
    if missing:
        raise Skip(f"fields {', '.join(missing)} are missing")
    return obj


# ---- corpus ----------------------------------------------------------------------------------------------------


def parse_doc(obj: object) -> Doc:
    """Validate one decoded corpus record → Doc. Raises Skip naming the field."""
    obj = _require(obj, ("doc_id", "title", "abstract"))
    doc_id, title, abstract = obj["doc_id"], obj["title"], obj["abstract"]
    if not _is_int(doc_id) or doc_id < 0:
        raise Skip(f"field 'doc_id' must be an integer ≥ 0, got {doc_id!r}")
    if not isinstance(title, str) or not title.strip():
        raise Skip(f"field 'title' must be a non-empty string, got {title!r}")
    if not isinstance(abstract, list) or not all(isinstance(s, str) for s in abstract):
        raise Skip(f"field 'abstract' must be a list of sentence strings, got {abstract!r:.80}")
    # `structured` is not used, but a wrong type means the file is not the SciFact corpus.
    if "structured" in obj and not isinstance(obj["structured"], bool):
        raise Skip(f"field 'structured' must be true or false, got {obj['structured']!r}")
    return Doc(doc_id, _clean(title), tuple(_clean(s) for s in abstract))


def read_corpus(path: Path, log: SkipLog) -> tuple[dict[int, Doc], int, int]:
    """(every valid abstract by doc id, lines read, lines used); bad lines go to ``log``. All are kept: the corpus is
    ~5k abstracts (a few MB), and which ones the claims cite is known only after the claims are read. A doc is "used"
    when it parses, cited or not, so the corpus file balances: docs read = valid docs + skipped docs."""
    key = str(path)
    lines = used = 0
    docs: dict[int, Doc] = {}
    first_at: dict[int, int] = {}
    limit = max_record_bytes()
    with open(path, "rb") as f:
        for lineno, raw, size in read_lines(f, limit):
            lines += 1
            obj = None
            if raw is None:  # over the limit: not read whole
                log.skip(key, lineno, over_limit_reason(size, limit), SKIP_INVALID)
                continue
            try:
                obj = decode_line(raw, lineno)
                doc = parse_doc(obj)
                if doc.doc_id in docs:
                    first = f"{key}:{first_at[doc.doc_id]}"
                    raise Skip(f"duplicate doc_id {doc.doc_id} (first at {first})", SKIP_DUPLICATE)
            except Skip as s:
                log.skip(key, lineno, s.reason, s.kind, record_id(obj, "doc_id"))
                continue
            docs[doc.doc_id] = doc
            first_at[doc.doc_id] = lineno
            used += 1
    return docs, lines, used


# ---- claims ----------------------------------------------------------------------------------------------------


def _parse_cited(value: object) -> tuple[int, ...]:
    if not isinstance(value, list):
        raise Skip(f"field 'cited_doc_ids' must be a list of ints, got {type(value).__name__}")
    for i, doc_id in enumerate(value):
        if not _is_int(doc_id) or doc_id < 0:
            raise Skip(f"field 'cited_doc_ids' item {i} must be a doc id (an integer ≥ 0), got {doc_id!r}")
    return tuple(dict.fromkeys(value))  # a doc cited twice is still one doc


def _parse_rationale(doc_id: int, j: int, value: object) -> Rationale:
    where = f"field 'evidence' doc {doc_id} rationale {j}"
    if not isinstance(value, dict) or "sentences" not in value or "label" not in value:
        raise Skip(f"{where} must be an object with 'sentences' and 'label', got {value!r:.80}")
    sentences, label = value["sentences"], value["label"]
    if not isinstance(sentences, list) or not sentences:
        raise Skip(f"{where}: field 'sentences' must be a non-empty list of sentence indices, got {sentences!r}")
    for s in sentences:
        if not _is_int(s) or s < 0:
            raise Skip(f"{where}: field 'sentences' holds {s!r}, expected sentence indices (integers ≥ 0)")
    try:
        normalized = normalize_label(label) if isinstance(label, str) else None
    except ValueError:
        normalized = None
    if normalized not in _CLAIM_LABELS:
        raise Skip(f"{where}: field 'label' is {label!r}, expected 'SUPPORT' or 'CONTRADICT'")
    return Rationale(doc_id, tuple(dict.fromkeys(sentences)), normalized)


def _parse_evidence(value: object) -> tuple[Rationale, ...]:
    if not isinstance(value, dict):
        raise Skip(f"field 'evidence' must be an object keyed by doc id, got {type(value).__name__}")
    rationales: list[Rationale] = []
    for key, sets in value.items():
        if not _DOC_KEY.fullmatch(key):
            raise Skip(f"field 'evidence' key {key!r} is not a doc id")
        doc_id = int(key)  # JSON object keys are strings; the corpus and cited_doc_ids use ints
        if not isinstance(sets, list) or not sets:
            raise Skip(f"field 'evidence' doc {doc_id} must be a non-empty list of rationales, got {sets!r:.80}")
        rationales += [_parse_rationale(doc_id, j, r) for j, r in enumerate(sets)]
    return tuple(rationales)


def parse_claim(obj: object) -> ClaimRecord | int:
    """Validate one decoded claim record → ClaimRecord, or the claim id of a test claim (no ``evidence`` and no
    ``cited_doc_ids``). Raises Skip naming the field."""
    obj = _require(obj, ("id", "claim"))
    claim_id, claim = obj["id"], obj["claim"]
    if not _is_int(claim_id):
        raise Skip(f"field 'id' must be an integer, got {claim_id!r}")
    if not isinstance(claim, str) or not claim.strip():
        raise Skip(f"field 'claim' must be a non-empty string, got {claim!r}")
    if "evidence" not in obj and "cited_doc_ids" not in obj:
        return claim_id
    obj = _require(obj, ("evidence", "cited_doc_ids"))
    cited = _parse_cited(obj["cited_doc_ids"])
    rationales = _parse_evidence(obj["evidence"])
    if not rationales and not cited:
        raise Skip("field 'cited_doc_ids' is empty, so the NOT ENOUGH INFO claim (empty 'evidence') has no context")
    return ClaimRecord(claim_id, _clean(claim), cited, rationales)
