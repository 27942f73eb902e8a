"""The transactions of task groups, written once as sans-I/O steps.

Each step function is a generator that yields `Query` values and receives their rows; it returns
its result. `run` drives one with a sync connection, `arun` with an async one, inside whatever
transaction the connection has open: the job runtime's (async), `jobs.cancel` (sync), the
caller's `conn=`. The SQL and why it is safe under concurrency are in queries.py. The state
topic rings are in the SQL too; what the steps add is the record of group events that
`jobs.group_history()` reads.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Generator, Sequence
from typing import Any, Literal, TypeVar

import psycopg
from psycopg.rows import dict_row

from ...types import shown
from ...postgres.connect import cursor_on
from ..api.args import check_sendable, dumps, encode
from ..api.enqueue import is_spec
from ..api.registry import JobRequest
from ..errors import InvalidArgumentsError
from ..events.views import group_event
from . import queries as gq
from ...errors import ArgumentTypeError

T = TypeVar("T")
Row = dict[str, Any]
# When an add rings its group's topic (ADD_TOTAL says how each is safe).
Ring = Literal["now", "later", "coalesced"]
TERMINAL_STATES = frozenset({"succeeded", "failed", "cancelled"})


@dataclasses.dataclass
class Query:
    sql: str
    params: dict[str, Any]


Steps = Generator[Query, list[Row], T]


def run(conn: psycopg.Connection, steps: Steps[T]) -> T:
    """Drive `steps` on `conn`. A statement whose JSON passes one message to Postgres raises
    MessageTooLarge before it is sent (args.check_sendable; the caller's args.stored_whole names
    what it held): Postgres would close the connection on it."""
    try:
        query = next(steps)
        while True:
            check_sendable(query.params)
            with cursor_on(conn, dict_row) as cur:
                cur.execute(query.sql, query.params)
                rows = cur.fetchall() if cur.description else []
            query = steps.send(rows)
    except StopIteration as stop:
        return stop.value  # type: ignore[no-any-return]


async def arun(aconn: psycopg.AsyncConnection, steps: Steps[T]) -> T:
    """run() for an AsyncConnection."""
    try:
        query = next(steps)
        while True:
            check_sendable(query.params)
            async with cursor_on(aconn, dict_row) as cur:
                await cur.execute(query.sql, query.params)
                rows = await cur.fetchall() if cur.description else []
            query = steps.send(rows)
    except StopIteration as stop:
        return stop.value  # type: ignore[no-any-return]


def members_of(rows: Sequence[Row]) -> list[Row]:
    """The rows that are group members (not callbacks, not lone jobs) in a terminal state."""
    return [r for r in rows if r.get("group_id") is not None and r["state"] in TERMINAL_STATES]


# -- the record of events (jobs.group_history) -------------------------------------------------

def record(rows: Sequence[Row], event: str | None = None) -> Steps[None]:
    """Record what the group rows (GROUP_VIEWS-like) show, as `event` or each row's own."""
    if not rows:
        return
    evs = [group_event(r, event) for r in rows]
    yield Query(gq.RECORD_EVENTS, {
        "group_ids": [e["group"]["id"] for e in evs],
        "events": [e["event"] for e in evs],
        "datas": [json.dumps(e, separators=(",", ":")) for e in evs],
    })


# -- finishing ------------------------------------------------------------------------------

def finish(ids: Sequence[int], *, locked: bool) -> Steps[list[Row]]:
    """Finish whichever of `ids` are sealed (or cancelled) with nothing pending: enqueue their
    callbacks (exactly once). Locks the group rows first unless the transaction already holds
    them. Returns the finished groups' rows."""
    if not ids:
        return []
    ids = sorted(set(ids))
    if not locked:
        yield Query(gq.LOCK_GROUPS, {"ids": ids})
    # A separate statement after the lock: its snapshot sees every earlier lock holder's commit.
    done = yield Query(gq.FINISH_GROUPS, {"ids": ids})
    yield from record(done)
    return done


def progress_now(ids: Sequence[int], changed: Callable[[Row], bool] | None = None) -> Steps[list[Row]]:
    """Record and ring progress for `ids` now, for the unfinished groups that `changed` accepts
    (all of them without it: an operator call, or the progress publisher's flush); returns every
    group's view. Locks the group rows (LOCK_GROUPS_FOR_PROGRESS says why), so two recorders take
    turns and no progress is recorded after `finished`; the views are read in a new statement, whose snapshot sees every finisher that
    held the lock before."""
    ids = sorted(set(ids))
    if not ids:
        return []
    yield Query(gq.LOCK_GROUPS_FOR_PROGRESS, {"ids": ids})
    views = yield Query(gq.GROUP_VIEWS, {"ids": ids})
    live = [v for v in views if v["finished_at"] is None and (changed is None or changed(v))]
    yield from record(live, "progress")
    if live:
        yield Query(gq.RING_GROUPS, {"ids": [v["id"] for v in live]})
    return views


def progress_coalesced(ids: Sequence[int]) -> Steps[None]:
    """progress_now for an operator call that may come many times a second (jobs.cancel of a
    group's members one after another, cancel_group's chunks): a group that showed an event in
    the last 100 ms is left to the runtimes, whose progress publishers ring it within about as
    long, as a coalesced add is; the others are recorded and rung now."""
    ids = sorted(set(ids))
    if not ids:
        return
    recent = [r["id"] for r in (yield Query(gq.RECENTLY_SHOWN, {"ids": ids}))]
    yield from progress_now([g for g in ids if g not in recent])
    if recent:
        yield Query(gq.UNRUNG, {"ids": recent})


# -- a member's outcome ----------------------------------------------------------------------

def count_outcomes(rows: Sequence[Row]) -> Steps[set[int]]:
    """In the transaction that moved `rows` (group members) to a terminal state: count them on
    their shards; for every shard that drained, lock its group and finish it if it is done.
    Returns the groups whose counts changed."""
    if not rows:
        return set()
    shards = yield Query(gq.COUNT_OUTCOMES, {
        "ids": [r["id"] for r in rows],
        "group_ids": [r["group_id"] for r in rows],
        "states": [r["state"] for r in rows],
    })
    return (yield from counted_shards(shards))


def counted_shards(shards: Sequence[Row]) -> Steps[set[int]]:
    """After COUNT_OUTCOMES (or COMPLETE_COUNTING) in this transaction, given the shard rows it
    returned: finish (LOCK_GROUPS, then FINISH_GROUPS) every group one of them drained. Returns
    the groups whose counts changed."""
    touched = {s["group_id"] for s in shards}
    drained = sorted({s["group_id"] for s in shards if s["pending"] <= 0})
    if drained:
        yield from finish(drained, locked=False)
    return touched


# -- building a group ------------------------------------------------------------------------

def callback_spec(request: Any, keyword: str) -> str | None:
    """A JobRequest as stored on the group: everything needed to enqueue it anywhere. `keyword`
    names the parameter it came as (`on_success=`): of three callbacks, the wrong one is named."""
    if request is None:
        return None
    if not isinstance(request, JobRequest):
        # The job function itself is the likely slip: say how to make its request.
        got = (f"the job function {request.name!r} itself: pass its .request(*args) with the arguments "
               f"the callback runs with" if is_spec(request) else f"{shown(request, typed=True, width=60)}")
        raise ArgumentTypeError(f"{keyword} takes a job request (some_job.request(*args)), got {got}")
    fn = request.function
    # request() checked the arguments on its fast path, which does not measure ints: encode()
    # names one too long for JSON text (InvalidArgumentsError, as enqueue does), where
    # json.dumps would raise Python's own ValueError.
    args = list(request.args)
    encode(args, "args", InvalidArgumentsError, "job arguments")
    # The function's claim limits hold for its callbacks as for its other jobs: without `limited`
    # the plain claim would take them, past its concurrency= and rate=. The key is taken now, as
    # enqueue takes it (a missing or oversized one is refused here, not when the group finishes).
    limits = getattr(fn, "_limits", None)
    limited = limits is not None and limits.any
    # dumps() as enqueue writes arguments: json.dumps writes a float from 1e16 up with an exponent,
    # which jsonb keeps as the integer it equals, so the callback would get an int in its place.
    return dumps({"name": fn.name, "queue": request.queue or fn.queue, "priority": fn.priority,
                  "max_attempts": fn.max_attempts, "args": args, "limited": limited,
                  "concurrency_key": limits.key_of(args, fn.name) if limits is not None and limited else None})


def create(group_id: int, shards: int, callbacks: dict[str, str | None], parent_id: int | None = None) -> Steps[None]:
    """A new group; `parent_id`: the durable job that will park on it (its finish wakes that job)."""
    yield Query(gq.CREATE_GROUP, {"id": group_id, "shards": shards, "parent_id": parent_id, **callbacks})


def add(group_id: int, batches: Sequence[tuple[str, dict[str, Any]]], *, states: Sequence[str], limit: int,
        seal: bool = False, ring: Ring = "now") -> Steps[tuple[list[Row], Row | None]]:
    """Insert members (enqueue statements and their parameters: Batch.chunks), count them pending,
    then, last, bump the group's total under its row lock (state and limit checked there) and ring
    as `ring` says (ADD_TOTAL). Returns the member rows (id, name) and the group's (total, state,
    rung), or None when the group refused (the caller raises and rolls back). An item whose
    idempotency key an unfinished job already held (created false) gets that job's row but is not
    a member: only created jobs are counted."""
    rows: list[Row] = []
    for sql, params in batches:
        rows.extend((yield Query(sql, params)))
    created = [r["id"] for r in rows if r.get("created", True)]
    if created:
        yield Query(gq.ADD_PENDING, {"group_id": group_id, "ids": created})
    got = yield Query(gq.ADD_TOTAL, {"group_id": group_id, "n": len(created), "seal": seal,
                                     "states": list(states), "limit": limit, "ring": ring})
    return rows, (got[0] if got else None)


def group_row(group_id: int) -> Steps[Row | None]:
    got = yield Query(gq.GROUP_ROW, {"id": group_id})
    return got[0] if got else None


def views(ids: Sequence[int]) -> Steps[list[Row]]:
    got = yield Query(gq.GROUP_VIEWS, {"ids": sorted(set(ids))})
    return got


def seal(group_id: int) -> Steps[bool]:
    yield Query(gq.SEAL_SHARDS, {"id": group_id})  # locks nothing under READ COMMITTED
    sealed = yield Query(gq.SEAL, {"id": group_id})
    if not sealed:
        return False
    # The seal holds the group lock: finish (in a new statement) if nothing is pending.
    if not (yield from finish([group_id], locked=True)):
        yield from record((yield from views([group_id])), "progress")
    return True
