"""Where a job's terminal transition (succeeded, failed for good, cancelled) meets its group and
its workflow run, inside the transaction that made it.

Every path that can end a job (a completer batch, the cancel of a queued job, the rescue of a
job whose last attempt died with its runtime, the release of a job whose cancel was requested)
calls `count` with the rows that just became terminal, before commit. The group's members are
counted on its shards in the same transaction, so its callbacks are enqueued exactly once (see
queries.py for why); a workflow step's end is recorded on its run and what follows is started,
in the same transaction too (workflows/engine.py). Progress is not rung here: the caller tells its progress publisher which
groups moved once the transaction committed, or, without one (an operator call), rings it in
the same transaction with `progress_now` (`progress_coalesced` for jobs.cancel, which may be
called for a group's members one after another).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import psycopg

from ..workflows.engine import steps_ended
from . import steps

Row = dict[str, Any]


def terminal(rows: Sequence[Row]) -> list[Row]:
    return [r for r in rows if r["state"] in steps.TERMINAL_STATES]


def ended(rows: Sequence[Row]) -> steps.Steps[set[int]]:
    """Count the group members among `rows` (just made terminal), finish any group this completes,
    and record the ends of workflow steps among them. Returns the groups whose counts changed."""
    rows = terminal(rows)
    touched = yield from steps.count_outcomes(steps.members_of(rows))
    yield from steps_ended(rows)
    return touched


async def count(aconn: psycopg.AsyncConnection, rows: Sequence[Row]) -> set[int]:
    """`ended` in an async transaction."""
    if not any(r.get("group_id") is not None or r.get("workflow_id") is not None for r in rows):
        return set()
    return await steps.arun(aconn, ended(rows))


async def counted(aconn: psycopg.AsyncConnection, shards: Sequence[Row], rows: Sequence[Row]) -> set[int]:
    """`count` for a transaction whose completion statement already counted its members
    (queries.COMPLETE_COUNTING), given the shard rows and the job rows it returned."""

    def after() -> steps.Steps[set[int]]:
        touched = yield from steps.counted_shards(shards)
        yield from steps_ended(terminal(rows))
        return touched

    return await steps.arun(aconn, after())



