"""Snapshots of state topics (`job:<id>`, `group:<id>`) for new subscribers.

The snapshot and the topic's latest offset are read in one REPEATABLE READ transaction
when the fan-out is Postgres, so the snapshot is exactly the state at that offset: the
live stream resumes right after it with no event lost or repeated.
"""

from __future__ import annotations

import json
import logging

import psycopg

from ..config import Settings
from ..fanout import FanOut
from ..types import Offset
from .hub import SnapshotProvider

log = logging.getLogger("livepush.server")

# name: latest_offset_in_tx -- read in the same snapshot as the job/group state.
LATEST = "SELECT epoch, last_seq FROM livepush_topics WHERE topic = %s"


def postgres_snapshots(settings: Settings, fanout: FanOut) -> SnapshotProvider:
    url = settings.require_database()
    same_db = fanout.name == "postgres"

    async def snapshot(topic: str) -> tuple[Offset, str] | None:
        kind, _, ident = topic.partition(":")
        try:
            from ..jobs import events
        except ImportError:
            return None
        reader = {"job": getattr(events, "job_snapshot", None), "group": getattr(events, "group_snapshot", None)}.get(kind)
        if reader is None:
            return None
        try:
            key = int(ident)
        except ValueError:
            return None
        async with await psycopg.AsyncConnection.connect(url, autocommit=False) as conn:
            await conn.set_isolation_level(psycopg.IsolationLevel.REPEATABLE_READ)
            if same_db:
                cur = await conn.execute(LATEST, (topic,))
                row = await cur.fetchone()
                offset = f"{row[0]}-{row[1]}" if row else "0"
                data = await reader(conn, key)
            else:
                offset = await fanout.alatest_offset(topic)
                data = await reader(conn, key)
            await conn.rollback()
        if data is None:
            return None
        return offset, json.dumps(data, separators=(",", ":"))

    return snapshot
