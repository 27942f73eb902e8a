"""An application written the way the docs show livepush's Python API, type-checked by
tests/test_typing.py with `mypy --strict`; it is never imported or run.

Every line must type-check, except those ending in `# error: [code]`, which must fail with that
error code and no other: they are what a type checker catches for a user (a job enqueued with
arguments its function does not take, a misspelt name)."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from typing import Any, assert_type

import livepush
from livepush import jobs
from livepush.sessions import Session

# ---- publishing and sessions: every ttl= takes seconds, a timedelta or None ----------------------
assert_type(livepush.publish("chat:lobby", {"text": "hi"}), str)
assert_type(livepush.publish_many([("user:7", {"a": 1}), ("user:8", [1, 2])]), list[str])
assert_type(livepush.sign_topic("job:42", ttl=timedelta(hours=1)), str)
assert_type(livepush.sign_topic("job:42", ttl=None), str)
assert_type(livepush.sessions.issue("user-7", ttl=timedelta(days=1)), str)
assert_type(livepush.sessions.revoke_subject("user-7"), float)
livepush.pubish("chat:lobby", {"text": "hi"})  # error: [attr-defined]
from livepush import Allw  # error: [attr-defined]


def authorize(session: Session | None, topic: str) -> bool:
    return session is not None


app = livepush.App(rules=[livepush.Allow("public:*", anonymous=True), livepush.Allow("user:{subject}")],
                   authorize=authorize, reverify_interval=timedelta(minutes=1))


# ---- jobs: @jobs.job keeps the function's parameters, which enqueue() and request() check -------
@jobs.job(queue="imports", max_attempts=5, timeout=timedelta(minutes=1), never_retry=(ValueError,))
async def import_row(ctx: jobs.JobContext, import_id: int, row: dict[str, Any]) -> None:
    await ctx.progress(0, 10, "parsing")
    group = ctx.group
    if group is not None:  # None for a job enqueued on its own
        await group.enqueue(import_row, import_id, row)
    ctx.group.id  # error: [union-attr]


@jobs.job
def resize(ctx: jobs.SyncJobContext, image_id: int, width: int = 640) -> int:
    ctx.progress(1, 2, "resizing")
    ctx.sleep("settle", 0.5)
    ctx.sleep("settle")  # error: [call-overload]
    return image_id * width


@jobs.job(backoff=lambda attempt: timedelta(seconds=10 * attempt))
async def report(ctx: jobs.JobContext, import_id: int) -> None:
    group = ctx.group
    if group is not None:  # an on_finish callback: the finished group's counts
        assert_type(group.succeeded, int)
        group.succeded  # error: [attr-defined]
    await ctx.checkpoint("total", sum, [1, 2])
    await ctx.checkpoint("total", sum, [1, 2], start=1)  # error: [arg-type]
    await ctx.sleep("cool down", timedelta(minutes=5))
    await ctx.sleep("cool down", 300)
    await ctx.sleep(300)  # error: [call-overload]
    await ctx.wait_for_signal("approved", timeout=timedelta(days=1))
    await ctx.wait_for_signal(timeout=60)  # error: [call-overload]


@jobs.periodic("*/5 * * * *", timezone="UTC", queue="maintenance")
async def sweep(ctx: jobs.JobContext, tick: str) -> None: ...


row: dict[str, Any] = {"a": 1}
assert_type(import_row.enqueue(1, row), jobs.JobHandle)
assert_type(resize.enqueue(7), jobs.JobHandle)  # width has a default
assert_type(import_row.enqueue(1, row, wait=timedelta(minutes=5), key="import:1", tags=["import:1"]), jobs.JobHandle)
assert_type(import_row.enqueue(1, row, at=datetime(2030, 1, 1, tzinfo=timezone.utc)), jobs.JobHandle)
assert_type(import_row.request(1, row), jobs.JobRequest)
assert_type(sweep.enqueue("2030-01-01T12:05:00+00:00"), jobs.JobHandle)
import_row.enqueue("1", row)  # error: [call-overload]
import_row.enqueue(1)  # error: [call-overload]
import_row.request(1, row, "extra")  # error: [call-overload]
import_row.enqueue(1, row, wiat=5)  # error: [call-overload]
import_row.delay(1, row)  # error: [attr-defined]
jobs.enqueue(import_row, 1, row)  # error: [attr-defined]


def called_as_a_function(ctx: jobs.SyncJobContext) -> None:
    assert_type(resize(ctx, 3), int)  # still the plain function
    resize(ctx, "3")  # error: [arg-type]


job: jobs.JobFunction = import_row  # a bare JobFunction: any job
info = jobs.get_job(1)
assert_type(info, jobs.JobInfo | None)

with jobs.group(on_finish=report.request(7)) as g:
    g.enqueue(import_row.request(7, row), key="import:7:row:1")  # request() checks the arguments
assert_type(g.handle, jobs.GroupHandle)

# ---- workflows: the step decorators keep the function; start() returns a WorkflowHandle ---------
flow = jobs.workflow("nightly_import", queue="imports")


@flow.step
async def fetch(ctx: jobs.StepContext) -> dict[str, Any]:
    return {"rows": [ctx.input["source"]]}


@flow.step(after=["fetch"], wait_for="approval", wait_timeout=3600)
def approve(ctx: jobs.StepContext) -> dict[str, Any]:
    return {"by": ctx.signal["by"]}


run = flow.start({"source": "s3://bucket/file.csv"})
assert_type(run, jobs.WorkflowHandle)
assert_type(jobs.workflows.pause(run.id, actor="ana", reason="bad data"), bool)
jobs.workflows.paus(run.id)  # error: [attr-defined]


def step_called_as_a_function(ctx: jobs.StepContext) -> None:
    assert_type(approve(ctx), dict[str, Any])


async def embedded() -> None:
    runtime = jobs.Runtime(["myapp.jobs"], shutdown_timeout=timedelta(seconds=30), install_signals=False)
    await runtime.wait_started(timeout=timedelta(seconds=10))
    assert_type(await flow.astart({"source": "x"}, key="nightly"), jobs.WorkflowHandle)
