"""Where a job's terminal transition (succeeded, failed for good, cancelled) meets its group,
inside the transaction that made it.

Every path that can end a job (a completer batch, the cancel of a queued job, the rescue of a
job whose last attempt died with its runtime, the release of a job whose cancel was requested)
calls `count` with the rows that just became terminal, before commit. The group's members are
counted on its shards in the same transaction, so its callbacks are enqueued exactly once (see
queries.py for why). Progress is not rung here: the caller tells its progress publisher which
groups moved once the transaction committed, or, without one (an operator call), rings it in
the same transaction with `progress_now`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import psycopg

from . import steps

Row = dict[str, Any]


def terminal(rows: Sequence[Row]) -> list[Row]:
    return [r for r in rows if r["state"] in steps.TERMINAL_STATES]


async def count(aconn: psycopg.AsyncConnection, rows: Sequence[Row]) -> set[int]:
    """Count the group members among `rows` (just made terminal) and finish any group this
    completes. Returns the groups whose counts changed."""
    members = steps.members_of(rows)
    if not members:
        return set()
    return await steps.arun(aconn, steps.count_outcomes(members))


async def counted(aconn: psycopg.AsyncConnection, shards: Sequence[Row]) -> set[int]:
    """`count` for a transaction whose completion statement already counted its members
    (queries.COMPLETE_COUNTING), given the shard rows it returned."""
    if not shards:
        return set()
    return await steps.arun(aconn, steps.counted_shards(shards))


def count_sync(conn: psycopg.Connection, rows: Sequence[Row]) -> set[int]:
    """`count` for the sync operator calls (jobs.cancel on a queued job)."""
    members = steps.members_of(rows)
    if not members:
        return set()
    return steps.run(conn, steps.count_outcomes(members))
