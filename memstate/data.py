"""Reading a built Instance dataset (``{split}.parquet`` + ``manifest.json``), for every stage after data_build."""

from __future__ import annotations

import hashlib
import tempfile
from pathlib import Path

from datasets import Dataset

from memstate.schema import Instance

SPLITS = ("train", "validation", "test")


def split_path(data_dir: str | Path, split: str) -> Path:
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; expected one of {list(SPLITS)}")
    return Path(data_dir) / f"{split}.parquet"


def load_split(data_dir: str | Path, split: str) -> list[Instance]:
    """All instances of one split; a bad row raises ``SchemaError`` naming the file, row and field."""
    path = split_path(data_dir, split)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such split file; build the data first (memstate build-data)")
    # A throwaway cache dir: rows are kept in memory, and a rebuilt file can never hit a stale cache entry.
    with tempfile.TemporaryDirectory(prefix="memstate-load-") as cache_dir:
        rows = Dataset.from_parquet(str(path), keep_in_memory=True, cache_dir=cache_dir)
        return [Instance.from_dict(row, f"{path} row {i}") for i, row in enumerate(rows)]


def manifest_sha256(data_dir: str | Path) -> str | None:
    """sha256 of the dataset's manifest.json: identifies exactly which build a checkpoint or report used."""
    path = Path(data_dir) / "manifest.json"
    return hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else None
