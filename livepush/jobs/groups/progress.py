"""Group progress: rung on `group:<id>` at most ~10 times a second per group.

A member's outcome must not ring its group in the hot completion transaction for every batch
(thousands of members would make thousands of reads of one group). Instead the runtime marks the
groups a committed transaction counted in (`mark()`), and this publisher, at most once per
PROGRESS_INTERVAL per group, reads their counts, records a `progress` event for those that
changed (for jobs.group_history()), and rings them. It reads after the marking commit, so it
never misses the counts it was marked for. It locks the group rows first, so no `progress` is
recorded after the group's `finished`, nor older counts after newer ones (queries.py says why).

Owned by a Runtime: started in its open, closed in its close, which publishes what is still
marked.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterable
from typing import Any

import psycopg
from psycopg_pool import AsyncConnectionPool

from ...postgres.text import BIGINT_MAX
from ...tasks import reraise_if_cancelled
from ...tasks import Backoff, stop, supervise
from ..events.views import GROUP_KEYS, PROGRESS_INTERVAL
from . import steps

log = logging.getLogger("livepush.jobs")

# Seconds after its last event here that the publisher forgets a group it was not marked for
# again. A group that finishes in another runtime (or is left open) is never read here again,
# so without this a long-lived runtime would keep two entries for every group it ever counted
# in. Forgetting costs at most one `progress` event recorded with unchanged counts.
FORGET_AFTER = 60.0


class ProgressPublisher:
    def __init__(self, pool: AsyncConnectionPool, interval: float = PROGRESS_INTERVAL) -> None:
        self._pool = pool
        self.interval = interval
        self._marked: set[int] = set()
        self._next_at: dict[int, float] = {}  # group -> earliest time of its next event
        self._last: dict[int, tuple[Any, ...]] = {}  # group -> counts last recorded
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._forgot_at = time.monotonic()

    def start(self) -> None:
        self._task = supervise("livepush-jobs-group-progress", self._run)

    @property
    def running(self) -> bool:
        return self._task is not None and not self._task.done()

    async def close(self) -> None:
        """Stop, after publishing what is marked (best effort: a failure is logged)."""
        task, self._task = self._task, None
        await stop(task)
        try:
            await self.flush(force=True)
        except Exception as exc:  # the group's own rows still tell the truth to a new subscriber
            log.warning("could not publish the last group progress: %s", exc)

    def tracked(self) -> int:
        """How many groups this publisher keeps a record of (their next due time, last counts)."""
        return len(self._next_at.keys() | self._last.keys())

    def _forget_idle(self, now: float) -> None:
        """Drop the records of groups idle here for FORGET_AFTER seconds and not marked since
        (at most once per FORGET_AFTER: a pass is a walk over every record)."""
        if now - self._forgot_at < FORGET_AFTER:
            return
        self._forgot_at = now
        horizon = now - FORGET_AFTER
        for g in [g for g, at in self._next_at.items() if at < horizon and g not in self._marked]:
            del self._next_at[g]
            self._last.pop(g, None)

    def mark(self, group_ids: Iterable[int]) -> None:
        """These groups' counts changed in a transaction that has committed."""
        before = len(self._marked)
        # Ids also come from `livepush_groups_progress` notifications, which any database login can
        # send: one no group can have would fail every later flush (it stays marked), so no group's
        # progress would be rung again by this runtime.
        self._marked.update(g for g in group_ids if 0 < g <= BIGINT_MAX)
        if len(self._marked) != before:
            self._wake.set()

    async def _run(self) -> None:
        retry = Backoff(0.05, 2.0)
        while True:
            if not self._marked:
                self._wake.clear()
                await self._wake.wait()
                continue
            due = min(self._next_at.get(g, 0.0) for g in self._marked) - time.monotonic()
            if due > 0:
                await asyncio.sleep(due)
            try:
                await self.flush()
                retry.reset()
            except psycopg.Error as exc:
                reraise_if_cancelled()
                log.warning("group progress failed, retrying in about %.2f s: %s", retry.delay, exc)
                await retry.wait()

    async def flush(self, force: bool = False) -> None:
        """One transaction: lock the due marked groups, read, record and ring what changed."""
        now = time.monotonic()
        ids = sorted(g for g in self._marked if force or self._next_at.get(g, 0.0) <= now)
        if not ids:
            return
        self._marked.difference_update(ids)  # a mark arriving from here on gets a read of its own

        def changed(view: steps.Row) -> bool:
            return tuple(view[k] for k in GROUP_KEYS) != self._last.get(view["id"])

        try:
            async with self._pool.connection() as conn:
                views = {v["id"]: v for v in await steps.arun(conn, steps.progress_now(ids, changed))}
        except BaseException:
            self._marked.update(ids)
            raise
        now = time.monotonic()
        for g in ids:
            view = views.get(g)
            if view is None or view["finished_at"] is not None:
                # Finished (its `finished` carried the final counts) or deleted: forget it.
                self._next_at.pop(g, None)
                self._last.pop(g, None)
                continue
            self._last[g] = tuple(view[k] for k in GROUP_KEYS)
            self._next_at[g] = now + self.interval
        self._forget_idle(now)
