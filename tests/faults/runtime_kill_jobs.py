"""The job the runtime-kill test (test_runtime_kills.py) runs in child runtimes: as small as a job
can be, and it records every execution.

Each run inserts (job, attempt, process) into `fault_runs` and commits before it returns, so a
record survives a kill that lands between the body and the outcome's write: the table holds every
execution that got that far, which is what a rerun is counted against.
"""

from __future__ import annotations

import asyncio
import os
import random
from typing import Any

from livepush import jobs
from livepush.jobs import database

RUNS_TABLE = """
CREATE TABLE fault_runs (
    job_id  bigint NOT NULL,
    attempt integer NOT NULL,
    pid     integer NOT NULL,
    at      timestamptz NOT NULL DEFAULT clock_timestamp()
)
"""

# A run holds its slot for a moment after its record: long enough that faults find jobs in hand
# (some recorded, some not), short enough that 5,000 jobs take seconds.
HOLD = 0.04

# Every rescue spends an attempt, and one job may be in hand at several kills in a row: a job must
# never fail for that (the test asserts every job succeeds).
MAX_ATTEMPTS = 100


@jobs.job(name="faults.tiny", max_attempts=MAX_ATTEMPTS, timeout=30, backoff=lambda attempt: 0.0)
async def tiny(ctx: Any, n: int) -> None:
    """Records this execution, then holds its slot for up to HOLD seconds."""
    pool = await database.pools().aget()
    async with pool.connection() as conn:
        await conn.execute("INSERT INTO fault_runs (job_id, attempt, pid) VALUES (%s, %s, %s)",
                           (ctx.job_id, ctx.attempt, os.getpid()))
    await asyncio.sleep(random.uniform(0.0, HOLD))
