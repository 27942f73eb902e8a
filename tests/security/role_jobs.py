"""Jobs for the runtime that runs as the runtime role (test_runtime_role.py)."""

from __future__ import annotations

from typing import Any

from livepush import jobs


@jobs.job(name="t.role.work", queue="role")
async def work(ctx: Any, steps: int) -> None:
    for i in range(1, steps + 1):
        await ctx.progress(i, steps, f"step {i}")
