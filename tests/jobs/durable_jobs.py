"""Durable job functions the durable tests run, in this process and in child runtimes.

Every checkpoint body records its run in `durable_bodies` (job, checkpoint name, attempt, when it
started, in autocommit: before its result is stored), so a test can tell how often each body ran
and whether one ran after its result was committed. `durable_inputs` holds values a test changes
between runs.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import datetime
import os
import threading
import time
from typing import Any

import psycopg

from livepush import jobs
from livepush.errors import DependencyError
from livepush.jobs import database
from tests.jobs.sample_jobs import _pool, until_flag

BODIES_TABLE = """
CREATE TABLE IF NOT EXISTS durable_bodies (
    job_id  bigint NOT NULL,
    name    text NOT NULL,
    attempt integer NOT NULL,
    pid     integer NOT NULL,
    at      timestamptz NOT NULL DEFAULT clock_timestamp()
)
"""
INPUTS_TABLE = "CREATE TABLE IF NOT EXISTS durable_inputs (name text PRIMARY KEY, value jsonb)"


async def body(ctx: Any, name: str, value: Any = None) -> Any:
    """A checkpoint body: records that it ran, returns `value` (default: the name)."""
    pool = await _pool()
    async with pool.connection() as conn:
        await conn.execute("INSERT INTO durable_bodies (job_id, name, attempt, pid) VALUES (%s, %s, %s, %s)",
                           (ctx.job_id, name, ctx.attempt, os.getpid()))
    return name if value is None else value


def body_sync(job_id: int, attempt: int, name: str) -> str:
    with psycopg.connect(database.database_url(), autocommit=True) as conn:
        conn.execute("INSERT INTO durable_bodies (job_id, name, attempt, pid) VALUES (%s, %s, %s, %s)",
                     (job_id, name, attempt, os.getpid()))
    return name


async def flag_value(name: str) -> Any:
    pool = await _pool()
    async with pool.connection() as conn:
        row = await (await conn.execute("SELECT value FROM durable_inputs WHERE name = %s", (name,))).fetchone()
    return None if row is None else row[0]


@jobs.job(name="d.steps", max_attempts=3, backoff=lambda attempt: 0.0)
async def steps(ctx: Any, n: int, fail_first: bool = False) -> dict[str, Any]:
    """n checkpoints, then (on its first attempt only, if asked) a failure: the retry replays."""
    got = [await ctx.checkpoint(f"s{i}", body, ctx, f"s{i}", {"i": i}) for i in range(n)]
    if fail_first and ctx.attempt == 1:
        raise RuntimeError("first attempt fails after its checkpoints")
    return {"got": got, "attempt": ctx.attempt}


@jobs.job(name="d.steps_together", max_attempts=2, backoff=lambda attempt: 0.0)
async def steps_together(ctx: Any, n: int) -> list[Any]:
    """n checkpoints side by side (asyncio.gather); the first attempt fails after them, so the
    retry replays all n at once."""
    got = await asyncio.gather(*(ctx.checkpoint(f"s{i}", body, ctx, f"s{i}", i) for i in range(n)))
    if ctx.attempt == 1:
        raise RuntimeError("first attempt fails after its checkpoints")
    return list(got)


@jobs.job(name="d.steps_sync", max_attempts=3, backoff=lambda attempt: 0.0)
def steps_sync(ctx: Any, n: int) -> list[str]:
    got = [ctx.checkpoint(f"s{i}", body_sync, ctx.job_id, ctx.attempt, f"s{i}") for i in range(n)]
    if ctx.attempt == 1:
        raise RuntimeError("first attempt fails after its checkpoints")
    return got


@jobs.job(name="d.with_input", max_attempts=3, backoff=lambda attempt: 0.0)
async def with_input(ctx: Any, flag: str, hold: str | None = None) -> Any:
    """A checkpoint whose input comes from durable_inputs (a test changes it between attempts:
    with `hold`, the first attempt fails only once the job_flags row `hold` is set, so the change
    is made before the retry reads the input)."""
    value = await ctx.checkpoint("charge", body, ctx, "charge", input={"cents": await flag_value(flag)})
    if ctx.attempt == 1:
        if hold is not None:
            await until_flag(hold)
        raise RuntimeError("fails after the charge")
    return value


@jobs.job(name="d.through_json", max_attempts=2, backoff=lambda attempt: 0.0)
async def through_json(ctx: Any) -> dict[str, Any]:
    """A checkpoint whose result JSON may spell differently: key order, a float past 2**53. What the
    first run saw is stored by a second checkpoint; the retry replays both."""
    got = await ctx.checkpoint("made", lambda: {"total": 1e16, "id": 7})
    seen = {"keys": list(got), "types": [type(v).__name__ for v in got.values()], "text": repr(got)}
    first = await ctx.checkpoint("first run saw", lambda: seen)
    if ctx.attempt == 1:
        raise RuntimeError("fails once, so that the retry replays")
    return {"first": first, "replay": seen}


@jobs.job(name="d.bad_result", max_attempts=3)
async def bad_result(ctx: Any, where: str) -> Any:
    if where == "checkpoint":
        await ctx.checkpoint("when", lambda: {"at": datetime.datetime.now()})
    if where == "big checkpoint":
        await ctx.checkpoint("big", lambda: {"n": 10**4301})
    if where == "big result":
        return {"n": -(10**4301)}
    if where == "huge checkpoint":
        # Longer than any jsonb string may be (2**28 - 1 bytes).
        await ctx.checkpoint("huge", body, ctx, "huge", "x" * 2**28)
    if where == "long checkpoint":
        # Past one message to Postgres as the test lowers its limit (args.SENDABLE).
        await ctx.checkpoint("long", body, ctx, "long", "x" * 150_000)
    return {"when": datetime.datetime.now()}


@dataclasses.dataclass
class Row:
    id: int


UNPLAIN = {"a set": lambda: {"ids": {3, 1}}, "bytes": lambda: {"ids": b"\x01"},
           "a dataclass": lambda: {"ids": Row(1)}, "a datetime": lambda: {"ids": datetime.datetime.now()}}


@jobs.job(name="d.unplain_checkpoint", max_attempts=3)
async def unplain_checkpoint(ctx: Any, what: str) -> Any:
    """A checkpoint whose result holds a value JSON has no place for (the test chooses which)."""
    return await ctx.checkpoint("fetch", UNPLAIN[what])


@jobs.job(name="d.unfit_input", max_attempts=1)
async def unfit_input(ctx: Any, how: str) -> Any:
    """A checkpoint after another, given an input it cannot fingerprint (the test chooses which)."""
    await ctx.checkpoint("fetch", lambda: 1, input={"id": 1})
    unfit = {"at": datetime.date(2026, 1, 2)} if how == "a date" else {"id": 2**53}
    return await ctx.checkpoint("charge", lambda: 2, input=unfit)


def charge(cents: int, key: str = "") -> dict[str, Any]:
    """A payment call that takes its idempotency key by keyword, as such APIs often do."""
    return {"cents": cents, "key": key}


@jobs.job(name="d.misused", max_attempts=1)
async def misused(ctx: Any, how: str) -> Any:
    """A durable call given what it does not take (the test chooses which)."""
    if how == "children of an int":
        return await ctx.run_children(5)
    if how == "children of one request":
        return await ctx.run_children(child.request(1))
    if how == "a child that is a function":
        return await ctx.run_child(child)
    if how == "keyword arguments":
        return await ctx.checkpoint("charge", charge, 1250, key="k-7")
    if how == "input misspelt":
        return await ctx.checkpoint("charge", charge, 1250, inputs={"cents": 1250})
    return await ctx.checkpoint("not callable", 5)


@jobs.job(name="d.misused_sync", max_attempts=1)
def misused_sync(ctx: Any, how: str) -> Any:
    if how == "children of an int":
        return ctx.run_children(5)
    if how == "keyword arguments":
        return ctx.checkpoint("charge", charge, 1250, key="k-7")
    return ctx.checkpoint("not callable", 5)


@jobs.job(name="d.forgets_await", max_attempts=3, backoff=lambda attempt: 0.0)
async def forgets_await(ctx: Any, how: str) -> str:
    """A durable call (or ctx.group.enqueue) whose `await` was forgotten, as is easy in an async
    job: the call never runs, and the job returns as if it had."""
    if how == "checkpoint":
        ctx.checkpoint("charge", body, ctx, "charge")
    elif how == "child":
        ctx.run_child(child.request(1))
    elif how == "sleep":
        ctx.sleep("nap", 0)
    elif how == "group add":
        ctx.group.enqueue(child, 2)
    elif how == "result used":
        rows = ctx.checkpoint("fetch", body, ctx, "fetch")
        return f"{len(rows)} rows"  # TypeError: a coroutine has no len()
    elif how == "raises before awaiting":
        charge = ctx.checkpoint("charge", body, ctx, "charge")  # made first, to be awaited below
        if ctx.attempt == 1:
            raise ValueError("a transient error before the await")
        await charge
    elif how == "awaited later":
        charge = ctx.checkpoint("charge", body, ctx, "charge")  # made first, awaited below: no mistake
        await asyncio.sleep(0)
        await charge
    return "returned"


MISUSES = ("input not JSON", "empty name", "empty name in a task group", "negative sleep", "sleep of a str", "negative timeout", "not callable",
           "sleep without a name", "sleep without seconds", "sleep of a bool", "wait without a name", "keyword arguments", "children of an int", "own ValueError", "jobs.signal of an empty name")


async def misuse(ctx: Any, how: str) -> Any:
    """One durable call made wrongly (the test chooses which), after a checkpoint and code between
    steps that records each run; or the job's own ValueError, or one from a livepush call that is
    no durable call, which a retry may not meet again."""
    await ctx.checkpoint("first", body, ctx, "first")
    await body(ctx, "between")  # code between steps: it runs again on every attempt
    if how == "input not JSON":
        return await ctx.checkpoint("charge", lambda: 1, input={"at": datetime.date(2026, 1, 2)})
    if how == "empty name":
        return await ctx.checkpoint("", lambda: 1)
    if how == "empty name in a task group":
        async with asyncio.TaskGroup() as group:
            group.create_task(ctx.checkpoint("", lambda: 1))
        return None
    if how == "negative sleep":
        return await ctx.sleep("nap", -1)
    if how == "sleep of a str":
        return await ctx.sleep("nap", "10")
    if how == "negative timeout":
        return await ctx.wait_for_signal("go", timeout=-5)
    if how == "sleep without a name":
        return await ctx.sleep(3600)
    if how == "sleep without seconds":
        return await ctx.sleep("nap")
    if how == "sleep of a bool":
        return await ctx.sleep(True)
    if how == "wait without a name":
        return await ctx.wait_for_signal(timeout=5)
    if how == "not callable":
        return await ctx.checkpoint("not callable", 5)
    if how == "keyword arguments":
        return await ctx.checkpoint("charge", charge, 1250, key="k-7")
    if how == "children of an int":
        return await ctx.run_children(5)
    if how == "jobs.signal of an empty name":
        return await jobs.asignal(ctx.job_id, "")
    raise ValueError("the job's own mistake, maybe not the next attempt's")


misuse_retried = jobs.job(name="d.misuse_retried", max_attempts=3, backoff=lambda attempt: 0.0)(misuse)


@jobs.job(name="d.misuse_sync", max_attempts=3, backoff=lambda attempt: 0.0)
def misuse_sync(ctx: Any, how: str) -> Any:
    """A sync job's durable call made wrongly (the test chooses which), after code between steps."""
    body_sync(ctx.job_id, ctx.attempt, "between")
    if how == "negative sleep":
        return ctx.sleep("nap", -1)
    if how == "sleep without a name":
        return ctx.sleep(3600)
    if how == "sleep without seconds":
        return ctx.sleep("nap")
    if how == "wait without a name":
        return ctx.wait_for_signal()
    if how == "not callable":
        return ctx.checkpoint("not callable", 5)
    if how == "keyword arguments":
        return ctx.checkpoint("charge", charge, 1250, key="k-7")
    return ctx.run_children(5)


ARGUMENT_REFUSALS = ("enqueue of a date", "enqueue of too many arguments", "run_child of a date",
                     "run_children of too many arguments", "own TypeError")


@jobs.job(name="d.refused_arguments", max_attempts=3, backoff=lambda attempt: 0.0)
async def refused_arguments(ctx: Any, how: str) -> Any:
    """A call whose arguments livepush refuses (InvalidArgumentsError), after code that records each
    run; or the job's own TypeError, which a retry may not meet again."""
    await body(ctx, "between")
    if how == "enqueue of a date":
        return await child.aenqueue(datetime.date(2026, 1, 2))
    if how == "enqueue of too many arguments":
        return await child.aenqueue(1, False, "one too many")
    if how == "run_child of a date":
        return await ctx.run_child(child.request({"at": datetime.date(2026, 1, 2)}))
    if how == "run_children of too many arguments":
        return await ctx.run_children([child.request(1), child.request(2, False, "one too many")])
    raise TypeError("the job's own mistake, maybe not the next attempt's")


@jobs.job(name="d.refused_arguments_sync", max_attempts=3, backoff=lambda attempt: 0.0)
def refused_arguments_sync(ctx: Any) -> Any:
    """A sync job's enqueue of arguments that are not JSON, after code that records each run."""
    body_sync(ctx.job_id, ctx.attempt, "between")
    return child.enqueue(datetime.date(2026, 1, 2))


@jobs.job(name="d.twice", max_attempts=3)
async def twice(ctx: Any) -> None:
    await ctx.checkpoint("same", body, ctx, "same")
    await ctx.checkpoint("same", body, ctx, "same")


@jobs.job(name="d.loop_of_one_name", max_attempts=3)
async def loop_of_one_name(ctx: Any, items: list[int]) -> None:
    """A checkpoint per item of a loop, all under one name (the mistake a loop invites)."""
    for item in items:
        await ctx.checkpoint("process", body, ctx, "process", item)


def flaky_try(tries: list[int], fails: int) -> dict[str, int]:
    """One try of a flaky API call: the first `fails` tries time out."""
    tries.append(1)
    if len(tries) <= fails:
        raise ConnectionError("the payment API timed out")
    return {"tries": len(tries)}


@jobs.job(name="d.retried_in_run", max_attempts=1)
async def retried_in_run(ctx: Any, fails: int) -> Any:
    """A checkpoint whose function fails `fails` times (a flaky API), retried by the job's own loop
    under the same name: one attempt, so only the loop's retries can make it succeed."""
    tries: list[int] = []

    async def charge() -> dict[str, int]:
        await body(ctx, "charge")
        return flaky_try(tries, fails)

    for _ in range(fails):
        with contextlib.suppress(ConnectionError):
            return await ctx.checkpoint("charge", charge)
    return await ctx.checkpoint("charge", charge)


@jobs.job(name="d.retried_in_run_sync", max_attempts=1)
def retried_in_run_sync(ctx: Any, fails: int) -> Any:
    """retried_in_run, as a sync job."""
    tries: list[int] = []

    def charge() -> dict[str, int]:
        body_sync(ctx.job_id, ctx.attempt, "charge")
        return flaky_try(tries, fails)

    for _ in range(fails):
        with contextlib.suppress(ConnectionError):
            return ctx.checkpoint("charge", charge)
    return ctx.checkpoint("charge", charge)


@jobs.job(name="d.store_retried_in_run", max_attempts=1)
async def store_retried_in_run(ctx: Any) -> Any:
    """A checkpoint whose result could not be stored (Postgres lost: DependencyError), retried by
    the job's own loop under the same name: one attempt, so only the loop can make it succeed."""
    for _ in range(2):
        with contextlib.suppress(DependencyError):
            return await ctx.checkpoint("charge", body, ctx, "charge", {"charged": True})
    return await ctx.checkpoint("charge", body, ctx, "charge", {"charged": True})


@jobs.job(name="d.sleep_retried_in_run", max_attempts=1, timeout=None)
async def sleep_retried_in_run(ctx: Any) -> str:
    """A durable sleep whose park could not be written (DependencyError), retried by the job's own
    loop under the same name: one attempt, so only the loop can make it succeed."""
    for _ in range(2):
        with contextlib.suppress(DependencyError):
            await ctx.sleep("nap", 0.2)
            return "woke"
    await ctx.sleep("nap", 0.2)
    return "woke"


@jobs.job(name="d.wait_retried_in_run", max_attempts=1, timeout=None)
async def wait_retried_in_run(ctx: Any) -> Any:
    """A signal wait that lost Postgres (DependencyError), retried by the job's own loop, then a
    durable sleep, whose wake-up replays the wait: one attempt, so only the loop can succeed."""
    for _ in range(2):
        with contextlib.suppress(DependencyError):
            got = await ctx.wait_for_signal("go")
            break
    else:
        got = await ctx.wait_for_signal("go")
    await ctx.sleep("nap", 0.2)
    return got


@jobs.job(name="d.child", max_attempts=1)
async def child(ctx: Any, value: Any, fail: bool = False) -> Any:
    await body(ctx, f"child:{value}")
    if fail:
        raise ValueError(f"child {value} fails")
    return {"child": value, "queue": ctx.queue}


@jobs.job(name="d.too_large_children", max_attempts=1)
async def too_large_children(ctx: Any) -> Any:
    """Runs two children whose arguments together are past what one jsonb value holds."""
    half = "x" * 140_000_000
    return await ctx.run_children([child.request(half), child.request(half)])


@jobs.job(name="d.child_elsewhere", queue="elsewhere", max_attempts=1)
async def child_elsewhere(ctx: Any, value: Any) -> Any:
    return {"child": value, "queue": ctx.queue}


@jobs.job(name="d.parent", max_attempts=3, backoff=lambda attempt: 0.0)
async def parent(ctx: Any, values: list[Any], failing: list[Any] | None = None) -> Any:
    """Fetch (a checkpoint), one child, then the rest as a group; a failed child is reported."""
    first = await ctx.checkpoint("fetch", body, ctx, "fetch", values)
    one = await ctx.run_child(child.request(first[0]))
    try:
        rest = await ctx.run_children([child.request(v, v in (failing or [])) for v in first[1:]])
    except jobs.ChildFailed as exc:
        return {"one": one, "failed": [f[0] for f in exc.failures], "error": str(exc)}
    return {"one": one, "rest": rest}


@jobs.job(name="d.child_then_step", max_attempts=1)
async def child_then_step(ctx: Any, flag: str) -> Any:
    """One child, then a step that fails until durable_inputs has `flag` (a retry_failed goes on)."""
    got = await ctx.run_child(child.request("kept"))
    if await flag_value(flag) is None:
        raise RuntimeError("the step after the child fails")
    return got


@jobs.job(name="d.redeployed_children", max_attempts=3, backoff=lambda attempt: 0.0)
async def redeployed_children(ctx: Any, flag: str, change: str) -> Any:
    """Its children call, as deployed before and after durable_inputs has `flag` (a redeploy that
    changed the call a parked run made): `change` "names" asks for another job, "count" for two.
    Its children go to "elsewhere" by name: a child's queue is its parent's unless the request
    names one, and one run at once would leave the parent parked too briefly to be seen."""
    if await flag_value(flag) is None:
        return await ctx.run_children([child_elsewhere.request("a", queue="elsewhere")])
    if change == "names":
        return await ctx.run_children([child.request("a", queue="elsewhere")])
    return await ctx.run_children([child_elsewhere.request("a", queue="elsewhere"),
                                   child_elsewhere.request("b", queue="elsewhere")])


@jobs.job(name="d.parent_queues", max_attempts=1)
async def parent_queues(ctx: Any) -> Any:
    return await ctx.run_children([child.request("mine"), child_elsewhere.request("theirs"),
                                   child.request("named", queue="elsewhere")])


@jobs.job(name="d.parent_sync", max_attempts=1)
def parent_sync(ctx: Any, value: Any) -> Any:
    return ctx.run_child(child.request(value))


@jobs.job(name="d.waits_and_sleeps_sync", max_attempts=1, timeout=None)
def waits_and_sleeps_sync(ctx: Any) -> Any:
    """A sync job's blocking parking calls: a signal wait that parks, a durable sleep that parks,
    and a wait whose timeout it catches."""
    got = ctx.wait_for_signal("approval", timeout=datetime.timedelta(hours=1))
    ctx.sleep("nap", 0.2)
    try:
        late = ctx.wait_for_signal("late", timeout=0)
    except jobs.SignalTimeout:
        late = "timeout"
    return {"got": got, "late": late, "at": ctx.checkpoint("after", body_sync, ctx.job_id, ctx.attempt, "after")}


@jobs.job(name="d.waiter", max_attempts=3, timeout=None)
async def waiter(ctx: Any, name: str, times: int = 1, timeout: float | None = None) -> Any:
    got = []
    for _ in range(times):
        try:
            got.append(await ctx.wait_for_signal(name, timeout=timeout))
        except jobs.SignalTimeout:
            got.append("timeout")
    return got


# The timeout= of redeployed_waiter's wait, as "the code" has it: a test changes it while a run
# is parked, as a deploy that changes timeout= does.
WAIT_TIMEOUT: dict[str, float] = {"seconds": 60.0}


@jobs.job(name="d.redeployed_waiter", max_attempts=1, timeout=None)
async def redeployed_waiter(ctx: Any, name: str) -> Any:
    return await ctx.wait_for_signal(name, timeout=WAIT_TIMEOUT["seconds"])


# Jobs of keyed_waiter wait here (the test's loop runs the runtime) until the test lets them go on.
KEYED_HOLD: dict[str, asyncio.Event] = {}


@jobs.job(name="d.keyed_waiter", max_attempts=1, timeout=None, concurrency=("account", 1))
async def keyed_waiter(ctx: Any, account: str, signal: str | None) -> str:
    """One at a time per account; held while KEYED_HOLD has the account unset, then, with a
    `signal`, parks until it comes."""
    hold = KEYED_HOLD.get(account)
    if hold is not None:
        await hold.wait()
    if signal is not None:
        await ctx.wait_for_signal(signal)
    return account


@jobs.job(name="d.sleeper", max_attempts=1)
async def sleeper(ctx: Any, seconds: float) -> str:
    await ctx.checkpoint("before", body, ctx, "before")
    await ctx.sleep("nap", seconds)
    await ctx.checkpoint("after", body, ctx, "after")
    return "rested"


# The seconds of redeployed_sleeper's sleep, as "the code" has it: a test changes them while a run
# is parked on it, as a deploy does.
SLEEP_SECONDS: dict[str, float] = {"seconds": 60.0}


@jobs.job(name="d.redeployed_sleeper", max_attempts=1, timeout=None)
async def redeployed_sleeper(ctx: Any) -> str:
    await ctx.sleep("nap", SLEEP_SECONDS["seconds"])
    return "rested"


@jobs.job(name="d.progress_then_sleep", max_attempts=1)
async def progress_then_sleep(ctx: Any, seconds: float) -> str:
    await ctx.progress(1, 2, "half way")
    await ctx.sleep("nap", seconds)
    return "rested"


@jobs.job(name="d.progress_then_fail_then_wait", max_attempts=2, timeout=None, backoff=lambda attempt: 0.0)
async def progress_then_fail_then_wait(ctx: Any, signal: str) -> Any:
    """Its first attempt reports progress and fails; the retry parks at once on `signal`."""
    if ctx.attempt == 1:
        await ctx.progress(1, 2, "first attempt")
        raise RuntimeError("the first attempt fails after its progress")
    return await ctx.wait_for_signal(signal)


@jobs.job(name="d.fan_and_wait", max_attempts=1, timeout=None)
async def fan_and_wait(ctx: Any, n: int) -> Any:
    """Children that wait for a signal each (so they stay unfinished until told)."""
    return await ctx.run_children([waiter.request(f"go-{i}") for i in range(n)])


@jobs.job(name="d.flaky_child", max_attempts=2, backoff=lambda attempt: 0.0)
async def flaky_child(ctx: Any, value: Any) -> Any:
    """A child whose first attempt fails: its own retry succeeds."""
    if ctx.attempt == 1:
        raise ConnectionError("the first attempt's API call timed out")
    return {"child": value, "attempt": ctx.attempt}


@jobs.job(name="d.parent_of_flaky", max_attempts=1)
async def parent_of_flaky(ctx: Any) -> Any:
    return await ctx.run_child(flaky_child.request("x"))


@jobs.job(name="d.sleep_then_wait", max_attempts=1, timeout=None)
async def sleep_then_wait(ctx: Any, seconds: float) -> Any:
    await ctx.sleep("nap", seconds)
    return await ctx.wait_for_signal("go")


@jobs.job(name="d.tagging_child", max_attempts=1, timeout=None)
async def tagging_child(ctx: Any, tag: str) -> Any:
    """A child that adds a tagged member to its own group (its siblings), then waits to be told."""
    await ctx.group.enqueue(waiter, "never", tags=[tag])
    return await ctx.wait_for_signal("go")


@jobs.job(name="d.parent_of_tagged", max_attempts=1, timeout=None)
async def parent_of_tagged(ctx: Any, tag: str) -> Any:
    return await ctx.run_children([tagging_child.request(tag)])


@jobs.job(name="d.slow_step", max_attempts=5, timeout=None, backoff=lambda attempt: 0.0)
async def slow_step(ctx: Any, seconds: float) -> str:
    async def work() -> str:
        await body(ctx, "slow")
        await asyncio.sleep(seconds)
        return "slow"

    return str(await ctx.checkpoint("slow", work))


async def slow_body(ctx: Any, seconds: float) -> str:
    """A checkpoint body that records its run, then takes `seconds`."""
    await body(ctx, "slow")
    await asyncio.sleep(seconds)
    return "slow"


@jobs.job(name="d.checkpoint_beside_park", max_attempts=1)
async def checkpoint_beside_park(ctx: Any, seconds: float) -> str:
    """A checkpoint whose body is still running when a sleep beside it (asyncio.gather) parks."""
    got, _ = await asyncio.gather(ctx.checkpoint("slow", slow_body, ctx, seconds), ctx.sleep("nap", 0.1))
    return str(got)


@jobs.job(name="d.checkpoint_beside_a_failure", max_attempts=2, backoff=lambda attempt: 0.0)
async def checkpoint_beside_a_failure(ctx: Any, seconds: float) -> str:
    """A checkpoint whose body is still running when a checkpoint beside it (asyncio.gather) fails
    the first attempt."""
    async def fail_once() -> str:
        if ctx.attempt == 1:
            raise RuntimeError("the first attempt fails while the slow body runs")
        return "ok"

    got, _ = await asyncio.gather(ctx.checkpoint("slow", slow_body, ctx, seconds),
                                  ctx.checkpoint("fails once", fail_once))
    return str(got)


@jobs.job(name="d.park_beside_a_failure", max_attempts=1)
async def park_beside_a_failure(ctx: Any, seconds: float) -> None:
    """A run that fails while its children call (asyncio.gather) waits for a slow checkpoint beside
    it to store its result before it parks."""
    async def fail() -> None:
        await asyncio.sleep(0.1)
        raise RuntimeError("the run fails while the park beside it waits")

    async def late_child() -> Any:
        await asyncio.sleep(0.02)  # once the slow body runs: the park waits for it
        return await ctx.run_child(child.request("late"))

    await asyncio.gather(ctx.checkpoint("slow", slow_body, ctx, seconds), fail(), late_child())


@jobs.job(name="d.parks_side_by_side", max_attempts=1)
async def parks_side_by_side(ctx: Any) -> list[Any]:
    """Two sleeps in asyncio.gather: both must be slept, each parked for in turn."""
    return await asyncio.gather(ctx.sleep("a", 0.1), ctx.sleep("b", 0.1))


@jobs.job(name="d.hold_in_checkpoint", max_attempts=1, timeout=None)
async def hold_in_checkpoint(ctx: Any, flag: str) -> None:
    """A checkpoint whose body waits until told (a test meanwhile arranges how its store goes)."""
    async def work() -> str:
        await body(ctx, "held")
        await until_flag(flag)
        return "held"

    await ctx.checkpoint("held", work)


@jobs.job(name="d.held_then_returns", max_attempts=1, timeout=None)
async def held_then_returns(ctx: Any, flag: str) -> Any:
    """hold_in_checkpoint, returning what its checkpoint returned (a test stores a result for the
    name while the body runs, as a store that lost its connection and committed late did)."""
    async def work() -> str:
        await body(ctx, "held")
        await until_flag(flag)
        return "this body's"

    return await ctx.checkpoint("held", work)


@jobs.job(name="d.park_in_task_group", max_attempts=2)
async def park_in_task_group(ctx: Any) -> int:
    """A checkpoint and a sleep in an asyncio.TaskGroup, which raises the park as an exception group."""
    async with asyncio.TaskGroup() as group:
        made = group.create_task(ctx.checkpoint("made", lambda: 3))
        group.create_task(ctx.sleep("nap", 0.1))
    return made.result()


@jobs.job(name="d.bad_result_in_task_group", max_attempts=3, backoff=lambda attempt: 0.0)
async def bad_result_in_task_group(ctx: Any) -> None:
    """A checkpoint whose result is not JSON, beside another in an asyncio.TaskGroup, which raises
    the InvalidResultError inside an exception group."""
    async with asyncio.TaskGroup() as group:
        group.create_task(ctx.checkpoint("beside", body, ctx, "beside"))
        group.create_task(ctx.checkpoint("when", lambda: {"at": datetime.datetime.now()}))


@jobs.job(name="d.checkpoint_then_hold", max_attempts=1, timeout=None)
async def checkpoint_then_hold(ctx: Any, flag: str) -> None:
    await ctx.checkpoint("fetched", body, ctx, "fetched")
    await until_flag(flag)


# Checkpoints whose sync functions must all run at once (a barrier of TOGETHER): they can only
# if each gets a thread of its own.
TOGETHER = 40
_together = threading.Barrier(TOGETHER)


def _meet() -> int:
    return _together.wait(timeout=15)


@jobs.job(name="d.checkpoint_together", max_attempts=1)
async def checkpoint_together(ctx: Any) -> Any:
    return await ctx.checkpoint("meet", _meet)


@jobs.job(name="d.checkpoint_in_finally", max_attempts=1, timeout=None)
async def checkpoint_in_finally(ctx: Any) -> Any:
    """A checkpoint in the `finally` of a wait: reached also when the wait parks the run."""
    try:
        return await ctx.wait_for_signal("go")
    finally:
        await ctx.checkpoint("after", body, ctx, "after")


@jobs.job(name="d.checkpoint_in_finally_sync", max_attempts=1, timeout=None)
def checkpoint_in_finally_sync(ctx: Any) -> Any:
    """checkpoint_in_finally, as a sync job."""
    try:
        return ctx.wait_for_signal("go")
    finally:
        ctx.checkpoint("after", body_sync, ctx.job_id, ctx.attempt, "after")


@jobs.job(name="d.parks_past_its_timeout", max_attempts=1, timeout=0.2)
async def parks_past_its_timeout(ctx: Any) -> str:
    """Swallows its timeout's cancel, then parks: its attempt has failed by its timeout already."""
    try:
        await asyncio.sleep(5)
    except asyncio.CancelledError:
        pass
    await ctx.sleep("nap", 60)
    return "slept"


@jobs.job(name="d.parks_past_its_timeout_sync", max_attempts=1, timeout=0.2)
def parks_past_its_timeout_sync(ctx: Any) -> str:
    """parks_past_its_timeout as a sync job: its thread runs on past its timeout, then parks."""
    time.sleep(0.5)
    ctx.sleep("nap", 60)
    return "slept"


@jobs.job(name="d.checkpoint_raising_stop_iteration", max_attempts=1, timeout=None)
async def checkpoint_raising_stop_iteration(ctx: Any) -> Any:
    """A sync checkpoint function that raises StopIteration (next() on an empty iterator)."""
    return await ctx.checkpoint("first", lambda: next(iter([])))


@jobs.job(name="d.sync_checkpoint_beside_a_failure_in_task_group", max_attempts=2, backoff=lambda attempt: 0.0)
async def sync_checkpoint_beside_a_failure_in_task_group(ctx: Any) -> int:
    """A sync checkpoint function still running in its thread when a sibling in an
    asyncio.TaskGroup fails (first attempt only) and the group cancels the checkpoint's task."""
    started, cancelled = threading.Event(), threading.Event()
    if ctx.attempt > 1:
        cancelled.set()

    def slow() -> str:
        started.set()
        cancelled.wait(10)  # returns once the task group has cancelled the task awaiting it
        return body_sync(ctx.job_id, ctx.attempt, "slow")

    async def fail_once() -> None:
        if ctx.attempt == 1:
            await asyncio.to_thread(started.wait, 10)
            raise ValueError("the sibling fails")

    try:
        async with asyncio.TaskGroup() as group:
            group.create_task(ctx.checkpoint("slow", slow))
            group.create_task(fail_once())
    except* ValueError:
        cancelled.set()
        raise
    return ctx.attempt
