"""The demo's jobs: an "import" of N rows, each a job that reports progress."""

from __future__ import annotations

import asyncio
import logging
import random

from .. import jobs

log = logging.getLogger("livepush.demo")


@jobs.job(queue="demo", max_attempts=3, timeout=60)
async def import_row(ctx: jobs.JobContext, import_id: int, row: int) -> None:
    steps = 4
    for step in range(1, steps + 1):
        await asyncio.sleep(random.uniform(0.05, 0.3))  # stands in for real work
        await ctx.progress(step, steps, f"row {row}: step {step} of {steps}")


@jobs.job(queue="demo")
async def import_finished(ctx: jobs.JobContext, import_id: int) -> None:
    """The group's on_finish callback: runs once, after every row is done."""
    g = ctx.group
    log.info("import of group %s finished: %s succeeded, %s failed, %s cancelled", g.id, g.succeeded, g.failed, g.cancelled)
