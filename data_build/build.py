"""Build the Instance dataset: raw FEVER files → ``{split}.parquet`` + ``{split}.jsonl`` + ``manifest.json``."""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

import yaml
from datasets import Dataset, Features, List, Value

from data_build import fever
from data_build.conflict import CONFLICT_PERSPECTIVES, conflict_instance
from data_build.labels import normalize_label
from data_build.splits import DEFAULT_RATIOS, assign_splits, check_ratios
from memstate.data import SPLITS  # noqa: E402
from memstate.schema import Instance

PROJECT_ROOT = Path(__file__).resolve().parents[1]


@dataclass
class DataConfig:
    """What to build; read from YAML by ``load_data_config``."""

    fever_dir: str = field(
        metadata={
            "help": "Directory holding the FEVER claim files and wiki-pages/. A relative path is taken from "
            "the working directory if it exists there, else from the project root."
        }
    )
    fever_claim_files: list[str] = field(
        default_factory=lambda: ["train.jsonl"],
        metadata={
            "help": "Claim files inside fever_dir, read in this order (e.g. train.jsonl, shared_task_dev.jsonl)."
        },
    )
    perspectives: list[str] = field(
        default_factory=lambda: list(CONFLICT_PERSPECTIVES),
        metadata={"help": "Perspectives of the injected user memory; one instance per claim and perspective."},
    )
    max_claims: int | None = field(
        default=None,
        metadata={
            "help": "Stop reading claim files once this many well-formed verifiable claims are selected "
            "(None: read everything)."
        },
    )
    split_ratios: dict[str, float] = field(
        default_factory=lambda: dict(DEFAULT_RATIOS),
        metadata={"help": "Fraction of claim groups per split; keys train, validation, test; must sum to 1."},
    )
    seed: int = field(default=0, metadata={"help": "Seed of the group → split assignment."})
    progress: bool = field(default=True, metadata={"help": "Show a progress bar while scanning wiki-pages."})

    def __post_init__(self) -> None:
        if not isinstance(self.fever_dir, str) or not self.fever_dir:
            raise ValueError(f"DataConfig.fever_dir must be a non-empty path, got {self.fever_dir!r}")
        if isinstance(self.fever_claim_files, str) or not self.fever_claim_files:
            raise ValueError(f"DataConfig.fever_claim_files must be a non-empty list, got {self.fever_claim_files!r}")
        if len(set(self.fever_claim_files)) != len(self.fever_claim_files):
            raise ValueError(f"DataConfig.fever_claim_files lists a file twice: {self.fever_claim_files!r}")
        bad = [p for p in self.perspectives if p not in CONFLICT_PERSPECTIVES]
        if bad or not self.perspectives or len(set(self.perspectives)) != len(self.perspectives):
            raise ValueError(
                f"DataConfig.perspectives must be distinct values from {list(CONFLICT_PERSPECTIVES)}, "
                f"got {self.perspectives!r}"
            )
        if self.max_claims is not None and (not isinstance(self.max_claims, int) or self.max_claims < 1):
            raise ValueError(f"DataConfig.max_claims must be a positive integer or null, got {self.max_claims!r}")
        if set(self.split_ratios) != set(SPLITS):
            raise ValueError(
                f"DataConfig.split_ratios must have exactly the keys {list(SPLITS)}, got {sorted(self.split_ratios)}"
            )
        check_ratios(self.split_ratios)


def load_data_config(path: str | Path) -> DataConfig:
    """Read a DataConfig from YAML; unknown or missing keys are errors that name them."""
    path = Path(path)
    data = yaml.safe_load(path.read_text(encoding="utf-8"))
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a mapping of DataConfig fields, got {type(data).__name__}")
    known = {f.name for f in fields(DataConfig)}
    unknown = sorted(set(data) - known)
    if unknown:
        raise ValueError(f"{path}: unknown DataConfig key(s) {unknown}; known keys are {sorted(known)}")
    if "fever_dir" not in data:
        raise ValueError(f"{path}: missing required key 'fever_dir'")
    try:
        return DataConfig(**data)
    except ValueError as e:
        raise ValueError(f"{path}: {e}") from None


def resolve_path(path: str | Path) -> Path:
    """An input path: absolute as is; relative from the working directory if it exists there, else the project."""
    p = Path(path)
    if p.is_absolute() or p.exists():
        return p
    return PROJECT_ROOT / p


def file_digest(path: Path) -> tuple[str, int]:
    """(sha256 hex, size in bytes) of a file, read in chunks."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest(), path.stat().st_size


_FACT = {
    "id": Value("string"),
    "text": Value("string"),
    "kind": Value("string"),
    "scope": Value("string"),
    "turn": Value("int64"),
    "time": Value("string"),
    "role": Value("string"),
}
_RELATION = {"src": Value("string"), "type": Value("string"), "dst": Value("string")}


def _features(rows: list[dict]) -> Features:
    """Explicit types for every Instance column (so an all-null column such as Fact.turn is still int64);
    meta's struct is inferred because each source has its own provenance keys."""
    meta = Dataset.from_list([{"meta": r["meta"]} for r in rows]).features["meta"]
    return Features(
        {
            "id": Value("string"),
            "source": Value("string"),
            "task": Value("string"),
            "perspective": Value("string"),
            "question": Value("string"),
            "options": List(Value("string")),
            "answer": Value("string"),
            "answer_kind": Value("string"),
            "labels": List(Value("string")),
            "facts": List(_FACT),
            "relations": List(_RELATION),
            "meta": meta,
        }
    )


def fever_instances(resolved: list[fever.ResolvedClaim], perspectives: list[str]) -> list[Instance]:
    """One conflict instance per resolved claim and perspective, in claim order."""
    out = []
    for rc in resolved:
        rec = rc.record
        meta = {
            "source_file": rec.rel_file,
            "line": rec.line,
            "claim_id": rec.claim_id,
            "group": f"fever:{rec.claim_id}",
            "evidence_set": rc.evidence_set,
            "evidence_pages": [e.page for e in rc.evidence],
            "evidence_sentences": [e.sentence for e in rc.evidence],
            "source_label": rec.label,
        }
        for perspective in perspectives:
            out.append(
                conflict_instance(
                    source="fever",
                    claim_id=rec.claim_id,
                    claim=rec.claim,
                    answer=normalize_label(rec.label),
                    evidence=[e.fact_text for e in rc.evidence],
                    perspective=perspective,
                    meta=meta,
                )
            )
    return out


def build_data(config: DataConfig, out_dir: str | Path) -> dict:
    """Build the dataset described by ``config`` into ``out_dir``; returns the manifest (also written)."""
    out_dir = Path(out_dir)
    fever_dir = resolve_path(config.fever_dir).resolve()
    if not fever_dir.is_dir():
        raise FileNotFoundError(f"FEVER directory not found: {config.fever_dir} (looked at {fever_dir})")

    claims = fever.read_claims(fever_dir, config.fever_claim_files, config.max_claims)
    cited = set().union(*(c.pages for c in claims.claims))
    wiki = fever.scan_wiki(fever_dir / "wiki-pages", cited, progress=config.progress)
    resolved, unresolved = fever.resolve_claims(claims.claims, wiki.pages)
    skipped = sorted(claims.skipped + unresolved, key=lambda s: (claims.files.index(Path(s.file)), s.line))

    records_in = sum(claims.records_in.values())
    if records_in != len(resolved) + len(skipped):
        raise RuntimeError(
            f"record accounting broken: {records_in} read != {len(resolved)} used + {len(skipped)} skipped"
        )
    instances = fever_instances(resolved, config.perspectives)
    if not instances:
        kinds = Counter(s.kind for s in skipped)
        raise ValueError(
            f"no usable claims in {[str(p) for p in claims.files]}: {records_in} records read, "
            f"skipped by kind {dict(kinds)}"
        )

    split_of_group = assign_splits((i.meta["group"] for i in instances), config.split_ratios, config.seed)
    rows = [i.to_dict() for i in instances]
    dataset = Dataset.from_list(rows, features=_features(rows))
    out_dir.mkdir(parents=True, exist_ok=True)
    outputs = {}
    for split in SPLITS:
        part = dataset.select([n for n, i in enumerate(instances) if split_of_group[i.meta["group"]] == split])
        part.to_parquet(str(out_dir / f"{split}.parquet"))
        # JSONL written from the same rows with json.dumps: pandas' to_json (behind Dataset.to_json) escapes "/".
        with open(out_dir / f"{split}.jsonl", "w", encoding="utf-8") as f:
            for row in part:
                f.write(json.dumps(row, ensure_ascii=False) + "\n")
        outputs[split] = {"parquet": f"{split}.parquet", "jsonl": f"{split}.jsonl", "rows": len(part)}

    inputs = [
        {"path": str(p), "sha256": d[0], "size": d[1], "kind": "fever_claims"}
        for p, d in ((p, file_digest(p)) for p in claims.files)
    ]
    inputs += [{"path": p, "sha256": d[0], "size": d[1], "kind": "fever_wiki_pages"} for p, d in wiki.digests.items()]
    answers_per_split = {s: Counter() for s in SPLITS}
    for inst in instances:
        answers_per_split[split_of_group[inst.meta["group"]]][inst.answer] += 1
    manifest = {
        "builder": "data_build.build",
        "config": asdict(config),
        "fever_dir": str(fever_dir),
        "inputs": inputs,
        "records_in": records_in,
        "records_used": len(resolved),
        "records_skipped": len(skipped),
        "records_in_per_file": claims.records_in,
        "instances_out": len(instances),
        "counts": {
            "source": dict(Counter(i.source for i in instances)),
            "task": dict(Counter(i.task for i in instances)),
            "perspective": dict(Counter(i.perspective for i in instances)),
            "split": {s: outputs[s]["rows"] for s in SPLITS},
            "answer": dict(Counter(i.answer for i in instances)),
            "groups_per_split": {s: sum(1 for v in split_of_group.values() if v == s) for s in SPLITS},
            "split_by_answer": {s: dict(answers_per_split[s]) for s in SPLITS},
        },
        "wiki": {
            "files": len(wiki.files),
            "pages_scanned": wiki.pages_scanned,
            "pages_cited": len(cited),
            "pages_kept": len(wiki.pages),
            "pages_missing": sorted(cited - set(wiki.pages)),
            "problems": wiki.problems,
        },
        "skipped_by_kind": dict(Counter(s.kind for s in skipped)),
        "skipped": [s.to_dict() for s in skipped],
        "outputs": outputs,
    }
    if claims.stopped_at:
        manifest["stopped_at"] = claims.stopped_at
    (out_dir / "manifest.json").write_text(json.dumps(manifest, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    return manifest
