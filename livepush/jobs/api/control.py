"""Operator calls on single jobs: cancel, retry_failed, discard_failed, job_state; cancel_tagged,
which cancels each unfinished job with a tag as cancel() does; and on queues: pause_queue,
resume_queue. Each has an async twin (`a` + its name)."""

from __future__ import annotations

import logging
from typing import Any

import psycopg
from psycopg.rows import dict_row

from ...blocking import warn_if_on_event_loop
from ...errors import ArgumentValueError, DependencyError
from ...postgres.text import BIGINT_MAX
from ...tasks import carried_through
from .. import database, queries
from ..errors import GroupClosedError, InvalidArgumentsError
from ..events.views import job_view
from ..groups import outcomes, steps
from ..groups.cancel import acancel_children, cancel_children
from ..groups.transactions import ain_tx, in_tx
from .awaited import awaited
from .handles import checked_id
from .limits import Limits, check_claim_entry
from .options import check_queue, check_tag
from .registry import REGISTRY

log = logging.getLogger("livepush.jobs")


def _cancel_steps(job_id: int) -> steps.Steps[list[dict[str, Any]]]:
    """Cancel (or flag) the job; if that ended it, count it in its group (ringing its progress,
    coalesced: cancel_tagged cancels a group's members one by one) and record it on its workflow run."""
    rows = yield steps.Query(queries.CANCEL, {"id": job_id})
    touched = yield from outcomes.ended(rows)
    yield from steps.progress_coalesced(sorted(touched))
    return rows


def cancel(job_id: int) -> bool:
    """Cancel a job. A queued, scheduled or waiting job is cancelled at once (a waiting one's
    unfinished children with it); a running one is told (its runtime gets a notification) and
    stops at its next await or `ctx.progress()` call, ending as `cancelled`. Returns False when
    the job is already finished or unknown. Retried when Postgres broke a deadlock (a cancel
    meets a completer finishing the same group)."""
    warn_if_on_event_loop("jobs.cancel()", "jobs.acancel()")
    return bool(_cancel(checked_id(job_id, "job_id")))


@awaited("jobs.acancel()")
async def acancel(job_id: int) -> bool:
    """cancel() for async code."""
    return bool(await _acancel(checked_id(job_id, "job_id")))


def _cancel(job_id: int) -> set[int]:
    """cancel(): the jobs it cancelled or told, the children of a waiting job among them."""
    rows = in_tx(lambda: _cancel_steps(job_id), None)
    ended = {job_id} if rows else set()
    if outcomes.terminal(rows):
        try:
            ended.update(cancel_children([job_id]))
        except DependencyError as exc:
            _children_failed(job_id, exc)
    return ended


async def _acancel(job_id: int) -> set[int]:
    rows = await ain_tx(lambda: _cancel_steps(job_id), None)
    ended = {job_id} if rows else set()
    if outcomes.terminal(rows):
        try:
            ended.update(await acancel_children([job_id]))
        except DependencyError as exc:
            _children_failed(job_id, exc)
    return ended


def _children_failed(job_id: int, exc: DependencyError) -> None:
    log.error("job %s was cancelled, but cancelling the children it waited for failed (%s): "
              "cancel their groups with jobs.cancel_group()", job_id, exc)


def tagged_unfinished(tag: str) -> list[int]:
    """The ids of every unfinished job with `tag`, oldest first."""
    params = {"tag": check_tag(tag), "limit": None, "unfinished": True, "before": BIGINT_MAX}
    with database.connection() as conn:
        return sorted(r[0] for r in conn.execute(queries.TAGGED_IDS, params).fetchall())


# Ids per statement of cancel_tagged()'s first pass (queries.CANCEL_LONE_QUEUED): each is its own
# short transaction, so a tag on a million jobs never holds a million row locks at once.
CANCEL_CHUNK = 1000


def _chunks(ids: list[int]) -> list[list[int]]:
    return [ids[i:i + CANCEL_CHUNK] for i in range(0, len(ids), CANCEL_CHUNK)]


def cancel_tagged(tag: str) -> int:
    """Cancel every unfinished job with `tag` (enqueue(tags=...)), each exactly as cancel() does
    (a running one is told and ends `cancelled` at its next await or progress call). Returns how
    many of them were cancelled or told, by their own cancel or their waiting parent's; a job
    that finished meanwhile is not counted. A job enqueued with the tag while this runs may be
    left out."""
    warn_if_on_event_loop("jobs.cancel_tagged()", "jobs.acancel_tagged()")
    ids = tagged_unfinished(tag)
    # Queued lone jobs (most, for a tag on a backlog) a thousand to a statement; then the rest
    # one by one, as cancel() does them: a transaction per job cost about a millisecond each.
    ended: set[int] = set()
    for chunk in _chunks(ids):
        with database.connection() as conn:
            ended.update(r[0] for r in conn.execute(queries.CANCEL_LONE_QUEUED, {"ids": chunk}).fetchall())
    for job_id in ids:
        if job_id not in ended:  # a tagged parent's cancel already took it
            ended |= _cancel(job_id)
    return len(ended.intersection(ids))


@awaited("jobs.acancel_tagged()")
async def acancel_tagged(tag: str) -> int:
    """cancel_tagged() for async code. A cancel of the task awaiting it does not cut it off
    part-way: a job cancelling a tag it carries is told to stop by that very cancel, at its next
    await, and the jobs after it in the cancel's order were left running."""
    return await carried_through(_acancel_tagged(check_tag(tag)),
                                 f"the cancel of the jobs tagged {tag!r} (call cancel_tagged again)")


async def _acancel_tagged(tag: str) -> int:
    ids = await _atagged_unfinished(tag)
    ended: set[int] = set()
    for chunk in _chunks(ids):
        async with database.aconnection() as conn:
            rows = await (await conn.execute(queries.CANCEL_LONE_QUEUED, {"ids": chunk})).fetchall()
        ended.update(r[0] for r in rows)
    for job_id in ids:
        if job_id not in ended:
            ended |= await _acancel(job_id)
    return len(ended.intersection(ids))


async def _atagged_unfinished(tag: str) -> list[int]:
    params = {"tag": check_tag(tag), "limit": None, "unfinished": True, "before": BIGINT_MAX}
    async with database.aconnection() as conn:
        rows = await (await conn.execute(queries.TAGGED_IDS, params)).fetchall()
    return sorted(r[0] for r in rows)


# What a failed member's refusal tells the caller to do instead.
# A workflow's fan-out batch is a task group too, which this read cannot tell apart (the runs are
# the workflows' to read): its way is named beside the group's.
_RETRY_INSTEAD = ("add a new member (or start a new group) instead; a member of a workflow's fan-out batch runs "
                  "again when its run is resumed (jobs.workflows.resume())")
_DISCARD_INSTEAD = "it is deleted with its group, after the retention time"


def retry_failed(job_id: int) -> bool:
    """Run a failed job again now, with a fresh set of attempts. False unless it was failed. A task
    group's member is refused (GroupClosedError): its failure is counted in its group. So is a
    workflow step's job (ValueError): its failure ended its run, which does not go on (run again,
    the job would end cancelled at once, its error lost)."""
    warn_if_on_event_loop("jobs.retry_failed()", "jobs.aretry_failed()")
    job_id = checked_id(job_id, "job_id")
    with database.connection() as conn:
        found = _refused_member(conn.execute(queries.JOB_GROUP, {"id": job_id}).fetchone(), job_id, _RETRY_INSTEAD)
        if not _retryable(found, job_id):
            return False
        assert found is not None
        limits = _limits_now(found, job_id)
        args = None
        if limits is not None and limits.key_index is not None:
            args = _args_of(conn.execute(queries.JOB_ARGS, {"id": job_id}).fetchone())
        params = {"id": job_id, **_claim_mark(job_id, found, limits, args)}
        try:
            # A savepoint: the unique violation below undoes only this statement.
            with conn.transaction():
                rows = conn.execute(queries.RETRY_FAILED, params).fetchall()
        except psycopg.errors.UniqueViolation:
            # An enqueue of the job's key committed while this ran (queries.RETRY_FAILED): that
            # job holds the key now, so this one stays failed, as when the key was held before.
            return False
    return bool(rows)


@awaited("jobs.aretry_failed()")
async def aretry_failed(job_id: int) -> bool:
    """retry_failed() for async code."""
    job_id = checked_id(job_id, "job_id")
    async with database.aconnection() as conn:
        found = _refused_member(await (await conn.execute(queries.JOB_GROUP, {"id": job_id})).fetchone(), job_id,
                                _RETRY_INSTEAD)
        if not _retryable(found, job_id):
            return False
        assert found is not None
        limits = _limits_now(found, job_id)
        args = None
        if limits is not None and limits.key_index is not None:
            args = _args_of(await (await conn.execute(queries.JOB_ARGS, {"id": job_id})).fetchone())
        params = {"id": job_id, **_claim_mark(job_id, found, limits, args)}
        try:
            async with conn.transaction():  # a savepoint, as in retry_failed()
                rows = await (await conn.execute(queries.RETRY_FAILED, params)).fetchall()
        except psycopg.errors.UniqueViolation:
            return False
    return bool(rows)


def _limits_now(found: tuple[Any, ...], job_id: int) -> Limits | None:
    """The claim limits of the failed job's function as this process defines it now (no limits:
    Limits()), or None when it does not define it (an operator's script that imports no jobs).
    retry_failed() enqueues the job again, and an enqueue is held to its caller's definition."""
    fn = REGISTRY.find(found[3])
    limits = getattr(fn, "_limits", None)
    if not isinstance(limits, Limits):
        return None
    if limits.any and found[4] != fn.queue:
        # Measured at the decorator for its own queue only (a durable child runs on its parent's).
        check_claim_entry(found[3], found[4], f"retry_failed({job_id}) of a job of {found[3]}")
    return limits


def _args_of(row: tuple[Any, ...] | None) -> list[Any]:
    return row[0] if row is not None and isinstance(row[0], list) else []


def _claim_mark(job_id: int, found: tuple[Any, ...], limits: Limits | None,
                args: list[Any] | None) -> dict[str, Any]:
    """RETRY_FAILED's `limited` and `concurrency_key` for a job of these limits (None: leave the
    job's mark as it is). A key the arguments cannot give (a parameter added since, without a
    default) leaves the job keyless, as a start marking the jobs enqueued before leaves it: it
    runs without the concurrency limit rather than never."""
    if limits is None:
        return {"limited": None, "concurrency_key": None}
    if not limits.any:
        return {"limited": False, "concurrency_key": None}
    try:
        key = limits.key_of(args or [], found[3])
    except InvalidArgumentsError:
        log.warning("job %s run again by retry_failed() has no value for the concurrency key %r of %s in its "
                    "arguments: it runs without the concurrency limit", job_id, limits.key_param, found[3])
        key = None
    return {"limited": True, "concurrency_key": key}


def _retryable(found: tuple[Any, ...] | None, job_id: int) -> bool:
    """Whether retry_failed() goes on to run the failed job again; a workflow step's is refused."""
    if found is None:
        return False
    if found[1] is not None:
        raise ArgumentValueError(f"job {job_id} ran a step of workflow run {found[1]}, which ended when it failed: a "
                                 "run does not go on once it ended; start a new run")
    return True


def _refused_member(found: tuple[Any, ...] | None, job_id: int, instead: str) -> tuple[Any, ...] | None:
    """From the job's queries.JOB_GROUP row: GroupClosedError if the job is a failed task group's
    member: its group counted its failure, so its row must stay as it is (queries.JOB_GROUP says
    why the read is safe). Returns the failed job's (group_id, workflow_id, state); None for no
    such job or one that is not failed, which retry_failed and discard_failed answer with False,
    a member's too: a member that has not failed is no mistake to refuse, and its group has
    counted no failure."""
    if found is None or found[2] != "failed":
        return None
    if found[0] is not None:
        raise GroupClosedError(f"job {job_id} is a member of task group {found[0]}, which counted its failure: "
                               f"{instead}")
    return found


def discard_failed(job_id: int) -> bool:
    """Delete a failed job for good. False unless it was failed. A task group's member is refused
    (GroupClosedError): its group counts it, and retention deletes it with its group."""
    warn_if_on_event_loop("jobs.discard_failed()", "jobs.adiscard_failed()")
    job_id = checked_id(job_id, "job_id")
    with database.connection() as conn:
        if _refused_member(conn.execute(queries.JOB_GROUP, {"id": job_id}).fetchone(), job_id,
                           _DISCARD_INSTEAD) is None:
            return False
        rows = conn.execute(queries.DISCARD_FAILED, {"id": job_id}).fetchall()
    return bool(rows)


@awaited("jobs.adiscard_failed()")
async def adiscard_failed(job_id: int) -> bool:
    """discard_failed() for async code."""
    job_id = checked_id(job_id, "job_id")
    async with database.aconnection() as conn:
        row = await (await conn.execute(queries.JOB_GROUP, {"id": job_id})).fetchone()
        if _refused_member(row, job_id, _DISCARD_INSTEAD) is None:
            return False
        rows = await (await conn.execute(queries.DISCARD_FAILED, {"id": job_id})).fetchall()
    return bool(rows)


def job_state(job_id: int) -> dict[str, Any] | None:
    """The job's current `job` object as its state topic shows it, or None."""
    warn_if_on_event_loop("jobs.job_state()", "jobs.ajob_state()")
    job_id = checked_id(job_id, "job_id")
    with database.connection() as conn:
        with conn.cursor(row_factory=dict_row) as cur:
            cur.execute(queries.JOB_STATES, {"ids": [job_id]})
            row = cur.fetchone()
    return None if row is None else job_view(row)


async def ajob_state(job_id: int) -> dict[str, Any] | None:
    """job_state() for async code."""
    job_id = checked_id(job_id, "job_id")
    async with database.aconnection() as conn:
        async with conn.cursor(row_factory=dict_row) as cur:
            await cur.execute(queries.JOB_STATES, {"ids": [job_id]})
            row = await cur.fetchone()
    return None if row is None else job_view(row)


def _queue_name(queue: Any) -> str:
    return check_queue(queue, "the queue to pause or resume")


def pause_queue(queue: str) -> bool:
    """Stop every runtime claiming from `queue` within a second (at once where its ring is heard);
    enqueues are still accepted and jobs already running finish. False when it was already paused."""
    warn_if_on_event_loop("jobs.pause_queue()", "jobs.apause_queue()")
    name = _queue_name(queue)  # a bad name is the caller's to fix, whatever the database's state
    with database.connection() as conn:
        return bool(conn.execute(queries.PAUSE_QUEUE, {"queue": name}).fetchall())


@awaited("jobs.apause_queue()")
async def apause_queue(queue: str) -> bool:
    """pause_queue() for async code."""
    name = _queue_name(queue)
    async with database.aconnection() as conn:
        return bool(await (await conn.execute(queries.PAUSE_QUEUE, {"queue": name})).fetchall())


def resume_queue(queue: str) -> bool:
    """Let runtimes claim from `queue` again; idle ones are rung and claim at once. False when it
    was not paused."""
    warn_if_on_event_loop("jobs.resume_queue()", "jobs.aresume_queue()")
    name = _queue_name(queue)  # a bad name is the caller's to fix, whatever the database's state
    with database.connection() as conn:
        return bool(conn.execute(queries.RESUME_QUEUE, {"queue": name}).fetchall())


@awaited("jobs.aresume_queue()")
async def aresume_queue(queue: str) -> bool:
    """resume_queue() for async code."""
    name = _queue_name(queue)
    async with database.aconnection() as conn:
        return bool(await (await conn.execute(queries.RESUME_QUEUE, {"queue": name})).fetchall())
