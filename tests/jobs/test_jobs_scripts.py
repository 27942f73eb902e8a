"""A job defined in a script run directly is named `__main__.fn`, which no runtime started with
`livepush jobs MODULE` defines: its first enqueue to a database that other live runtimes serve
warns once, naming the fix; the same script's jobs.drain() runs it as before (docs/jobs.md)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import pytest

from livepush import jobs
from livepush.jobs.api.functions import JobFunction
from tests.jobs.conftest import q, running
from tests.support.waiting import async_wait_for

QUEUE = "scripts-test"


def script_job(fn: Callable[..., Any]) -> Any:
    """`fn` decorated as if its script had been run directly (`python script.py`)."""
    fn.__module__ = "__main__"
    return jobs.job(queue=QUEUE)(fn)


async def served_elsewhere(ctx: Any) -> None:
    pass


async def drained_here(ctx: Any) -> None:
    pass


async def grouped(ctx: Any) -> None:
    pass


async def added(ctx: Any) -> None:
    pass


async def added_async(ctx: Any) -> None:
    pass


served_elsewhere = script_job(served_elsewhere)
drained_here = script_job(drained_here)
grouped, added, added_async = script_job(grouped), script_job(added), script_job(added_async)


def named_script_job(qualname: str) -> Any:
    """A script's job that does nothing, named `__main__.<qualname>`."""

    async def fn(ctx: Any) -> None:
        pass

    fn.__name__ = fn.__qualname__ = qualname
    return script_job(fn)


finished, finished_async, made_apart = (named_script_job(n) for n in ("finished", "finished_async", "made_apart"))
per_queue, added_by_member, child, child_of_many = (
    named_script_job(n) for n in ("per_queue", "added_by_member", "child", "child_of_many"))


async def adder(ctx: Any) -> None:
    await ctx.group.enqueue(added_by_member)


async def parent(ctx: Any) -> None:
    await ctx.run_child(child.request())
    await ctx.run_children([child_of_many.request()])


adder, parent = script_job(adder), script_job(parent)


def warnings_of(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING and "__main__." in r.getMessage()]


def another_runtime(url: str, *, beat_ago: float = 0.0) -> None:
    """A runtime of another process serving QUEUE, which beat `beat_ago` seconds ago."""
    q(url, "INSERT INTO livepush_job_runtimes (host, pid, queues, concurrency, heartbeat, heartbeat_at) "
           "VALUES ('elsewhere', 1, %s, 1, 10, now() - make_interval(secs => %s))", ([QUEUE], beat_ago))


def test_a_script_job_enqueued_to_other_runtimes_warns_once_naming_the_fix(
        jobs_db: str, caplog: pytest.LogCaptureFixture) -> None:
    assert served_elsewhere.name == "__main__.served_elsewhere"
    another_runtime(jobs_db)
    with caplog.at_level("WARNING", logger="livepush.jobs"):
        served_elsewhere.enqueue()
        jobs.enqueue_many([served_elsewhere.request()])
    (warning,) = warnings_of(caplog)
    assert "__main__.served_elsewhere" in warning and "name=" in warning and "module" in warning, warning
    assert "jobs.drain()" in warning, warning


async def test_a_script_job_made_a_group_member_warns_as_its_enqueue_does(
        jobs_db: str, caplog: pytest.LogCaptureFixture) -> None:
    """A member of a task group is enqueued too: a script's job added to a group (in a block, or to
    a group made apart, sync or async) warns once as a plain enqueue of it does."""
    another_runtime(jobs_db)
    with caplog.at_level("WARNING", logger="livepush.jobs"):
        with jobs.group() as g:
            g.enqueue(grouped)
        made = jobs.create_group()
        jobs.add_to_group(made.id, added)
        jobs.add_many_to_group(made.id, [added.request()])
        await jobs.aadd_to_group(made.id, added_async)
    assert sorted(w.split("'")[1] for w in warnings_of(caplog)) == [
        "__main__.added", "__main__.added_async", "__main__.grouped"], warnings_of(caplog)


async def test_a_script_job_made_a_groups_callback_warns_as_its_enqueue_does(
        jobs_db: str, caplog: pytest.LogCaptureFixture) -> None:
    """A group's callback is enqueued when the group finishes, by whichever process finishes it: a
    script's job given as a callback (to a block, sync or async, or to a group made apart) warns
    once when the group is made, as a plain enqueue of it does."""
    another_runtime(jobs_db)
    with caplog.at_level("WARNING", logger="livepush.jobs"):
        with jobs.group(on_finish=finished.request()):
            pass
        async with jobs.agroup(on_success=finished_async.request()):
            pass
        jobs.create_group(on_failure=made_apart.request())
        with jobs.group(on_finish=finished.request()):  # looked at once per process
            pass
    assert sorted(w.split("'")[1] for w in warnings_of(caplog)) == [
        "__main__.finished", "__main__.finished_async", "__main__.made_apart"], warnings_of(caplog)


def test_a_script_job_is_looked_at_once_per_queue(jobs_db: str, caplog: pytest.LogCaptureFixture) -> None:
    """A script's job enqueued first on a queue no runtime serves, then on one that other runtimes
    serve, warns at the second: the look is once per job and queue, not once per job."""
    another_runtime(jobs_db)
    with caplog.at_level("WARNING", logger="livepush.jobs"):
        jobs.enqueue_many([per_queue.request(queue="scripts-test-unserved")])
        assert warnings_of(caplog) == []
        per_queue.enqueue()
        per_queue.enqueue()
    (warning,) = warnings_of(caplog)
    assert "__main__.per_queue" in warning and repr(QUEUE) in warning, warning


async def test_a_script_job_enqueued_by_a_running_job_warns_as_its_enqueue_does(
        jobs_db: str, caplog: pytest.LogCaptureFixture) -> None:
    """A member's ctx.group.enqueue and a durable job's ctx.run_child and ctx.run_children enqueue
    jobs as any enqueue does: a script's job among them warns once too."""
    another_runtime(jobs_db)
    with caplog.at_level("WARNING", logger="livepush.jobs"):
        async with jobs.agroup() as g:
            g.enqueue(adder)
        await parent.aenqueue()
        await jobs.adrain(queues=[QUEUE])
    assert q(jobs_db, "SELECT name, state FROM livepush_jobs WHERE name IN (%s, %s, %s) ORDER BY name",
             (added_by_member.name, child.name, child_of_many.name)) == [
        (added_by_member.name, "succeeded"), (child.name, "succeeded"), (child_of_many.name, "succeeded")]
    assert sorted(w.split("'")[1] for w in warnings_of(caplog)) == [
        "__main__.added_by_member", "__main__.adder", "__main__.child", "__main__.child_of_many",
        "__main__.parent"], warnings_of(caplog)


def test_a_script_job_drained_in_its_own_process_runs_without_a_warning(
        jobs_db: str, caplog: pytest.LogCaptureFixture) -> None:
    another_runtime(jobs_db, beat_ago=3600.0)  # dead: it serves nothing
    with caplog.at_level("WARNING", logger="livepush.jobs"):
        drained_here.enqueue()
        assert jobs.drain(queues=[QUEUE]) == {"succeeded": 1}
    assert warnings_of(caplog) == []


async def test_a_runtime_given_a_script_job_names_the_fix(jobs_db: str, caplog: pytest.LogCaptureFixture) -> None:
    """A runtime that meets a `__main__.fn` job gives it back, as any job it does not define, and its
    warning names the fix (name= and a module), not a deploy of code that defines no such name."""

    async def from_a_script(ctx: Any) -> None:
        pass

    unknown = JobFunction(from_a_script, name="__main__.from_a_script", queue=QUEUE)  # not registered here
    unknown.enqueue()
    with caplog.at_level("WARNING", logger="livepush.jobs"):
        async with running(queues=[QUEUE], poll_interval=0.05) as rt:
            await async_wait_for(lambda: unknown.name in rt.excluded, 5.0)
    (warning,) = [m for m in warnings_of(caplog) if "unknown name" in m]
    assert "script run directly" in warning and "name=" in warning and "deploy" not in warning, warning
