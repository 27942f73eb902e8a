"""Operator calls on single jobs: cancel, retry_failed, discard_failed, job_state."""

from __future__ import annotations

from typing import Any

from psycopg.rows import dict_row

from .. import database, queries
from ..errors import GroupClosedError
from ..events.views import job_view
from ..groups import outcomes, steps
from ..groups.cancel import acancel_children, cancel_children
from .handles import checked_id


def cancel(job_id: int) -> bool:
    """Cancel a job. A queued, scheduled or waiting job is cancelled at once (a waiting one's
    unfinished children with it); a running one is told (its runtime gets a notification) and
    stops at its next await or `ctx.progress()` call, ending as `cancelled`. Returns False when
    the job is already finished or unknown."""
    job_id = checked_id(job_id, "job_id")
    with database.connection() as conn:
        with conn.cursor(row_factory=dict_row) as cur:
            cur.execute(queries.CANCEL, {"id": job_id})
            rows = cur.fetchall()
        touched = outcomes.count_sync(conn, outcomes.terminal(rows))
        steps.run(conn, steps.progress_now(sorted(touched)))
    # After commit: from now on the job cannot park again, so no new group of children appears.
    if outcomes.terminal(rows):
        cancel_children([job_id])
    return bool(rows)


async def acancel(job_id: int) -> bool:
    job_id = checked_id(job_id, "job_id")
    async with database.aconnection() as conn:
        async with conn.cursor(row_factory=dict_row) as cur:
            await cur.execute(queries.CANCEL, {"id": job_id})
            rows = await cur.fetchall()
        touched = await outcomes.count(conn, outcomes.terminal(rows))
        await steps.arun(conn, steps.progress_now(sorted(touched)))
    if outcomes.terminal(rows):
        await acancel_children([job_id])
    return bool(rows)


def retry_failed(job_id: int) -> bool:
    """Run a failed job again now, with a fresh set of attempts. False unless it was failed. A task
    group's member is refused (GroupClosedError): its failure is counted in its group."""
    job_id = checked_id(job_id, "job_id")
    with database.connection() as conn:
        found = conn.execute(queries.JOB_GROUP, {"id": job_id}).fetchone()
        if found is not None and found[0] is not None:
            raise GroupClosedError(f"job {job_id} is a member of task group {found[0]}, which counted its failure: "
                                   "add a new member (or start a new group) instead")
        rows = conn.execute(queries.RETRY_FAILED, {"id": job_id}).fetchall()
    return bool(rows)


def discard_failed(job_id: int) -> bool:
    """Delete a failed job for good. False unless it was failed."""
    job_id = checked_id(job_id, "job_id")
    with database.connection() as conn:
        rows = conn.execute(queries.DISCARD_FAILED, {"id": job_id}).fetchall()
    return bool(rows)


def job_state(job_id: int) -> dict[str, Any] | None:
    """The job's current `job` object as its state topic shows it, or None."""
    job_id = checked_id(job_id, "job_id")
    with database.connection() as conn:
        with conn.cursor(row_factory=dict_row) as cur:
            cur.execute(queries.JOB_STATES, {"ids": [job_id]})
            row = cur.fetchone()
    return None if row is None else job_view(row)
