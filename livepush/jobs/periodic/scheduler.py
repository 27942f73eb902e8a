"""The runtime's side of periodic jobs: each round enqueues every due tick not enqueued yet (the
newest only, however many were missed) and says how long to sleep until the next tick."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any, NamedTuple

from psycopg_pool import AsyncConnectionPool

from ...errors import ArgumentTypeError, ArgumentValueError
from ..api.enqueue import Batch
from . import queries
from .decorator import Schedule

log = logging.getLogger("livepush.jobs")


class Enqueued(NamedTuple):
    name: str
    tick: str  # ISO 8601, in the schedule's zone
    job_id: int


class Round(NamedTuple):
    enqueued: list[Enqueued]
    wait: float  # seconds from the database's clock to the next tick of any schedule


class Scheduler:
    """Enqueues the ticks of these schedules (see queries.ADVANCE for why many runtimes may)."""

    def __init__(self, schedules: Sequence[Schedule]) -> None:
        if not schedules:
            raise ValueError("a periodic scheduler needs at least one schedule")
        self.schedules = list(schedules)
        self._refused: dict[str, datetime] = {}  # name -> the newest tick its checks refused, logged

    async def round(self, pool: AsyncConnectionPool[Any]) -> Round:
        """One pass over every schedule, on the database's clock."""
        async with pool.connection() as conn:
            rows = await (await conn.execute(queries.STATE, {"names": [s.name for s in self.schedules]})).fetchall()
        # In UTC: psycopg hands instants back in the session's TimeZone, the schedule's own zone
        # on a database set to it, and Python compares and subtracts two datetimes of one zone on
        # the wall clock, ignoring which pass of a repeated hour each is.
        now: datetime = rows[0][2].astimezone(UTC)
        last: dict[str, datetime | None] = {name: None if tick is None else tick.astimezone(UTC)
                                            for name, tick, _ in rows}
        enqueued: list[Enqueued] = []
        for schedule in self.schedules:
            due = schedule.cron.latest_due(now)
            previous = last.get(schedule.name)
            if previous is None:
                await self._start(pool, schedule, due)
            elif due > previous:
                try:
                    job_id = await self._advance(pool, schedule, due)
                except (ArgumentTypeError, ArgumentValueError) as exc:
                    # Its schema (or a concurrency key) refuses this tick though it took the one
                    # checked at import: the user's to fix, and no reason to stop the runtime or
                    # the other schedules. Its tick stays where it was; a later one may pass.
                    if self._refused.get(schedule.name) != due:
                        self._refused[schedule.name] = due
                        log.error("periodic job %s was not enqueued for tick %s: %s", schedule.name,
                                  due.isoformat(), exc)
                    continue
                if job_id is not None:
                    enqueued.append(Enqueued(schedule.name, due.isoformat(), job_id))
        wait = min((s.cron.next_after(now) - now).total_seconds() for s in self.schedules)
        return Round(enqueued, max(wait, 0.0))

    async def _start(self, pool: AsyncConnectionPool[Any], schedule: Schedule, due: datetime) -> None:
        async with pool.connection() as conn:
            await conn.execute(queries.START, {"name": schedule.name, "tick": due})
        log.info("periodic job %s (%s, %s) starts from its next tick", schedule.name, schedule.cron.expression,
                 schedule.cron.timezone)

    async def _advance(self, pool: AsyncConnectionPool[Any], schedule: Schedule, due: datetime) -> int | None:
        """Enqueue the job for `due` if this call moved last_tick to it; its id, or None."""
        tick = due.isoformat()
        batch = Batch()
        batch.add(schedule.function, [tick])
        sql, params = batch.statement()
        async with pool.connection() as conn, conn.transaction():
            advanced = await conn.execute(queries.ADVANCE, {"name": schedule.name, "tick": due})
            if not advanced.rowcount:
                return None  # another runtime enqueued this tick (or a newer one)
            row = await (await conn.execute(sql, params)).fetchone()
        assert row is not None
        # Debug, as each job's run is: an every-second job would write 86,400 INFO lines a day.
        log.debug("periodic job %s enqueued for tick %s (job %s)", schedule.name, tick, row[0])
        return int(row[0])
