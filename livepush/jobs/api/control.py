"""Operator calls: cancel, retry_failed, discard_failed on single jobs; cancel_group (sync and async)."""

from __future__ import annotations

from typing import Any

from psycopg.rows import dict_row

from .. import database, queries
from ..events import views as events
from ..groups import outcomes as terminal
from .handles import checked_id


def cancel(job_id: int) -> bool:
    """Cancel a job. A queued or scheduled job is cancelled at once; a running one is told
    (its runtime gets a notification) and stops at its next await or `ctx.progress()` call,
    ending as `cancelled`. Returns False when the job is already finished or unknown."""
    job_id = checked_id(job_id, "job_id")
    with database.sync_pool().connection() as conn:
        with conn.cursor(row_factory=dict_row) as cur:
            cur.execute(queries.CANCEL, {"id": job_id})
            rows = cur.fetchall()
        done = [r for r in rows if r["state"] == "cancelled"]
        published = [events.state_event(r) for r in done]
        published.extend(terminal.on_terminal_sync(conn, done))
        later = events.publish_in(conn, published)
    events.publish_after(later)
    return bool(rows)


async def acancel(job_id: int) -> bool:
    job_id = checked_id(job_id, "job_id")
    pool = await database.async_pool()
    async with pool.connection() as conn:
        async with conn.cursor(row_factory=dict_row) as cur:
            await cur.execute(queries.CANCEL, {"id": job_id})
            rows = await cur.fetchall()
        done = [r for r in rows if r["state"] == "cancelled"]
        published = [events.state_event(r) for r in done]
        published.extend(await terminal.on_terminal(conn, done))
        later = await events.apublish_in(conn, published)
    await events.apublish_after(later)
    return bool(rows)


def retry_failed(job_id: int) -> bool:
    """Run a failed job again now, with a fresh set of attempts. False unless it was failed.
    A task group's member is refused (GroupClosedError): its failure is counted in its group."""
    job_id = checked_id(job_id, "job_id")
    with database.sync_pool().connection() as conn:
        with conn.cursor(row_factory=dict_row) as cur:
            cur.execute("SELECT group_id FROM livepush_jobs WHERE id = %s", (job_id,))
            found = cur.fetchone()
            if found is not None and (found["group_id"] or 0) > 0:
                from ..errors import GroupClosedError

                raise GroupClosedError(f"job {job_id} is a member of task group {found['group_id']}, which counted "
                                       "its failure: add a new member (or start a new group) instead")
            cur.execute(queries.RETRY_FAILED, {"id": job_id})
            rows = cur.fetchall()
        later = events.publish_in(conn, [events.job_event("enqueued", r) for r in rows])
    events.publish_after(later)
    return bool(rows)


def discard_failed(job_id: int) -> bool:
    """Delete a failed job for good. False unless it was failed."""
    job_id = checked_id(job_id, "job_id")
    with database.sync_pool().connection() as conn:
        rows = conn.execute(queries.DISCARD_FAILED, {"id": job_id}).fetchall()
    return bool(rows)


def job_state(job_id: int) -> dict[str, Any] | None:
    """The job's current `job` object as events show it, or None."""
    job_id = checked_id(job_id, "job_id")
    with database.sync_pool().connection() as conn:
        with conn.cursor(row_factory=dict_row) as cur:
            cur.execute(queries.JOB_STATE, {"id": job_id})
            row = cur.fetchone()
    return None if row is None else events.job_view(row)


# -- task groups ---------------------------------------------------------------------------------

CANCEL_CHUNK = 1000  # members per cancel transaction


def _cancel_mark_steps(group_id: int) -> Any:
    from ..groups import progress as group_events, queries as gq, steps

    marked = yield steps.Query(gq.CANCEL_MARK, {"id": group_id})
    if not marked:
        return False, []
    (view,) = yield from steps.views([group_id])
    evs = [group_events.group_event("cancelled", view)]
    yield from steps.record(evs)
    return True, evs


def _cancel_chunk_steps(group_id: int, after: int) -> Any:
    """One chunk of members: queued ones cancelled (and counted, like any outcome), running
    ones flagged. Returns (rows, events)."""
    from ..groups import queries as gq, steps

    rows = yield steps.Query(gq.CANCEL_MEMBERS, {"id": group_id, "after": after, "limit": CANCEL_CHUNK})
    return rows, [events.state_event(r) for r in rows if r["state"] == "cancelled"]


def cancel_group(group_id: int) -> bool:
    """Cancel a task group: members still queued (or waiting for a retry) are cancelled,
    running ones are told to stop (they end `cancelled` at their next await or
    `ctx.progress()`, or finish normally if they complete first). Once nothing is pending the
    group finishes as `cancelled`: on_finish and on_failure run. Returns False when the group
    was already finished or cancelled.

    Three kinds of short transaction, so a cancel never holds the group row while it waits
    for members' rows (see group_queries.py for the lock order)."""
    group_id = checked_id(group_id, "group_id")
    from ..groups import steps
    from ..groups.calls import _in_tx

    if not _in_tx(lambda: _cancel_mark_steps(group_id), None):
        return False
    after = 0
    while True:
        with database.sync_pool().connection() as conn:
            rows, evs = steps.run(conn, _cancel_chunk_steps(group_id, after))
            evs.extend(terminal.on_terminal_sync(conn, [r for r in rows if r["state"] == "cancelled"]))
            later = events.publish_in(conn, evs)
        events.publish_after(later)
        if len(rows) < CANCEL_CHUNK:
            break
        after = rows[-1]["id"]
    # Nothing pending now (all members were already finished, or none was running): the
    # group finishes here. Otherwise the last running member's outcome finishes it.
    _in_tx(lambda: _finish_steps(group_id), None)
    return True


async def acancel_group(group_id: int) -> bool:
    group_id = checked_id(group_id, "group_id")
    from ..groups import steps
    from ..groups.calls import _ain_tx

    if not await _ain_tx(lambda: _cancel_mark_steps(group_id), None):
        return False
    after = 0
    pool = await database.async_pool()
    while True:
        async with pool.connection() as conn:
            rows, evs = await steps.arun(conn, _cancel_chunk_steps(group_id, after))
            evs.extend(await terminal.on_terminal(conn, [r for r in rows if r["state"] == "cancelled"]))
            later = await events.apublish_in(conn, evs)
        await events.apublish_after(later)
        if len(rows) < CANCEL_CHUNK:
            break
        after = rows[-1]["id"]
    await _ain_tx(lambda: _finish_steps(group_id), None)
    return True


def _finish_steps(group_id: int) -> Any:
    from ..groups import steps

    evs = yield from steps.finish([group_id], locked=False)
    return None, evs
