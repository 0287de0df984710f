"""SciFact claims → ``EvidenceClaim``s with resolved rationale sentences (NOT ENOUGH INFO claims: the opening of
the abstracts they cite as context).

The files are read and validated by ``memstate.sources.scifact`` (the format is described there). Every record read
is either used or skipped with its file, 1-based line and a reason.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from memstate.data import max_record_bytes, over_limit_reason, read_lines, text_problem
from memstate.data_build.records import EvidenceClaim, SourceRead
from memstate.data_build.registry import DataSource, input_dir, register
from memstate.errors import InputNotFound
from memstate.sources.scifact import ClaimRecord, Doc, Rationale, Skip, decode_line, parse_claim, read_corpus, record_id
from memstate.sources.skips import (
    SKIP_CONFLICTING,
    SKIP_DUPLICATE,
    SKIP_INVALID,
    SKIP_UNLABELED,
    SKIP_UNRESOLVED,
    SkipLog,
    input_record,
)

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


@dataclass
class SciFactConfig:
    dir: str = field(metadata={"help": "Directory holding claims_*.jsonl and corpus.jsonl."})
    claim_files: list[str] = field(
        default_factory=lambda: ["claims_train.jsonl", "claims_dev.jsonl"], metadata={"help": "Claim files."}
    )
    corpus_file: str = field(default="corpus.jsonl", metadata={"help": "The abstracts corpus."})
    max_claims: int | None = field(default=None, metadata={"help": "Stop reading after N usable claims."})


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
            raise Skip(f"evidence doc {r.doc_id} is not in the corpus", SKIP_UNRESOLVED)
        for s in r.sentences:
            if s >= len(doc.sentences):
                n = len(doc.sentences)
                raise Skip(f"evidence doc {r.doc_id} has no sentence {s} (its abstract has {n})", SKIP_UNRESOLVED)
            if not doc.sentences[s]:
                raise Skip(f"evidence doc {r.doc_id} sentence {s} is empty", SKIP_UNRESOLVED)


def _label(rec: ClaimRecord) -> str:
    per_doc: dict[int, dict[str, None]] = {}  # doc → its labels, in order (a dict as an ordered set)
    for r in rec.rationales:
        per_doc.setdefault(r.doc_id, {})[r.label] = None
    distinct = {label for labels in per_doc.values() for label in labels}
    if len(distinct) > 1:
        said = ", ".join(f"doc {d} → {' and '.join(labels)}" for d, labels in per_doc.items())
        raise Skip(f"rationales disagree on the label: {said}", SKIP_CONFLICTING)
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
        raise Skip(f"NOT ENOUGH INFO claim has no context: {why}", SKIP_UNRESOLVED)
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
    """One claim line → EvidenceClaim; raises Skip otherwise."""
    rec = parse_claim(decode_line(raw, lineno))
    if isinstance(rec, int):
        # Not registered in `seen`: test claims never become items, so their ids cannot collide in the dataset.
        raise Skip(UNLABELED_REASON, SKIP_UNLABELED)
    if (problem := text_problem(rec.claim)) is not None:  # cannot be written out (UTF-8)
        raise Skip(f"field 'claim': {problem}", SKIP_INVALID)
    if rec.claim_id in seen:
        raise Skip(f"duplicate claim id {rec.claim_id} (first at {seen[rec.claim_id]})", SKIP_DUPLICATE)
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
    limit = max_record_bytes()
    with open(path, "rb") as f:
        for lineno, raw, size in read_lines(f, limit):
            if max_claims is not None and len(read.items) >= max_claims:
                read.stopped_at = {"file": key, "next_line": lineno}
                return True
            read.records_in[key] += 1
            if raw is None:  # not held in memory, so not parsed for its id either
                log.skip(key, lineno, over_limit_reason(size, limit), SKIP_INVALID)
                continue
            try:
                item = _claim_line(raw, lineno, key, rel, corpus, seen)
            except Skip as s:
                log.skip(key, lineno, s.reason, s.kind, record_id(raw, "id"))
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
    corpus, lines, used = read_corpus(corpus_path, log)
    read.inputs.append(input_record(corpus_path, CORPUS_KIND))
    read.records_in[str(corpus_path)], read.records_used[str(corpus_path)] = lines, used
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


def _read(c: SciFactConfig, config, log: SkipLog) -> SourceRead:
    scifact_dir = input_dir(c.dir, "SciFact")
    return read_scifact(scifact_dir, c.claim_files, log, corpus_file=c.corpus_file, max_claims=c.max_claims)


register(DataSource(SOURCE, "SciFact inputs.", SciFactConfig, _read, order=20))
