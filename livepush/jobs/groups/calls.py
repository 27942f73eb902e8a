"""Task groups: many jobs tracked as one, callbacks exactly once, progress live (SPEC §4, §6, §7).

    with jobs.group(on_success=report.request(1), on_failure=alert.request(1)) as g:
        for row in rows:
            g.enqueue(import_row, 1, row)      # created, filled and sealed in one transaction
    g.handle                                   # GroupHandle(id, topic, signed_topic)

Over several transactions: `create_group()`, `add_to_group()` (while open), `seal_group()`.
From inside a running member: `ctx.group.enqueue(fn, *args)` (also after the seal).
Reads: `get_group()`, `group_members()`, `group_history()`. Cancel: `jobs.cancel_group()`.
How counting, sealing and finishing stay exactly-once under concurrency: group_queries.py
and docs/groups.md.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
from collections.abc import Callable, Iterable, Sequence
from datetime import datetime
from typing import Any, TypeVar

import psycopg
from psycopg.rows import dict_row

from .. import database
from ..events import views as events
from . import progress as group_events, queries as gq, steps
from ..api.enqueue import Batch, _item, _run_at
from ..errors import GroupClosedError, GroupLimitError, GroupNotFound, LeaseLostError
from ..api.handles import JobHandle, checked_id
from ..api.registry import JobFunction, JobRequest

T = TypeVar("T")

MAX_GROUP_MEMBERS = 100_000  # members per group, whichever way they are added
DEFAULT_SHARDS = 16  # counter rows per group: outcomes of different shards never wait on each other
CHUNK = 5000  # members per insert statement
RETRIES = 5  # own transactions retried after a deadlock or serialization failure


# -- handles -------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class GroupHandle:
    """A task group: its id and the state topic a page subscribes to (`group:<id>`).

    `signed_topic` is signed with LIVEPUSH_SECRET on first access (no expiry)."""

    id: int

    @property
    def topic(self) -> str:
        return group_events.group_topic(self.id)

    @functools.cached_property
    def signed_topic(self) -> str:
        from ...api import sign_topic

        return sign_topic(self.topic)

    def add(self, fn: JobFunction, *args: Any, wait: float | None = None, at: datetime | None = None,
            conn: Any = None) -> JobHandle:
        return add_to_group(self.id, fn, *args, wait=wait, at=at, conn=conn)

    def seal(self, conn: Any = None) -> bool:
        return seal_group(self.id, conn=conn)

    def cancel(self) -> bool:
        from ..api.control import cancel_group

        return cancel_group(self.id)

    def get(self) -> dict[str, Any] | None:
        return get_group(self.id)


# -- running steps in a transaction -----------------------------------------------------------

def _in_tx(make: Callable[[], steps.Steps[tuple[T, list[events.Event]]]], conn: Any) -> T:
    """Run steps (returning (result, events)) in the caller's transaction or in our own,
    publish their events with it (Postgres fan-out) or right after."""
    if conn is not None:
        if database.conn_kind(conn) != "sync":
            raise TypeError("conn= takes a sync psycopg Connection here; use the a-prefixed function with an AsyncConnection")
        result, evs = steps.run(conn, make())
        events.publish_after(events.publish_in(conn, evs))
        return result
    for attempt in range(RETRIES):
        try:
            with database.sync_pool().connection() as own:
                result, evs = steps.run(own, make())
                later = events.publish_in(own, evs)
            events.publish_after(later)
            return result
        except (psycopg.errors.DeadlockDetected, psycopg.errors.SerializationFailure):
            if attempt == RETRIES - 1:
                raise
    raise AssertionError("unreachable")


async def _ain_tx(make: Callable[[], steps.Steps[tuple[T, list[events.Event]]]], conn: Any) -> T:
    if conn is not None:
        if database.conn_kind(conn) != "async":
            raise TypeError("conn= takes a psycopg AsyncConnection here; use the sync function with a Connection")
        result, evs = await steps.arun(conn, make())
        await events.apublish_after(await events.apublish_in(conn, evs))
        return result
    for attempt in range(RETRIES):
        try:
            pool = await database.async_pool()
            async with pool.connection() as own:
                result, evs = await steps.arun(own, make())
                later = await events.apublish_in(own, evs)
            await events.apublish_after(later)
            return result
        except (psycopg.errors.DeadlockDetected, psycopg.errors.SerializationFailure):
            if attempt == RETRIES - 1:
                raise
    raise AssertionError("unreachable")


def _refused(group_id: int, row: dict[str, Any] | None, adding: int, states: Sequence[str]) -> Exception:
    """The typed error for an add that ADD_TOTAL refused, from the group's row."""
    if row is None:
        return GroupNotFound(f"no task group {group_id} (never created, or deleted after its retention time)")
    if row["finished_at"] is not None or row["state"] not in states:
        how = ("only its running members can add to it (ctx.group.enqueue)" if row["state"] == "sealed"
               else "it takes no more members")
        return GroupClosedError(f"task group {group_id} is {row['state']}: {how}")
    return GroupLimitError(
        f"task group {group_id} has {row['total']} members and adding {adding} would pass the limit of "
        f"{MAX_GROUP_MEMBERS}: split the work over several groups")


def _add_steps(group_id: int, batch: Batch, *, states: Sequence[str], seal: bool = False,
               fence: tuple[int, int] | None = None
               ) -> steps.Steps[tuple[list[dict[str, Any]], list[events.Event]]]:
    """Fence (ctx.group.enqueue), insert, count pending, bump total; raise if refused.
    Returns the member rows (id and name at least) and their "enqueued" events still to
    publish: none when the insert published them itself (Postgres fan-out in the jobs'
    database, as enqueue_many does)."""
    if fence is not None:
        ok = yield steps.Query(gq.FENCE_MEMBER, {"id": fence[0], "lease": fence[1]})
        if not ok:
            raise LeaseLostError(
                f"job {fence[0]} no longer holds its claim (rescued after its runtime was presumed dead, timed out "
                f"or given back): its additions to group {group_id} are refused; another attempt will run")
    in_sql = events.in_transaction()
    rows, got = yield from steps.add(group_id, batch.chunks(CHUNK), states=states, limit=MAX_GROUP_MEMBERS,
                                     seal=seal, publish=in_sql)
    if got is None:
        row = yield from steps.group_row(group_id)
        raise _refused(group_id, row, len(rows), states)
    return rows, ([] if in_sql else [events.job_event("enqueued", r) for r in rows])


def _check_limit(n: int) -> None:
    if n > MAX_GROUP_MEMBERS:
        raise GroupLimitError(f"a task group takes at most {MAX_GROUP_MEMBERS} members; this one would have {n}: "
                              "split the work over several groups")


# -- the block: create, fill and seal in one transaction ---------------------------------------

class GroupBuilder:
    """`with jobs.group(...) as g:` collects members with `g.enqueue(fn, *args)`; at the end of
    the block the group is created, filled and sealed in one transaction (the caller's with
    `conn=`). If the block raises, nothing is written. `g.id` and `g.handle` are known inside
    the block already (the id is reserved on entry)."""

    def __init__(self, on_finish: JobRequest | None, on_success: JobRequest | None, on_failure: JobRequest | None,
                 conn: Any, shards: int) -> None:
        if not 1 <= shards <= 1024:
            raise ValueError(f"shards= must be between 1 and 1024, got {shards}")
        self._callbacks = {"on_finish": steps.callback_spec(on_finish), "on_success": steps.callback_spec(on_success),
                           "on_failure": steps.callback_spec(on_failure)}
        self._conn = conn
        self._shards = shards
        self._batch = Batch()
        self._id: int | None = None
        self.members: list[JobHandle] = []

    @property
    def id(self) -> int:
        if self._id is None:
            raise RuntimeError("the group's id is known once its `with` block is entered")
        return self._id

    @property
    def handle(self) -> GroupHandle:
        return GroupHandle(self.id)

    def enqueue(self, fn: JobFunction, *args: Any, wait: float | None = None, at: datetime | None = None) -> None:
        """Add a member (written when the block ends). Arguments are checked now."""
        if isinstance(fn, JobRequest):
            if args:
                raise TypeError("g.enqueue(job.request(...)) takes no further arguments")
            fn, args = fn.function, fn.args
        if not isinstance(fn, JobFunction):
            raise TypeError(f"g.enqueue() takes a @jobs.job function and its arguments, got {fn!r}")
        _check_limit(len(self._batch) + 1)
        self._batch.add(fn, args, _run_at(wait, at), self.id)

    def enqueue_many(self, items: Iterable[Any]) -> None:
        """Members as for jobs.enqueue_many: job.request(...) values or (job, args[, options]) tuples."""
        for item in items:
            fn, args, run_at = _item(item)
            _check_limit(len(self._batch) + 1)
            self._batch.add(fn, args, run_at, self.id)

    def _steps(self) -> steps.Steps[tuple[list[dict[str, Any]], list[events.Event]]]:
        yield from steps.create(self.id, self._shards, self._callbacks)
        rows, enqueued = yield from _add_steps(self.id, self._batch, states=["open"], seal=True)
        (view,) = yield from steps.views([self.id])
        evs = [group_events.group_event("created", view)] + enqueued
        # Empty: nothing will ever finish, so the seal finishes it (ADD_TOTAL holds the lock).
        evs.extend((yield from steps.finish([self.id], locked=True)) if not rows else [])
        yield from steps.record(evs[:1])
        return rows, evs

    def _done(self, rows: list[dict[str, Any]]) -> None:
        self.members = [JobHandle(r["id"], r["name"]) for r in rows]

    def __enter__(self) -> GroupBuilder:
        if self._conn is not None:
            self._id = int(self._conn.execute(gq.RESERVE_GROUP_ID).fetchone()[0])
        else:
            with database.sync_pool().connection() as own:
                self._id = int(own.execute(gq.RESERVE_GROUP_ID).fetchone()[0])  # type: ignore[index]
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if exc_type is not None:
            return  # nothing was written; the reserved id stays unused
        self._done(_in_tx(self._steps, self._conn))

    async def __aenter__(self) -> GroupBuilder:
        if self._conn is not None:
            cur = await self._conn.execute(gq.RESERVE_GROUP_ID)
        else:
            pool = await database.async_pool()
            async with pool.connection() as own:
                cur = await own.execute(gq.RESERVE_GROUP_ID)
                self._id = int((await cur.fetchone())[0])
                return self
        self._id = int((await cur.fetchone())[0])
        return self

    async def __aexit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if exc_type is not None:
            return
        self._done(await _ain_tx(self._steps, self._conn))


def group(on_finish: JobRequest | None = None, on_success: JobRequest | None = None,
          on_failure: JobRequest | None = None, *, conn: Any = None, shards: int = DEFAULT_SHARDS) -> GroupBuilder:
    """A task group built in one `with` block (see GroupBuilder). Callbacks are job requests
    (`some_job.request(*args)`): on_finish always runs once the group is finished, on_success
    when every member succeeded, on_failure otherwise (a failed or cancelled member)."""
    return GroupBuilder(on_finish, on_success, on_failure, conn, shards)


def agroup(on_finish: JobRequest | None = None, on_success: JobRequest | None = None,
           on_failure: JobRequest | None = None, *, conn: Any = None, shards: int = DEFAULT_SHARDS) -> GroupBuilder:
    """`async with jobs.agroup(...) as g:`; `conn=` takes an AsyncConnection."""
    return GroupBuilder(on_finish, on_success, on_failure, conn, shards)


# -- separate calls ----------------------------------------------------------------------------

def _create_steps(callbacks: dict[str, str | None], shards: int) -> steps.Steps[tuple[GroupHandle, list[events.Event]]]:
    (row,) = yield steps.Query(gq.RESERVE_GROUP_ID, {})
    group_id = int(row["nextval"])
    yield from steps.create(group_id, shards, callbacks)
    (view,) = yield from steps.views([group_id])
    evs = [group_events.group_event("created", view)]
    yield from steps.record(evs)
    return GroupHandle(group_id), evs


def _callbacks(on_finish: Any, on_success: Any, on_failure: Any) -> dict[str, str | None]:
    return {"on_finish": steps.callback_spec(on_finish), "on_success": steps.callback_spec(on_success),
            "on_failure": steps.callback_spec(on_failure)}


def create_group(on_finish: JobRequest | None = None, on_success: JobRequest | None = None,
                 on_failure: JobRequest | None = None, *, conn: Any = None,
                 shards: int = DEFAULT_SHARDS) -> GroupHandle:
    """Create an open group, to fill with add_to_group() and close with seal_group()
    (in as many transactions as you like). It cannot finish before it is sealed."""
    cbs = _callbacks(on_finish, on_success, on_failure)
    return _in_tx(lambda: _create_steps(cbs, shards), conn)


async def acreate_group(on_finish: JobRequest | None = None, on_success: JobRequest | None = None,
                        on_failure: JobRequest | None = None, *, conn: Any = None,
                        shards: int = DEFAULT_SHARDS) -> GroupHandle:
    cbs = _callbacks(on_finish, on_success, on_failure)
    return await _ain_tx(lambda: _create_steps(cbs, shards), conn)


def _add_many_steps(group_id: int, batch: Batch) -> steps.Steps[tuple[list[JobHandle], list[events.Event]]]:
    rows, enqueued = yield from _add_steps(group_id, batch, states=["open"])
    # We hold the group's row lock (ADD_TOTAL): this progress is ordered with its other events.
    (view,) = yield from steps.views([group_id])
    evs = enqueued + [group_events.group_event("progress", view)]
    yield from steps.record(evs[-1:])
    return [JobHandle(r["id"], r["name"]) for r in rows], evs


def _batch_of(group_id: int, items: Iterable[Any]) -> Batch:
    batch = Batch()
    for item in items:
        fn, args, run_at = _item(item)
        batch.add(fn, args, run_at, group_id)
    _check_limit(len(batch))
    return batch


def add_to_group(group_id: int, fn: JobFunction, *args: Any, wait: float | None = None,
                 at: datetime | None = None, conn: Any = None) -> JobHandle:
    """Add one member to an open group. Raises GroupClosedError once it is sealed (running
    members can still add through ctx.group.enqueue), GroupLimitError past the member limit."""
    group_id = checked_id(group_id, "group_id")
    batch = Batch()
    batch.add(fn, args, _run_at(wait, at), group_id)
    return _in_tx(lambda: _add_many_steps(group_id, batch), conn)[0]


def add_many_to_group(group_id: int, items: Iterable[Any], *, conn: Any = None) -> list[JobHandle]:
    """Add many members in one transaction (items as for jobs.enqueue_many)."""
    group_id = checked_id(group_id, "group_id")
    batch = _batch_of(group_id, items)
    return _in_tx(lambda: _add_many_steps(group_id, batch), conn)


async def aadd_to_group(group_id: int, fn: JobFunction, *args: Any, wait: float | None = None,
                        at: datetime | None = None, conn: Any = None) -> JobHandle:
    group_id = checked_id(group_id, "group_id")
    batch = Batch()
    batch.add(fn, args, _run_at(wait, at), group_id)
    return (await _ain_tx(lambda: _add_many_steps(group_id, batch), conn))[0]


def _seal_steps(group_id: int) -> steps.Steps[tuple[bool, list[events.Event]]]:
    sealed, evs = yield from steps.seal(group_id)
    if not sealed:
        row = yield from steps.group_row(group_id)
        if row is None:
            raise GroupNotFound(f"no task group {group_id}")
    return sealed, evs


def seal_group(group_id: int, *, conn: Any = None) -> bool:
    """Seal an open group: no more adds from outside; it finishes (callbacks run) once no
    member is pending, at once if none is. False if it was not open (already sealed,
    cancelled or finished)."""
    group_id = checked_id(group_id, "group_id")
    return _in_tx(lambda: _seal_steps(group_id), conn)


async def aseal_group(group_id: int, *, conn: Any = None) -> bool:
    group_id = checked_id(group_id, "group_id")
    return await _ain_tx(lambda: _seal_steps(group_id), conn)


# -- reads -------------------------------------------------------------------------------------

def _read(sql: str, params: dict[str, Any]) -> list[dict[str, Any]]:
    with database.sync_pool().connection() as conn:
        with conn.cursor(row_factory=dict_row) as cur:
            cur.execute(sql, params)  # type: ignore[arg-type]
            return cur.fetchall()


def get_group(group_id: int) -> dict[str, Any] | None:
    """The group as its events show it ({id, state, total, pending, succeeded, failed,
    cancelled}) plus created_at, sealed_at, cancelled_at, finished_at; None if unknown."""
    group_id = checked_id(group_id, "group_id")
    rows = _read(gq.GROUP_VIEWS, {"ids": [group_id]})
    return group_events.view_time(rows[0]) if rows else None


def group_members(group_id: int, after: int | None = None, limit: int = 100) -> tuple[list[dict[str, Any]], int | None]:
    """One page of members in id order: (rows, next_cursor). Pass next_cursor as `after` for
    the next page; it is None on the last page (even a full one)."""
    group_id = checked_id(group_id, "group_id")
    if limit < 1:
        raise ValueError(f"limit must be at least 1, got {limit}")
    rows = _read(gq.MEMBERS_PAGE, {"id": group_id, "after": after or 0, "limit": limit})
    more = len(rows) > limit
    rows = rows[:limit]
    for r in rows:
        r["run_at"] = group_events._iso(r["run_at"])
        r["finished_at"] = group_events._iso(r["finished_at"])
    return rows, (rows[-1]["id"] if more else None)


def group_history(group_id: int, before: int | None = None, limit: int = 50) -> tuple[list[dict[str, Any]], int | None]:
    """The group's events, newest first: (rows of {seq, event, data, at}, next_cursor)."""
    group_id = checked_id(group_id, "group_id")
    if limit < 1:
        raise ValueError(f"limit must be at least 1, got {limit}")
    rows = _read(gq.EVENTS_PAGE, {"id": group_id, "before": before or 2**62, "limit": limit})
    more = len(rows) > limit
    rows = rows[:limit]
    for r in rows:
        r["at"] = group_events._iso(r["at"])
    return rows, (rows[-1]["seq"] if more else None)


# -- ctx.group ---------------------------------------------------------------------------------

class GroupContext:
    """`ctx.group` of a running member or callback.

    Members: `id`, and `await ctx.group.enqueue(fn, *args)` adds a member to the group, also
    after the seal, fenced by the member's claim (LeaseLostError once it lost it).
    Callbacks: also `kind` ("finish", "success" or "failure") and the group's final `state`,
    `total`, `pending`, `succeeded`, `failed`, `cancelled` (loaded before the callback runs);
    `as_dict()` gives them as events do."""

    def __init__(self, ctx: Any, view: dict[str, Any] | None = None, kind: str | None = None) -> None:
        self._ctx = ctx
        gid = ctx.job.group_id
        self.id: int = abs(gid)
        self.is_callback = gid < 0
        self.kind = kind
        self._view = view or {}

    def __getattr__(self, name: str) -> Any:
        if name in ("state", "total", "pending", "succeeded", "failed", "cancelled"):
            return self._view.get(name)
        raise AttributeError(name)

    def as_dict(self) -> dict[str, Any]:
        return {"id": self.id, **{k: self._view.get(k) for k in group_events.VIEW_KEYS if k != "id"}}

    def __repr__(self) -> str:
        return f"<group {self.id}{' callback ' + str(self.kind) if self.is_callback else ''}>"

    async def _pool(self) -> Any:
        completer = getattr(self._ctx, "_completer", None)
        pool = getattr(completer, "_pool", None)
        return pool if pool is not None else await database.async_pool()

    async def enqueue(self, fn: JobFunction, *args: Any, wait: float | None = None,
                      at: datetime | None = None) -> JobHandle:
        """Add a member to this job's group; returns its handle once committed."""
        if self.is_callback:
            raise GroupClosedError(f"this callback runs after group {self.id} finished: it takes no more members "
                                   "(enqueue a job of your own, or start a new group)")
        if isinstance(fn, JobRequest):
            fn, args = fn.function, fn.args
        batch = Batch()
        batch.add(fn, args, _run_at(wait, at), self.id)
        job = self._ctx.job
        pool = await self._pool()
        async with pool.connection() as conn:
            rows, evs = await steps.arun(conn, _add_steps(self.id, batch, states=["open", "sealed"],
                                                          fence=(job.id, job.lease)))
            publisher = group_events.current_publisher()
            if publisher is None:
                evs.extend(await steps.arun(conn, steps.progress_now([self.id])))
            later = await events.apublish_in(conn, evs)
        await events.apublish_after(later)
        if publisher is not None:
            publisher.mark(self.id)  # after the commit: one read is enough
        return JobHandle(rows[0]["id"], rows[0]["name"])

    aenqueue = enqueue

    async def refresh(self) -> GroupContext:
        """Re-read the group's state and counts."""
        pool = await self._pool()
        async with pool.connection() as conn:
            (view,) = await steps.arun(conn, steps.views([self.id])) or [None]
        if view is not None:
            self._view = dict(view)
        return self


class SyncGroupContext:
    """`ctx.group` of a sync job (in a worker thread): the same names, blocking."""

    def __init__(self, inner: GroupContext, loop: asyncio.AbstractEventLoop) -> None:
        self._inner = inner
        self._loop = loop

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def enqueue(self, fn: JobFunction, *args: Any, wait: float | None = None, at: datetime | None = None,
                timeout: float = 30.0) -> JobHandle:
        future = asyncio.run_coroutine_threadsafe(self._inner.enqueue(fn, *args, wait=wait, at=at), self._loop)
        return future.result(timeout)

    def refresh(self, timeout: float = 30.0) -> SyncGroupContext:
        asyncio.run_coroutine_threadsafe(self._inner.refresh(), self._loop).result(timeout)
        return self


async def load_callback_context(ctx: Any) -> GroupContext:
    """ctx.group of a callback job: the group's final state and which callback this is."""
    group_id = -ctx.job.group_id
    pool = await GroupContext(ctx)._pool()
    async with pool.connection() as conn:
        async with conn.cursor(row_factory=dict_row) as cur:
            await cur.execute(gq.CALLBACK_CONTEXT, {"group_id": group_id, "job_id": ctx.job.id})
            row = await cur.fetchone()
    if row is None:
        return GroupContext(ctx)
    return GroupContext(ctx, dict(row), row["kind"])
