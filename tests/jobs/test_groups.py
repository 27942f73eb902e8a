"""Task groups in this process: the block, separate calls, callbacks, limits, paging, cancel, events, retention."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import functools
import logging
import re
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import psycopg
import pytest
from psycopg.rows import dict_row

from livepush import jobs
from livepush.errors import ArgumentTypeError, DependencyError
from livepush.jobs.groups import building, steps
from livepush.jobs.groups import queries as group_queries
from livepush.jobs.groups.transactions import in_tx
from livepush.jobs.runtime import maintenance
from livepush.jobs.runtime.context import ClaimedJob, JobContext
from livepush.jobs.runtime.runtime import Runtime
from tests.jobs import group_jobs as gj
from tests.jobs import limit_jobs
from tests.jobs.test_jobs_runtime import running as runtime_running
from tests.jobs.conftest import events_of, group_events, q, read_states
from tests.support.loop_threads import Caller, LoopThread, Stuck
from tests.support.waiting import async_wait_for, wait_for


@pytest.fixture
def groups_db(jobs_db: str) -> Iterator[str]:
    """jobs_db plus the table where test callbacks note their runs."""
    q(jobs_db, gj.CALLBACK_RUNS_TABLE)
    yield jobs_db


def group_messages(group_id: int) -> list[dict[str, Any]]:
    """The messages group:<id> showed ({"event", "group"}), oldest first, as livepush recorded
    them (jobs.group_history())."""
    return [e["data"] for e in group_events(group_id)]


def assert_events_well_formed(group_id: int) -> list[dict[str, Any]]:
    """created first, finished last and once, no progress after finished; each message's event
    is the one it was recorded as, and its group the one it names."""
    history = group_events(group_id)
    msgs = [e["data"] for e in history]
    names = [m["event"] for m in msgs]
    assert names[0] == "created", names
    assert names.count("finished") == 1 and names[-1] == "finished", names
    assert [e["event"] for e in history] == names
    assert {m["group"]["id"] for m in msgs} == {group_id}
    return msgs


def test_block_creates_fills_and_seals_then_callbacks_run_once(groups_db: str) -> None:
    """A block group of 5 members: after drain, on_finish and on_success ran once each with
    exactly their args, saw the finished group in ctx.group, and on_failure did not run."""
    with jobs.group(on_finish=gj.callback.request("fin", 1, {"x": [1]}), on_success=gj.callback.request("ok"),
                    on_failure=gj.callback.request("bad")) as g:
        for i in range(5):
            g.enqueue(gj.member, i)
        inside_id = g.id
    assert g.handle.id == inside_id and g.handle.topic == f"group:{inside_id}"
    assert len(g.members) == 5
    view = jobs.get_group(g.handle.id)
    assert view is not None and (view["state"], view["total"], view["pending"]) == ("sealed", 5, 5)
    jobs.drain()
    runs = gj.callback_runs(groups_db)
    assert sorted((r[0], r[1]) for r in runs) == [("fin", "finish"), ("ok", "success")]
    fin = next(r for r in runs if r[0] == "fin")
    assert fin[4] == ["fin", 1, {"x": [1]}]
    assert fin[3] == {"id": g.handle.id, "state": "finished", "total": 5, "pending": 0, "succeeded": 5,
                      "failed": 0, "cancelled": 0}
    assert jobs.get_group(g.handle.id)["state"] == "finished"
    assert_events_well_formed(g.handle.id)


@pytest.mark.parametrize("call", ["enqueue", "enqueue_many"])
async def test_an_awaited_g_enqueue_in_an_async_group_block_says_to_drop_the_await(groups_db: str, call: str) -> None:
    """In an `async with jobs.agroup()` block g.enqueue() adds to the block's batch at once.
    Awaited (as ctx.group.enqueue is, in an async job), it raised Python's "object NoneType can't
    be used in 'await' expression", which names neither the call nor the fix. The block raised,
    so nothing was written, and still nothing is."""
    with pytest.raises(TypeError, match=rf"g\.{call}\(\) is not awaited.*drop the `await`"):
        async with jobs.agroup() as g:
            if call == "enqueue":
                await g.enqueue(gj.member, 1)
            else:
                await g.enqueue_many([gj.member.request(1)])
    assert q(groups_db, "SELECT count(*) FROM livepush_jobs") == [(0,)]
    with jobs.group() as sync_block:  # sync code has nothing to await: None, as ever
        assert sync_block.enqueue(gj.member, 1) is None


def test_failures_and_retries(groups_db: str) -> None:
    """A member that fails then succeeds counts as succeeded; one that fails for good as
    failed; the group runs on_finish and on_failure, once."""
    with jobs.group(on_finish=gj.callback.request("fin"), on_success=gj.callback.request("ok"),
                    on_failure=gj.callback.request("bad")) as g:
        g.enqueue(gj.flaky, 1, "a")
        g.enqueue(gj.flaky, 2, "b")
        g.enqueue(gj.fail, "c")
        g.enqueue(gj.member, "d")
    for _ in range(10):
        jobs.drain()
        if jobs.get_group(g.handle.id)["state"] == "finished" and len(gj.callback_runs(groups_db)) == 2:
            break
    view = jobs.get_group(g.handle.id)
    assert (view["succeeded"], view["failed"], view["cancelled"], view["pending"]) == (3, 1, 0, 0)
    assert sorted(r[0] for r in gj.callback_runs(groups_db)) == ["bad", "fin"]



def test_a_callback_that_raises_is_retried_as_one_job_and_never_enqueued_again(groups_db: str) -> None:
    """A group's callback is a job of its own: one that raises is retried (its attempt counted)
    until it succeeds, and the retry is that same job, not a second callback enqueued by the
    group; the group's finish enqueued exactly one job per callback."""
    with jobs.group(on_finish=gj.flaky.request(2, "fin"), on_failure=gj.callback.request("bad")) as g:
        for i in range(3):
            g.enqueue(gj.member, i)
    for _ in range(10):  # the retries have no backoff: each drain runs the next attempt
        jobs.drain()
        if q(groups_db, "SELECT count(*) FROM job_runs WHERE key = 'fin' AND phase = 'done'")[0][0]:
            break
    runs = q(groups_db, "SELECT job_id, attempt, phase FROM job_runs WHERE key = 'fin' ORDER BY at")
    (callback_id,) = {job_id for job_id, _, _ in runs}
    assert [(attempt, phase) for _, attempt, phase in runs] == [(1, "start"), (2, "start"), (3, "start"),
                                                               (3, "done")], runs
    assert q(groups_db, "SELECT count(*) FROM livepush_jobs WHERE name = 'g.flaky'") == [(1,)]
    info = jobs.get_job(callback_id)
    assert info is not None and (info.state, info.attempt) == ("succeeded", 3)
    assert gj.callback_runs(groups_db) == [], "on_failure does not run: every member succeeded"

def test_empty_group_finishes_at_the_seal(groups_db: str) -> None:
    """An empty sealed group finishes at once: on_finish and on_success are enqueued by the seal."""
    with jobs.group(on_finish=gj.callback.request("fin"), on_success=gj.callback.request("ok")) as g:
        pass
    assert jobs.get_group(g.handle.id)["state"] == "finished"
    jobs.drain()
    assert sorted(r[0] for r in gj.callback_runs(groups_db)) == ["fin", "ok"]
    assert [m["event"] for m in group_messages(g.handle.id)] == ["created", "finished"]
    h = jobs.create_group(on_finish=gj.callback.request("fin2"))
    assert jobs.seal_group(h.id) is True
    assert jobs.seal_group(h.id) is False
    jobs.drain()
    assert sorted(r[0] for r in gj.callback_runs(groups_db)) == ["fin", "fin2", "ok"]


def test_block_that_raises_enqueues_nothing(groups_db: str) -> None:
    """If the block raises, no group, member or callback is written."""
    with pytest.raises(RuntimeError, match="oops"):
        with jobs.group(on_finish=gj.callback.request("fin")) as g:
            g.enqueue(gj.member, 1)
            raise RuntimeError("oops")
    assert q(groups_db, "SELECT count(*) FROM livepush_groups")[0][0] == 0
    assert q(groups_db, "SELECT count(*) FROM livepush_jobs")[0][0] == 0
    # An add after it says what became of the block: nothing was written, not "wrote its members".
    with pytest.raises(jobs.GroupClosedError, match=f"block of task group {g.id} raised and wrote nothing: "
                                                    "start a new group"):
        g.enqueue(gj.member, 2)


def test_a_block_takes_members_only_while_it_runs(groups_db: str) -> None:
    """A group block writes its members when it ends: g.enqueue after the block is refused with
    GroupClosedError (it would be silently dropped), and the builder cannot be entered again
    (a second block would write the first one's members again, into the first group)."""
    with jobs.group(on_finish=gj.callback.request("fin")) as g:
        g.enqueue(gj.member, 1)
    with pytest.raises(jobs.GroupClosedError, match=f"block of task group {g.id} has ended"):
        g.enqueue(gj.member, 2)
    with pytest.raises(jobs.GroupClosedError, match="has ended"):
        g.enqueue_many([gj.member.request(3)])
    with pytest.raises(jobs.GroupBlockError, match="once"):  # a RuntimeError, as it always was
        with g:
            g.enqueue(gj.member, 4)
    assert q(groups_db, "SELECT count(*) FROM livepush_jobs WHERE group_id IS NOT NULL") == [(1,)]
    jobs.drain()
    view = jobs.get_group(g.id)
    assert (view["state"], view["total"], view["succeeded"]) == ("finished", 1, 1)
    assert q(groups_db, "SELECT count(*) FROM livepush_groups") == [(1,)]


def test_block_in_the_callers_transaction(groups_db: str) -> None:
    """With conn= the group exists if and only if the caller's transaction commits."""
    with psycopg.connect(groups_db) as conn:
        with jobs.group(on_finish=gj.callback.request("fin"), conn=conn) as g:
            g.enqueue(gj.member, 1)
        conn.rollback()
    assert jobs.get_group(g.handle.id) is None
    with psycopg.connect(groups_db) as conn:
        with jobs.group(on_finish=gj.callback.request("fin"), conn=conn) as g:
            g.enqueue(gj.member, 1)
        conn.commit()
    assert jobs.get_group(g.handle.id)["total"] == 1


def test_a_refused_add_in_the_callers_transaction_leaves_nothing_of_it(groups_db: str) -> None:
    """add_to_group(conn=) refused (the group finished) writes nothing into the caller's
    transaction: the caller may catch the error and commit the rest of its work, and no member
    of a finished group runs or is counted after the group ended. With an autocommit connection
    the add is still one transaction."""
    h = jobs.create_group(on_finish=gj.callback.request("fin"))
    jobs.add_to_group(h.id, gj.member, 1)
    h.seal()
    jobs.drain()
    assert jobs.get_group(h.id)["state"] == "finished"
    with psycopg.connect(groups_db) as conn:
        with pytest.raises(jobs.GroupClosedError, match="finished"):
            jobs.add_to_group(h.id, gj.member, 2, conn=conn)
        with pytest.raises(jobs.GroupClosedError, match="finished"):
            jobs.add_many_to_group(h.id, [gj.member.request(3)], conn=conn)
        gj.member.enqueue("mine", conn=conn)  # the caller's own work goes on
        conn.commit()
    with psycopg.connect(groups_db, autocommit=True) as conn:
        with pytest.raises(jobs.GroupClosedError, match="finished"):
            jobs.add_to_group(h.id, gj.member, 4, conn=conn)
    assert q(groups_db, "SELECT count(*) FROM livepush_jobs WHERE group_id = %s", (h.id,)) == [(1,)]
    jobs.drain()
    view = jobs.get_group(h.id)
    assert (view["total"], view["pending"], view["succeeded"]) == (1, 0, 1)


def test_adding_to_a_group_whose_transaction_has_not_committed_says_to_pass_its_conn(groups_db: str) -> None:
    """A group created with conn= is not there for other connections until that transaction
    commits: an add or seal without conn= meanwhile raises GroupNotFound saying so and what to do,
    and with conn= both work."""
    with psycopg.connect(groups_db) as conn:
        h = jobs.create_group(on_finish=gj.callback.request("fin"), conn=conn)
        with pytest.raises(jobs.GroupNotFound, match="has not committed.*pass that transaction's conn="):
            jobs.add_to_group(h.id, gj.member, 1)
        with pytest.raises(jobs.GroupNotFound, match="has not committed.*pass that transaction's conn="):
            jobs.seal_group(h.id)
        h.add(gj.member, 1, conn=conn)
        assert h.seal(conn=conn) is True
        conn.commit()
    jobs.drain()
    assert jobs.get_group(h.id)["state"] == "finished"


def test_a_seal_in_a_repeatable_read_transaction_never_leaves_the_group_unfinished(groups_db: str) -> None:
    """seal_group(conn=) in a REPEATABLE READ transaction that began before the last member
    finished is refused as a conflict (run the transaction again), not committed as a sealed
    group that looks pending forever; run again, the seal finishes the group and its callback
    runs once. A group created, filled and sealed in one such transaction is sealed as usual."""
    h = jobs.create_group(on_finish=gj.callback.request("fin"))
    h.add(gj.member, 1)
    with psycopg.connect(groups_db) as conn:
        conn.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
        conn.execute("SELECT 1")  # the transaction's snapshot is taken here
        assert jobs.drain() == {"succeeded": 1}
        with pytest.raises(DependencyError, match="run the whole transaction again"):
            jobs.seal_group(h.id, conn=conn)
        conn.rollback()
        assert jobs.seal_group(h.id, conn=conn) is True
        conn.commit()
        with conn.transaction():
            other = jobs.create_group(on_finish=gj.callback.request("other"), conn=conn)
            jobs.add_to_group(other.id, gj.member, 2, conn=conn)
            assert jobs.seal_group(other.id, conn=conn) is True
    assert jobs.get_group(h.id)["state"] == "finished"
    jobs.drain()
    assert sorted(r[0] for r in gj.callback_runs(groups_db)) == ["fin", "other"]


async def test_a_block_given_the_wrong_kind_of_connection_is_refused_naming_it(groups_db: str) -> None:
    """`with jobs.group(conn=)` takes a psycopg Connection and `async with jobs.agroup(conn=)` an
    AsyncConnection: the other kind, or something that is no connection, is a TypeError saying
    so as the block is entered (not an AttributeError from the id reservation), and nothing is
    written."""
    async with await psycopg.AsyncConnection.connect(groups_db) as aconn:
        with pytest.raises(TypeError, match="a-prefixed"):
            with jobs.group(conn=aconn) as g:
                g.enqueue(gj.member, 1)
    with psycopg.connect(groups_db) as conn:
        with pytest.raises(TypeError, match="sync function"):
            async with jobs.agroup(conn=conn) as g:
                g.enqueue(gj.member, 1)
    with pytest.raises(TypeError, match="conn= must be a psycopg Connection or AsyncConnection, got str"):
        with jobs.group(conn="postgresql://") as g:  # type: ignore[arg-type]
            g.enqueue(gj.member, 1)
    assert q(groups_db, "SELECT count(*) FROM livepush_groups") == [(0,)]


def test_member_limit(groups_db: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Past the member limit (100,000 by default) adds are refused with GroupLimitError."""
    assert jobs.MAX_GROUP_MEMBERS == 100_000
    monkeypatch.setattr(building, "MAX_GROUP_MEMBERS", 5)
    with pytest.raises(jobs.GroupLimitError, match="at most 5"):
        with jobs.group() as g:
            for i in range(6):
                g.enqueue(gj.member, i)
    assert q(groups_db, "SELECT count(*) FROM livepush_jobs")[0][0] == 0
    h = jobs.create_group()
    jobs.add_many_to_group(h.id, [gj.member.request(i) for i in range(4)])
    h.add(gj.member, 4)
    with pytest.raises(jobs.GroupLimitError, match="limit of 5"):
        h.add(gj.member, 5)
    assert jobs.get_group(h.id)["total"] == 5


def test_a_member_that_adds_past_the_member_limit_fails_at_once_rather_than_retried(
        groups_db: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A group never loses members, so an add past its limit fails again on every attempt: the
    job that made it fails at its first attempt, as for never_retry, rather than waiting out its
    backoff max_attempts times before the same GroupLimitError."""
    monkeypatch.setattr(building, "MAX_GROUP_MEMBERS", 2)
    with jobs.group() as g:
        g.enqueue(gj.spawner, 3, "a")
    jobs.drain()
    (spawner,) = g.members
    info = jobs.get_job(spawner.id)
    assert info is not None
    assert (info.state, info.attempt) == ("failed", 1), (info.state, info.attempt, info.max_attempts)
    assert info.max_attempts > 1
    assert info.error.startswith("GroupLimitError: "), info.error


def test_a_job_that_meets_a_closed_group_fails_at_once_rather_than_retried(groups_db: str) -> None:
    """A group never opens again once sealed, cancelled or finished, so an add it refused is refused
    again on every attempt: the job that made it (a callback adding to its finished group, a job
    adding to a sealed group from outside) fails at its first attempt with GroupClosedError, as for
    GroupLimitError, rather than waiting out its backoff max_attempts times."""
    sealed = jobs.create_group()
    jobs.seal_group(sealed.id)
    outsider = gj.adds_to.enqueue(sealed.id)
    with jobs.group(on_finish=gj.callback_adds.request()) as g:
        g.enqueue(gj.member, "m")
    jobs.drain()
    (callback_id,) = [r[0] for r in q(groups_db, "SELECT id FROM livepush_jobs WHERE callback_of = %s",
                                        (g.handle.id,))]
    for job_id in (outsider.id, callback_id):
        info = jobs.get_job(job_id)
        assert info is not None
        assert (info.state, info.attempt, info.max_attempts) == ("failed", 1, 3), (info.state, info.attempt)
        assert info.error.startswith("GroupClosedError: "), info.error


def test_a_member_reading_the_counts_only_a_callback_has_is_told_where_to_read_them(groups_db: str) -> None:
    """ctx.group's counts and state are the finished group's, loaded for its callbacks only. A
    member reading them (async or sync) gets an AttributeError that says how to read its group's
    current counts, not None as if the group had none; a callback still sees them."""
    with jobs.group(on_finish=gj.callback.request("fin")) as g:
        g.enqueue(gj.reads_counts)
        g.enqueue(gj.reads_counts_sync)
    jobs.drain()
    reads = [r[0] for r in q(groups_db, "SELECT key FROM job_runs WHERE phase = 'read' ORDER BY job_id")]
    assert len(reads) == 2
    for read in reads:
        assert read.startswith("AttributeError: ctx.group.total"), read
        assert "jobs.aget_group(ctx.group.id)" in read, read
    assert q(groups_db, "SELECT key FROM job_runs WHERE phase = 'hasattr'") == [("False",)]
    (run,) = gj.callback_runs(groups_db)
    assert run[3] == {"id": g.handle.id, "state": "finished", "total": 2, "pending": 0, "succeeded": 2,
                      "failed": 0, "cancelled": 0}


def test_add_many_stops_reading_items_at_the_member_limit(groups_db: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """add_many_to_group refuses an iterable of items past the member limit as soon as it gets
    there, as the group block does: an endless (or huge) generator is not read to its end, nor
    held in memory, before GroupLimitError."""
    monkeypatch.setattr(building, "MAX_GROUP_MEMBERS", 5)
    drawn = 0

    def endless() -> Iterator[Any]:
        nonlocal drawn
        while True:
            drawn += 1
            if drawn > 100:
                raise AssertionError("read past the limit")
            yield gj.member.request(drawn)

    h = jobs.create_group()
    with pytest.raises(jobs.GroupLimitError, match="at most 5"):
        jobs.add_many_to_group(h.id, endless())
    assert drawn == 6 and jobs.get_group(h.id)["total"] == 0


def test_a_failed_member_is_neither_retried_nor_discarded(groups_db: str) -> None:
    """A failed member's failure is counted by its group: retry_failed and discard_failed both
    refuse it (GroupClosedError), so the group's counts always match its members' rows (a
    discarded member would leave `failed` counting a row that is gone, and a durable parent
    reading its children in order would read another job in its place)."""
    with jobs.group() as g:
        g.enqueue(gj.fail, "x")
        g.enqueue(gj.member, "y")
    jobs.drain()
    failed = g.members[0]
    with pytest.raises(jobs.GroupClosedError, match=f"member of task group {g.id}"):
        jobs.retry_failed(failed.id)
    with pytest.raises(jobs.GroupClosedError, match=f"member of task group {g.id}"):
        jobs.discard_failed(failed.id)
    # The group may be a workflow's fan-out batch, which a new member would never join: the
    # refusal names that way too.
    with pytest.raises(jobs.GroupClosedError, match=r"add a new member.*jobs\.workflows\.resume\(\)"):
        jobs.retry_failed(failed.id)
    rows, _ = jobs.group_members(g.id)
    assert [(r["id"], r["state"]) for r in rows] == [(failed.id, "failed"), (g.members[1].id, "succeeded")]
    view = jobs.get_group(g.id)
    assert (view["total"], view["failed"], view["succeeded"]) == (2, 1, 1)


def test_separate_calls_and_closed_groups(groups_db: str) -> None:
    """create, add, seal as separate transactions; adding from outside after the seal is refused."""
    h = jobs.create_group(on_finish=gj.callback.request("fin"))
    assert jobs.get_group(h.id)["state"] == "open"
    jobs.add_to_group(h.id, gj.member, 1)
    jobs.drain()
    assert jobs.get_group(h.id)["state"] == "open", "an open group never finishes"
    jobs.add_to_group(h.id, gj.member, 2)
    assert h.seal()
    with pytest.raises(jobs.GroupClosedError, match="sealed"):
        jobs.add_to_group(h.id, gj.member, 3)
    with pytest.raises(jobs.GroupNotFound):
        jobs.add_to_group(10**12, gj.member, 3)
    jobs.drain()
    view = jobs.get_group(h.id)
    assert (view["state"], view["total"], view["succeeded"]) == ("finished", 2, 2)
    assert [r[0] for r in gj.callback_runs(groups_db)] == ["fin"]


def test_an_id_no_group_can_have_is_named_as_given(groups_db: str) -> None:
    """add_to_group, add_many_to_group and seal_group with an id past the bigint range raise
    GroupNotFound naming that id, not the placeholder it is read as."""
    huge = 2**70
    with pytest.raises(jobs.GroupNotFound, match=f"no task group {huge}"):
        jobs.add_to_group(huge, gj.member, 1)
    with pytest.raises(jobs.GroupNotFound, match=f"no task group {huge}"):
        jobs.add_many_to_group(huge, [gj.member.request(1)])
    with pytest.raises(jobs.GroupNotFound, match=f"no task group {huge}"):
        jobs.seal_group(huge)
    with pytest.raises(jobs.GroupNotFound, match="no task group -3"):
        jobs.seal_group(-3)
    assert q(groups_db, "SELECT count(*) FROM livepush_jobs") == [(0,)]


def test_paging(groups_db: str) -> None:
    """Members come a page at a time in id order; the last page has no next cursor, even when full."""
    with jobs.group() as g:
        for i in range(20):
            g.enqueue(gj.member, i)
    seen: list[int] = []
    cursor = None
    pages = 0
    while True:
        rows, cursor = jobs.group_members(g.handle.id, after=cursor, limit=10)
        pages += 1
        seen.extend(r["id"] for r in rows)
        if cursor is None:
            break
    assert pages == 2 and seen == sorted(h.id for h in g.members)
    rows, cursor = jobs.group_members(g.handle.id, limit=7)
    assert len(rows) == 7 and cursor == rows[-1]["id"]
    evs, _ = jobs.group_history(g.handle.id)
    assert [e["event"] for e in evs] == ["created"]


def test_a_cursor_past_either_end_gives_an_empty_last_page(groups_db: str) -> None:
    """No member has an id after one past the bigint range, and no event comes before seq 0 (or
    a negative seq): such cursors give an empty last page, not the first page again (a client
    paging on would loop)."""
    with jobs.group() as g:
        for i in range(3):
            g.enqueue(gj.member, i)
    assert jobs.group_members(g.id, after=2**70) == ([], None)
    assert jobs.group_history(g.id, before=0) == ([], None)
    assert jobs.group_history(g.id, before=-1) == ([], None)
    rows, _ = jobs.group_members(g.id, after=-1)
    assert [r["id"] for r in rows] == [m.id for m in g.members]
    events, _ = jobs.group_history(g.id, before=2**70)
    assert [e["event"] for e in events] == ["created"]


def test_cursors_limits_and_shards_that_are_not_ints_are_refused_naming_them(groups_db: str) -> None:
    """A cursor, limit or shard count of the wrong type is a TypeError naming it (one out of range a
    ValueError), not a database error nor a bare comparison error."""
    handle = jobs.create_group()
    with pytest.raises(TypeError, match="after must be an int"):
        jobs.group_members(handle.id, after="x")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="before must be an int"):
        jobs.group_history(handle.id, before="x")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="limit must be an int from 1 to 100000, got str '10'"):
        jobs.group_members(handle.id, limit="10")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="limit must be an int of at least 1"):
        jobs.group_members(handle.id, limit=0)
    with pytest.raises(TypeError, match="shards= must be an int from 1 to 1024, got str '4'"):
        jobs.create_group(shards="4")  # type: ignore[arg-type]


def test_adding_something_that_is_not_a_job_is_refused_naming_it(groups_db: str) -> None:
    """add_to_group and GroupHandle.add take a @jobs.job function and its arguments, or a
    job.request(...) as the group block does: anything else is a TypeError naming what was
    given, not an AttributeError from deep inside, and nothing is added."""
    h = jobs.create_group()
    with pytest.raises(TypeError, match="@jobs.job function.*'import_row'"):
        jobs.add_to_group(h.id, "import_row", 1)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="@jobs.job function.*None"):
        h.add(None, 1)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="no further arguments"):
        jobs.add_to_group(h.id, gj.member.request(1), 2)  # type: ignore[arg-type]
    assert jobs.get_group(h.id)["total"] == 0
    member = jobs.add_to_group(h.id, gj.member.request(1))  # type: ignore[arg-type]
    assert member.name == "g.member" and jobs.get_group(h.id)["total"] == 1
    # The block's g.enqueue says it the same way: what it takes (a request too) and what it got.
    with jobs.group() as g:
        with pytest.raises(TypeError, match=r"g\.enqueue\(\) takes a @jobs\.job function and its arguments, or "
                                            r"job\.request\(\.\.\.\), got str 'g\.member'"):
            g.enqueue("g.member", 1)  # type: ignore[arg-type]
        g.enqueue(gj.member.request(1))
    assert jobs.get_group(g.id)["total"] == 1


def test_a_block_given_members_that_are_no_list_is_refused_naming_it(groups_db: str) -> None:
    """g.enqueue_many() given a number or None is a TypeError naming the call and what it takes,
    as add_many_to_group() says it, not Python's bare "'int' object is not iterable"; a block that
    catches it goes on, and the group gets only what was added otherwise."""
    with jobs.group() as g:
        for wrong in (5, None):
            with pytest.raises(TypeError, match=r"g\.enqueue_many\(\) takes an iterable of job\.request"):
                g.enqueue_many(wrong)  # type: ignore[arg-type]
        g.enqueue_many([gj.member.request(1)])
    assert jobs.get_group(g.id)["total"] == 1


def test_page_limits_past_what_a_page_can_hold_are_refused_naming_them(groups_db: str) -> None:
    """A page limit too big for the database is a ValueError naming `limit`, not a database
    error."""
    h = jobs.create_group()
    with pytest.raises(ValueError, match="limit must be an int from 1 to 100000, got 9223372036854775808"):
        jobs.group_members(h.id, limit=2**63)
    with pytest.raises(ValueError, match="limit must be an int from 1 to 100000"):
        jobs.group_history(h.id, limit=2**63)
    rows, cursor = jobs.group_members(h.id, limit=100_000)
    assert (rows, cursor) == ([], None)


def test_a_sync_add_past_its_timeout_is_called_off_not_committed_later(groups_db: str) -> None:
    """A sync member's ctx.group.enqueue(timeout=) that gives up raises TimeoutError telling it
    to pass key=, and the add it gave up on rolls back: once the lock it waited for is free, no
    member appears behind the caller's back."""
    with jobs.group() as g:
        g.enqueue(gj.spawner_sync_held, "held")
    jobs.drain()
    view = jobs.get_group(g.handle.id)
    assert (view["state"], view["total"], view["succeeded"]) == ("finished", 1, 1)
    notes = dict(q(groups_db, "SELECT phase, key FROM job_runs"))
    assert notes["done"] == "held"
    assert "did not commit within 0.3 s" in notes["timeout"] and "pass key=" in notes["timeout"]


@pytest.mark.parametrize("timeout", sorted(gj.TIMEOUTS))
def test_a_sync_add_with_a_timeout_that_is_not_a_number_of_seconds_is_refused_naming_it(
        groups_db: str, timeout: str) -> None:
    """ctx.group.enqueue(timeout=) takes a positive, finite number of seconds: anything else is
    refused with ArgumentValueError naming timeout=, and adds nothing (it raised Python's own
    TypeError from inside asyncio for a str, and a TimeoutError "did not commit within -1 s" for
    a negative number)."""
    with jobs.group() as g:
        g.enqueue(gj.spawner_sync_timeout, timeout)
    jobs.drain()
    notes = dict(q(groups_db, "SELECT phase, key FROM job_runs"))
    assert "done" not in notes, notes
    assert notes["refused"].startswith("ArgumentValueError: ctx.group.enqueue(timeout=) takes"), notes
    assert jobs.get_group(g.handle.id)["total"] == 1


def test_members_add_members_sync_and_async(groups_db: str) -> None:
    """ctx.group.enqueue from running members (async and sync), also after the seal: the group
    waits for the added members and counts them."""
    with jobs.group(on_finish=gj.callback.request("fin")) as g:
        g.enqueue(gj.spawner, 3, "a")
        g.enqueue(gj.spawner_sync, 2, "s")
    jobs.drain()
    view = jobs.get_group(g.handle.id)
    assert (view["state"], view["total"], view["succeeded"]) == ("finished", 7, 7)
    runs = gj.callback_runs(groups_db)
    assert len(runs) == 1 and runs[0][3]["total"] == 7
    assert_events_well_formed(g.handle.id)


def test_a_durable_members_add_runs_once_in_a_checkpoint_and_again_on_each_run_outside_one(groups_db: str) -> None:
    """A durable member's code between durable calls runs again when it wakes from its children
    (docs/durable.md), and ctx.group.enqueue is no durable call: outside a checkpoint its add is
    made again (a key= would not stop it, the first added member having finished meanwhile); in
    a checkpoint it is made once, as docs/groups.md says."""
    with jobs.group() as outside:
        outside.enqueue(gj.durable_adds, False)
    with jobs.group() as inside:
        inside.enqueue(gj.durable_adds, True)
    jobs.drain()
    assert jobs.get_group(outside.id)["total"] == 3  # itself, and "added" twice
    assert jobs.get_group(inside.id)["total"] == 2   # itself, and "added" once


async def test_add_from_a_member_that_lost_its_claim_is_refused(groups_db: str) -> None:
    """ctx.group.enqueue from a job whose lease is no longer valid raises LeaseLostError and adds nothing."""
    with jobs.group() as g:
        g.enqueue(gj.member, 1)
    (member,) = g.members
    row = q(groups_db, "SELECT run_at FROM livepush_jobs WHERE id = %s", (member.id,))[0]
    stale = ClaimedJob(id=member.id, name="g.member", queue="default", priority=0, attempt=1, max_attempts=5,
                       lease=123456, args=[1], run_at=row[0], group_id=g.handle.id)
    from psycopg_pool import AsyncConnectionPool

    from livepush.jobs.runtime.completer import Completer

    async with AsyncConnectionPool(groups_db, min_size=1, max_size=2, open=False) as pool:
        ctx = JobContext(stale, Completer(pool))
        with pytest.raises(jobs.LeaseLostError, match="no longer holds its claim"):
            await ctx.group.enqueue(gj.member, 2)
    assert jobs.get_group(g.handle.id)["total"] == 1


async def test_a_job_argument_given_by_keyword_to_a_group_path_is_refused_naming_its_position(groups_db: str) -> None:
    """The group paths take a member's arguments as enqueue does, by position: a keyword (or an
    option of enqueue's the group paths do not take, debounce=) raised Python's bare "unexpected
    keyword argument". Each now raises InvalidArgumentsError, as enqueue does, naming the
    parameter's place after ctx or the path's own options; nothing is added."""
    by_place = r"^g\.spawner takes its arguments by position: pass n as argument 1 after ctx"

    def no_option(call: str) -> str:
        return rf"^{re.escape(call)}\(\) has no option debounce=: its options are wait=, at=, "

    with jobs.group() as g:
        g.enqueue(gj.member, 1)
        with pytest.raises(jobs.InvalidArgumentsError, match=by_place):
            g.enqueue(gj.spawner, n=1)  # type: ignore[call-arg]
        with pytest.raises(jobs.InvalidArgumentsError, match=no_option("g.enqueue") + r".*; debounce= is for single "
                           r"enqueues, job\.enqueue\(\.\.\., key=, debounce=\): a group's member is never debounced$"):
            g.enqueue(gj.spawner, 1, debounce=5)  # type: ignore[call-arg]
    opened = jobs.create_group()
    for add, call in ((opened.add, "add"), (functools.partial(jobs.add_to_group, opened.id), "add_to_group")):
        with pytest.raises(jobs.InvalidArgumentsError, match=by_place):
            add(gj.spawner, n=1)  # type: ignore[call-arg]
        with pytest.raises(jobs.InvalidArgumentsError, match=no_option(call)):
            add(gj.spawner, 1, debounce=5)  # type: ignore[call-arg]
    for aadd, call in ((opened.aadd, "aadd"), (functools.partial(jobs.aadd_to_group, opened.id), "aadd_to_group")):
        with pytest.raises(jobs.InvalidArgumentsError, match=by_place):
            await aadd(gj.spawner, n=1)  # type: ignore[call-arg]
        with pytest.raises(jobs.InvalidArgumentsError, match=no_option(call)):
            await aadd(gj.spawner, 1, debounce=5)  # type: ignore[call-arg]
    # A running member's ctx.group, async and sync (the refusal comes before its loop is used).
    (member,) = g.members
    row = q(groups_db, "SELECT run_at FROM livepush_jobs WHERE id = %s", (member.id,))[0]
    claimed = ClaimedJob(id=member.id, name="g.member", queue="default", priority=0, attempt=1, max_attempts=5,
                         lease=1, args=[1], run_at=row[0], group_id=g.handle.id)
    from livepush.jobs.groups.context import SyncGroupContext
    from livepush.jobs.runtime.completer import Completer

    inner = JobContext(claimed, Completer(None)).group  # type: ignore[arg-type]
    with pytest.raises(jobs.InvalidArgumentsError, match=by_place):
        await inner.enqueue(gj.spawner, n=1)
    with pytest.raises(jobs.InvalidArgumentsError, match=no_option("ctx.group.enqueue")):
        await inner.enqueue(gj.spawner, 1, debounce=5)
    sync = SyncGroupContext(inner, asyncio.get_running_loop())
    with pytest.raises(jobs.InvalidArgumentsError, match=by_place):
        sync.enqueue(gj.spawner, n=1)  # type: ignore[call-arg]
    with pytest.raises(jobs.InvalidArgumentsError, match=no_option("ctx.group.enqueue")):
        sync.enqueue(gj.spawner, 1, debounce=5)  # type: ignore[call-arg]
    assert jobs.get_group(g.handle.id)["total"] == 1
    assert jobs.get_group(opened.id)["total"] == 0


@contextlib.asynccontextmanager
async def running(**options: Any) -> AsyncIterator[Runtime]:
    """A runtime on the default queue only, polling fast (the job tests' `running`)."""
    options.setdefault("poll_interval", 0.1)
    options.setdefault("queues", ["default"])
    async with runtime_running(**options) as rt:
        yield rt


async def finished(group_id: int, timeout: float = 10.0) -> dict[str, Any]:
    async def check() -> Any:
        v = await asyncio.to_thread(jobs.get_group, group_id)
        return v if v and v["pending"] == 0 and v["finished_at"] else None

    return await async_wait_for(check, timeout, message=f"group {group_id} to finish")


async def test_cancel_group(groups_db: str) -> None:
    """cancel_group: queued members cancelled, running ones stop cooperatively, the group ends
    cancelled with exact counts, and on_finish and on_failure run once."""
    with jobs.group(on_finish=gj.callback.request("fin"), on_success=gj.callback.request("ok"),
                    on_failure=gj.callback.request("bad")) as g:
        g.enqueue(gj.member, "first")
        for i in range(2):
            g.enqueue(gj.wait_flag, "never")
        for i in range(5):
            g.enqueue(gj.member, f"q{i}", wait=60)
    async with running(concurrency=4):
        async def two_running() -> bool:
            return q(groups_db, "SELECT count(*) FROM job_runs WHERE phase = 'start'")[0][0] == 2
        await async_wait_for(two_running, 10)
        assert await asyncio.to_thread(jobs.cancel_group, g.handle.id)
        assert not await asyncio.to_thread(jobs.cancel_group, g.handle.id)
        view = await finished(g.handle.id)
        async def callbacks_ran() -> bool:
            return len(gj.callback_runs(groups_db)) == 2
        await async_wait_for(callbacks_ran, 10)
    assert (view["state"], view["total"], view["succeeded"], view["cancelled"]) == ("cancelled", 8, 1, 7)
    assert sorted(r[0] for r in gj.callback_runs(groups_db)) == ["bad", "fin"]
    msgs = assert_events_well_formed(g.handle.id)
    names = [m["event"] for m in msgs]
    # The history holds what group:<id> showed: after the cancel, its label is its state's.
    assert set(names[names.index("cancelled"):-1]) == {"cancelled"}, names
    with pytest.raises(jobs.GroupClosedError):
        jobs.add_to_group(g.handle.id, gj.member, 1)


async def test_a_group_cancel_is_one_log_line_for_its_running_members_not_one_each(
        groups_db: str, caplog: pytest.LogCaptureFixture) -> None:
    """The cancel of a group whose members run in one runtime is one INFO line there, naming how
    many jobs it stops (their ids at DEBUG): a line per job filled an operator's terminal with
    hundreds of lines for one cancel of a big group. A lone job's cancel names the job."""
    caplog.set_level(logging.DEBUG, logger="livepush.jobs")
    with jobs.group() as g:
        for _ in range(6):
            g.enqueue(gj.wait_flag, "never")
    async with running(concurrency=7) as rt:
        lone = await gj.wait_flag.aenqueue("never")
        await async_wait_for(lambda: lone.id in rt.in_hand, 10, message="the lone job in hand")
        assert await asyncio.to_thread(jobs.cancel, lone.id)
        await async_wait_for(lambda: lone.id not in rt.in_hand, 10, message="the lone job to stop")
        await async_wait_for(lambda: len(rt.in_hand) == 6, 10, message="the group's six members in hand")
        ids = sorted(rt.in_hand)
        assert await asyncio.to_thread(jobs.cancel_group, g.handle.id)
        view = await finished(g.handle.id)
    assert (view["state"], view["cancelled"]) == ("cancelled", 6), view
    told = [(r.levelname, r.getMessage()) for r in caplog.records if "cancel requested" in r.getMessage()]
    assert told == [
        ("INFO", f"cancel requested: stopping job {lone.id} at its next await or progress call"),
        ("INFO", "cancel requested: stopping 6 jobs in hand at their next await or progress call"),
        ("DEBUG", f"cancel requested: the jobs in hand told to stop: {', '.join(map(str, ids))}"),
    ], told


def test_a_group_cancelled_after_every_member_succeeded_runs_on_failure_not_on_success(groups_db: str) -> None:
    """The cancel of a group decides between on_success and on_failure, not only its members: an
    open group whose one member succeeded, then cancelled, runs on_finish and on_failure (the docs'
    comment on on_failure said "a member failed for good, or was cancelled", which none was)."""
    h = jobs.create_group(on_finish=gj.callback.request("fin"), on_success=gj.callback.request("ok"),
                          on_failure=gj.callback.request("bad"))
    h.add(gj.member, "only")
    assert jobs.drain() == {"succeeded": 1}
    assert jobs.cancel_group(h.id) is True
    jobs.drain()
    view = jobs.get_group(h.id)
    assert (view["state"], view["succeeded"], view["failed"], view["cancelled"]) == ("cancelled", 1, 0, 0)
    assert sorted(r[0] for r in gj.callback_runs(groups_db)) == ["bad", "fin"]


def test_a_group_cancel_does_not_wait_for_a_callers_open_signal_to_a_member(groups_db: str) -> None:
    """A caller's transaction that sent a member a signal (jobs.signal(conn=), a key-share lock on
    the member's row until it commits) does not hold up cancel_group: it waited for that commit,
    holding the members before it meanwhile, whose outcomes (and the completer's whole batch with
    them) waited in turn. Its members are cancelled, as jobs.cancel() cancels a job the signal holds."""
    h = jobs.create_group()
    first, second = h.add(gj.member, "a"), h.add(gj.member, "b")
    h.seal()
    with psycopg.connect(groups_db) as conn, concurrent.futures.ThreadPoolExecutor(1) as pool:
        jobs.signal(second.id, "note", {"by": "ana"}, conn=conn)
        cancelled = pool.submit(jobs.cancel_group, h.id)
        try:
            wait_for(lambda: cancelled.done(), 10.0, message="the cancel to end while the signal's transaction is open")
        finally:
            conn.commit()
        assert cancelled.result(10) is True
    assert [jobs.get_job(j.id).state for j in (first, second)] == ["cancelled", "cancelled"]  # type: ignore[union-attr]


def test_a_callback_argument_json_cannot_carry_is_refused_as_a_members_is(groups_db: str) -> None:
    """A callback's arguments are stored with the group, as JSON text: an int too long for it is
    refused with InvalidArgumentsError naming where it is, as enqueue refuses it for a member,
    and nothing is written."""
    huge = 10**5000
    with pytest.raises(jobs.InvalidArgumentsError, match=r"args\[0\] is an int of more than"):
        jobs.group(on_finish=gj.callback.request(huge))
    with pytest.raises(jobs.InvalidArgumentsError, match=r"args\[1\]\[0\] is an int of more than"):
        jobs.create_group(on_success=gj.callback.request("x", [huge]))
    assert q(groups_db, "SELECT count(*) FROM livepush_groups")[0][0] == 0


def test_a_callback_that_is_no_job_request_is_refused_naming_its_keyword_and_the_fix(groups_db: str) -> None:
    """Of three callbacks, the error names the one that is wrong (on_success=, not "group
    callbacks"), and a job function given bare, the likely slip, is told to pass its request with
    the arguments to run with; nothing is written."""
    with pytest.raises(ArgumentTypeError, match=r"on_success= takes .*got the job function 'g\.callback' "
                                                     r"itself: pass its \.request\(\*args\)"):
        jobs.group(on_finish=gj.callback.request("fin"), on_success=gj.callback)  # type: ignore[arg-type]
    with pytest.raises(ArgumentTypeError, match=r"on_failure= takes a job request .*got str 'alert'"):
        jobs.create_group(on_failure="alert")  # type: ignore[arg-type]
    assert q(groups_db, "SELECT count(*) FROM livepush_groups")[0][0] == 0


def test_a_callback_runs_with_a_large_float_argument_still_a_float(groups_db: str) -> None:
    """A callback runs with exactly its arguments: a float from 1e16 up, which JSON writes with an
    exponent and jsonb would turn into an int, reaches the callback a float, as it reaches a member."""
    with jobs.group(on_finish=gj.member.request(1e16)) as g:
        g.enqueue(gj.member, 2.5e20)
    jobs.drain()
    keys = sorted(r[0] for r in q(groups_db, "SELECT key FROM job_runs WHERE phase = 'done'"))
    assert keys == ["1e+16", "2.5e+20"]


async def test_a_callback_keeps_the_claim_limits_of_its_function(groups_db: str) -> None:
    """A callback is a job of its function like any other: two groups' callbacks of a function
    with concurrency=("tenant", 1), for one tenant, run one at a time, as two enqueues would."""
    q(groups_db, limit_jobs.LIMIT_RUNS_TABLE)
    handles = [jobs.create_group(on_finish=limit_jobs.tenant_flag.request("acme", f"cb{i}")) for i in range(2)]
    for h in handles:
        jobs.seal_group(h.id)  # empty: finishes at its seal, its callback enqueued

    def callbacks() -> list[Any]:
        return [r[0] for r in q(groups_db, "SELECT state FROM livepush_jobs WHERE callback_of IS NOT NULL "
                                           "ORDER BY id")]

    async with runtime_running(queues=["default"], concurrency=4, poll_interval=30.0):
        await async_wait_for(lambda: "running" in callbacks(), 10.0, message="a callback to start")
        assert callbacks() == ["running", "available"]
        q(groups_db, "INSERT INTO job_flags (name) VALUES ('cb0')")
        await async_wait_for(lambda: callbacks() == ["succeeded", "running"], 10.0,
                             message="the second callback to start once the first freed the slot")
        q(groups_db, "INSERT INTO job_flags (name) VALUES ('cb1')")
        await async_wait_for(lambda: callbacks() == ["succeeded", "succeeded"], 10.0)


def test_a_cancel_that_failed_part_way_completes_when_called_again(
        groups_db: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """cancel_group runs as several transactions (mark, chunks of members, finish). If the
    connection fails after the mark committed, the group says `cancelled` while members are still
    queued; calling cancel_group again (what the error tells an operator to do) must cancel them
    and finish the group, not stop at "already cancelled" and leave them to run."""
    from livepush.jobs.groups import cancel

    with jobs.group(on_finish=gj.callback.request("fin"), on_failure=gj.callback.request("bad")) as g:
        for i in range(5):
            g.enqueue(gj.member, i, wait=60)
    monkeypatch.setattr(cancel, "CANCEL_CHUNK", 2)
    real_chunk = cancel._chunk_steps
    calls = []

    def failing_second_chunk(group_id: int, after: int) -> Any:
        calls.append(after)
        if len(calls) == 2:
            raise psycopg.OperationalError("server closed the connection unexpectedly")
        return real_chunk(group_id, after)

    monkeypatch.setattr(cancel, "_chunk_steps", failing_second_chunk)
    with pytest.raises(DependencyError):
        jobs.cancel_group(g.handle.id)
    partway = jobs.get_group(g.handle.id)
    assert (partway["state"], partway["cancelled"], partway["pending"]) == ("cancelled", 2, 3)

    jobs.cancel_group(g.handle.id)  # the connection is back: run it again

    members, _ = jobs.group_members(g.handle.id)
    assert [m["state"] for m in members] == ["cancelled"] * 5
    view = jobs.get_group(g.handle.id)
    assert (view["state"], view["pending"], view["cancelled"]) == ("cancelled", 0, 5)
    assert view["finished_at"] is not None
    assert sorted(r[0] for r in q(groups_db, "SELECT kind FROM livepush_group_callbacks WHERE group_id = %s",
                                  (g.handle.id,))) == ["failure", "finish"]
    assert not jobs.cancel_group(g.handle.id)
    assert_events_well_formed(g.handle.id)


async def test_a_running_member_whose_add_meets_its_groups_cancel_ends_cancelled_not_failed(
        groups_db: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A group marked cancelled, its running member not yet told (the cancel's chunks still on their
    way to it, or cut off): the member's ctx.group.enqueue is refused because of the cancel, and the
    member ends `cancelled`, as a member told of the cancel does, not `failed` with an error that
    puts it among the failures and counts the group's cancel as a failure."""
    from livepush.jobs.groups import cancel

    with jobs.group(on_finish=gj.callback.request("fin"), on_failure=gj.callback.request("bad")) as g:
        g.enqueue(gj.waits_then_adds, "go")
    (member_id,) = [m.id for m in g.members]

    def cut_off(group_id: int, after: int) -> Any:
        raise psycopg.OperationalError("server closed the connection unexpectedly")

    async with running(concurrency=2):
        await async_wait_for(lambda: q(groups_db, "SELECT 1 FROM job_runs WHERE phase = 'start'") or None, 10.0,
                             message="the member to start")
        monkeypatch.setattr(cancel, "_chunk_steps", cut_off)
        with pytest.raises(DependencyError):
            await asyncio.to_thread(jobs.cancel_group, g.handle.id)
        monkeypatch.undo()
        q(groups_db, "INSERT INTO job_flags (name) VALUES ('go')")
        await async_wait_for(lambda: jobs.get_job(member_id).state in ("failed", "cancelled") or None, 10.0,
                             message="the member to end")
        info = jobs.get_job(member_id)
        assert (info.state, info.attempt) == ("cancelled", 1), (info.state, info.error)
        jobs.cancel_group(g.handle.id)  # the connection is back: the cancel completes
        view = await finished(g.handle.id)
    assert (view["state"], view["failed"], view["cancelled"], view["total"]) == ("cancelled", 0, 1, 1)
    assert jobs.list_failed() == []


async def test_a_member_that_cancels_its_own_group_cancels_every_member_not_the_first_chunk_only(
        groups_db: str) -> None:
    """A member awaiting jobs.acancel_group() of its own group is told to stop by that very cancel,
    in its first chunk of members: the rest of the cancel still goes on to its end, so the members
    past that chunk are cancelled at once rather than left queued, to run, until a runtime found
    the cancel cut off 30 seconds later."""
    with jobs.group(on_finish=gj.callback.request("fin"), on_failure=gj.callback.request("bad")) as g:
        g.enqueue(gj.cancels_own_group)
        g.enqueue_many((gj.member, (i,), {"wait": 60}) for i in range(2500))
    async with running(concurrency=2):
        view = await finished(g.handle.id, 10.0)
    assert (view["state"], view["pending"], view["cancelled"], view["succeeded"]) == ("cancelled", 0, 2501, 0)
    assert q(groups_db, "SELECT phase FROM job_runs") == [("start",)]
    assert sorted(r[0] for r in q(groups_db, "SELECT kind FROM livepush_group_callbacks WHERE group_id = %s",
                                  (g.handle.id,))) == ["failure", "finish"]


async def test_a_cancel_whose_caller_died_after_the_mark_is_completed_by_a_runtime_not_run(groups_db: str) -> None:
    """cancel_group's caller dies (a web request killed at its timeout, its connection cut) after
    the group was marked cancelled and before its members were: nobody calls it again. A runtime
    completes the cancel at its next housekeeping, so the members the group says are cancelled
    never run, and the group finishes cancelled with its callbacks."""
    with jobs.group(on_finish=gj.callback.request("fin"), on_failure=gj.callback.request("bad")) as g:
        for i in range(3):
            g.enqueue(gj.member, f"m{i}", wait=3)  # due only once the runtime below has started
    first = min(r[0] for r in q(groups_db, "SELECT id FROM livepush_jobs WHERE group_id = %s", (g.handle.id,)))
    with psycopg.connect(groups_db) as holder:
        # The first chunk of the cancel waits for this member's row: the cancel is cut off there.
        holder.execute("SELECT id FROM livepush_jobs WHERE id = %s FOR UPDATE", (first,))
        cancelling = asyncio.create_task(asyncio.to_thread(jobs.cancel_group, g.handle.id))
        [(pid,)] = await async_wait_for(lambda: q(groups_db, """
            SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'
            """) or None, 10.0, message="the cancel's first chunk to wait for the member's row")
        q(groups_db, "SELECT pg_terminate_backend(%s, 5000)", (pid,))
        with pytest.raises(DependencyError):
            await asyncio.wait_for(cancelling, 10.0)
        holder.rollback()
    assert jobs.get_group(g.handle.id)["state"] == "cancelled"
    assert q(groups_db, "SELECT count(*) FROM livepush_jobs WHERE group_id = %s AND state = 'scheduled'",
             (g.handle.id,)) == [(3,)]
    # Its mark is past the grace a cancel still under way gets from the runtimes.
    q(groups_db, "UPDATE livepush_groups SET cancelled_at = now() - make_interval(secs => %s) WHERE id = %s",
      (maintenance.CANCEL_GRACE + 1, g.handle.id))

    async with running(concurrency=4, heartbeat=0.2):
        view = await finished(g.handle.id)
    assert (view["state"], view["cancelled"], view["succeeded"]) == ("cancelled", 3, 0)
    assert q(groups_db, "SELECT count(*) FROM job_runs WHERE key LIKE 'm%%'") == [(0,)]
    assert sorted(r[0] for r in q(groups_db, "SELECT kind FROM livepush_group_callbacks WHERE group_id = %s",
                                  (g.handle.id,))) == ["failure", "finish"]


async def test_a_cancel_cut_off_before_it_finished_a_group_with_nothing_pending_is_finished_by_a_runtime(
        groups_db: str) -> None:
    """An open group whose members have all ended is cancelled, and the caller dies right after the
    mark, with only the finish left to do: no member will ever end to finish it. A runtime finishes
    it, so its callbacks run, rather than leave it cancelled and unfinished for ever."""
    from livepush.jobs.groups import cancel

    h = await asyncio.to_thread(jobs.create_group, on_finish=gj.callback.request("fin"),
                                on_failure=gj.callback.request("bad"))
    await asyncio.to_thread(jobs.add_to_group, h.id, gj.member, "m")
    assert await jobs.adrain() == {"succeeded": 1}
    # cancel_group's first transaction, all that committed before its caller died.
    assert await asyncio.to_thread(in_tx, lambda: cancel._mark_steps(h.id), None)
    q(groups_db, "UPDATE livepush_groups SET cancelled_at = now() - make_interval(secs => %s) WHERE id = %s",
      (maintenance.CANCEL_GRACE + 1, h.id))

    async with running(concurrency=4, heartbeat=0.2):
        view = await finished(h.id)
    assert (view["state"], view["succeeded"], view["pending"]) == ("cancelled", 1, 0)
    assert sorted(r[0] for r in q(groups_db, "SELECT kind FROM livepush_group_callbacks WHERE group_id = %s",
                                  (h.id,))) == ["failure", "finish"]


def test_an_add_that_adds_no_member_shows_no_change(groups_db: str) -> None:
    """add_many_to_group() of an empty list (a page of rows that had none), or of items whose keys
    jobs outside the group hold, adds no member: group:<id> shows nothing new (no `progress` with
    the same counts, no new version), while a closed group still refuses it."""
    outside = gj.member.enqueue("outside", key="k:held")
    h = jobs.create_group()
    (version,) = [s.version for s in read_states(groups_db, [f"group:{h.id}"]).values()]
    # Its `created` a second old: an add with a change would ring and record at once (no coalescing).
    q(groups_db, "UPDATE livepush_group_events SET at = at - interval '1 second' WHERE group_id = %s", (h.id,))
    assert jobs.add_many_to_group(h.id, []) == []
    assert jobs.add_to_group(h.id, gj.member, "again", key="k:held").id == outside.id
    assert [e["event"] for e in group_messages(h.id)] == ["created"]
    assert [s.version for s in read_states(groups_db, [f"group:{h.id}"]).values()] == [version]
    jobs.add_to_group(h.id, gj.member, "real")
    assert [e["event"] for e in group_messages(h.id)] == ["created", "progress"]
    jobs.seal_group(h.id)
    with pytest.raises(jobs.GroupClosedError):
        jobs.add_many_to_group(h.id, [])


def test_progress_from_adds_is_coalesced_too(groups_db: str) -> None:
    """group:<id> shows progress at most ~10 times a second (docs/groups.md), including the
    progress adds make: 30 add_to_group calls in a fraction of a second record a few progress
    events, not 30."""
    import time

    h = jobs.create_group()
    started = time.monotonic()
    for i in range(30):
        jobs.add_to_group(h.id, gj.member, i)
    elapsed = time.monotonic() - started
    progress = [m for m in group_messages(h.id) if m["event"] == "progress"]
    assert len(progress) <= 10 * elapsed + 3, (len(progress), elapsed)


def test_adds_in_one_long_transaction_are_coalesced_too(groups_db: str) -> None:
    """Adds with conn= (one per item, as a web request adds what it makes) in a transaction open
    for longer than 100 ms are coalesced as adds in transactions of their own: a few progress
    events, not one per add."""
    import time

    with psycopg.connect(groups_db) as conn:
        started = time.monotonic()
        h = jobs.create_group(conn=conn)
        conn.execute("SELECT pg_sleep(0.2)")  # the request's other work: its transaction is now old
        for i in range(30):
            jobs.add_to_group(h.id, gj.member, i, conn=conn)
        conn.commit()
        elapsed = time.monotonic() - started
    progress = [m for m in group_messages(h.id) if m["event"] == "progress"]
    assert len(progress) <= 10 * elapsed + 3, (len(progress), elapsed)
    assert jobs.get_group(h.id)["total"] == 30


async def test_an_add_in_a_repeatable_read_transaction_never_records_older_counts_than_the_history_shows(
        groups_db: str) -> None:
    """add_to_group(conn=) in a REPEATABLE READ transaction reads the group as it was when that
    transaction began: members that finished since on other shards look pending to it. It never
    records those counts after newer ones: group_history's counts never go backwards, and the add
    is still shown, by a runtime, as a coalesced add is."""
    h = jobs.create_group(shards=2)
    for i in range(3):
        h.add(gj.member, i)  # ids in the first block of 32: shard 0
    q(groups_db, "SELECT setval('livepush_jobs_id_seq', 40)")  # the next member is on shard 1
    with psycopg.connect(groups_db) as conn:
        conn.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
        conn.execute("SELECT 1")  # the transaction's snapshot: no member has finished yet
        assert jobs.drain() == {"succeeded": 3}
        assert group_messages(h.id)[-1]["group"]["succeeded"] == 3
        # The last event is old enough that the add is not coalesced with it.
        q(groups_db, "UPDATE livepush_group_events SET at = at - interval '1 minute' WHERE group_id = %s", (h.id,))
        async with running(concurrency=1):
            jobs.add_to_group(h.id, gj.member, 9, wait=3600, conn=conn)
            conn.commit()
            await async_wait_for(lambda: group_messages(h.id)[-1]["group"]["total"] == 4, 10,
                                 message="a progress event showing the added member")
    shown = [m["group"] for m in group_messages(h.id)]
    for before, after in zip(shown, shown[1:]):
        assert all(after[k] >= before[k] for k in ("total", "succeeded", "failed", "cancelled")), shown
    assert shown[-1] == {"id": h.id, "state": "open", "total": 4, "pending": 1, "succeeded": 3, "failed": 0,
                         "cancelled": 0}


async def test_the_last_adds_of_a_burst_are_shown_by_a_runtime(groups_db: str) -> None:
    """Adds that come too soon after the group's last event to ring it ring the runtimes instead:
    a running runtime shows the group's final count (its members not yet due, so nothing else
    would ring it) within a bound, not at the next change."""
    h = jobs.create_group()
    async with running(concurrency=2):
        for i in range(30):
            await asyncio.to_thread(jobs.add_to_group, h.id, gj.member, i, wait=3600)
        await async_wait_for(lambda: group_messages(h.id)[-1]["group"]["total"] == 30, 10,
                             message="the last progress event to show all 30 members")
    assert [m["event"] for m in group_messages(h.id)][0] == "created"


async def test_cancelling_members_one_by_one_shows_progress_coalesced_and_the_last_count(groups_db: str) -> None:
    """jobs.cancel() of a group's members one after another (cancel_tagged over a tag its members
    share does just that) records and rings the group's progress at most about ten times a second,
    as outcomes and adds do, not once per member; a running runtime shows the final count."""
    import time

    h = jobs.create_group()
    jobs.add_many_to_group(h.id, [(gj.member, [i], {"wait": 3600, "tags": ["batch"]}) for i in range(300)])
    async with running(concurrency=1):
        started = time.monotonic()
        assert await asyncio.to_thread(jobs.cancel_tagged, "batch") == 300
        elapsed = time.monotonic() - started
        await async_wait_for(lambda: group_messages(h.id)[-1]["group"]["cancelled"] == 300, 10,
                             message="a progress event showing all 300 members cancelled")
    # Two recorders, each at most about ten a second: the cancels, and the runtime they rang.
    progress = [m for m in group_messages(h.id) if m["event"] == "progress"]
    assert len(progress) <= 20 * elapsed + 3, (len(progress), elapsed)
    assert jobs.get_group(h.id)["cancelled"] == 300


async def test_a_forged_progress_ring_naming_no_possible_group_stops_no_progress(groups_db: str) -> None:
    """Any database login can ring `livepush_groups_progress`: a ring naming ids no group can have
    (past the bigint range) is dropped, and the runtime goes on showing the adds that ring it
    after, rather than failing on that id at every try from then on."""
    h = jobs.create_group()
    async with running(concurrency=2):
        q(groups_db, "SELECT pg_notify('livepush_groups_progress', '9999999999999999999'), "
                     "pg_notify('livepush_groups_progress', '9223372036854775808,0')")
        for i in range(30):
            await asyncio.to_thread(jobs.add_to_group, h.id, gj.member, i, wait=3600)
        await async_wait_for(lambda: group_messages(h.id)[-1]["group"]["total"] == 30, 10,
                             message="the last progress event to show all 30 members")


async def test_progress_is_coalesced_and_never_after_finished(groups_db: str) -> None:
    """300 members through a runtime: the group topic gets created, a few progress events (at
    most ~10 a second), then finished last."""
    with jobs.group(on_finish=gj.callback.request("fin")) as g:
        for i in range(300):
            g.enqueue(gj.member, i)
    async with running(concurrency=8):
        await finished(g.handle.id, 30)
    msgs = assert_events_well_formed(g.handle.id)
    times = q(groups_db, "SELECT extract(epoch FROM max(at) - min(at)) FROM livepush_group_events "
                         "WHERE group_id = %s", (g.handle.id,))[0][0]
    progress = [m for m in msgs if m["event"] == "progress"]
    assert len(progress) <= 10 * float(times) + 3, (len(progress), times)
    assert msgs[-1]["group"]["succeeded"] == 300
    evs, _ = jobs.group_history(g.handle.id, limit=1000)
    assert evs[0]["event"] == "finished" and evs[-1]["event"] == "created"


def test_two_progress_recorders_at_once_record_the_counts_in_the_order_they_changed(groups_db: str) -> None:
    """Two transactions record progress for one group at once (two runtimes' progress publishers,
    or a publisher and jobs.cancel): one read the counts, then a member ended and the other went to
    record it. The newer counts are never recorded before the older ones: group_history() shows the
    counts in the order they changed."""
    with jobs.group() as g:
        for i in range(3):
            g.enqueue(gj.member, i)
    member = g.members[0].id
    # jobs.cancel records at once only when the group's last event is 100 ms old or more.
    q(groups_db, "UPDATE livepush_group_events SET at = at - interval '1 minute' WHERE group_id = %s", (g.id,))
    publisher = steps.progress_now([g.id])
    with psycopg.connect(groups_db, autocommit=False) as conn, conn.cursor(row_factory=dict_row) as cur:
        query = next(publisher)
        while query.sql != group_queries.GROUP_VIEWS:  # the publisher's statements up to its read
            cur.execute(query.sql, query.params)
            query = publisher.send(cur.fetchall() if cur.description else [])
        cur.execute(query.sql, query.params)
        read = cur.fetchall()
        assert read[0]["pending"] == 3
        # A member ends now and its progress is recorded, in a transaction of its own.
        cancel = threading.Thread(target=jobs.cancel, args=(member,), daemon=True)
        cancel.start()
        blocked = ("SELECT count(*) FROM pg_stat_activity WHERE %s = ANY(pg_blocking_pids(pid))",
                   (conn.info.backend_pid,))
        wait_for(lambda: not cancel.is_alive() or q(groups_db, *blocked)[0][0] > 0, 10,
                 message="the cancel to end, or to wait for the publisher")
        try:
            query = publisher.send(read)
            while True:  # the publisher records what it read, and commits
                cur.execute(query.sql, query.params)
                query = publisher.send(cur.fetchall() if cur.description else [])
        except StopIteration:
            conn.commit()
        cancel.join(10)
        assert not cancel.is_alive()
    pending = [m["group"]["pending"] for m in group_messages(g.id)]
    assert pending == [3, 3, 2], pending  # created, the publisher's progress, the cancel's


async def test_a_progress_publisher_forgets_groups_that_finished_in_another_runtime(
        groups_db: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A runtime's progress publisher remembers, per group, when it may ring next and what it
    recorded last. A group whose last member ends in another runtime is never read here again,
    so those entries must go once they are idle (here at once), or a long-running runtime
    among several holds one for every group it ever counted in."""
    from psycopg_pool import AsyncConnectionPool

    from livepush.jobs.groups import progress

    monkeypatch.setattr(progress, "FORGET_AFTER", 0.0)
    groups = []
    for _ in range(20):
        with jobs.group() as g:
            g.enqueue(gj.member, "here")
            g.enqueue(gj.member, "elsewhere")
        groups.append(g)
    async with AsyncConnectionPool(groups_db, min_size=1, max_size=2, open=False) as pool:
        publisher = progress.ProgressPublisher(pool, interval=0.0)
        for g in groups:
            here, elsewhere = g.members
            # This runtime counts one member's outcome and publishes the group's progress ...
            assert await asyncio.to_thread(jobs.cancel, here.id)
            publisher.mark([g.id])
            await publisher.flush()
            # ... and another one ends the last member, finishing the group without us.
            assert await asyncio.to_thread(jobs.cancel, elsewhere.id)
            assert (await asyncio.to_thread(jobs.get_group, g.id))["finished_at"] is not None
        assert publisher.tracked() <= 1


async def test_race_member_adds_while_the_last_other_member_finishes(groups_db: str) -> None:
    """50 times: a member adds a member while the only other member finishes, across 4 slots:
    the group never finishes early, counts every member, and its callback runs once."""
    gids = []
    for i in range(50):
        with jobs.group(on_finish=gj.callback.request(f"fin{i}")) as g:
            g.enqueue(gj.spawner, 1, f"s{i}")
            g.enqueue(gj.member, f"m{i}")
        gids.append(g.handle.id)
    async with running(concurrency=8):
        for gid in gids:
            await finished(gid, 30)
        async def all_ran() -> bool:
            return len(gj.callback_runs(groups_db)) >= 50
        await async_wait_for(all_ran, 30)
    for gid in gids:
        v = jobs.get_group(gid)
        assert (v["total"], v["succeeded"]) == (3, 3), v
    runs = gj.callback_runs(groups_db)
    assert sorted(r[0] for r in runs) == sorted(f"fin{i}" for i in range(50))
    # Each callback was enqueued after every member (including the added one) had finished.
    bad = q(groups_db, """
        SELECT c.group_id FROM livepush_group_callbacks c JOIN livepush_jobs cb ON cb.id = c.job_id
        JOIN livepush_jobs m ON m.group_id = c.group_id
        WHERE m.id > cb.id OR m.finished_at IS NULL""")
    assert bad == []


async def test_a_runtime_cancels_orphaned_children_in_its_own_database_not_the_process_default(
        groups_db: str, make_pg_url: Callable[[], str]) -> None:
    """A runtime on a database of its own (Runtime(url=)) cancels the groups of children whose parent
    finished first there, through its own connections: the process's default database, where the
    same group id names another group, is left alone."""
    other = make_pg_url()
    with jobs.group() as here:
        here.enqueue(gj.member, "here")
    jobs.configure(other)
    try:
        parent = gj.member.enqueue("parent")
        with jobs.group() as there:
            there.enqueue(gj.member, "there")
    finally:
        jobs.configure(None)
    assert here.handle.id == there.handle.id  # each database's ids start at 1
    # The parent finished while its children had not (a workflow run that ended, say).
    q(other, "UPDATE livepush_jobs SET state = 'succeeded', finished_at = now() WHERE id = %s", (parent.id,))
    q(other, "UPDATE livepush_groups SET parent_id = %s WHERE id = %s", (parent.id, there.handle.id))
    # It serves another queue: the members stay queued, so only the cancel can end them.
    async with runtime_running(url=other, queues=["second"]):
        def cancelled() -> bool:
            return q(other, "SELECT state FROM livepush_groups WHERE id = %s", (there.handle.id,)) == [("cancelled",)]
        await async_wait_for(lambda: asyncio.to_thread(cancelled), 10.0, message="the orphaned group's cancel")
    mine = jobs.get_group(here.handle.id)
    assert mine is not None and (mine["state"], mine["pending"]) == ("sealed", 1), mine


async def test_a_members_add_of_arguments_livepush_refuses_fails_it_at_once(groups_db: str) -> None:
    """A member's ctx.group.enqueue of arguments that are not JSON is refused the same way on every
    attempt: the member fails on its first with InvalidArgumentsError, not after max_attempts."""
    h = jobs.create_group()
    spawner = await h.aadd(gj.spawn_unfit)
    await jobs.adrain()
    info = jobs.get_job(spawner.id)
    assert info is not None and info.state == "failed", info
    assert info.error.startswith("InvalidArgumentsError: "), info.error
    assert info.attempt == 1, info.error


async def test_a_big_sweep_of_orphaned_child_groups_is_a_short_info_line_with_every_id_at_debug(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """A sweep that cancels many orphaned child groups says how many at INFO with the first few
    ids, not every id in one enormous line; every id is in a DEBUG line beside it."""
    swept = list(range(1001, 1101))

    async def cancelled(pool: Any, sql: str, params: dict[str, Any]) -> list[int]:
        return swept

    monkeypatch.setattr(maintenance, "_cancel_groups", cancelled)
    with caplog.at_level(logging.DEBUG, logger="livepush.jobs"):
        assert await maintenance.cancel_orphaned_children(None) == swept  # type: ignore[arg-type]
    infos = [r.getMessage() for r in caplog.records if r.levelno == logging.INFO]
    debugs = [r.getMessage() for r in caplog.records if r.levelno == logging.DEBUG]
    assert len(infos) == 1 and "100 " in infos[0] and "1001, 1002" in infos[0], infos
    assert "1100" not in infos[0] and len(infos[0]) < 200, infos
    assert any(all(str(gid) in line for gid in swept) for line in debugs), debugs


def test_retention(groups_db: str) -> None:
    """Maintenance deletes finished lone jobs and finished groups (with members and callbacks)
    past the retention time, payloads with their jobs; a member of an unfinished group stays."""
    lone = gj.member.enqueue("lone")
    with jobs.group(on_finish=gj.callback.request("fin")) as done_group:
        g_member = done_group.enqueue(gj.member, "x")  # noqa: F841
    open_group = jobs.create_group()
    kept = jobs.add_to_group(open_group.id, gj.member, "kept")
    jobs.drain()
    q(groups_db, "UPDATE livepush_jobs SET finished_at = now() - interval '2 hours' WHERE finished_at IS NOT NULL")
    q(groups_db, "UPDATE livepush_groups SET finished_at = now() - interval '2 hours' WHERE finished_at IS NOT NULL")

    async def prune() -> int:
        from psycopg_pool import AsyncConnectionPool

        async with AsyncConnectionPool(groups_db, min_size=1, max_size=2, open=False) as pool:
            return await maintenance.prune(pool, 3600)

    deleted = asyncio.run(prune())
    assert deleted >= 4
    left = {r[0] for r in q(groups_db, "SELECT id FROM livepush_jobs")}
    assert left == {kept.id}
    assert {r[0] for r in q(groups_db, "SELECT id FROM livepush_job_payloads")} == {kept.id}
    assert jobs.get_group(done_group.handle.id) is None
    assert jobs.get_group(open_group.id) is not None
    assert lone.id not in left
    assert q(groups_db, group_queries.PRUNE_GROUPS, {"retention": 3600, "limit": 10}) == []
    # Their state topics went with their rows (a page gets no state for them); the kept ones stay.
    # The message log never held a row for either.
    asked = [f"job:{lone.id}", f"group:{done_group.handle.id}", f"job:{kept.id}", f"group:{open_group.id}"]
    assert set(read_states(groups_db, asked)) == {f"job:{kept.id}", f"group:{open_group.id}"}
    assert q(groups_db, "SELECT count(*) FROM livepush_topics "
                        "WHERE topic LIKE 'job:%' OR topic LIKE 'group:%'") == [(0,)]


def test_retention_goes_past_old_groups_whose_callbacks_are_still_queued(groups_db: str) -> None:
    """A group is kept while one of its callbacks is queued (here: 150 old groups whose on_finish
    no runtime has run yet, e.g. its function is not deployed anywhere). Those must not hold up
    the deletion of the finished groups behind them: retention goes past them."""
    with psycopg.connect(groups_db) as conn:
        for _ in range(150):
            with jobs.group(on_finish=gj.callback.request("queued"), conn=conn):
                pass  # empty: finished at once, its callback queued
    q(groups_db, "UPDATE livepush_groups SET finished_at = now() - interval '3 hours'")
    with jobs.group() as done:
        done.enqueue(gj.member, "x")
    assert jobs.cancel(done.members[0].id)  # its last member ended: finished, with no callback
    q(groups_db, "UPDATE livepush_groups SET finished_at = now() - interval '2 hours' WHERE id = %s", (done.id,))
    q(groups_db, "UPDATE livepush_jobs SET finished_at = now() - interval '2 hours' WHERE finished_at IS NOT NULL")

    async def prune() -> int:
        from psycopg_pool import AsyncConnectionPool

        async with AsyncConnectionPool(groups_db, min_size=1, max_size=2, open=False) as pool:
            return await maintenance.prune(pool, 3600)

    asyncio.run(prune())
    assert jobs.get_group(done.id) is None
    assert q(groups_db, "SELECT count(*) FROM livepush_jobs WHERE group_id = %s", (done.id,)) == [(0,)]
    assert q(groups_db, "SELECT count(*) FROM livepush_groups") == [(150,)]


@pytest.mark.parametrize("fanout", ["postgres", "local"])
def test_every_member_gets_its_enqueued_event(groups_db: str, fanout: str) -> None:
    """Members added by the block, by add_many_to_group and by a running member each start
    with `enqueued` at version 1 on job:<id>, whatever the fan-out: a job's state topic is its
    row, written by the insert itself."""
    from livepush import api, config
    from livepush.fanout.local import LocalFanOut

    if fanout == "local":
        config.set_settings(config.Settings(database_url=groups_db, fanout="local", env="test",
                                            secret=config.get_settings().secret))
        api.set_default_fanout(LocalFanOut())

    with jobs.group() as g:
        g.enqueue(gj.spawner, 1, "a")
        g.enqueue(gj.member, "b")
    h = jobs.create_group()
    added = jobs.add_many_to_group(h.id, [gj.member.request("c"), gj.member.request("d")])
    h.seal()
    jobs.drain()
    members = [r[0] for r in q(groups_db, "SELECT id FROM livepush_jobs WHERE group_id IN (%s, %s) ORDER BY id",
                                  (g.handle.id, h.id))]
    assert len(members) == 5  # the block's two, the one the spawner added, the two added later
    assert {m.id for m in added} <= set(members)
    for job_id in members:
        evs = events_of(groups_db, job_id)
        assert [e["event"] for e in evs] == ["enqueued", "started", "succeeded"], job_id
        assert evs[0]["job"]["state"] == "available"


def test_retention_works_off_a_backlog_of_finished_groups_as_it_does_jobs(groups_db: str) -> None:
    """One prune deletes up to max_batches batches of expired groups, as it does jobs: groups that
    finish faster than one batch per prune (a runtime prunes at most once a minute) are still
    deleted, rather than piling up behind a single batch a minute."""
    q(groups_db, """INSERT INTO livepush_groups (id, shards, state, finished_at)
                    SELECT nextval('livepush_groups_id_seq'), 1, 'finished', now() - interval '2 days'
                    FROM generate_series(1, 250)""")

    async def prune() -> int:
        from psycopg_pool import AsyncConnectionPool

        async with AsyncConnectionPool(groups_db, min_size=1, max_size=2, open=False) as pool:
            return await maintenance.prune(pool, 3600, batch=100, max_batches=5)

    assert asyncio.run(prune()) == 250
    assert q(groups_db, "SELECT count(*) FROM livepush_groups") == [(0,)]


def test_retention_works_off_a_backlog_of_finished_groups_with_members(groups_db: str) -> None:
    """Groups with members too: one prune deletes up to max_batches batches of their jobs and of
    their rows, not one batch of groups a prune (which a runtime makes at most once a minute, so
    groups finishing faster than that would pile up for good)."""
    for i in range(250):
        with jobs.group() as g:
            g.enqueue(gj.member, i)
    assert jobs.drain() == {"succeeded": 250}
    q(groups_db, "UPDATE livepush_groups SET finished_at = now() - interval '2 days'")
    q(groups_db, "UPDATE livepush_jobs SET finished_at = now() - interval '2 days'")

    async def prune() -> int:
        from psycopg_pool import AsyncConnectionPool

        async with AsyncConnectionPool(groups_db, min_size=1, max_size=2, open=False) as pool:
            return await maintenance.prune(pool, 3600, batch=100, max_batches=5)

    assert asyncio.run(prune()) == 500
    assert q(groups_db, "SELECT count(*) FROM livepush_groups") == [(0,)]
    assert q(groups_db, "SELECT count(*) FROM livepush_jobs") == [(0,)]


def test_a_member_reading_kind_is_told_it_is_a_callbacks_only_attribute() -> None:
    """ctx.group.kind says which callback runs ("finish", "success", "failure"): a member has none,
    and reading it raises the AttributeError the other callbacks-only attributes raise, not None
    (which a member could take for a callback of no kind); hasattr() says False."""
    from types import SimpleNamespace

    from livepush.jobs.groups.context import GroupContext

    member = GroupContext(SimpleNamespace(_job=SimpleNamespace(callback_of=None, group_id=5)))
    with pytest.raises(AttributeError, match=r"ctx\.group\.kind is which callback .*known to its callbacks only"):
        member.kind
    assert not hasattr(member, "kind")
    callback = GroupContext(SimpleNamespace(_job=SimpleNamespace(callback_of=5, group_id=None)), {"state": "finished"},
                            "success")
    assert callback.kind == "success" and callback.id == 5


def test_sync_group_enqueue_does_not_wait_for_ever_on_a_loop_that_stopped(monkeypatch: pytest.MonkeyPatch) -> None:
    """The sync ctx.group.enqueue runs its add on the runtime's loop: should that loop stop and
    close while the add waits (the runtime's process shutting down), its own timeout never fires
    there. The call gives up once the loop stopped, with a RuntimeStoppedError saying so, rather than
    holding the job's thread for ever."""
    from types import SimpleNamespace

    from livepush.jobs.errors import RuntimeStoppedError
    from livepush.jobs.groups.context import GroupContext, SyncGroupContext
    from livepush.jobs.runtime import threads

    monkeypatch.setattr(threads, "LOOP_CHECK", 0.1)
    runtime_loop = LoopThread()

    class Blocked(GroupContext):
        enqueue = Stuck()

    inner = Blocked(SimpleNamespace(_job=SimpleNamespace(callback_of=None, group_id=5)))
    caller = Caller(lambda: SyncGroupContext(inner, runtime_loop.loop).enqueue(gj.member, 1, timeout=0.2))
    assert Blocked.enqueue.started.wait(5)
    runtime_loop.stop()
    assert caller.ended(10), "ctx.group.enqueue still waits on a closed loop"
    assert isinstance(caller.error, RuntimeStoppedError), caller.error
    assert "runtime's event loop" in str(caller.error)


def test_sync_group_enqueue_gives_up_on_a_stopped_loop_within_a_second_not_its_timeout(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A sync ctx.group.enqueue with its default 30 s timeout whose runtime's loop stops and closes
    while the add waits gives up within about a second of the stop, as every blocking ctx call
    does, not once its own timeout has passed: that timeout fires on the loop, which is gone."""
    from types import SimpleNamespace

    from livepush.jobs.errors import RuntimeStoppedError
    from livepush.jobs.groups.context import GroupContext, SyncGroupContext
    from livepush.jobs.runtime import threads

    monkeypatch.setattr(threads, "LOOP_CHECK", 0.1)
    runtime_loop = LoopThread()

    class Blocked(GroupContext):
        enqueue = Stuck()

    inner = Blocked(SimpleNamespace(_job=SimpleNamespace(callback_of=None, group_id=5)))
    caller = Caller(lambda: SyncGroupContext(inner, runtime_loop.loop).enqueue(gj.member, 1))  # timeout=30.0
    assert Blocked.enqueue.started.wait(5)
    runtime_loop.stop()
    assert caller.ended(5), "ctx.group.enqueue waits out its own timeout on a loop that stopped"
    assert isinstance(caller.error, RuntimeStoppedError), caller.error


def test_a_cancel_of_a_big_group_shows_progress_at_most_about_ten_times_a_second(
        groups_db: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """cancel_group works through a group's members chunk by chunk; the counts each chunk changes
    are shown as any other change of the counts is (at most about ten events a second per group,
    labelled `cancelled` once the group is), not one event per chunk, and the group's `finished`
    still shows every member cancelled."""
    import time

    from livepush.jobs.groups import cancel

    h = jobs.create_group()
    jobs.add_many_to_group(h.id, [(gj.member, [i], {"wait": 3600}) for i in range(600)])
    h.seal()
    monkeypatch.setattr(cancel, "CANCEL_CHUNK", 5)  # 120 chunks, as a 100,000-member group has 100
    started = time.monotonic()
    assert jobs.cancel_group(h.id)
    elapsed = time.monotonic() - started
    msgs = assert_events_well_formed(h.id)
    after_mark = msgs[[m["event"] for m in msgs].index("cancelled") + 1:-1]
    assert len(after_mark) <= 10 * elapsed + 2, (len(after_mark), elapsed)
    assert msgs[-1]["group"]["cancelled"] == 600


async def test_cancel_group_of_an_unknown_id_answers_false_where_seal_and_add_raise(groups_db: str) -> None:
    """cancel_group is an operator's call, answered as jobs.cancel() answers for an unknown job:
    False, nothing to cancel (a group deleted after its retention time had finished). add and
    seal build a group the caller holds, and an unknown one is a mistake it must hear of:
    GroupNotFound."""
    for unknown in (10**12, 2**70):
        assert await asyncio.to_thread(jobs.cancel_group, unknown) is False
        assert await jobs.acancel_group(unknown) is False
        with pytest.raises(jobs.GroupNotFound):
            await asyncio.to_thread(jobs.seal_group, unknown)


async def test_members_or_callbacks_too_large_to_store_are_refused_naming_them(groups_db: str) -> None:
    """A group's members or callbacks whose arguments are past what one jsonb value holds (256 MiB)
    raise InvalidArgumentsError naming them, and nothing is written: a DependencyError said
    Postgres had failed, for a call that fails the same however often it is tried again."""
    half = "x" * 140_000_000  # twice over the limit; one string, so the test holds it once
    with pytest.raises(jobs.InvalidArgumentsError,
                       match=r"the arguments of the members and callbacks of task group \d+ are too large for Postgres"):
        with jobs.group() as g:
            g.enqueue(gj.member, half)
            g.enqueue(gj.member, half)
    with pytest.raises(jobs.InvalidArgumentsError,
                       match="the arguments of the callbacks of a new task group are too large for Postgres"):
        jobs.create_group(on_finish=gj.callback.request(half, half))
    h = jobs.create_group()
    with pytest.raises(jobs.InvalidArgumentsError,
                       match=r"the arguments of aadd_many_to_group\(\)'s 2 jobs are too large for Postgres"):
        await jobs.aadd_many_to_group(h.id, [(gj.member, [half]), (gj.member, [half])])
    del half
    assert q(groups_db, "SELECT id FROM livepush_groups") == [(h.id,)]
    assert q(groups_db, "SELECT count(*) FROM livepush_jobs")[0][0] == 0
    # A running member's ctx.group.enqueue alike: its job fails naming the arguments.
    spawner = await h.aadd(gj.spawn_too_large)
    await jobs.adrain()
    info = jobs.get_job(spawner.id)
    assert info is not None and info.state == "failed", info
    assert info.error.startswith("InvalidArgumentsError: the arguments of g.callback are too large for Postgres"), \
        info.error


async def test_members_past_one_message_to_postgres_are_refused_naming_them(
        groups_db: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A group's members whose arguments' JSON passes what one message to Postgres carries
    together (lowered here to 100,000 bytes) raise InvalidArgumentsError naming them before
    anything is sent, and nothing is written: Postgres closed the connection on such a message."""
    from livepush.jobs.api import args

    monkeypatch.setattr(args, "SENDABLE", 100_000)
    part = "x" * 40_000
    with pytest.raises(jobs.InvalidArgumentsError, match=r"the arguments of the members and callbacks of task group "
                                                         r"\d+ are too large for Postgres to store \(past the 1 GiB"):
        with jobs.group() as g:
            for _ in range(3):
                g.enqueue(gj.member, part)
    h = jobs.create_group()
    with pytest.raises(jobs.InvalidArgumentsError,
                       match=r"the arguments of aadd_many_to_group\(\)'s 3 jobs are too large .*\(past the 1 GiB"):
        await jobs.aadd_many_to_group(h.id, [(gj.member, [part])] * 3)
    assert q(groups_db, "SELECT id FROM livepush_groups") == [(h.id,)]
    assert q(groups_db, "SELECT count(*) FROM livepush_jobs")[0][0] == 0
