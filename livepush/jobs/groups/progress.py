"""Group events on `group:<id>` (SPEC §6), their record, and the coalescing progress publisher.

    {"event": "created"|"progress"|"finished"|"cancelled"|"snapshot",
     "group": {"id", "state", "total", "pending", "succeeded", "failed", "cancelled"}}

`created`, `cancelled` and `finished` are published in the transaction that made the
change (with the Postgres fan-out), so they are never dropped and come in commit order.
`progress` is not: a member's outcome must not publish on its group's topic in the hot
completion transaction (thousands of members would queue on that topic's row). Instead the
transaction that counts the outcome marks the group dirty in this process's
`ProgressPublisher`, which publishes at most one `progress` per group per PROGRESS_INTERVAL,
reading the counts itself. It locks the group rows FOR SHARE first and reads after, so a
`progress` can never follow the group's `finished` (see group_queries.LOCK_GROUPS_SHARE).

Each dirty mark from an outcome carries, per shard, the shard's done count after that
outcome. Done counts only grow, so the publisher knows it has read past that commit once it
reads at least as much, and keeps reading (not publishing unchanged counts) until it has:
a commit that lands just after a read is never left unpublished. A mark whose transaction
rolled back is dropped after EXPECT_TIMEOUT.
"""

from __future__ import annotations

import asyncio
import logging
import time
import weakref
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any

import psycopg
from psycopg.rows import dict_row
from psycopg_pool import AsyncConnectionPool

from ...fanout.base import encode_payload
from ..events import views as events
from . import queries as group_queries

log = logging.getLogger("livepush.jobs")

PROGRESS_INTERVAL = 0.1  # seconds between two progress events of one group
EXPECT_TIMEOUT = 10.0  # seconds a dirty mark waits for its commit to become visible

Event = events.Event
VIEW_KEYS = ("id", "state", "total", "pending", "succeeded", "failed", "cancelled")


def group_topic(group_id: int) -> str:
    return f"group:{group_id}"


def group_view(row: Mapping[str, Any]) -> dict[str, Any]:
    """The `group` object of an event from a GROUP_VIEWS-like row."""
    return {k: row[k] for k in VIEW_KEYS}


def group_event(event: str, row: Mapping[str, Any]) -> Event:
    return group_topic(row["id"]), {"event": event, "group": group_view(row)}


def _iso(value: Any) -> Any:
    return value.isoformat() if isinstance(value, datetime) else value


def record_params(evs: Sequence[Event]) -> dict[str, Any] | None:
    """RECORD_EVENTS parameters for the group events among `evs`, or None if there are none."""
    mine = [(t, d) for t, d in evs if t.startswith("group:") and isinstance(d, dict) and "group" in d]
    if not mine:
        return None
    return {
        "group_ids": [d["group"]["id"] for _, d in mine],
        "events": [d["event"] for _, d in mine],
        "datas": [encode_payload(d) for _, d in mine],
    }


async def group_snapshot(aconn: psycopg.AsyncConnection, group_id: int) -> dict[str, Any] | None:
    """`{"event": "snapshot", "group": {...}}`, or None when there is no such group."""
    async with aconn.cursor(row_factory=dict_row) as cur:
        await cur.execute(group_queries.GROUP_VIEWS, {"ids": [group_id]})
        row = await cur.fetchone()
    if row is None:
        return None
    return {"event": "snapshot", "group": group_view(row)}


# -- the coalescing publisher -----------------------------------------------------------------

_publishers: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, list[ProgressPublisher]] = weakref.WeakKeyDictionary()


def current_publisher() -> ProgressPublisher | None:
    """The running publisher on this event loop (a job runtime's), or None."""
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        return None
    found = _publishers.get(loop)
    return found[-1] if found else None


class ProgressPublisher:
    """Publishes `progress` on group topics, at most once per PROGRESS_INTERVAL per group.

    Owned by a Runtime (started in its _open, closed in its _close, which publishes what is
    still dirty). `mark()` is called on the loop, from the completion transaction (with
    per-shard expectations) or after an add committed (without)."""

    def __init__(self, pool: AsyncConnectionPool, interval: float = PROGRESS_INTERVAL) -> None:
        self._pool = pool
        self.interval = interval
        self._expect: dict[int, dict[int, tuple[int, float]]] = {}  # group -> shard -> (done, marked at)
        self._plain: set[int] = set()  # groups marked after a commit: one read is enough
        self._next_at: dict[int, float] = {}  # group -> earliest time of its next event
        self._last: dict[int, tuple[Any, ...]] = {}  # group -> counts last published
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self.published = 0

    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        _publishers.setdefault(self._loop, []).append(self)
        self._task = asyncio.create_task(self._run(), name="livepush-jobs-group-progress")

    def _unregister(self) -> None:
        if self._loop is not None:
            found = _publishers.get(self._loop, [])
            if self in found:
                found.remove(self)

    async def close(self) -> None:
        """Stop, after publishing what is dirty (best effort: a failure is logged)."""
        self._unregister()
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except (asyncio.CancelledError, Exception):
                pass
            self._task = None
        try:
            await self.flush(force=True)
        except Exception as exc:  # the group's own events and snapshot still tell the truth
            log.warning("could not publish the last group progress: %s", exc)

    def mark(self, group_id: int, expect: Mapping[int, int] | None = None) -> None:
        if expect:
            now = time.monotonic()
            shards = self._expect.setdefault(group_id, {})
            for shard, done in expect.items():
                if done > shards.get(shard, (-1, 0.0))[0]:
                    shards[shard] = (done, now)
        else:
            self._plain.add(group_id)
        self._wake.set()

    def _dirty(self) -> set[int]:
        return set(self._expect) | self._plain

    async def _run(self) -> None:
        backoff = 0.05
        while True:
            dirty = self._dirty()
            if not dirty:
                self._wake.clear()
                await self._wake.wait()
                continue
            due = min(self._next_at.get(g, 0.0) for g in dirty) - time.monotonic()
            if due > 0:
                await asyncio.sleep(due)
            try:
                await self.flush()
                backoff = 0.05
            except psycopg.Error as exc:
                task = asyncio.current_task()
                if task is not None and task.cancelling():
                    raise asyncio.CancelledError from exc
                log.warning("group progress failed, retrying in %.2f s: %s", backoff, exc)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 2.0)

    async def flush(self, force: bool = False) -> None:
        """One transaction: lock the due dirty groups FOR SHARE, read, publish what changed."""
        now = time.monotonic()
        ids = sorted(g for g in self._dirty() if force or self._next_at.get(g, 0.0) <= now)
        if not ids:
            return
        plain = self._plain & set(ids)
        self._plain -= plain  # a mark arriving from here on gets a read of its own
        try:
            async with self._pool.connection() as conn:
                async with conn.cursor(row_factory=dict_row) as cur:
                    await cur.execute(group_queries.LOCK_GROUPS_SHARE, {"ids": ids})
                    # A new statement: its snapshot sees every finisher that held the lock before us.
                    await cur.execute(group_queries.GROUP_VIEWS, {"ids": ids})
                    views = {r["id"]: r for r in await cur.fetchall()}
                    await cur.execute(group_queries.SHARD_DONE, {"ids": ids})
                    done: dict[int, dict[int, int]] = {}
                    for r in await cur.fetchall():
                        done.setdefault(r["group_id"], {})[r["shard"]] = r["done"]
                    out: list[Event] = []
                    for g in ids:
                        v = views.get(g)
                        if v is None or v["finished_at"] is not None:
                            continue
                        counts = tuple(v[k] for k in VIEW_KEYS)
                        if counts != self._last.get(g):
                            out.append(group_event("progress", v))
                    params = record_params(out)
                    if params is not None:
                        await cur.execute(group_queries.RECORD_EVENTS, params)
                    later = await events.apublish_in(conn, out)
        except BaseException:
            self._plain |= plain
            raise
        await events.apublish_after(later)
        self.published += len(out)
        now = time.monotonic()
        for g in ids:
            v = views.get(g)
            if v is None or v["finished_at"] is not None:
                # Finished (its `finished` carried the final counts) or deleted: forget it.
                self._expect.pop(g, None)
                self._plain.discard(g)
                self._next_at.pop(g, None)
                self._last.pop(g, None)
                continue
            counts = tuple(v[k] for k in VIEW_KEYS)
            if counts != self._last.get(g):
                self._last[g] = counts
                self._next_at[g] = now + self.interval
            else:
                self._next_at[g] = max(self._next_at.get(g, 0.0), now + self.interval)
            shards = self._expect.get(g)
            if shards:
                read = done.get(g, {})
                for shard, (want, at) in list(shards.items()):
                    if read.get(shard, 0) >= want or now - at > EXPECT_TIMEOUT:
                        del shards[shard]
                if not shards:
                    del self._expect[g]


def progress_events(views: Iterable[Mapping[str, Any]]) -> list[Event]:
    """Progress events for unfinished groups among `views` (inline path, no publisher)."""
    return [group_event("progress", v) for v in views if v["finished_at"] is None]


def view_time(row: Mapping[str, Any]) -> dict[str, Any]:
    """A read's group dict: the event view plus its timestamps."""
    out = group_view(row)
    for k in ("created_at", "sealed_at", "cancelled_at", "finished_at"):
        out[k] = _iso(row.get(k))
    return out
