"""Async code calls the jobs API without blocking its loop: every call that reads or writes the
database has an async twin (`a` + its name) that answers as the sync call does."""

from __future__ import annotations

import asyncio
import inspect

import psycopg
import pytest

from livepush import jobs
from tests.jobs import sample_jobs
from tests.jobs import workflow_defs as wd
from livepush.jobs.api.awaited import iscoroutinefunction  # as asyncio and the frameworks read one
from tests.jobs.conftest import q
from tests.support.waiting import async_wait_for

# Calls that define or configure rather than talk to the database: nothing to await.
NOT_DATABASE_CALLS = {"job", "periodic", "workflow", "configure", "default_backoff", "input_fingerprint"}


def test_every_database_call_of_the_jobs_api_has_an_async_twin() -> None:
    exported = {name: getattr(jobs, name) for name in jobs.__all__}
    calls = {name for name, obj in exported.items()
             if inspect.isfunction(obj) and not name.startswith("a") and name not in NOT_DATABASE_CALLS}
    missing = sorted(name for name in calls if not iscoroutinefunction(exported.get("a" + name)))
    assert missing == ["group"]  # its twin is a block: `async with jobs.agroup() as g`
    assert hasattr(jobs.agroup(), "__aenter__")
    for verb in ("pause", "resume", "cancel", "skip", "signal", "get", "list"):
        assert iscoroutinefunction(getattr(jobs.workflows, "a" + verb)), verb
    for method in ("add", "seal"):
        assert iscoroutinefunction(getattr(jobs.GroupHandle, "a" + method)), method


async def test_a_failed_job_is_read_retried_and_discarded_from_async_code(jobs_db: str) -> None:
    handle = await sample_jobs.never.aenqueue()
    assert await jobs.adrain() == {"failed": 1}
    state = await jobs.ajob_state(handle.id)
    assert state == jobs.job_state(handle.id)
    assert state is not None and state["state"] == "failed"
    assert await jobs.adiscard_failed(handle.id + 1000) is False  # no such job
    assert [j.id for j in await jobs.alist_failed(name="t.never")] == [handle.id]

    assert await jobs.aretry_failed(handle.id) is True
    assert (await jobs.ajob_state(handle.id))["state"] == "available"  # type: ignore[index]
    assert await jobs.aretry_failed(handle.id) is False  # not failed now
    assert await jobs.adiscard_failed(handle.id) is False
    assert await jobs.adrain() == {"failed": 1}

    assert await jobs.adiscard_failed(handle.id) is True
    assert await jobs.ajob_state(handle.id) is None


async def test_async_retry_leaves_a_failed_job_alone_while_its_key_is_held_again(jobs_db: str) -> None:
    """As retry_failed(): a new job holding the failed one's key keeps it failed, whether the
    key's enqueue committed before the retry or commits while it waits."""
    failed = await sample_jobs.never.aenqueue(key="arf")
    await jobs.adrain()
    holder = await sample_jobs.never.aenqueue(key="arf")
    assert await jobs.aretry_failed(failed.id) is False
    assert await jobs.acancel(holder.id)

    async with await psycopg.AsyncConnection.connect(jobs_db) as conn:
        await sample_jobs.record.aenqueue("holder", key="arf", conn=conn)
        retried = asyncio.ensure_future(jobs.aretry_failed(failed.id))
        await async_wait_for(lambda: retried.done() or q(jobs_db, "SELECT count(*) FROM pg_stat_activity WHERE datname = "
                                                             "current_database() AND wait_event_type = 'Lock'")[0][0] > 0,
                             10.0, message="the retry to wait for the enqueue's transaction")
        await conn.commit()
        assert await asyncio.wait_for(retried, 10.0) is False
    assert (await jobs.aget_job(failed.id)).state == "failed"  # type: ignore[union-attr]


async def test_async_twins_refuse_a_failed_group_member_as_the_sync_calls_do(jobs_db: str) -> None:
    async with jobs.agroup() as g:
        g.enqueue(sample_jobs.never)
    await jobs.adrain()
    [member], _ = await jobs.agroup_members(g.id)
    assert member["state"] == "failed"
    with pytest.raises(jobs.GroupClosedError, match=f"member of task group {g.id}"):
        await jobs.aretry_failed(member["id"])
    with pytest.raises(jobs.GroupClosedError, match="deleted with its group"):
        await jobs.adiscard_failed(member["id"])


async def test_a_group_is_built_and_read_from_async_code(jobs_db: str) -> None:
    handle = await jobs.acreate_group()
    added = await jobs.aadd_many_to_group(handle.id, [(sample_jobs.record, ["a"]), (sample_jobs.record, ["b"])])
    one_more = await handle.aadd(sample_jobs.record, "c")
    assert await handle.aseal() is True
    assert await handle.aseal() is False

    group = await jobs.aget_group(handle.id)
    assert group == jobs.get_group(handle.id)
    assert group is not None and (group["state"], group["total"]) == ("sealed", 3)
    members, cursor = await jobs.agroup_members(handle.id, limit=2)
    assert [m["id"] for m in members] == [h.id for h in added] and cursor == added[1].id
    assert (members, cursor) == jobs.group_members(handle.id, limit=2)
    rest, end = await jobs.agroup_members(handle.id, after=cursor)
    assert [m["id"] for m in rest] == [one_more.id] and end is None
    assert await jobs.agroup_history(handle.id) == jobs.group_history(handle.id)
    assert await jobs.agroup_history(handle.id, before=1) == ([], None)
    assert await jobs.aget_group(handle.id + 1000) is None


async def test_workflow_runs_are_read_from_async_code(jobs_db: str) -> None:
    run = await wd.diamond.astart({"n": 1})
    got = await jobs.workflows.aget(run.id)
    assert got == jobs.workflows.get(run.id)
    assert got is not None and got["name"] == "t_diamond"
    assert await jobs.workflows.aget(run.id + 1000) is None
    page = await jobs.workflows.alist(name="t_diamond", limit=1)
    assert page == jobs.workflows.list(name="t_diamond", limit=1)
    assert [r["id"] for r in page[0]] == [run.id]
    with pytest.raises(ValueError, match="limit= takes an int from 1 to 1000"):
        await jobs.workflows.alist(limit=0)
