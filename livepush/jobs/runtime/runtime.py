"""The job runtime: one asyncio process running jobs from Postgres (SPEC §3, §7).

Roles, each a named task owned by the Runtime:
- listener: one LISTEN connection; the doorbell wakes the producer, cancel requests reach
  the jobs they name. Reconnects with backoff; polling covers the gap.
- producer: claims at most as many jobs as there are free slots, queue by queue in the
  order given, in one statement per queue (SKIP LOCKED), on its own connection, and starts
  them. Claims commit asynchronously (sql/0006_async_claims.sql says why that is safe).
- executor (one task per job): runs the function, hands the outcome to the completer.
- completer: writes outcomes and progress in batches (see completer.py).
- heartbeat: beats every `heartbeat` s, prunes dead runtimes and rescues their jobs.
- promoter: makes due scheduled jobs available.

Stop (SIGTERM/SIGINT or `stop()`): stop claiming; let the jobs in hand finish for up to
`shutdown_timeout` s; give back the rest (attempt not spent); deregister; return. A second
signal (or `stop(now=True)`) gives back the jobs in hand at once.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import importlib
import logging
import os
import signal
import socket
from collections.abc import Iterable, Sequence
from typing import Any

import psycopg
from psycopg.rows import dict_row
from psycopg_pool import AsyncConnectionPool

from ...postgres.connect import AsyncPool
from ...errors import ConfigError, SchemaError
from .. import database, queries
from ..events import views as events
from . import maintenance
from .completer import Completer, Outcome
from .context import ClaimedJob, JobContext
from .executor import execute
from ..api.registry import REGISTRY, Registry

log = logging.getLogger("livepush.jobs")


def _reraise_if_cancelled() -> None:
    """psycopg turns a cancellation during a query into QueryCanceled (a psycopg.Error): a
    loop that catches psycopg errors must not swallow its own task's cancellation."""
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        raise asyncio.CancelledError


class _InHand:
    __slots__ = ("ctx", "task", "is_async")

    def __init__(self, ctx: JobContext, task: asyncio.Task[None], is_async: bool) -> None:
        self.ctx = ctx
        self.task = task
        self.is_async = is_async


def load_modules(modules: Iterable[str]) -> None:
    """Import the modules that define job functions (`livepush jobs MODULE,...`)."""
    for name in modules:
        try:
            importlib.import_module(name)
        except ImportError as exc:
            raise ConfigError(f"cannot import job module {name!r} ({exc}): check the name and PYTHONPATH") from exc


class Runtime:
    def __init__(
        self,
        modules: Registry | Iterable[str] | None = None,
        *,
        queues: Sequence[str] | None = None,
        concurrency: int = 10,
        shutdown_timeout: float = 30.0,
        heartbeat: float = 10.0,
        poll_interval: float = 1.0,
        url: str | None = None,
        install_signals: bool = True,
        flush_delay: float = 0.002,
        retention: float | None = maintenance.DEFAULT_RETENTION,
    ) -> None:
        if isinstance(modules, Registry):
            self.registry = modules
        else:
            load_modules(modules or ())
            self.registry = REGISTRY
        if concurrency < 1:
            raise ConfigError(f"--concurrency {concurrency}: run at least one job at a time")
        if heartbeat <= 0:
            raise ConfigError(f"--heartbeat {heartbeat}: use a positive number of seconds")
        if shutdown_timeout < 0:
            raise ConfigError(f"--shutdown-timeout {shutdown_timeout}: use zero or more seconds")
        self.queues = list(queues) if queues else (self.registry.queues() or ["default"])
        self.concurrency = concurrency
        self.shutdown_timeout = shutdown_timeout
        self.heartbeat = heartbeat
        self.poll_interval = poll_interval
        self.url = url
        self.install_signals = install_signals
        self.flush_delay = flush_delay
        # Seconds finished jobs and groups are kept (None: forever); pruned by the heartbeat task.
        if retention is not None and retention <= 0:
            raise ConfigError(f"--retention {retention}: use a positive number of seconds")
        self.retention = retention
        self._pruned_at = 0.0
        self._group_progress: Any = None
        self.id: int | None = None
        self.state = "starting"
        self.in_hand: dict[int, _InHand] = {}
        self.peak_in_hand = 0  # most jobs ever in hand at once (never above concurrency)
        self.excluded: set[str] = set()  # job names claimed here but not known: never claimed again
        self.signals = 0
        self._pool: AsyncConnectionPool | None = None
        # The producer's own connection, in autocommit: claims only (no pool round on the
        # path between a slot freeing and the next job starting). Reopened after an error.
        self._claim_conn: psycopg.AsyncConnection | None = None
        self._completer: Completer | None = None
        self._threads: concurrent.futures.ThreadPoolExecutor | None = None
        self._doorbell = asyncio.Event()
        self._slot_freed = asyncio.Event()
        self._stop = asyncio.Event()
        self._stop_now = asyncio.Event()
        self._started = asyncio.Event()
        self._closing = asyncio.Event()  # side tasks end their loops when set
        self._tasks: list[asyncio.Task[Any]] = []
        self._host = socket.gethostname()

    # -- public ------------------------------------------------------------------------
    @property
    def info(self) -> dict[str, Any]:
        return {
            "id": self.id, "host": self._host, "pid": os.getpid(), "queues": self.queues,
            "concurrency": self.concurrency, "heartbeat": self.heartbeat, "state": self.state,
            "in_hand": len(self.in_hand),
        }

    @property
    def counts(self) -> dict[str, int]:
        return dict(self._completer.counts) if self._completer else {}

    def stop(self, now: bool = False) -> None:
        """Begin the drain; with now=True (or on a second call) give back the jobs at once."""
        self.signals += 1
        if now or self._stop.is_set():
            self._stop_now.set()
        self._stop.set()
        self._slot_freed.set()
        self._doorbell.set()

    async def wait_started(self, timeout: float = 10.0) -> None:
        await asyncio.wait_for(self._started.wait(), timeout)

    async def run(self) -> None:
        """Run until stopped; returns after a clean drain (the CLI then exits 0)."""
        await self._open()
        loop = asyncio.get_running_loop()
        installed: list[int] = []
        if self.install_signals:
            for sig in (signal.SIGTERM, signal.SIGINT):
                try:
                    loop.add_signal_handler(sig, self._on_signal, sig)
                    installed.append(sig)
                except (NotImplementedError, RuntimeError):
                    pass  # not the main thread: the embedder calls stop()
        try:
            self._tasks = [
                asyncio.create_task(self._listen(), name="livepush-jobs-listener"),
                asyncio.create_task(self._produce(), name="livepush-jobs-producer"),
                asyncio.create_task(self._heartbeat(), name="livepush-jobs-heartbeat"),
                asyncio.create_task(self._promote(), name="livepush-jobs-promoter"),
            ]
            self._started.set()
            log.info("job runtime %s running: queues %s, concurrency %s", self.id, ",".join(self.queues),
                     self.concurrency)
            stop_waiter = asyncio.create_task(self._stop.wait())
            # A side task that dies stops the runtime rather than letting it limp on. The
            # completer too: without it, every job this runtime claimed would stay `running`
            # under a live heartbeat, never finished and never rescued.
            assert self._completer is not None and self._completer._task is not None
            watched = [stop_waiter, *self._tasks, self._completer._task]
            done, _ = await asyncio.wait(watched, return_when=asyncio.FIRST_COMPLETED)
            if not self._stop.is_set():
                stop_waiter.cancel()
                for t in done:
                    if t is not stop_waiter:
                        log.error("runtime task %s stopped: %r; stopping the runtime", t.get_name(),
                                  t.exception() if not t.cancelled() else "cancelled")
                self.stop()
            await self._drain()
        finally:
            for sig in installed:
                loop.remove_signal_handler(sig)
            await self._close()

    # -- startup and shutdown --------------------------------------------------------------
    async def _open(self) -> None:
        url = self.url or database.database_url()
        self.url = url
        await _check_schema(url)
        self._pool = AsyncPool(url, min_size=2, max_size=6, open=False, kwargs={"autocommit": False},
                                         name="livepush-jobs-runtime")
        try:
            await self._pool.open(wait=True, timeout=10)
        except Exception as exc:
            from ...postgres.connect import unreachable

            raise unreachable(url, exc) from exc
        self._completer = Completer(self._pool, flush_delay=self.flush_delay)
        self._completer.start()
        from ..groups.progress import ProgressPublisher

        self._group_progress = ProgressPublisher(self._pool)
        self._group_progress.start()
        # Threads for sync jobs. A timed-out sync job keeps its thread until it returns, so
        # leave headroom beyond the concurrency.
        self._threads = concurrent.futures.ThreadPoolExecutor(max_workers=self.concurrency * 2,
                                                              thread_name_prefix="livepush-job")
        self.state = "running"
        self.id = await maintenance.register(self._pool, self.info)
        await self._publish_state("running")

    async def _drain(self) -> None:
        self.state = "draining"
        await self._publish_state("draining")
        if self.in_hand:
            log.info("draining: waiting up to %g s for %d jobs in hand", self.shutdown_timeout, len(self.in_hand))
            tasks = [h.task for h in self.in_hand.values()]
            now_waiter = asyncio.create_task(self._stop_now.wait())
            try:
                await asyncio.wait([asyncio.gather(*tasks, return_exceptions=True), now_waiter],
                                   timeout=self.shutdown_timeout, return_when=asyncio.FIRST_COMPLETED)
            finally:
                now_waiter.cancel()
        if self.in_hand:
            log.warning("giving back %d jobs in hand (attempt not spent)", len(self.in_hand))
            self.release_all()
        assert self._completer is not None
        await self._completer.close()

    def release_all(self) -> None:
        """Give back every job in hand, attempt not spent."""
        assert self._completer is not None
        for entry in list(self.in_hand.values()):
            ctx = entry.ctx
            if ctx.released:
                continue
            ctx.released = True
            self._completer.submit(Outcome(ctx, "released"))
            entry.task.cancel()
        self.in_hand.clear()

    async def _pause(self, seconds: float) -> None:
        """Sleep, but wake at once when the runtime closes."""
        try:
            await asyncio.wait_for(self._closing.wait(), seconds)
        except TimeoutError:
            pass

    async def _close(self) -> None:
        # Side tasks end at their next loop turn even if a cancellation is lost inside a
        # database call (psycopg may turn it into QueryCanceled); re-cancel until they are gone.
        self._closing.set()
        pending = set(self._tasks)
        while pending:
            for task in pending:
                task.cancel()
            _, pending = await asyncio.wait(pending, timeout=1.0)
            if pending:
                log.warning("side tasks %s still stopping", [t.get_name() for t in pending])
        self._tasks = []
        if self._completer is not None and self._completer._task is not None:
            await self._completer.close()
        if self._group_progress is not None:
            await self._group_progress.close()
            self._group_progress = None
        self.state = "stopped"
        if self._pool is not None:
            try:
                if self.id is not None:
                    given_back = await maintenance.deregister(self._pool, self.id)
                    if given_back:
                        log.warning("gave back %d jobs still marked as ours at deregistration", given_back)
                    await self._publish_state("stopped")
            except psycopg.Error as exc:
                log.error("could not deregister runtime %s (%s): its jobs are released once it is found dead",
                          self.id, exc)
            await self._pool.close()
        if self._claim_conn is not None:
            await self._claim_conn.close()
            self._claim_conn = None
        if self._threads is not None:
            # Threads still running (timed-out or given-back sync jobs) are not waited for.
            self._threads.shutdown(wait=False, cancel_futures=True)
        log.info("job runtime %s stopped", self.id)

    def _on_signal(self, sig: int) -> None:
        if self._stop.is_set():
            log.warning("second %s: giving back the jobs in hand now", signal.Signals(sig).name)
            self.stop(now=True)
        else:
            log.info("%s: draining (a second signal gives the jobs back at once)", signal.Signals(sig).name)
            self.stop()

    async def _publish_state(self, event: str) -> None:
        if self._pool is None or self.id is None:
            return
        try:
            async with self._pool.connection() as conn:
                later = await events.apublish_in(conn, events.runtime_event(event, self.info))
            await events.apublish_after(later)
        except Exception as exc:  # the runtime's own state is informative only
            _reraise_if_cancelled()
            log.warning("could not publish runtime state %s: %s", event, exc)

    # -- listener ----------------------------------------------------------------------------
    async def _listen(self) -> None:
        backoff = 0.1
        while not self._closing.is_set():
            try:
                async with await psycopg.AsyncConnection.connect(self.url, autocommit=True) as conn:
                    await conn.execute(f"LISTEN {queries.READY_CHANNEL}")
                    await conn.execute(f"LISTEN {queries.CANCEL_CHANNEL}")
                    backoff = 0.1
                    self._doorbell.set()  # anything enqueued while we were not listening
                    async for note in conn.notifies():
                        if note.channel == queries.READY_CHANNEL:
                            self._doorbell.set()
                        elif note.channel == queries.CANCEL_CHANNEL and note.payload.isdigit():
                            self._cancel_local(int(note.payload))
            except asyncio.CancelledError:
                raise
            except psycopg.Error as exc:
                _reraise_if_cancelled()
                log.warning("job listener lost its connection (%s); polling every %g s until it is back",
                            exc, self.poll_interval)
                await self._pause(backoff)
                backoff = min(backoff * 2, 5.0)

    def _cancel_local(self, job_id: int) -> None:
        entry = self.in_hand.get(job_id)
        if entry is None or entry.ctx.cancel_requested:
            return
        entry.ctx.cancel_requested = True
        log.info("job %s: cancel requested; stopping it at its next await or progress call", job_id)
        if entry.is_async:
            entry.task.cancel()

    # -- producer -----------------------------------------------------------------------------
    async def _produce(self) -> None:
        more = True  # whether the last claim filled every slot (so more may be waiting)
        backoff = 0.05
        while not self._stop.is_set():
            free = self.concurrency - len(self.in_hand)
            if free <= 0:
                self._slot_freed.clear()
                await self._slot_freed.wait()
                await self._settle()
                continue
            if not more:
                try:
                    await asyncio.wait_for(self._doorbell.wait(), self.poll_interval)
                except TimeoutError:
                    pass
                if self._stop.is_set():
                    break
                free = self.concurrency - len(self.in_hand)
                if free <= 0:
                    continue
            # Cleared before the claim: a doorbell during the claim is kept for the next round.
            self._doorbell.clear()
            try:
                claimed = await self._claim(free)
                backoff = 0.05
            except psycopg.Error as exc:
                _reraise_if_cancelled()
                log.warning("claim failed (%s); retrying in %.2f s", exc, backoff)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 5.0)
                continue
            more = claimed >= free

    async def _settle(self) -> None:
        """Yield while jobs are still finishing, so that the next claim is a batch rather
        than one job at a time (jobs that end together take a few loop turns to return).
        Bounded: a steady trickle of slow jobs must not hold the claim back."""
        before = len(self.in_hand)
        for _ in range(4):
            await asyncio.sleep(0)
            now = len(self.in_hand)
            if now == before:
                return
            before = now

    async def _claim_connection(self) -> psycopg.AsyncConnection:
        conn = self._claim_conn
        if conn is None or conn.closed or conn.broken:
            if conn is not None:
                await conn.close()
            self._claim_conn = None
            # prepare_threshold=0: the claim is prepared from its first run, not its sixth
            # (the first claims of an idle runtime are its pickup latency).
            conn = await psycopg.AsyncConnection.connect(self.url, autocommit=True,  # type: ignore[arg-type]
                                                         connect_timeout=10, prepare_threshold=0)
            self._claim_conn = conn
        return conn

    async def _claim(self, free: int) -> int:
        assert self._completer is not None
        rows: list[dict[str, Any]] = []
        params: dict[str, Any] = {"excluded": sorted(self.excluded), "runtime_id": self.id}
        # Each queue's claim is one statement in autocommit: one round trip, no BEGIN/COMMIT.
        conn = await self._claim_connection()
        try:
            async with conn.cursor(row_factory=dict_row) as cur:
                for queue in self.queues:
                    want = free - len(rows)
                    if want <= 0:
                        break
                    params["queue"], params["limit"] = queue, want
                    await cur.execute(queries.CLAIM, params)
                    rows.extend(await cur.fetchall())
        except psycopg.Error as exc:
            # Earlier queues' claims are committed: those jobs are ours and must run.
            if not rows:
                raise
            _reraise_if_cancelled()
            log.warning("claim failed after %d jobs were claimed (%s); running those", len(rows), exc)
        if not rows:
            return 0
        # "started" for the jobs this runtime knows (an unknown one is given back without an
        # event). With the Postgres fan-out the completer publishes them in its next batch,
        # ahead of anything else about these jobs; otherwise they go out now, after the commit.
        jobs = [ClaimedJob.from_row(row) for row in rows]
        known = [(job, row) for job, row in zip(jobs, rows) if job.name in self.registry]
        if events.in_transaction():
            for job, _ in known:
                self._completer.started(job)
        else:
            await events.apublish_after([events.job_event("started", row) for _, row in known])
        for job in jobs:
            self._start(job)
        return len(rows)

    def _start(self, job: ClaimedJob) -> None:
        assert self._completer is not None
        ctx = JobContext(job, self._completer)
        fn = self.registry.find(job.name)
        if fn is None:
            # A rolling deploy: a newer runtime enqueued a job this one does not know. Give it
            # back for a runtime that does, and never claim that name here again.
            log.warning("job %s has the unknown name %r: giving it back and skipping that name from now on "
                        "(deploy the code that defines it to this runtime)", job.id, job.name)
            self.excluded.add(job.name)
            ctx.released = True
            self._completer.submit(Outcome(ctx, "released"))
            return
        task = asyncio.create_task(self._run_job(fn, ctx), name=f"livepush-job-{job.id}")
        self.in_hand[job.id] = _InHand(ctx, task, fn.is_async)
        self.peak_in_hand = max(self.peak_in_hand, len(self.in_hand))
        if ctx.cancel_requested and fn.is_async:
            task.cancel()

    async def _run_job(self, fn: Any, ctx: JobContext) -> None:
        assert self._completer is not None
        try:
            outcome = await execute(fn, ctx, self._threads)
            if outcome is not None and not ctx.released:
                self._completer.submit(outcome)
        except asyncio.CancelledError:
            if not ctx.released:
                ctx.released = True
                self._completer.submit(Outcome(ctx, "released"))
            raise
        finally:
            if self.in_hand.get(ctx.job_id) is not None and self.in_hand[ctx.job_id].ctx is ctx:
                del self.in_hand[ctx.job_id]
            self._slot_freed.set()

    # -- heartbeat, rescue, promotion -------------------------------------------------------------
    async def _heartbeat(self) -> None:
        assert self._pool is not None
        last_in_hand = -1
        while not self._closing.is_set():
            try:
                await maintenance.beat(self._pool, self.info)
                await maintenance.rescue(self._pool)
                for job_id in await maintenance.cancel_requests(self._pool, self.id):  # type: ignore[arg-type]
                    self._cancel_local(job_id)
                if len(self.in_hand) != last_in_hand:
                    last_in_hand = len(self.in_hand)
                    await self._publish_state(self.state)
                await self._prune()
            except psycopg.Error as exc:
                _reraise_if_cancelled()
                log.warning("heartbeat failed (%s); trying again next beat", exc)
            await self._pause(self.heartbeat)

    async def _prune(self) -> None:
        """Retention, at most once a minute (or per tenth of the retention time) per runtime."""
        if self.retention is None or self._pool is None:
            return
        now = asyncio.get_running_loop().time()
        if now - self._pruned_at < min(60.0, self.retention / 10):
            return
        self._pruned_at = now
        await maintenance.prune(self._pool, self.retention)

    async def _promote(self) -> None:
        assert self._pool is not None
        while not self._closing.is_set():
            try:
                if await maintenance.promote(self._pool):
                    self._doorbell.set()
                wait = await maintenance.seconds_to_next_scheduled(self._pool)
            except psycopg.Error as exc:
                _reraise_if_cancelled()
                log.warning("promoting scheduled jobs failed (%s)", exc)
                wait = None
            delay = self.poll_interval if wait is None else min(self.poll_interval, max(wait, 0.005))
            await self._pause(delay)


async def _check_schema(url: str) -> None:
    from ...migrate import required_version

    try:
        async with await psycopg.AsyncConnection.connect(url, autocommit=True, connect_timeout=5) as conn:
            try:
                row = await (await conn.execute("SELECT coalesce(max(version), 0) FROM livepush_schema")).fetchone()
                have = int(row[0]) if row else 0
            except psycopg.errors.UndefinedTable:
                have = 0
    except psycopg.OperationalError as exc:
        from ...postgres.connect import unreachable

        raise unreachable(url, exc) from exc
    need = required_version()
    if have < need:
        raise SchemaError(f"the database schema is at version {have} but the job runtime needs {need}: "
                          "run `livepush migrate`")
