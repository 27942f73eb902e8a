"""Workflows where pauses, signals and a run's end meet (docs/workflows.md): a fan-out step resumed
twice counts every batch, a signal sent while its step is paused is kept for it, and a run that
ends stops its other steps, so none is left parked and a finished run never shows a failed step."""

from __future__ import annotations

import asyncio
import gc
import json
import threading
import warnings
from typing import Any

import psycopg
import pytest

from livepush import jobs
from livepush.jobs.api.registry import REGISTRY, Registry
from livepush.jobs.groups.transactions import in_tx
from livepush.jobs.workflows import operators
from tests.jobs import workflow_corner_defs as wc
from tests.jobs import workflow_crash_defs as cd
from tests.jobs.conftest import q, running
from tests.jobs.test_workflows import run_state, step_states
from tests.support.waiting import async_wait_for


async def job_ended(url: str, name: str) -> str | None:
    """The state of the (one) job named `name` once it finished, else None."""
    got = q(url, "SELECT state FROM livepush_jobs WHERE name = %s", (name,))
    return got[0][0] if got and got[0][0] in ("succeeded", "failed", "cancelled") else None


async def step_is(run_id: int, step: str, state: str) -> bool:
    got = jobs.workflows.get(run_id)
    return got is not None and got["steps"][step]["state"] == state


async def test_a_fan_out_step_resumed_twice_counts_every_batch(jobs_db: str) -> None:
    """Paused twice by failed members and resumed twice, a fan-out step outputs the counts of all
    its members: the batches add up."""
    q(jobs_db, cd.RUNS_TABLE)
    async with running(queues=[cd.QUEUE], concurrency=8):
        run = await cd.fan.astart({"n": 4, "failing": {"0": 2, "1": 1}})
        for _ in range(2):
            await run_state(run.id, "paused")
            assert await jobs.workflows.aresume(run.id, actor="ana")
        done = await run_state(run.id, "succeeded")
    assert done["steps"]["spread"]["output"] == {"total": 4, "succeeded": 4, "failed": 0, "cancelled": 0}
    assert done["steps"]["report"]["output"] == {"rows": done["steps"]["spread"]["output"], "n": 4}
    assert q(jobs_db, "SELECT count(*) FROM livepush_jobs WHERE name = 'wfc.member'") == [(4 + 2 + 1,)]


async def test_a_signal_sent_while_its_step_is_paused_is_kept_for_it(jobs_db: str) -> None:
    """A step that paused the run after its signal came waits again once resumed: a signal sent
    while it was paused is kept for its next job, and audited once."""
    async with running(queues=[wc.QUEUE]):
        run = await wc.approve_twice.astart()
        await jobs.workflows.asignal(run.id, "go", {"pause": True}, actor="ana")
        await run_state(run.id, "paused")
        await jobs.workflows.asignal(run.id, "go", {"by": "bo"}, actor="bo")
        assert await jobs.workflows.aresume(run.id, actor="bo")
        done = await run_state(run.id, "succeeded")
    assert done["steps"]["approve"]["output"] == {"by": "bo"}
    assert [(a["verb"], a["actor"]) for a in done["audit"]] == [
        ("signal", "ana"), ("pause", "step:approve"), ("signal", "bo"), ("resume", "bo")]


async def test_a_flow_verbs_reason_with_characters_postgres_cannot_store_is_kept_readable(jobs_db: str) -> None:
    """ctx.flow.skip(reason) with a NUL or a lone surrogate in its reason (text taken from the
    data) skips the step as asked: the characters Postgres cannot store read as U+FFFD in the
    audit, rather than the step's end failing to be written and failing the run."""
    async with running(queues=[wc.QUEUE]):
        run = await wc.skips_oddly.astart()
        done = await run_state(run.id, "succeeded")
    assert step_states(done) == {"odd": "skipped", "after_odd": "succeeded"}
    assert [(a["verb"], a["reason"]) for a in done["audit"]] == [("skip", "bad\ufffdrow \ufffd in the input")]


async def test_a_run_that_fails_stops_the_step_waiting_for_a_signal(jobs_db: str) -> None:
    """When a step fails the run, a step parked on a signal that can no longer come is cancelled
    with its job, instead of waiting for ever."""
    async with running(queues=[wc.QUEUE]):
        run = await wc.fails_while_waiting.astart()
        await async_wait_for(lambda: step_is(run.id, "waits", "waiting"), 10.0, message="the step to park")
        q(jobs_db, "INSERT INTO job_flags VALUES ('break-now')")
        done = await run_state(run.id, "failed")
        assert await async_wait_for(lambda: job_ended(jobs_db, "wfd_fails_while_waiting.waits"), 10.0,
                                    message="the parked step's job to end") == "cancelled"
    assert step_states(done) == {"start": "succeeded", "breaks": "failed", "waits": "cancelled"}


async def test_a_run_that_fails_stops_its_parked_step_while_a_caller_holds_a_signal_to_its_job(jobs_db: str) -> None:
    """A step parked on a signal is cancelled when a sibling fails the run, also while a caller's
    open transaction has sent its job a signal of another name (jobs.signal(conn=), which key-share
    locks the job's row until it commits): the run's stop passed over the row as busy, and the
    job was left parked for ever."""
    async with running(queues=[wc.QUEUE]):
        run = await wc.fails_while_waiting.astart()
        await async_wait_for(lambda: step_is(run.id, "waits", "waiting"), 10.0, message="the step to park")
        [(job_id,)] = q(jobs_db, "SELECT id FROM livepush_jobs WHERE name = 'wfd_fails_while_waiting.waits'")
        with psycopg.connect(jobs_db) as conn:
            await asyncio.to_thread(jobs.signal, job_id, "note", {"by": "ana"}, conn=conn)
            q(jobs_db, "INSERT INTO job_flags VALUES ('break-now')")
            done = await run_state(run.id, "failed")
            conn.commit()
        assert await async_wait_for(lambda: job_ended(jobs_db, "wfd_fails_while_waiting.waits"), 10.0,
                                    message="the parked step's job to end") == "cancelled"
    assert step_states(done) == {"start": "succeeded", "breaks": "failed", "waits": "cancelled"}


async def test_a_callers_open_signal_to_a_step_holds_up_only_its_own_run(jobs_db: str) -> None:
    """A caller's open transaction that woke a parked step's job (jobs.signal(conn=)) holds its
    run's row until it commits. A claim that took a job of another step of that run waited for
    that row, and the runtime started nothing at all meanwhile: another run's step and a plain job
    waited for the caller's commit. Now the claim passes over that run's steps, and they start
    once the caller commits, each once."""
    only_parked = Registry()
    only_parked.add(REGISTRY.get("wfd_parks_beside.parked"))
    run = await wc.parks_beside.astart()
    # A runtime that defines only `parked` parks it and leaves `beside` available.
    async with running(registry=only_parked, queues=[wc.QUEUE]):
        await async_wait_for(lambda: step_is(run.id, "parked", "waiting"), 10.0, message="the step to park")
    [(job_id,)] = q(jobs_db, "SELECT id FROM livepush_jobs WHERE name = 'wfd_parks_beside.parked'")
    with psycopg.connect(jobs_db) as conn:
        await asyncio.to_thread(jobs.signal, job_id, "note", {"by": "ana"}, conn=conn)
        # A poll far longer than the test: what starts the held run's steps is the commit's ring.
        async with running(queues=[wc.QUEUE], poll_interval=60.0):
            other = await wc.floats.astart()
            await wc.plain.aenqueue()
            await run_state(other.id, "succeeded")
            await async_wait_for(lambda: job_ended(jobs_db, "wfd.plain"), 10.0, message="the plain job to end")
            assert step_states(await jobs.workflows.aget(run.id)) == {"parked": "waiting", "beside": "running"}
            assert q(jobs_db, "SELECT state, attempt FROM livepush_jobs WHERE name = 'wfd_parks_beside.beside'") \
                == [("available", 0)]
            conn.commit()
            done = await run_state(run.id, "succeeded")
    assert done["steps"]["parked"]["output"] == {"by": "ana"} and done["steps"]["beside"]["output"] == "beside"
    assert {s["attempt"] for s in done["steps"].values()} == {1}
    assert await job_ended(jobs_db, "wfd.plain") == "succeeded"


async def test_a_step_passed_over_for_its_busy_run_is_claimed_again_without_a_ring(jobs_db: str) -> None:
    """A claim passes over the steps of a run whose row someone holds, and the holder may ring
    nothing at its commit (another runtime's claim of a sibling step, a park of one): the runtime
    claims again within a moment, not at its next poll, and the step starts once."""
    run = await wc.floats.astart()
    with psycopg.connect(jobs_db) as conn:
        conn.execute("SELECT 1 FROM livepush_workflows WHERE id = %s FOR NO KEY UPDATE", (run.id,))
        async with running(queues=[wc.QUEUE], poll_interval=60.0):
            # A plain job that ran: the runtime has claimed, and passed the run over, meanwhile.
            await wc.plain.aenqueue()
            await async_wait_for(lambda: job_ended(jobs_db, "wfd.plain"), 10.0, message="the plain job to end")
            assert q(jobs_db, "SELECT state FROM livepush_jobs WHERE name = 'wfd_floats.measure'") == [("available",)]
            conn.commit()
            done = await run_state(run.id, "succeeded", timeout=10.0)
    assert done["steps"]["measure"]["attempt"] == 1


@pytest.mark.parametrize("flow", [wc.waits_for_its_own, wc.sync_waits_for_its_own], ids=["async", "sync"])
async def test_a_step_waiting_in_its_body_for_its_own_wait_for_signal_is_refused_at_once(
        jobs_db: str, flow: Any) -> None:
    """A step's wait_for= signal is taken before its body runs (ctx.signal), and no second one
    ever reaches the step's job (jobs.workflows.signal gives each step one, jobs.signal refuses
    the name): a ctx.wait_for_signal() of that name in the body would wait until its timeout.
    It is refused at the call, saying to read ctx.signal, and the step fails without retries."""
    from livepush.jobs.errors import WorkflowStepWaitError

    async with running(queues=[wc.QUEUE]):
        run = await flow.astart()
        await jobs.workflows.asignal(run.id, "go", {"by": "ana"}, actor="ana")
        done = await run_state(run.id, "failed")
    (step,) = done["steps"]
    assert WorkflowStepWaitError.__name__ in done["steps"][step]["error"]
    assert "ctx.signal" in done["steps"][step]["error"]
    assert q(jobs_db, "SELECT attempt FROM livepush_jobs WHERE name = %s", (f"{flow.name}.{step}",)) == [(1,)]


@pytest.mark.parametrize(("flow", "given"), [(wc.waits_for_no_name, ", timeout=5"), (wc.sync_waits_for_no_name, "")],
                         ids=["async", "sync"])
async def test_a_step_waiting_for_a_signal_it_does_not_name_fails_at_once_saying_the_call(
        jobs_db: str, flow: Any, given: str) -> None:
    """ctx.wait_for_signal() with its name left out, in a step as in a job's code: refused as the
    call's own mistake, and the step fails at its first attempt. Python's TypeError was retried,
    and each retry ran the step's code up to the call again to meet it again."""
    async with running(queues=[wc.QUEUE]):
        run = await flow.astart()
        done = await run_state(run.id, "failed")
    (step,) = done["steps"]
    assert (f"ctx.wait_for_signal() takes the name of the signal to wait for: "
            f"ctx.wait_for_signal('approved'{given})") in done["steps"][step]["error"]
    assert q(jobs_db, "SELECT attempt FROM livepush_jobs WHERE name = %s", (f"{flow.name}.{step}",)) == [(1,)]


async def test_a_run_that_finished_early_stops_its_running_sibling(jobs_db: str) -> None:
    """ctx.flow.finish() ends the run as succeeded: a step still running beside it is stopped
    (its job cancelled, the step skipped), so the run never shows a failed step."""
    async with running(queues=[wc.QUEUE]):
        run = await wc.finishes_early.astart()
        await async_wait_for(lambda: step_is(run.id, "slow_sibling", "running"), 10.0,
                             message="the sibling to run")
        q(jobs_db, "INSERT INTO job_flags VALUES ('finish-now')")
        await run_state(run.id, "succeeded")
        ended = await async_wait_for(lambda: job_ended(jobs_db, "wfd_finishes_early.slow_sibling"), 10.0,
                                     message="the sibling's job to end")
        q(jobs_db, "INSERT INTO job_flags VALUES ('sibling-go')")
    assert ended == "cancelled"
    done = jobs.workflows.get(run.id)
    assert done["state"] == "succeeded" and done["output"] == {"early": True}
    assert step_states(done) == {"first": "succeeded", "done_early": "succeeded", "slow_sibling": "skipped"}


async def test_a_signal_kept_for_a_step_that_is_skipped_goes_with_it(jobs_db: str) -> None:
    """A signal sent before its step started is kept for that step: skipped before it started,
    the step takes its signal with it, so the next step waiting for that name still waits for a
    signal of its own (which is accepted, not refused as if that step had one)."""
    async with running(queues=[wc.QUEUE]):
        run = await wc.two_approvals.astart()
        await jobs.workflows.asignal(run.id, "go", {"by": "ana"}, actor="ana")
        assert await jobs.workflows.askip(run.id, "legal", actor="ana", reason="not needed")
        q(jobs_db, "INSERT INTO job_flags VALUES (%s)", (f"gather-{run.id}",))
        await async_wait_for(lambda: step_is(run.id, "finance", "waiting"), 10.0,
                             message="finance to wait for a signal of its own")
        await jobs.workflows.asignal(run.id, "go", {"by": "bo"}, actor="bo")
        done = await run_state(run.id, "succeeded")
    assert step_states(done) == {"gather": "succeeded", "legal": "skipped", "finance": "succeeded"}
    assert done["steps"]["finance"]["output"] == {"by": "bo"}


async def test_skipping_a_step_before_what_it_comes_after_finished_keeps_the_order(jobs_db: str) -> None:
    """Skipped, a step counts as succeeded for what comes after it: so what comes after it still
    waits for what the skipped step came after (as it would have had the step run), and sees
    its output."""
    async with running(queues=[wc.QUEUE]):
        run = await wc.chain.astart()
        await async_wait_for(lambda: step_is(run.id, "load", "running"), 10.0, message="load to run")
        assert await jobs.workflows.askip(run.id, "check", actor="ana", reason="checked by hand")
        assert step_states(await jobs.workflows.aget(run.id)) == {"load": "running", "check": "skipped", "publish": "pending"}
        q(jobs_db, "INSERT INTO job_flags VALUES (%s)", (f"load-{run.id}",))
        done = await run_state(run.id, "succeeded")
    assert step_states(done) == {"load": "succeeded", "check": "skipped", "publish": "succeeded"}
    assert done["steps"]["publish"]["output"] == {"saw": ["load"]}


async def test_signals_sent_at_once_before_their_steps_started_are_kept_one_for_each_step(jobs_db: str) -> None:
    """Each step that waits for a name takes one signal of it, also of signals sent at the same
    time before either step started: two of them are kept one for each step, never both for the
    first (the second step would then wait for a third)."""
    runs = [await wc.two_approvals.astart() for _ in range(5)]
    for run in runs:
        await asyncio.gather(jobs.workflows.asignal(run.id, "go", {"by": "ana"}, actor="ana"),
                             jobs.workflows.asignal(run.id, "go", {"by": "bo"}, actor="bo"))
        assert sorted(step for (step,) in q(jobs_db, "SELECT step FROM livepush_workflow_signals "
                                                     "WHERE workflow_id = %s", (run.id,))) == ["finance", "legal"]
    async with running(queues=[wc.QUEUE]):
        for run in runs:
            q(jobs_db, "INSERT INTO job_flags VALUES (%s)", (f"gather-{run.id}",))
        for run in runs:
            done = await run_state(run.id, "succeeded")
            assert {done["steps"]["legal"]["output"]["by"], done["steps"]["finance"]["output"]["by"]} == {"ana", "bo"}


async def signal_meanwhile(url: str, run_id: int, data: Any, actor: str) -> threading.Thread:
    """jobs.workflows.signal(run_id, "go", ...) in a thread of its own, returned once it has ended
    or waits for a lock (another transaction holds what it needs)."""
    thread = threading.Thread(target=jobs.workflows.signal, args=(run_id, "go", data), kwargs={"actor": actor})
    thread.start()
    await async_wait_for(lambda: not thread.is_alive() or q(
        url, "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
             "AND wait_event_type = 'Lock'")[0][0] > 0, 10.0, message="the signal to end or wait for a lock")
    return thread


async def test_signals_sent_at_once_to_started_steps_go_one_to_each_step(jobs_db: str) -> None:
    """Each step that waits for a name takes one signal of it, also of signals sent at the same time
    while both steps' jobs exist: the second goes to the other step. (Both went to the first step's
    job, whose wait took one: the other lay there unread, audited as delivered, and the second step
    waited for a signal that had come.) The first signal's transaction is held open here, so that
    the second is sent while it has not committed."""
    run = await wc.side_approvals.astart()
    data = json.dumps({"by": "ana"})
    with psycopg.connect(jobs_db) as first:
        in_tx(lambda: operators._signal_steps(run.id, "go", data, "ana"), first)
        second = await signal_meanwhile(jobs_db, run.id, {"by": "bo"}, "bo")
        first.commit()
    await asyncio.to_thread(second.join, 10.0)
    assert not second.is_alive()
    assert [(a["actor"], a["step"]) for a in jobs.workflows.get(run.id)["audit"]] == [("ana", "north"), ("bo", "south")]
    async with running(queues=[wc.QUEUE]):
        done = await run_state(run.id, "succeeded")
    assert [done["steps"][n]["output"] for n in ("north", "south")] == [{"by": "ana"}, {"by": "bo"}]


async def test_a_signal_whose_step_is_skipped_while_it_is_sent_goes_to_the_next_step(jobs_db: str) -> None:
    """A signal goes to the first unfinished step that waits for its name: one whose step is skipped
    while the signal is on its way to the step's job goes to the next step instead, not to the job
    of a step that no longer runs (where it lay unread, audited as delivered, while the next step
    waited). The skip takes the run's row first here, and commits while the signal waits for it."""
    run = await wc.side_approvals.astart()
    with psycopg.connect(jobs_db) as operator:
        operator.execute("SELECT 1 FROM livepush_workflows WHERE id = %s FOR UPDATE", (run.id,))
        signal = await signal_meanwhile(jobs_db, run.id, {"by": "bo"}, "bo")
        in_tx(lambda: operators._verb_steps(run.id, "skip", "north", "ana", "not needed"), operator)
        operator.commit()
    await asyncio.to_thread(signal.join, 10.0)
    assert not signal.is_alive()
    assert [(a["verb"], a["step"]) for a in jobs.workflows.get(run.id)["audit"]] == [("skip", "north"),
                                                                                    ("signal", "south")]
    async with running(queues=[wc.QUEUE]):
        done = await run_state(run.id, "succeeded")
    assert step_states(done) == {"north": "skipped", "south": "succeeded"}
    assert done["steps"]["south"]["output"] == {"by": "bo"}


async def test_a_signal_whose_steps_job_stops_waiting_before_the_send_goes_to_the_next_step(
        jobs_db: str, monkeypatch: Any) -> None:
    """A step's job that stops waiting between the signal's look and its send (here it gets a
    signal of its own, sent to the job directly, at that moment) is passed: the signal goes to the
    next step that waits for its name, not kept for a step whose job will never read it."""
    run = await wc.side_approvals.astart()
    original = operators._to_job
    calls: list[str] = []

    def racing(run_id: int, step: dict[str, Any], name: str, data: str) -> Any:
        calls.append(step["name"])
        if len(calls) == 1:
            return False  # as if the first, unlocked look lost a race: the locked loop runs
        if len(calls) == 2:
            with psycopg.connect(jobs_db, autocommit=True) as other:
                other.execute("INSERT INTO livepush_job_signals (job_id, name, data) VALUES (%s, 'go', %s)",
                              (step["job_id"], json.dumps({"by": "eve"})))
        return (yield from original(run_id, step, name, data))

    monkeypatch.setattr(operators, "_to_job", racing)
    await asyncio.to_thread(jobs.workflows.signal, run.id, "go", {"by": "bo"}, actor="bo")
    assert calls[:2] == ["north", "north"]
    assert [(a["verb"], a["step"]) for a in jobs.workflows.get(run.id)["audit"]] == [("signal", "south")]
    monkeypatch.setattr(operators, "_to_job", original)
    async with running(queues=[wc.QUEUE]):
        done = await run_state(run.id, "succeeded")
    assert done["steps"]["north"]["output"] == {"by": "eve"}
    assert done["steps"]["south"]["output"] == {"by": "bo"}


async def test_float_outputs_reach_the_next_step_and_the_run_as_floats(jobs_db: str) -> None:
    """A step's output is JSON kept as it returned it, as a job's result is: a float that JSON
    text writes with an exponent (1e16) reaches the steps after it, get() and the run's output
    as a float, not as the int it equals."""
    async with running(queues=[wc.QUEUE]):
        run = await wc.floats.astart()
        done = await run_state(run.id, "succeeded")
    floats = {k: "float" for k in wc.FLOATS}
    assert done["output"]["types"] == floats, "what the next step saw in ctx.outputs"
    assert {k: type(v).__name__ for k, v in done["output"]["seen"].items()} == floats, "the run's output"
    assert {k: type(v).__name__ for k, v in done["steps"]["measure"]["output"].items()} == floats, "the step's"


async def test_sync_steps_run_side_by_side_up_to_the_runtimes_concurrency(jobs_db: str) -> None:
    """A sync step runs in a thread of the runtime's, as a sync job does: as many run at once as
    the runtime has slots. (They ran in the event loop's default pool, a few threads: the others
    waited there, their slots held and their timeouts running.)"""
    async with running(queues=[wc.QUEUE], concurrency=wc.SIDE_BY_SIDE):
        run = await wc.side_by_side.astart()
        done = await run_state(run.id, {"succeeded", "failed"}, timeout=30.0)
    assert done["state"] == "succeeded", done["error"]


async def test_a_sync_step_that_raises_stop_iteration_fails_as_a_sync_job_does(jobs_db: str) -> None:
    """A sync step (or a fan-out step's sync function) that raises StopIteration fails its attempt,
    as an async step's does (Python turns it into a RuntimeError on its way out of the step's
    coroutine). Carried from its thread as it was, asyncio refused it: the step's job never ended,
    and a step without a timeout kept its run going for ever."""
    async with running(queues=[wc.QUEUE]):
        runs = [await wc.stops.astart(), await wc.stops_fanning.astart()]
        done = [await run_state(run.id, "failed") for run in runs]
    assert [d["error"] for d in done] == [f"step {name!r} failed: RuntimeError: coroutine raised StopIteration"
                                          for name in ("exhausted", "exhausted_batch")]


async def test_a_step_that_is_an_object_with_an_async_call_is_awaited(jobs_db: str) -> None:
    """An object whose __call__ is async is an async step, as it is an async job: its call is
    awaited and what it returns is the step's output. (Taken for a sync step, it was called in a
    thread and its coroutine, never run, failed the step as an output that is not JSON.)"""
    async with running(queues=[wc.QUEUE]):
        run = await wc.greets.astart("ana")
        done = await run_state(run.id, {"succeeded", "failed"})
    assert (done["state"], done["steps"]["greet"]["output"]) == ("succeeded", {"hello": "ana"}), done["error"]


@pytest.mark.parametrize("call", ["enqueue", "enqueue_many"])
async def test_an_awaited_batch_call_in_an_async_fan_out_step_says_to_drop_the_await(jobs_db: str, call: str) -> None:
    """batch.enqueue() adds to the step's batch at once. Awaited (as ctx.group.enqueue is, in an
    async job), it failed the step with Python's "object NoneType can't be used in 'await'
    expression", which names neither the call nor the fix."""
    async with running(queues=[wc.QUEUE]):
        run = await wc.awaits_batch.astart(call)
        done = await run_state(run.id, "failed")
    assert f"batch.{call}() is not awaited" in done["error"] and "drop the `await`" in done["error"], done["error"]
    assert q(jobs_db, "SELECT count(*) FROM livepush_jobs WHERE name = %s", (wc.record.name,)) == [(0,)]


def lock_waiters(url: str) -> int:
    """How many sessions of the test's database wait for a lock that another holds."""
    return q(url, "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                  "AND wait_event_type = 'Lock'")[0][0]


async def test_a_step_parked_on_a_signal_is_stopped_when_its_run_ends_while_that_signal_is_sent(
        jobs_db: str) -> None:
    """A run that a step fails stops the job of a step parked on its signal, also when a signal to
    that job is on its way at that moment (its transaction holds the job's row, which the run's end
    cannot wait for): the signal, refused since the run has ended, stops the job itself, rather
    than leave it parked for a signal that can no longer come. The run's row is held here so that
    the run's end and the signal meet."""
    async with running(queues=[wc.QUEUE]):
        run = await wc.fails_while_waiting.astart()
        await async_wait_for(lambda: step_is(run.id, "waits", "waiting"), 10.0, message="the step to park")
        refused: list[BaseException] = []

        def send() -> None:
            try:
                jobs.workflows.signal(run.id, "go", {"by": "ana"}, actor="ana")
            except ValueError as exc:
                refused.append(exc)

        with psycopg.connect(jobs_db) as holder:
            holder.execute("SELECT 1 FROM livepush_workflows WHERE id = %s FOR UPDATE", (run.id,))
            q(jobs_db, "INSERT INTO job_flags VALUES ('break-now')")
            await async_wait_for(lambda: lock_waiters(jobs_db) == 1, 10.0, message="the run's end to wait for its row")
            signal = threading.Thread(target=send)
            signal.start()
            await async_wait_for(lambda: lock_waiters(jobs_db) == 2, 10.0, message="the signal to wait for the run")
            holder.commit()
        await asyncio.to_thread(signal.join, 10.0)
        assert not signal.is_alive()
        done = await run_state(run.id, "failed")
        assert await async_wait_for(lambda: job_ended(jobs_db, "wfd_fails_while_waiting.waits"), 10.0,
                                    message="the parked step's job to end") == "cancelled"
    assert [str(exc) for exc in refused] == [f"workflow run {run.id} has failed: it takes no more signals"]
    assert step_states(done) == {"start": "succeeded", "breaks": "failed", "waits": "cancelled"}
    assert [a["verb"] for a in done["audit"]] == []


@pytest.mark.parametrize("flow, step, says", [
    (wc.forgets_await, "unawaited", "returned a coroutine it did not await: write `return await ...`"),
    (wc.wraps_async, "wrapped", "returned a coroutine without running it: its function is not `async def`"),
])
async def test_a_step_that_returns_a_coroutine_unrun_fails_saying_so(jobs_db: str, flow: Any, step: str,
                                                                    says: str) -> None:
    """A step that returns a coroutine instead of its output (a forgotten `await`, a sync wrapper
    around an async function) fails its run naming the step and the fix, as a job does, rather
    than with an output "that is not JSON" whose advice (pass an id) is no fix."""
    async with running(queues=[wc.QUEUE]):
        run = await flow.astart()
        done = await run_state(run.id, "failed")
    assert step_states(done) == {step: "failed"}
    assert "InvalidResultError" in done["error"] and says in done["error"], done["error"]
    assert f"step {step!r} of workflow {flow.name!r}" in done["error"], done["error"]


@pytest.mark.parametrize("flow, step, verb", [
    (wc.completes_unawaited, "completes", "complete"),
    (wc.finishes_unawaited, "finishes", "finish"),
])
async def test_a_flow_verb_given_a_coroutine_unrun_fails_saying_so(jobs_db: str, flow: Any, step: str,
                                                                  verb: str) -> None:
    """ctx.flow.complete(x) or ctx.flow.finish(x) with x a coroutine (a forgotten `await`) fails the
    step naming it and the fix, as a step that returns one does, rather than with an output "that is
    not JSON" whose advice (pass an id) is no fix; and no "never awaited" warning follows."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        async with running(queues=[wc.QUEUE]):
            run = await flow.astart()
            done = await run_state(run.id, "failed")
        gc.collect()
    assert step_states(done) == {step: "failed"}
    assert "InvalidResultError" in done["error"], done["error"]
    assert (f"step {step!r} of workflow {flow.name!r} passed ctx.flow.{verb}() a coroutine it did not await: "
            f"write `ctx.flow.{verb}(await ...)`") in done["error"], done["error"]
    assert not [w for w in caught if "never awaited" in str(w.message)]


@pytest.mark.parametrize("flow, step, says", [
    (wc.outputs_a_set, "resize", "step 'resize' of workflow 'wfd_outputs_a_set' returned a set: outputs are "
                                 "plain JSON (str, int, float, bool, None, list, dict with str keys)"),
    (wc.nests_a_set, "measure", "step 'measure' of workflow 'wfd_nests_a_set' returned an output that is not plain "
                                "JSON: output[\"sizes\"][1] is a set: outputs are plain JSON"),
    (wc.finishes_with_a_set, "wraps_up", "step 'wraps_up' of workflow 'wfd_finishes_with_a_set' passed "
                                         "ctx.flow.finish() an output that is not plain JSON: output[\"done\"] is a set"),
])
async def test_a_step_whose_output_is_not_json_fails_naming_the_step_and_its_output(
        jobs_db: str, flow: Any, step: str, says: str) -> None:
    """A step whose output is not plain JSON fails its run naming the step and where in its output,
    not the step job's result that wraps it (`result["output"] is a set: job results ...`)."""
    async with running(queues=[wc.QUEUE]):
        run = await flow.astart()
        done = await run_state(run.id, "failed")
    assert step_states(done) == {step: "failed"}
    assert "InvalidResultError" in done["error"] and says in done["error"], done["error"]
    assert "result[" not in done["error"] and "job results" not in done["error"], done["error"]


async def test_a_step_whose_output_is_too_large_to_store_fails_its_run_and_the_runtime_goes_on(
        jobs_db: str) -> None:
    """A step whose output passes what one jsonb value holds (256 MiB) fails at once, its run's
    error saying that its result is too large; the runtime that ran it goes on. The failure
    written in place of its outcome carried that output along, was refused too, and stopped the
    runtime, which gave the step back to the next runtime, to meet the same."""
    # Encoding and sending 270 MB holds the loop for seconds on a busy machine: a heartbeat of a
    # few seconds keeps the runtime from being taken for dead meanwhile (docs/workflows.md).
    async with running(queues=[wc.QUEUE], heartbeat=5.0) as rt:
        run = await wc.outputs_too_much.astart()
        done = await run_state(run.id, {"failed", "succeeded"}, timeout=60.0)
        assert step_states(done) == {"too_much": "failed", "after_too_much": "cancelled"}
        assert "too large for Postgres to store" in done["error"], done["error"]
        assert q(jobs_db, "SELECT attempt FROM livepush_jobs WHERE id = %s",
                 (done["steps"]["too_much"]["job"],)) == [(1,)]
        # Still serving: another run's step is claimed, run and its end written.
        other = await wc.outputs_a_set.astart()
        assert "InvalidResultError" in (await run_state(other.id, "failed"))["error"]
        assert rt.state == "running"


async def test_resuming_a_fan_out_step_keeps_no_copy_of_its_failed_members_arguments(jobs_db: str) -> None:
    """A resumed fan-out step runs its failed members again from their own rows: its job stores no
    copy of their arguments, which for a large batch passed what one jsonb value holds (the resume
    then failed the run) and was read again at each of the job's replays."""
    async with running(queues=[wc.QUEUE], concurrency=8):
        run = await wc.padded.astart({"n": 20, "pad": 20_000})
        await run_state(run.id, "paused")
        q(jobs_db, "INSERT INTO job_flags VALUES ('padded-members-ok')")
        assert await jobs.workflows.aresume(run.id, actor="ana")
        done = await run_state(run.id, "succeeded")
    assert done["steps"]["padded_rows"]["output"] == {"total": 20, "succeeded": 20, "failed": 0, "cancelled": 0}
    stored = q(jobs_db, "SELECT coalesce(sum(pg_column_size(result)), 0) FROM livepush_job_steps WHERE job_id = %s",
               (done["steps"]["padded_rows"]["job"],))[0][0]
    assert stored < 20_000, f"the resumed step's job stores {stored} bytes: a copy of its members' arguments"
