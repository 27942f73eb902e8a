"""Workflows the kill -9 tests of workflows run in child runtimes (tests/jobs/test_workflows_crashes.py):
a diamond of plain steps, and a fan-out whose members fail in as many batches as the run's input
says (each failing batch pauses the run until an operator resumes it).

Every step body, every start of the fan-out's batch-making function and every member run records
itself in `wf_crash_runs` (job, run, what, attempt, process, and when: clock_timestamp() of an
autocommit insert, committed before the body goes on), so the test can tell what a killed
runtime was doing. Random short awaits (and sleeps, in the sync functions) spread the instants at
which a SIGKILL lands.
"""

from __future__ import annotations

import asyncio
import os
import random
import time
from typing import Any

import psycopg

from livepush import jobs
from livepush.jobs import database
from livepush.postgres.pools import aautocommitted

RUNS_TABLE = """
CREATE TABLE IF NOT EXISTS wf_crash_runs (
    job_id  bigint NOT NULL,
    run_id  bigint NOT NULL,
    what    text NOT NULL,
    attempt integer NOT NULL,
    pid     integer NOT NULL,
    at      timestamptz NOT NULL DEFAULT clock_timestamp()
)
"""

QUEUE = "wfc"
# A rescue counts an attempt, and one job may be interrupted by many kills in a row: never fail
# it for that.
MAX_ATTEMPTS = 50
PAUSE = 0.03  # seconds, at most, of each random await in a step or member
MAKE_PAUSE = 0.006  # seconds, at most, before each member the batch-making function adds


def no_backoff(attempt: int) -> float:
    return 0.0


async def pause() -> None:
    await asyncio.sleep(random.uniform(0.0, PAUSE))


async def record(job_id: int, run_id: int, what: str, attempt: int) -> None:
    pool = await database.pools().aget()
    # Autocommit: the record must survive a kill that lands right after it.
    async with pool.connection() as conn, aautocommitted(conn):
        await conn.execute("INSERT INTO wf_crash_runs (job_id, run_id, what, attempt, pid) VALUES (%s, %s, %s, %s, %s)",
                           (job_id, run_id, what, attempt, os.getpid()))


def record_sync(job_id: int, run_id: int, what: str, attempt: int) -> None:
    with psycopg.connect(database.database_url(), autocommit=True) as conn:
        conn.execute("INSERT INTO wf_crash_runs (job_id, run_id, what, attempt, pid) VALUES (%s, %s, %s, %s, %s)",
                     (job_id, run_id, what, attempt, os.getpid()))


# a -> (b, c) -> d: plain steps, outputs passed along.
diamond = jobs.workflow("wfc_diamond", queue=QUEUE)


@diamond.step(max_attempts=MAX_ATTEMPTS, backoff=no_backoff)
async def a(ctx: Any) -> Any:
    await record(ctx.job_id, ctx.run_id, "a", ctx.attempt)
    await pause()
    return ctx.input["n"]


@diamond.step(after="a", max_attempts=MAX_ATTEMPTS, backoff=no_backoff)
async def b(ctx: Any) -> Any:
    await record(ctx.job_id, ctx.run_id, "b", ctx.attempt)
    await pause()
    return ctx.outputs["a"] + 1


@diamond.step(after="a", max_attempts=MAX_ATTEMPTS, backoff=no_backoff)
def c(ctx: Any) -> Any:  # a sync step, in a thread
    record_sync(ctx.job_id, ctx.run_id, "c", ctx.attempt)
    time.sleep(random.uniform(0.0, PAUSE))
    return ctx.outputs["a"] * 2


@diamond.step(after=["b", "c"], max_attempts=MAX_ATTEMPTS, backoff=no_backoff)
async def d(ctx: Any) -> Any:
    await record(ctx.job_id, ctx.run_id, "d", ctx.attempt)
    await pause()
    return {"sum": ctx.outputs["b"] + ctx.outputs["c"]}


def diamond_outputs(n: int) -> dict[str, Any]:
    """What each step of a diamond run with input {"n": n} outputs."""
    return {"a": n, "b": n + 1, "c": n * 2, "d": {"sum": n + 1 + n * 2}}


# plan -> spread (a fan-out, paused by failed members) -> report.
class MemberFails(Exception):
    """A member asked to fail (for good: never retried)."""


@jobs.job(name="wfc.member", queue=QUEUE, max_attempts=MAX_ATTEMPTS, backoff=no_backoff, timeout=None,
          never_retry=(MemberFails,))
async def member(ctx: Any, run_id: int, i: int, failing_batches: int) -> dict[str, int]:
    """Fails (for good) while fewer than `failing_batches` earlier batches held this member."""
    await record(ctx.job_id, run_id, f"member {i}", ctx.attempt)
    await pause()
    pool = await database.pools().aget()
    async with pool.connection() as conn, aautocommitted(conn):
        cur = await conn.execute(
            """SELECT count(*) FROM livepush_jobs j JOIN livepush_job_payloads p ON p.id = j.id
               WHERE j.name = 'wfc.member' AND p.args = (SELECT args FROM livepush_job_payloads WHERE id = %s)
                 AND j.id < %s""", (ctx.job_id, ctx.job_id))
        (earlier,) = await cur.fetchone()  # type: ignore[misc]
    if earlier < failing_batches:
        raise MemberFails(f"member {i} of run {run_id} fails in batch {earlier + 1}")
    return {"i": i}


fan = jobs.workflow("wfc_fan", queue=QUEUE)


@fan.step(max_attempts=MAX_ATTEMPTS, backoff=no_backoff)
async def plan(ctx: Any) -> Any:
    await record(ctx.job_id, ctx.run_id, "plan", ctx.attempt)
    await pause()
    return {"n": ctx.input["n"]}


@fan.fan_out(after="plan", max_attempts=MAX_ATTEMPTS, backoff=no_backoff, on_batch_failure="pause")
def spread(ctx: Any, batch: Any) -> None:  # sync, in a thread: slow enough for kills to land inside
    record_sync(ctx.job_id, ctx.run_id, "spread making its batch", ctx.attempt)
    failing = ctx.input.get("failing", {})
    for i in range(ctx.outputs["plan"]["n"]):
        time.sleep(random.uniform(0.0, MAKE_PAUSE))
        batch.enqueue(member, ctx.run_id, i, failing.get(str(i), 0))


@fan.step(after="spread", max_attempts=MAX_ATTEMPTS, backoff=no_backoff)
async def report(ctx: Any) -> Any:
    await record(ctx.job_id, ctx.run_id, "report", ctx.attempt)
    await pause()
    return {"rows": ctx.outputs["spread"], "n": ctx.outputs["plan"]["n"]}
