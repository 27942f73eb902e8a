"""Job functions the job tests run, in this process and in child runtimes.

Each records its runs in the `job_runs` table (created by the `jobs_db` fixture), so a test
can count how many times each job ran, in which process and attempt.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import math
import os
import sys
import threading
import time
from typing import Any

import psycopg
from psycopg_pool import AsyncConnectionPool

from livepush import jobs
from livepush.jobs import database
from livepush.jobs.api.functions import INT4_MAX

RUNS_TABLE = """
CREATE TABLE IF NOT EXISTS job_runs (
    job_id  bigint NOT NULL,
    attempt integer NOT NULL,
    pid     integer NOT NULL,
    phase   text NOT NULL,
    key     text,
    at      timestamptz NOT NULL DEFAULT clock_timestamp()
)
"""

async def _pool() -> AsyncConnectionPool:
    # The jobs' own per-loop pool: drain() closes it before its loop ends. A pool of our own
    # left open there made asyncio.run()'s shutdown hang (its cancelled connect came back as a
    # connection error the pool retried).
    return await database.pools().aget()


async def note(ctx: Any, phase: str, key: Any = None) -> None:
    pool = await _pool()
    async with pool.connection() as conn:
        await conn.execute("INSERT INTO job_runs (job_id, attempt, pid, phase, key) VALUES (%s, %s, %s, %s, %s)",
                           (ctx.job_id, ctx.attempt, os.getpid(), phase, None if key is None else str(key)))


def note_sync(ctx: Any, phase: str, key: Any = None) -> None:
    with psycopg.connect(database.database_url(), autocommit=True) as conn:
        conn.execute("INSERT INTO job_runs (job_id, attempt, pid, phase, key) VALUES (%s, %s, %s, %s, %s)",
                     (ctx.job_id, ctx.attempt, os.getpid(), phase, None if key is None else str(key)))


@jobs.job(name="t.record")
async def record(ctx: Any, key: Any = None, *carried: Any) -> None:
    """Notes its run under `key`. Takes any number of further arguments, unused: the tests of what
    an enqueue checks and stores pass it whatever arguments they need."""
    await note(ctx, "done", key)


@jobs.job(name="t.record_sync")
def record_sync(ctx: Any, key: Any = None) -> None:
    note_sync(ctx, "done", key)


@jobs.job(name="t.hold", timeout=120)
async def hold(ctx: Any, seconds: float) -> None:
    """Runs for `seconds`, noting its start and its end."""
    await note(ctx, "start")
    await asyncio.sleep(seconds)
    await note(ctx, "done")


@jobs.job(name="t.hold_sync", timeout=120)
def hold_sync(ctx: Any, seconds: float) -> None:
    note_sync(ctx, "start")
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        ctx.progress(0, 1, "waiting")
        time.sleep(0.02)
    note_sync(ctx, "done")


@jobs.job(name="t.sleep_sync", timeout=120)
def sleep_sync(ctx: Any, seconds: float) -> None:
    """Notes its start, then sleeps without a progress call: a sync job nothing can stop."""
    note_sync(ctx, "start")
    time.sleep(seconds)
    note_sync(ctx, "done")


@jobs.job(name="t.debounce_self_then_fail", max_attempts=1)
async def debounce_self_then_fail(ctx: Any, key: str) -> None:
    """While it runs, a debounced enqueue of its own key queues a job behind it; then it fails
    for good."""
    await debounce_self_then_fail.aenqueue(key, key=key, debounce=60)
    raise ValueError("boom")


@jobs.job(name="t.flaky", max_attempts=3, backoff=lambda attempt: 0.0)
async def flaky(ctx: Any, fail_times: int) -> None:
    await note(ctx, "start")
    if ctx.attempt <= fail_times:
        raise RuntimeError(f"boom on attempt {ctx.attempt}")
    await note(ctx, "done")


@jobs.job(name="t.backoff", max_attempts=3)
async def with_default_backoff(ctx: Any) -> None:
    raise RuntimeError("always")


@jobs.job(name="t.never", never_retry=(ValueError,))
async def never(ctx: Any) -> None:
    await note(ctx, "start")
    raise ValueError("bad input")


@jobs.job(name="t.never_in_group", never_retry=(ValueError,))
async def never_in_group(ctx: Any) -> None:
    """Its ValueError raised by a task of an asyncio.TaskGroup, which wraps it in an exception group."""
    async def bad() -> None:
        raise ValueError("bad input")

    async with asyncio.TaskGroup() as group:
        group.create_task(bad())


@jobs.job(name="t.progress")
async def progress(ctx: Any, steps: int, pause: float = 0.0) -> None:
    for i in range(steps):
        await ctx.progress(i + 1, steps, f"step {i + 1}")
        if pause:
            await asyncio.sleep(pause)


@jobs.job(name="t.nul_error", max_attempts=1)
async def nul_error(ctx: Any) -> None:
    """Fails with a NUL character and a lone surrogate (as os.fsdecode makes from a file
    name's undecodable byte) in its error message."""
    raise ValueError("bad\x00byte in caf\udce9")


@jobs.job(name="t.odd_progress", max_attempts=1)
async def odd_progress(ctx: Any, done: Any, message: Any = None) -> None:
    """Reports progress with whatever it is given, then succeeds. Job arguments cannot carry
    NaN, infinity or NUL: "nan" and "inf" become those floats, a backslash-zero in the
    message a NUL character."""
    if isinstance(done, str):
        done = {"nan": math.nan, "inf": math.inf}.get(done, done)
    await ctx.progress(done, 10, message.replace("\\0", "\x00") if isinstance(message, str) else message)


@jobs.job(name="t.odd_progress_sync", max_attempts=1)
def odd_progress_sync(ctx: Any, done: Any) -> None:
    ctx.progress(done, 10)


@jobs.job(name="t.too_slow", timeout=0.2, max_attempts=1)
async def too_slow(ctx: Any) -> None:
    await note(ctx, "start")
    await asyncio.sleep(10)
    await note(ctx, "done")


@jobs.job(name="t.blocks_the_loop", timeout=0.2, max_attempts=1)
async def blocks_the_loop(ctx: Any, seconds: float) -> str:
    # A blocking call in an async job: no cancel can reach it until it returns.
    time.sleep(seconds)
    return "late"


@jobs.job(name="t.progress_not_awaited")
async def progress_not_awaited(ctx: Any) -> None:
    # The `await` forgotten, as is easy in an async job.
    ctx.progress(3, 10, "forgot the await")


@jobs.job(name="t.too_slow_sync", timeout=0.2, max_attempts=1)
def too_slow_sync(ctx: Any, seconds: float) -> None:
    note_sync(ctx, "start")
    time.sleep(seconds)
    note_sync(ctx, "done")


@jobs.job(name="t.other_queue", queue="second")
async def other_queue(ctx: Any, key: Any = None) -> None:
    await note(ctx, "done", key)


@jobs.job(name="t.where_sync", queue="second")
def where_sync(ctx: Any) -> dict[str, Any]:
    return {"name": ctx.name, "queue": ctx.queue, "attempt": ctx.attempt}


FLAGS_TABLE = "CREATE TABLE IF NOT EXISTS job_flags (name text PRIMARY KEY)"


@jobs.job(name="t.wait_flag", timeout=120)
async def wait_flag(ctx: Any, flag: str) -> None:
    """Notes its start, then runs until the row `flag` appears in job_flags."""
    await note(ctx, "start", flag)
    await until_flag(flag)
    await note(ctx, "done", flag)


@jobs.job(name="t.deaf_to_cancel", timeout=120)
async def deaf_to_cancel(ctx: Any) -> None:
    """Notes its start, then runs on however often it is cancelled: job code that swallows
    asyncio.CancelledError in a retry loop."""
    await note(ctx, "start")
    while True:
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            pass


@jobs.job(name="t.blocked_in_a_thread", timeout=120)
async def blocked_in_a_thread(ctx: Any) -> None:
    """Notes its start, then waits on a blocking call handed to asyncio.to_thread() (a library
    without an async API): cancelling the job ends its wait, never the call in its thread."""
    await note(ctx, "start")
    await asyncio.to_thread(time.sleep, 120)


@jobs.job(name="t.progress_then_fail", max_attempts=2, backoff=lambda attempt: 0.0)
async def progress_then_fail(ctx: Any, report_on_retry: bool) -> None:
    """Attempt 1 reports 9 of 10 and fails; attempt 2 reports 1 of 10 (if `report_on_retry`) and succeeds."""
    if ctx.attempt == 1:
        await ctx.progress(9, 10, "almost there")
        raise RuntimeError("boom on attempt 1")
    if report_on_retry:
        await ctx.progress(1, 10, "again")


@jobs.job(name="t.progress_unless_flag", max_attempts=1)
async def progress_unless_flag(ctx: Any, flag: str) -> None:
    """Reports 9 of 10 and fails while the row `flag` is not in job_flags; succeeds without a report once it is."""
    pool = await _pool()
    async with pool.connection() as conn:
        row = await (await conn.execute("SELECT 1 FROM job_flags WHERE name = %s", (flag,))).fetchone()
    if row is None:
        await ctx.progress(9, 10, "almost there")
        raise RuntimeError(f"no flag {flag} yet")


@jobs.job(name="t.returns_text", max_attempts=3, backoff=lambda attempt: 0.0)
async def returns_text(ctx: Any, size: int, count: int = 1, flag: str | None = None, char: str = "x") -> list[str]:
    """Returns one string of `size` times `char` `count` times (JSON text that long, for the
    memory of one string), after the row `flag` is in job_flags when one is given."""
    if flag is not None:
        await until_flag(flag)
    return [char * size] * count


@jobs.job(name="t.progress_then_wait", timeout=120)
async def progress_then_wait(ctx: Any, message: str, flag: str) -> None:
    """Reports progress with `message`, then runs until the row `flag` appears in job_flags."""
    await ctx.progress(1, 2, message)
    await until_flag(flag)


async def until_flag(flag: str, interval: float = 0.05) -> None:
    """Returns once the row `flag` is in job_flags (a test sets it to let a job finish). A poll
    that loses its connection polls again: the tests that cut the database off do it to the
    runtime, and a job failing on its own test plumbing would spend an attempt they count."""
    pool = await _pool()
    while True:
        try:
            async with pool.connection() as conn:
                row = await (await conn.execute("SELECT 1 FROM job_flags WHERE name = %s", (flag,))).fetchone()
        except psycopg.OperationalError:
            row = None
        if row:
            return
        await asyncio.sleep(interval)


# What a job may raise that is not an Exception (SystemExit: sys.exit() in a library it calls;
# CancelledError: awaiting a future something else cancelled), or that asyncio handles apart
# (StopIteration: next() on an exhausted iterator). A runtime installs its own signal handlers, so
# a KeyboardInterrupt inside a job is the job's own.
EXITS = {"exit": lambda: SystemExit(3), "interrupt": KeyboardInterrupt, "generator": GeneratorExit,
         "cancelled": asyncio.CancelledError, "stop": lambda: StopIteration()}


@jobs.job(name="t.exits", max_attempts=2, backoff=lambda attempt: 0.0)
async def exits(ctx: Any, how: str) -> None:
    await note(ctx, "start")
    raise EXITS[how]()


@jobs.job(name="t.exits_sync", max_attempts=2, backoff=lambda attempt: 0.0)
def exits_sync(ctx: Any, how: str) -> None:
    note_sync(ctx, "start")
    raise EXITS[how]()


class Unprintable(Exception):
    """An exception whose message cannot be read: str() of it raises what it was given."""

    def __init__(self, raises: BaseException) -> None:
        super().__init__()
        self.raises = raises

    def __str__(self) -> str:
        raise self.raises


UNPRINTABLE = {"error": lambda: RuntimeError("no message"), "exit": lambda: SystemExit(4)}


@jobs.job(name="t.unprintable", max_attempts=1)
async def unprintable(ctx: Any, how: str) -> None:
    raise Unprintable(UNPRINTABLE[how]())


def sync_wrapper(func: Any) -> Any:
    """A decorator that forgets to be async: its wrapper returns the coroutine the job makes."""

    @functools.wraps(func)
    def wrapper(*args: Any) -> Any:
        return func(*args)

    return wrapper


@jobs.job(name="t.wrapped_async", max_attempts=3)
@sync_wrapper
async def wrapped_async(ctx: Any) -> int:
    await note(ctx, "ran")
    return 1


@jobs.job(name="t.forgets_await", max_attempts=3)
async def forgets_await(ctx: Any) -> Any:
    return note(ctx, "ran")  # `return await note(...)` meant


# Timeouts too long to ever pass: as good as none.
@jobs.job(name="t.endless_timeout", timeout=sys.float_info.max, max_attempts=1)
async def endless_timeout(ctx: Any) -> None:
    await note(ctx, "done")


@jobs.job(name="t.endless_timeout_int", timeout=10**400, max_attempts=1)
async def endless_timeout_int(ctx: Any) -> None:
    await note(ctx, "done")


@jobs.job(name="t.endless_timeout_sync", timeout=10**400, max_attempts=1)
def endless_timeout_sync(ctx: Any) -> None:
    note_sync(ctx, "done")


@jobs.job(name="t.retries_for_ever", max_attempts=INT4_MAX)
async def retries_for_ever(ctx: Any) -> None:
    """Fails every attempt, on the default backoff: retried for as long as anyone waits."""
    await note(ctx, "start")
    raise RuntimeError(f"attempt {ctx.attempt}")


@jobs.job(name="t.swallows_timeout", timeout=0.2, max_attempts=1)
async def swallows_timeout(ctx: Any) -> str:
    """Swallows the cancel its timeout brings (as code that catches BaseException does) and
    returns as if nothing happened."""
    try:
        await asyncio.sleep(10)
    except asyncio.CancelledError:
        pass
    return "finished anyway"


async def deaf_until_flag(ctx: Any, flag: str) -> str:
    """Swallows every cancellation (as code retrying on BaseException does) until the row `flag`
    appears in job_flags, then notes its end and returns."""
    await note(ctx, "start")
    while True:
        try:
            await until_flag(flag)
            break
        except asyncio.CancelledError:
            pass
    await note(ctx, "done")
    return "finished anyway"


@jobs.job(name="t.swallows_cancel", timeout=120)
async def swallows_cancel(ctx: Any, flag: str) -> str:
    """Swallows the cancel a jobs.cancel() brings (as code that catches BaseException does) and
    returns as if nothing happened."""
    await note(ctx, "start")
    try:
        await until_flag(flag)
    except asyncio.CancelledError:
        return "finished anyway"
    return "flagged"


@jobs.job(name="t.sync_swallows_cancel", timeout=120)
def sync_swallows_cancel(ctx: Any) -> str:
    """A sync job that reports progress until its cancel reaches it (JobCancelled), catches that
    and returns as if nothing happened."""
    import time

    from livepush.jobs import JobCancelled

    deadline = time.monotonic() + 30
    try:
        while time.monotonic() < deadline:
            ctx.progress(1, 2)
            time.sleep(0.02)
    except JobCancelled:
        return "finished anyway"
    return "never told"


@jobs.job(name="t.sync_polls_cancelled", timeout=120)
def sync_polls_cancelled(ctx: Any) -> str:
    """A sync job that checks `ctx.cancelled` between pieces of work and stops early once it is
    set, returning what it got done."""
    import time

    note_sync(ctx, "start")
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if ctx.cancelled:
            return "stopped early"
        time.sleep(0.02)
    return "ran to its end"


@jobs.job(name="t.gives_up", max_attempts=3)
async def gives_up(ctx: Any, reason: str, task_groups: int = 0) -> None:
    """A job that finds its work no longer wanted and stops on purpose, raising JobCancelled (in a
    task of an asyncio.TaskGroup, nested `task_groups` deep, each of which raises it wrapped in an
    exception group)."""
    await ctx.progress(1, 2, "looked")

    async def look(depth: int) -> None:
        if depth == 0:
            raise jobs.JobCancelled(reason)
        async with asyncio.TaskGroup() as tasks:
            tasks.create_task(look(depth - 1))
            tasks.create_task(asyncio.sleep(10))

    await look(task_groups)


@jobs.job(name="t.gives_up_sync", max_attempts=3)
def gives_up_sync(ctx: Any, reason: str, task_groups: int = 0) -> None:
    """gives_up, as a sync job."""
    ctx.progress(1, 2, "looked")
    raise jobs.JobCancelled(reason)


@jobs.job(name="t.deaf_to_timeout", timeout=0.2, max_attempts=1)
async def deaf_to_timeout(ctx: Any, flag: str) -> str:
    return await deaf_until_flag(ctx, flag)


@jobs.job(name="t.deaf_until_flag", timeout=120)
async def deaf_to_cancel_until_flag(ctx: Any, flag: str) -> str:
    return await deaf_until_flag(ctx, flag)


# Set by a test to let the threads of `stuck_sync` jobs end. Each adds the token it was given to
# UNSTUCK as it ends: a test waits for its own job's thread by its token, not for any thread to
# end (those of earlier tests end too, once their test let them go).
UNSTICK = threading.Event()
UNSTUCK: set[str] = set()


@jobs.job(name="t.stuck_sync", timeout=0.2, max_attempts=1)
def stuck_sync(ctx: Any, token: str | None = None) -> None:
    """Hangs (as a call to a service without a timeout does) until the test lets it go."""
    try:
        UNSTICK.wait(60)
    finally:
        if token is not None:
            UNSTUCK.add(token)


@jobs.job(name="t.record_sync_soon", timeout=2.0, max_attempts=1)
def record_sync_soon(ctx: Any, key: Any = None) -> None:
    note_sync(ctx, "done", key)


# Steps of `reports_past_timeout_sync`, for a test to interleave its two attempts.
ZOMBIE_GO = threading.Event()
ZOMBIE_DONE = threading.Event()


@jobs.job(name="t.reports_past_timeout_sync", timeout=2.0, max_attempts=2, backoff=lambda attempt: 0.0)
def reports_past_timeout_sync(ctx: Any) -> None:
    """Attempt 1 runs past its timeout and reports progress once attempt 2 has started; attempt 2
    reports its own right after that, then runs until the flag `second` is set."""
    if ctx.attempt == 1:
        ZOMBIE_GO.wait(30)
        ctx.progress(1, None, "attempt 1")
        ZOMBIE_DONE.set()
        return
    ZOMBIE_GO.set()
    ZOMBIE_DONE.wait(30)
    ctx.progress(1, 2, "attempt 2")
    with psycopg.connect(database.database_url(), autocommit=True) as conn:
        while not conn.execute("SELECT 1 FROM job_flags WHERE name = 'second'").fetchone():
            time.sleep(0.02)


async def _deaf_until(event: threading.Event) -> None:
    """Wait for `event`, swallowing every cancellation meanwhile."""
    while not event.is_set():
        try:
            await asyncio.sleep(0.01)
        except asyncio.CancelledError:
            pass


# Set by a test to let the second attempt of `reports_past_timeout` end; and made by the test on
# its loop: set by the first attempt once it reported its progress.
ZOMBIE_END = threading.Event()
ZOMBIE_REPORTED: asyncio.Event | None = None


@jobs.job(name="t.reports_past_timeout", timeout=0.5, max_attempts=2, backoff=lambda attempt: 0.0)
async def reports_past_timeout(ctx: Any) -> None:
    """`reports_past_timeout_sync` as an async job deaf to its timeout's cancels: attempt 1 runs on
    once ended without it, and reports progress once attempt 2 has started; attempt 2 reports its
    own in the loop turn after that, then runs until ZOMBIE_END is set (or is ended 2 s after its
    timeout)."""
    assert ZOMBIE_REPORTED is not None
    if ctx.attempt == 1:
        await _deaf_until(ZOMBIE_GO)
        with contextlib.suppress(asyncio.CancelledError):
            await ctx.progress(1, None, "attempt 1")
        ZOMBIE_REPORTED.set()
        return
    ZOMBIE_GO.set()
    while not ZOMBIE_REPORTED.is_set():
        with contextlib.suppress(asyncio.CancelledError):
            await ZOMBIE_REPORTED.wait()
    with contextlib.suppress(asyncio.CancelledError):
        await ctx.progress(1, 2, "attempt 2")
    await _deaf_until(ZOMBIE_END)


# Set by a test to let `checkpoint_later` go on to its checkpoint.
CHECKPOINT_GO = threading.Event()


@jobs.job(name="t.checkpoint_later", timeout=30.0, max_attempts=1)
async def checkpoint_later(ctx: Any) -> Any:
    """Waits for the test, then runs a sync function as a checkpoint (in the runtime's threads)."""
    while not CHECKPOINT_GO.is_set():
        await asyncio.sleep(0.02)
    return await ctx.checkpoint("sync", lambda: "ran")


@jobs.job(name="t.cancels_own_tag", timeout=120)
async def cancels_own_tag(ctx: Any, tag: str, running: int) -> None:
    """Once `running` jobs with `tag` (itself among them) run, cancels the tag, its own job too."""
    while sum(j.state == "running" for j in await jobs.alist_tagged(tag, unfinished=True)) < running:
        await asyncio.sleep(0.05)
    await jobs.acancel_tagged(tag)
