"""Snapshots of state topics (`job:<id>`, `group:<id>`) for new subscribers.

The snapshot and the topic's latest offset are read in one REPEATABLE READ transaction
when the fan-out is Postgres, so the snapshot is exactly the state at that offset: the
live stream resumes right after it with no event lost or repeated.
"""

from __future__ import annotations

import asyncio
import json
import logging

import psycopg
from psycopg_pool import AsyncConnectionPool

from ..postgres import connect as db
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
    pools: list[AsyncConnectionPool] = []
    opening = asyncio.Lock()

    async def pool() -> AsyncConnectionPool:
        # Opened on first use, on the server's loop: a connection per subscribe would cost
        # a Postgres backend start each time.
        async with opening:
            if not pools:
                p = db.AsyncPool(url, min_size=1, max_size=4, open=False)
                await p.open(wait=True, timeout=5)
                pools.append(p)
        return pools[0]

    async def snapshot(topic: str) -> tuple[Offset, str] | None:
        kind, _, ident = topic.partition(":")
        try:
            from ..jobs.events import views as events
        except ImportError:
            return None
        reader = {"job": getattr(events, "job_snapshot", None), "group": getattr(events, "group_snapshot", None)}.get(kind)
        if reader is None:
            return None
        try:
            key = int(ident)
        except ValueError:
            return None
        async with (await pool()).connection() as conn:
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
            await conn.set_isolation_level(None)
        if data is None:
            return None
        return offset, json.dumps(data, separators=(",", ":"))

    async def aclose() -> None:
        for p in pools:
            await p.close()

    snapshot.aclose = aclose  # type: ignore[attr-defined]
    return snapshot
