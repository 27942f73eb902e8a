"""The one place a job's terminal transition (succeeded, failed for good, cancelled) is
seen inside the transaction that made it.

Every path that can end a job (completer batch, cancel of a queued job, rescue of a job
whose last attempt died with its runtime, release of a job whose cancel was requested)
calls `on_terminal` with the rows that just became terminal, before commit. Task groups
(issue 6) count their members here, in the same transaction, so a group's callback is
enqueued exactly once.
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

    Nothing to do until task groups exist: jobs without a group_id never need anything."""
    grouped = [r for r in rows if r.get("group_id") is not None and r["state"] in TERMINAL_STATES]
    if not grouped:
        return []
    return []  # issue 6: count members per group, seal/finish, enqueue callbacks


def on_terminal_sync(conn: psycopg.Connection, rows: Sequence[Row]) -> list[tuple[str, Any]]:
    """on_terminal for the sync admin calls (jobs.cancel on a queued job)."""
    grouped = [r for r in rows if r.get("group_id") is not None and r["state"] in TERMINAL_STATES]
    if not grouped:
        return []
    return []  # issue 6
