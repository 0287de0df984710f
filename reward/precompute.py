"""``memstate reward precompute-baselines``: fill the SQLite baseline cache ahead of training.

Every no-state Score(A(q, M_q), y*) of a split is computed once, in batches, and stored; training then only
scores candidate states. An instance whose exact request (messages, continuations, mode, responder identity: see
``reward.cache.baseline_key``) is already cached is skipped, whichever dataset build cached it, so an interrupted run
resumes where it stopped and a rebuilt dataset only rescores the prompts that changed.
"""

from __future__ import annotations

import logging

from memstate.reward.cache import BaselineCache
from memstate.reward.counterfactual import CounterfactualGainReward, RewardConfig
from tqdm import tqdm

from memstate.data import load_split
from memstate.responder import Responder

logger = logging.getLogger("memstate.reward")


def precompute_baselines(
    responder: Responder, data_dir: str, splits: list[str], cache_path: str, mode: str, batch_size: int = 256
) -> dict[str, int]:
    """Cache the baselines of ``splits``; returns counts (instances, newly scored, already cached, unscorable)."""
    cache = BaselineCache(cache_path)
    reward = CounterfactualGainReward(responder, RewardConfig(mode=mode), cache)
    counts = {"instances": 0, "scored": 0, "cached_before": 0, "unscorable": 0}
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
    cache.close()
    counts["scored"] -= counts["unscorable"]
    logger.info("baselines in %s: %s", cache_path, counts)
    return counts
