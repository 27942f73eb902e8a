"""The runtime in this process: wake-up, scheduling, cancel, timeouts, unknown names, queues, slots, fencing."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

import psycopg
import psycopg.sql
import pytest

from livepush import config, jobs
from livepush.jobs import database, queries
from livepush.jobs.api.functions import JobFunction
from livepush.jobs.api.registry import REGISTRY, Registry
from livepush.jobs.runtime.context import ClaimedJob, JobContext
from livepush.jobs.runtime.executor import Outcome
from livepush.jobs.runtime import runtime
from livepush.jobs.runtime.runtime import Runtime
from livepush.postgres.listener import Listener
from tests.jobs import sample_jobs
from tests.jobs.conftest import events_of, names_of, q, running
from tests.support import services
from tests.support.fanouts import read_history
from tests.support.loop_threads import Caller, LoopThread, Stuck
from tests.support.waiting import async_wait_for


async def state_of(job_id: int) -> str | None:
    s = await asyncio.to_thread(jobs.job_state, job_id)
    return None if s is None else s["state"]


async def wait_state(job_id: int, want: str, timeout: float = 5.0) -> None:
    async def check() -> bool:
        return await state_of(job_id) == want

    await async_wait_for(check, timeout, message=f"job {job_id} to become {want}")


async def assert_counts(rt: Any, expected: dict[str, int]) -> None:
    """The runtime's outcome counts are `expected`. Another connection sees a job's state at its
    outcome's commit, a moment before the completer counts it: the check waits for as many
    outcomes as expected to be counted, then compares."""
    await async_wait_for(lambda: sum(rt.counts.values()) >= sum(expected.values()), 5,
                         message=f"the runtime to count {expected}")
    assert rt.counts == expected


async def test_idle_runtime_wakes_on_notify(jobs_db: str) -> None:
    """An idle runtime starts a new job at once (LISTEN/NOTIFY), not at its next poll."""
    async with running(poll_interval=30.0):
        # Idle: the producer claimed the first job and found nothing more, so it now waits for
        # the doorbell (or its 30 s poll). The bound below is a tenth of that poll: room for a
        # loaded machine's enqueue, claim, run and write, far short of what a poll would take.
        first = await sample_jobs.record.aenqueue("first")
        await wait_state(first.id, "succeeded", timeout=10.0)
        t0 = time.monotonic()
        h = await sample_jobs.record.aenqueue("fast")
        await wait_state(h.id, "succeeded", timeout=10.0)
        assert time.monotonic() - t0 < 3.0


async def test_scheduled_job_runs_when_due(jobs_db: str) -> None:
    """A job enqueued with wait= runs once due, not before."""
    async with running(poll_interval=0.2):
        t0 = time.monotonic()
        h = await sample_jobs.record.aenqueue(wait=0.6)
        await wait_state(h.id, "succeeded", timeout=5.0)
        assert time.monotonic() - t0 >= 0.6


async def test_cancel_running_async_job(jobs_db: str) -> None:
    """cancel() of a running async job stops it at its next await; it ends cancelled."""
    async with running():
        h = await sample_jobs.wait_flag.aenqueue("never-set")
        await wait_state(h.id, "running")
        assert await asyncio.to_thread(jobs.cancel, h.id)
        await wait_state(h.id, "cancelled", timeout=3.0)
    assert events_of(jobs_db, h.id)[-1]["event"] == "cancelled"
    assert q(jobs_db, "SELECT count(*) FROM job_runs WHERE job_id = %s AND phase = 'done'", (h.id,))[0][0] == 0


async def test_cancel_running_sync_job_at_progress(jobs_db: str) -> None:
    """A running sync job learns of its cancel at its next ctx.progress() call."""
    async with running():
        h = await sample_jobs.hold_sync.aenqueue(30)
        await wait_state(h.id, "running")
        assert await asyncio.to_thread(jobs.cancel, h.id)
        await wait_state(h.id, "cancelled", timeout=3.0)


async def test_a_sync_job_that_sees_ctx_cancelled_and_returns_ends_cancelled(jobs_db: str) -> None:
    """A sync job that checks ctx.cancelled and stops early, as cooperative code does, was told of
    its cancel as one that meets JobCancelled at ctx.progress() is. It ended `succeeded`, its early
    return stored as its result, so its page, its group and get_job() showed a cancelled job as
    one that had done its work."""
    async with running():
        h = await sample_jobs.sync_polls_cancelled.aenqueue()
        await wait_state(h.id, "running")
        assert await asyncio.to_thread(jobs.cancel, h.id)
        await wait_state(h.id, "cancelled", timeout=3.0)
    info = jobs.get_job(h.id)
    assert info is not None and (info.state, info.result) == ("cancelled", None)
    assert names_of(jobs_db, h.id) == ["enqueued/available", "started/running", "cancelled/cancelled"]


@pytest.mark.parametrize("job, task_groups", [(sample_jobs.gives_up, 0), (sample_jobs.gives_up, 1),
                                              (sample_jobs.gives_up, 2), (sample_jobs.gives_up_sync, 0)])
async def test_a_job_that_raises_jobcancelled_itself_ends_cancelled_at_once(
        jobs_db: str, job: JobFunction, task_groups: int, caplog: pytest.LogCaptureFixture) -> None:
    """A job that gives up on purpose (its work no longer wanted) raises JobCancelled itself, or
    in a task of an asyncio.TaskGroup, nested or not (which wraps it in an exception group: the
    attempt failed, and was retried): it ends `cancelled` as a cancelled job does, not retried,
    its error `cancelled` on get_job() and its state topic, its progress kept. Its reason is not
    its error: the runtime logs it."""
    caplog.set_level(logging.INFO, logger="livepush.jobs")
    h = await job.aenqueue("the import was deleted", task_groups)
    assert await jobs.adrain() == {"cancelled": 1}
    info = await jobs.aget_job(h.id)
    assert info is not None
    assert (info.state, info.attempt, info.error, info.result) == ("cancelled", 1, "cancelled", None)
    assert names_of(jobs_db, h.id)[-1] == "cancelled/cancelled"
    last = events_of(jobs_db, h.id)[-1]["job"]
    assert (last["state"], last["error"]) == ("cancelled", "cancelled")
    assert last["progress"] == {"done": 1, "total": 2, "message": "looked"}
    said = [r.getMessage() for r in caplog.records if r.name == "livepush.jobs" and f"job {h.id} " in r.getMessage()]
    assert any("raised JobCancelled" in m and "the import was deleted" in m for m in said), said


async def test_async_timeout_fails_the_attempt(jobs_db: str) -> None:
    """An async job past its timeout is cancelled and the attempt fails."""
    async with running():
        h = await sample_jobs.too_slow.aenqueue()
        await wait_state(h.id, "failed", timeout=3.0)
    state = jobs.job_state(h.id)
    assert state is not None and state["error"] == "TimeoutError: timed out after 0.2 s"


async def test_an_async_job_that_blocks_the_loop_past_its_timeout_fails_by_it(jobs_db: str) -> None:
    """An async job whose blocking call (time.sleep) holds the loop past its timeout cannot be
    cancelled meanwhile; once it returns, its attempt fails by its timeout and its result is
    dropped, as for an async job that swallows its timeout's cancel and returns."""
    async with running():
        h = await sample_jobs.blocks_the_loop.aenqueue(0.5)
        await wait_state(h.id, "failed", timeout=5.0)
    info = await asyncio.to_thread(jobs.get_job, h.id)
    assert info is not None and info.error == "TimeoutError: timed out after 0.2 s" and info.result is None


async def test_sync_timeout_fails_and_late_outcome_is_fenced(jobs_db: str) -> None:
    """A sync job past its timeout fails its attempt; when its thread ends later, nothing changes."""
    async with running() as rt:
        h = await sample_jobs.too_slow_sync.aenqueue(0.8)
        await wait_state(h.id, "failed", timeout=3.0)

        async def thread_done() -> bool:
            rows = await asyncio.to_thread(q, jobs_db, "SELECT count(*) FROM job_runs WHERE job_id = %s AND phase = 'done'", (h.id,))
            return rows[0][0] == 1

        await async_wait_for(thread_done, 5.0)
        assert rt._completer is not None
        await rt._completer.wait_idle(5)  # whatever was handed to the completer is written
    assert await state_of(h.id) == "failed"
    assert names_of(jobs_db, h.id) == ["enqueued/available", "started/running", "failed/failed"]


async def test_unknown_name_is_given_back_and_skipped(jobs_db: str) -> None:
    """A job name this runtime does not know is released (attempt not spent) and not claimed again."""

    async def newer(ctx: Any) -> None:
        pass

    unknown = JobFunction(newer, name="t.from_the_future")  # not registered here
    h = unknown.enqueue()
    async with running(poll_interval=0.05) as rt:
        await async_wait_for(lambda: "t.from_the_future" in rt.excluded, 3.0)
        # Three claims after it was given back, each with the unknown job first in claim order
        # (same queue, older): each takes the new job and skips the unknown one.
        for i in range(3):
            ok = await sample_jobs.record.aenqueue(i)
            await wait_state(ok.id, "succeeded")
    state = jobs.job_state(h.id)
    assert state is not None and (state["state"], state["attempt"]) == ("available", 0)
    # Claimed once (started), given back as it was (enqueued, attempt 0), and never again.
    assert names_of(jobs_db, h.id) == ["enqueued/available", "started/running", "enqueued/available"]
    assert events_of(jobs_db, h.id)[-1]["job"]["attempt"] == 0


async def test_a_name_given_back_as_unknown_is_claimed_once_its_function_is_defined(jobs_db: str) -> None:
    """A runtime that claimed a job before the module defining its function was imported gave it
    back and skipped its name for as long as it ran, even once that module was imported in its
    process: the job waited for another runtime or a restart. It now claims the name again once
    the function is defined, and the job runs with its attempt unspent."""
    name, queue = "t.defined_after_its_job_was_given_back", "late-unknown"
    ran: list[int] = []

    async def defined_later(ctx: Any, n: int) -> None:
        ran.append(n)

    h = await JobFunction(defined_later, name=name, queue=queue).aenqueue(7)  # not registered yet
    async with running(queues=[queue], poll_interval=0.05) as rt:
        await async_wait_for(lambda: name in rt.excluded, 5.0, message="the unknown name to be given back")
        await wait_state(h.id, "available")
        jobs.job(name=name, queue=queue)(defined_later)  # its module imported now, in this process
        await wait_state(h.id, "succeeded", timeout=10.0)
        assert name not in rt.excluded
    assert ran == [7]
    info = await asyncio.to_thread(jobs.get_job, h.id)
    assert info is not None and info.attempt == 1
    assert names_of(jobs_db, h.id) == ["enqueued/available", "started/running", "enqueued/available",
                                       "started/running", "succeeded/succeeded"]


async def test_a_runtime_without_queues_serves_the_queue_of_a_job_defined_after_it_started(jobs_db: str) -> None:
    """A runtime made without `queues` serves every queue its jobs use, but read that list once, as
    it was made: a job defined later in its process (a module imported after the start) on a queue
    no earlier job used was never claimed, and its jobs waited for ever with no word. The queue is
    now served from the definition on, its jobs picked up at their enqueue's ring (the poll is far
    longer than the wait), and the runtime's row, which `livepush status` reads, lists it."""
    registry = Registry()
    ran: list[str] = []

    async def first(ctx: Any, key: str) -> None:
        ran.append(key)

    registry.add(JobFunction(first, name="t.late_queue.first", queue="late-queue-first"))
    async with running(registry=registry, queues=None, poll_interval=30.0) as rt:
        assert rt.queues == ["late-queue-first"]

        async def later(ctx: Any, key: str) -> None:
            ran.append(key)

        defined = registry.add(JobFunction(later, name="t.late_queue.later", queue="late-queue-later"))
        h = await defined.aenqueue("later")  # its module imported now, in this process
        await wait_state(h.id, "succeeded", timeout=10.0)
        assert rt.queues == ["late-queue-first", "late-queue-later"]
        # A queue the jobs also run on (add_queues(): enqueues that name it), added later, too.
        registry.add_queues(["late-queue-named"])
        named = await JobFunction(later, name=defined.name, queue="late-queue-named").aenqueue("named")
        await wait_state(named.id, "succeeded", timeout=10.0)
        served = ["late-queue-first", "late-queue-later", "late-queue-named"]
        assert rt.queues == served
        report = await jobs.astatus()
        (row,) = [r for r in report.runtimes if r.id == rt.id]
        assert row.queues == served
        assert {"late-queue-later", "late-queue-named"} <= {queue.queue for queue in report.queues}
    assert ran == ["later", "named"]


async def test_a_runtime_given_queues_keeps_them_when_a_job_is_defined_on_another(jobs_db: str) -> None:
    """A runtime given its `queues` serves exactly those: a job defined later on another queue is
    left to the runtimes that serve it, however many claims this one makes meanwhile."""
    registry = Registry()

    async def record(ctx: Any, key: str) -> None: ...

    served = registry.add(JobFunction(record, name="t.given_queues.served", queue="given-queue"))
    async with running(registry=registry, queues=["given-queue"], poll_interval=30.0) as rt:
        other = registry.add(JobFunction(record, name="t.given_queues.other", queue="given-queue-other"))
        left = await other.aenqueue("left")
        # Enqueued after the definition: the claim that runs it has seen the definition.
        await wait_state((await served.aenqueue("ran")).id, "succeeded", timeout=10.0)
        assert rt.queues == ["given-queue"]
        assert await state_of(left.id) == "available"
        report = await jobs.astatus()
        (row,) = [r for r in report.runtimes if r.id == rt.id]
        assert row.queues == ["given-queue"]


async def test_queues_in_order(jobs_db: str) -> None:
    """With --queues second,default a runtime takes every job of `second` before `default`."""
    for i in range(3):
        sample_jobs.record.enqueue(f"d{i}")
        sample_jobs.other_queue.enqueue(f"s{i}")
    async with running(queues=["second", "default"], concurrency=1):
        await async_wait_for(lambda: q(jobs_db, "SELECT count(*) FROM job_runs")[0][0] == 6, 5.0)
    keys = [r[0] for r in q(jobs_db, "SELECT key FROM job_runs ORDER BY at")]
    assert keys == ["s0", "s1", "s2", "d0", "d1", "d2"]


async def test_never_more_than_free_slots(jobs_db: str) -> None:
    """A runtime never has more jobs in hand than its concurrency (a slot frees when its
    function returns; the outcome is written a few ms later, in a batch)."""
    handles = jobs.enqueue_many([sample_jobs.hold.request(0.15) for _ in range(12)])
    async with running(concurrency=3) as rt:
        async def all_done() -> bool:
            rows = await asyncio.to_thread(q, jobs_db, "SELECT count(*) FROM livepush_jobs WHERE state = 'succeeded'")
            return rows[0][0] == 12

        await async_wait_for(all_done, 10.0)
        assert rt.peak_in_hand == 3
    assert all(jobs.job_state(h.id)["state"] == "succeeded" for h in handles)  # type: ignore[index]
    starts = q(jobs_db, "SELECT at FROM job_runs WHERE phase = 'start' ORDER BY at")
    dones = q(jobs_db, "SELECT at FROM job_runs WHERE phase = 'done' ORDER BY at")
    # At any start, fewer than three earlier-started jobs are still unfinished.
    for (t,) in starts:
        started = sum(1 for (s,) in starts if s < t)
        finished = sum(1 for (d,) in dones if d <= t)
        assert started - finished < 3


async def test_stale_outcome_is_fenced(jobs_db: str) -> None:
    """An outcome naming a lease the job no longer has changes nothing."""
    h = sample_jobs.record.enqueue()
    async with running(concurrency=1, queues=["nothing"]) as rt:
        assert rt._completer is not None
        q(jobs_db, "UPDATE livepush_jobs SET state = 'running', attempt = 1, lease = 999, runtime_id = %s WHERE id = %s",
          (rt.id, h.id))
        row = q(jobs_db, "SELECT run_at FROM livepush_jobs WHERE id = %s", (h.id,))[0]
        stale = ClaimedJob(id=h.id, name="t.record", queue="default", priority=0, attempt=1, max_attempts=5,
                           lease=998, args=[], run_at=row[0])
        rt._completer.submit(Outcome(JobContext(stale, rt._completer), "succeeded"))
        await rt._completer.wait_idle(5)
        assert rt._completer.stale == 1
        assert await state_of(h.id) == "running"
        q(jobs_db, "UPDATE livepush_jobs SET runtime_id = NULL WHERE id = %s", (h.id,))


async def test_runtime_publishes_its_state(jobs_db: str) -> None:
    """A runtime publishes running, draining and stopped on runtime:<id> through the fan-out it
    was given (Runtime(publisher=...))."""
    import json

    from livepush.fanout.postgres import PostgresFanOut

    fanout = PostgresFanOut(jobs_db)
    try:
        async with running(publisher=fanout) as rt:
            rid = rt.id
        epoch = (await fanout.alatest_offset(f"runtime:{rid}")).split("-")[0]
        messages = await read_history(fanout, f"runtime:{rid}", f"{epoch}-0")  # from its first message
        assert messages is not None
    finally:
        await fanout.aclose()
    seen = [json.loads(m.data_json)["event"] for m in messages if m.data_json is not None]
    assert len(seen) == len(messages)
    assert seen[0] == "running" and seen[-2:] == ["draining", "stopped"]
    first = json.loads(messages[0].data_json or "")["runtime"]
    assert set(first) >= {"id", "host", "pid", "queues", "concurrency", "in_hand", "state"} and first["id"] == rid


async def test_a_running_job_publishes_started_while_it_runs(jobs_db: str) -> None:
    """The claim itself writes the job's "started" version, at once and not when the job ends:
    the job is still running (attempt 1) when it is there."""
    async with running():
        # It runs for 30 s: a started version seen within 10 s (room for a loaded machine) was
        # written long before the job could have ended.
        h = await sample_jobs.hold.aenqueue(30.0)

        async def started() -> bool:
            return [e["event"] for e in await asyncio.to_thread(events_of, jobs_db, h.id)] == ["enqueued", "started"]

        await async_wait_for(started, 10.0, message="the started event")
        assert await state_of(h.id) == "running"
        event = (await asyncio.to_thread(events_of, jobs_db, h.id))[-1]
        assert event["job"]["state"] == "running" and event["job"]["attempt"] == 1


async def test_the_runtime_claims_again_after_its_connections_are_killed(jobs_db: str) -> None:
    """Every connection of a running runtime terminated by the server (a restart, a proxy
    dropping them): the next enqueued job still runs, on connections opened again."""
    async with running(poll_interval=0.2) as rt:
        first = await sample_jobs.record.aenqueue("before")
        await wait_state(first.id, "succeeded")
        # With a timeout, pg_terminate_backend() returns once each backend has exited, so
        # every connection is dead before the next call (else a pool may hand one out
        # between the signal and its backend's exit, and only the runtime is under test).
        killed = await asyncio.to_thread(
            q, jobs_db, "SELECT count(*) FILTER (WHERE pg_terminate_backend(pid, 5000)) FROM pg_stat_activity "
            "WHERE datname = current_database() AND pid <> pg_backend_pid() AND backend_type = 'client backend'")
        assert killed[0][0] >= 3  # listener, claims, pool
        h = await sample_jobs.record.aenqueue("after")  # this test's own pool lost its connection too
        await wait_state(h.id, "succeeded", timeout=10.0)
        assert rt.state == "running"


async def test_text_postgres_cannot_store_never_stops_the_runtime(jobs_db: str) -> None:
    """A NUL character or a lone surrogate in a job's error or progress message (Postgres
    text cannot hold either) is stored as U+FFFD; a `done` that is NaN, infinite or not a number raises
    InvalidProgressError in the job, which fails with that error. The runtime goes on: a
    job enqueued after them all still runs."""
    async with running() as rt:
        nul_error = await sample_jobs.nul_error.aenqueue()
        nul_message = await sample_jobs.odd_progress.aenqueue(3, "half\\0way")
        bad = [await sample_jobs.odd_progress.aenqueue(v) for v in ("3", None, "nan", "inf")]
        bad_sync = await sample_jobs.odd_progress_sync.aenqueue([1])
        last = await sample_jobs.record.aenqueue("after")
        await wait_state(last.id, "succeeded")
        await wait_state(nul_error.id, "failed")
        await wait_state(nul_message.id, "succeeded")
        s = await asyncio.to_thread(jobs.job_state, nul_error.id)
        assert s is not None and s["error"] == "ValueError: bad\ufffdbyte in caf\ufffd"
        s = await asyncio.to_thread(jobs.job_state, nul_message.id)
        assert s is not None and s["progress"] == {"done": 3, "total": 10, "message": "half\ufffdway"}
        for h in [*bad, bad_sync]:
            await wait_state(h.id, "failed")
            s = await asyncio.to_thread(jobs.job_state, h.id)
            assert s is not None and s["error"].startswith("InvalidProgressError: ctx.progress() takes a"), s
            assert "for done" in s["error"]
        assert rt.state == "running"


async def only_the_bad_input_fails_unstored() -> None:
    """Run 20 jobs and one that fails with "ValueError: bad input", whose outcome Postgres refuses:
    the 20 succeed, and that one fails with the fixed error of an outcome that could not be stored."""
    from livepush.jobs.runtime.completer import UNSTORABLE_OUTCOME

    handles = await jobs.aenqueue_many([sample_jobs.record.request(i) for i in range(20)]
                                       + [sample_jobs.never.request()])
    refused = handles[-1]
    await wait_state(refused.id, "failed")
    for h in handles[:-1]:
        await wait_state(h.id, "succeeded")
    s = await asyncio.to_thread(jobs.job_state, refused.id)
    assert s is not None and s["error"] == UNSTORABLE_OUTCOME


async def test_an_outcome_postgres_refuses_fails_alone(jobs_db: str) -> None:
    """If Postgres refuses one outcome of a batch for a reason no check foresaw (here a CHECK
    constraint this test adds against one job's error), the others of the batch are written
    as they are, the refused job fails with a fixed error, and the runtime goes on."""
    q(jobs_db, "ALTER TABLE livepush_job_payloads ADD CONSTRAINT test_refused "
               "CHECK (error IS NULL OR error NOT LIKE '%bad input%')")
    async with running(concurrency=10) as rt:
        await only_the_bad_input_fails_unstored()
        after = await sample_jobs.record.aenqueue("after")
        await wait_state(after.id, "succeeded")
        assert rt.state == "running"


async def test_an_outcome_over_a_postgres_limit_fails_alone_rather_than_hold_up_the_batch(jobs_db: str) -> None:
    """A limit of Postgres' (a result over jsonb's 256 MB: here a trigger raises that error,
    program_limit_exceeded, against one job's error) refuses that outcome on every try: it is a
    refusal like any other. The others of the batch are written, the refused job fails with a
    fixed error, and the runtime goes on. psycopg calls such an error an OperationalError, and it
    was retried for ever as connection trouble, every job of the batch left `running`."""
    q(jobs_db, """CREATE FUNCTION test_over_limit() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
            IF NEW.error LIKE '%bad input%' THEN
                RAISE EXCEPTION 'string too long to represent as jsonb string' USING ERRCODE = 'program_limit_exceeded';
            END IF;
            RETURN NEW;
        END $$""")
    q(jobs_db, "CREATE TRIGGER test_over_limit BEFORE INSERT OR UPDATE ON livepush_job_payloads "
               "FOR EACH ROW EXECUTE FUNCTION test_over_limit()")
    async with running(concurrency=10) as rt:
        await only_the_bad_input_fails_unstored()
        assert rt.state == "running"


async def test_a_result_past_one_message_to_postgres_fails_its_job_and_the_runtime_goes_on(
        jobs_db: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A result whose JSON passes what one message to Postgres carries (1 GiB) fails its job at
    once with InvalidResultError saying it is too large, and the runtime runs the next job.
    Postgres closed the connection on the batch holding it: the completer took that for an outage
    and retried the batch for ever, every outcome of the runtime held up behind it."""
    from livepush.jobs.api import args

    # The limit lowered to 10 MB: the same check, at the same place, as 1.1 GB meets, without the
    # seconds of encoding it (test_jobs_enqueue.py crosses the real limit).
    monkeypatch.setattr(args, "SENDABLE", 10_000_000)
    async with running() as rt:
        huge = await sample_jobs.returns_text.aenqueue(1_000_000, 11)
        await wait_state(huge.id, "failed")
        after = await sample_jobs.record.aenqueue("after")
        await wait_state(after.id, "succeeded")
        assert rt.state == "running"
    s = await asyncio.to_thread(jobs.job_state, huge.id)
    assert s is not None and s["attempt"] == 1, s
    assert (s["error"] or "").startswith("InvalidResultError: the job's result is too large for Postgres to store "
                                         "(past the 1 GiB one message to Postgres carries)"), s["error"]


async def test_results_that_pass_one_message_only_together_are_written_apart(
        jobs_db: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """Results each of which one message to Postgres carries, but not all of a batch together
    (the limit lowered here to 100,000 bytes), are written in smaller statements: every job
    succeeds with its result. A result that passes it only as the batch's JSON carries it (45,000
    quotes, each escaped twice there) fails its job only. The log says the batch was too large,
    as a warning: Postgres refused nothing."""
    from livepush.jobs.api import args

    monkeypatch.setattr(args, "SENDABLE", 100_000)
    caplog.set_level(logging.WARNING, logger="livepush.jobs")
    async with running(concurrency=10) as rt:
        handles = await jobs.aenqueue_many([(sample_jobs.returns_text, [30_000, 1, "results"])] * 5
                                           + [(sample_jobs.returns_text, [45_000, 1, "results", '"'])])
        await async_wait_for(lambda: asyncio.to_thread(lambda: q(jobs_db, "SELECT count(*) FROM livepush_jobs "
                                                                 "WHERE state = 'running'") == [(6,)]),
                             10.0, message="the six jobs to run")
        await asyncio.to_thread(q, jobs_db, "INSERT INTO job_flags VALUES ('results')")
        for h in handles[:5]:
            await wait_state(h.id, "succeeded")
        await wait_state(handles[5].id, "failed")
        assert rt.state == "running"
    for h in handles[:5]:
        assert q(jobs_db, "SELECT length(result ->> 0) FROM livepush_job_payloads WHERE id = %s", (h.id,)) == [(30_000,)]
    s = await asyncio.to_thread(jobs.job_state, handles[5].id)
    assert s is not None and (s["error"] or "").startswith("InvalidResultError: the job's result is too large"), s
    said = [(r.levelno, r.getMessage()) for r in caplog.records if "a batch of job updates" in r.getMessage()]
    assert said and all(level == logging.WARNING and "past the 1 GiB" in text for level, text in said), said
    # The job whose result alone passes it is said as held back by livepush, which sent nothing.
    refused = [r.getMessage() for r in caplog.records if "Postgres refused" in r.getMessage()]
    assert refused == [], refused


async def test_progress_postgres_refuses_is_dropped(jobs_db: str) -> None:
    """Progress Postgres refuses is dropped, the job's own and the batch's other work written:
    a running job's (written alone, then dropped) and a finishing job's (its outcome is then
    written without it)."""
    q(jobs_db, "ALTER TABLE livepush_job_payloads ADD CONSTRAINT test_refused "
               "CHECK (progress IS NULL OR progress ->> 'message' IS DISTINCT FROM 'refused')")
    async with running() as rt:
        waiting = await sample_jobs.progress_then_wait.aenqueue("refused", "go")
        finishing = await sample_jobs.odd_progress.aenqueue(1, "refused")
        await wait_state(finishing.id, "succeeded")
        other = await sample_jobs.record.aenqueue("other")
        await wait_state(other.id, "succeeded")  # the running job's refused progress held up nothing
        await asyncio.to_thread(q, jobs_db, "INSERT INTO job_flags VALUES ('go')")
        await wait_state(waiting.id, "succeeded")
        for h in (waiting, finishing):
            s = await asyncio.to_thread(jobs.job_state, h.id)
            assert s is not None and s["progress"]["message"] is None, s
        assert rt.state == "running"


async def test_a_failure_postgres_refuses_stops_the_runtime_rather_than_swallowing_jobs(jobs_db: str) -> None:
    """If Postgres refuses even the fixed failure (here a CHECK constraint that forbids this
    job to fail at all), the runtime stops at once with DependencyError and deregisters, giving
    its jobs back, instead of running on without its completer, where every job it claimed
    would stay `running` under a live heartbeat for ever (or run again once given back)."""
    from livepush import DependencyError

    q(jobs_db, "ALTER TABLE livepush_jobs ADD CONSTRAINT test_refused CHECK (state <> 'failed' OR name <> 't.never')")
    rt = Runtime(REGISTRY, install_signals=False, queues=["default"], heartbeat=0.2)
    task = asyncio.create_task(rt.run())
    await rt.wait_started()
    h = await sample_jobs.never.aenqueue()
    with pytest.raises(DependencyError, match="livepush-jobs-completer"):
        await asyncio.wait_for(task, 10)
    assert rt.state == "stopped"
    assert q(jobs_db, "SELECT count(*) FROM livepush_job_runtimes")[0][0] == 0
    assert await state_of(h.id) in ("available", "scheduled")


@jobs.job(name="t.backoff_raises", max_attempts=3, backoff=lambda attempt: (0.0,)[attempt])  # attempt 1: IndexError
async def backoff_raises(ctx: Any) -> None:
    raise ValueError("the job's own failure")


async def test_a_backoff_that_raises_still_retries_the_job(jobs_db: str) -> None:
    """backoff= is user code, called when an attempt fails. When it raised, the failure was never
    written: the job stayed `running`, held by a live runtime that had forgotten it, until that
    runtime stopped. The attempt's failure is written, and the job retried on the default backoff."""
    async with running() as rt:
        handle = await backoff_raises.aenqueue()
        await wait_state(handle.id, "scheduled")
        s = await asyncio.to_thread(jobs.job_state, handle.id)
        assert s is not None and s["error"] == "ValueError: the job's own failure" and s["attempt"] == 1, s
        after = await sample_jobs.record.aenqueue("after")
        await wait_state(after.id, "succeeded")
        assert rt.state == "running"


@jobs.job(name="t.backoff_nan", max_attempts=3, backoff=lambda attempt: float("nan"))
async def backoff_nan(ctx: Any) -> None:
    raise ValueError("the job's own failure")


@jobs.job(name="t.backoff_text", max_attempts=3, backoff=lambda attempt: "0")
async def backoff_text(ctx: Any) -> None:
    raise ValueError("the job's own failure")


@pytest.mark.parametrize("job", [backoff_nan, backoff_text], ids=["nan", "text"])
async def test_a_backoff_that_returns_no_number_of_seconds_retries_on_the_default_backoff(
        jobs_db: str, job: JobFunction, caplog: pytest.LogCaptureFixture) -> None:
    """backoff= must return a number of seconds. A NaN, or a str, is logged as the mistake it is
    and the retry waits the default backoff (about 2 s after a first failure), not no time at all."""
    async with running():
        handle = await job.aenqueue()

        async def failed_once() -> dict[str, Any] | None:
            s = await asyncio.to_thread(jobs.job_state, handle.id)
            return s if s is not None and s["error"] is not None and s["state"] != "running" else None

        state = await async_wait_for(failed_once, 10.0, message="the first attempt's failure")
    assert state["state"] == "scheduled", state
    wait = q(jobs_db, "SELECT extract(epoch FROM run_at - now()) FROM livepush_jobs WHERE id = %s", (handle.id,))
    assert float(wait[0][0]) > 0.5, wait
    assert "returned" in caplog.text and "not a number of seconds" in caplog.text


@pytest.mark.parametrize("how", ["cancelled", "generator"])
@pytest.mark.parametrize("job", ["exits", "exits_sync"])
async def test_a_job_raising_cancellederror_itself_fails_its_attempt(jobs_db: str, job: str, how: str) -> None:
    """A CancelledError (or GeneratorExit) the job raises itself, with no cancel of it asked for
    (it awaited a future something else cancelled), fails that attempt and is retried as usual:
    it is not taken for the runtime's own cancel and given back, attempt unspent, for ever."""
    async with running() as rt:
        h = await getattr(sample_jobs, job).aenqueue(how)
        await wait_state(h.id, "failed")
        error = {"cancelled": "CancelledError", "generator": "GeneratorExit"}[how]
        assert (await asyncio.to_thread(jobs.get_job, h.id)).error == error  # type: ignore[union-attr]
        assert q(jobs_db, "SELECT attempt FROM job_runs WHERE job_id = %s ORDER BY attempt", (h.id,)) == [(1,), (2,)]
        await assert_counts(rt, {"retrying": 1, "failed": 1})


@pytest.mark.parametrize("job", ["exits", "exits_sync"])
async def test_a_job_raising_stopiteration_fails_its_attempt_at_once(jobs_db: str, job: str) -> None:
    """A job that raises StopIteration (next() on an exhausted iterator) fails that attempt at once,
    like any other exception. From a sync job's thread, asyncio refused to carry it to the
    runtime's loop: the job stayed `running`, its slot held, until its timeout failed it."""
    async with running() as rt:
        h = await getattr(sample_jobs, job).aenqueue("stop")
        await wait_state(h.id, "failed", timeout=10.0)  # far below the job's 60 s timeout
        error = "RuntimeError: coroutine raised StopIteration" if job == "exits" else "StopIteration"
        assert (await asyncio.to_thread(jobs.get_job, h.id)).error == error  # type: ignore[union-attr]
        assert q(jobs_db, "SELECT attempt FROM job_runs WHERE job_id = %s ORDER BY attempt", (h.id,)) == [(1,), (2,)]
        await assert_counts(rt, {"retrying": 1, "failed": 1})


@pytest.mark.parametrize("how", ["error", "exit"])
async def test_a_job_raising_an_exception_whose_str_raises_fails_with_its_type_name(jobs_db: str, how: str) -> None:
    """An exception whose str() raises (an Exception, or a SystemExit) fails the job with its type
    name and a note that its message could not be read; the runtime runs on. A SystemExit from
    str() ended the runtime's process, and every job it held waited for the rescue."""
    async with running() as rt:
        h = await sample_jobs.unprintable.aenqueue(how)
        await wait_state(h.id, "failed")
        error = (await asyncio.to_thread(jobs.get_job, h.id)).error  # type: ignore[union-attr]
        assert error == "Unprintable: (its message could not be read: str() raised)"
        after = await sample_jobs.record.aenqueue("after")
        await wait_state(after.id, "succeeded")
        await assert_counts(rt, {"failed": 1, "succeeded": 1})
        assert rt.state == "running"


@pytest.mark.parametrize(("job", "error"), [
    ("wrapped_async", "t.wrapped_async returned a coroutine without running it: its function is not `async def`"),
    ("forgets_await", "t.forgets_await returned a coroutine it did not await: write `return await ...`"),
])
async def test_a_job_returning_a_coroutine_fails_at_once_saying_how_to_fix_it(jobs_db: str, job: str,
                                                                              error: str) -> None:
    """A job that returns a coroutine unrun (its decorator's wrapper is sync, or it forgot an
    await) fails at once, without retries, with an error that says what happened and what to
    change, not one about JSON results ("job results are plain JSON ...")."""
    async with running() as rt:
        h = await getattr(sample_jobs, job).aenqueue()
        await wait_state(h.id, "failed")
        info = await asyncio.to_thread(jobs.get_job, h.id)
        assert info is not None and info.attempt == 1, info
        assert info.error is not None and info.error.startswith(f"InvalidResultError: {error}"), info.error
        assert q(jobs_db, "SELECT count(*) FROM job_runs WHERE job_id = %s", (h.id,)) == [(0,)]
        await assert_counts(rt, {"failed": 1})


async def test_jobs_a_claim_returns_after_the_stop_are_given_back_unstarted(jobs_db: str) -> None:
    """A stop stops claiming: jobs that a claim already on its way returns after the stop are
    given back untouched (attempt not spent), not started and then cut off when the drain ends.
    The claim is held at a table lock until the runtime is draining. The late job is enqueued in
    the transaction that holds the lock: whatever claim waits there (a poll's, a ring's), it
    reads the table once the lock is gone, and finds the late job."""
    import psycopg

    async with running() as rt:
        first = await sample_jobs.wait_flag.aenqueue("first")
        await async_wait_for(lambda: first.id in rt.in_hand, 5.0, message="the first job to be in hand")
        async with await psycopg.AsyncConnection.connect(jobs_db) as locker:
            # SHARE: the claim's UPDATE waits for it; reads (the first job's flag) do not. The
            # lock's own transaction may still write the table.
            await locker.execute("LOCK TABLE livepush_jobs IN SHARE MODE")
            (late,) = await jobs.aenqueue_many([sample_jobs.wait_flag.request("late", queue="second")], conn=locker)

            def claim_waits() -> bool:
                # The plain claim, or the limited one of a name with limits that other test modules
                # registered (it comes first).
                return q(jobs_db, """SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()
                                     AND wait_event_type = 'Lock' AND (query LIKE '%%picked%%'
                                     OR query LIKE '%%livepush_claim_limited%%')""")[0][0] == 1

            await async_wait_for(lambda: asyncio.to_thread(claim_waits), 5.0, message="the claim to wait at the lock")
            rt.stop()  # as SIGTERM: the drain waits for the first job
            await async_wait_for(lambda: rt.state == "draining", 5.0, message="the runtime to drain")
        # The lock is gone with the late job committed: the claim returns it, while the drain still waits.
        await async_wait_for(lambda: asyncio.to_thread(
            lambda: q(jobs_db, "SELECT state, attempt, version = 3 FROM livepush_jobs WHERE id = %s", (late.id,))
            == [("available", 0, True)] or q(jobs_db, "SELECT 1 FROM job_runs WHERE job_id = %s", (late.id,))),
            15.0, message="the late job to be given back or started")
        q(jobs_db, "INSERT INTO job_flags VALUES ('first')")
        await wait_state(first.id, "succeeded")
    assert q(jobs_db, "SELECT job_id FROM job_runs WHERE phase = 'start' ORDER BY job_id") == [(first.id,)]
    assert q(jobs_db, "SELECT state, attempt FROM livepush_jobs WHERE id = %s", (late.id,)) == [("available", 0)]


async def beats_on_since(url: str, rt: Runtime, since: Any, what: str) -> None:
    """Returns once `rt` (beating every 0.3 s) beat 1.5 s after `since` (database time), or was
    pruned as dead meanwhile: the caller checks its row is still there."""

    def beats_on() -> bool:
        rows = q(url, "SELECT heartbeat_at > %s + interval '1.5 s' FROM livepush_job_runtimes WHERE id = %s",
                 (since, rt.id))
        return not rows or rows[0][0]

    await async_wait_for(lambda: asyncio.to_thread(beats_on), 10.0,
                         message=f"five beats {what} (or the runtime presumed dead)")


async def test_a_rescue_run_after_its_runtime_was_held_up_takes_no_live_runtime_for_dead(jobs_db: str) -> None:
    """A runtime whose loop a job holds up past three beats (a CPU-heavy step) runs the rescue its
    last beat started only once the loop is free, before its next beat can see the gap. Its own
    silence meanwhile is no sign of death, nor that of the runtimes held up with it: that rescue
    prunes nobody, itself included (a lone runtime took itself for dead and ran its own job
    again), and the first rescue after its next beat prunes the runtimes that stayed silent."""
    from psycopg_pool import AsyncConnectionPool

    from livepush.jobs.runtime import maintenance

    register = ("INSERT INTO livepush_job_runtimes (host, pid, queues, concurrency, heartbeat, heartbeat_at) "
                "VALUES ('test', 0, '{default}', 1, 0.2, now() - interval '2 s') RETURNING id")
    (held,) = q(jobs_db, register)[0]
    (sibling,) = q(jobs_db, register)[0]
    h = await sample_jobs.wait_flag.aenqueue("never-set")
    q(jobs_db, queries.CLAIM, {"queue": "default", "limit": 1, "excluded": [], "runtime_id": held})
    info = {"id": held, "state": "running", "in_hand": 1}
    async with AsyncConnectionPool(jobs_db, min_size=1, max_size=2, open=False) as pool:
        rescued, _ = await maintenance.rescue(pool, held)  # ten beats late, its loop just free
        assert rescued == []
        assert sorted(r[0] for r in q(jobs_db, "SELECT id FROM livepush_job_runtimes")) == sorted([held, sibling])
        assert q(jobs_db, "SELECT state, attempt, runtime_id FROM livepush_jobs WHERE id = %s",
                 (h.id,)) == [("running", 1, held)]
        await maintenance.beat(pool, info)
        await maintenance.rescue(pool, held)  # beating again: the silent sibling is dead
    assert [r[0] for r in q(jobs_db, "SELECT id FROM livepush_job_runtimes")] == [held]
    assert q(jobs_db, "SELECT state, attempt, runtime_id FROM livepush_jobs WHERE id = %s",
             (h.id,)) == [("running", 1, held)]


@jobs.job(name="t.kills_its_runtime", max_attempts=5, backoff=lambda attempt: 600.0 * attempt)
async def kills_its_runtime(ctx: Any) -> None:
    """Stands for a job that takes its runtime down (out of memory): only claimed here, never run."""


async def test_a_job_rescued_twice_in_a_row_waits_its_backoff_before_it_is_due_again(jobs_db: str) -> None:
    """A job whose runtime died is due again at once: the runtime's death was likely not its
    doing. Rescued again straight after (its last attempt ended in a rescue too), it may be what
    kills its runtimes: it waits its retry's backoff (scheduled, as after a failure) instead of
    taking the next runtime down at once, each time, until its attempts run out. A rescuer that
    does not define the job uses the default backoff."""
    from psycopg_pool import AsyncConnectionPool

    from livepush.jobs.runtime import maintenance

    h = kills_its_runtime.enqueue()
    (me,) = q(jobs_db, "INSERT INTO livepush_job_runtimes (host, pid, queues, concurrency, heartbeat) "
                       "VALUES ('test', 0, '{default}', 1, 3600) RETURNING id")[0]

    def due_in() -> tuple[str, str, int, float]:
        return q(jobs_db, "SELECT state, event, attempt, extract(epoch FROM run_at - now())::float8 "
                          "FROM livepush_jobs WHERE id = %s", (h.id,))[0]

    async with AsyncConnectionPool(jobs_db, min_size=1, max_size=2, open=False) as pool:
        async def claimed_by_a_dead_runtime_and_rescued(registry: Any) -> list[dict[str, Any]]:
            async with pool.connection() as conn:
                await conn.execute(queries.CLAIM, {"queue": "default", "limit": 1, "excluded": [],
                                                   "runtime_id": me + 1000})  # a runtime with no row: dead
            rescued, _ = await maintenance.rescue(pool, me, registry=registry)
            return rescued

        assert [r["id"] for r in await claimed_by_a_dead_runtime_and_rescued(REGISTRY)] == [h.id]
        state, event, attempt, wait = due_in()
        assert (state, event, attempt) == ("available", "retrying", 1) and wait <= 0
        assert [r["id"] for r in await claimed_by_a_dead_runtime_and_rescued(REGISTRY)] == [h.id]
        state, event, attempt, wait = due_in()
        assert (state, event, attempt) == ("scheduled", "retrying", 2) and 1190 < wait <= 1200
        q(jobs_db, "UPDATE livepush_jobs SET state = 'available' WHERE id = %s", (h.id,))  # as if it came due
        assert [r["id"] for r in await claimed_by_a_dead_runtime_and_rescued(None)] == [h.id]
        state, event, attempt, wait = due_in()
        assert (state, attempt) == ("scheduled", 3) and 5 < wait <= 10  # the default backoff of attempt 3: 8 s ±25 %
    assert names_of(jobs_db, h.id)[-2:] == ["started/running", "retrying/scheduled"]


async def test_a_rescue_its_runtimes_next_beat_overtook_prunes_nobody(jobs_db: str) -> None:
    """A rescue judges the others' silence by what the beat that started it knew: whether this
    runtime had just come back from a spell without contact (an outage every runtime shared, whose
    silence says nothing). A rescue that waited (for a connection through that outage, or held up
    with the loop) can run after the next beat, fresh but telling of the outage: judged with the
    older knowledge, the silence of every live runtime was taken for death, and their jobs ran
    twice. Such a rescue prunes nobody; the one the newer beat starts judges again."""
    from psycopg_pool import AsyncConnectionPool

    from livepush.jobs.runtime import maintenance

    register = ("INSERT INTO livepush_job_runtimes (host, pid, queues, concurrency, heartbeat, heartbeat_at) "
                "VALUES ('test', 0, '{default}', 1, 0.2, now() - interval '2 s') RETURNING id, heartbeat_at")
    me, started_by = q(jobs_db, register)[0]  # the beat that started the rescue, before the outage
    other = q(jobs_db, register)[0][0]  # silent through the same outage, alive
    info = {"id": me, "state": "running", "in_hand": 0}
    async with AsyncConnectionPool(jobs_db, min_size=1, max_size=2, open=False) as pool:
        await maintenance.beat(pool, info)  # the beat after the outage lands first
        rescued, _ = await maintenance.rescue(pool, me, None, beat_at=started_by)
        assert rescued == []
        assert sorted(r[0] for r in q(jobs_db, "SELECT id FROM livepush_job_runtimes")) == sorted([me, other])
        beat_at, _ = await maintenance.beat(pool, info)
        await maintenance.rescue(pool, me, None, beat_at=beat_at)  # what that beat knows: still silent, dead
    assert [r[0] for r in q(jobs_db, "SELECT id FROM livepush_job_runtimes")] == [me]


async def test_a_runtime_pruned_while_held_up_never_releases_the_jobs_it_claims_before_it_beats_again(
        jobs_db: str) -> None:
    """Pruned by another runtime while its loop was held up, a runtime claims again before its
    next beat registers it again: those jobs' runtime has no row then. Its own rescue in that gap
    released them while it ran them (they ran twice); it never releases its own jobs, while a
    runtime that is really gone still has its jobs released."""
    from psycopg_pool import AsyncConnectionPool

    from livepush.jobs.runtime import maintenance

    register = ("INSERT INTO livepush_job_runtimes (host, pid, queues, concurrency, heartbeat) "
                "VALUES ('test', 0, '{default}', 1, 10) RETURNING id")
    (pruned,) = q(jobs_db, register)[0]
    (gone,) = q(jobs_db, register)[0]
    mine = await sample_jobs.wait_flag.aenqueue("never-set")
    theirs = await sample_jobs.wait_flag.aenqueue("never-set")
    for runtime_id in (pruned, gone):
        q(jobs_db, queries.CLAIM, {"queue": "default", "limit": 1, "excluded": [], "runtime_id": runtime_id})
    q(jobs_db, "UPDATE livepush_job_runtimes SET heartbeat_at = now() - interval '1 minute' WHERE id = %s", (pruned,))
    q(jobs_db, "DELETE FROM livepush_job_runtimes WHERE id = %s", (gone,))  # both pruned by another runtime
    q(jobs_db, "DELETE FROM livepush_job_runtimes WHERE id = %s", (pruned,))
    (pruned_job,) = [r[0] for r in q(jobs_db, "SELECT id FROM livepush_jobs WHERE runtime_id = %s", (pruned,))]
    async with AsyncConnectionPool(jobs_db, min_size=1, max_size=2, open=False) as pool:
        rescued, _ = await maintenance.rescue(pool, pruned)  # its own rescue, before its next beat
    assert [r["id"] for r in rescued] != [] and pruned_job not in [r["id"] for r in rescued]
    assert q(jobs_db, "SELECT state, attempt, runtime_id FROM livepush_jobs WHERE id = %s",
             (pruned_job,)) == [("running", 1, pruned)]
    assert {mine.id, theirs.id} - {pruned_job} == {r["id"] for r in rescued}


async def test_a_slow_retention_prune_never_holds_up_the_heartbeat(jobs_db: str) -> None:
    """The heartbeat is what keeps a live runtime's jobs from being rescued: retention's deletes,
    however long they take (a backlog, a slow disk, a lock: here a lock the test holds), must not
    delay it past three beats, or another runtime presumes the live one dead and runs its jobs
    again."""
    import psycopg

    async with await psycopg.AsyncConnection.connect(jobs_db) as locker:
        # Retention's statements delete a job's unread signals too: they wait at this lock.
        await locker.execute("LOCK TABLE livepush_job_signals IN ACCESS EXCLUSIVE MODE")
        async with running(queues=["default"], heartbeat=0.3, retention=3600.0) as holder:
            h = await sample_jobs.wait_flag.aenqueue("go")
            await async_wait_for(lambda: h.id in holder.in_hand, 5.0, message="the job to be in hand")

            def prune_waits() -> bool:
                return q(jobs_db, """SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()
                                     AND wait_event_type = 'Lock' AND query LIKE '%%livepush_job_signals%%'""")[0][0] > 0

            await async_wait_for(lambda: asyncio.to_thread(prune_waits), 5.0, message="retention to wait at the lock")
            since = q(jobs_db, "SELECT now()")[0][0]
            async with running(queues=["second"], heartbeat=0.3, retention=None):  # it rescues what it finds dead
                await beats_on_since(jobs_db, holder, since, "while retention waits")
                assert q(jobs_db, "SELECT count(*) FROM livepush_job_runtimes WHERE id = %s", (holder.id,)) == [(1,)]
                assert q(jobs_db, "SELECT state, attempt, runtime_id FROM livepush_jobs WHERE id = %s",
                         (h.id,)) == [("running", 1, holder.id)]
            q(jobs_db, "INSERT INTO job_flags VALUES ('go')")
            await wait_state(h.id, "succeeded")
        await locker.rollback()
    assert q(jobs_db, "SELECT count(*) FROM job_runs WHERE job_id = %s AND phase = 'start'", (h.id,)) == [(1,)]


async def test_a_statement_timeout_shorter_than_a_retention_batch_halves_the_batch_and_retention_finishes(
        jobs_db: str, caplog: pytest.LogCaptureFixture) -> None:
    """A statement_timeout (of the role, the database or here the URL) shorter than one batch of
    finished jobs takes cancelled every retention run: nothing was deleted, a warning each time,
    and the jobs table grew. The batch halves at each cancel, within the operator's timeout, so
    retention finishes; one WARNING says so, and the runtime's next run starts at the smaller size."""
    from psycopg.conninfo import make_conninfo
    from psycopg_pool import AsyncConnectionPool

    from livepush.jobs.runtime import maintenance

    def finish_long_ago(n: int) -> None:
        q(jobs_db, "INSERT INTO livepush_jobs (queue, name, state, finished_at) SELECT 'default', 't.old', "
                   "'succeeded', now() - interval '2 days' FROM generate_series(1, %s)", (n,))

    shrinking = maintenance.prune_batches()
    timed = make_conninfo(jobs_db, options="-c statement_timeout=300")
    # A batch of more than 700 jobs outlasts the timeout: 1,000 is cancelled, 500 is not.
    with services.pg_slow_deletes_past(jobs_db, "livepush_jobs", 700):
        async with AsyncConnectionPool(timed, min_size=1, max_size=2, open=False) as pool:
            finish_long_ago(1500)
            assert await asyncio.wait_for(maintenance.prune(pool, 3600, shrinking=shrinking), 30) == 1500
            finish_long_ago(900)
            assert await asyncio.wait_for(maintenance.prune(pool, 3600, shrinking=shrinking), 30) == 900
    said = [r.getMessage() for r in caplog.records if r.levelname == "WARNING" and "statement_timeout" in r.getMessage()]
    assert len(said) == 1 and "finished jobs" in said[0], said


async def test_a_frozen_redis_never_holds_up_the_heartbeat(jobs_db: str, redis_url: str) -> None:
    """A runtime publishes its own state (runtime:<id>) through its fan-out when its jobs in hand
    change. With Redis frozen (its connections open, nothing answered) that publication waits, but
    the heartbeat must not wait for it: silent for three beats, the runtime was presumed dead, and
    the job it was running ran again elsewhere."""
    from livepush.fanout.redis import RedisFanOut

    fanout = RedisFanOut(redis_url)
    try:
        async with running(queues=["default"], heartbeat=0.3, publisher=fanout) as holder:
            h = await sample_jobs.wait_flag.aenqueue("go")
            await async_wait_for(lambda: h.id in holder.in_hand, 5.0, message="the job to be in hand")
            with services.redis_frozen(redis_url):
                # One more job in hand: the next beat publishes the runtime's state, into the frozen Redis.
                other = await sample_jobs.wait_flag.aenqueue("go")
                await async_wait_for(lambda: other.id in holder.in_hand, 5.0, message="the second job in hand")
                since = q(jobs_db, "SELECT now()")[0][0]
                async with running(queues=["second"], heartbeat=0.3, retention=None):  # it rescues what it finds dead
                    await beats_on_since(jobs_db, holder, since, "while Redis is frozen")
                    assert q(jobs_db, "SELECT count(*) FROM livepush_job_runtimes WHERE id = %s",
                             (holder.id,)) == [(1,)]
                    assert q(jobs_db, "SELECT state, attempt, runtime_id FROM livepush_jobs WHERE id IN (%s, %s)",
                             (h.id, other.id)) == [("running", 1, holder.id)] * 2
            q(jobs_db, "INSERT INTO job_flags VALUES ('go')")
            await wait_state(h.id, "succeeded")
            await wait_state(other.id, "succeeded")
    finally:
        await fanout.aclose()
    assert q(jobs_db, "SELECT count(*) FROM job_runs WHERE job_id IN (%s, %s) AND phase = 'start'",
             (h.id, other.id)) == [(2,)]


async def test_a_stop_with_redis_frozen_still_gives_the_jobs_back_and_deregisters(jobs_db: str, redis_url: str) -> None:
    """A stop publishes the runtime's `draining` and `stopped` through its fan-out. With Redis
    frozen those publications wait, but the stop must not wait for them for ever: it gives back
    the job in hand (attempt not spent), deregisters and returns, as with Redis up. It hung until
    a second signal, and a process killed then left its job to the rescue, attempt spent."""
    from livepush.fanout.redis import RedisFanOut

    fanout = RedisFanOut(redis_url)
    rt = Runtime(REGISTRY, queues=["default"], heartbeat=0.3, shutdown_timeout=0.2, publisher=fanout,
                 install_signals=False)
    task = asyncio.create_task(rt.run())
    try:
        await rt.wait_started()
        h = await sample_jobs.wait_flag.aenqueue("never")
        await async_wait_for(lambda: h.id in rt.in_hand, 5.0, message="the job to be in hand")
        with services.redis_frozen(redis_url):
            rt.stop()
            await asyncio.wait_for(asyncio.shield(task), 20.0)
        assert q(jobs_db, "SELECT count(*) FROM livepush_job_runtimes WHERE id = %s", (rt.id,)) == [(0,)]
        assert q(jobs_db, "SELECT state, attempt FROM livepush_jobs WHERE id = %s", (h.id,)) == [("available", 0)]
    finally:
        if not task.done():
            rt.stop(now=True)
            await asyncio.wait_for(task, 10.0)
        await fanout.aclose()


@pytest.mark.parametrize("how", ["run", "drain"])
async def test_a_runtime_that_fails_to_start_leaves_nothing_running(jobs_db: str, how: str) -> None:
    """A runtime whose start fails part-way (here its listener cannot reach its database: a wrong
    LIVEPUSH_LISTEN_DATABASE_URL) raises, and leaves none of what it had started behind on the
    loop: not its completer, its group progress publisher nor its connection pools' tasks, as an
    app that starts it again, or a test's jobs.adrain(), would pile them up."""
    from livepush.errors import ListenError

    before = asyncio.all_tasks()
    bad = "postgresql://nobody@127.0.0.1:1/nothing"
    with pytest.raises(ListenError):
        if how == "run":
            rt = Runtime(REGISTRY, queues=["default"], install_signals=False, listen_url=bad)
            await asyncio.wait_for(rt.run(), 30.0)
        else:
            # drain() listens at LIVEPUSH_LISTEN_DATABASE_URL when jobs.configure() chose no database
            # (the fixture puts both back).
            config.set_settings(config.Settings(database_url=jobs_db, fanout="postgres", env="test",
                                                listen_database_url=bad))
            database.configure(None)
            await asyncio.wait_for(jobs.adrain(), 30.0)
    left = sorted(t.get_name() for t in asyncio.all_tasks() - before if not t.done())
    assert [name for name in left if name.startswith("livepush-jobs")] == [], left


async def test_waiting_for_a_runtime_whose_start_failed_raises_that_failure_at_once(jobs_db: str) -> None:
    """An app that runs a Runtime in a task of its own and awaits wait_started() learns of a start
    that failed (its database unreachable) as soon as run() has ended, with run()'s own error, and
    of a runtime stopped before it started with an error saying so: it neither waits out its
    timeout for a TimeoutError that names nothing, nor, with timeout=None, for ever."""
    from livepush.errors import ListenError, LivepushError

    bad = "postgresql://nobody@127.0.0.1:1/nothing"
    rt = Runtime(REGISTRY, queues=["default"], install_signals=False, listen_url=bad)
    task = asyncio.create_task(rt.run())
    with pytest.raises(ListenError):
        await asyncio.wait_for(rt.wait_started(timeout=None), 30.0)
    with pytest.raises(ListenError):
        await task
    stopped = Runtime(REGISTRY, queues=["default"], install_signals=False)
    stopped.stop()
    await asyncio.wait_for(stopped.run(), 30.0)
    with pytest.raises(LivepushError, match="stopped before it started"):
        await asyncio.wait_for(stopped.wait_started(timeout=None), 5.0)


async def test_waiting_for_a_runtime_whose_task_was_cancelled_while_it_opened_says_so(jobs_db: str) -> None:
    """An app that cancels the task running run() before the runtime started (its own shutdown
    while the runtime opened) learns from wait_started() that the task was cancelled, and what to
    do, not that stop() came, which nobody called."""
    from livepush.errors import LivepushError

    rt = Runtime(REGISTRY, queues=["default"], install_signals=False)
    task = asyncio.create_task(rt.run())
    await asyncio.sleep(0)  # one step: run() is opening, suspended on its database
    assert not rt._started.is_set()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(task, 30.0)
    with pytest.raises(LivepushError, match="cancelled before it started") as raised:
        await asyncio.wait_for(rt.wait_started(timeout=None), 5.0)
    message = str(raised.value)
    assert "stop() (or a stop signal) came" not in message and "Runtime(...)" in message, message


def claimed_unheard(url: str, runtime_id: int | None, job_id: int) -> None:
    """Leave the job's row as a claim of that runtime's leaves it whose reply never reached it."""
    q(url, """UPDATE livepush_jobs SET state = 'running', attempt = attempt + 1, runtime_id = %s,
              lease = livepush_job_lease(), version = version + 1, event = 'started' WHERE id = %s""",
      (runtime_id, job_id))


async def test_a_claim_whose_reply_was_lost_is_given_back_once_the_runtime_claims_again(
        jobs_db: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A claim that commits in Postgres but whose reply never reaches the runtime (its connection
    breaks on the way back) leaves jobs `running` under a live runtime that does not know them:
    nothing ended them while it lived, however long. Once a claim has failed, the runtime gives
    back, before its next claim, the jobs the database says it holds and it does not know (their
    attempt not spent); they run. The row is set here as such a claim leaves it."""

    async def unseen(conn: Any) -> bool:
        return False  # the close lands after the check for one closed while idle: the claim fails

    monkeypatch.setattr(runtime, "aclosed_while_idle", unseen)
    async with running(queues=["default"], poll_interval=0.2) as rt:
        known = await sample_jobs.wait_flag.aenqueue("go")
        await async_wait_for(lambda: known.id in rt.in_hand, 5.0, message="a job in hand")
        h = await sample_jobs.record.aenqueue("unheard", wait=3600)
        claimed_unheard(jobs_db, rt.id, h.id)
        assert rt._claim_conn is not None
        q(jobs_db, "SELECT pg_terminate_backend(%s)", (rt._claim_conn.info.backend_pid,))  # the next claim fails
        await wait_state(h.id, "succeeded", timeout=15.0)
        assert q(jobs_db, "SELECT attempt FROM job_runs WHERE job_id = %s", (h.id,)) == [(1,)]
        # The job it knew, in hand all along, is still its own.
        assert q(jobs_db, "SELECT state, attempt, runtime_id FROM livepush_jobs WHERE id = %s",
                 (known.id,)) == [("running", 1, rt.id)]
        q(jobs_db, "INSERT INTO job_flags VALUES ('go')")
        await wait_state(known.id, "succeeded")
    assert q(jobs_db, "SELECT count(*) FROM job_runs WHERE job_id = %s AND phase = 'start'", (known.id,)) == [(1,)]


async def test_a_claim_that_commits_after_the_runtime_gave_back_is_given_back_within_a_reconcile(
        jobs_db: str, caplog: pytest.LogCaptureFixture) -> None:
    """A claim whose connection breaks mid-statement can commit after the runtime has reconnected
    and already given back what failed claims took: its job is `running` under the live runtime,
    which never heard of it, and its heartbeat keeps the rescue away. It stayed so until that
    runtime restarted. The runtime now gives back, every reconcile period, what the database says
    it holds and it does not know: the job runs, its attempt not spent. The row is set here as
    such a late commit leaves it, with no claim of the runtime's failing."""
    caplog.set_level(logging.WARNING, logger="livepush.jobs")
    async with running(queues=["default"], poll_interval=0.2) as rt:
        rt.reconcile_seconds = 0.3
        h = await sample_jobs.record.aenqueue("late", wait=3600)
        claimed_unheard(jobs_db, rt.id, h.id)
        await wait_state(h.id, "succeeded", timeout=10.0)
    assert q(jobs_db, "SELECT attempt FROM job_runs WHERE job_id = %s", (h.id,)) == [(1,)]
    said = [r.getMessage() for r in caplog.records if r.getMessage().startswith("gave back 1 job")]
    assert len(said) == 1, said


async def test_a_runtime_with_every_slot_taken_still_gives_back_what_a_late_claim_left(jobs_db: str) -> None:
    """A runtime whose every slot a long job holds makes no claim, before which to give back what
    a late-committing claim left under its id: it gives it back all the same within a reconcile
    period, and it is `available` for any runtime; the job in hand is kept."""
    async with running(queues=["default"], poll_interval=0.2, concurrency=1) as rt:
        rt.reconcile_seconds = 0.3
        long = await sample_jobs.wait_flag.aenqueue("full")
        await async_wait_for(lambda: long.id in rt.in_hand, 5.0, message="the job in hand")
        h = await sample_jobs.record.aenqueue("late", wait=3600)
        claimed_unheard(jobs_db, rt.id, h.id)
        await wait_state(h.id, "available")
        assert q(jobs_db, "SELECT state, attempt FROM livepush_jobs WHERE id = %s", (long.id,)) == [("running", 1)]
        q(jobs_db, "INSERT INTO job_flags VALUES ('full')")
        await wait_state(h.id, "succeeded")
    assert q(jobs_db, "SELECT attempt FROM job_runs WHERE job_id = %s", (h.id,)) == [(1,)]


async def test_a_stopped_runtime_leaves_no_reconcile_timer_on_its_loop(jobs_db: str) -> None:
    """A runtime whose every slot is taken arms a timer that ends its wait for a free slot at the
    next reconcile. Stopped, it left that timer on the loop, which goes on in an app that embeds
    the runtime: for up to a minute it held the stopped runtime (its completer, its contexts) and
    then woke a producer that no longer ran. Once run() has returned, nothing of it is scheduled."""
    loop = asyncio.get_running_loop()
    async with running(queues=["default"], poll_interval=0.2, concurrency=1) as rt:
        h = await sample_jobs.wait_flag.aenqueue("armed")
        await async_wait_for(lambda: h.id in rt.in_hand, 5.0, message="the job in hand")
        await async_wait_for(lambda: rt._reconcile_wake is not None, 5.0, message="the reconcile's timer")
        q(jobs_db, "INSERT INTO job_flags VALUES ('armed')")
        await wait_state(h.id, "succeeded")
    armed = [h for h in loop._scheduled  # type: ignore[attr-defined]
             if not h.cancelled() and getattr(h._callback, "__self__", None) is rt._slot_freed]
    assert armed == [], "a stopped runtime left its reconcile timer on the loop"


async def test_the_reconcile_never_gives_back_a_job_in_hand_or_one_whose_outcome_waits(
        jobs_db: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The periodic give-back of what a runtime does not know keeps every job it knows: one in
    hand across several reconciles, then its outcome held in the completer across several more,
    finishes once, attempt 1; and jobs claimed and started while reconciles run on every claim
    round each start once."""
    from livepush.jobs.runtime import maintenance

    reconciles = 0
    release_unknown = maintenance.release_unknown

    async def counted(*args: Any) -> tuple[int, set[int]]:
        nonlocal reconciles
        reconciles += 1
        given_back, touched = await release_unknown(*args)
        assert given_back == 0, "the reconcile gave back a job the runtime knows"
        return given_back, touched

    monkeypatch.setattr(maintenance, "release_unknown", counted)
    async with running(queues=["default"], poll_interval=0.05, concurrency=4) as rt:
        rt.reconcile_seconds = 0.05  # about every claim round
        assert rt._completer is not None
        completer, flush = rt._completer, rt._completer.flush
        gate = asyncio.Event()

        async def held_flush(limit: int | None = None) -> None:
            if completer._outcomes and not gate.is_set():
                await gate.wait()
            await flush(limit)

        async def several_reconciles(what: str) -> None:
            seen = reconciles
            await async_wait_for(lambda: reconciles >= seen + 3, 5.0, message=f"reconciles with {what}")

        h = await sample_jobs.wait_flag.aenqueue("reconciled")
        await async_wait_for(lambda: h.id in rt.in_hand, 5.0, message="the job in hand")
        await several_reconciles("the job in hand")
        monkeypatch.setattr(completer, "flush", held_flush)
        q(jobs_db, "INSERT INTO job_flags VALUES ('reconciled')")
        await async_wait_for(lambda: h.id in completer.pending(), 5.0, message="its outcome waiting")
        await several_reconciles("its outcome waiting")
        gate.set()
        await wait_state(h.id, "succeeded")
        many = [await sample_jobs.record.aenqueue(i) for i in range(20)]
        for job in many:
            await wait_state(job.id, "succeeded")
    assert q(jobs_db, "SELECT phase, attempt FROM job_runs WHERE job_id = %s ORDER BY at", (h.id,)) == [
        ("start", 1), ("done", 1)]
    assert q(jobs_db, "SELECT count(*), max(attempt) FROM job_runs WHERE job_id = ANY(%s)",
             ([job.id for job in many],)) == [(20, 1)]


async def test_a_job_given_back_by_a_draining_runtime_wakes_an_idle_one_at_once(jobs_db: str) -> None:
    """A job a draining runtime gives back at the end of its shutdown timeout is available again at
    once, and an idle runtime is rung for it, as for an enqueue: it waited for that runtime's next
    poll (here 60 s)."""
    holder = Runtime(REGISTRY, queues=["default"], heartbeat=0.3, shutdown_timeout=0.1, install_signals=False)
    task = asyncio.create_task(holder.run())
    try:
        await holder.wait_started()
        h = await sample_jobs.wait_flag.aenqueue("go")
        await async_wait_for(lambda: h.id in holder.in_hand, 5.0, message="the job in hand")
        async with running(queues=["default"], poll_interval=60.0) as idle:
            await async_wait_for(lambda: idle._claim_conn is not None, 5.0, message="the idle runtime's first claim")
            holder.stop()
            await asyncio.wait_for(task, 10.0)
            await async_wait_for(lambda: h.id in idle.in_hand, 10.0, message="the idle runtime to take the job")
            q(jobs_db, "INSERT INTO job_flags VALUES ('go')")
            await wait_state(h.id, "succeeded")
    finally:
        if not task.done():
            holder.stop(now=True)
            await asyncio.wait_for(task, 10.0)


async def test_a_cancel_confirmed_in_the_loop_turn_its_job_started_still_stops_it(
        jobs_db: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A cancel the heartbeat confirms in the very loop turn that started the job (the claim's
    reply and the heartbeat's read both waiting when the loop wakes), before the job's task ran
    a step: the job still ends cancelled and its slot frees. Forced here by confirming the cancel
    right as the job starts."""
    started = Runtime._start

    def start_then_cancel(self: Runtime, job: ClaimedJob) -> None:
        started(self, job)
        self._cancel_local(job.id)

    monkeypatch.setattr(Runtime, "_start", start_then_cancel)
    async with running() as rt:
        h = await sample_jobs.wait_flag.aenqueue("never-set")
        await wait_state(h.id, "cancelled")
        await async_wait_for(lambda: not rt.in_hand, 5.0, message="the slot to free")


@pytest.mark.parametrize("job", ["endless_timeout", "endless_timeout_int", "endless_timeout_sync"])
async def test_a_timeout_too_long_to_ever_pass_is_as_good_as_none(jobs_db: str, job: str) -> None:
    """The decorator takes any positive timeout: one longer than any clock can count to
    (sys.float_info.max, 10**400) never passes, like float("inf"), and the job runs to its end."""
    async with running():
        h = await getattr(sample_jobs, job).aenqueue()
        await wait_state(h.id, "succeeded")


async def test_the_default_backoff_retries_a_job_on_its_thousandth_attempt_and_later(jobs_db: str) -> None:
    """max_attempts takes any int Postgres stores: a job that has failed a thousand times and more
    (hourly, on the default backoff's cap) is still retried an hour later, never left running."""
    h = await sample_jobs.retries_for_ever.aenqueue()
    q(jobs_db, "UPDATE livepush_jobs SET attempt = 1500 WHERE id = %s", (h.id,))  # as after 1500 failures
    async with running():
        await wait_state(h.id, "scheduled")
    (attempt, due_in), = q(jobs_db, "SELECT attempt, extract(epoch FROM run_at - now()) FROM livepush_jobs "
                                    "WHERE id = %s", (h.id,))
    assert attempt == 1501 and 2600 < due_in <= 3600  # an hour, less up to 25 % of jitter


async def test_a_job_that_swallows_its_timeouts_cancel_still_fails_the_attempt(jobs_db: str) -> None:
    """An async job past its timeout fails the attempt, also when it swallows the cancel and
    returns a value as if nothing happened: it ran past its timeout all the same."""
    async with running():
        h = await sample_jobs.swallows_timeout.aenqueue()
        await wait_state(h.id, "failed")
    info = jobs.get_job(h.id)
    assert info is not None and info.error == "TimeoutError: timed out after 0.2 s" and info.result is None


@contextlib.asynccontextmanager
async def let_end_after(jobs_db: str, rt: Runtime, job_id: int, flag: str) -> AsyncIterator[None]:
    """Runs the block, then lets the job `job_id` of deaf_until_flag end (sets `flag`, whatever
    happened in the block) and returns once its task ended and the completer wrote what it had."""
    try:
        yield
    finally:
        q(jobs_db, "INSERT INTO job_flags (name) VALUES (%s)", (flag,))

    async def ended() -> bool:
        rows = await asyncio.to_thread(q, jobs_db, "SELECT count(*) FROM job_runs WHERE job_id = %s "
                                                   "AND phase = 'done'", (job_id,))
        return rows[0][0] == 1

    await async_wait_for(ended, 5.0, message="the deaf job's task to end")
    assert rt._completer is not None
    await rt._completer.wait_idle(5)


async def cancelled_while_running(rt: Any, job_id: int) -> None:
    """jobs.cancel() of the job once it runs on `rt`; returns once its outcome is written."""
    await async_wait_for(lambda: job_id in rt.in_hand, 5.0, message="the job to start")
    await wait_state(job_id, "running")
    assert await asyncio.to_thread(jobs.cancel, job_id)
    await async_wait_for(lambda: job_id not in rt.in_hand, 10.0, message="the job to end")
    assert rt._completer is not None
    await rt._completer.wait_idle(5)


async def test_a_cancelled_async_job_that_swallows_the_cancel_and_returns_ends_cancelled(jobs_db: str) -> None:
    """jobs.cancel() of a running async job that catches the cancellation and returns: the job
    ends `cancelled`, what it returned dropped, as when it swallows the cancel and runs on (and
    as a job that swallows its timeout's cancel still fails by its timeout). It ended
    `succeeded`, its result stored, cancelled or not depending on how soon it returned."""
    async with running() as rt:
        h = await sample_jobs.swallows_cancel.aenqueue("never-set")
        await cancelled_while_running(rt, h.id)
    info = jobs.get_job(h.id)
    assert info is not None and (info.state, info.result) == ("cancelled", None)
    assert names_of(jobs_db, h.id) == ["enqueued/available", "started/running", "cancelled/cancelled"]


async def test_a_cancelled_sync_job_that_swallows_jobcancelled_and_returns_ends_cancelled(jobs_db: str) -> None:
    """The same for a sync job: told of its cancel (JobCancelled at its ctx.progress()), it catches
    it and returns. It ends `cancelled`, what it returned dropped, as an async job does. It
    ended `succeeded` with its result, as if the cancel had come too late."""
    async with running() as rt:
        h = await sample_jobs.sync_swallows_cancel.aenqueue()
        await cancelled_while_running(rt, h.id)
    info = jobs.get_job(h.id)
    assert info is not None and (info.state, info.result) == ("cancelled", None)


async def test_an_async_job_deaf_to_its_timeouts_cancel_still_fails_and_frees_its_slot(jobs_db: str) -> None:
    """An async job past its timeout that swallows every cancellation and runs on fails its
    attempt within the grace after the cancel (runtime.TIMEOUT_GRACE), once, and frees its slot
    for the next job, as a sync job past its timeout does. It held the slot for good, its job
    `running` and its attempt never failed. What its task does when it ends at last is ignored."""
    async with running(concurrency=1, poll_interval=0.1) as rt:
        deaf = await sample_jobs.deaf_to_timeout.aenqueue("deaf-go")
        after = await sample_jobs.record.aenqueue("after")
        async with let_end_after(jobs_db, rt, deaf.id, "deaf-go"):
            await wait_state(deaf.id, "failed", timeout=0.2 + runtime.TIMEOUT_GRACE + 3.0)
            await wait_state(after.id, "succeeded")
            assert deaf.id not in rt.in_hand
    info = jobs.get_job(deaf.id)
    assert info is not None
    assert (info.state, info.attempt, info.error, info.result) == ("failed", 1, "TimeoutError: timed out after 0.2 s",
                                                                   None)
    assert names_of(jobs_db, deaf.id) == ["enqueued/available", "started/running", "failed/failed"]


async def test_an_async_job_deaf_to_its_cancel_still_ends_cancelled_and_frees_its_slot(jobs_db: str) -> None:
    """jobs.cancel() of a running async job that swallows every cancellation and runs on ends it
    `cancelled` within the grace after the cancel (runtime.TIMEOUT_GRACE) and frees its slot for
    the next job. It stayed `running`, holding its slot, until the runtime stopped. What its task
    does when it ends at last is ignored."""
    async with running(concurrency=1, poll_interval=0.1) as rt:
        deaf = await sample_jobs.deaf_to_cancel_until_flag.aenqueue("deaf-go")
        await wait_state(deaf.id, "running")
        after = await sample_jobs.record.aenqueue("after")
        async with let_end_after(jobs_db, rt, deaf.id, "deaf-go"):
            assert await asyncio.to_thread(jobs.cancel, deaf.id)
            await wait_state(deaf.id, "cancelled", timeout=runtime.TIMEOUT_GRACE + 3.0)
            await wait_state(after.id, "succeeded")
            assert deaf.id not in rt.in_hand
    info = jobs.get_job(deaf.id)
    assert info is not None and (info.state, info.attempt, info.result) == ("cancelled", 1, None)
    assert names_of(jobs_db, deaf.id) == ["enqueued/available", "started/running", "cancelled/cancelled"]


@pytest.mark.parametrize("option", ["heartbeat", "poll_interval", "shutdown_timeout", "retention"])
def test_a_runtime_refuses_an_int_too_large_for_a_float_naming_the_option(option: str) -> None:
    """An embedder's Runtime(...) option of seconds that no float holds (10**400) is refused with
    the ConfigError naming the option, as any other number out of range, not an OverflowError; the
    int is named by its size, not written out in 400 digits."""
    from livepush.errors import ConfigError

    with pytest.raises(ConfigError, match=rf"Runtime\({option}=an int of 1329 bits\)"):
        Runtime(REGISTRY, install_signals=False, **{option: 10**400})


@pytest.mark.parametrize(("options", "said"), [
    ({"concurrency": 0}, "Runtime(concurrency=0): run from 1 to 100000 jobs at a time"),
    ({"heartbeat": 0}, "Runtime(heartbeat=0): use a number of seconds"),
    ({"poll_interval": -1}, "Runtime(poll_interval=-1): use a number of seconds"),
    ({"shutdown_timeout": -1}, "Runtime(shutdown_timeout=-1): use a finite number of seconds"),
    ({"retention": 0}, "Runtime(retention=0): use a number of seconds from 0.001 to 3162240000 (100 years), "
                       "or None to keep finished jobs and groups"),
    ({"queues": ["a,b"]}, "Runtime(queues=): a queue is a non-empty string"),
    ({"queues": "imports"}, "Runtime(queues='imports') is one string: pass a list"),
    ({"queues": []}, r"Runtime(queues=[]) names no queue: list the queues to run, or pass None"),
])
def test_a_runtime_made_in_python_names_the_keyword_it_was_given(options: dict[str, Any], said: str) -> None:
    """An embedder's Runtime(concurrency=0) was told "--concurrency 0", a flag of a command it never
    ran (and retention=0 to pass 0 to keep jobs, which Runtime refuses): the ConfigError names the
    keyword and the value given, as `livepush jobs` names its flags."""
    from livepush.errors import ConfigError

    with pytest.raises(ConfigError) as refused:
        Runtime(REGISTRY, install_signals=False, **options)
    assert str(refused.value).startswith(said), str(refused.value)
    assert "--" not in str(refused.value).split(":")[0], str(refused.value)


@pytest.mark.parametrize("queues", ["imports", b"imports", []])
def test_a_runtime_given_queues_that_are_not_a_list_of_names_refuses_them(queues: object) -> None:
    """An embedder's Runtime(queues="imports") served the queues "i", "m", "p", ... (a str is a
    sequence of one-letter names), so the imports jobs never ran and nothing said why; queues=[]
    served every queue of the modules, those meant for other runtimes too. A ConfigError naming
    queues=, as `livepush jobs --queues ""` gets one naming --queues."""
    from livepush.errors import ConfigError

    with pytest.raises(ConfigError, match=r"Runtime\(queues="):
        Runtime(REGISTRY, install_signals=False, queues=queues)  # type: ignore[arg-type]
    assert Runtime(REGISTRY, install_signals=False, queues=("imports",)).queues == ["imports"]


def test_a_queue_named_twice_is_served_once_at_its_first_place() -> None:
    """`--queues a,b,a` serves a then b: each round claimed `a` twice, and `livepush status` listed
    it twice for the runtime."""
    assert Runtime(REGISTRY, install_signals=False, queues=["a", "b", "a", "b"]).queues == ["a", "b"]


def test_a_runtime_given_its_modules_as_one_string_refuses_it_naming_the_fix() -> None:
    """Runtime("myapp.jobs") tried to import the modules "m", "y", "a", ...: the error named a
    module "m" nobody wrote. A ConfigError saying to pass a list of module names."""
    from livepush.errors import ConfigError

    with pytest.raises(ConfigError, match=r"\['tests.jobs.sample_jobs'\]"):
        Runtime("tests.jobs.sample_jobs", install_signals=False)  # type: ignore[arg-type]


def test_a_thread_pool_let_go_of_ends_its_idle_threads() -> None:
    """A runtime whose sync jobs' threads hung replaces its pool without shutting it down (jobs
    started before still hold it): once nothing holds it, its idle threads end rather than wait
    for work for the life of the process."""
    import gc
    import threading

    from livepush.jobs.runtime.threads import JobThreads

    pool = JobThreads(3, "livepush-job-let-go")
    assert [pool.submit(lambda n=n: n * 2).result(timeout=5) for n in range(3)] == [0, 2, 4]
    threads = [t for t in threading.enumerate() if t.name.startswith("livepush-job-let-go")]
    assert threads and all(t.daemon for t in threads)  # nor does the process wait for them at exit
    del pool
    gc.collect()
    for thread in threads:
        thread.join(timeout=5)
    assert not any(t.is_alive() for t in threads), "the idle threads of a pool nothing holds did not end"


async def test_sync_jobs_still_run_after_more_timed_out_threads_than_slots(jobs_db: str) -> None:
    """A sync job past its timeout fails its attempt and frees its slot while its thread runs on.
    However many such threads hang (here three, with one slot), the freed slot runs the next sync
    job: it does not queue behind them until its own timeout fails it without running."""
    sample_jobs.UNSTICK.clear()
    try:
        async with running(concurrency=1):
            for _ in range(3):
                h = await sample_jobs.stuck_sync.aenqueue()
                await wait_state(h.id, "failed")
            after = await sample_jobs.record_sync_soon.aenqueue("after")
            await wait_state(after.id, "succeeded")
    finally:
        sample_jobs.UNSTICK.set()


async def test_a_timed_out_sync_thread_that_ended_no_longer_counts_as_hung(
        jobs_db: str, caplog: pytest.LogCaptureFixture) -> None:
    """The runtime takes a fresh thread pool once as many sync threads hang past their timeouts
    as it has slots, not once that many timeouts have ever happened: a thread that ended since
    its timeout holds no thread of the pool."""
    async with running(concurrency=2):
        for _ in range(3):
            sample_jobs.UNSTICK.clear()
            token = uuid.uuid4().hex
            h = await sample_jobs.stuck_sync.aenqueue(token)
            await wait_state(h.id, "failed")
            sample_jobs.UNSTICK.set()
            await async_wait_for(lambda: token in sample_jobs.UNSTUCK, 5.0, message="the thread to end")
        after = await sample_jobs.record_sync_soon.aenqueue("after")
        await wait_state(after.id, "succeeded")
    assert "fresh thread pool" not in caplog.text


async def test_a_job_started_before_its_runtime_took_fresh_threads_still_runs_sync_work(jobs_db: str) -> None:
    """After as many hung sync threads as slots, new sync work goes to a fresh thread pool. A job
    that started before that holds the old pool as ctx._threads, and its sync checkpoint still
    runs there: the old pool is left to end with its threads, not shut down under it."""
    sample_jobs.UNSTICK.clear()
    sample_jobs.CHECKPOINT_GO.clear()
    try:
        async with running(concurrency=2):
            early = await sample_jobs.checkpoint_later.aenqueue()
            await wait_state(early.id, "running")
            for _ in range(2):  # one slot left: each hangs past its timeout in turn
                h = await sample_jobs.stuck_sync.aenqueue()
                await wait_state(h.id, "failed")
            sample_jobs.CHECKPOINT_GO.set()
            await wait_state(early.id, "succeeded")
        info = await jobs.aget_job(early.id)
        assert info is not None and info.result == "ran"
    finally:
        sample_jobs.UNSTICK.set()
        sample_jobs.CHECKPOINT_GO.set()


async def attempt_2_progress_shown(job_id: int, timeout: float) -> None:
    """Returns once the job's state shows its second attempt running, with its progress "attempt 2"."""

    def shown() -> bool:
        state = jobs.job_state(job_id)
        return state is not None and state["state"] == "running" and state["attempt"] == 2 \
            and (state["progress"] or {}).get("message") == "attempt 2"

    await async_wait_for(lambda: asyncio.to_thread(shown), timeout, message="attempt 2's progress to show while it runs")


async def test_the_progress_of_a_sync_jobs_timed_out_thread_never_hides_its_next_attempts(jobs_db: str) -> None:
    """A sync job's thread that runs on past its timeout may go on reporting progress: it is
    ignored (the attempt's lease is gone), and it must not keep the job's next attempt, run by the
    same runtime meanwhile, from having its own progress shown. Here the old thread reports just
    before the new attempt does."""
    sample_jobs.ZOMBIE_GO.clear()
    sample_jobs.ZOMBIE_DONE.clear()
    async with running(concurrency=2):
        h = await sample_jobs.reports_past_timeout_sync.aenqueue()
        await attempt_2_progress_shown(h.id, 8.0)
        q(jobs_db, "INSERT INTO job_flags VALUES ('second')")
        await wait_state(h.id, "succeeded")


async def test_the_progress_of_an_async_job_ended_without_its_task_never_hides_its_next_attempts(
        jobs_db: str) -> None:
    """An async job deaf to its timeout's cancels is ended without its task, which runs on and may
    go on reporting progress: it is ignored, as a sync job's thread's is, and must not keep the
    job's next attempt, run by the same runtime meanwhile, from having its own progress shown
    while it runs (here, within the 2.5 s its own timeout and grace leave it)."""
    sample_jobs.ZOMBIE_GO.clear()
    sample_jobs.ZOMBIE_REPORTED = asyncio.Event()
    sample_jobs.ZOMBIE_END.clear()
    try:
        async with running(concurrency=2):
            h = await sample_jobs.reports_past_timeout.aenqueue()
            await attempt_2_progress_shown(h.id, 10.0)
            sample_jobs.ZOMBIE_END.set()

            def ended() -> bool:  # succeeded, or failed by its timeout if it ran for more than 0.5 s
                state = jobs.job_state(h.id)
                return state is not None and state["state"] in ("succeeded", "failed")

            await async_wait_for(lambda: asyncio.to_thread(ended), 10.0, message="attempt 2 to end")
    finally:
        sample_jobs.ZOMBIE_END.set()


# Makes a claim of a job on the queue "second" wait while a test holds the advisory lock 727: a
# claim of several queues then has committed its first queue's jobs and waits on the next.
HOLD_SECOND_QUEUE_CLAIMS = """
CREATE FUNCTION test_hold_claims() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_advisory_xact_lock(727);
    RETURN NEW;
END $$;
CREATE TRIGGER test_hold_claims BEFORE UPDATE ON livepush_jobs FOR EACH ROW
    WHEN (OLD.state = 'available' AND NEW.state = 'running' AND NEW.queue = 'second')
    EXECUTE FUNCTION test_hold_claims();
"""


async def test_a_cancel_heard_before_the_claim_that_took_its_job_returned_still_stops_it(jobs_db: str) -> None:
    """A running job's cancel can commit, and its notification reach the runtime, after the claim
    that took the job committed but before the runtime has the claim's reply (here: the claim of
    a second queue still waits). The job still stops at once, as any other cancelled job does.
    The notification named a job the runtime did not hold yet and was dropped: the job ran on
    until the next heartbeat found the cancel."""
    q(jobs_db, HOLD_SECOND_QUEUE_CLAIMS)
    cancel_heard = asyncio.Event()
    # Added before the runtime's own handler, so it runs first: once this is set, the runtime's
    # handler has run too, in the same delivery.
    listener = Listener(jobs_db, name="test-jobs-listener")
    listener.add(queries.CANCEL_CHANNEL, lambda payload: cancel_heard.set())
    locker = await psycopg.AsyncConnection.connect(jobs_db, autocommit=True)
    try:
        await locker.execute("SELECT pg_advisory_lock(727)")
        h = await sample_jobs.wait_flag.aenqueue("never-set")
        await sample_jobs.other_queue.aenqueue("held")
        async with running(heartbeat=60.0, listener=listener) as rt:
            await wait_state(h.id, "running")  # claimed and committed; the claim itself still waits
            assert h.id not in rt.in_hand
            assert await asyncio.to_thread(jobs.cancel, h.id)
            await asyncio.wait_for(cancel_heard.wait(), 5.0)
            await locker.execute("SELECT pg_advisory_unlock(727)")
            await wait_state(h.id, "cancelled", timeout=5.0)
    finally:
        await locker.close()
        await listener.aclose()
    assert q(jobs_db, "SELECT count(*) FROM job_runs WHERE job_id = %s AND phase = 'done'", (h.id,)) == [(0,)]


async def test_a_job_past_its_timeout_when_the_runtime_gives_its_jobs_back_still_fails_by_it(jobs_db: str) -> None:
    """A stop that gives back the jobs in hand (a second signal, or the shutdown timeout's end)
    while an async job that passed its timeout has not ended yet (it swallows the cancel, or its
    cleanup is slow): the attempt fails by its timeout, as it would have a moment later. It was
    given back with its attempt unspent, to run again as if it had never passed its timeout."""
    h = await sample_jobs.deaf_to_timeout.aenqueue("deaf-stopped")
    deaf: list[asyncio.Task[Any]] = []
    try:
        async with running(concurrency=1) as rt:
            await async_wait_for(lambda: h.id in rt.in_hand and rt.in_hand[h.id].ctx._timed_out, 5.0,
                                 message="the job to pass its timeout")
            deaf.append(rt.in_hand[h.id].task)
            rt.stop(now=True)  # within its grace (runtime.TIMEOUT_GRACE)
    finally:
        q(jobs_db, "INSERT INTO job_flags (name) VALUES ('deaf-stopped')")  # its task ends
        # Before this test's loop closes: a task left running there (and the pool it reads its
        # flag through) would be finalized at some later garbage collection, in another test.
        await asyncio.wait(deaf, timeout=10)
    info = jobs.get_job(h.id)
    assert info is not None
    assert (info.state, info.attempt, info.error) == ("failed", 1, "TimeoutError: timed out after 0.2 s")
    assert names_of(jobs_db, h.id) == ["enqueued/available", "started/running", "failed/failed"]


async def test_a_cancel_sent_while_the_runtimes_listener_was_away_stops_its_job_once_it_is_back(
        jobs_db: str, pg_admin_url: str) -> None:
    """A cancel whose notification came while the runtime's listener was away (its connection
    lost, the database refusing a new one) stops the job once the listener is back, as its
    resync checks the jobs in hand: not at the next heartbeat (a minute here)."""
    h = await sample_jobs.wait_flag.aenqueue("never-set")
    name = "test-jobs-listener-away"
    listener = Listener(jobs_db, name=name)
    try:
        async with running(heartbeat=60.0, listener=listener):
            await wait_state(h.id, "running")
            dbname = services.dbname_of(jobs_db)
            with services.pg_refusing_connections(pg_admin_url, dbname):
                assert await asyncio.to_thread(services.pg_terminate, pg_admin_url, dbname, name) == 1
                assert await jobs.acancel(h.id)  # on a connection the pool already holds
            await wait_state(h.id, "cancelled", timeout=15.0)
    finally:
        await listener.aclose()


async def test_a_job_given_back_runs_again_without_the_old_runs_progress(jobs_db: str) -> None:
    """A job a stopping runtime gave back (attempt not spent) shows no progress when it starts
    again: the progress its given-back run reported is not the new run's."""
    async with running():
        h = await sample_jobs.progress_then_wait.aenqueue("before the give-back", "given back")

        async def reported() -> bool:
            s = await asyncio.to_thread(jobs.job_state, h.id)
            return s is not None and s["progress"]["message"] == "before the give-back"

        await async_wait_for(reported, 10.0, message="the first run's progress to be written")
    assert await state_of(h.id) == "available", "given back when its runtime stopped at once"
    await asyncio.to_thread(q, jobs_db, "INSERT INTO job_flags VALUES ('given back')")
    async with running():
        await wait_state(h.id, "succeeded", timeout=10.0)
    evs = await asyncio.to_thread(events_of, jobs_db, h.id)
    starts = [i for i, e in enumerate(evs) if e["event"] == "started"]
    assert len(starts) == 2, [e["event"] for e in evs]
    assert [e["job"]["attempt"] for e in evs[starts[0]:]].count(1) >= 2, "the same attempt ran twice"
    for e in evs[starts[0] + 1:starts[-1] + 1]:
        if e["event"] != "progress":
            assert e["job"]["progress"] == {"done": 0, "total": None, "message": None}, e


async def test_a_stopping_runtime_never_claims_again_the_job_it_gives_back(jobs_db: str) -> None:
    """A claim already on its way when the runtime stops returns before the jobs in hand are given
    back: run after the give-back had committed, it would take the job just given back, and the
    job's page would show a start that never ran."""
    h = await sample_jobs.wait_flag.aenqueue("never-set")
    on_the_wire: list[asyncio.Task[int]] = []
    async with running(concurrency=2) as rt:
        await wait_state(h.id, "running")
        claim = rt._claim_starting

        async def given_back() -> bool:
            return await state_of(h.id) == "available"

        async def slow_on_the_wire(free: int) -> int:
            # Held until the job is given back, or for one second at most (the stop waits longer
            # than that for a claim), as a statement slowed on its way to the server would be; and,
            # as one already sent, not called back by the stop.
            async def sent() -> int:
                with contextlib.suppress(AssertionError):
                    await async_wait_for(given_back, 1.0)
                return await claim(free)

            on_the_wire.append(asyncio.create_task(sent()))
            return await asyncio.shield(on_the_wire[-1])

        rt._claim_starting = slow_on_the_wire  # type: ignore[method-assign]
        rt._doorbell.set()
        await async_wait_for(lambda: on_the_wire, 5.0, message="a claim on its way")
    await asyncio.wait(on_the_wire, timeout=5.0)
    assert names_of(jobs_db, h.id) == ["enqueued/available", "started/running", "enqueued/available"]


async def test_a_job_released_at_deregistration_runs_again_without_the_old_runs_progress(jobs_db: str) -> None:
    """Deregistering gives back what still runs under the runtime (attempt not spent); the run
    that follows shows no progress until it reports its own."""
    from psycopg_pool import AsyncConnectionPool

    from livepush.jobs.runtime import maintenance

    # Deregistered by the test, the runtime runs on without a row until its next beat registers
    # it again, and it claims the job given back at once: a rescue in between (one a beat started
    # before the deregistration, late on a loaded machine) releases that claim as an orphan's, and
    # the job starts a third time. A beat far off, and its first rescue over, leave no rescue then.
    async with running(heartbeat=60.0) as rt:
        await async_wait_for(lambda: rt._rescuing is not None and rt._rescuing.done(), 10.0,
                             message="the rescue after the runtime's first beat to end")
        h = await sample_jobs.progress_then_wait.aenqueue("before the release", "released")

        async def reported() -> bool:
            s = await asyncio.to_thread(jobs.job_state, h.id)
            return s is not None and s["progress"]["message"] == "before the release"

        await async_wait_for(reported, 10.0, message="the first run's progress to be written")
        async with AsyncConnectionPool(jobs_db, min_size=1, max_size=1, open=False) as pool:
            assert (await maintenance.deregister(pool, rt.id))[0] == 1
        await asyncio.to_thread(q, jobs_db, "INSERT INTO job_flags VALUES ('released')")
        await wait_state(h.id, "succeeded", timeout=10.0)
    evs = await asyncio.to_thread(events_of, jobs_db, h.id)
    starts = [i for i, e in enumerate(evs) if e["event"] == "started"]
    assert len(starts) == 2, [e["event"] for e in evs]
    for e in evs[starts[0] + 1:starts[1] + 1]:
        if e["event"] != "progress":
            assert e["job"]["progress"] == {"done": 0, "total": None, "message": None}, e


# The database's clock, made to step: `now()` is the real one plus `test_clock.skew`, for every
# session the runtimes open from then on (public is searched before pg_catalog).
SKEWED_CLOCK = """
CREATE TABLE test_clock (skew interval NOT NULL);
INSERT INTO test_clock VALUES ('0');
CREATE FUNCTION public.now() RETURNS timestamptz LANGUAGE sql STABLE
AS $$ SELECT pg_catalog.now() + (SELECT skew FROM public.test_clock) $$;
"""


async def test_a_step_of_the_databases_clock_never_gets_a_live_runtime_presumed_dead(jobs_db: str) -> None:
    """The database's clock steps forward (a correction, a host resumed) by more than three of one
    runtime's beats but less than another's beat: to the latter, whose own beats show no gap, the
    former looks silent until it beats again. It must count silence only from the step, as after
    an outage, or the live runtime's jobs are taken from it and run again."""
    q(jobs_db, SKEWED_CLOCK)
    q(jobs_db, psycopg.sql.SQL("ALTER DATABASE {} SET search_path = public, pg_catalog").format(
        psycopg.sql.Identifier(services.dbname_of(jobs_db))).as_string(None))
    async with running(queues=["default"], heartbeat=1.0) as holder:
        h = await sample_jobs.wait_flag.aenqueue("go")
        await async_wait_for(lambda: h.id in holder.in_hand, 5.0, message="the job to be in hand")

        def holder_beat() -> Any:
            return q(jobs_db, "SELECT heartbeat_at FROM livepush_job_runtimes WHERE id = %s", (holder.id,))

        # The watcher beats half a beat of the holder's after it, so that the step comes between them.
        last = await asyncio.to_thread(holder_beat)
        await async_wait_for(lambda: asyncio.to_thread(lambda: holder_beat() != last), 10.0,
                             message="the holder to beat")
        await asyncio.sleep(0.5)
        async with running(queues=["second"], heartbeat=5.0, retention=None) as watcher:

            def watcher_beat() -> Any:
                return q(jobs_db, "SELECT heartbeat_at FROM livepush_job_runtimes WHERE id = %s", (watcher.id,))

            first = await asyncio.to_thread(watcher_beat)
            await async_wait_for(lambda: asyncio.to_thread(lambda: watcher_beat() != first), 10.0,
                                 message="the watcher to beat")
            beat = await asyncio.to_thread(watcher_beat)
            # Not an event to await: the step must come just before the watcher's next beat (every
            # 5 s) and the rescue that follows it, while the holder's last beat is half a beat old.
            await asyncio.sleep(4.85)
            await asyncio.to_thread(q, jobs_db, "UPDATE test_clock SET skew = '4.5 s'")
            await async_wait_for(lambda: asyncio.to_thread(lambda: watcher_beat() != beat), 10.0,
                                 message="the watcher to beat after the step")
            # Its rescue follows that beat at once; the holder's next beat comes half a second later.
            stepped = await asyncio.to_thread(watcher_beat)
            await async_wait_for(lambda: asyncio.to_thread(lambda: holder_beat() > stepped), 10.0,
                                 message="the holder to beat after the watcher's rescue")
            # Its job was never taken from it (a rescue clears runtime_id): still its own, on its first attempt.
            assert q(jobs_db, """SELECT j.state, j.attempt, j.runtime_id, r.id IS NOT NULL
                                 FROM livepush_jobs j LEFT JOIN livepush_job_runtimes r ON r.id = j.runtime_id
                                 WHERE j.id = %s""", (h.id,)) == [("running", 1, holder.id, True)]
        q(jobs_db, "INSERT INTO job_flags VALUES ('go')")
        await wait_state(h.id, "succeeded")
    assert q(jobs_db, "SELECT attempt FROM job_runs WHERE job_id = %s AND phase = 'start'", (h.id,)) == [(1,)]


async def test_a_runtime_that_ran_refuses_to_run_again_saying_to_make_a_new_one(jobs_db: str) -> None:
    """An embedder that starts a stopped Runtime again is told to make a new one: the second run()
    returned at once, as if it had run, and the jobs it was meant to serve waited for nothing."""
    from livepush import ConfigError

    rt = Runtime(REGISTRY, install_signals=False, queues=["default"], heartbeat=0.2)
    task = asyncio.create_task(rt.run())
    await rt.wait_started()
    rt.stop()
    await asyncio.wait_for(task, 10)
    with pytest.raises(ConfigError, match="runs once: make a new Runtime"):
        await asyncio.wait_for(rt.run(), 10)
    assert q(jobs_db, "SELECT count(*) FROM livepush_job_runtimes")[0][0] == 0


async def test_a_claim_connection_the_server_closed_while_idle_is_reopened_without_a_failed_claim(
        jobs_db: str, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    """Postgres may close an idle connection (idle_session_timeout, a restart of a pooler, an
    operator's pg_terminate_backend). A claim connection closed so after the claim's check for
    it (the close landing in between) is found by the claim's failure, which opens a new one and
    claims at once: the job runs, and nothing is logged as a failed claim (no WARNING for a
    routine close)."""

    async def unseen(conn: Any) -> bool:
        return False  # the close lands after the claim's check for one closed while idle

    monkeypatch.setattr(runtime, "aclosed_while_idle", unseen)
    async with running(poll_interval=60) as rt:
        first = sample_jobs.record.enqueue("before the close")
        await wait_state(first.id, "succeeded", timeout=10.0)
        # Idle between claims: the next one comes at the doorbell of the enqueue below.
        await async_wait_for(lambda: rt._claim_returned.is_set(), 5, message="the runtime between claims")
        assert rt._claim_conn is not None
        q(jobs_db, "SELECT pg_terminate_backend(%s)", (rt._claim_conn.info.backend_pid,))
        with caplog.at_level("INFO", logger="livepush.jobs"):
            h = sample_jobs.record.enqueue("after the close")
            await wait_state(h.id, "succeeded", timeout=10.0)
    assert "claim failed" not in caplog.text, caplog.text
    assert "claiming again on a new one" in caplog.text, caplog.text


class _SleepsForEver:
    """The part of a JobContext a sync job's ctx.sleep calls: a sleep that never returns."""

    job_id = 7

    def __init__(self) -> None:
        self.sleep = Stuck()


def test_a_sync_jobs_context_call_ends_when_the_runtimes_loop_stops_under_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """A sync job's blocking ctx calls (ctx.sleep here; checkpoint, run_child, wait_for_signal
    likewise) run on the runtime's loop and wait for it in the job's thread. Should that loop stop
    and close while one waits (the runtime shutting down under the job), the call raises
    RuntimeStoppedError within a bound and the thread ends, instead of waiting for ever; a call
    made after that raises at once."""
    from livepush.jobs.errors import RuntimeStoppedError
    from livepush.jobs.runtime import threads
    from livepush.jobs.runtime.context import SyncJobContext

    monkeypatch.setattr(threads, "LOOP_CHECK", 0.1)
    runtime_loop, inner = LoopThread(), _SleepsForEver()
    ctx = SyncJobContext(inner, runtime_loop.loop)  # type: ignore[arg-type]
    job = Caller(lambda: ctx.sleep("cool-down", 60))
    assert inner.sleep.started.wait(5)
    runtime_loop.stop()
    assert job.ended(5), "the sync job's ctx.sleep still waits on a loop that stopped"
    assert isinstance(job.error, RuntimeStoppedError), job.error
    assert "stopped" in str(job.error) and "runs again" in str(job.error), job.error
    # Not a TimeoutError: a job's `except TimeoutError:` around a wait_for_signal is its own
    # timeout branch (escalate, notify someone), which a shutdown must not run.
    assert not isinstance(job.error, TimeoutError)

    started = time.monotonic()
    with pytest.raises(RuntimeStoppedError):
        ctx.sleep("again", 60)  # the loop is closed now
    assert time.monotonic() - started < 1


def test_a_sync_jobs_context_call_on_a_loop_closed_under_it_logs_no_traceback(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """A runtime's loop closed while a sync job's ctx call waited on it (livepush.loops.run closes
    it without a task that did not end within its 2 s): the job gets RuntimeStoppedError, and the
    log gets no "exception calling callback" error with a traceback from calling the call off on
    a loop that can no longer take it."""
    from livepush.jobs.errors import RuntimeStoppedError
    from livepush.jobs.runtime import threads
    from livepush.jobs.runtime.context import SyncJobContext

    monkeypatch.setattr(threads, "LOOP_CHECK", 0.1)
    runtime_loop, inner = LoopThread(), _SleepsForEver()
    job = Caller(lambda: SyncJobContext(inner, runtime_loop.loop).sleep("cool-down", 60))  # type: ignore[arg-type]
    assert inner.sleep.started.wait(5)
    with caplog.at_level("ERROR"):
        runtime_loop.stop()  # it closes before the job's thread looks again
        assert job.ended(5)
    assert isinstance(job.error, RuntimeStoppedError), job.error
    assert "exception calling callback" not in caplog.text, caplog.text


def test_a_sync_jobs_context_call_the_stopping_loop_cancels_raises_runtime_stopped() -> None:
    """A runtime's loop ends (livepush.loops.run) by cancelling every task still on it, a sync
    job's ctx call among them: the job's thread gets RuntimeStoppedError, not the bare
    concurrent.futures.CancelledError that says nothing of why."""
    from livepush.jobs.errors import RuntimeStoppedError
    from livepush.jobs.runtime.context import SyncJobContext

    runtime_loop, inner = LoopThread(), _SleepsForEver()
    try:
        job = Caller(lambda: SyncJobContext(inner, runtime_loop.loop).sleep("cool-down", 60))  # type: ignore[arg-type]
        assert inner.sleep.started.wait(5)
        runtime_loop.cancel_all()
        assert job.ended(5)
        assert isinstance(job.error, RuntimeStoppedError), job.error
    finally:
        runtime_loop.stop()


async def test_a_claim_connection_the_server_closed_while_idle_is_replaced_before_the_claim(
        jobs_db: str, caplog: pytest.LogCaptureFixture) -> None:
    """A claim connection whose server hung up while it sat idle has the server's goodbye waiting
    on its socket: the next claim sees it and claims on a new connection, so no claim fails on it
    (nothing to give back, no second try). The claims on a live connection keep it."""
    async with running(poll_interval=60) as rt:
        first = sample_jobs.record.enqueue("before the close")
        await wait_state(first.id, "succeeded", timeout=10.0)
        await async_wait_for(lambda: rt._claim_returned.is_set(), 5, message="the runtime between claims")
        kept = rt._claim_conn
        assert kept is not None
        second = sample_jobs.record.enqueue("on a live connection")
        await wait_state(second.id, "succeeded", timeout=10.0)
        assert rt._claim_conn is kept
        await async_wait_for(lambda: rt._claim_returned.is_set(), 5, message="the runtime between claims")
        pid = kept.info.backend_pid
        q(jobs_db, "SELECT pg_terminate_backend(%s)", (pid,))
        # Gone from the server: its goodbye (a FATAL message, then the close) is on the socket.
        await async_wait_for(
            lambda: not q(jobs_db, "SELECT 1 FROM pg_stat_activity WHERE pid = %s", (pid,)), 5,
            message="the claim connection's backend to exit")
        with caplog.at_level("INFO", logger="livepush.jobs"):
            h = sample_jobs.record.enqueue("after the close")
            await wait_state(h.id, "succeeded", timeout=10.0)
    assert "claim failed" not in caplog.text, caplog.text
    assert "claiming again" not in caplog.text, caplog.text
    assert "closed by the server while idle" in caplog.text, caplog.text


async def test_a_fan_out_that_keeps_failing_is_said_once_a_minute_not_at_every_beat_that_changes_the_jobs_in_hand(
        jobs_db: str, caplog: pytest.LogCaptureFixture) -> None:
    """A runtime publishes its own state at each beat whose jobs in hand changed. While its fan-out
    is away (Redis down, the jobs going on in Postgres) each of those publications failed with a
    WARNING of its own: a line a beat on a busy runtime for as long as the outage lasted. They are
    said as the runtime's other failing loops are, at most once a minute, with the database's or
    Redis' own words, and the jobs run on."""
    from livepush.errors import DependencyError
    from livepush.fanout.local import LocalFanOut

    class Away(LocalFanOut):
        attempts: list[str] = []

        async def apublish(self, topic: str, data: object, *, conn: object = None) -> str:  # type: ignore[override]
            self.attempts.append(topic)
            raise DependencyError("Redis at redis://127.0.0.1:1/0 failed while publishing (Connection refused)")

    fanout = Away()
    caplog.set_level(logging.WARNING, "livepush.jobs")
    async with running(queues=["default"], heartbeat=0.1, publisher=fanout):
        handles = []
        for n in range(6):
            handles.append(await sample_jobs.hold.aenqueue(0.15))
            await async_wait_for(lambda: sum(t.startswith("runtime:") for t in fanout.attempts) >= n + 1, 10.0,
                                 message="a beat publishing the runtime's state")
        for h in handles:
            await wait_state(h.id, "succeeded")
    said = [r.getMessage() for r in caplog.records if "could not publish runtime state" in r.getMessage()]
    assert sum(t.startswith("runtime:") for t in fanout.attempts) >= 6
    assert len(said) == 1 and "Connection refused" in said[0], said


async def test_a_runtime_state_topic_refused_alone_leaves_the_other_published(jobs_db: str) -> None:
    """A fan-out that refuses `runtime:<id>` alone (an ACL rule of that topic) still gets the
    runtime's state on `runtimes`, which the operators' page of every runtime reads."""
    from livepush.errors import ConfigError
    from livepush.fanout.local import LocalFanOut

    class RefusesOne(LocalFanOut):
        published: list[str] = []

        async def apublish(self, topic: str, data: object, *, conn: object = None) -> str:  # type: ignore[override]
            if topic.startswith("runtime:"):
                raise ConfigError("NOPERM this user has no permissions to access one of the channels")
            self.published.append(topic)
            return await super().apublish(topic, data)  # type: ignore[arg-type]

    fanout = RefusesOne()
    async with running(queues=["default"], publisher=fanout):
        await async_wait_for(lambda: "runtimes" in fanout.published, 10.0,
                             message="the runtime's state on runtimes, beside the refused runtime:<id>")
