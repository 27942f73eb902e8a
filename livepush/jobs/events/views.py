"""Job events on `job:<id>` (SPEC §6) and the snapshot a new subscriber gets first.

    {"event": "enqueued"|"started"|"progress"|"retrying"|"succeeded"|"failed"|"cancelled"|"snapshot",
     "job": {"id", "name", "queue", "state", "attempt", "max_attempts",
             "progress": {"done", "total", "message"}, "error", "run_at"}}

Events are published in the same transaction as the state change they describe when the
fan-out is Postgres (on the jobs' database): a batch of any size is one statement calling
the fan-out's `livepush_publish()` per event, so an event goes out if and only if its change
commits, and in commit order per job. Except `started`: the completer publishes it with its
next batch after the claim (queries.PUBLISH_STARTED), ahead of the job's other events, so
the claim stays a bare UPDATE. With another fan-out (Redis, local) they are
published right after the commit instead.

Runtimes publish their own state on `runtime:<id>` and on `runtimes` (all of them):
    {"event": "running"|"draining"|"stopped",
     "runtime": {"id", "host", "pid", "queues", "concurrency", "in_hand", "state"}}
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any

import psycopg
from psycopg.rows import dict_row

from ...config import get_settings
from ...fanout.base import encode_payload
from .. import database, queries

log = logging.getLogger("livepush.jobs")

Event = tuple[str, Any]  # (topic, data)

# Completer outcome kinds and the event each resulting state publishes.
_STATE_EVENT = {
    "succeeded": "succeeded",
    "failed": "failed",
    "cancelled": "cancelled",
    "scheduled": "retrying",
    "available": "retrying",
    "running": "started",
}

EMPTY_PROGRESS = {"done": 0, "total": None, "message": None}


def job_topic(job_id: int) -> str:
    return f"job:{job_id}"


def _iso(value: Any) -> str | None:
    if isinstance(value, datetime):
        text = value.isoformat()
        if value.microsecond:
            # Postgres's JSON drops the fraction's trailing zeros (…:00.12345+00:00), and most
            # job events are built in SQL (livepush_job_event): write the same text here.
            head, _, rest = text.partition(".")
            text = f"{head}.{rest[:6].rstrip('0')}{rest[6:]}"
        return text
    return value


def job_view(row: Mapping[str, Any], **override: Any) -> dict[str, Any]:
    """The `job` object of an event from a row of queries._EVENT_COLUMNS."""
    progress = override.get("progress", row.get("progress")) or EMPTY_PROGRESS
    return {
        "id": row["id"],
        "name": row["name"],
        "queue": row["queue"],
        "state": override.get("state", row["state"]),
        "attempt": row["attempt"],
        "max_attempts": row["max_attempts"],
        "progress": {"done": progress.get("done"), "total": progress.get("total"), "message": progress.get("message")},
        "error": override.get("error", row.get("error")),
        "run_at": _iso(row["run_at"]),
    }


def job_event(event: str, row: Mapping[str, Any], **override: Any) -> Event:
    return job_topic(row["id"]), {"event": event, "job": job_view(row, **override)}


def state_event(row: Mapping[str, Any]) -> Event:
    """The event for a row that just reached its state."""
    return job_event(_STATE_EVENT[row["state"]], row)


def in_transaction() -> bool:
    """True when events can go out inside the jobs' transactions: the fan-out is Postgres
    and lives in the jobs' database."""
    settings = get_settings()
    if settings.fanout != "postgres":
        return False
    return settings.database_url is None or settings.database_url == database.database_url()


def _encode(events: Sequence[Event]) -> tuple[list[str], list[str]]:
    return [t for t, _ in events], [encode_payload(d) for _, d in events]


async def apublish_in(aconn: psycopg.AsyncConnection, events: Sequence[Event]) -> list[Event]:
    """Publish `events` inside aconn's open transaction when the fan-out allows it;
    otherwise return them, for `apublish_after` once the transaction committed."""
    if not events:
        return []
    if not in_transaction():
        return list(events)
    topics, datas = _encode(events)
    await aconn.execute(queries.PUBLISH_MANY, {"topics": topics, "datas": datas})
    return []


def publish_in(conn: psycopg.Connection, events: Sequence[Event]) -> list[Event]:
    """Sync publish_in."""
    if not events:
        return []
    if not in_transaction():
        return list(events)
    topics, datas = _encode(events)
    conn.execute(queries.PUBLISH_MANY, {"topics": topics, "datas": datas})
    return []


async def apublish_after(events: Iterable[Event]) -> None:
    """Publish events whose transaction committed (non-Postgres fan-outs). A failure is
    logged, not raised: the state change already happened and the snapshot shows it."""
    from ...api import apublish

    for topic, data in events:
        try:
            await apublish(topic, data)
        except Exception:
            log.exception("could not publish %s after commit", topic)


def publish_after(events: Iterable[Event]) -> None:
    from ...api import publish

    for topic, data in events:
        try:
            publish(topic, data)
        except Exception:
            log.exception("could not publish %s after commit", topic)


async def job_snapshot(aconn: psycopg.AsyncConnection, job_id: int) -> dict[str, Any] | None:
    """`{"event": "snapshot", "job": {...}}` for a job, or None if there is no such job."""
    async with aconn.cursor(row_factory=dict_row) as cur:
        await cur.execute(queries.JOB_STATE, {"id": job_id})
        row = await cur.fetchone()
    if row is None:
        return None
    return {"event": "snapshot", "job": job_view(row)}


async def group_snapshot(aconn: psycopg.AsyncConnection, group_id: int) -> dict[str, Any] | None:
    """`{"event": "snapshot", "group": {...}}` for a task group, or None if there is no such group."""
    from ..groups.progress import group_snapshot as read

    return await read(aconn, group_id)


async def snapshot(conn_or_url: psycopg.AsyncConnection | str, topic: str) -> dict[str, Any] | None:
    """The snapshot for a state topic `job:<id>` or `group:<id>`, or None (not a state
    topic, or no such job or group). Takes an AsyncConnection or a database URL."""
    kind, _, ident = topic.partition(":")
    reader = {"job": job_snapshot, "group": group_snapshot}.get(kind)
    if reader is None or not ident.isdigit():
        return None
    if isinstance(conn_or_url, str):
        async with await psycopg.AsyncConnection.connect(conn_or_url, autocommit=True) as aconn:
            return await reader(aconn, int(ident))
    return await reader(conn_or_url, int(ident))


def runtime_event(event: str, view: Mapping[str, Any]) -> list[Event]:
    data = {"event": event, "runtime": dict(view)}
    return [(f"runtime:{view['id']}", data), ("runtimes", data)]
