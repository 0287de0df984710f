"""Build the Instance dataset from raw FEVER / SciFact / PersonaMem files.

Outputs in ``out_dir``: ``{split}.parquet`` and ``{split}.jsonl`` per split, the ``datasets.DatasetDict`` saved to
disk under ``hf/``, a dataset card ``README.md`` with the counts, and ``manifest.json`` (inputs with sha256; counts
per source, task, perspective and split; every skipped record with file, line/row and reason; per-file balance
records read = used + skipped).
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import json
import logging
import os
import shutil
import tempfile
from collections import Counter, defaultdict
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from datasets import Dataset, DatasetDict, Features, List, Value, disable_progress_bars

from memstate.data import SPLITS, find_text_problem
from memstate.data_build.conflict import CONFLICT_PERSPECTIVES, ClaimPool, InstanceOptions, claim_instances
from memstate.data_build.probe import check_probes, run_probes
from memstate.data_build.records import EvidenceClaim, SourceRead
from memstate.data_build.registry import get_source, source_names
from memstate.data_build.splits import DEFAULT_RATIOS, assign_splits, check_ratios
from memstate.errors import ConfigError, InputNotFound, OutputExists, OutputUnwritable
from memstate.parsing import read_yaml
from memstate.schema import Instance, stable_id
from memstate.sources.skips import DataError, SkipLog

logger = logging.getLogger("memstate.data_build")


@dataclass
class DataConfig:
    """What to build; read from YAML by ``load_data_config``. A source whose section is absent is not built.

    The sources are those registered in ``memstate.data_build.registry`` (fever, scifact, personamem, synthetic, and
    any other registered before the config is made); ``sources`` maps each one built to its section."""

    sources: dict[str, Any] = field(
        default_factory=dict,
        metadata={
            "help": "Source name → its section, an instance of the source's section dataclass (data_build/registry.py)."
            " In YAML each section is a top-level key named after its source (fever:, scifact:, …)."
        },
    )
    perspectives: list[str] = field(
        default_factory=lambda: list(CONFLICT_PERSPECTIVES),
        metadata={"help": "Perspectives of the injected user memory; one instance per claim and perspective."},
    )
    consistent_share: float = field(
        default=0.5,
        metadata={
            "help": "Share of claim × perspective pairs whose user memory agrees with the evidence (controls). At 0.5 "
            "the user's stance says nothing about the label; other values fail the shortcut probe."
        },
    )
    evidence_relations: str = field(
        default="none",
        metadata={
            "help": "'none': no evidence–user-memory relation (none is drawn at deployment). 'gold': CONFLICTS_WITH/"
            "SUPPORTS from the gold label — leaks the answer; for diagnosis only, the shortcut probe fails it."
        },
    )
    shortcut_probe: str = field(
        default="fail",
        metadata={
            "help": "'fail': stop the build when a shortcut probe beats the majority class by more than 5 points; "
            "'warn': log it and record it in the manifest instead (the dataset then teaches a shortcut)."
        },
    )
    distractors: list[int] = field(default_factory=lambda: [2, 4], metadata={"help": "Min and max distractors."})
    caps: dict[str, int] = field(
        default_factory=dict,
        metadata={
            "help": "Instance caps keyed 'source', 'source/task' or 'source/task/perspective' (e.g. fever: 40000, "
            "fever/evidence_consistent: 8000); instances over a cap are dropped in a seeded order and counted."
        },
    )
    split_ratios: dict[str, float] = field(
        default_factory=lambda: dict(DEFAULT_RATIOS),
        metadata={"help": "Fraction of groups per split; keys train, validation, test; must sum to 1."},
    )
    seed: int = field(default=0, metadata={"help": "Seed of templates, controls, distractors, caps and splits."})
    skip_invalid: bool = field(
        default=False, metadata={"help": "Skip structurally invalid records (listed) instead of stopping."}
    )
    progress: bool = field(default=True, metadata={"help": "Show progress bars."})

    def __post_init__(self) -> None:
        names = source_names()
        unknown = sorted(set(self.sources) - set(names))
        if unknown:
            raise ValueError(f"DataConfig names unknown source(s) {unknown}; registered: {', '.join(names)}")
        self.sources = {name: section for name, section in self.sources.items() if section is not None}
        if not self.sources:
            raise ValueError(f"DataConfig names no source: give at least one of {', '.join(names)}")
        for name, section in self.sources.items():
            if not isinstance(section, get_source(name).section):
                cls = get_source(name).section.__name__
                raise ValueError(f"sources[{name!r}] must be a {cls}, got {type(section).__name__}")
        bad = [p for p in self.perspectives if p not in CONFLICT_PERSPECTIVES]
        if bad or not self.perspectives or len(set(self.perspectives)) != len(self.perspectives):
            raise ValueError(f"perspectives must be distinct values from {list(CONFLICT_PERSPECTIVES)}")
        if not 0.0 <= self.consistent_share < 1.0:
            raise ValueError(f"consistent_share must be in [0, 1), got {self.consistent_share}")
        if self.evidence_relations not in ("none", "gold"):
            raise ValueError(f"evidence_relations must be 'none' or 'gold', got {self.evidence_relations!r}")
        if self.shortcut_probe not in ("fail", "warn"):
            raise ValueError(f"shortcut_probe must be 'fail' or 'warn', got {self.shortcut_probe!r}")
        if len(self.distractors) != 2 or not 0 <= self.distractors[0] <= self.distractors[1]:
            raise ValueError(f"distractors must be [min, max] with 0 ≤ min ≤ max, got {self.distractors}")
        if set(self.split_ratios) != set(SPLITS):
            raise ValueError(f"split_ratios must have exactly the keys {list(SPLITS)}, got {sorted(self.split_ratios)}")
        check_ratios(self.split_ratios)
        for key, cap in self.caps.items():
            if len(key.split("/")) > 3 or not isinstance(cap, int) or cap < 0:
                raise ValueError(f"caps[{key!r}] must be a 'source[/task[/perspective]]' key with a count ≥ 0")


def _dataclass_from(cls: type, data: object, where: str):
    if not isinstance(data, dict):
        raise ConfigError(f"{where}: expected a mapping, got {type(data).__name__}")
    known = {f.name for f in fields(cls)}
    unknown = sorted(set(data) - known)
    if unknown:
        raise ConfigError(f"{where}: unknown key(s) {unknown}; known keys are {sorted(known)}")
    try:
        return cls(**data)
    except TypeError as e:  # a missing required key
        raise ConfigError(f"{where}: {e}") from None
    except ValueError as e:  # the class's own validation
        raise ConfigError(f"{where}: {e}") from None


def load_data_config(path: str | Path, **overrides) -> DataConfig:
    """Read a DataConfig from YAML; a missing file, bad YAML, unknown or missing keys are ``ConfigError``s that name
    the file (and line, key)."""
    path = Path(path)
    data = read_yaml(path)
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping of DataConfig fields, got {type(data).__name__}")
    data = {**data, **overrides}
    # Each registered source is a top-level key of its own; DataConfig gathers them in ``sources``.
    names = source_names()
    sources = {}
    for name in names:
        section = data.pop(name, None)
        if section is not None:
            sources[name] = _dataclass_from(get_source(name).section, section, f"{path}: {name}")
    known = sorted({f.name for f in fields(DataConfig)} - {"sources"} | set(names))
    unknown = sorted(set(data) - set(known))
    if unknown:
        raise ConfigError(f"{path}: unknown key(s) {unknown}; known keys are {known}")
    return _dataclass_from(DataConfig, data | {"sources": sources}, str(path))


def read_sources(config: DataConfig, log: SkipLog) -> list[SourceRead]:
    """Each source with a section, in the registry's build order."""
    return [
        get_source(name).read(config.sources[name], config, log) for name in source_names() if name in config.sources
    ]


def config_record(config: DataConfig) -> dict:
    """The config as the manifest records it: each registered source's section under its own name (None when it is
    not built), as the data YAML writes it, then the other fields."""
    record = asdict(config)
    sections = record.pop("sources")
    return {name: sections.get(name) for name in source_names()} | record


def make_instances(reads: list[SourceRead], config: DataConfig) -> tuple[list[Instance], dict[str, str]]:
    """Instances of every source and the split of every group. Claims are split before instances are made, so
    distractors and NEI evidence are drawn from the claim's own split."""
    groups = [c.group for r in reads for c in r.items if isinstance(c, EvidenceClaim)]
    groups += [i.meta["group"] for r in reads for i in r.items if isinstance(i, Instance)]
    split_of = assign_splits(groups, config.split_ratios, config.seed)
    options = InstanceOptions(
        perspectives=tuple(config.perspectives),
        consistent_share=config.consistent_share,
        distractors=(config.distractors[0], config.distractors[1]),
        evidence_relations=config.evidence_relations,
        seed=config.seed,
    )
    instances: list[Instance] = []
    for read in reads:
        claims = [c for c in read.items if isinstance(c, EvidenceClaim)]
        instances += [i for i in read.items if isinstance(i, Instance)]
        pools = defaultdict(list)
        for c in claims:
            pools[split_of[c.group]].append(c)
        pools = {split: ClaimPool(cs) for split, cs in pools.items()}
        for c in claims:
            instances += claim_instances(c, pools[split_of[c.group]], options)
    return instances, split_of


def apply_caps(instances: list[Instance], caps: dict[str, int], seed: int) -> tuple[list[Instance], dict[str, int]]:
    """Drop instances over each cap, in a seeded order; returns the kept ones and the drops per cap key."""
    if not caps:
        return instances, {}
    order = sorted(instances, key=lambda i: stable_id("cap", seed, i.id))
    counts: Counter = Counter()
    dropped: Counter = Counter()
    kept_ids = set()
    for inst in order:
        keys = (inst.source, f"{inst.source}/{inst.task}", f"{inst.source}/{inst.task}/{inst.perspective}")
        over = [k for k in keys if k in caps and counts[k] >= caps[k]]
        if over:
            dropped[over[0]] += 1
            continue
        counts.update(keys)
        kept_ids.add(inst.id)
    return [i for i in instances if i.id in kept_ids], dict(dropped)


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


def _balance(reads: list[SourceRead], log: SkipLog) -> dict[str, dict[str, int]]:
    """Per input file: records read = used + skipped, or a RuntimeError (a reader lost a record)."""
    skipped = Counter(s.file for s in log.records)
    table = {}
    for read in reads:
        for f, n_in in read.records_in.items():
            row = {"read": n_in, "used": read.records_used.get(f, 0), "skipped": skipped[f]}
            if row["read"] != row["used"] + row["skipped"]:
                raise RuntimeError(f"record accounting broken for {f}: {row}")
            table[f] = row
    unknown = set(skipped) - set(table)
    if unknown:
        raise RuntimeError(f"skipped records in files no reader counted: {sorted(unknown)}")
    return table


def _counts(instances: list[Instance], split_of: dict[str, str]) -> dict:
    def by(key) -> dict:
        return dict(sorted(Counter(key(i) for i in instances).items()))

    return {
        "source": by(lambda i: i.source),
        "task": by(lambda i: i.task),
        "perspective": by(lambda i: i.perspective),
        "split": _per_split(Counter(split_of[i.meta["group"]] for i in instances)),
        "source/task/perspective": by(lambda i: f"{i.source}/{i.task}/{i.perspective}"),
        "split/source": by(lambda i: f"{split_of[i.meta['group']]}/{i.source}"),
        "answer": by(lambda i: f"{i.source}/{i.answer}"),
        "groups_per_split": _per_split(Counter(split_of[g] for g in {i.meta["group"] for i in instances})),
        "relations": by_relation(instances),
    }


def _per_split(counter: Counter) -> dict[str, int]:
    return {s: counter[s] for s in SPLITS}  # fixed key order: the manifest must be byte-identical across runs


def by_relation(instances: list[Instance]) -> dict[str, int]:
    return dict(sorted(Counter(r.type for i in instances for r in i.relations).items()))


def build_data(config: DataConfig, out_dir: str | Path, *, overwrite: bool = False) -> dict:
    """Build the dataset described by ``config`` into ``out_dir``; returns the manifest (also written).

    All or nothing: the build is written into a staging folder beside ``out_dir`` and renamed into place when it is
    complete, so a failed build leaves ``out_dir`` as it was. ``out_dir`` may be missing, empty, a previous build
    (replaced), or hold files the build does not write (kept); files of the build's names that are not a previous
    build's are replaced only with ``overwrite`` (``check_out_dir``)."""
    out_dir = Path(out_dir)
    check_out_dir(out_dir, overwrite)
    if not config.progress:
        disable_progress_bars()
    log = SkipLog(skip_invalid=config.skip_invalid)
    try:
        reads = read_sources(config, log)
    except RecursionError:  # a reader without the record bounds of memstate.data met deeply nested JSON
        raise DataError("an input record is JSON nested too deeply to parse; --debug shows where") from None
    balance = _balance(reads, log)
    instances, split_of = make_instances(reads, config)
    instances, capped = apply_caps(instances, config.caps, config.seed)
    if not instances:
        raise DataError(f"no instances built; skipped by kind {dict(Counter(s.kind for s in log.records))}")
    logger.info("%d instances from %s", len(instances), [r.source for r in reads])
    rows = [i.to_dict() for i in instances]
    check_text(rows)
    probes = run_probes(instances, config.seed)
    if config.shortcut_probe == "fail":
        check_probes(probes)  # before anything is written: a dataset with a shortcut must not be trained on
    elif not probes["passed"]:
        logger.warning("shortcut probes over the margin (shortcut_probe: warn, build goes on): %s", probes["worst"])
    probes["enforced"] = config.shortcut_probe == "fail"

    features = _features(rows)
    had_build = out_dir.is_dir() and any(out_dir.iterdir())
    with _writable(out_dir, had_build):
        staging = _staging_dir(out_dir)
    try:
        with _writable(out_dir, had_build):  # the staging folder only: out_dir is not touched yet
            manifest = _write(staging, config, reads, log, balance, instances, split_of, capped, probes, rows, features)
        _move_into_place(staging, out_dir)
    finally:  # a failed build leaves nothing of itself behind
        shutil.rmtree(staging, ignore_errors=True)
    return manifest


def check_text(rows: list[dict]) -> None:
    """Every string of every instance row can be written as UTF-8, or a ``DataError`` naming the input record and
    the field. The readers skip such records where they read them (FEVER and SciFact claims); this catches the rest
    (a lone surrogate in a wiki sentence, an abstract, a PersonaMem turn) before anything is written."""
    for row in rows:
        found = find_text_problem(row)
        if found is not None:
            meta = row["meta"]
            where = f"{meta.get('source_file', row['source'])}:{meta.get('line', meta.get('row', 0))}"
            raise DataError(f"{where}: {found[0]}: {found[1]} (in instance {row['id']})")


# What a build writes into --out; any other file there is the user's and is never touched.
OUTPUT_NAMES = (
    *(f"{split}.{ext}" for split in SPLITS for ext in ("parquet", "jsonl")),
    "hf",
    "README.md",
    "manifest.json",  # last: a folder whose manifest is missing is not a complete build
)
_BUILDER = "memstate.data_build.build"


def is_previous_build(out_dir: Path) -> bool:
    """Whether ``out_dir/manifest.json`` is a manifest this builder wrote (so its outputs may be replaced)."""
    try:
        manifest = json.loads((out_dir / "manifest.json").read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError, RecursionError):
        return False
    return isinstance(manifest, dict) and manifest.get("builder") == _BUILDER


def check_out_dir(out_dir: str | Path, overwrite: bool = False) -> None:
    """Refuse an ``--out`` whose files the build would replace unless they are a previous build's or ``overwrite``
    says so; files the build does not write are left alone either way. Called before anything is read."""
    out_dir = Path(out_dir)
    if out_dir.exists() and not out_dir.is_dir():
        raise OutputExists(f"{out_dir}: --out exists and is not a directory")
    if not out_dir.is_dir() or overwrite or is_previous_build(out_dir):
        return
    clash = [name for name in OUTPUT_NAMES if os.path.lexists(out_dir / name)]
    if clash:
        raise OutputExists(
            f"{out_dir}: --out holds {', '.join(clash)}, which the build would replace, and no manifest.json of a "
            "previous build"
        )


def _staging_dir(out_dir: Path) -> Path:
    """A fresh folder on the same filesystem as ``out_dir`` to build into: a hidden sibling, or a hidden folder
    inside ``out_dir`` when its parent is not writable."""
    out_dir = Path(os.path.realpath(out_dir))  # through a link: the build goes where it points
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    try:
        return Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.building-", dir=out_dir.parent))
    except PermissionError:
        out_dir.mkdir(exist_ok=True)
        return Path(tempfile.mkdtemp(prefix=".building-", dir=out_dir))


# A disk that is full or out of quota, a file over the size limit (RLIMIT_FSIZE), a read-only filesystem.
_NO_ROOM = {errno.ENOSPC, errno.EFBIG, errno.EDQUOT, errno.EROFS}


@contextlib.contextmanager
def _writable(out_dir: Path, had_build: bool) -> Iterator[None]:
    """A write of the staging folder that fails for want of room (``_NO_ROOM``) is one ``OutputUnwritable``: the
    build is all or nothing, so ``out_dir`` is as it was. pyarrow's ``OSError`` may lack the errno; its text says."""
    try:
        yield
    except OSError as e:
        text = str(e)
        if e.errno not in _NO_ROOM and not any(os.strerror(n) in text for n in _NO_ROOM):
            raise
        reason = e.strerror or text.splitlines()[0][:200]
        kept = "the previous build is untouched" if had_build else "nothing was written there"
        raise OutputUnwritable(f"{out_dir}: cannot write the build: {reason}; {kept}") from None


def _move_into_place(staging: Path, out_dir: Path) -> None:
    """Put a finished build at ``out_dir``. A missing or empty ``out_dir``, or one holding only a previous build,
    is swapped whole by renames; otherwise each output replaces its namesake (manifest.json removed first and put
    back last) and the folder's other files stay."""
    out_dir = Path(os.path.realpath(out_dir))  # through a link: the build goes where it points
    cwd = Path(os.path.realpath(os.getcwd()))
    # Never rename the working directory away (``--out .``): the shell would be left in a deleted folder.
    if staging.parent == out_dir.parent and out_dir != cwd and out_dir not in cwd.parents:
        if not out_dir.exists() or not any(out_dir.iterdir()):
            os.replace(staging, out_dir)  # rename(2) replaces an empty directory
            return
        if set(os.listdir(out_dir)) <= set(OUTPUT_NAMES):
            old = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.old-", dir=out_dir.parent))
            os.replace(out_dir, old / "build")
            try:
                os.replace(staging, out_dir)
            except BaseException:
                os.replace(old / "build", out_dir)
                raise
            shutil.rmtree(old, ignore_errors=True)
            return
    (out_dir / "manifest.json").unlink(missing_ok=True)
    for name in OUTPUT_NAMES:
        target = out_dir / name
        if target.is_dir() and not target.is_symlink():
            trash = Path(tempfile.mkdtemp(prefix=f".{name}.old-", dir=out_dir))
            os.replace(target, trash / name)
            shutil.rmtree(trash, ignore_errors=True)
        elif (staging / name).is_dir() and os.path.lexists(target):
            target.unlink()  # a file or link where hf/ goes: rename cannot put a directory over it
        os.replace(staging / name, target)


def _write(out_dir, config, reads, log, balance, instances, split_of, capped, probes, rows, features) -> dict:
    parts = {}
    for split in SPLITS:
        split_rows = [r for r in rows if split_of[r["meta"]["group"]] == split]
        # from_list cannot type an empty list; an empty split (tiny inputs) is built from empty columns.
        parts[split] = (
            Dataset.from_list(split_rows, features=features)
            if split_rows
            else Dataset.from_dict({k: [] for k in features}, features=features)
        )
        parts[split].to_parquet(str(out_dir / f"{split}.parquet"))
        # json.dumps rather than Dataset.to_json, which escapes "/" (pandas).
        with open(out_dir / f"{split}.jsonl", "w", encoding="utf-8") as f:
            for row in split_rows:
                f.write(json.dumps(row, ensure_ascii=False) + "\n")
    DatasetDict(parts).save_to_disk(str(out_dir / "hf"))

    from memstate.memory.relation_rule import RELATION_RULE_VERSION  # late: the memory package is large

    skipped = sorted(log.records, key=lambda s: (s.file, s.line))
    manifest = {
        "builder": _BUILDER,
        # The rule that drew the relations the policy learns from (memory.relation_rule), so a serving store
        # (meta relation_rule) can be checked against it.
        "relation_rule": RELATION_RULE_VERSION,
        "config": config_record(config),
        "inputs": [inp for r in reads for inp in r.inputs],
        "records": {
            "read": sum(b["read"] for b in balance.values()),
            "used": sum(b["used"] for b in balance.values()),
            "skipped": len(skipped),
            "per_file": balance,
        },
        "instances_out": len(instances),
        "instances_capped": capped,
        "counts": _counts(instances, split_of),
        "shortcut_probes": probes,
        "source_stats": {r.source: r.stats for r in reads},
        "stopped_early": {r.source: r.stopped_at for r in reads if r.stopped_at},
        "skipped_by_kind": dict(sorted(Counter(s.kind for s in skipped).items())),
        "skipped": [s.to_dict() for s in skipped],
    }
    (out_dir / "manifest.json").write_text(json.dumps(manifest, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    (out_dir / "README.md").write_text(dataset_card(manifest), encoding="utf-8")
    return manifest


def dataset_card(manifest: dict) -> str:
    counts = manifest["counts"]
    lines = [
        "# memstate Instance dataset",
        "",
        "Conflicting-memory QA instances built by `memstate build-data` (schema: docs/design.md, `memstate.schema`).",
        f"{manifest['instances_out']} instances; {manifest['records']['read']} source records read, "
        f"{manifest['records']['used']} used, {manifest['records']['skipped']} skipped (see manifest.json).",
        "",
        "| split | " + " | ".join(SPLITS) + " |",
        "|---" * (len(SPLITS) + 1) + "|",
        "| instances | " + " | ".join(str(counts["split"][s]) for s in SPLITS) + " |",
        "",
        "| source/task/perspective | instances |",
        "|---|---|",
        *(f"| {k} | {v} |" for k, v in counts["source/task/perspective"].items()),
        "",
        "Inputs:",
        "",
        *(f"- `{i['path']}` ({i['size']} bytes, sha256 `{i['sha256']}`)" for i in manifest["inputs"]),
    ]
    return "\n".join(lines) + "\n"


# ---- memstate build-data ---------------------------------------------------------------------------------------------


def make_parser(prog: str | None = None) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=prog,
        description="Build the Instance dataset from raw source files (FEVER, SciFact, PersonaMem). The data YAML's "
        "keys are DataConfig's (data_build/build.py), with one section per source.",
    )
    p.add_argument("--config", required=True, help="Data YAML, e.g. configs/data/fever_fixture.yaml.")
    p.add_argument("--out", required=True, help="Output dataset dir (parquet + jsonl + manifest.json).")
    p.add_argument(
        "--overwrite",
        action="store_true",
        help="Replace files of the build's names (README.md, manifest.json, {split}.parquet/.jsonl, hf/) in --out "
        "even when they are not a previous build's; other files in --out are kept either way.",
    )
    p.add_argument(
        "--skip-invalid",
        action="store_true",
        help="Skip structurally invalid records and list them in the manifest (default: stop at the first one).",
    )
    p.add_argument(
        "--warn-on-shortcuts",
        action="store_true",
        help="Only warn (and record it in the manifest) when a shortcut probe predicts the answer more than 5 points "
        "above the majority class; by default the build fails.",
    )
    return p


def run(args: argparse.Namespace) -> None:
    overrides = ({"skip_invalid": True} if args.skip_invalid else {}) | (
        {"shortcut_probe": "warn"} if args.warn_on_shortcuts else {}
    )
    config = load_data_config(args.config, **overrides)
    try:
        manifest = build_data(config, args.out, overwrite=args.overwrite)
    except InputNotFound as e:
        raise InputNotFound(f"{args.config}: {e}") from None
    records = manifest["records"]
    worst = manifest["shortcut_probes"]["worst"]
    print(
        f"{manifest['instances_out']} instances ({manifest['counts']['split']}) in {args.out}; "
        f"{records['skipped']} of {records['read']} records skipped (see manifest.json)"
    )
    if worst:
        verdict = "passed" if manifest["shortcut_probes"]["passed"] else "FAILED (not enforced: --warn-on-shortcuts)"
        print(
            f"shortcut probes {verdict}; highest: {worst['source']} {worst['probe']} ({worst['classifier']}) "
            f"{worst['accuracy']:.3f} vs majority {worst['majority_rate']:.3f}"
        )
