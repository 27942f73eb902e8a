"""Durable job functions for the kill -9 tests (tests/jobs/test_durable_crashes.py), run by child
runtimes: a parent with checkpoints around two groups of children, each child with a checkpoint.

Every checkpoint body records its run in `crash_bodies` (job, checkpoint name, attempt, process,
and when it started: clock_timestamp() of an autocommit insert, committed before the body goes on),
so a test can tell whether a body ran after its result was committed. Random short awaits between
and inside the steps spread the instants at which a SIGKILL lands.
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

BODIES_TABLE = """
CREATE TABLE IF NOT EXISTS crash_bodies (
    job_id  bigint NOT NULL,
    name    text NOT NULL,
    attempt integer NOT NULL,
    pid     integer NOT NULL,
    at      timestamptz NOT NULL DEFAULT clock_timestamp()
)
"""

# A rescue counts an attempt, and one job may be interrupted by many kills in a row: never fail
# it for that.
MAX_ATTEMPTS = 50
PAUSE = 0.02  # seconds, at most, of each random await
SECOND_FAN = 2  # children of the parent's second group
CHECKPOINTS = ("start", "double", "middle", "end")  # the parent's, in order


async def pause() -> None:
    # Timing only, never the order of durable calls: a replay must meet the same calls.
    await asyncio.sleep(random.uniform(0.0, PAUSE))


async def body(ctx: Any, name: str, value: Any) -> Any:
    """A checkpoint body: records that it started, then returns `value` a little later."""
    pool = await database.pools().aget()
    # Autocommit: the record must survive a kill that lands before the body returns.
    async with pool.connection() as conn, aautocommitted(conn):
        await conn.execute("INSERT INTO crash_bodies (job_id, name, attempt, pid) VALUES (%s, %s, %s, %s)",
                           (ctx.job_id, name, ctx.attempt, os.getpid()))
    # A kill here: the body ran but its result is not stored, so the next run must run it again.
    await pause()
    return value


def body_sync(job_id: int, attempt: int, name: str, value: Any) -> Any:
    """`body` as a sync function: an async job runs it in a thread."""
    with psycopg.connect(database.database_url(), autocommit=True) as conn:
        conn.execute("INSERT INTO crash_bodies (job_id, name, attempt, pid) VALUES (%s, %s, %s, %s)",
                     (job_id, name, attempt, os.getpid()))
    time.sleep(random.uniform(0.0, PAUSE))
    return value


@jobs.job(name="crash.child", max_attempts=MAX_ATTEMPTS, timeout=None, backoff=lambda attempt: 0.0)
async def child(ctx: Any, tag: int, i: int) -> dict[str, int]:
    await pause()
    square = await ctx.checkpoint("square", body, ctx, "square", i * i)
    await pause()
    return {"tag": tag, "i": i, "square": square}


@jobs.job(name="crash.parent", max_attempts=MAX_ATTEMPTS, timeout=None, backoff=lambda attempt: 0.0)
async def parent(ctx: Any, tag: int, fan: int) -> dict[str, Any]:
    """Two checkpoints, `fan` children, a checkpoint, SECOND_FAN more children, a last checkpoint."""
    start = await ctx.checkpoint("start", body, ctx, "start", tag)
    await pause()
    double = await ctx.checkpoint("double", body_sync, ctx.job_id, ctx.attempt, "double", start * 2)
    await pause()
    first = await ctx.run_children([child.request(tag, i) for i in range(fan)])
    await pause()
    middle = await ctx.checkpoint("middle", body, ctx, "middle", sum(r["square"] for r in first))
    await pause()
    second = await ctx.run_children([child.request(tag, fan + i) for i in range(SECOND_FAN)])
    await pause()
    end = await ctx.checkpoint("end", body, ctx, "end", middle + sum(r["square"] for r in second) + double)
    return {"start": start, "double": double, "first": first, "middle": middle, "second": second, "end": end}


def expected(tag: int, fan: int) -> dict[str, Any]:
    """What `parent(tag, fan)` returns."""
    first = [{"tag": tag, "i": i, "square": i * i} for i in range(fan)]
    second = [{"tag": tag, "i": i, "square": i * i} for i in range(fan, fan + SECOND_FAN)]
    middle = sum(r["square"] for r in first)
    return {"start": tag, "double": tag * 2, "first": first, "middle": middle, "second": second,
            "end": middle + sum(r["square"] for r in second) + tag * 2}
