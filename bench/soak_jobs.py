"""The soak test's job module (`livepush jobs soak_jobs`): each run writes one row to a table
the soak owns, so the soak can count how often every job ran and under which attempt."""

from __future__ import annotations

import asyncio
import os

import psycopg

from livepush import jobs

RUNS_TABLE = """
CREATE TABLE IF NOT EXISTS soak_runs (
    seq     bigint NOT NULL,
    job_id  bigint NOT NULL,
    attempt int NOT NULL,
    pid     int NOT NULL,
    at      timestamptz NOT NULL DEFAULT clock_timestamp()
)
"""
# name: record_run -- one row per execution of a soak job.
RECORD = "INSERT INTO soak_runs (seq, job_id, attempt, pid) VALUES (%s, %s, %s, %s)"

_conn: psycopg.AsyncConnection | None = None
_lock = asyncio.Lock()


async def _record(seq: int, job_id: int, attempt: int) -> None:
    """Insert the run's row on this process's connection, reopened after an outage."""
    global _conn
    async with _lock:
        try:
            if _conn is None or _conn.closed:
                _conn = await psycopg.AsyncConnection.connect(os.environ["LIVEPUSH_DATABASE_URL"], autocommit=True,
                                                              connect_timeout=5)
            await _conn.execute(RECORD, (seq, job_id, attempt, os.getpid()))
        except psycopg.Error:
            if _conn is not None:
                await _conn.close()
            _conn = None
            raise


# A short backoff: the soak counts repeats and losses, not how long retries wait.
@jobs.job(queue="soak", max_attempts=10, timeout=30, backoff=lambda attempt: min(0.5 * attempt, 3.0))
async def work(ctx, seq: int, hold: float) -> dict:
    """Record this run, hold the slot a moment (so kills find jobs in hand), return the seq."""
    await _record(seq, ctx.job_id, ctx.attempt)
    await asyncio.sleep(hold)
    return {"seq": seq}
