"""flow.start(key=) (docs/workflows.md "Runs and steps"): a start retried after its reply was lost
returns the run the first one made, whatever the number of concurrent starters; a finished run
frees its key."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import psycopg
import pytest

from livepush import jobs
from tests.jobs import workflow_defs as wd
from tests.jobs.conftest import q
from tests.support.waiting import wait_for


def runs_with_key(url: str, key: str) -> list[tuple[Any, ...]]:
    return q(url, "SELECT id, name, state FROM livepush_workflows WHERE key = %s ORDER BY id", (key,))


async def test_a_start_retried_with_its_key_returns_the_first_run_until_it_finished(jobs_db: str) -> None:
    """While the run a key started is unfinished (running or paused), start and astart with the key
    return its handle and write nothing, whatever input they pass; once it finished the key is free.
    A key is one workflow's: another workflow's start with it makes that workflow's own run."""
    first = wd.diamond.start({"n": 1}, key="order:7")
    assert wd.diamond.start({"n": 2}, key="order:7") == first  # the caller's retry
    assert await wd.diamond.astart({"n": 3}, key="order:7") == first
    assert await jobs.workflows.apause(first.id, actor="ana")
    assert wd.diamond.start({"n": 4}, key="order:7") == first  # paused is unfinished
    other = await wd.verbs.astart({}, key="order:7")
    assert other != first and other.name == "t_verbs"
    found = await jobs.workflows.aget(first.id)
    assert found is not None and found["audit"][0]["verb"] == "pause" and len(found["audit"]) == 1
    assert q(jobs_db, "SELECT input FROM livepush_workflows WHERE id = %s", (first.id,)) == [({"n": 1},)]
    assert await jobs.workflows.acancel(first.id)
    again = wd.diamond.start({"n": 5}, key="order:7")
    assert again.id > other.id
    assert [r[0] for r in runs_with_key(jobs_db, "order:7")] == [first.id, other.id, again.id]
    # One run's steps were enqueued, not one per call: the first run's first step, the second's, the third's.
    assert q(jobs_db, "SELECT count(*) FROM livepush_jobs WHERE workflow_id IS NOT NULL") == [(3,)]
    await jobs.workflows.acancel(other.id)
    await jobs.workflows.acancel(again.id)


@pytest.mark.parametrize("key", ["", 7, "k" * 501, "a\x00b"])
def test_a_bad_start_key_is_refused_before_anything_is_written(jobs_db: str, key: Any) -> None:
    with pytest.raises(jobs.InvalidArgumentsError, match="key="):
        wd.diamond.start({"n": 1}, key=key)
    assert q(jobs_db, "SELECT count(*) FROM livepush_workflows") == [(0,)]


def test_a_start_with_conn_takes_its_key_when_the_transaction_commits(jobs_db: str) -> None:
    """With conn=, a concurrent start of the key waits for the caller's transaction: rolled back,
    the key stays free and the waiting start makes its own run; committed, it returns that run."""
    for outcome in ("rollback", "commit"):
        with psycopg.connect(jobs_db) as conn, ThreadPoolExecutor(1) as pool:
            mine = wd.diamond.start({"n": 1}, key=f"tx-{outcome}", conn=conn)
            racing = pool.submit(wd.diamond.start, {"n": 2}, key=f"tx-{outcome}")
            wait_for(lambda: racing.done() or q(jobs_db, "SELECT count(*) FROM pg_stat_activity WHERE datname = "
                                                         "current_database() AND wait_event_type = 'Lock'")[0][0] > 0,
                     10.0, message="the second start to wait for the first's transaction")
            getattr(conn, outcome)()
            theirs = racing.result(10)
        assert (theirs == mine) is (outcome == "commit")
        assert [r[0] for r in runs_with_key(jobs_db, f"tx-{outcome}")] == [theirs.id]


def test_concurrent_starts_of_one_key_from_threads_make_one_run(jobs_db: str) -> None:
    """16 threads starting the same key at once (each on its own connection, in its own
    transaction held open a moment): one run, and every caller gets its handle."""
    barrier = threading.Barrier(16)
    got: list[Any] = []
    errors: list[BaseException] = []

    def start(i: int) -> None:
        try:
            with psycopg.connect(jobs_db) as conn:
                barrier.wait(10)
                got.append(wd.diamond.start({"n": i}, key="race", conn=conn))
                conn.execute("SELECT pg_sleep(0.01)")  # the others wait on the key until this commits
        except BaseException as exc:  # noqa: BLE001 - reported by the assertion below
            errors.append(exc)

    threads = [threading.Thread(target=start, args=(i,)) for i in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert errors == [] and len(got) == 16 and len(set(got)) == 1
    assert runs_with_key(jobs_db, "race") == [(got[0].id, "t_diamond", "running")]
    assert q(jobs_db, "SELECT count(*) FROM livepush_jobs WHERE workflow_id = %s", (got[0].id,)) == [(1,)]


async def test_a_run_shows_its_start_key_and_list_finds_its_runs_by_it(jobs_db: str) -> None:
    """A caller who lost the reply to a start finds its run by the key, without starting again:
    get() and list() rows show the key a run was started with (None without one), and list(key=)
    (alist too) pages the runs started with it, newest first, finished ones included, alone or with
    name= and state=."""
    first = wd.diamond.start({"n": 1}, key="order:8")
    assert jobs.workflows.cancel(first.id)
    second = await wd.diamond.astart({"n": 2}, key="order:8")
    other = wd.verbs.start({}, key="order:8")
    plain = wd.diamond.start({"n": 3})
    got = jobs.workflows.get(second.id)
    assert got is not None and got["key"] == "order:8"
    assert (await jobs.workflows.aget(plain.id) or {})["key"] is None
    page, cursor = jobs.workflows.list(key="order:8")
    assert [(r["id"], r["name"], r["key"]) for r in page] == [
        (other.id, "t_verbs", "order:8"), (second.id, "t_diamond", "order:8"), (first.id, "t_diamond", "order:8")]
    assert cursor is None
    page, cursor = await jobs.workflows.alist("t_diamond", key="order:8", limit=1)
    assert [r["id"] for r in page] == [second.id] and cursor == second.id
    assert (await jobs.workflows.alist("t_diamond", key="order:8", before=cursor))[0][0]["id"] == first.id
    assert [r["id"] for r in jobs.workflows.list(state="cancelled", key="order:8")[0]] == [first.id]
    assert jobs.workflows.list(key="order:9") == ([], None)
    assert [(r["id"], r["key"]) for r in jobs.workflows.list("t_diamond", "running")[0]] == [
        (plain.id, None), (second.id, "order:8")]
    for run in (second, other, plain):
        jobs.workflows.cancel(run.id)


@pytest.mark.parametrize("key", ["", 7, "k" * 501, "a\x00b"])
async def test_a_bad_list_key_is_refused_as_a_start_refuses_it(jobs_db: str, key: Any) -> None:
    with pytest.raises(jobs.InvalidArgumentsError, match="key="):
        jobs.workflows.list(key=key)
    with pytest.raises(jobs.InvalidArgumentsError, match="key="):
        await jobs.workflows.alist(key=key)
