"""Which checkpoint a run continues from, and whether this launch may continue it.

A checkpoint is **complete** when the Trainer wrote ``trainer_state.json`` (the last file of its save: weights,
optimizer and RNG states come first) and memstate's callback wrote ``memstate.json`` after it. A save cut off — the
job killed mid-write, a full disk — lacks them; transformers' own ``resume_from_checkpoint=True`` would pick it as the
newest and crash in the load. Here it is set aside (renamed ``incomplete-checkpoint-N``: transformers' rotation takes
any name that starts ``checkpoint-<digits>`` for a checkpoint) with a warning naming its size.

``--resume`` (``last``): the newest complete checkpoint, or an error. ``--resume auto`` (the launch scripts' default):
it if there is one, else a fresh start. No ``--resume``: a fresh start, refused over existing checkpoints (it would
overwrite them, and the last stop's ``stopped.json``).

Under DeepSpeed ZeRO a checkpoint's optimizer state is partitioned by the number of processes that saved it
(``memstate.json``: ``world_size``, ``zero_stage``); DeepSpeed cannot load it into another number ("checkpoint ...
used a DP world size of X"), only after the models have loaded. A resume on another world size or stage is refused
before anything loads — in the dry run too — with the two ways on: the saving shape, or a new run from the
checkpoint's consolidated weights (a fresh optimizer).
"""

from __future__ import annotations

import logging
import os
import re
from pathlib import Path

from memstate.checkpoint import METADATA_FILE, CheckpointMetadata
from memstate.errors import ConfigError

logger = logging.getLogger("memstate.train")

RESUME_MODES = ("last", "auto")
COMPLETE_FILES = ("trainer_state.json", METADATA_FILE)
_CHECKPOINT = re.compile(r"^checkpoint-(\d+)$")


def checkpoints(output_dir: str | Path) -> list[Path]:
    """The ``checkpoint-N`` directories of ``output_dir``, oldest step first."""
    root = Path(output_dir)
    if not root.is_dir():
        return []
    found = [p for p in root.iterdir() if p.is_dir() and _CHECKPOINT.match(p.name)]
    return sorted(found, key=lambda p: int(p.name.split("-")[1]))


def is_complete(checkpoint: Path) -> bool:
    return all((checkpoint / name).is_file() for name in COMPLETE_FILES)


def _size(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def set_aside(checkpoint: Path) -> Path:
    """Rename an incomplete checkpoint out of the way (``incomplete-checkpoint-N``, a number added if taken)."""
    target, n = checkpoint.with_name(f"incomplete-{checkpoint.name}"), 1
    while target.exists():
        n += 1
        target = checkpoint.with_name(f"incomplete{n}-{checkpoint.name}")
    checkpoint.rename(target)
    return target


def resume_checkpoint(output_dir: str | Path, resume: str | None, *, main_process: bool = True) -> Path | None:
    """The checkpoint this run continues from (``None``: a fresh start), per the module docstring. The main process
    sets aside incomplete checkpoints newer than the one chosen; every process chooses the same one."""
    found = checkpoints(output_dir)
    complete = [p for p in found if is_complete(p)]
    chosen = complete[-1] if complete else None
    broken = [p for p in found if not is_complete(p) and (chosen is None or _step(p) > _step(chosen))]
    if resume is None:
        if found:
            names = ", ".join(p.name for p in found[-3:])
            raise ConfigError(
                f"output_dir {output_dir} holds {len(found)} checkpoint(s) ({names}): a fresh start would overwrite "
                "them; continue with --resume (or --resume auto), or give another output_dir"
            )
        return None
    if resume not in RESUME_MODES:
        raise ConfigError(f"--resume {resume!r}: give --resume (the newest complete checkpoint) or --resume auto")
    for path in broken:
        what = f"{path}: an incomplete save (no {' or '.join(n for n in COMPLETE_FILES if not (path / n).is_file())})"
        if main_process:
            size = _size(path)
            logger.warning("%s; set aside as %s (%.1f GB: delete it to free the space)", what, set_aside(path).name,
                           size / 1e9)  # fmt: skip
    if chosen is None and resume == "last":
        raise ConfigError(f"--resume: no complete checkpoint-* directory in {output_dir} to resume from")
    if chosen is not None:
        logger.info("resuming from %s", chosen)
    return chosen


def _step(path: Path) -> int:
    return int(path.name.split("-")[1])


def launch_zero_stage() -> int | None:
    """The DeepSpeed ZeRO stage ``accelerate launch`` gave this process, or ``None`` (no DeepSpeed)."""
    if os.environ.get("ACCELERATE_USE_DEEPSPEED", "").lower() != "true":
        return None
    stage = os.environ.get("ACCELERATE_DEEPSPEED_ZERO_STAGE", "")
    return int(stage) if stage.isdigit() else None


def check_resume_shape(checkpoint: Path, world_size: int, zero_stage: int | None) -> None:
    """Refuse to continue a DeepSpeed checkpoint on another number of processes or another ZeRO stage.

    >>> import tempfile
    >>> d = Path(tempfile.mkdtemp())
    >>> m = CheckpointMetadata("v", "p", "r", "exact", 100, 20, "data", world_size=16, zero_stage=3)
    >>> _ = m.write(d)
    >>> check_resume_shape(d, 16, 3)
    >>> check_resume_shape(d, 8, 3)
    Traceback (most recent call last):
    ...
    memstate.errors.ConfigError: ... saved by 16 processes under DeepSpeed ZeRO-3, this launch has 8: ...
    """
    metadata = CheckpointMetadata.read(checkpoint)
    if metadata is None or metadata.world_size is None:
        return  # written before the shape was recorded: DeepSpeed itself says so if it does not fit
    saved_stage, saved_world = metadata.zero_stage, metadata.world_size
    if saved_stage is None and zero_stage is None:
        return  # plain (DDP or one process) optimizer state is whole in every checkpoint
    if (saved_world, saved_stage) == (world_size, zero_stage):
        return
    saved = f"{saved_world} processes" + (f" under DeepSpeed ZeRO-{saved_stage}" if saved_stage else " without ZeRO")
    now = f"{world_size}" + ("" if zero_stage == saved_stage else f" under {_stage(zero_stage)}")
    raise ConfigError(
        f"{checkpoint} was saved by {saved}, this launch has {now}: its optimizer state is partitioned for the "
        f"saving shape and cannot be loaded into this one. Resume on {saved_world} processes with the same "
        f"DeepSpeed config, or start a new run from its consolidated weights with a fresh optimizer: "
        f"--policy_model {checkpoint} --output_dir <a new directory>"
    )


def _stage(stage: int | None) -> str:
    return f"DeepSpeed ZeRO-{stage}" if stage else "no ZeRO"
