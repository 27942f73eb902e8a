"""The transactions of task groups, written once as sans-I/O steps.

Each step function is a generator that yields `Query` values and receives their rows; it
returns its result (usually the events to publish with the transaction). `run` drives one
with a sync connection, `arun` with an async one, inside whatever transaction the
connection has open: the job runtime's (async), `jobs.cancel` (sync), the caller's `conn=`.
The SQL and why it is safe under concurrency are in group_queries.py.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Generator, Sequence
from typing import Any, TypeVar

import psycopg
from psycopg.rows import dict_row

from ..events import views as events
from . import progress as group_events, queries as gq
from .. import queries
from .outcomes import TERMINAL_STATES

T = TypeVar("T")
Row = dict[str, Any]


@dataclasses.dataclass
class Query:
    sql: str
    params: dict[str, Any]


Steps = Generator[Query, list[Row], T]


def run(conn: psycopg.Connection, steps: Steps[T]) -> T:
    try:
        query = next(steps)
        while True:
            with conn.cursor(row_factory=dict_row) as cur:
                cur.execute(query.sql, query.params)  # type: ignore[arg-type]
                rows = cur.fetchall() if cur.description else []
            query = steps.send(rows)
    except StopIteration as stop:
        return stop.value  # type: ignore[no-any-return]


async def arun(aconn: psycopg.AsyncConnection, steps: Steps[T]) -> T:
    try:
        query = next(steps)
        while True:
            async with aconn.cursor(row_factory=dict_row) as cur:
                await cur.execute(query.sql, query.params)  # type: ignore[arg-type]
                rows = await cur.fetchall() if cur.description else []
            query = steps.send(rows)
    except StopIteration as stop:
        return stop.value  # type: ignore[no-any-return]


def members_of(rows: Sequence[Row]) -> list[Row]:
    """The rows that are group members (not callbacks, not lone jobs) in a terminal state."""
    return [r for r in rows if (r.get("group_id") or 0) > 0 and r["state"] in TERMINAL_STATES]


# -- finishing ------------------------------------------------------------------------------

def finish(ids: Sequence[int], *, locked: bool) -> Steps[list[events.Event]]:
    """Finish whichever of `ids` are sealed (or cancelled) with nothing pending: enqueue their
    callbacks (exactly once) and return `enqueued` + `finished` events. Locks the group rows
    first unless the transaction already holds them."""
    if not ids:
        return []
    ids = sorted(set(ids))
    if not locked:
        yield Query(gq.LOCK_GROUPS, {"ids": ids})
    # A separate statement after the lock: its snapshot sees every earlier lock holder's commit.
    done = yield Query(gq.FINISH_GROUPS, {"ids": ids})
    out: list[events.Event] = []
    for row in done:
        for cb in row["callbacks"]:
            out.append(events.job_event("enqueued", {**cb, "progress": None, "error": None}))
        out.append(group_events.group_event("finished", row))
    yield from record(out)
    return out


def record(evs: Sequence[events.Event]) -> Steps[None]:
    params = group_events.record_params(evs)
    if params is not None:
        yield Query(gq.RECORD_EVENTS, params)


def progress_now(ids: Sequence[int]) -> Steps[list[events.Event]]:
    """Progress events for `ids`, read now (when no ProgressPublisher runs in this process:
    an admin call such as jobs.cancel). Locks FOR SHARE like the publisher, so it never
    reports after `finished`."""
    ids = sorted(set(ids))
    if not ids:
        return []
    yield Query(gq.LOCK_GROUPS_SHARE, {"ids": ids})
    views = yield Query(gq.GROUP_VIEWS, {"ids": ids})
    out = group_events.progress_events(views)
    yield from record(out)
    return out


# -- a member's outcome ----------------------------------------------------------------------

@dataclasses.dataclass
class Counted:
    events: list[events.Event]
    # group -> shard -> that shard's done count after this transaction (for the publisher)
    expect: dict[int, dict[int, int]]


def count_outcomes(rows: Sequence[Row]) -> Steps[Counted]:
    """In the transaction that moved `rows` (group members) to a terminal state: count them
    on their shards; for every shard that drained, lock its group and finish it if it is done."""
    if not rows:
        return Counted([], {})
    shards = yield Query(gq.COUNT_OUTCOMES, {
        "ids": [r["id"] for r in rows],
        "group_ids": [r["group_id"] for r in rows],
        "states": [r["state"] for r in rows],
    })
    return (yield from counted_shards(shards))


def counted_shards(shards: Sequence[Row]) -> Steps[Counted]:
    """After COUNT_OUTCOMES (or COMPLETE_COUNTING) in this transaction, given the shard rows
    it returned: finish (LOCK_GROUPS, then FINISH_GROUPS) every group one of them drained."""
    expect: dict[int, dict[int, int]] = {}
    drained: set[int] = set()
    for s in shards:
        expect.setdefault(s["group_id"], {})[s["shard"]] = s["done"]
        if s["pending"] <= 0:
            drained.add(s["group_id"])
    evs = (yield from finish(sorted(drained), locked=False)) if drained else []
    return Counted(evs, expect)


# -- building a group ------------------------------------------------------------------------

def callback_spec(request: Any) -> str | None:
    """A JobRequest as stored on the group: everything needed to enqueue it anywhere."""
    if request is None:
        return None
    from ..api.registry import JobRequest

    if not isinstance(request, JobRequest):
        raise TypeError(f"group callbacks are job requests (some_job.request(*args)), got {request!r}")
    fn = request.function
    return json.dumps({"name": fn.name, "queue": fn.queue, "priority": fn.priority,
                       "max_attempts": fn.max_attempts, "args": list(request.args)})


def create(group_id: int, shards: int, callbacks: dict[str, str | None]) -> Steps[None]:
    yield Query(gq.CREATE_GROUP, {"id": group_id, "shards": shards, **callbacks})


def add(group_id: int, batches: Sequence[dict[str, Any]], *, states: Sequence[str], limit: int,
        seal: bool = False, publish: bool = False) -> Steps[tuple[list[Row], Row | None]]:
    """Insert members (ENQUEUE_MANY parameter sets), count them pending, then, last, bump the
    group's total under its row lock (state and limit checked there). Returns the member rows
    and the group's (total, state), or None when the group refused (the caller raises and
    rolls back). `publish`: the insert also publishes the members' "enqueued" events
    (ENQUEUE_MANY_PUBLISHING; its rows then carry only id and name)."""
    rows: list[Row] = []
    insert = queries.ENQUEUE_MANY_PUBLISHING if publish else queries.ENQUEUE_MANY
    for params in batches:
        rows.extend((yield Query(insert, params)))
    if rows:
        yield Query(gq.ADD_PENDING, {"group_id": group_id, "ids": [r["id"] for r in rows]})
    got = yield Query(gq.ADD_TOTAL, {"group_id": group_id, "n": len(rows), "seal": seal,
                                     "states": list(states), "limit": limit})
    return rows, (got[0] if got else None)


def group_row(group_id: int) -> Steps[Row | None]:
    got = yield Query(gq.GROUP_ROW, {"id": group_id})
    return got[0] if got else None


def views(ids: Sequence[int]) -> Steps[list[Row]]:
    got = yield Query(gq.GROUP_VIEWS, {"ids": sorted(set(ids))})
    return got


def seal(group_id: int) -> Steps[tuple[bool, list[events.Event]]]:
    sealed = yield Query(gq.SEAL, {"id": group_id})
    if not sealed:
        return False, []
    # The seal holds the group lock: finish (in a new statement) if nothing is pending.
    evs = yield from finish([group_id], locked=True)
    if not evs:
        (view,) = yield from views([group_id])
        evs = [group_events.group_event("progress", view)]
        yield from record(evs)
    return True, evs
