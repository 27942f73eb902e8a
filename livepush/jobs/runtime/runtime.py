"""The job runtime: one asyncio process running jobs from Postgres (docs/jobs.md).

Roles, each a named task owned by the Runtime and supervised (livepush.tasks: a task that fails
is logged with its traceback and restarted with backoff; one that keeps failing stops the
runtime with an error, so its process exits non-zero):
- listener: the process's Postgres listener carries the runtimes' doorbell (wake the producer)
  and cancel requests (confirmed against the row before anything is stopped). Polling covers
  the time it is away.
- producer: claims at most as many jobs as there are free slots, queue by queue in the order
  given, in one statement per queue (SKIP LOCKED), on its own connection, and starts them. Job
  names with limits (concurrency per key, a start rate) take a claim of their own, one short
  transaction per name, before the queue's other jobs (limits.py). Paused queues are skipped: the set is read again
  when a pause or resume rings, and at least every PAUSED_REFRESH_SECONDS. Between claims, after a
  failed one and every RECONCILE_SECONDS, it gives back the jobs running under its id that it does
  not know (a claim whose reply never reached it took them).
- executor (one task per job): runs the function, hands the outcome to the completer.
- completer: writes outcomes and progress in batches (see completer.py).
- heartbeat: beats every `heartbeat` s; after each beat, prunes dead runtimes and rescues their
  jobs in a task of its own, which nothing it waits for may hold the beats up with.
- housekeeping: every `heartbeat` s, cancels groups of children whose parent finished first and
  deletes what retention lets go; apart from the heartbeat, which nothing slow may hold up.
- promoter: makes due scheduled jobs available.
- periodic (only with periodic jobs on its queues): enqueues each cron tick, once across every
  runtime (livepush/jobs/periodic/scheduler.py), sleeping until the next tick.

Stop (SIGTERM/SIGINT or `stop()`): stop claiming; let the jobs in hand finish for up to
`shutdown_timeout` s; give back the rest (attempt not spent); deregister; return. A second signal
(or `stop(now=True)`) gives back the jobs in hand at once.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import concurrent.futures
import importlib
import logging
import os
import re
import signal
import socket
import time
from collections.abc import Awaitable, Callable, Iterable, Iterator, Sequence
from datetime import datetime
from typing import Any, TypeVar

import psycopg
from psycopg.rows import dict_row

from ... import metrics, migrate, stopsignals, topics
from ...errors import ArgumentTypeError, ArgumentValueError, ConfigError, DependencyError, LivepushError
from ...fanout import FanOut
from ...postgres.connect import aconnect, as_warned, translate
from ...channels import ListenerSlot
from ...postgres.listener import Listener
from ...postgres.pools import AsyncPool, LoopPools, aclosed_while_idle
from ...postgres.text import BIGINT_MAX
from ...repeats import Repeats
from ...tasks import Backoff, reraise_if_cancelled, supervise
from ...types import Seconds, as_seconds, is_finite, shown
from ...usercode import as_module, is_a_path, names_the_module, not_found, what_raised, where_raised
from .. import database, queries
from ..api.enqueue import SCRIPT_PREFIX
from ..api.limits import Limits
from ..api.options import check_queue
from ..api.registry import REGISTRY, Registry
from ..groups.progress import ProgressPublisher
from ..periodic.decorator import SCHEDULES, Schedule
from ..periodic.scheduler import Scheduler
from ..workflows import queries as workflow_queries
from . import limits, maintenance
from .completer import Completer
from .context import ClaimedJob, JobContext
from .deadlines import Deadlines
from .threads import JobThreads
from .executor import Outcome, execute, timeout_failure

log = logging.getLogger("livepush.jobs")
T = TypeVar("T")

# A cancel or group progress notification names at most this many ids
# (livepush_jobs_cancel_requested(), livepush_groups_unrung()).
_IDS = re.compile(r"[0-9]{1,19}(?:,[0-9]{1,19}){0,299}")
# Errors a loop of the runtime waits out and tries again: the database went away or refused.
_DB_ERRORS = (psycopg.Error, DependencyError)
# The longest a runtime goes on claiming from a queue after its pause committed, should the pause's
# ring be lost: the paused set is read again before a claim once it is this old.
PAUSED_REFRESH_SECONDS = 0.5
# Seconds an async job gets to end once cancelled (past its timeout, or by jobs.cancel()) before
# it is ended without it (its `finally` blocks, its cleanup, run meanwhile): a job that swallows
# every cancellation would otherwise hold its slot, and its concurrency key's, for good.
TIMEOUT_GRACE = 2.0
# Seconds the stop's last writes (outcomes, deregistration, state) still get after a second
# signal, all together: enough for a healthy Postgres, short for one that is down.
STOP_NOW_GRACE = 2.0
# The jobs in hand's time to finish on a stop, unless told otherwise (`livepush jobs
# --shutdown-timeout`); `serve --with-jobs` runs with it, and its supervisor bounds a worker's stop by it.
DEFAULT_SHUTDOWN_TIMEOUT = 30.0
# Seconds the stop waits for a claim on its way to return before giving back the jobs in hand: a
# healthy Postgres answers in milliseconds; one that does not answer must not hold the jobs on.
CLAIM_RETURN_WAIT = 5.0
# Seconds by which the database's clock may run ahead of this process's, from one beat to the
# next, before it counts as a step of that clock; compared with the offsets of this many beats.
CLOCK_STEP = 0.5
CLOCK_SAMPLES = 3
# Seconds between a runtime's give-backs of the jobs the database says it runs and it does not know
# (_release_unheard). After a failed claim it gives them back before its next claim; but a claim
# whose connection broke mid-statement can commit after that, once its backend gets to it, and its
# job would stay `running` under this live runtime, which never runs it, until it restarts (its
# beats keep the rescue away). About a minute: a job stuck so is back within it, for one cheap
# statement a minute per runtime.
RECONCILE_SECONDS = 60.0
# Seconds a publication of the runtime's own state (runtime:<id>, runtimes) gets on each topic:
# informative only, it must never hold up a start or a stop.
STATE_PUBLISH_TIMEOUT = 2.0


class _InHand:
    __slots__ = ("ctx", "task", "is_async", "deadline")

    def __init__(self, ctx: JobContext, task: asyncio.Task[None], is_async: bool) -> None:
        self.ctx = ctx
        self.task = task
        self.is_async = is_async
        self.deadline: int | None = None  # its bucket in Runtime._deadlines, for an async job with a timeout


def load_modules(modules: Iterable[str]) -> None:
    """Import the modules that define job functions (`livepush jobs MODULE,...`). What one raises
    at import (a decorator refusing its options, a mistake in the module) becomes a ConfigError
    naming the module and the line of the user's code it came from: one line, not a traceback."""
    for name in modules:
        if is_a_path(name):
            raise _a_path(name)
        try:
            importlib.import_module(name)
        except ImportError as exc:
            if name.endswith(".py") and names_the_module(exc, name):
                raise _a_path(name) from None  # only when failed: `pkg.py` may be a module named py
            if not names_the_module(exc, name):
                # Found, but a dependency it imports is missing: its name is right, its line is the news.
                raise ConfigError(f"job module {name!r} failed at import ({where_raised(exc)}): "
                                  f"{what_raised(exc)}") from exc
            raise ConfigError(f"cannot import job module {name!r}: {not_found(exc.name or name)}") from exc
        except ConfigError:
            raise
        except Exception as exc:  # noqa: BLE001 - whatever the module raises, said in one line
            raise ConfigError(f"job module {name!r} failed at import ({where_raised(exc)}): "
                              f"{what_raised(exc)}") from exc
        except SystemExit as exc:
            # A script's code left at module level (sys.exit(), argparse): it ended the runtime as
            # it said, with sys.exit(0) silently and with status 0, as if it had stopped cleanly.
            raise ConfigError(f"job module {name!r} exited at import ({where_raised(exc, top_level=True)}): "
                              f"sys.exit({exc.code!r}); "
                              "a job module is imported by the runtime, so it must not exit: move that code "
                              "under `if __name__ == \"__main__\":`") from exc


def _a_path(name: str) -> ConfigError:
    dotted = as_module(name)
    return ConfigError(f"job module {name!r} is a file path, not a module: name the module as Python imports it, "
                       f"e.g. {dotted or 'myapp.jobs'}")


def parse_ids(payload: str, channel: str) -> list[int]:
    """The ids of a `livepush_jobs_cancel` or `livepush_groups_progress` notification; [] for
    anything else."""
    if not _IDS.fullmatch(payload):
        if payload:
            log.debug("dropped a %s notification that names no ids: %r", channel, payload[:80])
        return []
    # Any database login may send these: an id past the bigint range would fail the statement
    # that reads the rows, for the real ids named beside it too.
    return [n for n in map(int, payload.split(",")) if n <= BIGINT_MAX]



# The shortest heartbeat and poll interval (less would spin), and the longest: a day
# (sql/0003_jobs.sql holds the heartbeat to it too).
MIN_BEAT = 0.01
MAX_HEARTBEAT = 86400.0
# A step claim that passed over steps whose run's row was busy (workflows/queries.py: CLAIM_STEPS)
# claims again this soon, then twice as late each time it meets a busy run again, up to the poll
# interval: a decision or another claim holds the row for milliseconds, a caller's open
# transaction for as long as it likes (its commit rings the doorbell).
BUSY_RUN_RETRY = 0.02
# The most jobs one runtime holds at once: its row in livepush_runtimes keeps it in an integer
# column, and far more than one process can run anyway.
MAX_CONCURRENCY = 100_000
# The longest retention: a hundred years (0 on the command line, None here, keeps jobs forever).
# Postgres computes the cut-off as now() minus the retention, which leaves its timestamp range
# for a few thousand years: every prune would then fail, on every runtime, for good.
MAX_RETENTION = 100 * 366 * 86400.0


@dataclasses.dataclass(frozen=True, slots=True)
class OptionNames:
    """How a runtime's ConfigErrors name the options its caller gave: `livepush jobs` gave flags
    (`--concurrency 0`), Python code Runtime's keywords (`Runtime(concurrency=0)`), so that the
    line points at what was written rather than at a command the caller never ran."""

    flags: bool

    def said(self, keyword: str, value: Any) -> str:
        """The option `keyword` of Runtime as the caller gave it, with its value."""
        if self.flags:
            return f"--{keyword.replace('_', '-')} {shown(value, width=40)}"
        return f"Runtime({keyword}={shown(value, width=40)})"

    def name(self, keyword: str) -> str:
        """The option `keyword` of Runtime as the caller knows it, without a value."""
        return f"--{keyword.replace('_', '-')}" if self.flags else f"Runtime({keyword}=)"


KEYWORDS = OptionNames(flags=False)  # Runtime(...) called from Python
FLAGS = OptionNames(flags=True)  # `livepush jobs`, whose flags became Runtime's keywords


def check_seconds(keyword: str, value: float, names: OptionNames, *, least: float, most: float | None = None,
                  also: str = "") -> None:
    """A number of seconds from `least` to `most`: a ConfigError naming Runtime's option `keyword`
    as the caller gave it otherwise, with `also` (another value the option takes) after the range."""
    finite = isinstance(value, (int, float)) and is_finite(value)  # 10**400: out of range like any other
    if isinstance(value, bool) or not finite or value < least or (most is not None and value > most):
        bound = f"from {least:g} to {_whole(most)}" if most is not None else f"{least:g} or more"
        # "finite" only where no upper bound says it: infinity is "0 or more", and NaN is no number.
        kind = "a finite number" if most is None else "a number"
        raise ConfigError(f"{names.said(keyword, value)}: use {kind} of seconds {bound}{also}")


def _fix_for_unknown(name: str) -> str:
    """What to do about a job whose name this runtime does not define. A script's job (`__main__.fn`,
    enqueued by a script run directly) is defined by no module a runtime imports: no deploy brings it."""
    if name.startswith(SCRIPT_PREFIX):
        return ("its function was defined in a script run directly, whose module is __main__: give it a name= "
                "and define it in a module this runtime imports, or run it with jobs.drain() in that script")
    return "deploy the code that defines it to this runtime"


def _queue_list(queues: Sequence[str], names: OptionNames) -> Sequence[str]:
    """A runtime's `queues`: a non-empty list of names (None, for every queue of its modules, is
    the caller's). A str would be served as its one-letter queues, and an empty list, taken for
    None, served every queue, those meant for other runtimes too."""
    if isinstance(queues, (str, bytes)):
        raise ConfigError(f"{names.said('queues', queues)} is one string: pass a list of queue names, "
                          f"e.g. [{shown(queues, width=80)}]")
    if not queues:
        every = "leave the flag out" if names.flags else "pass None"
        raise ConfigError(f"{names.said('queues', queues)} names no queue: list the queues to run, or {every} "
                          "to run every queue the modules use")
    return queues


def _nothing() -> None:
    pass


def _whole(seconds: float) -> str:
    """`seconds` as --help writes a bound: 3162240000, not 3.16224e+09."""
    return f"{seconds:.0f}" if seconds == int(seconds) else f"{seconds:g}"


async def _done_or_set(task: asyncio.Future[Any], event: asyncio.Event) -> None:
    """Wait until `task` is done or `event` is set, whichever comes first (neither is cancelled)."""
    if event.is_set():
        return
    waiter = asyncio.create_task(event.wait())
    try:
        await asyncio.wait([task, waiter], return_when=asyncio.FIRST_COMPLETED)
    finally:
        waiter.cancel()


class Runtime:
    """The job runtime embedded in Python: what `livepush jobs` runs (docs/jobs.md). `modules` are
    the names of the modules that define the jobs (a list, not one string), `queues` the queues it
    serves, first ones first (None: every queue their jobs use, those of jobs defined while it runs
    included); `concurrency` jobs at a time.
    `shutdown_timeout`, `heartbeat`, `poll_interval` and `retention` are seconds or a timedelta, in
    the ranges the command's flags take (`retention=None` keeps finished jobs and groups). `url`
    is the database (None: the one `jobs.configure()` names, else LIVEPUSH_DATABASE_URL).
    `await run()` runs until `stop()` (or SIGTERM and SIGINT, unless `install_signals=False`), once:
    a stopped runtime is not run again (make a new one). `option_names` says how its errors name
    the options: as Runtime's keywords (KEYWORDS), or as the flags of `livepush jobs` (FLAGS)."""

    def __init__(
        self,
        modules: Registry | Iterable[str] | None = None,
        *,
        queues: Sequence[str] | None = None,
        concurrency: int = 10,
        shutdown_timeout: Seconds = DEFAULT_SHUTDOWN_TIMEOUT,
        heartbeat: Seconds = 10.0,
        poll_interval: Seconds = 1.0,
        url: str | None = None,
        install_signals: bool = True,
        flush_delay: float = 0.002,
        retention: Seconds | None = maintenance.DEFAULT_RETENTION,
        listener: Listener | None = None,
        listen: bool = True,
        publisher: FanOut | None = None,
        listen_url: str | None = None,
        option_names: OptionNames = KEYWORDS,
    ) -> None:
        if isinstance(modules, Registry):
            self.registry = modules
        else:
            if isinstance(modules, (str, bytes)):
                # A str is a sequence of one-letter names: the error would name a module "m".
                raise ConfigError(f"the job modules {shown(modules, width=80)} are one string: pass a list of module names, "
                                  f"e.g. [{shown(modules, width=80)}]")
            module_names = list(modules or ())
            load_modules(module_names)
            self.registry = REGISTRY
            if module_names and not REGISTRY.names():
                # The wrong module of the app: serving the default queue, the runtime would claim
                # its jobs only to give each one back.
                raise ConfigError(f"the modules {', '.join(module_names)} define no job: name the modules that "
                                  "define your job functions (@jobs.job), e.g. `livepush jobs myapp.jobs`")
        if isinstance(concurrency, bool) or not isinstance(concurrency, int) or not 1 <= concurrency <= MAX_CONCURRENCY:
            raise ConfigError(f"{option_names.said('concurrency', concurrency)}: run from 1 to {MAX_CONCURRENCY} "
                              "jobs at a time")
        heartbeat, poll_interval = as_seconds(heartbeat), as_seconds(poll_interval)
        shutdown_timeout, retention = as_seconds(shutdown_timeout), as_seconds(retention)
        # Every runtime reads every runtime's heartbeat (the rescue of dead ones), so a NaN or an
        # infinity there would break the rescue for all of them; a poll interval of nothing spins.
        check_seconds("heartbeat", heartbeat, option_names, least=MIN_BEAT, most=MAX_HEARTBEAT)
        check_seconds("poll_interval", poll_interval, option_names, least=MIN_BEAT, most=MAX_HEARTBEAT)
        check_seconds("shutdown_timeout", shutdown_timeout, option_names, least=0.0)
        if retention is not None:
            # 0 on the command line, None here, keeps them: the line names it beside the range.
            keep = "0" if option_names.flags else "None"
            check_seconds("retention", retention, option_names, least=0.001, most=MAX_RETENTION,
                          also=f" (100 years), or {keep} to keep finished jobs and groups")
        # The names enqueue() accepts: a runtime serving another could never claim a job, and one
        # Postgres cannot store fails at registration with the driver's error.
        # A queue named twice is served once, at its first place: twice, each round claimed it twice
        # and the registered row listed it twice.
        self.queues = (list(dict.fromkeys(check_queue(q, option_names.name("queues"))
                                          for q in _queue_list(queues, option_names)))
                       if queues is not None else (self.registry.queues() or ["default"]))
        # Made without `queues`, it serves every queue its registry's jobs use: those of a job
        # defined since (a module imported later) too, taken up before its next claim as its
        # limits are; `_queues_seen` is the registry's count of registrations they were read at.
        self._every_queue = queues is None
        self._queues_seen = self.registry.changes
        # Queues taken up since its registration that its row does not list yet (`livepush status`).
        self._queues_unwritten = False
        self.concurrency = concurrency
        self.shutdown_timeout = shutdown_timeout
        self.heartbeat = heartbeat
        self.poll_interval = poll_interval
        self.url = url
        self.install_signals = install_signals
        self.flush_delay = flush_delay
        # Seconds finished jobs and groups are kept (None: forever); pruned by the housekeeping task.
        self.retention = retention
        self.publisher = publisher  # where the runtime's own state goes (runtime:<id>, runtimes)
        # Its own listener (when none is given) may connect elsewhere than its pools: past a pooler
        # in transaction mode, which cannot keep a LISTEN (LIVEPUSH_LISTEN_DATABASE_URL).
        self.listen_url = listen_url
        self._listener = ListenerSlot(listener, lambda: Listener(self.listen_url or self.url or "",
                                                                 name="livepush-jobs-listener"))
        self._listen = listen
        self._pruned_at = 0.0
        self._prune_batches = maintenance.prune_batches()  # halved by a statement_timeout
        # What the background loops' failures log: each kind at most once a minute (repeats.py),
        # a grant the role lacks with what to run.
        self._failures = Repeats(log, shown=self._said)
        self.id: int | None = None
        self.state = "starting"
        self.in_hand: dict[int, _InHand] = {}
        self.peak_in_hand = 0  # most jobs ever in hand at once (never above concurrency)
        # Job names claimed here but not known: not claimed again until their function is defined.
        self.excluded: set[str] = set()
        # The workflow steps this runtime defines (their job names): their jobs take a claim of
        # their own (workflows/queries.py: CLAIM_STEPS), which a runtime without steps never runs.
        self.step_names: list[str] = []
        # Names whose jobs take the limited claim (limits.names(), re-read every beat). And when
        # the next claim is due without a ring (loop time): a rate-limited name's next token, if a
        # bucket held jobs back, or the retry of steps passed over because their run was busy
        # (`_busy_retry`, the next such retry's delay): the producer wakes then rather than
        # polling or spinning.
        self.limited: list[str] = []
        self._limited_turn = 0  # claim rounds so far: which limited name of a priority is asked first (limits.in_turn)
        self.limits_dropped: frozenset[str] = frozenset()  # of them, rows whose limits a newer definition dropped
        # The limits this runtime wrote for each of its functions, at its start or since, and the
        # registry's count of registrations when it last compared them: a function defined while it
        # runs (a module imported later) has its limits written by a side task, as at a start.
        self._limits_written: dict[str, Limits | None] = {}
        self._registry_seen = -1
        self._limits_writing: asyncio.Task[None] | None = None
        self._claim_due: float | None = None
        self._busy_retry = BUSY_RUN_RETRY
        # (name, queue) whose last limited claim found nothing it could start, and when (loop
        # time): skipped until the doorbell rings (not for limits_dropped), a job of the name ends
        # here, or a poll interval passes, so that a runtime with limited functions does not pay
        # their claims on every round of plain work.
        self._limited_empty: dict[tuple[str, str], float] = {}
        # Queues no claim takes from (jobs.pause_queue()), as last read, and when (loop time; None:
        # read again before the next claim, as after a `queues` ring).
        self.paused: frozenset[str] = frozenset()
        self._paused_read_at: float | None = None
        self._pools: LoopPools | None = None
        self._pool: AsyncPool | None = None
        self._beat_pools: LoopPools | None = None
        self._beat_pool: AsyncPool | None = None
        # The producer's own connection, in autocommit: claims only (no pool round on the path
        # between a slot freeing and the next job starting). Reopened after an error.
        self._claim_conn: psycopg.AsyncConnection | None = None
        self._completer: Completer | None = None
        self._group_progress: ProgressPublisher | None = None
        self._threads: JobThreads | None = None
        self._stuck_threads = 0  # sync jobs' threads run on past their timeouts, in _threads
        self._deadlines: Deadlines[_InHand] = Deadlines(self._time_out)
        self._doorbell = asyncio.Event()
        self._slot_freed = asyncio.Event()
        self._stop = asyncio.Event()
        self._stop_now = asyncio.Event()
        self._stopped_now_at: float | None = None  # time.monotonic() of the second signal
        self._signalled = False  # a signal (SIGTERM, SIGINT) stopped it
        self._started = asyncio.Event()
        # run() has returned or raised, and what it raised: wait_started() says so rather than
        # wait for a start that will never come.
        self._ended = asyncio.Event()
        self._ended_by: BaseException | None = None
        self._ran = False  # run() was called: its events and tasks are one run's
        self._closing = asyncio.Event()  # side tasks end their loops when set
        self._tasks: list[asyncio.Task[Any]] = []
        self._completer_task: asyncio.Task[None] | None = None
        self._cancels_due: set[int] = set()
        self._cancel_check: asyncio.Task[None] | None = None
        self._state_publish: asyncio.Task[None] | None = None  # the heartbeat's publication of our state
        self._rescuing: asyncio.Task[None] | None = None  # the heartbeat's rescue of dead runtimes' jobs
        # Whether a claim is under way, and the ids cancel requests named meanwhile that were not
        # in hand: a job the claim took can be cancelled, and its notification heard, before the
        # claim's reply comes back. Checked again once the claim's jobs have started.
        self._claim_returned = asyncio.Event()  # set while no claim is under way
        self._claim_returned.set()
        self._heard_while_claiming: set[int] = set()
        # A claim statement failed: it may have committed jobs to this runtime whose reply never
        # came (the connection broke on the way back). Looked for before the next claim.
        self._claims_unheard = False
        # And looked for every `reconcile_seconds` anyway (RECONCILE_SECONDS says why), by the
        # producer between claims; `_reconciled_at` is when it last did (loop time).
        self.reconcile_seconds = RECONCILE_SECONDS
        self._reconciled_at = 0.0
        self._reconcile_wake: asyncio.TimerHandle | None = None  # ends a wait for a free slot then
        self._host = socket.gethostname()
        # The periodic jobs it schedules (run() sets them before it registers; drain() schedules
        # none), in its row: jobs.forget_periodic() refuses to forget them while it lives.
        self._schedules: list[Schedule] = []

    # -- public ------------------------------------------------------------------------
    @property
    def info(self) -> dict[str, Any]:
        return {
            "id": self.id, "host": self._host, "pid": os.getpid(), "queues": self.queues,
            "concurrency": self.concurrency, "heartbeat": self.heartbeat, "state": self.state,
            "in_hand": len(self.in_hand),
            "periodic": [s.name for s in self._schedules],
        }

    @property
    def counts(self) -> dict[str, int]:
        return dict(self._completer.counts) if self._completer else {}

    @property
    def healthy(self) -> bool:
        """Every side task runs, and the listener (if any) hears the doorbell."""
        tasks_alive = all(not t.done() for t in [*self._tasks, *([self._completer_task] if self._completer_task else [])])
        progress_alive = self._group_progress is None or self._group_progress.running
        listening = self._listener.listening
        return self.state in ("running", "draining") and tasks_alive and progress_alive and listening

    def stop(self, now: bool = False) -> None:
        """Begin the drain; with now=True (or on a second call) give back the jobs at once."""
        if (now or self._stop.is_set()) and not self._stop_now.is_set():
            self._stopped_now_at = time.monotonic()
            self._stop_now.set()
        self._stop.set()
        self._slot_freed.set()
        self._doorbell.set()

    async def wait_started(self, timeout: Seconds | None = 10.0) -> None:
        """Return once run() has started claiming jobs; TimeoutError after `timeout` seconds (or a
        timedelta; None: no bound). A run() that ended without starting ends the wait at once: its
        error is raised here too (a database it could not reach), or, stopped (or its task
        cancelled) before it started, a LivepushError saying which."""
        timeout = as_seconds(timeout)
        # Checked here: a str raised a bare TypeError from inside asyncio, and a negative or NaN
        # bound timed out at once, as if the runtime had not started.
        if timeout is not None and (isinstance(timeout, bool) or not isinstance(timeout, (int, float))):
            raise ArgumentTypeError(f"wait_started(timeout=) takes seconds, a timedelta or None (no bound), got "
                                    f"{shown(timeout, typed=True, width=60)}")
        if timeout is not None and not (is_finite(timeout) and timeout >= 0):
            raise ArgumentValueError(f"wait_started(timeout=) takes zero or more seconds, a finite number (None: no "
                                     f"bound), got {shown(timeout, width=60)}")
        waits = [asyncio.ensure_future(self._started.wait()), asyncio.ensure_future(self._ended.wait())]
        try:
            await asyncio.wait(waits, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for waiting in waits:
                waiting.cancel()
        if self._started.is_set():
            return
        if not self._ended.is_set():
            raise TimeoutError(f"the job runtime did not start within {timeout:g} s")
        if isinstance(self._ended_by, Exception):
            raise self._ended_by  # as awaiting run()'s task raises it
        if isinstance(self._ended_by, asyncio.CancelledError):
            # Not raised as such: this waiter was not cancelled, and a CancelledError here would
            # read as its own cancellation to the code awaiting it.
            raise LivepushError("the job runtime did not start: the task running its run() was cancelled before it "
                                "started; to stop a runtime call stop() and await run() (it drains), and make a new "
                                "Runtime(...) to run again")
        raise LivepushError("the job runtime stopped before it started: stop() (or a stop signal) came while it "
                            "opened; make a new Runtime(...) to run again")

    async def run(self) -> None:
        """Run until stopped; returns after a clean drain (the CLI then exits 0). Raises
        DependencyError when a side task failed for good (after draining)."""
        if self._ran:
            # Its stop and closing events stay set: a second run would return at once, as if it
            # had served, while the jobs it was meant to run waited for nothing.
            raise ConfigError("this job runtime already ran: a Runtime runs once: make a new Runtime(...) to run again")
        self._ran = True
        self._take_up_new_queues()  # of jobs defined since it was made
        self._schedules = SCHEDULES.read(self, self.registry, self.queues, every_queue=self._every_queue)
        try:
            await self._run_once()
        except BaseException as exc:
            self._ended_by = exc
            raise
        finally:
            SCHEDULES.done_reading(self)
            self._ended.set()

    async def _run_once(self) -> None:
        # Before it registers, so that a scrape never sees it serving a queue whose counters are missing.
        metrics.count_queues(self.queues)
        loop = asyncio.get_running_loop()
        installed: list[int] = []
        # Before _open(), which registers: a signal that comes while the runtime starts must drain
        # and deregister it too, not end the process with the default action.
        if self.install_signals:
            for sig in stopsignals.STOP_SIGNALS:
                try:
                    loop.add_signal_handler(sig, self._on_signal, sig)
                    installed.append(sig)
                except (NotImplementedError, RuntimeError):
                    pass  # not the main thread: the embedder calls stop()
        try:
            try:
                opened = await self._open_unless_stopped()
            except BaseException:
                # What it started before the failure (its completer, its pools, perhaps its row)
                # goes with it: an app that starts it again would pile them up on its loop.
                await self._close()
                raise
        except BaseException:
            self._uninstall_signals(loop, installed)
            raise
        if not opened:  # stopped while it opened: what it had opened goes, as after a failure
            try:
                await self._close()
            finally:
                self._uninstall_signals(loop, installed)
            log.info("job runtime stopped before it started")
            return
        failure: str | None = None
        try:
            self._tasks = [
                supervise("livepush-jobs-producer", self._produce),
                supervise("livepush-jobs-heartbeat", self._beat_loop),
                supervise("livepush-jobs-housekeeping", self._housekeep),
                supervise("livepush-jobs-promoter", self._promote),
            ]
            if self._schedules:
                scheduler = Scheduler(self._schedules)
                self._tasks.append(supervise("livepush-jobs-periodic", lambda: self._schedule(scheduler)))
            elsewhere = SCHEDULES.elsewhere(self.registry, self.queues)
            if elsewhere:
                # With no runtime serving its queue, a periodic job is never enqueued, and never
                # listed by `livepush status` either: said where the queues that left it out are.
                log.info("periodic jobs on queues this runtime does not serve, scheduled only by runtimes that "
                         "serve them: %s", ", ".join(f"{s.name} (queue {s.function.queue})" for s in elsewhere))
            self._started.set()
            log.info("job runtime %s running: queues %s, concurrency %s", self.id, ",".join(self.queues),
                     self.concurrency)
            stop_waiter = asyncio.create_task(self._stop.wait())
            assert self._completer_task is not None
            done, _ = await asyncio.wait([stop_waiter, *self._tasks, self._completer_task],
                                         return_when=asyncio.FIRST_COMPLETED)
            if not self._stop.is_set():
                stop_waiter.cancel()
                for t in done:
                    if t is not stop_waiter:
                        failure = f"{t.get_name()}: {t.exception() if not t.cancelled() else 'cancelled'}"
                        log.error("job runtime %s: %s; stopping", self.id, failure)
                self.stop()
            await self._drain()
        finally:
            try:
                await self._close()
            finally:
                # Only once closed: a second signal during the close (the last outcomes being
                # written, the deregistration) must not end the process with the default action.
                self._uninstall_signals(loop, installed)
        if failure is not None:
            raise DependencyError(f"the job runtime stopped because a part of it failed for good ({failure})")

    def _said(self, value: Any) -> Any:
        """What the runtime's warnings show of `value`: an error as as_warned() says it (a grant
        the role lacks with `livepush migrate --runtime-role ROLE`, where the driver names only
        the table), anything else as it is. The loops that warn run once _open() set the URL."""
        if isinstance(value, BaseException) and self.url is not None:
            return as_warned(self.url, value)
        return value

    # -- startup and shutdown --------------------------------------------------------------
    async def _open_unless_stopped(self) -> bool:
        """_open(), given up (False) when a stop is asked for first: the runtime holds no job yet,
        so there is nothing to drain, and a database that does not answer would otherwise hold
        the stop for its connect timeout and end it as a failure."""
        opening = asyncio.create_task(self._open(), name="livepush-jobs-open")
        try:
            await _done_or_set(opening, self._stop)
        finally:
            if not opening.done():
                opening.cancel()
                await asyncio.gather(opening, return_exceptions=True)  # unwound before _close()
        if opening.cancelled():
            return False
        try:
            opening.result()  # its failure, raised here
        except psycopg.Error as exc:
            # A statement the database refused (a grant the role lacks): one line naming what to
            # run, as the server says it, not the driver's traceback.
            raise translate(self.url or database.database_url(), exc) from exc
        return True

    async def _open(self) -> None:
        url = self.url or database.database_url()
        self.url = url
        await migrate.acheck_schema(url, "the job runtime")
        self._pools = LoopPools(url, name="livepush-jobs-runtime", min_size=2, max_size=6, autocommit=False)
        self._pool = await self._pools.aget()
        # The heartbeat's own connection: on the shared pool it waited behind job work (parks held
        # up by a signal(conn=) transaction left open, one connection each), and a live runtime
        # silent for three beats was presumed dead, its jobs run again elsewhere.
        self._beat_pools = LoopPools(url, name="livepush-jobs-beat", min_size=1, max_size=1, autocommit=False)
        self._beat_pool = await self._beat_pools.aget()
        self._group_progress = ProgressPublisher(self._pool)
        self._group_progress.start()
        self._completer = Completer(self._pool, flush_delay=self.flush_delay, groups=self._group_progress,
                                    on_ended=self._on_ended)
        # Not restarted: the completer already retries whatever can succeed later (connection
        # trouble, conflicts, a refused outcome written alone: completer.py), so what it raises
        # would be raised again on the same queued outcome. And while it is down the producer goes
        # on claiming: every job run meanwhile has no outcome written, is given back at
        # deregistration and runs again. So the first failure stops the runtime.
        self._completer_task = supervise("livepush-jobs-completer", self._completer.run, give_up=1)
        # Threads for sync jobs. A timed-out sync job keeps its thread until it returns, so leave
        # headroom beyond the concurrency (and see _thread_stuck).
        self._threads = self._thread_pool()
        if self._listen:
            listener = self._listener.get()
            listener.add(queries.READY_CHANNEL, self._on_ready_ring, on_resync=self._on_ready_resync)
            listener.add(queries.CANCEL_CHANNEL, self._on_cancel_ring, on_resync=self._on_cancel_resync)
            listener.add(queries.GROUP_PROGRESS_CHANNEL, self._on_group_ring, on_resync=self._on_group_resync)
            await listener.start()
        self.state = "running"
        self.id = await maintenance.register(self._pool, self.info)
        self._reconciled_at = asyncio.get_running_loop().time()  # a new runtime's id holds nothing yet
        self._registry_seen = self.registry.changes
        written = limits.definitions(self.registry)
        await limits.store(self._pool, self.registry)
        self._limits_written = written
        await self._read_limited(self._pool)
        self._read_step_names()
        # The heartbeat's first round (right after this) rescues what they held. Their progress
        # publishers' unflushed groups are rung by ours.
        if await maintenance.prune_gone_on_node(self._pool, self.id):
            self._group_progress.mark(await maintenance.unrung_groups(self._pool))
        await self._publish_state("running")

    async def _drain(self) -> None:
        self.state = "draining"
        await self._unless_stopped_now(self._publish_state("draining"), "publishing the runtime's state")
        if self.in_hand:
            log.info("draining: waiting up to %g s for %d jobs in hand", self.shutdown_timeout, len(self.in_hand))
            ended = asyncio.create_task(self.in_hand_ended())
            now_waiter = asyncio.create_task(self._stop_now.wait())
            try:
                await asyncio.wait([ended, now_waiter], timeout=self.shutdown_timeout,
                                   return_when=asyncio.FIRST_COMPLETED)
            finally:
                ended.cancel()
                now_waiter.cancel()
        if self.in_hand:
            log.warning("giving back %d jobs in hand (attempt not spent)", len(self.in_hand))
            await self._claim_on_its_way()
            self.release_all()
        await self._close_completer()

    async def _claim_on_its_way(self) -> None:
        """Wait for a claim under way to return. Executed after the give-back committed, it would
        take those jobs again: given back at once unrun, yet each would show a start it never had."""
        if self._claim_returned.is_set():
            return
        try:
            await self._unless_stopped_now(asyncio.wait_for(self._claim_returned.wait(), CLAIM_RETURN_WAIT),
                                           "waiting for the claim on its way")
        except TimeoutError:
            log.warning("a claim still had not returned after %g s; giving back the jobs in hand anyway",
                        CLAIM_RETURN_WAIT)

    async def in_hand_ended(self) -> None:
        """Return once no job is in hand. Not once their tasks have ended: a job that swallows
        its timeout's or its cancel's cancellation is ended without its task (_time_out), which
        runs on."""
        while self.in_hand:
            self._slot_freed.clear()
            await self._slot_freed.wait()

    async def _close_completer(self) -> None:
        if self._completer is None or self._completer_task is None:
            return
        self._completer.closing()
        task, self._completer_task = self._completer_task, None
        try:
            await self._unless_stopped_now(task, "writing the last outcomes")
        except Exception as exc:  # gave up: what it could not write is given back at deregistration
            log.error("the completer stopped (%s); outcomes not written are given back at deregistration", exc)

    def release_all(self) -> None:
        """Give back every job in hand, attempt not spent; but for one past its timeout that has
        not ended yet (in its grace: _time_out): its attempt failed by the timeout already, and
        given back it would run again as if it had not."""
        assert self._completer is not None
        for entry in list(self.in_hand.values()):
            ctx = entry.ctx
            if ctx._released:
                continue
            ctx._released = True
            self._completer.submit(timeout_failure(self.registry.find(ctx._job.name), ctx) if ctx._timed_out
                                   else Outcome(ctx, "released"))
            entry.task.cancel()
            self._deadlines.discard(entry.deadline, ctx.job_id)
        self.in_hand.clear()

    async def _unless_stopped_now(self, aw: Awaitable[T], what: str) -> T | None:
        """Await `aw` during the stop, but once a second signal came (stop(now=True)) for no longer
        than STOP_NOW_GRACE seconds after it: then cancel it and return None. Every write of the stop waits for Postgres
        (pool timeouts, the completer's retries): while it is down they would hold the process
        for as long as the outage, and the second signal is the operator's way out."""
        task = asyncio.ensure_future(aw)
        await _done_or_set(task, self._stop_now)
        if not task.done():
            # A healthy Postgres takes them in milliseconds: the jobs given back then keep their
            # attempt, where the rescue would count it.
            assert self._stopped_now_at is not None
            await asyncio.wait([task], timeout=max(self._stopped_now_at + STOP_NOW_GRACE - time.monotonic(), 0.0))
        if task.done():
            return task.result()
        task.cancel()
        log.error("second signal: gave up on %s (Postgres unreachable?); the rescue releases what this "
                  "runtime still holds once the others find it dead", what)
        await asyncio.wait([task], timeout=1.0)
        return None

    async def _pause(self, seconds: float) -> None:
        """Sleep, but wake at once when the runtime closes."""
        try:
            await asyncio.wait_for(self._closing.wait(), seconds)
        except TimeoutError:
            pass

    async def _close(self) -> None:
        # Side tasks end at their next loop turn even if a cancellation is lost inside a database
        # call (psycopg may turn it into QueryCanceled); re-cancel until they are gone.
        self._closing.set()
        pending = {t for t in [*self._tasks, self._cancel_check, self._state_publish, self._rescuing,
                               self._limits_writing] if t is not None}
        while pending:
            for task in pending:
                task.cancel()
            _, pending = await asyncio.wait(pending, timeout=1.0)
            if pending:
                log.warning("side tasks %s still stopping", [t.get_name() for t in pending])
        self._tasks = []
        if self._reconcile_wake is not None:
            # The producer's wake at the next reconcile (_wake_for_reconcile): left armed on a loop
            # that goes on (an app's), it held this stopped runtime for up to a reconcile period.
            self._reconcile_wake.cancel()
            self._reconcile_wake = None
        try:
            await self._close_completer()
        except Exception as exc:
            log.error("could not write the last outcomes (%s): those jobs are given back at deregistration", exc)
        self.state = "stopped"
        if self._pool is not None and self.id is not None:
            try:
                deregistered = await self._unless_stopped_now(maintenance.deregister(self._pool, self.id),
                                                              "deregistering")
                if deregistered is not None:
                    given_back, touched = deregistered
                    if given_back:
                        log.warning("gave back %d jobs still marked as ours at deregistration", given_back)
                    if self._group_progress is not None:
                        self._group_progress.mark(touched)
                    await self._unless_stopped_now(self._publish_state("stopped"), "publishing the runtime's state")
            except _DB_ERRORS as exc:
                log.error("could not deregister runtime %s (%s): its jobs are released once it is found dead",
                          self.id, self._said(exc))
        if self._group_progress is not None:
            await self._unless_stopped_now(self._group_progress.close(), "publishing the last group progress")
            self._group_progress = None
        await self._listener.aclose()
        if self._pools is not None:
            await self._pools.aclose()
        if self._beat_pools is not None:
            await self._beat_pools.aclose()
        if self._claim_conn is not None:
            await self._claim_conn.close()
            self._claim_conn = None
        if self._threads is not None:
            # Threads still running (timed-out or given-back sync jobs) are not waited for.
            self._threads.shutdown(wait=False, cancel_futures=True)
        if self.id is not None:  # else it failed to start, and said why
            log.info("job runtime %s stopped", self.id)

    def _uninstall_signals(self, loop: asyncio.AbstractEventLoop, installed: list[int]) -> None:
        """Take our handlers off; once a signal stopped this runtime, later ones are ignored."""
        stopsignals.remove_handlers(loop, installed, ignore=self._signalled)

    def _on_signal(self, sig: int) -> None:
        self._signalled = True
        if self._stop.is_set():
            log.warning("second %s: giving back the jobs in hand now", signal.Signals(sig).name)
            self.stop(now=True)
        else:
            log.info("%s: draining (a second signal gives the jobs back at once)", signal.Signals(sig).name)
            self.stop()

    async def _publish_state(self, event: str) -> None:
        """The runtime's own state on runtime:<id> and runtimes, for operators' pages. A failure is
        said as the other loops' are, at most once a minute: it comes at each beat that changes the
        jobs in hand for as long as the fan-out is away, while the jobs run on."""
        if self.publisher is None or self.id is None:
            return
        data = {"event": event, "runtime": self.info}
        for topic in (f"{topics.RUNTIME_PREFIX}{self.id}", topics.RUNTIMES_TOPIC):
            try:
                # Bounded: a fan-out that answers nothing (Redis frozen, or cut off with its
                # connections open) held a start, or a stop's drain and deregistration, for as long.
                await asyncio.wait_for(self.publisher.apublish(topic, data), STATE_PUBLISH_TIMEOUT)
            except TimeoutError:
                self._failures.warning("could not publish runtime state %s on %s: no answer within %g s; going on "
                                       "without it", event, topic, STATE_PUBLISH_TIMEOUT)
                return  # the other topic goes the same way
            except Exception as exc:  # informative only: the runtime goes on
                # The other topic is still tried: a refusal may be of this topic alone (an ACL
                # rule), and a second failure of the minute is counted, not said.
                reraise_if_cancelled()
                self._failures.warning("could not publish runtime state %s on %s: %s", event, topic, exc)

    # -- cancel requests ------------------------------------------------------------------
    def _on_ready_ring(self, payload: str) -> None:
        if payload == queries.QUEUES_RING:
            self._paused_read_at = None
        self._doorbell.set()

    def _on_ready_resync(self) -> None:
        # Rings may have been missed while the listener was away, a pause among them.
        self._paused_read_at = None
        self._doorbell.set()

    def _on_group_ring(self, payload: str) -> None:
        # Adds from outside a runtime that came too soon after their group's last event to ring
        # it: our publisher reads the rows and rings what changed, coalesced like our outcomes.
        if self._group_progress is not None:
            self._group_progress.mark(parse_ids(payload, queries.GROUP_PROGRESS_CHANNEL))

    async def _on_group_resync(self) -> None:
        # Rings missed while the listener was away: the groups whose counts no event has shown.
        if self._pool is not None and self._group_progress is not None:
            self._group_progress.mark(await maintenance.unrung_groups(self._pool))

    def _on_cancel_ring(self, payload: str) -> None:
        ids = parse_ids(payload, queries.CANCEL_CHANNEL)
        if not self._claim_returned.is_set():
            self._heard_while_claiming.update(i for i in ids if i not in self.in_hand)
        self._check_cancels([i for i in ids if i in self.in_hand])

    def _on_cancel_resync(self) -> None:
        """The listener was away, and cancels sent meanwhile were not heard: check every job in
        hand against its row now, rather than at the next heartbeat."""
        if not self._closing.is_set():
            self._check_cancels(list(self.in_hand))

    def _check_cancels(self, ids: Iterable[int]) -> None:
        """Confirm against the rows, then stop, the jobs in hand among `ids` whose cancel was
        requested (one check at a time, taking every id named meanwhile)."""
        self._cancels_due.update(ids)
        if not self._cancels_due:
            return
        if self._cancel_check is None or self._cancel_check.done():
            self._cancel_check = asyncio.create_task(self._confirm_cancels(), name="livepush-jobs-cancel-check")

    async def _confirm_cancels(self) -> None:
        """Cancel what the rows say was cancelled among the ids notifications named."""
        assert self._pool is not None and self.id is not None
        while self._cancels_due:
            ids, self._cancels_due = sorted(self._cancels_due), set()
            try:
                confirmed = await maintenance.cancel_requests(self._pool, self.id, ids)
            except _DB_ERRORS as exc:
                reraise_if_cancelled()
                self._failures.warning("could not check cancel requests (%s); the heartbeat checks them again", exc)
                return
            self._cancel_confirmed(confirmed)

    def _cancel_confirmed(self, job_ids: Iterable[int]) -> None:
        """Tell the jobs in hand among `job_ids`, whose rows say their cancel was requested, to
        stop. One INFO line for all of them (their ids at DEBUG): a group's cancel confirms
        hundreds at once, and a line each buried everything else the runtime said."""
        told = [job_id for job_id in job_ids if self._cancel_local(job_id)]
        if len(told) == 1:
            log.info("cancel requested: stopping job %s at its next await or progress call", told[0])
        elif told:
            log.info("cancel requested: stopping %d jobs in hand at their next await or progress call", len(told))
            log.debug("cancel requested: the jobs in hand told to stop: %s", ", ".join(map(str, sorted(told))))

    def _cancel_local(self, job_id: int) -> bool:
        """Tell the job `job_id` to stop; whether it was told now (not already, and in hand)."""
        entry = self.in_hand.get(job_id)
        if entry is None:
            if not self._claim_returned.is_set():  # confirmed before the claim that took it returned: see _claim
                self._heard_while_claiming.add(job_id)
            return False
        if entry.ctx._cancel_requested:
            return False
        entry.ctx._cancel_requested = True
        if entry.is_async:
            self._stop_async(entry)
        return True

    # -- producer -----------------------------------------------------------------------------
    async def _produce(self) -> None:
        more = True  # whether the last claim filled every slot (so more may be waiting)
        retry = Backoff(0.05, 5.0)
        while not self._stop.is_set():
            free = self.concurrency - len(self.in_hand)
            if free <= 0:
                if self._until_reconcile() <= 0:
                    # Every slot taken by long jobs: no claim comes to give back what a late claim
                    # left, so the reconcile runs here, between claims all the same.
                    await self._reconcile_between_claims()
                    continue
                self._slot_freed.clear()
                self._wake_for_reconcile()
                await self._slot_freed.wait()
                await self._settle()
                continue
            if not more:
                try:
                    await asyncio.wait_for(self._doorbell.wait(), self._idle_wait())
                except TimeoutError:
                    pass
                if self._stop.is_set():
                    break
                free = self.concurrency - len(self.in_hand)
                if free <= 0:
                    continue
            # Cleared before the claim: a doorbell during the claim is kept for the next round. A
            # name whose limits were dropped only has leftovers from older code: looked for every
            # poll interval, not on every ring.
            if self._doorbell.is_set():
                dropped = self.limits_dropped
                self._limited_empty = {k: at for k, at in self._limited_empty.items() if k[0] in dropped} \
                    if dropped else {}
            self._doorbell.clear()
            try:
                claimed = await self._claim(free)
                retry.reset()
            except _DB_ERRORS as exc:
                reraise_if_cancelled()
                self._failures.warning("claim failed (%s); retrying in about %.2f s", exc, retry.delay)
                # Or sooner, at a doorbell: the listener's resync rings it once Postgres is back,
                # so claims resume within about a second of its return, not at the backoff's
                # next turn (up to 7.5 s after a long outage or read-only spell).
                await retry.wait(self._doorbell)
                continue
            more = claimed >= free

    def _idle_wait(self) -> float:
        """Seconds to wait for the doorbell: the poll interval, or less when a claim (or the
        reconcile before it) is due sooner."""
        wait = min(self.poll_interval, self._until_reconcile())
        if self._claim_due is None:
            return wait
        return min(wait, max(self._claim_due - asyncio.get_running_loop().time(), 0.0))

    def _until_reconcile(self) -> float:
        """Seconds until the producer's next periodic give-back of the jobs it does not know."""
        return max(self._reconciled_at + self.reconcile_seconds - asyncio.get_running_loop().time(), 0.0)

    def _wake_for_reconcile(self) -> None:
        """Have the wait for a free slot end when the reconcile is due: one timer, moved only when
        the reconcile's time moves, where a timeout on each wait (a task per wait_for) would cost
        every claim round of a busy runtime."""
        due = self._reconciled_at + self.reconcile_seconds
        if self._reconcile_wake is not None and self._reconcile_wake.when() == due:
            return
        if self._reconcile_wake is not None:
            self._reconcile_wake.cancel()
        self._reconcile_wake = asyncio.get_running_loop().call_at(due, self._slot_freed.set)

    async def _reconcile_between_claims(self) -> None:
        """The periodic give-back while every slot is taken, its failure logged (the claims' own
        path raises it as a failed claim): tried again a reconcile period later."""
        try:
            await self._release_unheard()
        except _DB_ERRORS as exc:
            reraise_if_cancelled()
            self._failures.warning("giving back jobs this runtime does not know failed (%s); trying again in "
                                   "%g s", exc, self.reconcile_seconds)

    async def _settle(self) -> None:
        """Yield while jobs are still finishing, so that the next claim is a batch rather than one
        job at a time (jobs that end together take a few loop turns to return). Bounded: a steady
        trickle of slow jobs must not hold the claim back."""
        before = len(self.in_hand)
        for _ in range(4):
            await asyncio.sleep(0)
            now = len(self.in_hand)
            if now == before:
                return
            before = now

    async def _claim_connection(self) -> psycopg.AsyncConnection:
        conn = self._claim_conn
        # A connection the server closed while it sat between claims (idle_session_timeout, a
        # restart, pg_terminate_backend) is replaced before the claim, not found by its failure;
        # the check costs no round trip while the connection is live.
        if conn is not None and not (conn.closed or conn.broken) and await aclosed_while_idle(conn):
            log.info("the claim connection was closed by the server while idle; claiming on a new one")
            await conn.close()
        if conn is None or conn.closed or conn.broken:
            if conn is not None:
                await conn.close()
            self._claim_conn = None
            assert self.url is not None
            # prepare_threshold=0: the claim is prepared from its first run, not its sixth (the
            # first claims of an idle runtime are its pickup latency); never, with
            # LIVEPUSH_PREPARED_STATEMENTS=off (connect.statement_options).
            conn = await aconnect(self.url, prepare_threshold=0)
            self._claim_conn = conn
        return conn

    async def _claim(self, free: int) -> int:
        """Claim up to `free` jobs and start them; how many were claimed. The cancels heard while
        it ran, of jobs not then in hand, are checked once its jobs have started."""
        self._claim_returned.clear()
        try:
            return await self._claim_starting(free)
        finally:
            self._claim_returned.set()
            heard, self._heard_while_claiming = self._heard_while_claiming, set()
            if not self._closing.is_set():  # no new side task once _close() is stopping them
                self._check_cancels([i for i in heard if i in self.in_hand])

    async def _claim_starting(self, free: int, reopened: bool = False) -> int:
        rows: list[dict[str, Any]] = []
        if self.registry.changes != self._registry_seen:
            self._registry_seen = self.registry.changes
            self._hold_late_definitions(self._late_definitions())
            self._include_defined()
            self._read_step_names()
        self._take_up_new_queues()
        if self._queues_unwritten:
            # Before it claims there: a job it runs is on a queue its row lists.
            assert self._pool is not None and self.id is not None
            await maintenance.set_queues(self._pool, self.id, self.queues)
            self._queues_unwritten = False
        params: dict[str, Any] = {"excluded": sorted(self.excluded), "runtime_id": self.id}
        limited = [n for n in self.limited if n not in self.excluded]
        if len(limited) > 1:
            limited = limits.in_turn(limited, self.registry, self._limited_turn)
            self._limited_turn += 1
        self._claim_due = None
        if self._claims_unheard or self._until_reconcile() <= 0:
            await self._release_unheard()
            self._claims_unheard = False
        # Each queue's plain claim is one statement in autocommit: one round trip, no BEGIN/COMMIT.
        kept = self._claim_conn
        conn = await self._claim_connection()
        held = conn is kept  # kept from an earlier claim, not opened for this one
        busy = False  # whether a step claim passed over steps whose run's row was busy
        try:
            async with conn.cursor(row_factory=dict_row) as cur:
                now = asyncio.get_running_loop().time()
                if self._paused_read_at is None or now - self._paused_read_at >= PAUSED_REFRESH_SECONDS:
                    await cur.execute(queries.PAUSED_QUEUES)
                    self.paused = frozenset(r["queue"] for r in await cur.fetchall())
                    self._paused_read_at = now
                for queue in self.queues:
                    if queue in self.paused:
                        continue
                    for name in limited:
                        empty_at = self._limited_empty.get((name, queue))
                        if free - len(rows) > 0 and (empty_at is None or now - empty_at >= self.poll_interval):
                            await self._claim_limited(conn, name, queue, free - len(rows), rows)
                    want = free - len(rows)
                    if want > 0 and self.step_names:
                        # Before the plain claim, like the limited one: a queue's backlog of plain
                        # jobs never holds a run's next step back.
                        await cur.execute(workflow_queries.CLAIM_STEPS, {
                            "queue": queue, "limit": want, "names": self.step_names, "runtime_id": self.id})
                        claimed = await cur.fetchall()
                        busy = busy or bool(claimed[0]["busy"])
                        claimed = [row for row in claimed if row["id"] is not None]
                        if claimed:
                            rows.extend(claimed)
                            metrics.JOBS_CLAIMED.labels(queue).inc(len(claimed))
                        want = free - len(rows)
                    if want <= 0:
                        break
                    params["queue"], params["limit"] = queue, want
                    await cur.execute(queries.CLAIM, params)
                    claimed = await cur.fetchall()
                    if claimed:
                        rows.extend(claimed)
                        metrics.JOBS_CLAIMED.labels(queue).inc(len(claimed))
        except psycopg.Error as exc:
            self._claims_unheard = True
            if not rows and held and not reopened and conn.broken:
                # A connection kept open between claims that Postgres closed while it was idle
                # (idle_session_timeout, a restart, pg_terminate_backend) is only found now: a
                # routine event, not a failed claim. Claim again at once on a new one (after
                # giving back what a statement may have taken unheard); a second failure is one.
                reraise_if_cancelled()
                log.info("the claim connection was closed by the server (%s); claiming again on a new one", exc)
                return await self._claim_starting(free, reopened=True)
            # Earlier queues' claims are committed: those jobs are ours and must run.
            if not rows:
                raise
            reraise_if_cancelled()
            log.warning("claim failed after %d jobs were claimed (%s); running those", len(rows), self._said(exc))
        self._retry_if_busy(busy)
        assert self._completer is not None
        for row in rows:
            job = ClaimedJob.from_row(row)
            self._completer.started(job)
            if self._stop.is_set():
                # A claim on its way when the stop came: the drain no longer waits for these, so
                # started they would be cut off when it ends. Give them back untouched (attempt
                # not spent); should the completer have closed already, deregistration does.
                ctx = JobContext(job, self._completer, pool=self._pool, url=self.url)
                ctx._released = True
                self._completer.submit(Outcome(ctx, "released"))
                continue
            self._start(job)
        return len(rows)

    def _retry_if_busy(self, busy: bool) -> None:
        """After a claim round: when its step claims passed over steps whose run's row someone
        held, claim again soon (BUSY_RUN_RETRY, doubling while rounds find runs busy), not only at
        the next ring or poll."""
        if not busy:
            self._busy_retry = BUSY_RUN_RETRY
            return
        due = asyncio.get_running_loop().time() + self._busy_retry
        self._claim_due = due if self._claim_due is None else min(self._claim_due, due)
        self._busy_retry = min(self._busy_retry * 2, self.poll_interval)

    def _include_defined(self) -> None:
        """Claim again the names given back as unknown whose function was defined since (their
        module imported after this runtime claimed one of their jobs): skipping them for as long
        as it runs would leave their jobs to another runtime, or to none."""
        defined = {name for name in self.excluded if self.registry.find(name) is not None}
        if defined:
            self.excluded -= defined
            log.info("job names %s were defined after this job runtime gave their jobs back: claiming them again",
                     ", ".join(sorted(defined)))

    def _take_up_new_queues(self) -> None:
        """A runtime made without `queues` serves the queues of jobs defined since it started (their
        module imported later), in the order a start would give them (sorted); one given its
        `queues` keeps them. A queue is never dropped: jobs enqueued there may still wait."""
        if not self._every_queue or self.registry.changes == self._queues_seen:
            return
        self._queues_seen = self.registry.changes
        new = [queue for queue in self.registry.queues() if queue not in self.queues]
        if not new:
            return
        self.queues = sorted({*self.queues, *new})
        metrics.count_queues(new)
        if self.id is None:
            return  # not registered yet: its row will list them, and its periodic jobs are read after
        self._queues_unwritten = True
        log.info("job runtime %s now serves queues %s too: jobs defined since it started use them", self.id,
                 ",".join(new))

    def _read_step_names(self) -> None:
        """Every step whose function is registered here, read from the registry: a workflow name
        defined twice (two modules) keeps the steps of both, and each one's runs go on. Read at the
        start and again when the registry counts new registrations, so that the steps of a
        workflow defined later in this process (a module imported after the start) are claimed."""
        self.step_names = [name for name in self.registry.names()
                           if getattr(self.registry.find(name), "_step_of", None) is not None]

    async def _release_unheard(self) -> None:
        """Give back (attempt not spent) the jobs a failed claim committed to this runtime without
        its reply reaching it: `running` under its id, unknown here, nothing would ever end them
        while it lives. Run after a failed claim and every `reconcile_seconds` (a claim can commit
        after the first). Every other job running under its id is in hand, or has its outcome
        waiting in the completer: only this producer claims, and it is here, between claims, with
        every row of its last claim started (_start puts a job in hand, or its give-back in the
        completer, in the loop turn the claim returned in). The ids it keeps are read before the
        statement goes out: a job among them that ends meanwhile is no longer `running`, and the
        completer forgets an outcome only once its write committed."""
        assert self._pool is not None and self._completer is not None and self.id is not None
        self._reconciled_at = asyncio.get_running_loop().time()  # a failure too waits a period to try again
        given_back, touched = await maintenance.release_unknown(self._pool, self.id,
                                                                [*self.in_hand, *self._completer.pending()])
        if given_back:
            log.warning("gave back %d job%s running under this runtime's id that it did not know: a claim whose "
                        "reply never reached it (its connection broke) had taken them", given_back,
                        "" if given_back == 1 else "s")
        if touched and self._group_progress is not None:
            self._group_progress.mark(touched)

    async def _claim_limited(self, conn: psycopg.AsyncConnection, name: str, queue: str, want: int,
                             rows: list[dict[str, Any]]) -> None:
        """Claim jobs of one name with limits into `rows`, and note when its next token is due.

        One claim reads a bounded number of candidates in claim order, then keeps each key's free
        slots among them: a key with a longer backlog than that fills the read, and the keys
        behind it are not reached. So while a claim started some jobs but fewer than wanted (and
        no bucket held any back), claim again: the next one counts those running, passes a key
        they filled and reaches the others. Each claim is committed on its own: what one took
        is ours even if the next fails."""
        got = 0
        while True:
            claimed, wait = await limits.claim(conn, name, queue, want - got, self.id)
            if claimed:
                rows.extend(claimed)
                got += len(claimed)
                metrics.JOBS_CLAIMED.labels(queue).inc(len(claimed))
            if not claimed or got >= want or wait is not None:
                break
        if got or wait is not None:
            self._limited_empty.pop((name, queue), None)
        else:
            self._limited_empty[(name, queue)] = asyncio.get_running_loop().time()
        if wait is not None:
            due = asyncio.get_running_loop().time() + wait
            self._claim_due = due if self._claim_due is None else min(self._claim_due, due)

    def _start(self, job: ClaimedJob) -> None:
        assert self._completer is not None
        ctx = JobContext(job, self._completer, pool=self._pool, url=self.url, group_progress=self._group_progress,
                         threads=self._threads)
        fn = self.registry.find(job.name)
        if fn is None:
            # A rolling deploy: a newer runtime enqueued a job this one does not know. Give it back
            # for a runtime that does, and skip that name here until it is defined (_include_defined).
            log.warning("job %s has the unknown name %r: giving it back and skipping that name until it is "
                        "defined here (%s)",
                        job.id, job.name, _fix_for_unknown(job.name))
            self.excluded.add(job.name)
            ctx._released = True
            self._completer.submit(Outcome(ctx, "released"))
            return
        task = asyncio.create_task(self._run_job(fn, ctx), name=f"livepush-job-{job.id}")
        entry = self.in_hand[job.id] = _InHand(ctx, task, fn._is_async)
        self.peak_in_hand = max(self.peak_in_hand, len(self.in_hand))
        if ctx._cancel_requested and fn._is_async:
            self._stop_async(entry)

    def _stop_async(self, entry: _InHand) -> None:
        """Cancel a cancelled async job's task, and give it TIMEOUT_GRACE seconds to end (_time_out).

        Not before the task ran its first step: a task cancelled before that never enters its
        coroutine, so _run_job's handlers and its `finally` never run, and the job was neither
        ended nor let go of (its slot taken and its row `running` until the runtime stopped). Its
        first step is already in the loop's queue (create_task put it there), so this, queued
        after it, comes once the job awaits (and once its timeout is armed, which it replaces)."""
        def stop() -> None:
            if self.in_hand.get(entry.ctx.job_id) is not entry or entry.task.done():
                return
            entry.task.cancel()
            self._deadlines.discard(entry.deadline, entry.ctx.job_id)
            entry.deadline = self._deadlines.add(entry.ctx.job_id, TIMEOUT_GRACE, entry)

        asyncio.get_running_loop().call_soon(stop)

    def _on_ended(self, names: Iterator[str]) -> None:
        """The completer committed outcomes of jobs with these names. A limited one's slot is free
        in the database only now (a claim made as its function returned still saw it running), and
        nothing else rings for it: claim again, past any note that its name had nothing to start."""
        if not self.limited:
            return
        ended = set(names).intersection(self.limited)
        if not ended:
            return
        for key in [k for k in self._limited_empty if k[0] in ended]:
            del self._limited_empty[key]
        self._doorbell.set()

    def _arm(self, fn: Any, ctx: JobContext) -> None:
        """Start an async job's timeout, just before its function runs (execute() calls this; sync
        jobs keep their own: their threads cannot be cancelled anyway)."""
        entry = self.in_hand.get(ctx.job_id)
        if entry is not None and entry.ctx is ctx:
            entry.deadline = self._deadlines.add(ctx.job_id, fn.timeout, entry)

    def _thread_pool(self) -> JobThreads:
        self._stuck_threads = 0
        return JobThreads(self.concurrency * 2, "livepush-job")

    def _thread_stuck(self, pool: concurrent.futures.Executor | None) -> Callable[[], None]:
        """A sync job's thread runs on past its timeout. With as many of them hung in the pool as
        there are slots, the pool has no thread left for a slot's next sync job: it would wait in
        the pool's queue until its own timeout failed it, never run, and so would every sync job
        after it. A fresh pool then takes the new jobs; the old one's threads end with their
        functions (they hold nothing: their leases are gone). It is not shut down: jobs started
        before hold it as `ctx._threads` (a checkpoint's or a workflow step's sync function runs
        there), and a shut-down pool refuses work; once nothing holds it, its idle threads end.
        Returns what to call once the thread has ended: it no longer holds a thread of the pool."""
        assert self._threads is not None
        if pool is not self._threads:  # a thread of a pool already replaced: it holds none of ours
            return _nothing
        self._stuck_threads += 1
        if self._stuck_threads >= self.concurrency:
            log.warning("%d sync jobs' threads run on past their timeouts: new sync jobs get a fresh thread pool",
                        self._stuck_threads)
            self._threads = self._thread_pool()

        def ended() -> None:
            if self._threads is pool:
                self._stuck_threads -= 1

        return ended

    def _time_out(self, entry: _InHand) -> None:
        """An async job ran past its timeout: cancel it; execute() makes that a TimeoutError failure.
        One still running TIMEOUT_GRACE seconds after it was cancelled (by its timeout, or by
        jobs.cancel(): _stop_async) swallows its cancellation: it ends here, failed by its timeout
        or cancelled, and its slot is freed, as a sync job's past its timeout is; its task runs on
        unheeded."""
        if self.in_hand.get(entry.ctx.job_id) is not entry or entry.task.done():
            return
        ctx = entry.ctx
        if not ctx._timed_out and not ctx._cancel_requested:
            ctx._timed_out = True
            entry.task.cancel()
            entry.deadline = self._deadlines.add(ctx.job_id, TIMEOUT_GRACE, entry)
            return
        assert self._completer is not None
        log.warning("async job %s (%s) did not end within %g s of being cancelled (it swallows "
                    "cancellations): it ends now, %s, and its slot is freed; its task runs on, its outcome "
                    "ignored", ctx.job_id, ctx._job.name, TIMEOUT_GRACE,
                    "cancelled" if ctx._cancel_requested else "its attempt failed by its timeout")
        outcome = (Outcome(ctx, "cancelled", error="cancelled") if ctx._cancel_requested
                   else timeout_failure(self.registry.find(ctx._job.name), ctx))
        # Released: whatever the task still does (its outcome, its progress) is dropped, and
        # _run_job's end finds its slot already given up.
        ctx._released = True
        self._completer.submit(outcome)
        del self.in_hand[ctx.job_id]
        entry.task.cancel()
        self._slot_freed.set()

    async def _run_job(self, fn: Any, ctx: JobContext) -> None:
        assert self._completer is not None
        try:
            outcome = await execute(fn, ctx, self._threads, self._arm, self._thread_stuck)
            if outcome is not None and not ctx._released:
                self._completer.submit(outcome)
            elif outcome is None and not ctx._released:
                # Parked (or its claim lost): the completer writes nothing, and a limited job's
                # slot is already free in the database, which nothing else rings for.
                self._on_ended(iter((ctx._job.name,)))
        except asyncio.CancelledError:
            if not ctx._released:
                ctx._released = True
                self._completer.submit(Outcome(ctx, "released"))
            raise
        finally:
            entry = self.in_hand.get(ctx.job_id)
            if entry is not None and entry.ctx is ctx:
                del self.in_hand[ctx.job_id]
                self._deadlines.discard(entry.deadline, ctx.job_id)
            self._slot_freed.set()

    # -- heartbeat, rescue, promotion -------------------------------------------------------------
    async def _beat_loop(self) -> None:
        assert self._beat_pool is not None and self.id is not None
        pool = self._beat_pool
        last_in_hand = -1
        # While this runtime could not beat, the others may not have been able to either (Postgres
        # down, a network between): their silence then says nothing. `since` is when its own
        # beats came back (database time), and the rescue counts only silence after it. A beat
        # that failed, one that waited out the outage for a connection (more than two beats after
        # the last), and one that found this runtime pruned each show a spell without contact.
        # A forward step of the database's clock (a correction, a host resumed) shows the same:
        # another runtime's last beat looks older than it is. Seen here as the database's time
        # running ahead of this process's own (monotonic) by more than CLOCK_STEP. Each beat's
        # offset between the two is read as the beat returns: a late return (a wait, a loop held
        # up by a job) only lowers it, so it is compared with the highest of the last few.
        since: datetime | None = None
        last_at: datetime | None = None
        offsets: collections.deque[float] = collections.deque(maxlen=CLOCK_SAMPLES)
        lost = False
        loop = asyncio.get_running_loop()
        while not self._closing.is_set():
            try:
                beat_at, kept = await maintenance.beat(pool, self.info)
                offset = beat_at.timestamp() - loop.time()
                if offsets and offset > max(offsets) + CLOCK_STEP:
                    lost = True
                offsets.append(offset)
                if last_at is not None and (beat_at - last_at).total_seconds() > 2 * self.heartbeat:
                    lost = True
                if lost or not kept:
                    since = beat_at
                last_at, lost = beat_at, False
                await self._read_limited(pool)
                if self._rescuing is None or self._rescuing.done():
                    # Not awaited: a rescue ends the jobs it finds (counts them in their groups,
                    # ends workflow steps), which waits at any lock an open transaction holds
                    # there; awaited, it silenced this live runtime for as long, and the others
                    # presumed it dead and ran its jobs again. One at a time, each after a beat
                    # that set `since`, which holds for that beat only: a rescue that runs after a
                    # later beat prunes nobody (maintenance.rescue).
                    self._rescuing = asyncio.create_task(self._rescue(since, beat_at), name="livepush-jobs-rescue")
                self._cancel_confirmed(await maintenance.cancel_requests(pool, self.id))
                if len(self.in_hand) != last_in_hand and (self._state_publish is None or self._state_publish.done()):
                    last_in_hand = len(self.in_hand)
                    # Not awaited: a fan-out that does not answer (Redis frozen, or cut off with its
                    # connections open) held up the beat, and a live runtime silent for three beats
                    # was presumed dead, its jobs run again elsewhere. One at a time; what changes
                    # meanwhile goes out with a later beat.
                    self._state_publish = asyncio.create_task(self._publish_state(self.state),
                                                              name="livepush-jobs-state")
            except _DB_ERRORS as exc:
                reraise_if_cancelled()
                lost = True
                self._failures.warning("heartbeat failed (%s); trying again next beat", exc)
            await self._pause(self.heartbeat)

    async def _read_limited(self, pool: AsyncPool) -> None:
        """Read the names that take the limited claim (limits.names()), but for functions defined
        since their limits were written (_hold_late_definitions)."""
        self.limited, self.limits_dropped = await limits.names(pool, self.registry)
        self._hold_late_definitions(self._late_definitions())

    def _late_definitions(self) -> dict[str, Limits | None]:
        """The functions whose limits as defined now are not those this runtime wrote: defined (or
        defined again with other limits) since it started."""
        written = self._limits_written
        return {name: lim for name, lim in limits.definitions(self.registry).items()
                if name not in written or written[name] != lim}

    def _hold_late_definitions(self, late: dict[str, Limits | None]) -> None:
        """Keep these names out of the limited claim until a side task has written their limits.
        Their jobs, marked limited by their enqueue, wait meanwhile: the limited claim would hold
        them for ever with no row of the name, and run them past the new limits with a row an
        older definition left without any."""
        if not late:
            return
        self.limited = [name for name in self.limited if name not in late]
        if self._closing.is_set():
            return  # _close() is ending the side tasks: no new one
        if self._limits_writing is None or self._limits_writing.done():
            self._limits_writing = asyncio.create_task(self._write_late_limits(), name="livepush-jobs-limits")

    async def _write_late_limits(self) -> None:
        """Write the limits of functions defined since this runtime started, as a start writes
        them (limits.store(): under the same table lock, marking their jobs enqueued before), then
        let the limited claim take their jobs. Off the heartbeat: the marking may wait seconds
        for rows others hold."""
        assert self._pool is not None
        try:
            while late := self._late_definitions():
                await limits.store(self._pool, self.registry, late)
                self._limits_written.update(late)
                for name, lim in late.items():
                    if lim is not None:
                        log.info("job %s was defined after this job runtime started: its limits (concurrency %s, "
                                 "rate %s a second) are written now, as at a start, and hold from now on", name,
                                 None if lim.max_running is None else (lim.key_param, lim.max_running), lim.rate)
            await self._read_limited(self._pool)
        except _DB_ERRORS as exc:
            reraise_if_cancelled()
            self._failures.warning("writing the limits of jobs defined since this runtime started failed (%s); "
                                   "their jobs wait, trying again next beat", exc)
            return
        except Exception as exc:  # noqa: BLE001 - not awaited by anyone: said here, and tried again next beat
            log.error("writing the limits of jobs defined since this runtime started failed: %s", exc, exc_info=exc)
            return
        self._doorbell.set()  # their waiting jobs are claimable now

    async def _rescue(self, since: datetime | None, beat_at: datetime) -> None:
        """Release the jobs of runtimes silent for three beats since `since`, as the beat at
        `beat_at` knew it (maintenance.rescue), and have the groups it counted in rung."""
        assert self._pool is not None and self.id is not None
        try:
            _, touched = await maintenance.rescue(self._pool, self.id, since, beat_at=beat_at, registry=self.registry)
        except _DB_ERRORS as exc:
            reraise_if_cancelled()
            self._failures.warning("rescuing dead runtimes' jobs failed (%s); trying again next beat", exc)
            return
        except Exception as exc:  # noqa: BLE001 - not awaited by anyone: said here, and tried again next beat
            log.error("rescuing dead runtimes' jobs failed: %s", exc, exc_info=exc)
            return
        if touched and self._group_progress is not None:
            self._group_progress.mark(touched)

    async def _housekeep(self) -> None:
        """Work that may take long (many deletes, locks held by others), kept off the heartbeat's
        loop: there, a retention prune or a group cancel slower than two beats got this live
        runtime presumed dead by the others, and its jobs run again."""
        assert self._pool is not None
        while not self._closing.is_set():
            try:
                await maintenance.cancel_orphaned_children(self._pool)
                await maintenance.complete_cut_off_cancels(self._pool)
                await self._prune()
            except _DB_ERRORS as exc:
                reraise_if_cancelled()
                self._failures.warning("housekeeping failed (%s); trying again in a beat", exc)
            await self._pause(self.heartbeat)

    async def _prune(self) -> None:
        """Retention, at most once a minute (or per tenth of the retention time) per runtime."""
        if self.retention is None or self._pool is None:
            return
        now = asyncio.get_running_loop().time()
        if now - self._pruned_at < min(60.0, self.retention / 10):
            return
        self._pruned_at = now
        await maintenance.prune(self._pool, self.retention, shrinking=self._prune_batches)

    async def _promote(self) -> None:
        assert self._pool is not None
        while not self._closing.is_set():
            try:
                if await maintenance.promote(self._pool):
                    self._doorbell.set()
                wait = await maintenance.seconds_to_next_scheduled(self._pool)
            except _DB_ERRORS as exc:
                reraise_if_cancelled()
                self._failures.warning("promoting scheduled jobs failed (%s)", exc)
                wait = None
            delay = self.poll_interval if wait is None else min(self.poll_interval, max(wait, 0.005))
            await self._pause(delay)

    async def _schedule(self, scheduler: Scheduler) -> None:
        assert self._pool is not None
        while not self._closing.is_set():
            try:
                wait = (await scheduler.round(self._pool)).wait
            except _DB_ERRORS as exc:
                reraise_if_cancelled()
                self._failures.warning("scheduling periodic jobs failed (%s); trying again", exc)
                wait = self.poll_interval
            # Until the next tick, but at least a few ms (a wake-up just before the tick on the
            # database's clock finds nothing due and sleeps the rest) and at most a heartbeat.
            await self._pause(min(max(wait, 0.005), self.heartbeat))
