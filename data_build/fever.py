"""FEVER 1.0 claims → ``EvidenceClaim``s: each claim with its first evidence set whose sentences resolve in the
wiki dump, the sentences decoded as fact texts.

The files are read and validated by ``memstate.sources.fever`` (the format is described there). Every record read
is either used or skipped with its file, 1-based line and a reason; nothing is dropped silently.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from memstate.data import text_problem
from memstate.data_build.records import EvidenceClaim, SourceRead
from memstate.data_build.registry import DataSource, input_dir, register
from memstate.sources.fever import ClaimRecord, EvidenceRef, decode_sentence, decode_title, read_claims, scan_wiki
from memstate.sources.labels import normalize_label
from memstate.sources.skips import SKIP_UNRESOLVED, SkipLog, input_record


@dataclass
class FeverConfig:
    dir: str = field(metadata={"help": "Directory holding the FEVER claim files and wiki-pages/."})
    claim_files: list[str] = field(default_factory=lambda: ["train.jsonl"], metadata={"help": "Claim files."})
    max_claims: int | None = field(default=None, metadata={"help": "Stop reading after N usable claims."})


@dataclass(frozen=True)
class EvidenceSentence:
    """A resolved evidence sentence, decoded."""

    page: str
    sentence: int
    title: str
    text: str

    @property
    def fact_text(self) -> str:
        return f"{self.title}: {self.text}"


def _resolve_set(refs: Iterable[EvidenceRef], pages: dict[str, dict[int, str]]) -> tuple[EvidenceSentence, ...] | str:
    out = []
    for ref in refs:
        sentences = pages.get(ref.page)
        if sentences is None:
            return f"page {ref.page!r} is not in the wiki dump"
        if ref.sentence not in sentences:
            return f"page {ref.page!r} has no sentence {ref.sentence}"
        text = decode_sentence(sentences[ref.sentence])
        if not text:
            return f"page {ref.page!r} sentence {ref.sentence} is empty"
        if (problem := text_problem(text)) is not None:
            return f"page {ref.page!r} sentence {ref.sentence}: {problem}"
        out.append(EvidenceSentence(ref.page, ref.sentence, decode_title(ref.page), text))
    return tuple(out)


def resolve_claims(
    claims: Sequence[ClaimRecord], pages: dict[str, dict[int, str]], log: SkipLog
) -> list[EvidenceClaim]:
    """Each claim with the first evidence set whose sentences all resolve; a claim with none is skipped.

    NOT ENOUGH INFO claims cite no sentences: they come out with empty ``evidence`` (the builder decides what
    retrieved-but-undeciding evidence they are shown with)."""
    out: list[EvidenceClaim] = []
    for rec in claims:
        meta = {"source_label": rec.label}
        if rec.label == "NOT ENOUGH INFO":
            out.append(_evidence_claim(rec, (), meta))
            continue
        failures = []
        for i, refs in enumerate(rec.evidence_sets):
            result = _resolve_set(refs, pages)
            if isinstance(result, str):
                failures.append(f"set {i}: {result}")
                continue
            meta |= {
                "evidence_set": i,
                "evidence_pages": [e.page for e in result],
                "evidence_sentences": [e.sentence for e in result],
            }
            out.append(_evidence_claim(rec, tuple(e.fact_text for e in result), meta))
            break
        else:
            log.skip(
                rec.file, rec.line, "no evidence set resolves: " + "; ".join(failures), SKIP_UNRESOLVED, rec.claim_id
            )
    return out


def _evidence_claim(rec: ClaimRecord, evidence: tuple[str, ...], meta: dict) -> EvidenceClaim:
    return EvidenceClaim(
        source="fever",
        claim_id=str(rec.claim_id),
        claim=rec.claim,
        label=normalize_label(rec.label),
        evidence=evidence,
        file=rec.rel_file,
        line=rec.line,
        meta=meta,
    )


def read_fever(
    fever_dir: Path, claim_files: Sequence[str], log: SkipLog, *, max_claims: int | None = None, progress: bool = True
) -> SourceRead:
    """Claim files + one scan of ``wiki-pages/`` → EvidenceClaims, with per-file accounting."""
    claims = read_claims(fever_dir, claim_files, log, max_claims)
    cited = set().union(*(c.pages for c in claims.claims))
    wiki = scan_wiki(Path(fever_dir) / "wiki-pages", cited, log, progress=progress)
    items = resolve_claims(claims.claims, wiki.pages, log)
    skipped_per_file = Counter(s.file for s in log.records)
    used = {f: claims.records_in[f] - skipped_per_file[f] for f in claims.records_in}
    used |= {f: n - skipped_per_file[f] for f, n in wiki.lines_read.items()}
    inputs = [input_record(p, "fever_claims") for p in claims.files]
    inputs += [{"path": p, "sha256": d[0], "size": d[1], "kind": "fever_wiki_pages"} for p, d in wiki.digests.items()]
    return SourceRead(
        source="fever",
        items=items,
        records_in=claims.records_in | wiki.lines_read,
        records_used=used,
        inputs=inputs,
        stats={
            "wiki_files": len(wiki.files),
            "wiki_pages_scanned": wiki.pages_scanned,
            "wiki_pages_cited": len(cited),
            "wiki_pages_kept": len(wiki.pages),
            "wiki_pages_missing": sorted(cited - set(wiki.pages)),
            "wiki_problems": wiki.problems,
        },
        stopped_at=claims.stopped_at,
    )


def _read(c: FeverConfig, config, log: SkipLog) -> SourceRead:
    return read_fever(input_dir(c.dir, "FEVER"), c.claim_files, log, max_claims=c.max_claims, progress=config.progress)


register(DataSource("fever", "FEVER 1.0 inputs.", FeverConfig, _read, order=10))
