"""jobs.drain(), retries, never_retry, retry_failed, discard_failed, cancel of queued jobs, clear()."""

from __future__ import annotations

import asyncio
import re
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import psycopg
import pytest

from livepush import ConfigError, config
from livepush import jobs
from livepush.jobs import database
from livepush.jobs.api import testing
from livepush.jobs.runtime import runtime
from tests.jobs import limit_jobs, sample_jobs
from tests.jobs.conftest import events_of, names_of, q, read_states, running
from tests.support.waiting import async_wait_for, wait_for


def runs(url: str, job_id: int, phase: str = "done") -> list[int]:
    return [r[0] for r in q(url, "SELECT attempt FROM job_runs WHERE job_id = %s AND phase = %s ORDER BY at",
                            (job_id, phase))]


def test_drain_runs_every_due_job_and_counts(jobs_db: str) -> None:
    """drain() runs due jobs of every queue once (async and sync) and returns counts by outcome."""
    a = sample_jobs.record.enqueue("a")
    b = sample_jobs.record_sync.enqueue("b")
    c = sample_jobs.other_queue.enqueue("c")
    later = sample_jobs.record.enqueue("later", wait=60)
    assert jobs.drain() == {"succeeded": 3}
    assert runs(jobs_db, a.id) == runs(jobs_db, b.id) == runs(jobs_db, c.id) == [1]
    assert runs(jobs_db, later.id) == []
    assert jobs.job_state(later.id)["state"] == "scheduled"  # type: ignore[index]
    for h in (a, b, c):
        assert names_of(jobs_db, h.id) == ["enqueued/available", "started/running", "succeeded/succeeded"]
    assert names_of(jobs_db, later.id) == ["enqueued/scheduled"]


def test_a_job_knows_its_name_queue_and_attempt(jobs_db: str) -> None:
    """`ctx.queue` is the queue the job was claimed from, in a sync job (a thread) as in an async one."""
    h = sample_jobs.where_sync.enqueue()
    assert jobs.drain(["second"]) == {"succeeded": 1}
    assert jobs.get_job(h.id).result == {"name": "t.where_sync", "queue": "second", "attempt": 1}  # type: ignore[union-attr]


def test_drain_gives_back_nothing_it_does_not_know_before_a_reconcile_is_due(
        jobs_db: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A runtime's periodic give-back of jobs it does not know counts from its registration: a
    drain's first claim sends no such statement, as a new runtime's id holds nothing yet."""
    from livepush.jobs.runtime import maintenance

    calls = 0
    release_unknown = maintenance.release_unknown

    async def counted(*args: Any) -> tuple[int, set[int]]:
        nonlocal calls
        calls += 1
        return await release_unknown(*args)

    monkeypatch.setattr(maintenance, "release_unknown", counted)
    sample_jobs.record.enqueue("a")
    assert jobs.drain() == {"succeeded": 1}
    assert calls == 0


def test_drain_leaves_a_paused_queue_alone_as_runtimes_do(jobs_db: str) -> None:
    """drain() claims as a runtime does: a paused queue's jobs wait, named or not, until it is resumed."""
    jobs.pause_queue("second")
    a = sample_jobs.record.enqueue("a")
    held = sample_jobs.other_queue.enqueue("held")
    assert jobs.drain() == {"succeeded": 1}
    assert jobs.drain(["second"]) == {}
    assert runs(jobs_db, a.id) == [1] and runs(jobs_db, held.id) == []
    assert jobs.job_state(held.id)["state"] == "available"  # type: ignore[index]
    jobs.resume_queue("second")
    assert jobs.drain(["second"]) == {"succeeded": 1}
    assert runs(jobs_db, held.id) == [1]


async def test_drain_from_async_code(jobs_db: str) -> None:
    """adrain() works inside a running loop (and drain() too, through a thread)."""
    sample_jobs.record.enqueue()
    assert await jobs.adrain() == {"succeeded": 1}
    sample_jobs.record.enqueue()
    assert jobs.drain() == {"succeeded": 1}


async def test_adrain_leaves_the_pools_of_the_callers_loop_to_its_other_tasks(jobs_db: str) -> None:
    """adrain() runs in the caller's loop, which goes on after it: an aenqueue() of another task
    of that loop, waiting for a connection of the loop's pool as adrain() returned, failed with
    "cannot reach Postgres (the pool is closed)", adrain() having closed the pool on its way out
    as if the loop ended with it (drain() does close what it opened on its own loop)."""
    pool_size = database.pools().max_size
    with psycopg.connect(jobs_db) as holder:
        # A keyed enqueue waits for this uncommitted job of the key, holding its pool connection.
        sample_jobs.record.enqueue("held", key="held", conn=holder)
        blocked = [asyncio.create_task(sample_jobs.record.aenqueue(i, key="held")) for i in range(pool_size)]
        await async_wait_for(lambda: q(jobs_db, "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = "
                                                "'Lock' AND query LIKE '%livepush_enqueue%'")[0][0] == pool_size,
                             10.0, message="every connection of the loop's pool to wait for the held key")
        waiting = asyncio.create_task(sample_jobs.record.aenqueue("waiting for a connection"))
        assert await jobs.adrain() == {}
        holder.commit()
    handles = await asyncio.wait_for(asyncio.gather(*blocked, waiting, return_exceptions=True), 10)
    assert [h for h in handles if isinstance(h, BaseException)] == []
    assert await jobs.adrain() == {"succeeded": 2}


def test_drain_runs_a_job_with_limits_that_a_job_it_ran_enqueued(jobs_db: str) -> None:
    """drain() runs every due job, also a job with limits enqueued by a job it ran: it ended with
    that job left available, because the first claim had noted that the function had no job to
    start, and a runtime trusts that note for a poll interval unless its doorbell rings."""
    q(jobs_db, limit_jobs.LIMIT_RUNS_TABLE)
    parent = limit_jobs.enqueues_per_tenant.enqueue("acme")
    assert jobs.drain() == {"succeeded": 2}
    assert q(jobs_db, "SELECT name, state FROM livepush_jobs WHERE id <> %s", (parent.id,)) == [
        ("t.per_tenant", "succeeded")]


def test_retries_until_success(jobs_db: str) -> None:
    """A failing job retries with its attempt counted and succeeds on the third attempt."""
    h = sample_jobs.flaky.enqueue(2)
    assert jobs.drain() == {"retrying": 2, "succeeded": 1}
    assert runs(jobs_db, h.id, "start") == [1, 2, 3]
    assert runs(jobs_db, h.id) == [3]
    # Each retry waits (scheduled), then its promotion makes it available again: a new version
    # that keeps the event's name.
    assert names_of(jobs_db, h.id) == [
        "enqueued/available", "started/running",
        "retrying/scheduled", "retrying/available", "started/running",
        "retrying/scheduled", "retrying/available", "started/running",
        "succeeded/succeeded",
    ]
    evs = events_of(jobs_db, h.id)
    assert [e["job"]["attempt"] for e in evs] == [0, 1, 1, 1, 2, 2, 2, 3, 3]
    assert evs[2]["job"]["error"] == evs[3]["job"]["error"] == "RuntimeError: boom on attempt 1"
    assert evs[-1]["job"]["error"] is None


def test_exhausted_attempts_fail_and_keep_the_last_error(jobs_db: str) -> None:
    """After max_attempts the job is failed, keeping the last error."""
    h = sample_jobs.flaky.enqueue(5)
    assert jobs.drain() == {"retrying": 2, "failed": 1}
    state = jobs.job_state(h.id)
    assert state is not None
    assert (state["state"], state["attempt"], state["error"]) == ("failed", 3, "RuntimeError: boom on attempt 3")
    assert events_of(jobs_db, h.id)[-1]["event"] == "failed"


def test_default_backoff_is_exponential_with_jitter(jobs_db: str) -> None:
    """Retry n waits about 2^n seconds (±25 %), capped at an hour. Each delay is read as the
    retry recorded it (run_at less the time of the transaction that wrote it), exactly."""

    def last_delay() -> float:
        return float(q(jobs_db, """SELECT extract(epoch FROM run_at - at) FROM test_job_versions
                                   WHERE id = %s AND event = 'retrying' ORDER BY version DESC LIMIT 1""",
                       (h.id,))[0][0])

    h = sample_jobs.with_default_backoff.enqueue()
    assert jobs.drain() == {"retrying": 1}
    assert 1.5 <= last_delay() <= 2.5
    q(jobs_db, "UPDATE livepush_jobs SET run_at = now() WHERE id = %s", (h.id,))
    assert jobs.drain() == {"retrying": 1}
    assert 3.0 <= last_delay() <= 5.0
    samples = [jobs.default_backoff(30) for _ in range(50)]
    assert max(samples) <= 3600 and min(samples) >= 2700
    assert len({round(jobs.default_backoff(5), 6) for _ in range(20)}) > 1


def test_never_retry_fails_at_once(jobs_db: str) -> None:
    """An exception listed in never_retry fails the job on its first attempt."""
    h = sample_jobs.never.enqueue()
    assert jobs.drain() == {"failed": 1}
    state = jobs.job_state(h.id)
    assert state is not None and (state["state"], state["attempt"], state["error"]) == ("failed", 1, "ValueError: bad input")


def test_never_retry_fails_at_once_when_an_asyncio_task_group_raised_it(jobs_db: str) -> None:
    """The same when the exception comes wrapped in the exception group of an asyncio.TaskGroup
    (one of its tasks raised it): a retry would run the same tasks and meet it again. The job's
    error names it, not the group."""
    h = sample_jobs.never_in_group.enqueue()
    assert jobs.drain() == {"failed": 1}
    state = jobs.job_state(h.id)
    assert state is not None and (state["state"], state["attempt"], state["error"]) == ("failed", 1, "ValueError: bad input")


def test_retry_failed_and_discard_failed(jobs_db: str) -> None:
    """retry_failed runs a failed job again with fresh attempts; discard_failed deletes it; both refuse other states."""
    h = sample_jobs.never.enqueue()
    ok = sample_jobs.record.enqueue()
    jobs.drain()
    assert jobs.retry_failed(ok.id) is False
    assert jobs.retry_failed(h.id) is True
    assert jobs.job_state(h.id)["state"] == "available"  # type: ignore[index]
    assert jobs.drain() == {"failed": 1}
    assert runs(jobs_db, h.id, "start") == [1, 1]
    # retry_failed is one new version: enqueued again, with no attempt spent.
    assert names_of(jobs_db, h.id) == ["enqueued/available", "started/running", "failed/failed",
                                       "enqueued/available", "started/running", "failed/failed"]
    assert events_of(jobs_db, h.id)[3]["job"]["attempt"] == 0
    assert jobs.discard_failed(ok.id) is False
    assert jobs.discard_failed(h.id) is True
    assert jobs.job_state(h.id) is None
    assert q(jobs_db, "SELECT count(*) FROM livepush_job_payloads WHERE id = %s", (h.id,))[0][0] == 0
    # Its state topic goes with its row (a page gets no state for it); the other job's stays.
    assert set(read_states(jobs_db, [h.topic, ok.topic])) == {ok.topic}


def test_list_failed_names_the_failed_jobs_newest_first_of_a_queue_or_a_function(jobs_db: str) -> None:
    """What retry_failed() and discard_failed() take is found through the API: the failed jobs,
    newest first, each with its error and arguments, of one queue or one function when asked; a
    job that did not fail is never listed, and one retried or discarded leaves the list."""
    first = sample_jobs.never.enqueue()
    sample_jobs.record.enqueue("fine")
    wrapped = sample_jobs.never_in_group.enqueue()
    (elsewhere,) = jobs.enqueue_many([sample_jobs.never.request(queue="second")])
    assert jobs.drain() == {"failed": 3, "succeeded": 1}
    listed = jobs.list_failed()
    assert [j.id for j in listed] == [elsewhere.id, wrapped.id, first.id]
    assert {(j.state, j.error) for j in listed} == {("failed", "ValueError: bad input")}
    assert [j.queue for j in listed] == ["second", "default", "default"]
    assert [j.id for j in jobs.list_failed("default")] == [wrapped.id, first.id]
    assert [j.id for j in jobs.list_failed(name="t.never")] == [elsewhere.id, first.id]
    assert [j.id for j in jobs.list_failed("default", name="t.never", limit=1)] == [first.id]
    assert jobs.list_failed("no-such-queue") == []
    assert jobs.retry_failed(first.id) and jobs.discard_failed(wrapped.id)
    assert [j.id for j in jobs.list_failed()] == [elsewhere.id]


async def test_list_failed_pages_past_one_call_with_before(jobs_db: str) -> None:
    """More failed jobs than one call lists (at most 1,000) are read page by page, as list_tagged's
    are: before= the last listed id lists the older ones, sync and async alike, with the queue and
    name filters; a cursor that is no int is refused."""
    handles = jobs.enqueue_many([sample_jobs.never.request() for _ in range(5)])
    assert jobs.drain() == {"failed": 5}
    ids = [h.id for h in reversed(handles)]
    first = jobs.list_failed(limit=2)
    assert [j.id for j in first] == ids[:2]
    assert [j.id for j in jobs.list_failed("default", name="t.never", limit=2, before=first[-1].id)] == ids[2:4]
    assert [j.id for j in await jobs.alist_failed(limit=2, before=ids[3])] == ids[4:]
    assert jobs.list_failed(before=ids[-1]) == []
    assert [j.id for j in jobs.list_failed(before=2**70)] == ids  # past every id: from the newest
    with pytest.raises(TypeError, match=r"before"):
        jobs.list_failed(before="7")  # type: ignore[arg-type]


@pytest.mark.parametrize("call,error,named", [
    (lambda: jobs.list_failed(limit=0), ValueError, "limit="),
    (lambda: jobs.list_failed(limit="10"), TypeError, "limit="),
    (lambda: jobs.list_failed(7), ConfigError, "list_failed(queue=)"),
    (lambda: jobs.list_failed(name=sample_jobs.never), ConfigError, "list_failed(name=)"),
])
def test_list_failed_refuses_what_no_job_could_match_naming_the_argument(jobs_db: str, call: Callable[[], Any],
                                                                         error: type[Exception], named: str) -> None:
    """A queue or name of the wrong type would match nothing and read as "no failed job": refused."""
    with pytest.raises(error, match=re.escape(named)):
        call()


def test_retry_failed_and_discard_failed_of_a_group_member_that_did_not_fail_answer_false(jobs_db: str) -> None:
    """retry_failed and discard_failed answer False for a job that is not failed, a task group's
    member too: only a failed member is refused (GroupClosedError: its group counted its
    failure). A succeeded or queued member raised that error, saying its group had counted a
    failure it never had; the member is left as it was."""
    with jobs.group() as g:
        g.enqueue(sample_jobs.record, "done")
    assert jobs.drain() == {"succeeded": 1}
    with jobs.group() as queued:
        queued.enqueue(sample_jobs.record, "queued")
    for member, state in ((g.members[0], "succeeded"), (queued.members[0], "available")):
        assert jobs.retry_failed(member.id) is False
        assert jobs.discard_failed(member.id) is False
        assert jobs.job_state(member.id)["state"] == state  # type: ignore[index]


def test_cancel_queued_and_scheduled(jobs_db: str) -> None:
    """cancel() of a queued or scheduled job cancels it at once; it never runs; a finished job is left alone."""
    a = sample_jobs.record.enqueue()
    b = sample_jobs.record.enqueue(wait=60)
    assert jobs.cancel(a.id) is True and jobs.cancel(b.id) is True
    assert jobs.drain() == {}
    assert jobs.job_state(a.id)["state"] == jobs.job_state(b.id)["state"] == "cancelled"  # type: ignore[index]
    assert names_of(jobs_db, a.id) == ["enqueued/available", "cancelled/cancelled"]
    assert names_of(jobs_db, b.id) == ["enqueued/scheduled", "cancelled/cancelled"]
    c = sample_jobs.record.enqueue()
    jobs.drain()
    assert jobs.cancel(c.id) is False
    assert jobs.job_state(c.id)["state"] == "succeeded"  # type: ignore[index]


def test_progress_events_before_the_final_one(jobs_db: str) -> None:
    """A job reporting progress gets at least one progress version, committed before its final
    one, and the final version carries the last progress; a burst is coalesced."""
    h = sample_jobs.progress.enqueue(500)
    assert jobs.drain() == {"succeeded": 1}
    evs = events_of(jobs_db, h.id)
    names = [e["event"] for e in evs]
    assert names[:2] == ["enqueued", "started"] and names[-1] == "succeeded"
    assert 1 <= names.count("progress") <= 5
    assert names.index("progress") < names.index("succeeded")
    assert evs[-1]["job"]["progress"] == {"done": 500, "total": 500, "message": "step 500"}


def test_an_async_jobs_progress_reported_without_await_is_kept(jobs_db: str) -> None:
    """`ctx.progress(...)` in an async job without its `await` (an easy slip) made a coroutine that
    never ran: the progress was dropped, with only a RuntimeWarning at garbage collection. It is
    recorded at the call; the await is the cancellation point, as before."""
    h = sample_jobs.progress_not_awaited.enqueue()
    assert jobs.drain() == {"succeeded": 1}
    assert events_of(jobs_db, h.id)[-1]["job"]["progress"] == {"done": 3, "total": 10, "message": "forgot the await"}


@pytest.mark.parametrize("report_on_retry", [False, True])
def test_a_new_attempt_never_shows_the_progress_of_the_one_before(jobs_db: str, report_on_retry: bool) -> None:
    """The failed attempt's `retrying` shows the progress it reached; the next attempt starts with
    none and shows only what it reports itself, up to its final state."""
    h = sample_jobs.progress_then_fail.enqueue(report_on_retry)
    assert jobs.drain() == {"retrying": 1, "succeeded": 1}
    evs = events_of(jobs_db, h.id)
    none = {"done": 0, "total": None, "message": None}
    almost = {"done": 9, "total": 10, "message": "almost there"}
    again = {"done": 1, "total": 10, "message": "again"}
    retrying = [e for e in evs if e["event"] == "retrying"]
    assert retrying and all(e["job"]["progress"] == almost for e in retrying), retrying
    second = [e for e in evs if e["job"]["attempt"] == 2]
    assert [e["event"] for e in second][0] == "started" and second[-1]["event"] == "succeeded"
    assert second[0]["job"]["progress"] == none, "a new attempt starts with no progress"
    assert second[-1]["job"]["progress"] == (again if report_on_retry else none), second[-1]
    assert all(e["job"]["progress"] != almost for e in second), second


def test_a_failed_job_run_again_starts_without_the_old_runs_progress(jobs_db: str) -> None:
    """retry_failed() runs a job again from attempt 1: the new run shows no progress until it
    reports some, though the failed run reported its own at attempt 1 too."""
    h = sample_jobs.progress_unless_flag.enqueue("second run")
    assert jobs.drain() == {"failed": 1}
    assert events_of(jobs_db, h.id)[-1]["job"]["progress"] == {"done": 9, "total": 10, "message": "almost there"}
    seen = len(events_of(jobs_db, h.id))
    q(jobs_db, "INSERT INTO job_flags VALUES ('second run')")
    assert jobs.retry_failed(h.id)
    assert jobs.drain() == {"succeeded": 1}
    again = events_of(jobs_db, h.id)[seen:]
    assert [e["event"] for e in again] == ["enqueued", "started", "succeeded"], again
    assert all(e["job"]["progress"] == {"done": 0, "total": None, "message": None} for e in again), again


def test_clear_refuses_outside_tests(jobs_db: str) -> None:
    """clear() empties the job tables with LIVEPUSH_ENV=test and refuses otherwise."""
    sample_jobs.record.enqueue()
    jobs.clear()
    assert q(jobs_db, "SELECT count(*) FROM livepush_jobs")[0][0] == 0
    config.set_settings(config.Settings(database_url=jobs_db, fanout="postgres"))
    with pytest.raises(ConfigError, match="LIVEPUSH_ENV=test"):
        jobs.clear()


async def test_aclear_empties_the_job_tables_from_async_tests_and_refuses_outside_them(jobs_db: str) -> None:
    """aclear() is clear() for async tests, on their loop's pool: same tables, same refusal."""
    await sample_jobs.record.aenqueue()
    await jobs.aclear()
    assert q(jobs_db, "SELECT count(*) FROM livepush_jobs")[0][0] == 0
    config.set_settings(config.Settings(database_url=jobs_db, fanout="postgres"))
    with pytest.raises(ConfigError, match=r"jobs\.aclear\(\).*LIVEPUSH_ENV=test"):
        await jobs.aclear()


def test_a_job_that_fails_under_drain_logs_its_own_traceback_only(jobs_db: str,
                                                                   caplog: pytest.LogCaptureFixture) -> None:
    """drain() from sync code runs jobs "through the normal code paths": the traceback a failed job
    logs is the job's, not chained to drain()'s own check for a running event loop (which read
    "RuntimeError: no running event loop" above every error a test's job raised)."""
    import traceback

    h = sample_jobs.flaky.enqueue(99)
    with caplog.at_level("WARNING", logger="livepush.jobs"):
        assert jobs.drain() == {"retrying": 2, "failed": 1}
    failed = [r for r in caplog.records if r.exc_info and f"job {h.id} " in r.getMessage()]
    assert failed, [r.getMessage() for r in caplog.records]
    for record in failed:
        text = "".join(traceback.format_exception(*record.exc_info))  # type: ignore[misc]
        assert "boom on attempt" in text
        assert "no running event loop" not in text, text


async def test_drain_of_one_queue_given_as_a_str_is_refused_not_a_drain_of_its_letters(jobs_db: str) -> None:
    """drain("second") raises TypeError saying to wrap the queue in a list, and runs nothing, rather than
    draining the queues "s", "e", "c", ... and reporting that nothing was due; the list drains it."""
    h = sample_jobs.other_queue.enqueue("c")
    with pytest.raises(TypeError, match=r"wrap a single queue in a list: \['second'\]"):
        jobs.drain("second")
    with pytest.raises(TypeError, match=r"wrap a single queue in a list"):
        await jobs.adrain("second")
    assert jobs.job_state(h.id)["state"] == "available"  # type: ignore[index]
    assert jobs.drain(["second"]) == {"succeeded": 1}


@pytest.mark.parametrize("bound,error", [("1", TypeError), (1.5, TypeError), (True, TypeError), (-1, ValueError)])
async def test_drain_refuses_a_max_jobs_that_is_not_a_whole_number_from_zero_and_runs_nothing(
        jobs_db: str, bound: object, error: type[Exception]) -> None:
    """drain(max_jobs=) takes None or a whole number from 0 up: anything else raises naming
    max_jobs= before any job runs (a str used to fail inside the drain's loop with Python's own
    comparison error, a negative or fractional bound was taken as given). What is no whole number
    is a TypeError; a negative one a ValueError, as every other count out of range is (reference
    §4: `limit=0`, `shards=0`)."""
    h = sample_jobs.other_queue.enqueue("c")
    with pytest.raises(error, match=r"drain\(max_jobs=\) takes a whole number from 0 up"):
        jobs.drain(["second"], max_jobs=bound)  # type: ignore[arg-type]
    with pytest.raises(error, match=r"drain\(max_jobs=\)"):
        await jobs.adrain(["second"], max_jobs=bound)  # type: ignore[arg-type]
    assert jobs.job_state(h.id)["state"] == "available"  # type: ignore[index]
    assert jobs.drain(["second"], max_jobs=0) == {}
    assert jobs.drain(["second"], max_jobs=1) == {"succeeded": 1}


def test_drain_names_itself_for_a_bad_queue_name(jobs_db: str) -> None:
    """A queue name drain() cannot serve raises ConfigError naming drain(queues=)."""
    with pytest.raises(ConfigError, match=r"drain\(queues=\)"):
        jobs.drain([""])


async def test_drain_of_an_empty_list_of_queues_is_refused_and_runs_nothing(jobs_db: str) -> None:
    """queues=[] names no queue, as a `--queues` naming none: a ValueError saying to pass None for
    every queue, not a drain of every queue."""
    h = sample_jobs.other_queue.enqueue("c")
    with pytest.raises(ValueError, match=r"drain\(queues=\[\]\) names no queue: .* pass None"):
        jobs.drain([])
    with pytest.raises(ValueError, match=r"drain\(queues=\[\]\) names no queue"):
        await jobs.adrain(())
    assert jobs.job_state(h.id)["state"] == "available"  # type: ignore[index]


def drain_in_thread(**options: Any) -> tuple[threading.Thread, dict[str, Any]]:
    """drain(**options) in a thread of its own, so that a test can bound how long it takes."""
    result: dict[str, Any] = {}

    def target() -> None:
        try:
            result["counts"] = jobs.drain(**options)
        except BaseException as exc:  # handed to the test
            result["error"] = exc

    thread = threading.Thread(target=target, name="test-drain", daemon=True)
    thread.start()
    return thread, result


def test_drain_fails_a_job_deaf_to_its_timeouts_cancel_and_returns(jobs_db: str) -> None:
    """An async job that swallows every cancellation and runs on past its timeout fails its
    attempt under drain() as under a runtime, within the grace after the timeout's cancel
    (runtime.TIMEOUT_GRACE); drain() runs the next job and returns, leaving the deaf task
    behind. It waited for that task to end, for ever."""
    deaf = sample_jobs.deaf_to_timeout.enqueue("deaf-drained")
    after = sample_jobs.record.enqueue("after")
    thread, result = drain_in_thread()
    try:
        thread.join(0.2 + runtime.TIMEOUT_GRACE + 10.0)
        assert not thread.is_alive(), "drain() did not return"
    finally:
        q(jobs_db, "INSERT INTO job_flags (name) VALUES ('deaf-drained')")  # lets a hung drain end
        thread.join(10.0)
    assert result == {"counts": {"failed": 1, "succeeded": 1}}
    info = jobs.get_job(deaf.id)
    assert info is not None and (info.state, info.error) == ("failed", "TimeoutError: timed out after 0.2 s")
    assert runs(jobs_db, deaf.id) == [] and runs(jobs_db, after.id) == [1]


def started(url: str, job_id: int) -> bool:
    return bool(runs(url, job_id, "start"))


@pytest.mark.parametrize("job", ["wait_flag", "deaf_to_cancel_until_flag"])
def test_a_job_cancelled_while_drain_runs_it_ends_cancelled_and_drain_returns(jobs_db: str, job: str) -> None:
    """jobs.cancel() of a job drain() is running reaches it as it reaches one a runtime runs: it
    ends `cancelled`, one that swallows the cancel too (within runtime.TIMEOUT_GRACE), and drain()
    returns. drain() heard no cancel: the job ran on until its flag was set."""
    handle = getattr(sample_jobs, job).enqueue("cancel-drained")
    thread, result = drain_in_thread()
    try:
        wait_for(lambda: started(jobs_db, handle.id), 10.0, message="the job to start")
        assert jobs.cancel(handle.id)
        thread.join(runtime.TIMEOUT_GRACE + 10.0)
        assert not thread.is_alive(), "drain() did not return"
    finally:
        q(jobs_db, "INSERT INTO job_flags (name) VALUES ('cancel-drained')")  # lets a hung drain end
        thread.join(10.0)
    assert result == {"counts": {"cancelled": 1}}
    info = jobs.get_job(handle.id)
    assert info is not None and (info.state, info.attempt) == ("cancelled", 1)
    assert runs(jobs_db, handle.id) == []


def test_a_process_that_drained_a_sync_job_past_its_timeout_exits_without_waiting_for_its_thread(
        jobs_db: str, livepush_env: Callable[..., dict[str, str]]) -> None:
    """drain() fails a sync job past its timeout and returns while the job's thread runs on; the
    process then waited for that thread at exit (here up to a minute; for ever, for a call that
    never returns), a test session that drained it hanging after its last test. It exits now."""
    code = ("from livepush import jobs; from tests.jobs import sample_jobs; sample_jobs.stuck_sync.enqueue(); "
            "print(jobs.drain(), flush=True)")
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-c", code], env=livepush_env(database_url=jobs_db, env="test"),
                          capture_output=True, text=True, timeout=30)
    assert done.stdout.strip() == "{'failed': 1}", done.stderr[-2000:]
    assert time.monotonic() - started < 20  # stuck_sync's thread waits 60 s


def test_a_drain_longer_than_three_beats_keeps_its_job_from_the_rescue_of_other_runtimes(
        jobs_db: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """drain() registers as a runtime, so that no other runtime rescues what it holds; but it never
    beat, and a drain longer than three of its beats (three minutes: a long job, or a start rate
    that spreads its jobs out) was taken for dead by any runtime serving the same database, which
    released its job to run again, its attempt spent. Here a beat is 0.2 s."""
    monkeypatch.setattr(testing, "DRAIN_HEARTBEAT", 0.2)
    handle = sample_jobs.wait_flag.enqueue("long-drain")
    thread, result = drain_in_thread()
    try:
        wait_for(lambda: started(jobs_db, handle.id), 10.0, message="the job to start")
        (drainer,) = q(jobs_db, "SELECT id FROM livepush_job_runtimes")[0]

        async def beside_another_runtime() -> None:
            # It rescues the jobs of runtimes silent for three of their beats, each of its own beats.
            async with running(queues=["nothing"], heartbeat=0.1) as other:
                (since,) = q(jobs_db, "SELECT now()")[0]
                await async_wait_for(lambda: q(jobs_db, "SELECT heartbeat_at > %s + interval '1 s' FROM "
                                                        "livepush_job_runtimes WHERE id = %s", (since, other.id))[0][0],
                                     10.0, message="the other runtime to beat for a second, 5 of drain()'s beats")

        asyncio.run(beside_another_runtime())
        assert q(jobs_db, "SELECT state, runtime_id FROM livepush_jobs WHERE id = %s", (handle.id,)) == [
            ("running", drainer)]
    finally:
        q(jobs_db, "INSERT INTO job_flags (name) VALUES ('long-drain')")
        thread.join(10.0)
    assert result == {"counts": {"succeeded": 1}}
    assert runs(jobs_db, handle.id, "start") == [1]
    assert names_of(jobs_db, handle.id) == ["enqueued/available", "started/running", "succeeded/succeeded"]


def test_a_cancel_whose_notification_drain_missed_is_found_at_its_next_beat(
        jobs_db: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A runtime finds a cancel whose notification it never heard (a pooler in transaction mode
    delivers none) at its next heartbeat; drain() relied on the notification alone, and ran the
    cancelled job to its end. The cancel is written here as the row holds it, with no ring."""
    monkeypatch.setattr(testing, "DRAIN_HEARTBEAT", 0.2)
    handle = sample_jobs.wait_flag.enqueue("unheard-cancel")
    thread, result = drain_in_thread()
    try:
        wait_for(lambda: started(jobs_db, handle.id), 10.0, message="the job to start")
        q(jobs_db, "UPDATE livepush_jobs SET cancel_requested = true WHERE id = %s", (handle.id,))
        thread.join(10.0)
        assert not thread.is_alive(), "drain() did not hear the cancel"
    finally:
        q(jobs_db, "INSERT INTO job_flags (name) VALUES ('unheard-cancel')")  # lets a deaf drain end
        thread.join(10.0)
    assert result == {"counts": {"cancelled": 1}}
    assert runs(jobs_db, handle.id) == []


SEEN_RUNTIME_QUEUES: list[list[str]] = []


@jobs.job(name="tests.drain.reads_runtime_queues", queue="second")
def reads_runtime_queues(ctx: Any) -> None:
    """Notes the queues the runtime rows say are served, as `livepush status` shows them."""
    with psycopg.connect(database.database_url()) as conn:
        SEEN_RUNTIME_QUEUES.extend(r[0] for r in conn.execute("SELECT queues FROM livepush_job_runtimes"))


def test_a_drain_of_every_queue_registers_the_queues_it_drains(jobs_db: str) -> None:
    """drain() without queues= drains every queue with due jobs; its runtime row (what `livepush
    status` lists, and what a script's enqueue counts as serving a queue) names those queues, not
    `default` alone while it runs another queue's jobs."""
    SEEN_RUNTIME_QUEUES.clear()
    reads_runtime_queues.enqueue()
    assert jobs.drain() == {"succeeded": 1}
    assert SEEN_RUNTIME_QUEUES == [["second"]]
