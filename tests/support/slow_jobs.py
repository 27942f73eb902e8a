"""A job module for `serve --with-jobs` tests: a job that takes a while."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import psycopg

from livepush import jobs
from livepush.jobs import database
from tests.support.waiting import async_wait_for


@jobs.job(name="t.slow", queue="slow")
async def slow(ctx: Any, seconds: float) -> None:
    await asyncio.sleep(seconds)


@jobs.job(name="t.slow_sync", queue="slow")
def slow_sync(ctx: Any, seconds: float) -> None:
    """A sync job: its thread cannot be stopped before it returns."""
    time.sleep(seconds)


class StartedJob:
    """A job a runtime has started: its id, and calling it reads its state now."""

    def __init__(self, pg_url: str, job_id: int) -> None:
        self.pg_url, self.id = pg_url, job_id

    def __call__(self) -> str:
        with psycopg.connect(self.pg_url) as conn:
            return conn.execute("SELECT state FROM livepush_jobs WHERE id = %s", (self.id,)).fetchone()[0]


async def started_slow_job(pg_url: str, seconds: float, job: Any = slow) -> StartedJob:
    """Enqueue `job(seconds)` (`slow` unless told) on `pg_url` and return once a runtime runs it."""
    database.configure(pg_url)
    try:
        handle = await asyncio.to_thread(job.enqueue, seconds)
    finally:
        database.configure(None)
    state = StartedJob(pg_url, handle.id)
    await async_wait_for(lambda: state() == "running", 10, message="the slow job to start")
    return state
