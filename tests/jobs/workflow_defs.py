"""Workflows the workflow tests run (defined at import, as a user's module would)."""

from __future__ import annotations

import asyncio
from typing import Any

from livepush import jobs
from tests.jobs.durable_jobs import body
from tests.jobs.sample_jobs import until_flag

# fetch -> (left, right) -> join: a diamond, outputs passed along.
diamond = jobs.workflow("t_diamond", queue="flows")


@diamond.step()
async def fetch(ctx: Any) -> Any:
    await body(ctx, "fetch")
    return {"n": ctx.input["n"]}


@diamond.step(after=["fetch"])
async def left(ctx: Any) -> Any:
    return ctx.outputs["fetch"]["n"] + 1


@diamond.step(after="fetch")
def right(ctx: Any) -> Any:  # a sync step, in a thread
    return ctx.outputs["fetch"]["n"] * 10


@diamond.step(after=["left", "right"])
async def join(ctx: Any) -> Any:
    return {"sum": ctx.outputs["left"] + ctx.outputs["right"], "input": ctx.input}


# A step whose behaviour the test chooses through the run's input: a flow verb, a failure, a hold.
verbs = jobs.workflow("t_verbs", queue="flows")


@verbs.step(max_attempts=1)
async def first(ctx: Any) -> Any:
    what = ctx.input.get("first")
    if what == "fail":
        raise ValueError("first fails")
    if what == "hold":
        await until_flag(ctx.input["flag"])
    if what in ("skip", "cancel", "pause"):
        getattr(ctx.flow, what)(f"asked to {what}")
    if what == "finish":
        ctx.flow.finish({"early": True})
    if what == "finish large":  # the output the input sizes: the run's own output is the same again
        ctx.flow.finish({"rows": "x" * ctx.input["chars"]})
    if what in ("skip in a task", "finish in a task"):
        # The verb in one of the step's own tasks, beside another that it cuts short.
        async def verb() -> None:
            getattr(ctx.flow, what.split()[0])({"early": True} if what.startswith("finish") else "in a task")

        async with asyncio.TaskGroup() as tasks:
            tasks.create_task(asyncio.sleep(30))
            tasks.create_task(verb())
    if what == "reattempt" and ctx.attempt == 1 and not await _seen(ctx):
        ctx.flow.reattempt(0.2)
    if what == "reattempt in a task" and ctx.attempt == 1 and not await _seen(ctx):
        async def again() -> None:
            ctx.flow.reattempt(0.2)

        async with asyncio.TaskGroup() as tasks:
            tasks.create_task(again())
    return "first done"


async def _seen(ctx: Any) -> bool:
    """Whether an earlier run of this step already asked to be run again (records it if not)."""
    from tests.jobs.sample_jobs import _pool

    pool = await _pool()
    async with pool.connection() as conn:
        cur = await conn.execute("INSERT INTO job_flags VALUES (%s) ON CONFLICT DO NOTHING",
                                 (f"reattempt-{ctx.run_id}",))
        return cur.rowcount == 0


@verbs.step(after=["first"])
async def second(ctx: Any) -> Any:
    await body(ctx, "second")
    return {"after": ctx.outputs.get("first")}


# A step that waits for a person's approval.
approval = jobs.workflow("t_approval", queue="flows")


@approval.step()
async def prepare(ctx: Any) -> Any:
    return "prepared"


@approval.step(after=["prepare"], wait_for="approve", wait_timeout=30, on_timeout="cancel")
async def publish(ctx: Any) -> Any:
    return {"approved_by": ctx.signal["by"]}


two_approvals = jobs.workflow("t_two_approvals", queue="flows")


@two_approvals.step(wait_for="go")
async def first_approval(ctx: Any) -> Any:
    if ctx.input.get("flag"):
        await until_flag(ctx.input["flag"])  # its body runs on after it took its signal
    return ctx.signal


@two_approvals.step(after=["first_approval"], wait_for="go")
async def second_approval(ctx: Any) -> Any:
    return ctx.signal


quick_timeout = jobs.workflow("t_quick_timeout", queue="flows")


@quick_timeout.step(wait_for="approve", wait_timeout=0.3, on_timeout="skip")
async def maybe(ctx: Any) -> Any:
    return "approved"


@quick_timeout.step(after=["maybe"])
async def after_maybe(ctx: Any) -> Any:
    return "went on"


# A fan-out step; members that fail (True) or end cancelled ("cancel") are chosen by the input.
@jobs.job(name="t.member", queue="flows", max_attempts=1)
async def member(ctx: Any, i: int, fail: bool | str) -> None:
    if fail:
        from tests.jobs.sample_jobs import _pool

        pool = await _pool()
        async with pool.connection() as conn:
            row = await (await conn.execute("SELECT 1 FROM job_flags WHERE name = 'members-ok'")).fetchone()
        if row is None and fail == "cancel":
            raise jobs.JobCancelled(f"member {i} cancels itself")
        if row is None:
            raise ValueError(f"member {i} fails")


fan = jobs.workflow("t_fan", queue="flows")


@fan.step()
async def plan(ctx: Any) -> Any:
    return list(range(ctx.input["n"]))


@fan.fan_out(after=["plan"], on_batch_failure="pause")
def rows(ctx: Any, batch: Any) -> None:
    for i in ctx.outputs["plan"]:
        fail = "cancel" if i in ctx.input.get("cancelling", []) else i in ctx.input.get("failing", [])
        batch.enqueue(member, i, fail)


@fan.step(after=["rows"])
async def report(ctx: Any) -> Any:
    return {"rows": ctx.outputs["rows"]}


# A run that fails while its fan-out step waits for a batch of slow members.
@jobs.job(name="t.slow_member", queue="flows", max_attempts=1, timeout=None)
async def slow_member(ctx: Any, i: int) -> None:
    import asyncio

    await asyncio.sleep(0.2)


doomed = jobs.workflow("t_doomed", queue="flows")


@doomed.step()
async def begin(ctx: Any) -> Any:
    return 1


@doomed.fan_out(after=["begin"])
def many(ctx: Any, batch: Any) -> None:
    for i in range(40):
        batch.enqueue(slow_member, i)


@doomed.step(after=["begin"], max_attempts=1)
async def breaks(ctx: Any) -> Any:
    import asyncio

    await asyncio.sleep(0.3)
    raise ValueError("breaks")


# Two steps whose outputs the next step reads, once it has its signal.
two_outputs = jobs.workflow("t_two_outputs", queue="flows")


@two_outputs.step()
async def one(ctx: Any) -> Any:
    return "one"


@two_outputs.step()
async def two(ctx: Any) -> Any:
    return "two"


@two_outputs.step(after=["one", "two"], wait_for="go")
async def sizes(ctx: Any) -> Any:
    return {name: len(ctx.outputs[name]) for name in ("one", "two")}


# Two steps side by side: `ender` ends the run as the input says once its flag is set, while
# `bystander` runs on until it is stopped.
siblings = jobs.workflow("t_siblings", queue="flows")


@siblings.step(max_attempts=1)
async def ender(ctx: Any) -> Any:
    await until_flag(ctx.input["flag"])
    if ctx.input["end"] == "fail":
        raise ValueError("ender fails")
    getattr(ctx.flow, ctx.input["end"])({"ended": True} if ctx.input["end"] == "finish" else "asked to")
    return None


@siblings.step(max_attempts=1)
async def bystander(ctx: Any) -> Any:
    await until_flag("never")
    return "ran to its end"


# A fan-out step whose function ends the step with a flow verb after enqueuing members: the
# verb the input names (skip, or complete with an output of its own).
fan_verbs = jobs.workflow("t_fan_verbs", queue="flows")


@fan_verbs.fan_out()
def maybe_spread(ctx: Any, batch: Any) -> None:
    for i in range(ctx.input["n"]):
        batch.enqueue(member, i, False)
    if ctx.input["verb"] == "skip":
        ctx.flow.skip("nothing to import")
    ctx.flow.complete({"planned": len(batch)})


@fan_verbs.step(after=["maybe_spread"])
async def after_spread(ctx: Any) -> Any:
    return ctx.outputs.get("maybe_spread")


# A wait that runs out while its run is paused: long enough to pause the run while it waits.
paused_timeout = jobs.workflow("t_paused_timeout", queue="flows")


@paused_timeout.step(wait_for="approve", wait_timeout=2, on_timeout="cancel")
async def approved(ctx: Any) -> Any:
    return ctx.signal
