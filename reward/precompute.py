"""``memstate reward precompute-baselines``: fill the SQLite baseline cache ahead of training.

Every no-state Score(A(q, M_q), y*) of a split is computed once, in batches, and stored; training then only
scores candidate states. An instance whose exact request (messages, continuations, mode, responder identity: see
``reward.cache.baseline_key``) is already cached is skipped, whichever dataset build cached it, so an interrupted run
resumes where it stopped and a rebuilt dataset only rescores the prompts that changed.

It writes in SQLite's WAL mode and, when it stops (done or interrupted by an exception), folds the log into the file
and leaves it in rollback-journal mode: no ``-wal`` file, so the file alone is complete and training can copy it to
node-local disk and read it there (``reward.cache.open_training_cache``). A ``-wal`` file left next to it means a run
is still writing it or was killed: rerun this command on it to finish it.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from tqdm import tqdm

from memstate.data import load_split, split_path
from memstate.errors import ConfigError
from memstate.filesystem import network_mount, read_mount_table
from memstate.parsing import StageParser
from memstate.responders import Responder, ResponderConfig, make_responder
from memstate.reward.cache import BaselineCache, default_local_dir, refuse_unfinished
from memstate.reward.counterfactual import CounterfactualGainReward, RewardConfig
from memstate.reward.responder_score import score_mode

logger = logging.getLogger("memstate.reward")


def precompute_baselines(
    responder: Responder, data_dir: str, splits: list[str], cache_path: str, mode: str, batch_size: int = 256
) -> dict[str, int]:
    """Cache the baselines of ``splits``; returns counts (instances, newly scored, already cached, unscorable)."""
    cache = BaselineCache(cache_path)
    # Baselines only: the answer-flow table is not opened (nor left open, with its WAL files, on the cache file).
    reward = CounterfactualGainReward(responder, RewardConfig(mode=mode, answer_flow_check=False), cache)
    counts = {"instances": 0, "scored": 0, "cached_before": 0, "unscorable": 0}
    try:
        for split in splits:
            instances = load_split(data_dir, split)
            counts["instances"] += len(instances)
            for start in tqdm(range(0, len(instances), batch_size), desc=f"baselines {split}", unit="batch"):
                batch = instances[start : start + batch_size]
                hits, prompts = cache.hits, reward.responder_prompts
                found = reward.baselines(batch)
                counts["cached_before"] += cache.hits - hits
                counts["scored"] += reward.responder_prompts - prompts
                counts["unscorable"] += len(batch) - len(found)
    finally:
        cache.close(self_contained=True)  # no -wal file left: a byte copy of the file is the whole cache
    counts["scored"] -= counts["unscorable"]
    logger.info("baselines in %s: %s", cache_path, counts)
    return counts


def refuse_network_filesystem(cache_path: str | Path, mount_table=read_mount_table) -> None:
    """Precompute writes the file in SQLite's WAL mode, which needs shared memory a network filesystem does not give
    (training refuses read-write access there for the same reason)."""
    mount = network_mount(Path(cache_path).expanduser(), mount_table)
    if mount is not None:
        raise ConfigError(
            f"--cache {cache_path} is on a network filesystem ({mount.fstype} at {mount.point}), where SQLite's WAL "
            "mode fails: precompute into node-local disk and move the finished file there, or run `memstate train "
            "... --precompute-baselines`, which does both"
        )


def fill_shared_cache(
    responder: Responder,
    data_dir: str,
    splits: list[str],
    shared: str | Path,
    mode: str,
    local_dir: str | Path | None = None,
    *,
    mount_table=read_mount_table,
) -> dict[str, int]:
    """Make ``shared`` hold every baseline of ``splits``, whatever filesystem it is on: the work happens in a
    node-local copy (``local_dir``, default ``reward.cache.default_local_dir``) — what ``shared`` held already is
    copied there first, so only the missing baselines are scored — and the finished, self-contained file is copied
    next to ``shared`` under a temporary name and renamed onto it (``os.replace``): a reader (a training rank copying
    it) sees the old file or the new one, never half of one. Nothing is written when nothing was missing."""
    shared = Path(shared).expanduser()
    if shared.exists():
        refuse_unfinished(shared)
    local_dir = Path(local_dir).expanduser() if local_dir else default_local_dir()
    local_dir.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(dir=local_dir, prefix=f".{shared.stem}.precompute-", suffix=".sqlite")
    os.close(fd)
    local = Path(name)
    try:
        if shared.exists():
            shutil.copyfile(shared, local)
        refuse_network_filesystem(local, mount_table)
        counts = precompute_baselines(responder, data_dir, splits, str(local), mode)
        if counts["scored"]:
            shared.parent.mkdir(parents=True, exist_ok=True)
            part = shared.with_name(f".{shared.name}.{os.getpid()}.part")
            shutil.copyfile(local, part)
            os.replace(part, shared)
            logger.info("baselines: %d scored now, %d cached before; %s replaced atomically", counts["scored"],
                        counts["cached_before"], shared)  # fmt: skip
    finally:
        for path in (local, *(local.with_name(local.name + s) for s in ("-wal", "-shm", "-journal"))):
            path.unlink(missing_ok=True)
    return counts


@dataclass
class PrecomputeArguments:
    """Which baselines to cache, and where. The responder (and its ``score_mode``) is a ``ResponderConfig``."""

    data: str = field(metadata={"help": "Built dataset dir (memstate build-data output)."})
    cache: str = field(metadata={"help": "SQLite cache file (created if missing)."})
    split: list[str] = field(default_factory=lambda: ["train"], metadata={"help": "Splits to cache."})
    batch_size: int = field(default=64, metadata={"help": "Instances per batch."})


def make_parser(prog: str | None = None) -> StageParser:
    return StageParser(
        (PrecomputeArguments, ResponderConfig),
        prog=prog,
        description="Fill the SQLite baseline cache for a dataset ahead of training (resumable). --config FILE.yaml "
        "(flat keys, e.g. a train config's responder_* and score_mode) is read too; flags override it.",
    )


def run(parsed: tuple[PrecomputeArguments, ResponderConfig]) -> int:
    args, responder_config = parsed
    scoring = score_mode(responder_config.score_mode)  # an unknown mode: ConfigError naming the registered ones
    for split in args.split:  # data and responder are checked before the cache file is created
        if not split_path(args.data, split).is_file():
            raise ConfigError(f"--data: {split_path(args.data, split)}: no such split file; build the data first")
    refuse_network_filesystem(args.cache)
    # A server that is down, or cannot serve the mode's requests, fails here, in one line.
    responder = make_responder(responder_config, likelihood=scoring.likelihood)
    counts = precompute_baselines(
        responder, args.data, args.split, args.cache, responder_config.score_mode, args.batch_size
    )
    print(json.dumps(counts))
    if counts["unscorable"]:
        raise SystemExit(f"{counts['unscorable']} baselines could not be scored (responder errors); rerun to retry")
    return 0
