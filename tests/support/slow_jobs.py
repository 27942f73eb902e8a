"""A job module for `serve --with-jobs` tests: a job that takes a while."""

from __future__ import annotations

import asyncio
from typing import Any

from livepush import jobs


@jobs.job(name="t.slow", queue="slow")
async def slow(ctx: Any, seconds: float) -> None:
    await asyncio.sleep(seconds)
