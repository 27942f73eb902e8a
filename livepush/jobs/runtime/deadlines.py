"""Timeouts of the async jobs a runtime runs, with one loop timer per slice of time rather than
one per job.

A timer per job (`asyncio.timeout()`: an object, a loop timer armed and cancelled) was a
noticeable share of the runtime's CPU per short job (docs/performance.md, Jobs). Here a deadline
joins the bucket of the GRAIN-second slice it falls in; the bucket's one timer fires at the end
of its slice and expires what is still in it, so a timeout fires at most GRAIN seconds late,
never early. A job that ends leaves its bucket, and a bucket left empty goes with its timer
(except the one jobs are being added to now, which would only be made again), so nothing is
held for jobs that ended, whatever their timeout.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable
from typing import Generic, TypeVar

T = TypeVar("T")

GRAIN = 0.05  # seconds: how late a timeout may fire
# Seconds (a hundred years) past which a timeout never passes in any process's life: as good as
# none. Further out, the loop's clock plus it may not even be a number (sys.float_info.max
# overflows to infinity, 10**400 to an OverflowError), which failed every run of the job.
FOREVER = 100 * 366 * 86400.0


def effective(seconds: float | None) -> float | None:
    """A job's timeout as the runtime keeps it: None for none, infinite or past FOREVER."""
    return seconds if seconds is not None and seconds < FOREVER else None


class Deadlines(Generic[T]):
    """Deadlines of items by id; `expired(item)` is called on the loop for each one that passes."""

    def __init__(self, expired: Callable[[T], None]) -> None:
        self._expired = expired
        self._buckets: dict[int, tuple[dict[int, T], asyncio.TimerHandle]] = {}
        self._adding: int | None = None  # the bucket of the latest add

    def add(self, item_id: int, seconds: float, item: T) -> int | None:
        """Expire `item` `seconds` from now (at most GRAIN later) unless discarded first; returns
        the bucket to pass to discard(), or None for a time that never comes (nothing to expire)."""
        if effective(seconds) is None:
            return None
        loop = asyncio.get_running_loop()
        key = math.ceil((loop.time() + seconds) / GRAIN)
        found = self._buckets.get(key)
        if found is None:
            found = self._buckets[key] = ({}, loop.call_at(key * GRAIN, self._fire, key))
        if key != self._adding:
            previous, self._adding = self._adding, key
            self._drop_if_empty(previous)
        found[0][item_id] = item
        return key

    def discard(self, bucket: int | None, item_id: int) -> None:
        found = self._buckets.get(bucket)  # type: ignore[arg-type]
        if found is not None:
            found[0].pop(item_id, None)
            if bucket != self._adding:
                self._drop_if_empty(bucket)

    def _drop_if_empty(self, bucket: int | None) -> None:
        found = self._buckets.get(bucket)  # type: ignore[arg-type]
        if found is not None and not found[0]:
            found[1].cancel()
            del self._buckets[bucket]  # type: ignore[arg-type]

    def _fire(self, key: int) -> None:
        found = self._buckets.pop(key, None)
        if found is not None:
            for item in found[0].values():
                self._expired(item)

    def __len__(self) -> int:
        """Items waiting."""
        return sum(len(items) for items, _ in self._buckets.values())

    @property
    def buckets(self) -> int:
        """Buckets kept: at most one of them empty (the one being added to)."""
        return len(self._buckets)
