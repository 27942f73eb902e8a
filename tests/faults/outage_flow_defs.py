"""The workflow the Postgres outage tests of workflows run in child runtimes
(tests/faults/test_postgres_outage_jobs.py): a step that runs through the outage, a fan-out step
whose members are sample_jobs' `t.record`, a step that waits for a person's signal, and a last
step. Each step notes its start and end in job_runs, as sample_jobs' jobs do."""

from __future__ import annotations

import asyncio
from typing import Any

from livepush import jobs
from tests.jobs.sample_jobs import note, record

QUEUE = "outage_flows"

flow = jobs.workflow("outage_flow", queue=QUEUE)


@flow.step(timeout=120)
async def first(ctx: Any) -> Any:
    """Runs through the outage: no database call between its start and its end."""
    await note(ctx, "start")
    await asyncio.sleep(ctx.input["hold"])
    await note(ctx, "done")
    return {"n": ctx.input["n"]}


@flow.fan_out(after="first")
async def spread(ctx: Any, batch: Any) -> None:
    await note(ctx, "start")
    for i in range(ctx.outputs["first"]["n"]):
        batch.enqueue(record, f"member-{i}")


@flow.step(after="spread", wait_for="go")
async def approve(ctx: Any) -> Any:
    await note(ctx, "done")
    return ctx.signal


@flow.step(after="approve")
async def last(ctx: Any) -> Any:
    await note(ctx, "done")
    return {"members": ctx.outputs["spread"], "by": ctx.outputs["approve"]}
