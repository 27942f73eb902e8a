"""An async job that calls one of the jobs API's async writes (`other_job.aenqueue()`,
`jobs.acancel()`, ...) without `await` made a coroutine that never ran: nothing was enqueued,
cancelled or sent, and the job ended `succeeded` over it, with at most Python's "never awaited"
RuntimeWarning at garbage collection. It fails at once, naming the call and the fix, as a
forgotten durable ctx call does; awaited, or handed to a task, the call runs as ever."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any

import pytest

from livepush import jobs
from tests.jobs import sample_jobs
from tests.jobs import workflow_defs as wd
from livepush.jobs.api.awaited import iscoroutinefunction  # as asyncio and the frameworks read one
from tests.jobs.conftest import q
from tests.support.waiting import async_wait_for

QUEUE = "forgets"  # drained alone: what the calls would enqueue or start goes elsewhere


@jobs.job(name="fa.target", queue="fa_target")
async def target(ctx: Any, n: int) -> None:
    """What the job under test enqueues: never run here (its queue is not drained)."""


# Each write the job under test makes, from the ids the test prepared (`t`), by the name the
# job's failure gives it.
CALLS: dict[str, Callable[[dict[str, Any]], Coroutine[Any, Any, Any]]] = {
    "fa.target.aenqueue()": lambda t: target.aenqueue(1),
    "jobs.aenqueue_many()": lambda t: jobs.aenqueue_many([target.request(2)]),
    "jobs.acancel()": lambda t: jobs.acancel(t["victim"]),
    "jobs.acancel_tagged()": lambda t: jobs.acancel_tagged("fa-victim"),
    "jobs.aretry_failed()": lambda t: jobs.aretry_failed(t["failed"]),
    "jobs.adiscard_failed()": lambda t: jobs.adiscard_failed(t["failed"]),
    "jobs.apause_queue()": lambda t: jobs.apause_queue("fa_target"),
    "jobs.aresume_queue()": lambda t: jobs.aresume_queue("fa_paused"),
    "jobs.asignal()": lambda t: jobs.asignal(t["victim"], "go"),
    "jobs.aforget_periodic()": lambda t: jobs.aforget_periodic("fa.no_such_periodic"),
    "jobs.acreate_group()": lambda t: jobs.acreate_group(),
    "jobs.aadd_to_group()": lambda t: jobs.aadd_to_group(t["group"], target, 3),
    "jobs.aadd_many_to_group()": lambda t: jobs.aadd_many_to_group(t["group"], [target.request(4)]),
    "jobs.aseal_group()": lambda t: jobs.aseal_group(t["group"]),
    "jobs.acancel_group()": lambda t: jobs.acancel_group(t["group"]),
    "handle.aadd()": lambda t: jobs.GroupHandle(t["group"]).aadd(target, 5),
    "handle.aseal()": lambda t: jobs.GroupHandle(t["group"]).aseal(),
    "t_diamond.astart()": lambda t: wd.diamond.astart({"n": 2}),
    "jobs.workflows.apause()": lambda t: jobs.workflows.apause(t["run"]),
    "jobs.workflows.aresume()": lambda t: jobs.workflows.aresume(t["paused_run"]),
    "jobs.workflows.acancel()": lambda t: jobs.workflows.acancel(t["run"]),
    "jobs.workflows.askip()": lambda t: jobs.workflows.askip(t["run"], "fetch"),
    "jobs.workflows.asignal()": lambda t: jobs.workflows.asignal(t["run"], "go"),
}

# The async calls of the API that only read, and the test helpers (drain, clear): no write to lose.
NOT_WRITES = {*(f"jobs.{name}" for name in ("aget_job", "alist_failed", "alist_tagged", "ajob_state", "astatus",
                                             "aget_group", "agroup_members", "agroup_history", "adrain", "aclear")),
              "jobs.workflows.aget", "jobs.workflows.alist"}

_tasks: set[asyncio.Task[Any]] = set()  # the tasks the jobs under test started, held until they are done


@jobs.job(name="fa.forgets", queue=QUEUE, max_attempts=3, backoff=lambda attempt: 0.0)
async def forgets(ctx: Any, call: str, how: str, ids: dict[str, Any]) -> Any:
    made = CALLS[call](ids)
    if how == "awaited":
        await made
    elif how == "gathered":
        await asyncio.gather(made)
    elif how == "task":
        task = asyncio.create_task(made)  # not awaited here: the task runs it after the job returned
        _tasks.add(task)
        task.add_done_callback(_tasks.discard)
    elif how == "result used":
        return made.id  # AttributeError: a coroutine has no id
    return "returned as if it had run"


@jobs.job(name="fa.starts_a_task", queue=QUEUE)
async def starts_a_task(ctx: Any) -> str:
    """Starts a task that makes two enqueues and awaits them one after the other, and returns while
    that task awaits the first: the second is the task's, to await after the job returned."""
    made = asyncio.Event()

    async def enqueue_both() -> None:
        calls = [target.aenqueue(1), target.aenqueue(2)]
        made.set()
        for call in calls:
            await call

    task = asyncio.create_task(enqueue_both())
    _tasks.add(task)
    task.add_done_callback(_tasks.discard)
    await made.wait()
    return "returned while its task enqueues"


# Everything the calls write, but the row of the job under test (and its payload).
WRITTEN = """
SELECT 'job', to_jsonb(j)::text FROM livepush_jobs j WHERE j.name <> 'fa.forgets'
UNION ALL SELECT 'payload', to_jsonb(p)::text FROM livepush_job_payloads p
    JOIN livepush_jobs j USING (id) WHERE j.name <> 'fa.forgets'
UNION ALL SELECT 'group', to_jsonb(g)::text FROM livepush_groups g
UNION ALL SELECT 'signal', to_jsonb(s)::text FROM livepush_job_signals s
UNION ALL SELECT 'paused', to_jsonb(p)::text FROM livepush_paused_queues p
UNION ALL SELECT 'run', to_jsonb(w)::text FROM livepush_workflows w
UNION ALL SELECT 'step', to_jsonb(s)::text FROM livepush_workflow_steps s
UNION ALL SELECT 'audit', to_jsonb(a)::text FROM livepush_workflow_audit a
UNION ALL SELECT 'run signal', to_jsonb(s)::text FROM livepush_workflow_signals s
ORDER BY 1, 2
"""


async def prepared() -> dict[str, Any]:
    """What the calls act on: a scheduled job (tagged), a failed one, an open group with a member,
    a paused queue, a running workflow run and a paused one. Nothing here is on the drained queue."""
    failed = await sample_jobs.never.aenqueue()
    assert await jobs.adrain() == {"failed": 1}
    victim = await target.aenqueue(0, wait=3600, tags=["fa-victim"])
    group = await jobs.acreate_group()
    await group.aadd(target, 0)
    await jobs.apause_queue("fa_paused")
    run, paused_run = await wd.diamond.astart({"n": 1}), await wd.diamond.astart({"n": 1})
    assert await jobs.workflows.apause(paused_run.id)
    return {"victim": victim.id, "failed": failed.id, "group": group.id, "run": run.id, "paused_run": paused_run.id}


@pytest.mark.parametrize("call", list(CALLS))
async def test_a_write_whose_await_was_forgotten_fails_the_job_at_once_naming_it(jobs_db: str, call: str) -> None:
    """Each write of the jobs API an async job can make: without `await` it never ran, and the job
    fails at once (every attempt would forget it again), naming the call and the fix; nothing
    the call would have written was written."""
    ids = await prepared()
    before = q(jobs_db, WRITTEN)
    handle = await forgets.aenqueue(call, "forgotten", ids)
    assert await jobs.adrain([QUEUE]) == {"failed": 1}
    failed = await jobs.aget_job(handle.id)
    assert failed is not None and failed.attempt == 1, failed
    assert (failed.error or "").startswith(f"InvalidResultError: fa.forgets returned without awaiting {call}: "), \
        failed.error
    assert "add `await` before the call" in (failed.error or ""), failed.error
    assert q(jobs_db, WRITTEN) == before


async def test_a_write_whose_coroutine_was_used_as_its_result_fails_naming_it(jobs_db: str) -> None:
    """`handle = other_job.aenqueue(1)` then `handle.id`: the job raised "'coroutine' object has
    no attribute 'id'", retried as any AttributeError though every attempt meets it. It fails at
    once, naming the call, what it raised, and the fix."""
    handle = await forgets.aenqueue("fa.target.aenqueue()", "result used", {})
    assert await jobs.adrain([QUEUE]) == {"failed": 1}
    failed = await jobs.aget_job(handle.id)
    assert failed is not None and failed.attempt == 1, failed
    assert (failed.error or "").startswith(
        "InvalidResultError: fa.forgets raised AttributeError after it called fa.target.aenqueue() without "
        "`await`"), failed.error
    assert q(jobs_db, "SELECT count(*) FROM livepush_jobs WHERE name = 'fa.target'") == [(0,)]


@pytest.mark.parametrize("how", ["awaited", "gathered", "task"])
async def test_an_enqueue_awaited_or_handed_to_a_task_runs_and_the_job_succeeds(jobs_db: str, how: str) -> None:
    """Awaited where it is made, gathered, or handed to a task that runs it after the job
    returned: the call is not forgotten, the job succeeds and the job it enqueued is there."""
    handle = await forgets.aenqueue("fa.target.aenqueue()", how, {})
    assert await jobs.adrain([QUEUE]) == {"succeeded": 1}
    done = await jobs.aget_job(handle.id)
    assert done is not None and done.state == "succeeded", done
    await async_wait_for(lambda: q(jobs_db, "SELECT args FROM livepush_jobs j JOIN livepush_job_payloads p USING (id) "
                                            "WHERE j.name = 'fa.target'") == [([1],)],
                         10.0, message="the job the call enqueued")


async def test_a_write_made_in_a_task_the_job_started_is_that_tasks_to_await_after_the_job_returned(
        jobs_db: str) -> None:
    """A task the job started made its calls, and awaits them one by one after the job returned:
    they are the task's, not forgotten by the job. The job succeeds, and every call runs."""
    handle = await starts_a_task.aenqueue()
    assert await jobs.adrain([QUEUE]) == {"succeeded": 1}, await jobs.aget_job(handle.id)
    await async_wait_for(lambda: q(jobs_db, "SELECT p.args FROM livepush_jobs j JOIN livepush_job_payloads p USING (id) "
                                            "WHERE j.name = 'fa.target' ORDER BY j.id") == [([1],), ([2],)],
                         10.0, message="both jobs the task enqueued")


async def test_a_write_made_outside_any_job_is_left_to_its_caller() -> None:
    """Outside a job no ctx watches the call: it is the coroutine an `async def` gives, and an
    `async def` to asyncio and to the frameworks that call it (a background task of
    `some_job.aenqueue` is awaited, not run in a thread)."""
    made = target.aenqueue(1)
    try:
        assert asyncio.iscoroutine(made)
    finally:
        made.close()
    for call in (target.aenqueue, jobs.acancel, jobs.GroupHandle(1).aadd, wd.diamond.astart, jobs.workflows.asignal):
        assert iscoroutinefunction(call), call


def test_every_async_write_of_the_jobs_api_is_among_those_checked() -> None:
    """A write added to the API is added here too, where its forgotten `await` is shown to fail."""
    exported = {f"jobs.{name}" for name in jobs.__all__
                if name.startswith("a") and iscoroutinefunction(getattr(jobs, name))}
    verbs = {f"jobs.workflows.{verb}" for verb in jobs.workflows.__all__ if verb.startswith("a")}
    methods = {"fa.target.aenqueue()", "handle.aadd()", "handle.aseal()", "t_diamond.astart()"}
    assert {f"{name}()" for name in (exported | verbs) - NOT_WRITES} == set(CALLS) - methods
