"""Admission control of the reasoning-state API: a bounded queue in front of the work, with deadlines.

At most ``limit`` requests are at work (hold a slot); at most ``queue`` more wait for one, first come, first served,
each no longer than its own wait budget. A request is refused at once (``Refused``) when it finds ``limit`` at work
and ``queue`` waiting (reason ``queue_full``), or when its predicted wait, ``(waiting + 1) · S / limit``, is longer
than it may wait, ``max_wait_s`` or its own budget when shorter (reason ``predicted_wait``): a queue that cannot serve
it in time should say so now, not after the wait. One whose budget runs out while it waits all the same leaves the
queue refused (reason ``deadline``), so it is never worked on after its client has given up.

A refusal carries a ``Retry-After`` (whole seconds): the time the present backlog takes to clear at the recent pace,
``ceil(S · (at work + waiting) / limit)``, clamped to [1, 60], where ``S`` is the mean time recent requests held a
slot (an exponentially weighted mean, weight 0.2 for the newest; 1 s before any request has finished).

Single event loop, no locks: every change of state happens between awaits.

>>> admission = Admission(limit=2, queue=2)
>>> admission.retry_after()  # nothing at work, no history: the 1 s floor
1
>>> admission.observe(3.0)  # a request held its slot 3 s
>>> admission.active = 2  # 2 at work, none waiting, 2 slots: they clear in 3 s
>>> admission.retry_after()
3
>>> admission.predicted_wait()  # the first in the queue: one of the 2 slots frees in 3 s / 2 on average
1.5
>>> Admission(limit=2, queue=2, max_wait_s=1.0).refusal(30.0) is None  # nothing at work: a slot is free
True
>>> admission.max_wait_s = 1.0
>>> admission.refusal(30.0).reason  # 1.5 s predicted, 1 s allowed
'predicted_wait'
>>> admission.max_wait_s = None
>>> admission.refusal(1.0).reason, admission.refusal(2.0) is None  # the request's own budget decides
('predicted_wait', True)
"""

from __future__ import annotations

import asyncio
import math
import time
from collections import deque
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

PRIOR_SERVICE_S = 1.0  # S before any request has finished
WEIGHT = 0.2  # of the newest request in S
MAX_RETRY_AFTER_S = 60


class Refused(Exception):
    """A request the queue did not take (``queue_full``, ``predicted_wait``) or gave up on (``deadline``);
    ``retry_after`` in seconds."""

    def __init__(self, reason: str, detail: str, retry_after: int):
        super().__init__(detail)
        self.reason, self.detail, self.retry_after = reason, detail, retry_after


class Admission:
    """``limit`` slots and a queue of at most ``queue`` waiters (``queue`` 0: no waiting, refuse when full), none
    admitted to wait when its predicted wait exceeds ``max_wait_s`` (None: only its own budget bounds it)."""

    def __init__(self, limit: int, queue: int, max_wait_s: float | None = None):
        if limit < 1 or queue < 0 or (max_wait_s is not None and not max_wait_s > 0):
            raise ValueError(f"need limit >= 1, queue >= 0 and max_wait_s > 0, got {limit}, {queue}, {max_wait_s}")
        self.limit, self.queue, self.max_wait_s = limit, queue, max_wait_s
        self.active = 0  # requests holding a slot
        self.waiters: deque[asyncio.Future] = deque()
        self.service_s: float | None = None  # S, the weighted mean time a slot is held

    @property
    def waiting(self) -> int:
        return len(self.waiters)

    def observe(self, seconds: float) -> None:
        """One request held its slot ``seconds``."""
        s = self.service_s
        self.service_s = seconds if s is None else (1 - WEIGHT) * s + WEIGHT * seconds

    def _service_s(self) -> float:
        return PRIOR_SERVICE_S if self.service_s is None else self.service_s

    def predicted_wait(self) -> float | None:
        """Seconds a request arriving now would wait for a slot: 0 while one is free, else its place in the queue
        times the mean time between two slots freeing (``S / limit``); None before any request has finished (the
        1 s prior is a guess for ``Retry-After``, no ground to refuse on)."""
        if self.active < self.limit and not self.waiters:
            return 0.0
        return None if self.service_s is None else (self.waiting + 1) * self.service_s / self.limit

    def refusal(self, budget_s: float, why: str = "") -> Refused | None:
        """Why a request that may wait ``budget_s`` would be refused now (``why``: where that budget came from), or
        None when it would be taken. Also asked before a request's body is read, to shed it cheaply."""
        wait = self.predicted_wait()
        if wait == 0.0:
            return None
        if self.waiting >= self.queue:
            reason, why_not = "queue_full", f"at most {self.queue} may wait"
        else:
            allowed, source = budget_s, why
            if self.max_wait_s is not None and self.max_wait_s < budget_s:
                allowed, source = self.max_wait_s, " (max_queue_wait_s)"
            if wait is None or wait <= allowed:
                return None
            reason = "predicted_wait"
            why_not = f"a slot would take about {wait:.1f} s, more than the {allowed:g} s{source} a request may wait"
        retry = self.retry_after()
        detail = (
            f"the API is at capacity ({self.active} at work, {self.waiting} queued, {why_not}); retry after {retry} s"
        )
        return Refused(reason, detail, retry)

    def retry_after(self) -> int:
        """Seconds a refused client should wait: the present backlog's time to clear at the recent pace."""
        seconds = math.ceil(self._service_s() * (self.active + self.waiting) / self.limit)
        return min(MAX_RETRY_AFTER_S, max(1, seconds))

    @asynccontextmanager
    async def slot(self, budget_s: float, why: str = "") -> AsyncIterator[float]:
        """Hold a slot for the block; yields the seconds spent waiting for it. ``Refused`` when the queue is full,
        or when no slot came within ``budget_s`` (``why`` says where that budget came from, for the message)."""
        waited = await self._acquire(budget_s, why)
        started = time.monotonic()
        try:
            yield waited
        finally:
            self.observe(time.monotonic() - started)
            self._release()

    async def _acquire(self, budget_s: float, why: str) -> float:
        if self.active < self.limit and not self.waiters:
            self.active += 1
            return 0.0
        refused = self.refusal(budget_s, why)
        if refused is not None:
            raise refused
        future = asyncio.get_running_loop().create_future()
        self.waiters.append(future)
        queued = time.monotonic()
        try:
            async with asyncio.timeout(budget_s):
                await future  # _release hands its slot over: ``active`` stays as it is
        except BaseException as e:  # the deadline, or the request cancelled (its client went away)
            if future.done() and not future.cancelled():  # the slot was handed over at the same moment: pass it on
                self._release()
            else:
                future.cancel()
                if future in self.waiters:  # a release may have dropped it already
                    self.waiters.remove(future)
            if isinstance(e, TimeoutError):
                retry = self.retry_after()
                detail = f"no free slot within {budget_s:g} s{why} ({self.waiting} still queued); retry after {retry} s"
                raise Refused("deadline", detail, retry) from None
            raise
        return time.monotonic() - queued

    def _release(self) -> None:
        """A slot is free: hand it to the longest waiter, else give it back."""
        while self.waiters:
            future = self.waiters.popleft()
            if not future.done():
                future.set_result(None)
                return
        self.active -= 1
