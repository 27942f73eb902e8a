"""Cancelling a task group: `jobs.cancel_group()` / `acancel_group()`."""

from __future__ import annotations

from typing import Any

from psycopg_pool import AsyncConnectionPool

from ...blocking import warn_if_on_event_loop
from ...tasks import carried_through
from ..api.awaited import awaited
from ..api.handles import checked_id
from . import queries as gq
from . import steps
from .transactions import ain_tx, in_tx

CANCEL_CHUNK = 1000  # members per cancel transaction


def _mark_steps(group_id: int) -> steps.Steps[bool | None]:
    """True when this call cancelled the group; False when it was cancelled already but has not
    finished (a cancel that failed part-way, e.g. its connection dropped after this mark
    committed: its members must still be cancelled, and doing that again is harmless); None when
    there is nothing to do (finished, or no such group)."""
    marked = yield steps.Query(gq.CANCEL_MARK, {"id": group_id})
    if not marked:
        row = yield from steps.group_row(group_id)
        if row is not None and row["state"] == "cancelled" and row["finished_at"] is None:
            return False
        return None
    yield from steps.record((yield from steps.views([group_id])), "cancelled")
    return True


def _chunk_steps(group_id: int, after: int) -> steps.Steps[list[dict[str, Any]]]:
    """One chunk of members: queued ones cancelled (and counted, like any outcome), running ones
    flagged. Counts what changed and shows it coalesced, as jobs.cancel() of members does (an
    operator call has no progress publisher): chunks follow each other by milliseconds, and one
    event each broke the ~10 a second per group that progress keeps to. A group whose chunks are
    all cancelled finishes, and its `finished` shows the final counts. Returns the chunk's rows."""
    rows = yield steps.Query(gq.CANCEL_MEMBERS, {"id": group_id, "after": after, "limit": CANCEL_CHUNK})
    touched = yield from steps.count_outcomes(steps.members_of(rows))
    yield from steps.progress_coalesced(sorted(touched))
    return rows


def _finish_steps(group_id: int) -> steps.Steps[None]:
    yield from steps.finish([group_id], locked=False)


def _children_steps(job_ids: list[int]) -> steps.Steps[list[int]]:
    rows = yield steps.Query(gq.CHILD_GROUPS, {"ids": job_ids})
    return [r["id"] for r in rows]


def _parked(rows: list[dict[str, Any]]) -> list[int]:
    """Members this chunk cancelled that may have been parked on children of their own."""
    return [r["id"] for r in rows if r["state"] == "cancelled" and r["has_steps"]]


def _cancel_one(group_id: int) -> tuple[bool, list[int], list[int]]:
    """Cancel one group: (whether this call cancelled it, the members it cancelled that had
    durable steps, every member it cancelled or told). A group cancelled already but not finished is worked through again, so a
    cancel that failed part-way completes when called again.

    Three kinds of short transaction, so a cancel never holds the group row while it waits for
    members' rows (see queries.py for the lock order)."""
    marked = in_tx(lambda: _mark_steps(group_id), None)
    if marked is None:
        return False, [], []
    parked: list[int] = []
    ended: list[int] = []
    after = 0
    while True:
        rows = in_tx(lambda: _chunk_steps(group_id, after), None)
        parked += _parked(rows)
        ended += [r["id"] for r in rows]
        if len(rows) < CANCEL_CHUNK:
            break
        after = rows[-1]["id"]
    # Nothing pending now (every member was finished already, or none was running): the group
    # finishes here. Otherwise the last running member's outcome finishes it.
    in_tx(lambda: _finish_steps(group_id), None)
    return marked, parked, ended


async def _acancel_one(group_id: int, pool: AsyncConnectionPool | None) -> tuple[bool, list[int], list[int]]:
    """_cancel_one for async code, through `pool` when given (ain_tx)."""
    marked = await ain_tx(lambda: _mark_steps(group_id), None, pool)
    if marked is None:
        return False, [], []
    parked: list[int] = []
    ended: list[int] = []
    after = 0
    while True:
        rows = await ain_tx(lambda: _chunk_steps(group_id, after), None, pool)
        parked += _parked(rows)
        ended += [r["id"] for r in rows]
        if len(rows) < CANCEL_CHUNK:
            break
        after = rows[-1]["id"]
    await ain_tx(lambda: _finish_steps(group_id), None, pool)
    return marked, parked, ended


def cancel_group(group_id: int) -> bool:
    """Cancel a task group: members still queued (or waiting for a retry, or parked) are cancelled,
    running ones are told to stop (they end `cancelled` at their next await or `ctx.progress()`, or
    finish normally if they complete first). Once nothing is pending the group finishes as
    `cancelled`: on_finish and on_failure run. Parked members' own children are cancelled too.
    Returns False when the group was already finished or cancelled, or is unknown (as cancel()
    answers for an unknown job; add and seal raise GroupNotFound); called again on a cancelled
    group that has not finished, it still cancels what is queued (completing a cancel that failed
    part-way)."""
    warn_if_on_event_loop("jobs.cancel_group()", "jobs.acancel_group()")
    marked, parked, _ = _cancel_one(checked_id(group_id, "group_id"))
    cancel_children(parked)
    return marked


@awaited("jobs.acancel_group()")
async def acancel_group(group_id: int) -> bool:
    """cancel_group() for async code. A cancel of the task awaiting it does not cut it off part-way:
    it goes on to its end. A member that cancels its own group is the likely case: the cancel's
    first chunk of members tells that member to stop, at its next await, which is this one."""
    return await carried_through(acancel_group_through(None, checked_id(group_id, "group_id")),
                                 f"the cancel of task group {group_id} (a runtime completes it at its housekeeping, "
                                 "or call cancel_group again)")


async def acancel_group_through(pool: AsyncConnectionPool | None, group_id: int) -> bool:
    """acancel_group() through `pool` (None: the process's jobs pool). A runtime's housekeeping
    passes its own: the ids it read are its database's, which may not be the process's default
    (Runtime(url=)), where the same id names another group."""
    marked, parked, _ = await _acancel_one(checked_id(group_id, "group_id"), pool)
    await acancel_children(parked, pool)
    return marked


def cancel_children(job_ids: list[int]) -> list[int]:
    """Cancel the unfinished groups of children that these jobs (just cancelled) were parked on,
    and their parked members' children in turn. Returns every child it cancelled or told."""
    todo = list(job_ids)
    ended: list[int] = []
    while todo:
        groups = in_tx(lambda: _children_steps(todo), None)
        done = [_cancel_one(g) for g in groups]
        todo = [j for _, parked, _ in done for j in parked]
        ended += [j for _, _, members in done for j in members]
    return ended


async def acancel_children(job_ids: list[int], pool: AsyncConnectionPool | None = None) -> list[int]:
    todo = list(job_ids)
    ended: list[int] = []
    while todo:
        groups = await ain_tx(lambda: _children_steps(todo), None, pool)
        done = [await _acancel_one(g, pool) for g in groups]
        todo = [j for _, parked, _ in done for j in parked]
        ended += [j for _, _, members in done for j in members]
    return ended
