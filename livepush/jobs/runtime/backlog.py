"""Marking the jobs enqueued before their function gained limits (docs/jobs.md, "Limits and
paused queues"): the first runtime that starts with the new definition gives each unfinished one
the mark and its concurrency key, so that the limited claim holds them to the limits too."""

from __future__ import annotations

import asyncio
import logging

import psycopg
from psycopg_pool import AsyncConnectionPool

from .. import queries
from ..api.limits import Limits
from ..errors import InvalidArgumentsError

log = logging.getLogger("livepush.jobs")

# Jobs read per page.
MARK_PAGE = 5000
# How long a start goes on looking again at the jobs whose rows other transactions held when it
# marked the others (an outcome being written, a debounce's transaction left open), and how often.
MARK_RETRY_SECONDS = 5.0
MARK_RETRY_EVERY = 0.05


class Backlog:
    """The jobs to mark for the names that gain limits with this start (`gained`); of those in
    `keyed` (keyed anew: by another parameter, or where a rate alone gave them no key), the jobs
    marked already too."""

    def __init__(self, gained: dict[str, Limits], keyed: set[str]) -> None:
        self.gained = gained
        self.keyed = sorted(keyed)
        self.marked = 0
        self.unkeyed = 0

    async def mark(self, conn: psycopg.AsyncConnection, ids: list[int] | None = None) -> list[int]:
        """Mark what can be marked now, in `conn`'s transaction (of `ids` only, when given);
        returns the jobs left, whose rows another transaction held or which changed after they
        were read: finish() reads them again."""
        after, left = 0, []
        while self.gained:
            rows = await (await conn.execute(queries.UNMARKED_JOBS, {
                "names": list(self.gained), "keyed": self.keyed, "after": after, "page": MARK_PAGE,
                "ids": ids})).fetchall()
            if not rows:
                break
            read, versions, keys = [], [], []
            for job_id, name, version, args, limited in rows:
                try:
                    key = self.gained[name].key_of(args if isinstance(args, list) else [], name)
                except InvalidArgumentsError:
                    self.unkeyed += 1
                    if not limited:
                        continue  # left unmarked: the plain claim runs it without the limit
                    # Keyed anew, it was marked already, with a key of the old parameter, which
                    # would count it in that value's slots: marked without a key, it runs
                    # without the concurrency limit, as the log says.
                    key = None
                read.append(job_id)
                versions.append(version)
                keys.append(key)
            cur = await conn.execute(queries.MARK_LIMITED, {"ids": read, "versions": versions, "keys": keys})
            done = {r[0] for r in await cur.fetchall()}
            self.marked += len(done)
            left += [i for i in read if i not in done]
            after = rows[-1][0]
        return left

    async def finish(self, pool: AsyncConnectionPool, left: list[int]) -> None:
        """Mark the jobs mark() left, once their rows are free, each try a short transaction of
        its own: held by the start's transaction, the rows it marked kept waiting the very
        transactions it waited for. Then say what was done."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + MARK_RETRY_SECONDS
        while left:
            async with pool.connection() as conn:
                left = await self.mark(conn, left)
            if not left or loop.time() >= deadline:
                break
            await asyncio.sleep(MARK_RETRY_EVERY)
        names = ", ".join(sorted(self.gained))
        if self.marked:
            log.info("limits added to %s: %d unfinished jobs enqueued before take them", names, self.marked)
        if self.unkeyed:
            log.warning("limits added to %s: %d unfinished jobs have no value for the concurrency key in their "
                        "arguments and run without the limit", names, self.unkeyed)
        if left:
            log.warning("limits added to %s: %d unfinished jobs were held by other transactions for %g s and run "
                        "without the limit: %s", names, len(left), MARK_RETRY_SECONDS, left[:20])
