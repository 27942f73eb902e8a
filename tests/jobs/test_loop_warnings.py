"""A sync call made on a running event loop (an async view or endpoint, an async job) works,
but the loop waits for its round trip: the first such call of each name logs one WARNING a
process naming it, where it was made, and its async twin; from a thread it says nothing."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest

import livepush
from livepush import blocking, jobs
from tests.jobs import sample_jobs


@pytest.fixture(autouse=True)
def unsaid(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(blocking, "_said", set())  # this process may have warned already


def loop_warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "livepush" and "event loop" in r.getMessage()]


async def test_a_sync_enqueue_in_an_async_function_warns_once_naming_aenqueue(
        jobs_db: str, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level("WARNING", logger="livepush"):
        for _ in range(3):
            sample_jobs.record.enqueue("loop")
    said = loop_warnings(caplog)
    assert len(said) == 1, said
    assert "t.record.enqueue()" in said[0] and "await t.record.aenqueue()" in said[0], said
    assert "test_loop_warnings.py" in said[0], said


async def test_a_sync_enqueue_through_a_thread_says_nothing(jobs_db: str, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level("WARNING", logger="livepush"):
        await asyncio.to_thread(sample_jobs.record.enqueue, "thread")
        await asyncio.to_thread(jobs.enqueue_many, [sample_jobs.record.request("thread")])
    assert loop_warnings(caplog) == []


async def test_a_publish_then_an_enqueue_on_the_loop_each_warn_once(
        jobs_db: str, caplog: pytest.LogCaptureFixture) -> None:
    """One call's warning hides no other's: a view that publishes, then enqueues, hears of both."""
    with caplog.at_level("WARNING", logger="livepush"):
        for _ in range(2):
            livepush.publish("news:loop", {"n": 1})
            sample_jobs.record.enqueue("loop")
    said = loop_warnings(caplog)
    assert len(said) == 2, said
    assert "livepush.publish()" in said[0] and "await livepush.apublish()" in said[0], said
    assert "t.record.enqueue()" in said[1], said


# Each sync jobs call with a round trip, called on the loop, and the twin its warning names.
CALLS: list[tuple[str, str, Callable[[int], Any]]] = [
    ("jobs.enqueue_many()", "jobs.aenqueue_many()", lambda _: jobs.enqueue_many([sample_jobs.record.request(1)])),
    ("jobs.get_job()", "jobs.aget_job()", lambda job_id: jobs.get_job(job_id)),
    ("jobs.job_state()", "jobs.ajob_state()", lambda job_id: jobs.job_state(job_id)),
    ("jobs.cancel()", "jobs.acancel()", lambda job_id: jobs.cancel(job_id)),
    ("jobs.signal()", "jobs.asignal()", lambda job_id: jobs.signal(job_id, "go")),
    ("jobs.list_tagged()", "jobs.alist_tagged()", lambda _: jobs.list_tagged("t")),
    ("jobs.list_failed()", "jobs.alist_failed()", lambda _: jobs.list_failed()),
    ("jobs.retry_failed()", "jobs.aretry_failed()", lambda job_id: jobs.retry_failed(job_id)),
    ("jobs.discard_failed()", "jobs.adiscard_failed()", lambda job_id: jobs.discard_failed(job_id)),
    ("jobs.status()", "jobs.astatus()", lambda _: jobs.status()),
    ("jobs.pause_queue()", "jobs.apause_queue()", lambda _: jobs.pause_queue("loop")),
    ("jobs.resume_queue()", "jobs.aresume_queue()", lambda _: jobs.resume_queue("loop")),
    ("jobs.cancel_tagged()", "jobs.acancel_tagged()", lambda _: jobs.cancel_tagged("t")),
    ("jobs.create_group()", "jobs.acreate_group()", lambda _: jobs.create_group()),
    ("jobs.get_group()", "jobs.aget_group()", lambda _: jobs.get_group(1)),
    ("jobs.group_members()", "jobs.agroup_members()", lambda _: jobs.group_members(1)),
    ("jobs.workflows.get()", "jobs.workflows.aget()", lambda job_id: jobs.workflows.get(job_id)),
    # A test's helpers: drain() holds the loop while every due job runs (a job that calls back
    # into a server on that loop waits for its timeout), clear() for its round trips.
    ("jobs.drain()", "jobs.adrain()", lambda _: jobs.drain()),
    ("jobs.clear()", "jobs.aclear()", lambda _: jobs.clear()),
]


@pytest.mark.parametrize(("call", "twin", "make"), CALLS, ids=[c[0] for c in CALLS])
async def test_each_sync_jobs_call_on_the_loop_warns_once_naming_its_twin(
        jobs_db: str, caplog: pytest.LogCaptureFixture, call: str, twin: str, make: Callable[[int], Any]) -> None:
    handle = await sample_jobs.record.aenqueue("target")
    with caplog.at_level("WARNING", logger="livepush"):
        for _ in range(2):
            try:
                make(handle.id)
            except jobs.JobFinishedError:
                pass  # a second cancel or signal of the same job: the call was made all the same
    said = loop_warnings(caplog)
    assert len(said) == 1, said
    assert call in said[0] and f"await {twin}" in said[0], said
    assert "test_loop_warnings.py" in said[0], said


async def test_a_sync_latest_offset_on_the_loop_warns_once_naming_alatest_offset(
        jobs_db: str, caplog: pytest.LogCaptureFixture) -> None:
    """latest_offset() (read in an async view, before the page's data) is a round trip too."""
    with caplog.at_level("WARNING", logger="livepush"):
        await asyncio.to_thread(livepush.latest_offset, "news:loop")
        for _ in range(2):
            livepush.latest_offset("news:loop")
    said = loop_warnings(caplog)
    assert len(said) == 1, said
    assert "livepush.latest_offset()" in said[0] and "await livepush.alatest_offset()" in said[0], said


async def test_a_sync_workflow_start_on_the_loop_warns_once_naming_astart(
        jobs_db: str, caplog: pytest.LogCaptureFixture) -> None:
    """A workflow's start() (in an async view, as a job's enqueue() is) enqueues its first steps in
    a round trip to Postgres, and has astart() as its twin."""
    from tests.jobs import workflow_defs

    with caplog.at_level("WARNING", logger="livepush"):
        await asyncio.to_thread(workflow_defs.diamond.start, {"n": 1})
        for _ in range(2):
            workflow_defs.diamond.start({"n": 1})
    said = loop_warnings(caplog)
    assert len(said) == 1, said
    assert "t_diamond.start()" in said[0] and "await t_diamond.astart()" in said[0], said
    assert "test_loop_warnings.py" in said[0], said
