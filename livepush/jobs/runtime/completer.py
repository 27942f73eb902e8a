"""The completer: writes job outcomes and progress in batches, with their events.

The producer hands it the jobs it claimed (`started`), executors their outcomes (`submit`)
and progress (`progress`); one writer task turns whatever accumulated into one
transaction: the "started" events of new claims (so a claim stays a bare UPDATE on the
path to running the job), a fenced progress write, a fenced completion of every outcome
(queries.COMPLETE), the terminal hook for groups, and every event of the batch in one more
statement. With the Postgres fan-out and no progress to write first, a
batch is one statement (COMPLETE_PUBLISHING, autocommit; or, holding group members,
group_queries.COMPLETE_COUNTING in a transaction, followed by the group finish only when
a shard drained). Because one task writes, and each transaction publishes "started" first,
a job's events always go out in the order started, progress, final.

Flush policy: outcomes and starts go out after `flush_delay` (a few ms, to gather a batch)
or at once when `max_batch` are waiting; progress goes out when it is due (~10 a second
per job).
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import json
import logging
import time
from collections.abc import Sized
from typing import Any

import psycopg
from psycopg.rows import dict_row
from psycopg_pool import AsyncConnectionPool

from ..events import views as events
from ..groups import queries as gq, outcomes as terminal
from .. import queries
from .context import ClaimedJob, JobContext

log = logging.getLogger("livepush.jobs")

MAX_ERROR = 4000  # characters of an error kept with the job and sent in its events

# Connection trouble, or a conflict with another transaction: the same batch succeeds later.
_TRANSIENT = (psycopg.OperationalError, psycopg.errors.DeadlockDetected, psycopg.errors.SerializationFailure)
# Anything else Postgres (or the encoding of a parameter) refuses would be refused again on
# every retry. Catch _TRANSIENT first.
_REFUSED = (psycopg.Error, ValueError)
# The error a job gets when Postgres refused to store its real outcome (see _salvage).
UNSTORABLE_OUTCOME = "livepush could not store this job's outcome; the runtime's log says why"

# Batches larger than this are planned for their actual size. A prepared statement's
# generic plan sizes an array parameter at ten elements, and for a large batch it picked a
# nested loop that re-read the array for every row: 3,570 starts took 1.5 s, and a slow
# batch makes the next one larger. Planning costs ~0.5 ms, noise next to such a batch.
PREPARED_BATCH_MAX = 64


def _prepare(batch: Sized) -> bool | None:
    """psycopg's `prepare=` for a statement over `batch`: its default (prepared once it
    repeats) for small batches, never prepared for large ones."""
    return None if len(batch) <= PREPARED_BATCH_MAX else False


@dataclasses.dataclass
class Outcome:
    ctx: JobContext
    kind: str  # succeeded | retry | fail | cancelled | released
    error: str | None = None
    delay: float = 0.0


class Completer:
    def __init__(self, pool: AsyncConnectionPool, *, flush_delay: float = 0.002, max_batch: int = 500) -> None:
        self._pool = pool
        self.flush_delay = flush_delay
        self.max_batch = max_batch
        self._outcomes: list[Outcome] = []
        self._started: list[ClaimedJob] = []
        self._dirty: dict[int, JobContext] = {}
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._closing = False
        self._idle = asyncio.Event()
        self._idle.set()
        self.counts: collections.Counter[str] = collections.Counter()
        self.stale = 0  # outcomes fenced off

    # -- called by the producer and the executors (on the loop) ---------------------------
    def started(self, job: ClaimedJob) -> None:
        """Publish this claimed job's "started" event with the next batch (Postgres fan-out)."""
        self._started.append(job)
        self._idle.clear()
        self._wake.set()

    def submit(self, outcome: Outcome) -> None:
        ctx = outcome.ctx
        self._dirty.pop(ctx.job_id, None)
        if outcome.error is not None:
            outcome.error = outcome.error[:MAX_ERROR]
        self._outcomes.append(outcome)
        self._idle.clear()
        self._wake.set()

    def progress(self, ctx: JobContext) -> None:
        if ctx.job_id not in self._dirty:
            self._dirty[ctx.job_id] = ctx
            self._idle.clear()
            self._wake.set()

    # -- lifecycle -----------------------------------------------------------------------
    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="livepush-jobs-completer")

    async def wait_idle(self, timeout: float | None = None) -> None:
        """Until every submitted outcome is written."""
        await asyncio.wait_for(self._idle.wait(), timeout)

    async def close(self) -> None:
        """Write what is pending (progress due or not), then stop the writer task."""
        self._closing = True
        self._wake.set()
        if self._task is not None:
            try:
                await self._task
            finally:
                self._task = None

    async def _run(self) -> None:
        backoff = 0.05
        while True:
            if not self._outcomes and not self._dirty and not self._started:
                self._idle.set()
                if self._closing:
                    return
                self._wake.clear()
                await self._wake.wait()
                continue
            if self._outcomes or self._started:
                if len(self._outcomes) < self.max_batch and not self._closing:
                    await asyncio.sleep(self.flush_delay)  # gather a batch
            elif not self._closing:
                # Progress only: wait until the earliest job is due (or an outcome arrives).
                due = min(c.next_publish_at for c in self._dirty.values()) - time.monotonic()
                if due > 0:
                    self._wake.clear()
                    try:
                        await asyncio.wait_for(self._wake.wait(), due)
                    except TimeoutError:
                        pass
                    continue
            try:
                try:
                    await self.flush()
                except _TRANSIENT:
                    raise
                except _REFUSED as exc:
                    await self._salvage(exc)
                backoff = 0.05
            except _TRANSIENT as exc:
                task = asyncio.current_task()
                if task is not None and task.cancelling():
                    raise asyncio.CancelledError from exc
                # Outcomes stay queued and go out with the next try: the leases still fence them.
                log.warning("job completion failed, retrying in %.2f s: %s", backoff, exc)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 2.0)

    async def _salvage(self, exc: BaseException) -> None:
        """Postgres refused the batch for something in it (no check foresaw it: the values
        jobs report are checked and cleaned before they get here). The same batch would be
        refused on every retry, holding up every job of this runtime, so write it piece by
        piece: the starts alone, each outcome alone (refused again: without its progress;
        refused again: as a failure with a fixed error), then each pending progress alone
        (refused again: dropped). Raises if even a fixed failure is refused (the runtime
        then stops and gives its jobs back)."""
        log.error("Postgres refused a batch of job updates (%s); writing them one at a time", exc)
        suspects = self._outcomes[: self.max_batch]  # at the front, in order: executors only append
        dirty, self._dirty = self._dirty, {}  # kept out of the pieces until their own turn
        try:
            if self._started:
                await self.flush(limit=0)  # the starts: ids and leases only
            for o in suspects:
                for attempt in ("as is", "without its progress", "as a failure"):
                    if attempt == "without its progress":
                        o.ctx.latest = None
                    elif attempt == "as a failure":
                        o.kind, o.error, o.delay = "fail", UNSTORABLE_OUTCOME, None
                    try:
                        await self.flush(limit=1)  # o alone; on success it leaves the queue
                        break
                    except _TRANSIENT:
                        raise  # o and the rest are still queued, first
                    except _REFUSED as again:
                        if attempt == "as a failure":
                            raise
                        log.error("job %s (%s): Postgres refused its outcome %r (%s); trying it %s",
                                  o.ctx.job_id, o.ctx.name, o.kind, again,
                                  "without its progress" if attempt == "as is" else "as a failure")
        finally:
            self._dirty = {**dirty, **self._dirty}
        for job_id, ctx in list(dirty.items()):
            if self._dirty.get(job_id) is not ctx:
                continue  # finished or written meanwhile
            del self._dirty[job_id]
            others, self._dirty = self._dirty, {job_id: ctx}
            ctx.next_publish_at = 0.0  # due now, written alone
            try:
                await self.flush(limit=0)
            except _TRANSIENT:
                raise
            except _REFUSED as again:
                log.error("job %s (%s): Postgres refused its progress %r (%s); dropped", job_id, ctx.name,
                          ctx.latest, again)
                ctx.dirty, ctx.latest = False, None  # nor tried again with its outcome
                self._dirty = {}
            finally:
                self._dirty = {**others, **self._dirty}

    async def flush(self, limit: int | None = None) -> None:
        """One transaction for the pending batch (at most `limit` outcomes, default
        max_batch). Raises on database errors, keeping it queued."""
        outcomes = self._outcomes[: self.max_batch if limit is None else limit]
        # Every start taken here precedes every outcome taken here (both lists only grow,
        # and a job's outcome is submitted after its start), so no final event can overtake
        # its "started".
        starting = list(self._started)
        now = time.monotonic()
        ending = {o.ctx.job_id for o in outcomes}
        progress_ctxs = [
            c for c in self._dirty.values()
            if c.job_id not in ending and (self._closing or c.next_publish_at <= now)
        ]
        # A job that reported progress but published none yet gets one progress event just
        # before its final one (SPEC §6): same transaction, in order.
        first_progress = [o.ctx for o in outcomes if o.ctx.latest is not None and o.ctx.published == 0
                          and o.kind != "released"]
        writes = progress_ctxs + first_progress
        written = {c.job_id: c.latest for c in writes}
        live: set[int] = set()
        later: list[events.Event] = []
        if not writes and outcomes and events.in_transaction():
            if all(o.ctx.job.group_id is None for o in outcomes):
                # The common case: outcomes only, and no task group to count (terminal.on_terminal
                # needs nothing for jobs without a group). COMPLETE_PUBLISHING writes them and
                # publishes their events in one statement (after the starts, if any).
                rows = await self._complete_publishing(starting, outcomes)
            else:
                # Group members (or callbacks): COMPLETE_COUNTING also counts them on their
                # shards; only a drained shard needs more statements (the finish).
                rows, later = await self._complete_counting(starting, outcomes)
        else:
            rows, later = await self._flush_in_transaction(starting, outcomes, writes, written, live)
        # Committed.
        del self._started[: len(starting)]
        del self._outcomes[: len(outcomes)]
        for c in progress_ctxs:
            if c.job_id in live:
                c.mark_published()
                if c.latest is written[c.job_id]:
                    c.dirty = False  # nothing newer arrived while we wrote
            if not c.dirty or c.job_id not in live:  # written, or fenced: the job is no longer ours
                if self._dirty.get(c.job_id) is c:
                    del self._dirty[c.job_id]
        by_id = {r["id"]: r for r in rows}
        for o in outcomes:
            row = by_id.get(o.ctx.job_id)
            if row is None:
                self.stale += 1
                log.warning("job %s (%s, attempt %s): outcome %r ignored: its lease is gone "
                            "(rescued, cancelled or released meanwhile)", o.ctx.job_id, o.ctx.name,
                            o.ctx.attempt, o.kind)
            else:
                self.counts[_count_key(row)] += 1
        await events.apublish_after(later)

    def _outcome_params(self, outcomes: list[Outcome]) -> dict[str, Any]:
        return {
            "ids": [o.ctx.job_id for o in outcomes],
            "leases": [o.ctx.job.lease for o in outcomes],
            "kinds": [o.kind for o in outcomes],
            "errors": [o.error for o in outcomes],
            "delays": [o.delay for o in outcomes],
            "progress": [json.dumps(o.ctx.latest) if o.ctx.latest is not None else None for o in outcomes],
        }

    @staticmethod
    def _started_params(starting: list[ClaimedJob]) -> dict[str, Any]:
        return {"started_ids": [j.id for j in starting], "started_leases": [j.lease for j in starting]}

    async def _complete_publishing(self, starting: list[ClaimedJob], outcomes: list[Outcome]) -> list[dict[str, Any]]:
        if starting:
            # Starts and outcomes in one transaction, pipelined: still one round trip.
            async with self._pool.connection() as conn:
                async with conn.pipeline():
                    async with conn.cursor(row_factory=dict_row) as cur:
                        await cur.execute(queries.PUBLISH_STARTED, self._started_params(starting),
                                          prepare=_prepare(starting))
                        await cur.execute(queries.COMPLETE_PUBLISHING, self._outcome_params(outcomes),
                                          prepare=_prepare(outcomes))
                        return await cur.fetchall()
        async with self._pool.connection() as conn:
            await conn.set_autocommit(True)
            try:
                async with conn.cursor(row_factory=dict_row) as cur:
                    await cur.execute(queries.COMPLETE_PUBLISHING, self._outcome_params(outcomes),
                                      prepare=_prepare(outcomes))
                    return await cur.fetchall()
            finally:
                if not conn.closed:
                    await conn.set_autocommit(False)

    async def _complete_counting(
        self, starting: list[ClaimedJob], outcomes: list[Outcome],
    ) -> tuple[list[dict[str, Any]], list[events.Event]]:
        """COMPLETE_COUNTING in a transaction, then, only if it drained a shard, the group
        finish steps and their events (terminal.on_counted), in that same transaction.
        Returns the completed rows and the events to publish after commit (none here: the
        caller checked that the fan-out publishes in the transaction)."""
        async with self._pool.connection() as conn:
            # Pipelined, BEGIN and the statement go out together: one round trip.
            async with conn.pipeline():
                async with conn.cursor(row_factory=dict_row) as cur:
                    if starting:
                        await cur.execute(queries.PUBLISH_STARTED, self._started_params(starting),
                                          prepare=_prepare(starting))
                    await cur.execute(gq.COMPLETE_COUNTING, self._outcome_params(outcomes),
                                      prepare=_prepare(outcomes))
                    rows = await cur.fetchall()
            shards = rows[0]["_shards"] if rows else []
            for r in rows:
                r.pop("_shards", None)
            later = await events.apublish_in(conn, await terminal.on_counted(conn, shards))
        return rows, later  # committed by the pool as the block ends

    async def _flush_in_transaction(
        self, starting: list[ClaimedJob], outcomes: list[Outcome], writes: list[JobContext],
        written: dict[int, Any], live: set[int],
    ) -> tuple[list[dict[str, Any]], list[events.Event]]:
        """Starts, progress, outcomes, the terminal hook and every event in one transaction. Fills
        `live` (jobs whose progress was written); returns the completed rows and the events
        to publish after commit (non-Postgres fan-outs)."""
        published: list[events.Event] = []
        rows: list[dict[str, Any]] = []
        async with self._pool.connection() as conn:
            async with conn.cursor(row_factory=dict_row) as cur:
                if starting:  # only ever given with the Postgres fan-out (see Runtime._claim)
                    await cur.execute(queries.PUBLISH_STARTED, self._started_params(starting),
                                      prepare=_prepare(starting))
                if writes:
                    await cur.execute(queries.WRITE_PROGRESS, {
                        "ids": [c.job_id for c in writes],
                        "leases": [c.job.lease for c in writes],
                        "progress": [json.dumps(written[c.job_id]) for c in writes],
                    }, prepare=_prepare(writes))
                    live.update(r["id"] for r in await cur.fetchall())
                    for c in writes:
                        if c.job_id in live:
                            published.append(events.job_event("progress", c.job.row(), progress=written[c.job_id]))
                if outcomes:
                    await cur.execute(queries.COMPLETE, self._outcome_params(outcomes),
                                      prepare=_prepare(outcomes))
                    rows = await cur.fetchall()
                    published.extend(events.state_event(r) for r in rows
                                     if r["kind"] != "released" or r["state"] == "cancelled")
                    published.extend(await terminal.on_terminal(conn, terminal.terminal_rows(rows)))
                later = await events.apublish_in(conn, published)
        return rows, later


def _count_key(row: dict[str, Any]) -> str:
    if row["kind"] == "released" and row["state"] == "available":
        return "released"
    if row["state"] in ("scheduled", "available"):
        return "retrying"
    return str(row["state"])
