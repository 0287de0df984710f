"""SciFact, as released by its maintainers: claim files + ``corpus.jsonl`` → claims with resolved rationale sentences.

Claim files (``claims_{train,dev,test}.jsonl``) hold one JSON claim per line: ``id``, ``claim``, ``evidence``
(``{"<doc_id>": [{"sentences": [int, ...], "label": "SUPPORT" | "CONTRADICT"}, ...]}``, keyed by the doc id as a
*string*; ``{}`` for a NOT ENOUGH INFO claim) and ``cited_doc_ids`` (ints). Test claims carry only ``id`` and
``claim``. The corpus holds one abstract per line: ``doc_id``, ``title``, ``abstract`` (a list of sentences),
``structured``. Every record read is either used or skipped with its file, 1-based line and a reason.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from memstate.data_build.labels import normalize_label
from memstate.data_build.records import (
    SKIP_CONFLICTING,
    SKIP_DUPLICATE,
    SKIP_INVALID,
    SKIP_UNLABELED,
    SKIP_UNRESOLVED,
    EvidenceClaim,
    SkipLog,
    SourceRead,
    input_record,
)

from memstate.errors import InputNotFound

SOURCE = "scifact"
CLAIMS_KIND = "scifact_claims"
CORPUS_KIND = "scifact_corpus"
# Not structural, so a strict build goes on: the record is well-formed, but its cited abstracts disagree (SciFact
# labels claim-abstract pairs), so there is no single answer. Candidate for memstate.data_build.records.
UNLABELED_REASON = "SciFact test claims carry no label"

# SciFact rationales are 1-3 sentences and most claims have one; a few have many rationale sets over several
# abstracts. Each rationale set alone justifies the label, so past this many sentences more sets add prompt length
# (shared with the injected memory and distractors) and no information.
MAX_EVIDENCE_SENTENCES = 6
# A NOT ENOUGH INFO claim shows the opening of the abstracts it cited: retrieved, on topic, but not deciding it.
NEI_CONTEXT_DOCS = 3
NEI_CONTEXT_SENTENCES = 2

_CLAIM_LABELS = ("supported", "refuted")  # what a rationale may say; NEI is the absence of rationales
_DOC_KEY = re.compile(r"0|[1-9][0-9]*")  # an evidence key as SciFact writes it: str(doc_id)


class _Skip(Exception):
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
            raise _Skip(f"duplicate key {key!r} in a JSON object")
        obj[key] = value
    return obj


def _decode(raw: bytes, lineno: int) -> object:
    """One JSONL line → its JSON value; raises _Skip for an undecodable line."""
    try:
        text = raw.decode("utf-8-sig" if lineno == 1 else "utf-8")
    except UnicodeDecodeError as e:
        raise _Skip(f"line is not valid UTF-8 ({e.reason} at byte {e.start})") from None
    if not text.strip():
        raise _Skip("empty line")
    try:
        return json.loads(text.rstrip("\r\n"), object_pairs_hook=_no_duplicate_keys)
    except json.JSONDecodeError as e:
        raise _Skip(f"invalid JSON ({e.msg}, column {e.colno})") from None


def _id_of(record: object, name: str) -> int | None:
    """The record's id for the skip list, when it has a readable one (``record``: a decoded object or a raw line)."""
    if isinstance(record, bytes):
        try:
            record = json.loads(record)
        except (json.JSONDecodeError, UnicodeDecodeError):
            return None
    value = record.get(name) if isinstance(record, dict) else None
    return value if _is_int(value) else None


def _require(obj: object, names: Sequence[str]) -> dict:
    if not isinstance(obj, dict):
        raise _Skip(f"record is a JSON {type(obj).__name__}, expected an object")
    missing = [repr(n) for n in names if n not in obj]
    if len(missing) == 1:
        raise _Skip(f"field {missing[0]} is missing")
    if missing:
        raise _Skip(f"fields {', '.join(missing)} are missing")
    return obj


# ---- corpus ----------------------------------------------------------------------------------------------------


def parse_doc(obj: object) -> Doc:
    """Validate one decoded corpus record → Doc. Raises _Skip naming the field."""
    obj = _require(obj, ("doc_id", "title", "abstract"))
    doc_id, title, abstract = obj["doc_id"], obj["title"], obj["abstract"]
    if not _is_int(doc_id) or doc_id < 0:
        raise _Skip(f"field 'doc_id' must be an integer ≥ 0, got {doc_id!r}")
    if not isinstance(title, str) or not title.strip():
        raise _Skip(f"field 'title' must be a non-empty string, got {title!r}")
    if not isinstance(abstract, list) or not all(isinstance(s, str) for s in abstract):
        raise _Skip(f"field 'abstract' must be a list of sentence strings, got {abstract!r:.80}")
    # `structured` is not used, but a wrong type means the file is not the SciFact corpus.
    if "structured" in obj and not isinstance(obj["structured"], bool):
        raise _Skip(f"field 'structured' must be true or false, got {obj['structured']!r}")
    return Doc(doc_id, _clean(title), tuple(_clean(s) for s in abstract))


def _read_corpus(path: Path, log: SkipLog, read: SourceRead) -> dict[int, Doc]:
    """Every valid abstract by doc id. All are kept: the corpus is ~5k abstracts (a few MB), and which ones the
    claims cite is known only after the claims are read. A doc is "used" when it parses, cited or not, so the
    corpus file balances: docs read = valid docs + skipped docs."""
    key = str(path)
    read.inputs.append(input_record(path, CORPUS_KIND))
    read.records_in[key] = read.records_used[key] = 0
    docs: dict[int, Doc] = {}
    first_at: dict[int, int] = {}
    with open(path, "rb") as f:
        for lineno, raw in enumerate(f, 1):
            read.records_in[key] += 1
            obj = None
            try:
                obj = _decode(raw, lineno)
                doc = parse_doc(obj)
                if doc.doc_id in docs:
                    first = f"{key}:{first_at[doc.doc_id]}"
                    raise _Skip(f"duplicate doc_id {doc.doc_id} (first at {first})", SKIP_DUPLICATE)
            except _Skip as s:
                log.skip(key, lineno, s.reason, s.kind, _id_of(obj, "doc_id"))
                continue
            docs[doc.doc_id] = doc
            first_at[doc.doc_id] = lineno
            read.records_used[key] += 1
    return docs


# ---- claims ----------------------------------------------------------------------------------------------------


def _parse_cited(value: object) -> tuple[int, ...]:
    if not isinstance(value, list):
        raise _Skip(f"field 'cited_doc_ids' must be a list of ints, got {type(value).__name__}")
    for i, doc_id in enumerate(value):
        if not _is_int(doc_id) or doc_id < 0:
            raise _Skip(f"field 'cited_doc_ids' item {i} must be a doc id (an integer ≥ 0), got {doc_id!r}")
    return tuple(dict.fromkeys(value))  # a doc cited twice is still one doc


def _parse_rationale(doc_id: int, j: int, value: object) -> Rationale:
    where = f"field 'evidence' doc {doc_id} rationale {j}"
    if not isinstance(value, dict) or "sentences" not in value or "label" not in value:
        raise _Skip(f"{where} must be an object with 'sentences' and 'label', got {value!r:.80}")
    sentences, label = value["sentences"], value["label"]
    if not isinstance(sentences, list) or not sentences:
        raise _Skip(f"{where}: field 'sentences' must be a non-empty list of sentence indices, got {sentences!r}")
    for s in sentences:
        if not _is_int(s) or s < 0:
            raise _Skip(f"{where}: field 'sentences' holds {s!r}, expected sentence indices (integers ≥ 0)")
    try:
        normalized = normalize_label(label) if isinstance(label, str) else None
    except ValueError:
        normalized = None
    if normalized not in _CLAIM_LABELS:
        raise _Skip(f"{where}: field 'label' is {label!r}, expected 'SUPPORT' or 'CONTRADICT'")
    return Rationale(doc_id, tuple(dict.fromkeys(sentences)), normalized)


def _parse_evidence(value: object) -> tuple[Rationale, ...]:
    if not isinstance(value, dict):
        raise _Skip(f"field 'evidence' must be an object keyed by doc id, got {type(value).__name__}")
    rationales: list[Rationale] = []
    for key, sets in value.items():
        if not _DOC_KEY.fullmatch(key):
            raise _Skip(f"field 'evidence' key {key!r} is not a doc id")
        doc_id = int(key)  # JSON object keys are strings; the corpus and cited_doc_ids use ints
        if not isinstance(sets, list) or not sets:
            raise _Skip(f"field 'evidence' doc {doc_id} must be a non-empty list of rationales, got {sets!r:.80}")
        rationales += [_parse_rationale(doc_id, j, r) for j, r in enumerate(sets)]
    return tuple(rationales)


def parse_claim(obj: object) -> ClaimRecord | int:
    """Validate one decoded claim record → ClaimRecord, or the claim id of a test claim (no ``evidence`` and no
    ``cited_doc_ids``). Raises _Skip naming the field."""
    obj = _require(obj, ("id", "claim"))
    claim_id, claim = obj["id"], obj["claim"]
    if not _is_int(claim_id):
        raise _Skip(f"field 'id' must be an integer, got {claim_id!r}")
    if not isinstance(claim, str) or not claim.strip():
        raise _Skip(f"field 'claim' must be a non-empty string, got {claim!r}")
    if "evidence" not in obj and "cited_doc_ids" not in obj:
        return claim_id
    obj = _require(obj, ("evidence", "cited_doc_ids"))
    cited = _parse_cited(obj["cited_doc_ids"])
    rationales = _parse_evidence(obj["evidence"])
    if not rationales and not cited:
        raise _Skip("field 'cited_doc_ids' is empty, so the NOT ENOUGH INFO claim (empty 'evidence') has no context")
    return ClaimRecord(claim_id, _clean(claim), cited, rationales)


def select_rationales(rationales: Sequence[Rationale], cap: int = MAX_EVIDENCE_SENTENCES) -> tuple[dict, bool]:
    """The sentences to show, {doc_id: sorted sentence indices} in doc order, and whether the cap dropped any.

    Whole rationale sets are taken in file order while they fit under ``cap``; a set that does not fit is passed
    over (a later, smaller one may fit), so every kept set is complete. Only a first set longer than ``cap`` is cut.

    >>> sets = [Rationale(7, (4, 1), "supported"), Rationale(7, (1, 2), "supported")]
    >>> select_rationales(sets + [Rationale(3, (0, 1, 2), "supported")], cap=4)
    ({7: [1, 2, 4]}, True)
    >>> select_rationales(sets + [Rationale(3, (5,), "supported")], cap=4)
    ({7: [1, 2, 4], 3: [5]}, False)
    """
    chosen: dict[int, set[int]] = {}
    total, capped = 0, False
    for r in rationales:
        new = sorted(set(r.sentences) - chosen.get(r.doc_id, set()))
        if total + len(new) > cap:
            capped = True
            if total:
                continue
            new = new[:cap]
        chosen.setdefault(r.doc_id, set()).update(new)
        total += len(new)
    return {d: sorted(s) for d, s in chosen.items() if s}, capped


def _check_resolves(rec: ClaimRecord, corpus: dict[int, Doc]) -> None:
    for r in rec.rationales:
        doc = corpus.get(r.doc_id)
        if doc is None:
            raise _Skip(f"evidence doc {r.doc_id} is not in the corpus", SKIP_UNRESOLVED)
        for s in r.sentences:
            if s >= len(doc.sentences):
                n = len(doc.sentences)
                raise _Skip(f"evidence doc {r.doc_id} has no sentence {s} (its abstract has {n})", SKIP_UNRESOLVED)
            if not doc.sentences[s]:
                raise _Skip(f"evidence doc {r.doc_id} sentence {s} is empty", SKIP_UNRESOLVED)


def _label(rec: ClaimRecord) -> str:
    per_doc: dict[int, dict[str, None]] = {}  # doc → its labels, in order (a dict as an ordered set)
    for r in rec.rationales:
        per_doc.setdefault(r.doc_id, {})[r.label] = None
    distinct = {label for labels in per_doc.values() for label in labels}
    if len(distinct) > 1:
        said = ", ".join(f"doc {d} → {' and '.join(labels)}" for d, labels in per_doc.items())
        raise _Skip(f"rationales disagree on the label: {said}", SKIP_CONFLICTING)
    return distinct.pop()


def _labeled_claim(rec: ClaimRecord, corpus: dict[int, Doc], rel: str, lineno: int) -> EvidenceClaim:
    _check_resolves(rec, corpus)  # before the label check: a corpus mismatch is structural, so a strict build stops
    label = _label(rec)
    shown, capped = select_rationales(rec.rationales)
    evidence = [corpus[d].fact(s) for d, sentences in shown.items() for s in sentences]
    doc_ids = rec.doc_ids
    meta = {
        "doc_ids": doc_ids,
        "cited_doc_ids": list(rec.cited),
        # Parallel to doc_ids (not keyed by doc id), so Arrow infers one schema for every row.
        "rationale_sentences": [[list(r.sentences) for r in rec.rationales if r.doc_id == d] for d in doc_ids],
        "sentences_used": [shown.get(d, []) for d in doc_ids],
        "evidence_capped": capped,
    }
    return EvidenceClaim(
        source=SOURCE,
        claim_id=str(rec.claim_id),
        claim=rec.claim,
        label=label,
        evidence=tuple(dict.fromkeys(evidence)),  # two docs may share a title and a sentence
        file=rel,
        line=lineno,
        meta=meta,
    )


def _nei_claim(rec: ClaimRecord, corpus: dict[int, Doc], rel: str, lineno: int) -> EvidenceClaim:
    shown: dict[int, list[int]] = {}
    for doc in (corpus[d] for d in rec.cited if d in corpus):
        opening = [i for i, s in enumerate(doc.sentences) if s][:NEI_CONTEXT_SENTENCES]
        if opening:
            shown[doc.doc_id] = opening
        if len(shown) == NEI_CONTEXT_DOCS:
            break
    if not shown:
        missing = [d for d in rec.cited if d not in corpus]
        why = f"cited docs {missing} are not in the corpus" if missing else "cited docs have no abstract sentences"
        raise _Skip(f"NOT ENOUGH INFO claim has no context: {why}", SKIP_UNRESOLVED)
    context = [corpus[d].fact(s) for d, sentences in shown.items() for s in sentences]
    meta = {
        "doc_ids": list(shown),
        "cited_doc_ids": list(rec.cited),
        "rationale_sentences": [[] for _ in shown],
        "sentences_used": list(shown.values()),
        "evidence_capped": False,
    }
    return EvidenceClaim(
        source=SOURCE,
        claim_id=str(rec.claim_id),
        claim=rec.claim,
        label="not enough info",
        evidence=(),
        context=tuple(dict.fromkeys(context)),
        file=rel,
        line=lineno,
        meta=meta,
    )


def _claim_line(
    raw: bytes, lineno: int, key: str, rel: str, corpus: dict[int, Doc], seen: dict[int, str]
) -> EvidenceClaim:
    """One claim line → EvidenceClaim; raises _Skip otherwise."""
    rec = parse_claim(_decode(raw, lineno))
    if isinstance(rec, int):
        # Not registered in `seen`: test claims never become items, so their ids cannot collide in the dataset.
        raise _Skip(UNLABELED_REASON, SKIP_UNLABELED)
    if rec.claim_id in seen:
        raise _Skip(f"duplicate claim id {rec.claim_id} (first at {seen[rec.claim_id]})", SKIP_DUPLICATE)
    seen[rec.claim_id] = f"{key}:{lineno}"
    build = _labeled_claim if rec.rationales else _nei_claim
    return build(rec, corpus, rel, lineno)


def _read_claim_file(
    path: Path,
    rel: str,
    corpus: dict[int, Doc],
    log: SkipLog,
    read: SourceRead,
    seen: dict[int, str],
    max_claims: int | None,
) -> bool:
    """Read one claim file into ``read``; True when ``max_claims`` stopped it before its end."""
    key = str(path)
    read.inputs.append(input_record(path, CLAIMS_KIND))
    read.records_in[key] = read.records_used[key] = 0
    with open(path, "rb") as f:
        for lineno, raw in enumerate(f, 1):
            if max_claims is not None and len(read.items) >= max_claims:
                read.stopped_at = {"file": key, "next_line": lineno}
                return True
            read.records_in[key] += 1
            try:
                item = _claim_line(raw, lineno, key, rel, corpus, seen)
            except _Skip as s:
                log.skip(key, lineno, s.reason, s.kind, _id_of(raw, "id"))
                continue
            read.items.append(item)
            read.records_used[key] += 1
    return False


# ---- reader ----------------------------------------------------------------------------------------------------


def _stats(items: list[EvidenceClaim], corpus: dict[int, Doc]) -> dict:
    cited = {d for c in items for d in c.meta["cited_doc_ids"]}
    return {
        "labels": dict(sorted(Counter(c.label for c in items).items())),
        "corpus_docs": len(corpus),
        "docs_shown": len({d for c in items for d in c.meta["doc_ids"]}),
        "cited_docs_missing": sorted(cited - set(corpus)),
        "evidence_capped": sum(1 for c in items if c.meta["evidence_capped"]),
    }


def read_scifact(
    scifact_dir: Path,
    claim_files: Sequence[str],
    log: SkipLog,
    corpus_file: str = "corpus.jsonl",
    max_claims: int | None = None,
) -> SourceRead:
    """The corpus, then the claim files in order (paths relative to ``scifact_dir``) → EvidenceClaims, one per
    usable claim line; every other line goes to ``log``. Reading stops once ``max_claims`` claims were produced."""
    if max_claims is not None and max_claims < 0:
        raise ValueError(f"max_claims must be ≥ 0, got {max_claims}")
    scifact_dir = Path(scifact_dir)
    corpus_path = scifact_dir / corpus_file
    for path in [corpus_path, *(scifact_dir / rel for rel in claim_files)]:
        if not path.is_file():  # checked up front, so a typo fails before the corpus is read
            raise InputNotFound(f"SciFact file not found: {path} (scifact.corpus_file / claim_files)")
    read = SourceRead(source=SOURCE, items=[])
    corpus = _read_corpus(corpus_path, log, read)
    seen: dict[int, str] = {}
    for rel in claim_files:
        path = scifact_dir / rel
        if max_claims is not None and len(read.items) >= max_claims:
            read.stopped_at = {"file": str(path), "next_line": 1}
            break
        if _read_claim_file(path, Path(rel).as_posix(), corpus, log, read, seen, max_claims):
            break
    read.stats = _stats(read.items, corpus)
    return read
