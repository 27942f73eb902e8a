"""Timeouts of the async jobs a runtime runs, with one loop timer per slice of time rather than
one per job.

A timer per job (`asyncio.timeout()`: an object, a loop timer armed and cancelled) was a
noticeable share of the runtime's CPU per short job (docs/performance.md, Jobs). Here a deadline joins the bucket of the GRAIN-second slice it falls in; the bucket's one
timer fires at the end of its slice and expires what is still in it, so a timeout fires at most
GRAIN seconds late, never early. A job that ends leaves its bucket (one dict removal), so nothing
is held for jobs long gone.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable
from typing import Generic, TypeVar

T = TypeVar("T")

GRAIN = 0.05  # seconds: how late a timeout may fire


class Deadlines(Generic[T]):
    """Deadlines of items by id; `expired(item)` is called on the loop for each one that passes."""

    def __init__(self, expired: Callable[[T], None]) -> None:
        self._expired = expired
        self._buckets: dict[int, dict[int, T]] = {}

    def add(self, item_id: int, seconds: float, item: T) -> int:
        """Expire `item` `seconds` from now (at most GRAIN later) unless discarded first; returns
        the bucket to pass to discard()."""
        loop = asyncio.get_running_loop()
        key = math.ceil((loop.time() + seconds) / GRAIN)
        bucket = self._buckets.get(key)
        if bucket is None:
            bucket = self._buckets[key] = {}
            loop.call_at(key * GRAIN, self._fire, key)
        bucket[item_id] = item
        return key

    def discard(self, bucket: int, item_id: int) -> None:
        items = self._buckets.get(bucket)
        if items is not None:
            items.pop(item_id, None)

    def _fire(self, key: int) -> None:
        for item in self._buckets.pop(key, {}).values():
            self._expired(item)

    def __len__(self) -> int:
        return sum(len(items) for items in self._buckets.values())
