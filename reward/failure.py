"""Stop a run whose responder cannot score, instead of training on zeros.

A completion the responder could not score (no usable reply after its retries or within ``responder_deadline``) gets
reward None, and TRL gives it a zero advantage: a round where the responder is down trains on nothing but the gates'
penalties. ``CounterfactualGainReward`` calls ``UnscorableGuard.observe`` at the end of every call (one generation
round on each rank) with the completions that needed the responder (those that passed the format, leak and
answer-flow gates; a gate's penalty needs no responder) and how many of them got None. The guard sums both counts over
the ranks through ``reduce`` (default: this process alone; ``memstate train`` passes one over
``accelerator.reduce``), so every rank takes the same decision, and raises ``ResponderFailure`` once the share has
been above ``max_share`` in ``patience`` consecutive rounds. It raises inside the reward, so the optimizer step of
the round that tripped it never runs (the rounds before it, within ``patience``, did train). A round in which no
completion needed the responder neither counts nor resets the streak. ``max_share = 1`` turns the guard off.

>>> guard = UnscorableGuard(max_share=0.5, patience=2)
>>> guard.observe(8, 6, "POST http://h:8000/v1/chat/completions: ConnectError: refused")  # 1st bad round: tolerated
0.75
>>> guard.observe(8, 1)  # a good round resets the streak
0.125
>>> guard.observe(8, 8)
1.0
>>> guard.observe(8, 5, "POST http://h:8000/v1/chat/completions: ConnectError: refused")
Traceback (most recent call last):
...
memstate.errors.ResponderFailure: 5 of 8 completions that needed the responder were unscorable (62% > \
max_unscorable_share 0.5) in 2 consecutive generation rounds; last error: POST http://h:8000/v1/chat/completions: \
ConnectError: refused
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

from memstate.errors import ConfigError, ResponderFailure

__all__ = ["UnscorableGuard"]

logger = logging.getLogger("memstate.reward")


def _alone(values: list[int]) -> list[int]:
    """The default ``reduce``: one process, nothing to sum."""
    return values


class UnscorableGuard:
    """Raises ``ResponderFailure`` when more than ``max_share`` of the completions that needed the responder were
    unscorable in ``patience`` consecutive reward calls. ``reduce`` sums ``[completions, unscorable]`` over the ranks
    (a collective: every rank must call ``observe`` once per round, as every rank calls the reward)."""

    def __init__(
        self,
        max_share: float = 0.5,
        patience: int = 1,
        reduce: Callable[[list[int]], Sequence[float]] | None = None,
    ):
        if not 0.0 <= max_share <= 1.0:
            raise ConfigError(f"max_unscorable_share must be in [0, 1], got {max_share}")
        if patience < 1:
            raise ConfigError(f"unscorable_patience must be at least 1, got {patience}")
        self.max_share, self.patience = max_share, patience
        self.reduce = reduce or _alone
        self.streak = 0  # consecutive rounds above max_share so far
        self.rounds = 0  # rounds observed

    def observe(self, n_completions: int, n_unscorable: int, last_error: str | None = None) -> float:
        """Record one round (this rank's counts; ``last_error``: this rank's last failed request, for the message)
        and return the share over all ranks; raise ``ResponderFailure`` when it ends ``patience`` bad rounds."""
        total, bad = (round(float(v)) for v in self.reduce([int(n_completions), int(n_unscorable)]))
        self.rounds += 1
        if total <= 0:
            return 0.0
        share = bad / total
        if share <= self.max_share:
            self.streak = 0
            return share
        self.streak += 1
        what = (
            f"{bad} of {total} completions that needed the responder were unscorable ({share:.0%} > "
            f"max_unscorable_share {self.max_share:g})"
        )
        if self.streak < self.patience:
            logger.warning("%s: round %d of %d allowed (unscorable_patience); last error: %s", what, self.streak,
                           self.patience, last_error)  # fmt: skip
            return share
        rounds = "a generation round" if self.streak == 1 else f"{self.streak} consecutive generation rounds"
        message = f"{what} in {rounds}" + (f"; last error: {last_error}" if last_error else "")
        raise ResponderFailure(message, share=share, rounds=self.streak, last_error=last_error)
