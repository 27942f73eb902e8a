"""The completer: writes job outcomes and progress in batches.

The producer hands it the jobs it claimed (`started`), executors their outcomes (`submit`) and
progress (`progress`); one writer task turns whatever accumulated into as few statements as it
can: the progress that is due (queries.WRITE_PROGRESS, one statement in autocommit), then every
outcome (queries.COMPLETE, one statement in autocommit; or, holding group members or workflow
steps, groups.queries.COMPLETE_COUNTING in a transaction, followed by the group finish only when a
shard drained, and the steps' ends on their workflow runs). Each statement rings the state topics it changed; the outcome statement also rings the
`started` versions the claims left (the claim itself rings nothing, to stay the shortest
statement on the path to running a job), or RING_STARTED does when no outcome is due. Because
one task writes, a job's versions always go started (the claim), progress, final.

A job that reported progress but had none written yet gets one progress write, committed before
its final one, so a page that watches sees at least one progress before the outcome.

Flush policy: outcomes go out after `flush_delay` (a few ms, to gather a batch) or at once when
`max_batch` are waiting; progress goes out when it is due (~10 a second per job).
"""

from __future__ import annotations

import asyncio
import collections
import json
import logging
import time
from collections.abc import Callable, Iterable, Iterator, Sequence, Sized
from typing import Any

import psycopg
from psycopg.rows import dict_row
from psycopg_pool import AsyncConnectionPool

from ... import metrics
from ...postgres.pools import aautocommitted
from ...tasks import Backoff, reraise_if_cancelled
from .. import queries
from ..api.args import PAST_ONE_MESSAGE, check_sendable, dumps
from ..errors import MessageTooLarge, OutputsTooLarge
from ..groups import outcomes as group_outcomes
from ..groups import queries as gq
from ..groups.progress import ProgressPublisher
from .context import ClaimedJob, JobContext
from .executor import Outcome, result_too_large

log = logging.getLogger("livepush.jobs")

MAX_ERROR = 4000  # characters of an error kept with the job and shown on its topic

# Connection trouble, a conflict with another transaction, or a database that takes no writes for
# now (a failover's standby not yet promoted, a primary being demoted): the same batch succeeds
# later. Refused as if for good, a read-only moment stopped the runtime and dropped the outcomes
# of jobs that had run, which then ran again.
_TRANSIENT = (psycopg.OperationalError, psycopg.errors.DeadlockDetected, psycopg.errors.SerializationFailure,
              psycopg.errors.ReadOnlySqlTransaction)
# Anything else Postgres (or the encoding of a parameter, or check_sendable() before it is sent)
# refuses would be refused again on every retry. Ask _transient() first.
_REFUSED = (psycopg.Error, ValueError, MessageTooLarge)


def _transient(exc: BaseException) -> bool:
    """Whether the same batch may succeed later. A limit of Postgres' (class 54: a result too large
    for jsonb) is an OperationalError to psycopg, but would be refused again on every retry, holding
    up every job of this runtime: it is salvaged as a refusal."""
    return isinstance(exc, _TRANSIENT) and not isinstance(exc, psycopg.errors.ProgramLimitExceeded)
# The error a job gets when Postgres refused to store its real outcome (see _salvage).
UNSTORABLE_OUTCOME = "livepush could not store this job's outcome; the runtime's log says why"


def _unstorable(outcome: Outcome, refused: BaseException) -> str:
    """The error of a job whose outcome Postgres refused. A result past what a jsonb value holds
    (256 MiB), or one message to Postgres (1 GiB), is said as such: the job's code, not the
    runtime, is what to change. A workflow step's output that its run's decision would write past
    one message (with others) is said as the decision said it: naming the run and the steps."""
    if isinstance(refused, OutputsTooLarge):
        return f"InvalidResultError: {refused}"
    if outcome.result is not None and isinstance(refused, (psycopg.errors.ProgramLimitExceeded, MessageTooLarge)):
        said = (PAST_ONE_MESSAGE if isinstance(refused, MessageTooLarge)
                else refused.diag.message_primary or str(refused).splitlines()[0])
        return f"InvalidResultError: {result_too_large(said)}"
    return UNSTORABLE_OUTCOME

# Batches larger than this are planned for their actual size. A prepared statement's generic plan
# sizes an array parameter at ten elements, and for a large batch it picked a nested loop that
# re-read the array for every row: a slow batch makes the next one larger. Planning costs well
# under a millisecond, noise next to such a batch.
PREPARED_BATCH_MAX = 64


def started_param(pairs: Iterable[tuple[int, int]]) -> dict[str, str]:
    """RING_STARTED's parameter, also COMPLETE's `started`: the (job id, version) pairs to ring."""
    return {"started": dumps(list(pairs))}


def complete_params(outcomes: Iterable[Sequence[Any]], started: Iterable[tuple[int, int]] = ()) -> dict[str, str]:
    """COMPLETE's (and COMPLETE_COUNTING's) parameters: per outcome (id, lease, kind, error,
    delay, progress, result), progress a dict or None, result JSON text or None; and the
    `started` pairs to ring with them."""
    return {"outcomes": dumps(list(outcomes)), **started_param(started)}


def _prepare(batch: Sized) -> bool | None:
    """psycopg's `prepare=` for a statement over `batch`: its default (prepared once it repeats)
    for small batches, never prepared for large ones."""
    return None if len(batch) <= PREPARED_BATCH_MAX else False


class Completer:
    def __init__(self, pool: AsyncConnectionPool, *, flush_delay: float = 0.002, max_batch: int = 500,
                 groups: ProgressPublisher | None = None,
                 on_ended: Callable[[Iterator[str]], None] | None = None) -> None:
        self._pool = pool
        # Told the names of the jobs whose outcomes a flush committed: their claim-limit slots are
        # free in the database only from then on (the runtime claims again for them).
        self.on_ended = on_ended
        self.flush_delay = flush_delay
        self.max_batch = max_batch
        self.groups = groups
        self._outcomes: list[Outcome] = []
        self._started: list[ClaimedJob] = []  # claimed, their `started` version not rung yet
        self._dirty: dict[int, JobContext] = {}
        self._wake = asyncio.Event()
        self._closing = False
        self._idle = asyncio.Event()
        self._idle.set()
        self.counts: collections.Counter[str] = collections.Counter()
        self.stale = 0  # outcomes fenced off

    # -- called by the producer and the executors (on the loop) -----------------------------
    def started(self, job: ClaimedJob) -> None:
        """Ring this claimed job's `started` version with the next statement."""
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

    def pending(self) -> list[int]:
        """The ids of the jobs whose outcomes are not written yet."""
        return [o.ctx.job_id for o in self._outcomes]

    def progress(self, ctx: JobContext) -> None:
        if ctx.job_id not in self._dirty:
            self._dirty[ctx.job_id] = ctx
            self._idle.clear()
            self._wake.set()

    # -- lifecycle -----------------------------------------------------------------------
    async def wait_idle(self, timeout: float | None = None) -> None:
        """Until every submitted outcome is written."""
        await asyncio.wait_for(self._idle.wait(), timeout)

    def closing(self) -> None:
        """From now on write what is pending (progress due or not), and let run() return once
        nothing is."""
        self._closing = True
        self._wake.set()

    async def run(self) -> None:
        """The writer task's body (the runtime runs it under supervision)."""
        retry = Backoff(0.05, 2.0)
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
                due = min(c._next_publish_at for c in self._dirty.values()) - time.monotonic()
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
                except _REFUSED as exc:
                    if _transient(exc):
                        raise
                    await self._salvage(exc)
                retry.reset()
            except _REFUSED as exc:
                if not _transient(exc):
                    raise
                reraise_if_cancelled()
                # Outcomes stay queued and go out with the next try: the leases still fence them.
                log.warning("job completion failed, retrying in about %.2f s: %s", retry.delay, exc)
                await retry.wait()

    async def _salvage(self, exc: BaseException) -> None:
        """Postgres refused the batch for something in it (no check foresaw it: the values jobs
        report are checked and cleaned before they get here). The same batch would be refused on
        every retry, holding up every job of this runtime, so write it piece by piece: each
        outcome alone (refused again: without its progress; refused again: as a failure with a
        fixed error), then each pending progress alone (refused again: dropped). Raises if even a
        fixed failure is refused (the runtime then stops and gives its jobs back)."""
        if isinstance(exc, MessageTooLarge):
            # Outcomes each within the limit that pass it together (several large results): no
            # refusal of Postgres', and nothing wrong with any one of them.
            log.warning("a batch of job updates is %s; writing them one at a time", PAST_ONE_MESSAGE)
        else:
            log.error("Postgres refused a batch of job updates (%s); writing them one at a time", exc)
        suspects = self._outcomes[: self.max_batch]  # at the front, in order: executors only append
        dirty, self._dirty = self._dirty, {}  # kept out of the pieces until their own turn
        try:
            for o in suspects:
                refused: BaseException = exc
                for attempt in ("as is", "without its progress", "as a failure"):
                    if attempt == "without its progress":
                        o.ctx._latest = None
                    elif attempt == "as a failure":
                        # Without its result too: a result past what jsonb holds was refused again
                        # in the failure, which stopped the runtime, and the next one to run it.
                        o.kind, o.error, o.delay = "fail", _unstorable(o, refused), 0.0
                        o.result = None
                    try:
                        await self.flush(limit=1)  # o alone; on success it leaves the queue
                        break
                    except _REFUSED as again:
                        refused = again
                        if _transient(again) or attempt == "as a failure":
                            raise  # transient: o and the rest are still queued, first
                        # Past one message (check_sendable) it was never sent: said as livepush's
                        # own refusal, lest the operator look for one in the database.
                        who = "livepush held back" if isinstance(again, MessageTooLarge) else "Postgres refused"
                        log.error("job %s (%s): %s its outcome %r (%s); trying it %s",
                                  o.ctx.job_id, o.ctx.name, who, o.kind, again,
                                  "without its progress" if attempt == "as is" else "as a failure")
        finally:
            self._dirty = {**dirty, **self._dirty}
        for job_id, ctx in list(dirty.items()):
            if self._dirty.get(job_id) is not ctx:
                continue  # finished or written meanwhile
            del self._dirty[job_id]
            others, self._dirty = self._dirty, {job_id: ctx}
            ctx._next_publish_at = 0.0  # due now, written alone
            try:
                await self.flush(limit=0)
            except _REFUSED as again:
                if _transient(again):
                    raise
                log.error("job %s (%s): Postgres refused its progress %r (%s); dropped", job_id, ctx.name,
                          ctx._latest, again)
                ctx._dirty, ctx._latest = False, None  # nor tried again with its outcome
                self._dirty = {}
            finally:
                self._dirty = {**others, **self._dirty}

    async def flush(self, limit: int | None = None) -> None:
        """Write the pending batch (at most `limit` outcomes, default max_batch): due progress
        first, then the outcomes. Raises on database errors, keeping what was not written queued."""
        outcomes = self._outcomes[: self.max_batch if limit is None else limit]
        # Every start taken here precedes every outcome taken here (both lists only grow, and a
        # job's outcome is submitted after its start).
        starting = list(self._started)
        now = time.monotonic()
        ending = {o.ctx.job_id for o in outcomes}
        progress_ctxs = [
            c for c in self._dirty.values()
            if c.job_id not in ending and (self._closing or c._next_publish_at <= now)
        ]
        # A job that reported progress but had none written yet gets one progress write just
        # before its final one.
        first_progress = [o.ctx for o in outcomes if o.ctx._latest is not None and o.ctx._published == 0
                          and o.kind != "released"]
        writes = progress_ctxs + first_progress
        if writes:
            await self._write_progress(writes, progress_ctxs)
        # A job whose later version is rung here (its progress, its outcome) needs no `started` ring.
        superseded = ending | {c.job_id for c in writes}
        started = [(j.id, j.version) for j in starting if j.id not in superseded]
        if not outcomes:
            if starting:
                await self._ring_started(started)
                del self._started[: len(starting)]
            return
        touched: set[int]
        if all(o.ctx._job.group_id is None and o.ctx._job.workflow_id is None for o in outcomes):
            rows, touched = await self._complete(outcomes, started), set()
        else:
            rows, touched = await self._complete_counting(outcomes, started)
        del self._started[: len(starting)]
        del self._outcomes[: len(outcomes)]
        by_id = {r["id"]: r for r in rows}
        ended: collections.Counter[tuple[str, str]] = collections.Counter()
        for o in outcomes:
            row = by_id.get(o.ctx.job_id)
            if row is None:
                self.stale += 1
                log.warning("job %s (%s, attempt %s): outcome %r ignored: its lease is gone "
                            "(rescued, cancelled or released meanwhile)", o.ctx.job_id, o.ctx.name,
                            o.ctx.attempt, o.kind)
            else:
                key = _count_key(row)
                self.counts[key] += 1
                ended[key, o.ctx.queue] += 1
        for (key, queue), n in ended.items():
            counter = _COUNTERS.get(key)
            if counter is not None:
                counter.labels(queue).inc(n)
        if touched and self.groups is not None:
            self.groups.mark(touched)
        if self.on_ended is not None and rows:
            # Lazily: a runtime without limited functions reads none of it, per flush.
            self.on_ended(o.ctx.name for o in outcomes if o.ctx.job_id in by_id)

    async def _write_progress(self, writes: list[JobContext], due: list[JobContext]) -> None:
        written = {c.job_id: c._latest for c in writes}
        async with self._pool.connection() as conn, aautocommitted(conn), conn.cursor() as cur:
            await cur.execute(queries.WRITE_PROGRESS, {
                "ids": [c.job_id for c in writes],
                "leases": [c._job.lease for c in writes],
                "progress": [json.dumps(written[c.job_id]) for c in writes],
            }, prepare=_prepare(writes))
            live = {r[0] for r in await cur.fetchall()}
        for c in writes:
            if c.job_id in live:
                c._mark_published()
                if c._latest is written[c.job_id]:
                    c._dirty = False  # nothing newer arrived while we wrote
        for c in due:
            if (not c._dirty or c.job_id not in live) and self._dirty.get(c.job_id) is c:
                del self._dirty[c.job_id]  # written, or fenced: the job is no longer ours

    async def _ring_started(self, started: list[tuple[int, int]]) -> None:
        async with self._pool.connection() as conn, aautocommitted(conn):
            await conn.execute(queries.RING_STARTED, started_param(started))

    @staticmethod
    def _outcome_params(outcomes: list[Outcome], started: list[tuple[int, int]]) -> dict[str, str]:
        """The outcome statement's parameters, refused (MessageTooLarge) past one message to
        Postgres, which closed the connection on them: taken for an outage, the batch was retried
        for ever. Refused, it is written one outcome at a time (_salvage), and a result too large
        alone fails its job."""
        params = complete_params(((o.ctx.job_id, o.ctx._job.lease, o.kind, o.error, o.delay, o.ctx._latest, o.result)
                                  for o in outcomes), started)
        check_sendable(params)
        return params

    async def _complete(self, outcomes: list[Outcome], started: list[tuple[int, int]]) -> list[dict[str, Any]]:
        """Outcomes of jobs outside any group or workflow: one statement, in autocommit (one round trip)."""
        async with self._pool.connection() as conn, aautocommitted(conn), conn.cursor(row_factory=dict_row) as cur:
            await cur.execute(queries.COMPLETE, self._outcome_params(outcomes, started), prepare=_prepare(outcomes))
            return await cur.fetchall()

    async def _complete_counting(self, outcomes: list[Outcome], started: list[tuple[int, int]]
                                 ) -> tuple[list[dict[str, Any]], set[int]]:
        """COMPLETE_COUNTING in a transaction, then, only if it drained a shard, the group finish, and
        the ends of workflow steps (outcomes.counted), in that same transaction. Returns the
        completed rows and the groups whose counts changed."""
        async with self._pool.connection() as conn:
            # Pipelined, BEGIN and the statement go out together: one round trip.
            async with conn.pipeline():
                async with conn.cursor(row_factory=dict_row) as cur:
                    await cur.execute(gq.COMPLETE_COUNTING, self._outcome_params(outcomes, started),
                                      prepare=_prepare(outcomes))
                    rows = await cur.fetchall()
            shards = rows[0]["_shards"] if rows else []
            touched = await group_outcomes.counted(conn, shards or [], rows)
        return rows, touched  # committed by the pool as the block ends


# Which outcomes /metrics counts, by _count_key().
_COUNTERS = {"succeeded": metrics.JOBS_SUCCEEDED, "failed": metrics.JOBS_FAILED, "retrying": metrics.JOBS_RETRIED}


def _count_key(row: dict[str, Any]) -> str:
    # A release gives its attempt back, whether it runs again now or after a delay (a workflow
    # step's ctx.flow.reattempt(wait=)): it failed nothing, and the retried counter is failures.
    if row["kind"] == "released" and row["state"] in ("available", "scheduled"):
        return "released"
    if row["state"] in ("scheduled", "available"):
        return "retrying"
    return str(row["state"])
