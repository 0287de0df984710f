"""FEVER 1.0, as released: the claim files and the wiki-pages dump, read and validated.

Claim files (``train.jsonl``, ``shared_task_dev.jsonl``) hold one JSON claim per line; each evidence set is a list
of ``[annotation_id, evidence_id, wiki_url, sentence_id]`` (``[annotation_id, null, null, null]`` for NOT ENOUGH
INFO)::

    {"id": 75397, "verifiable": "VERIFIABLE", "label": "SUPPORTS", "claim": "Nikolaj Coster-Waldau worked with the
     Fox Broadcasting Company.", "evidence": [[[92206, 104971, "Nikolaj_Coster-Waldau", 7], ...]]}

The dump (``wiki-pages/*.jsonl``) holds one page per line (``id``, ``text``, ``lines``) where ``lines`` rows are
``"N\\tsentence[\\tanchor\\ttarget…]"``; page ids and sentences are tokenized with escapes (``-LRB-``), which
``decode_title`` / ``decode_sentence`` undo.

``read_claims`` checks every claim line (a bad one is skipped with its file, 1-based line and the field, through a
``SkipLog``: strict by default); ``scan_wiki`` reads the dump once, keeping only the cited pages. Resolving the
claims' evidence against the pages is the data build's (``memstate.data_build.fever``).
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from tqdm.auto import tqdm

from memstate.data import find_text_problem, loads_record, max_record_bytes, over_limit_reason, read_lines
from memstate.errors import InputNotFound
from memstate.sources.skips import SKIP_DUPLICATE, SKIP_INVALID, SkipLog

FEVER_LABELS = ("SUPPORTS", "REFUTES", "NOT ENOUGH INFO")
VERIFIABLE_VALUES = ("VERIFIABLE", "NOT VERIFIABLE")
REQUIRED_FIELDS = ("id", "verifiable", "label", "claim", "evidence")

_ESCAPES = {
    "-LRB-": "(",
    "-RRB-": ")",
    "-LSB-": "[",
    "-RSB-": "]",
    "-LCB-": "{",
    "-RCB-": "}",
    "-COLON-": ":",
}
_ESCAPE_RE = re.compile("|".join(map(re.escape, _ESCAPES)))


def decode_title(page_id: str) -> str:
    """A FEVER page id as a readable title.

    >>> decode_title("Savages_-LRB-2012_film-RRB-"), decode_title("Halo-COLON-_Combat_Evolved")
    ('Savages (2012 film)', 'Halo: Combat Evolved')
    """
    return _ESCAPE_RE.sub(lambda m: _ESCAPES[m.group()], page_id).replace("_", " ").strip()


def decode_sentence(sentence: str) -> str:
    """A dump sentence as plain text: escapes decoded, and the tokenizer's spacing around punctuation undone
    (the responder reads these sentences, so they should look like prose).

    >>> decode_sentence("Its summit rises to 5,895 metres -LRB- 19,341 ft -RRB- , the world 's highest .")
    "Its summit rises to 5,895 metres (19,341 ft), the world's highest."
    >>> decode_sentence("Halo -COLON- Combat Evolved , credited to `` the Author '' .")
    'Halo: Combat Evolved, credited to "the Author".'
    """
    text = _ESCAPE_RE.sub(lambda m: _ESCAPES[m.group()], sentence)
    text = re.sub(r"``\s*", '"', text)
    text = re.sub(r"\s*''", '"', text)
    text = re.sub(r"([(\[{])\s+", r"\1", text)
    text = re.sub(r"\s+([)\]},.;:!?%])", r"\1", text)
    text = re.sub(r"\s+('s|'re|'ve|'ll|'d|'m|n't)\b", r"\1", text)
    return " ".join(text.split())


@dataclass(frozen=True)
class EvidenceRef:
    """One cited sentence: a raw FEVER page id and a sentence number."""

    page: str
    sentence: int


@dataclass(frozen=True)
class ClaimRecord:
    """A well-formed verifiable claim, before its evidence is looked up in the dump."""

    claim_id: int
    claim: str
    label: str  # raw FEVER label (SUPPORTS / REFUTES)
    file: str  # path as read, for file:line messages
    rel_file: str  # path relative to the FEVER dir, stored in instance meta
    line: int
    evidence_sets: tuple[tuple[EvidenceRef, ...], ...]

    @property
    def pages(self) -> set[str]:
        return {ref.page for s in self.evidence_sets for ref in s}


@dataclass
class ClaimScan:
    """What ``read_claims`` found."""

    claims: list[ClaimRecord] = field(default_factory=list)
    records_in: dict[str, int] = field(default_factory=dict)  # per file, lines read
    files: list[Path] = field(default_factory=list)
    stopped_at: dict | None = None  # set when max_claims stopped the read early


@dataclass
class WikiScan:
    """What ``scan_wiki`` found: only the wanted pages are kept."""

    pages: dict[str, dict[int, str]] = field(default_factory=dict)  # page id → {sentence id: raw sentence}
    files: list[Path] = field(default_factory=list)
    digests: dict[str, tuple[str, int]] = field(default_factory=dict)  # path → (sha256, size), hashed while read
    pages_scanned: int = 0
    lines_read: dict[str, int] = field(default_factory=dict)  # path → lines read
    problems: list[dict] = field(default_factory=list)  # malformed `lines` rows inside pages that are kept


class _BadRecord(ValueError):
    """A claim record that breaks FEVER's format; the message names the field."""


def _check_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def parse_claim(obj: object) -> tuple[int, str, str, tuple[tuple[EvidenceRef, ...], ...]]:
    """Validate one decoded claim record → (id, claim, label, evidence sets). Raises _BadRecord naming the field."""
    if not isinstance(obj, dict):
        raise _BadRecord(f"record is a JSON {type(obj).__name__}, expected an object")
    missing = [name for name in REQUIRED_FIELDS if name not in obj]
    if missing:
        raise _BadRecord(f"missing field(s) {', '.join(repr(m) for m in missing)}")
    claim_id, claim, label, verifiable = obj["id"], obj["claim"], obj["label"], obj["verifiable"]
    if not _check_int(claim_id):
        raise _BadRecord(f"field 'id' must be an integer, got {claim_id!r}")
    if not isinstance(claim, str) or not claim.strip():
        raise _BadRecord(f"field 'claim' must be a non-empty string, got {claim!r}")
    if label not in FEVER_LABELS:
        raise _BadRecord(f"field 'label' is {label!r}, expected one of {list(FEVER_LABELS)}")
    if verifiable not in VERIFIABLE_VALUES:
        raise _BadRecord(f"field 'verifiable' is {verifiable!r}, expected one of {list(VERIFIABLE_VALUES)}")
    if (verifiable == "NOT VERIFIABLE") != (label == "NOT ENOUGH INFO"):
        raise _BadRecord(f"field 'verifiable' is {verifiable!r} but field 'label' is {label!r}")
    evidence = obj["evidence"]
    if not isinstance(evidence, list) or not evidence:
        raise _BadRecord("field 'evidence' must be a non-empty list of evidence sets")
    sets: list[tuple[EvidenceRef, ...]] = []
    for i, ev_set in enumerate(evidence):
        if not isinstance(ev_set, list) or not ev_set:
            raise _BadRecord(f"field 'evidence' set {i} must be a non-empty list")
        refs: list[EvidenceRef] = []
        for j, item in enumerate(ev_set):
            if not isinstance(item, list) or len(item) != 4:
                raise _BadRecord(
                    f"field 'evidence' set {i} item {j} must be [annotation_id, evidence_id, wiki_url, "
                    f"sentence_id], got {item!r}"
                )
            if label == "NOT ENOUGH INFO":
                continue  # NEI items are [annotation_id, null, null, null]
            page, sentence = item[2], item[3]
            if not isinstance(page, str) or not page:
                raise _BadRecord(f"field 'evidence' set {i} item {j}: wiki_url must be a page id, got {page!r}")
            if not _check_int(sentence) or sentence < 0:
                raise _BadRecord(
                    f"field 'evidence' set {i} item {j}: sentence_id must be an integer ≥ 0, got {sentence!r}"
                )
            ref = EvidenceRef(page, sentence)
            if ref not in refs:  # a sentence cited twice in one set would become a duplicate fact
                refs.append(ref)
        sets.append(tuple(refs))
    return claim_id, claim.strip(), label, tuple(sets)


def read_claims(fever_dir: Path, files: Sequence[str], log: SkipLog, max_claims: int | None = None) -> ClaimScan:
    """Read claim files (relative to ``fever_dir``) in order; stop once ``max_claims`` usable claims are selected."""
    scan = ClaimScan()
    seen: dict[int, str] = {}
    limit = max_record_bytes()
    for rel in files:
        path = Path(fever_dir) / rel
        if not path.is_file():
            raise InputNotFound(f"FEVER claim file not found: {path} (fever.claim_files)")
        scan.files.append(path)
        scan.records_in[str(path)] = 0
        with open(path, "rb") as f:
            for lineno, raw, size in read_lines(f, limit):
                if max_claims is not None and len(scan.claims) >= max_claims:
                    scan.stopped_at = {
                        "file": str(path),
                        "next_line": lineno,
                        "reason": f"max_claims={max_claims} reached; later records not read",
                    }
                    return scan
                scan.records_in[str(path)] += 1
                if raw is None:  # over the limit: not read whole
                    log.skip(str(path), lineno, over_limit_reason(size, limit), SKIP_INVALID)
                    continue
                record = _read_claim_line(raw, str(path), Path(rel).as_posix(), lineno, seen, log)
                if record is not None:
                    scan.claims.append(record)
    return scan


def _read_claim_line(
    raw: bytes, file: str, rel_file: str, lineno: int, seen: dict[int, str], log: SkipLog
) -> ClaimRecord | None:
    """One claim line → a ClaimRecord, or None after logging why it is skipped."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        return log.skip(file, lineno, f"line is not valid UTF-8 ({e.reason} at byte {e.start})", SKIP_INVALID)
    if not text.strip():
        return log.skip(file, lineno, "empty line", SKIP_INVALID)
    try:
        obj = loads_record(text.rstrip("\r\n"))
    except json.JSONDecodeError as e:
        return log.skip(file, lineno, f"invalid JSON ({e.msg}, column {e.colno})", SKIP_INVALID)
    try:
        claim_id, claim, label, sets = parse_claim(obj)
    except _BadRecord as e:
        cid = obj.get("id") if isinstance(obj, dict) and _check_int(obj.get("id")) else None
        return log.skip(file, lineno, str(e), SKIP_INVALID, cid)
    # A lone surrogate ("\\ud800" without its pair) cannot be written out as UTF-8, nor looked up in the dump.
    bad = find_text_problem({"claim": claim, "evidence": [[ref.page for ref in refs] for refs in sets]})
    if bad is not None:
        return log.skip(file, lineno, f"field '{bad[0]}': {bad[1]}", SKIP_INVALID, claim_id)
    if claim_id in seen:
        reason = f"duplicate claim id {claim_id} (first at {seen[claim_id]})"
        return log.skip(file, lineno, reason, SKIP_DUPLICATE, claim_id)
    seen[claim_id] = f"{file}:{lineno}"
    return ClaimRecord(claim_id, claim, label, file, rel_file, lineno, sets)


# The dump writes `{"id": "<page id>", ...` first, so the id can be read without decoding the whole page.
_ID_PREFIX = re.compile(rb'^\{"id": "((?:[^"\\]|\\.)*)"')


def _json_variants(page_id: str) -> set[bytes]:
    """How a page id can appear between the quotes of a JSON line (ASCII-escaped or raw UTF-8)."""
    return {json.dumps(page_id)[1:-1].encode(), json.dumps(page_id, ensure_ascii=False)[1:-1].encode("utf-8")}


def parse_lines(lines_field: str) -> tuple[dict[int, str], list[str]]:
    """The ``lines`` field of a page → ({sentence id: raw sentence}, malformed rows). Anchor columns are dropped."""
    sentences: dict[int, str] = {}
    bad: list[str] = []
    for row in lines_field.split("\n"):
        if not row.strip():
            continue
        head, _, rest = row.partition("\t")
        try:
            sid = int(head)
        except ValueError:
            bad.append(row[:80])
            continue
        sentences[sid] = rest.split("\t", 1)[0]
    return sentences, bad


def scan_wiki(wiki_dir: Path, wanted: Collection[str], log: SkipLog, progress: bool = True) -> WikiScan:
    """Read every ``*.jsonl`` file of the dump once, keeping only the pages in ``wanted``."""
    wiki_dir = Path(wiki_dir)
    files = sorted(wiki_dir.glob("*.jsonl"))
    if not files:
        raise InputNotFound(f"{wiki_dir}: no wiki-pages *.jsonl files (the FEVER wiki dump: fever.dir/wiki-pages)")
    wanted = set(wanted)
    wanted_raw = {v for page in wanted for v in _json_variants(page)}
    scan = WikiScan(files=files)
    total = sum(p.stat().st_size for p in files)
    limit = max_record_bytes()
    with tqdm(total=total, unit="B", unit_scale=True, desc="scan wiki-pages", disable=not progress) as bar:
        for path in files:
            digest = hashlib.sha256()
            pending = lineno = 0
            with open(path, "rb") as f:
                for lineno, raw, size in read_lines(f, limit, digest.update):
                    pending += size
                    if pending >= 1 << 22:  # refresh the bar every 4 MiB, not every line
                        bar.update(pending)
                        pending = 0
                    if raw is None:  # over the limit: not read whole
                        log.skip(str(path), lineno, f"unreadable page: {over_limit_reason(size, limit)}", SKIP_INVALID)
                        continue
                    _scan_page_line(raw, str(path), lineno, wanted, wanted_raw, scan, log)
            scan.lines_read[str(path)] = lineno
            bar.update(pending)
            scan.digests[str(path)] = (digest.hexdigest(), path.stat().st_size)
    return scan


def _scan_page_line(
    raw: bytes, file: str, lineno: int, wanted: set[str], wanted_raw: set[bytes], scan: WikiScan, log: SkipLog
) -> None:
    if not raw.strip():
        return
    m = _ID_PREFIX.match(raw)
    if m:
        raw_id = m.group(1)
        if not raw_id:
            return  # each dump file starts with an empty placeholder page
        scan.pages_scanned += 1
        # An id without escapes is its own decoding, so a miss there is final; escaped ids are decoded to check.
        if raw_id not in wanted_raw:
            if b"\\" not in raw_id:
                return
            try:
                if json.loads(b'"' + raw_id + b'"') not in wanted:
                    return
            except (json.JSONDecodeError, UnicodeDecodeError):
                pass  # the full parse below reports the broken line
    try:
        page = loads_record(raw)
        page_id, lines_field = page["id"], page["lines"]
    except (json.JSONDecodeError, UnicodeDecodeError, TypeError, KeyError) as e:
        log.skip(file, lineno, f"unreadable page: {type(e).__name__}: {e}", SKIP_INVALID)
        return
    if not m:
        if not page_id:
            return
        scan.pages_scanned += 1
    if page_id not in wanted:
        return
    if page_id in scan.pages:
        log.skip(file, lineno, f"duplicate page {page_id!r}; the first one is kept", SKIP_DUPLICATE, page_id)
        return
    if not isinstance(lines_field, str):
        log.skip(file, lineno, f"page {page_id!r}: field 'lines' is not text", SKIP_INVALID, page_id)
        return
    sentences, bad = parse_lines(lines_field)
    for row in bad:
        scan.problems.append({"file": file, "line": lineno, "reason": f"page {page_id!r}: malformed lines row {row!r}"})
    scan.pages[page_id] = sentences
