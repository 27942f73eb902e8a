"""Job functions with claim limits, run by child runtimes in test_jobs_limits.py.

Each run notes its start and end in `limit_runs` (created by LIMIT_RUNS_TABLE), with the number
of running jobs of its key that the database showed at its start.
"""

from __future__ import annotations

import asyncio
import os
from typing import Any

from livepush import jobs
from livepush.jobs import database
from tests.jobs.sample_jobs import until_flag

LIMIT_RUNS_TABLE = """
CREATE TABLE IF NOT EXISTS limit_runs (
    job_id   bigint NOT NULL,
    name     text NOT NULL,
    key      text,
    phase    text NOT NULL,
    pid      integer NOT NULL,
    running  integer,
    at       timestamptz NOT NULL DEFAULT clock_timestamp()
)
"""


async def note(ctx: Any, name: str, phase: str, key: Any = None) -> None:
    pool = await database.pools().aget()
    async with pool.connection() as conn:
        await conn.execute("""
            INSERT INTO limit_runs (job_id, name, key, phase, pid, running)
            SELECT %(id)s, %(name)s, %(key)s, %(phase)s, %(pid)s,
                   (SELECT count(*) FROM livepush_jobs j
                    WHERE j.state = 'running' AND j.name = %(name)s AND j.concurrency_key = %(json_key)s)""",
                           {"id": ctx.job_id, "name": name, "key": None if key is None else str(key),
                            "phase": phase, "pid": os.getpid(),
                            "json_key": None if key is None else f'"{key}"'})


@jobs.job(name="t.per_tenant", concurrency=("tenant", 2), timeout=120)
async def per_tenant(ctx: Any, tenant: str, seconds: float = 0.2) -> None:
    """Holds its slot for `seconds`; at most 2 at once per tenant."""
    await note(ctx, "t.per_tenant", "start", tenant)
    await asyncio.sleep(seconds)
    await note(ctx, "t.per_tenant", "done", tenant)


@jobs.job(name="t.enqueues_per_tenant")
async def enqueues_per_tenant(ctx: Any, tenant: str) -> None:
    """A plain job whose follow-up has limits: enqueues one t.per_tenant job of `tenant`."""
    await per_tenant.aenqueue(tenant, 0.0)


@jobs.job(name="t.tenant_flag", concurrency=("tenant", 1), timeout=120)
async def tenant_flag(ctx: Any, tenant: str, flag: str) -> None:
    """Holds its tenant's only slot until the row `flag` appears in job_flags."""
    await note(ctx, "t.tenant_flag", "start", tenant)
    await until_flag(flag)
    await note(ctx, "t.tenant_flag", "done", tenant)


@jobs.job(name="t.rated", rate="10/s")
async def rated(ctx: Any) -> None:
    """Starts at most 10 a second, across every runtime."""
    await note(ctx, "t.rated", "start")


@jobs.job(name="t.plain")
async def plain(ctx: Any, seconds: float = 0.0) -> None:
    """No limits."""
    await note(ctx, "t.plain", "start")
    if seconds:
        await asyncio.sleep(seconds)
