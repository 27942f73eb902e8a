"""Operator calls on single jobs: cancel, retry_failed, discard_failed (sync and async)."""

from __future__ import annotations

from typing import Any

from psycopg.rows import dict_row

from . import database, events, queries, terminal


def cancel(job_id: int) -> bool:
    """Cancel a job. A queued or scheduled job is cancelled at once; a running one is told
    (its runtime gets a notification) and stops at its next await or `ctx.progress()` call,
    ending as `cancelled`. Returns False when the job is already finished or unknown."""
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
    """Run a failed job again now, with a fresh set of attempts. False unless it was failed."""
    with database.sync_pool().connection() as conn:
        with conn.cursor(row_factory=dict_row) as cur:
            cur.execute(queries.RETRY_FAILED, {"id": job_id})
            rows = cur.fetchall()
        later = events.publish_in(conn, [events.job_event("enqueued", r) for r in rows])
    events.publish_after(later)
    return bool(rows)


def discard_failed(job_id: int) -> bool:
    """Delete a failed job for good. False unless it was failed."""
    with database.sync_pool().connection() as conn:
        rows = conn.execute(queries.DISCARD_FAILED, {"id": job_id}).fetchall()
    return bool(rows)


def job_state(job_id: int) -> dict[str, Any] | None:
    """The job's current `job` object as events show it, or None."""
    with database.sync_pool().connection() as conn:
        with conn.cursor(row_factory=dict_row) as cur:
            cur.execute(queries.JOB_STATE, {"id": job_id})
            row = cur.fetchone()
    return None if row is None else events.job_view(row)
