"""Workflows the tests of workflow corners run (tests/jobs/test_workflows_corners.py): a step that
pauses its run after its signal came, a step that finishes the run beside a slow sibling, and a
step that fails the run beside a step waiting for a signal."""

from __future__ import annotations

import asyncio
import os
import threading
from typing import Any

from livepush import jobs
from tests.jobs.sample_jobs import record, until_flag

QUEUE = "wfd"

approve_twice = jobs.workflow("wfd_approve_twice", queue=QUEUE)


@approve_twice.step(wait_for="go")
async def approve(ctx: Any) -> Any:
    if ctx.signal.get("pause"):
        ctx.flow.pause("looked wrong")
    return ctx.signal


finishes_early = jobs.workflow("wfd_finishes_early", queue=QUEUE)


@finishes_early.step()
async def first(ctx: Any) -> Any:
    return 1


@finishes_early.step(after="first")
async def done_early(ctx: Any) -> Any:
    await until_flag("finish-now")
    ctx.flow.finish({"early": True})


@finishes_early.step(after="first", max_attempts=1)
async def slow_sibling(ctx: Any) -> Any:
    await until_flag("sibling-go")
    raise ValueError("the sibling fails after the run finished")


fails_while_waiting = jobs.workflow("wfd_fails_while_waiting", queue=QUEUE)


@fails_while_waiting.step()
async def start(ctx: Any) -> Any:
    return 1


@fails_while_waiting.step(after="start", max_attempts=1)
async def breaks(ctx: Any) -> Any:
    await until_flag("break-now")
    raise ValueError("breaks")


@fails_while_waiting.step(after="start", wait_for="go")
async def waits(ctx: Any) -> Any:
    return "approved"


two_approvals = jobs.workflow("wfd_two_approvals", queue=QUEUE)


@two_approvals.step()
async def gather(ctx: Any) -> Any:
    await until_flag(f"gather-{ctx.run_id}")
    return 1


@two_approvals.step(after="gather", wait_for="go")
async def legal(ctx: Any) -> Any:
    return ctx.signal


@two_approvals.step(after="legal", wait_for="go")
async def finance(ctx: Any) -> Any:
    return ctx.signal


chain = jobs.workflow("wfd_chain", queue=QUEUE)


@chain.step()
async def load(ctx: Any) -> Any:
    await until_flag(f"load-{ctx.run_id}")
    return {"rows": 3}


@chain.step(after="load")
async def check(ctx: Any) -> Any:
    return "checked"


@chain.step(after="check")
async def publish(ctx: Any) -> Any:
    return {"saw": sorted(ctx.outputs)}


# Outputs with floats JSON text writes with an exponent (from 1e16 up), passed along and finished with.
FLOATS = {"big": 1e16, "huge": 1.5e300, "plain": 2.5}
floats = jobs.workflow("wfd_floats", queue=QUEUE)


@floats.step()
async def measure(ctx: Any) -> Any:
    return FLOATS


@floats.step(after="measure")
async def total(ctx: Any) -> Any:
    seen = ctx.outputs["measure"]
    ctx.flow.finish({"seen": seen, "types": {k: type(v).__name__ for k, v in seen.items()}})


# Sync steps side by side, more of them than the event loop's default thread pool has threads
# (at most 32): each runs only once all of them run at once.
SIDE_BY_SIDE = 40
side_by_side = jobs.workflow("wfd_side_by_side", queue=QUEUE)
_barriers: dict[int, threading.Barrier] = {}
_barriers_lock = threading.Lock()


def _together(ctx: Any) -> Any:
    with _barriers_lock:
        barrier = _barriers.setdefault(ctx.run_id, threading.Barrier(SIDE_BY_SIDE))
    barrier.wait(timeout=15)
    return ctx.step


for _n in range(SIDE_BY_SIDE):
    side_by_side.step(name=f"s{_n}", max_attempts=1)(_together)


# Two steps side by side that wait for one signal name: both started (their jobs queued) at once.
side_approvals = jobs.workflow("wfd_side_approvals", queue=QUEUE)


@side_approvals.step(wait_for="go")
async def north(ctx: Any) -> Any:
    return ctx.signal


@side_approvals.step(wait_for="go")
async def south(ctx: Any) -> Any:
    return ctx.signal


# Sync steps that stop with StopIteration (next() on an exhausted iterator), in the ways a step
# runs without a timeout: a step given timeout=None, and a fan-out step's function.
stops = jobs.workflow("wfd_stops", queue=QUEUE)


@stops.step(timeout=None, max_attempts=1)
def exhausted(ctx: Any) -> Any:
    return next(iter(()))


stops_fanning = jobs.workflow("wfd_stops_fanning", queue=QUEUE)


@stops_fanning.fan_out(max_attempts=1)
def exhausted_batch(ctx: Any, batch: Any) -> None:
    next(iter(()))


# An async fan-out step that awaits its batch's calls, as an async job awaits ctx.group.enqueue.
awaits_batch = jobs.workflow("wfd_awaits_batch", queue=QUEUE)


@awaits_batch.fan_out(max_attempts=1)
async def awaited_batch(ctx: Any, batch: Any) -> None:
    if ctx.input == "enqueue_many":
        await batch.enqueue_many([record.request("never")])
    else:
        await batch.enqueue(record, "never")


# A step that is an object with an async __call__ (a callable class instance), as @jobs.job takes one.
class _Greeter:
    async def __call__(self, ctx: Any) -> Any:
        await asyncio.sleep(0)
        return {"hello": ctx.input}


greets = jobs.workflow("wfd_greets", queue=QUEUE)
greets.step(name="greet", max_attempts=1)(_Greeter())


skips_oddly = jobs.workflow("wfd_skips_oddly", queue=QUEUE)


@skips_oddly.step()
async def odd(ctx: Any) -> Any:
    ctx.flow.skip("bad\x00row \ud800 in the input")


@skips_oddly.step(after="odd")
async def after_odd(ctx: Any) -> Any:
    return "went on"


# Steps that return a coroutine unrun: an async step that forgot its `await`, and a sync wrapper
# (as a decorator may make) around an async function, which therefore ran in a thread.
async def _load(ctx: Any) -> Any:
    return {"rows": 3}


forgets_await = jobs.workflow("wfd_forgets_await", queue=QUEUE)


@forgets_await.step()
async def unawaited(ctx: Any) -> Any:
    return _load(ctx)


wraps_async = jobs.workflow("wfd_wraps_async", queue=QUEUE)


def _sync_wrapper(ctx: Any) -> Any:
    return _load(ctx)


wraps_async.step(name="wrapped")(_sync_wrapper)


# Steps that hand a flow verb a coroutine unrun as the output: a forgotten `await` inside
# ctx.flow.complete(...) and ctx.flow.finish(...).
completes_unawaited = jobs.workflow("wfd_completes_unawaited", queue=QUEUE)


@completes_unawaited.step()
async def completes(ctx: Any) -> Any:
    ctx.flow.complete(_load(ctx))


finishes_unawaited = jobs.workflow("wfd_finishes_unawaited", queue=QUEUE)


@finishes_unawaited.step()
async def finishes(ctx: Any) -> Any:
    ctx.flow.finish(_load(ctx))


# Steps whose output is not plain JSON: a set returned, a set inside the output, and a set given
# to ctx.flow.finish() as the run's output.
outputs_a_set = jobs.workflow("wfd_outputs_a_set", queue=QUEUE)


@outputs_a_set.step()
def resize(ctx: Any) -> Any:
    return {1, 2}


nests_a_set = jobs.workflow("wfd_nests_a_set", queue=QUEUE)


@nests_a_set.step()
async def measure(ctx: Any) -> Any:
    return {"sizes": [1, {2}]}


finishes_with_a_set = jobs.workflow("wfd_finishes_with_a_set", queue=QUEUE)


@finishes_with_a_set.step()
async def wraps_up(ctx: Any) -> Any:
    ctx.flow.finish({"done": {1}})


# A fan-out step whose members carry a large argument each and fail until the flag
# 'padded-members-ok' is set: its failures pause the run.
@jobs.job(name="wfd.padded_member", queue=QUEUE, max_attempts=1)
async def padded_member(ctx: Any, i: int, pad: str) -> int:
    from tests.jobs.sample_jobs import _pool

    pool = await _pool()
    async with pool.connection() as conn:
        row = await (await conn.execute("SELECT 1 FROM job_flags WHERE name = 'padded-members-ok'")).fetchone()
    if row is None:
        raise ValueError(f"member {i} fails")
    return i


padded = jobs.workflow("wfd_padded", queue=QUEUE)


@padded.fan_out()
def padded_rows(ctx: Any, batch: Any) -> None:
    for i in range(ctx.input["n"]):
        batch.enqueue(padded_member, i, os.urandom(ctx.input["pad"] // 2).hex())  # compresses not at all


# Steps whose own code waits again for the signal their wait_for= names: refused at the call.
waits_for_its_own = jobs.workflow("wfd_waits_for_its_own", queue=QUEUE)


@waits_for_its_own.step(wait_for="go", max_attempts=3)
async def waits_again(ctx: Any) -> Any:
    return await ctx.wait_for_signal("go", timeout=3600)


sync_waits_for_its_own = jobs.workflow("wfd_sync_waits_for_its_own", queue=QUEUE)


@sync_waits_for_its_own.step(wait_for="go", max_attempts=3)
def sync_waits_again(ctx: Any) -> Any:
    return ctx.wait_for_signal("go", timeout=3600)


# Steps that wait for a signal and name none: the call's own mistake, as in a job's code.
waits_for_no_name = jobs.workflow("wfd_waits_for_no_name", queue=QUEUE)


@waits_for_no_name.step(max_attempts=3)
async def waits_unnamed(ctx: Any) -> Any:
    return await ctx.wait_for_signal(timeout=5)


sync_waits_for_no_name = jobs.workflow("wfd_sync_waits_for_no_name", queue=QUEUE)


@sync_waits_for_no_name.step(max_attempts=3)
def sync_waits_unnamed(ctx: Any) -> Any:
    return ctx.wait_for_signal()


# A step whose output passes what one jsonb value holds (a string of 256 MiB and more), then a
# step that must not run.
outputs_too_much = jobs.workflow("wfd_outputs_too_much", queue=QUEUE)


@outputs_too_much.step(max_attempts=3)
async def too_much(ctx: Any) -> Any:
    return "x" * 270_000_000


@outputs_too_much.step(after="too_much")
async def after_too_much(ctx: Any) -> Any:
    return "never"


# A step parked in its body on a signal of its own (ctx.wait_for_signal), beside a step of the
# same run that only a runtime defining it claims.
parks_beside = jobs.workflow("wfd_parks_beside", queue=QUEUE)


@parks_beside.step()
async def parked(ctx: Any) -> Any:
    return await ctx.wait_for_signal("note")


@parks_beside.step()
async def beside(ctx: Any) -> Any:
    return "beside"


@jobs.job(name="wfd.plain", queue=QUEUE)
async def plain(ctx: Any) -> None:
    """A plain job on the steps' queue."""
