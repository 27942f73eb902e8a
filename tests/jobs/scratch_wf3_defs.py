from __future__ import annotations
from typing import Any
from livepush import jobs
from tests.jobs.sample_jobs import until_flag

QUEUE = "s3"
odd = jobs.workflow("s3_odd", queue=QUEUE)

@odd.step(max_attempts=1)
async def a(ctx: Any) -> Any:
    w = ctx.input["what"]
    if w == "set":
        return {1, 2}
    if w == "nul":
        ctx.flow.complete("a\x00b")
    if w == "nulout":
        return {"k\x00": 1}
    if w == "bigint":
        return 10**30
    return 1

@odd.step(after="a")
async def b(ctx: Any) -> Any:
    return ctx.outputs

timeout_flow = jobs.workflow("s3_timeout", queue=QUEUE)

@timeout_flow.step(wait_for="go", wait_timeout=1, on_timeout="skip")
async def wt(ctx: Any) -> Any:
    return ctx.signal

@timeout_flow.step(after="wt")
async def after_wt(ctx: Any) -> Any:
    return 2
