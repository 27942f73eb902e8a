"""The one place a job's terminal transition (succeeded, failed for good, cancelled) is
seen inside the transaction that made it.

Every path that can end a job (completer batch, cancel of a queued job, rescue of a job
whose last attempt died with its runtime, release of a job whose cancel was requested)
calls `on_terminal` with the rows that just became terminal, before commit. Task groups
count their members here, in the same transaction, so a group's callback is enqueued
exactly once (see group_queries.py for why).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import psycopg

TERMINAL_STATES = frozenset({"succeeded", "failed", "cancelled"})

Row = dict[str, Any]


def terminal_rows(rows: Sequence[Row]) -> list[Row]:
    return [r for r in rows if r["state"] in TERMINAL_STATES]


async def on_terminal(aconn: psycopg.AsyncConnection, rows: Sequence[Row]) -> list[tuple[str, Any]]:
    """Called in the transaction that moved `rows` (dicts with id, state, group_id, ...) to
    a terminal state. Returns extra events to publish with the batch (group events).

    Counts group members on their groups' shards and finishes any group this completes
    (callbacks enqueued in this transaction, exactly once). Group progress is not published
    here: the runtime's ProgressPublisher is told which shards moved and publishes at most
    ~10 times a second per group; without one (an admin call), progress goes out now."""
    from . import steps as group_steps

    members = group_steps.members_of(rows)
    if not members:
        return []
    counted = await group_steps.arun(aconn, group_steps.count_outcomes(members))
    return await _after_count(aconn, counted)


async def on_counted(aconn: psycopg.AsyncConnection, shards: Sequence[Row]) -> list[tuple[str, Any]]:
    """on_terminal for a transaction whose completion statement already counted its members
    (group_queries.COMPLETE_COUNTING), given the shard rows it returned: finishes any group
    they drained, in this transaction, and marks (or publishes) progress the same way."""
    from . import steps as group_steps

    if not shards:
        return []
    counted = await group_steps.arun(aconn, group_steps.counted_shards(shards))
    return await _after_count(aconn, counted)


async def _after_count(aconn: psycopg.AsyncConnection, counted: Any) -> list[tuple[str, Any]]:
    from . import progress as group_events, steps as group_steps

    publisher = group_events.current_publisher()
    if publisher is not None:
        for group_id, shards in counted.expect.items():
            publisher.mark(group_id, shards)
        return counted.events
    progress = await group_steps.arun(aconn, group_steps.progress_now(list(counted.expect)))
    return counted.events + progress


def on_terminal_sync(conn: psycopg.Connection, rows: Sequence[Row]) -> list[tuple[str, Any]]:
    """on_terminal for the sync admin calls (jobs.cancel on a queued job)."""
    from . import steps as group_steps

    members = group_steps.members_of(rows)
    if not members:
        return []
    counted = group_steps.run(conn, group_steps.count_outcomes(members))
    progress = group_steps.run(conn, group_steps.progress_now(list(counted.expect)))
    return counted.events + progress
