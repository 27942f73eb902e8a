"""Durable jobs (docs/durable.md): checkpoints replayed, not rerun; children, signals and sleeps that
park a job without holding a slot; results; the events a page sees; cancel and retention."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import time
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from livepush import jobs
from livepush.jobs.api.registry import REGISTRY
from livepush.jobs.runtime import maintenance
from livepush.jobs.runtime.runtime import Runtime
from tests.jobs import durable_jobs as dj
from tests.jobs.conftest import names_of, q, read_states
from tests.jobs.conftest import running as runtime_running
from tests.support.waiting import async_wait_for


@pytest.fixture
def durable_db(jobs_db: str) -> Iterator[str]:
    """jobs_db, with the tables the durable job functions record into."""
    q(jobs_db, dj.BODIES_TABLE)
    q(jobs_db, dj.INPUTS_TABLE)
    yield jobs_db


def running(**options: Any) -> Any:
    """conftest.running on the queues the durable jobs use, polling every 0.2 s."""
    options.setdefault("queues", ["default", "elsewhere"])
    options.setdefault("poll_interval", 0.2)
    return runtime_running(**options)


async def info(job_id: int) -> jobs.JobInfo:
    found = await jobs.aget_job(job_id)
    assert found is not None
    return found


async def wait_state(job_id: int, want: str, timeout: float = 10.0) -> jobs.JobInfo:
    async def check() -> jobs.JobInfo | None:
        found = await info(job_id)
        return found if found.state == want else None

    return await async_wait_for(check, timeout, message=f"job {job_id} to become {want}")


def bodies(url: str, job_id: int) -> list[str]:
    return [r[0] for r in q(url, "SELECT name FROM durable_bodies WHERE job_id = %s ORDER BY at", (job_id,))]


# -- checkpoints -----------------------------------------------------------------------------------

async def test_checkpoints_are_replayed_not_rerun(durable_db: str) -> None:
    """A retry replays the stored checkpoints: each body ran once, and the result is stored."""
    async with running():
        h = await dj.steps.aenqueue(5, True)
        done = await wait_state(h.id, "succeeded")
    assert bodies(durable_db, h.id) == [f"s{i}" for i in range(5)]
    assert done.attempt == 2
    assert done.result == {"got": [{"i": i} for i in range(5)], "attempt": 2}


async def test_checkpoints_replayed_side_by_side_read_the_stored_steps_once(
        durable_db: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A run reads its job's stored steps in one query, also when many checkpoints side by side
    (asyncio.gather) need them at the same moment: not one query each, which also asked the
    runtime's small pool for as many connections at once."""
    from livepush.jobs.durable import queries as dq
    from livepush.jobs.durable.run import DurableRun

    loads: list[int] = []
    real_read = DurableRun._read

    async def counted(self: DurableRun, sql: str, params: dict[str, Any]) -> list[dict[str, Any]]:
        if sql == dq.LOAD_STEPS:
            loads.append(self.ctx._job.attempt)
        return await real_read(self, sql, params)

    monkeypatch.setattr(DurableRun, "_read", counted)
    async with running():
        h = await dj.steps_together.aenqueue(20)
        done = await wait_state(h.id, "succeeded")
    assert done.result == list(range(20)) and done.attempt == 2
    assert sorted(bodies(durable_db, h.id)) == sorted(f"s{i}" for i in range(20))
    assert loads == [2], loads  # the first run had nothing stored; the replay read it all once


async def test_sync_job_checkpoints_are_replayed(durable_db: str) -> None:
    """A sync job's ctx.checkpoint works the same, its body running in the job's thread."""
    async with running():
        h = await dj.steps_sync.aenqueue(3)
        done = await wait_state(h.id, "succeeded")
    assert bodies(durable_db, h.id) == ["s0", "s1", "s2"]
    assert done.result == ["s0", "s1", "s2"]


async def test_changed_input_fails_the_job_at_once(durable_db: str) -> None:
    """A replay whose checkpoint input changed fails with CheckpointInputConflict, without a retry,
    before the body runs again."""
    q(durable_db, "INSERT INTO durable_inputs VALUES ('price', '1250')")
    async with running():
        h = await dj.with_input.aenqueue("price", "input changed")
        await async_wait_for(lambda: bodies(durable_db, h.id) == ["charge"], 10.0, message="the charge to run")
        # Changed before the retry (backoff 0) reads it: the first attempt fails after its charge
        # only once the flag says the input changed.
        q(durable_db, "UPDATE durable_inputs SET value = '999' WHERE name = 'price'")
        q(durable_db, "INSERT INTO job_flags VALUES ('input changed')")
        failed = await wait_state(h.id, "failed")
    assert "CheckpointInputConflict" in (failed.error or "") and "'charge'" in (failed.error or "")
    # What to do, and what renaming costs: a charge renamed is a charge made again.
    assert "(its body then runs again, for this input)" in (failed.error or ""), failed.error
    assert f"then jobs.retry_failed({h.id}) runs the job on" in (failed.error or ""), failed.error
    assert failed.attempt == 2  # failed on the attempt that met the conflict, no further retry
    assert bodies(durable_db, h.id) == ["charge"]


async def test_same_input_replays_the_stored_result(durable_db: str) -> None:
    """With the same input on replay, the checkpoint returns its stored result."""
    q(durable_db, "INSERT INTO durable_inputs VALUES ('price', '1250')")
    async with running():
        h = await dj.with_input.aenqueue("price")
        done = await wait_state(h.id, "succeeded")
    assert done.result == "charge" and bodies(durable_db, h.id) == ["charge"]


def test_input_fingerprint_is_sha256_of_canonical_json() -> None:
    """input_fingerprint: SHA-256 of RFC 8785 JSON (key order and 1.0 vs 1 do not matter)."""
    import hashlib

    want = hashlib.sha256(b'{"a":[1,2.5,"x"],"b":null}').hexdigest()
    assert jobs.input_fingerprint({"b": None, "a": [1, 2.5, "x"]}) == want
    assert jobs.input_fingerprint({"b": None, "a": [1.0, 2.5, "x"]}) == want
    assert len(want) == 64 and want == want.lower()


def test_an_input_holding_a_nul_is_fingerprinted_as_only_its_fingerprint_is_stored() -> None:
    """A checkpoint's input is compared by its fingerprint, never stored: text Postgres cannot store
    (a NUL character) is an input like any other, told apart from the same text without it. A lone
    surrogate, which is no Unicode text, is refused naming where it is."""
    import hashlib

    assert jobs.input_fingerprint({"k\x00": "a\x00b"}) == hashlib.sha256(b'{"k\\u0000":"a\\u0000b"}').hexdigest()
    assert jobs.input_fingerprint("a\x00b") != jobs.input_fingerprint("ab")
    with pytest.raises(ValueError, match=r"input\[1\] contains a lone surrogate"):
        jobs.input_fingerprint(["\x00", "\ud800"])


@pytest.mark.parametrize("value", [2**53, -(2**53), {"n": [float(2**60)]}])
def test_input_fingerprint_refuses_numbers_past_2_53(value: Any) -> None:
    """Numbers beyond ±(2**53-1) are refused with ValueError naming the path."""
    with pytest.raises(ValueError, match="2\\*\\*53"):
        jobs.input_fingerprint(value)
    assert jobs.input_fingerprint(2**53 - 1)


def test_input_fingerprint_refuses_an_int_too_long_to_print_naming_the_path() -> None:
    """An int with more digits than Python converts to text (4300) is refused as any number past
    2**53 is, with ArgumentValueError naming its path and its size, in a message of readable
    length: not Python's bare ValueError about integer string conversion."""
    from livepush.errors import ArgumentValueError

    with pytest.raises(ArgumentValueError, match=r'input\["a"\]\[0\] is a negative int of 16610 bits') as raised:
        jobs.input_fingerprint({"a": [-(10**5000)]})
    assert len(str(raised.value)) < 300
    with pytest.raises(ArgumentValueError, match=r"input is an int of 1329 bits"):
        jobs.input_fingerprint(10**400)


async def test_a_checkpoint_returns_on_its_first_run_what_a_replay_returns(durable_db: str) -> None:
    """The first run gets a checkpoint's result through JSON exactly as a replay gets it back from
    the database: the same keys in the same order, the same types (a float past 2**53 that jsonb
    writes as an integer). Else code after it, which the docs say replays deterministically from a
    checkpoint's result, could start its children or waits in another order on replay."""
    async with running():
        h = await dj.through_json.aenqueue()
        done = await wait_state(h.id, "succeeded")
    assert done.attempt == 2
    assert done.result["first"] == done.result["replay"]


async def test_a_checkpoint_result_keeps_its_number_types_and_takes_jsonbs_key_order(durable_db: str) -> None:
    """A checkpoint's result comes back with jsonb's key order (shorter keys first), an int as an
    int and a float as a float, 1e16 included (Python writes it with an exponent, livepush stores
    it with a fraction), on the first run as on the replay."""
    async with running():
        h = await dj.through_json.aenqueue()
        done = await wait_state(h.id, "succeeded")
    assert done.result["first"]["keys"] == ["id", "total"]
    assert done.result["first"]["types"] == ["int", "float"]
    assert done.result["first"] == done.result["replay"]


async def test_a_checkpoint_beside_a_park_in_gather_runs_its_body_once(durable_db: str) -> None:
    """A park waits for the checkpoints running beside it (asyncio.gather) to store their results:
    a body still running when its run parked was stored by no one, so the replay ran it again,
    perhaps while the first was still going."""
    async with running():
        h = await dj.checkpoint_beside_park.aenqueue(0.5)
        done = await wait_state(h.id, "succeeded")
    assert done.result == "slow"
    assert bodies(durable_db, h.id) == ["slow"]
    assert names_of(durable_db, h.id).count("waiting/waiting") == 1


@pytest.mark.parametrize("job", ["checkpoint_in_finally", "checkpoint_in_finally_sync"])
async def test_a_checkpoint_reached_after_its_run_parked_does_not_run_its_body(durable_db: str, job: str) -> None:
    """A checkpoint reached once the run parked (in a `finally` around the parking call) does not
    start its body, in a sync job as in an async one: nobody could store its result, so the body
    would run again on the replay."""
    async with running():
        h = await getattr(dj, job).aenqueue()
        await wait_state(h.id, "waiting")
        await jobs.asignal(h.id, "go", "went")
        done = await wait_state(h.id, "succeeded")
    assert done.result == "went"
    assert bodies(durable_db, h.id) == ["after"]


async def test_a_checkpoint_beside_a_failure_in_gather_runs_its_body_once(durable_db: str) -> None:
    """A run that fails while a checkpoint beside it (asyncio.gather) is still running waits for
    that checkpoint to store its result before its outcome is written: the retry replays it
    instead of running its body a second time, perhaps while the first was still going."""
    async with running():
        h = await dj.checkpoint_beside_a_failure.aenqueue(0.5)
        done = await wait_state(h.id, "succeeded")
    assert done.result == "slow" and done.attempt == 2
    assert bodies(durable_db, h.id) == ["slow"]


async def test_a_sync_checkpoint_cancelled_by_a_failing_task_group_sibling_runs_its_body_once(
        durable_db: str) -> None:
    """A TaskGroup cancels the checkpoint beside a failing task, but a sync function runs on in its
    thread: its result is stored all the same before the attempt ends, so the retry replays it
    instead of running the body (its side effect) a second time."""
    async with running():
        h = await dj.sync_checkpoint_beside_a_failure_in_task_group.aenqueue()
        done = await wait_state(h.id, "succeeded", timeout=15.0)
    assert done.result == 2
    assert bodies(durable_db, h.id) == ["slow"]


async def test_a_parking_call_beside_a_failure_in_gather_does_not_park_the_ended_run(durable_db: str) -> None:
    """A children call that waited for a checkpoint beside it while the run failed does not go on
    once the run ended: the job fails with the run's error, and no child is created after it."""
    async with running():
        h = await dj.park_beside_a_failure.aenqueue(0.5)
        failed = await wait_state(h.id, "failed", timeout=15.0)
    assert "the run fails while the park beside it waits" in (failed.error or ""), failed
    assert q(durable_db, "SELECT count(*) FROM livepush_jobs WHERE name = 'd.child'") == [(0,)]
    assert bodies(durable_db, h.id) == ["slow"]


async def test_parks_side_by_side_in_gather_park_in_turn(durable_db: str) -> None:
    """Two parking calls in asyncio.gather: the first parks the run, the second ends with it
    quietly (no lost claim in the log) and parks on the replay."""
    async with running():
        h = await dj.parks_side_by_side.aenqueue()
        done = await wait_state(h.id, "succeeded")
    assert done.result == [None, None]
    assert names_of(durable_db, h.id).count("waiting/waiting") == 2


async def test_a_park_inside_a_task_group_is_a_park_not_a_failure(
        durable_db: str, caplog: pytest.LogCaptureFixture) -> None:
    """asyncio.TaskGroup raises a park of one of its tasks wrapped in an exception group: the run
    parked all the same, so no failed attempt is logged and no outcome is written for it."""
    caplog.set_level("INFO", logger="livepush.jobs")
    async with running():
        h = await dj.park_in_task_group.aenqueue()
        done = await wait_state(h.id, "succeeded")
    assert done.result == 3 and done.attempt == 1
    assert names_of(durable_db, h.id).count("waiting/waiting") == 1
    assert not [r.getMessage() for r in caplog.records if "failed" in r.getMessage() or "ignored" in r.getMessage()]


@pytest.mark.parametrize("job", ["parks_past_its_timeout", "parks_past_its_timeout_sync"])
async def test_a_park_after_the_attempt_passed_its_timeout_does_not_undo_the_timeout(
        durable_db: str, job: str) -> None:
    """A parking call made once its attempt passed its timeout (an async job that swallowed the
    cancel, a sync job's thread running on) does not park: the attempt failed by its timeout, also
    when the park comes before that failure is written (the runtime writes outcomes in batches,
    here two seconds apart)."""
    async with running(flush_delay=2.0):
        h = await getattr(dj, job).aenqueue()
        failed = await wait_state(h.id, "failed", timeout=15.0)
    assert failed.error == "TimeoutError: timed out after 0.2 s"
    from tests.support.job_versions import events_of

    assert "waiting" not in [e["event"] for e in events_of(durable_db, h.id)]


async def test_a_sync_checkpoint_function_raising_stop_iteration_fails_the_attempt(durable_db: str) -> None:
    """A sync checkpoint function of an async job that raises StopIteration (next() on an empty
    iterator) fails the attempt, as it would raised in the job's own code (Python makes it a
    RuntimeError on its way out of a coroutine): the job does not hang `running` for ever."""
    async with running():
        h = await dj.checkpoint_raising_stop_iteration.aenqueue()
        failed = await wait_state(h.id, "failed")
    assert "StopIteration" in (failed.error or ""), failed.error


async def test_a_checkpoint_that_loses_its_connection_fails_with_dependency_error(durable_db: str) -> None:
    """A checkpoint whose store loses its database connection fails the attempt with livepush's
    DependencyError (what a job may catch around ctx.checkpoint), not with psycopg's own error."""
    async with running():
        h = await dj.hold_in_checkpoint.aenqueue("store")
        await async_wait_for(lambda: bodies(durable_db, h.id) == ["held"], 10.0, message="the body to start")
        with psycopg.connect(durable_db) as holder:
            holder.execute("SELECT 1 FROM livepush_jobs WHERE id = %s FOR UPDATE", (h.id,))
            q(durable_db, "INSERT INTO job_flags VALUES ('store')")
            storing = "SELECT pid FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE '%%job_steps%%'"
            (pid,) = await async_wait_for(lambda: q(durable_db, storing), 10.0, message="the store to wait for the row")
            q(durable_db, "SELECT pg_terminate_backend(%s)", pid)
        failed = await wait_state(h.id, "failed")
    assert (failed.error or "").startswith("DependencyError: "), failed.error


async def test_a_checkpoint_stored_meanwhile_returns_the_stored_result_not_its_bodys(durable_db: str) -> None:
    """A checkpoint whose name was stored while its body ran (a first store that lost its
    connection, caught by the job, committed only after the retry looked for it): its own store
    keeps the stored result, and the call returns that one, as every replay will, not the result
    of the body that was not stored."""
    async with running():
        h = await dj.held_then_returns.aenqueue("late store")
        await async_wait_for(lambda: bodies(durable_db, h.id) == ["held"], 10.0, message="the body to start")
        q(durable_db, """INSERT INTO livepush_job_steps (job_id, kind, name, result)
                         VALUES (%s, 'checkpoint', 'held', '{"value": "the stored"}')""", (h.id,))
        q(durable_db, "INSERT INTO job_flags VALUES ('late store')")
        done = await wait_state(h.id, "succeeded")
    assert done.result == "the stored"


@pytest.mark.parametrize("where, path", [("result", 'result["when"] is a datetime'),
                                         ("checkpoint", """checkpoint 'when' result["at"] is a datetime"""),
                                         ("big result", 'result["n"] is an int of more than 4300 digits'),
                                         ("big checkpoint", """checkpoint 'big' result["n"] is an int of more""")])
async def test_a_result_that_is_not_json_fails_naming_the_path(durable_db: str, where: str, path: str) -> None:
    """A job or checkpoint result that is not JSON (or holds an int too long for JSON text) fails
    the job at once, naming where."""
    async with running():
        h = await dj.bad_result.aenqueue(where)
        failed = await wait_state(h.id, "failed")
    assert "InvalidResultError" in (failed.error or "") and path in (failed.error or ""), failed.error
    assert failed.attempt == 1


@pytest.mark.parametrize("what, says", [
    ("a set", 'result["ids"] is a set: checkpoint results are plain JSON (str, int, float, bool, None, list, dict '
              'with str keys); use a list (sorted(value)) instead'),
    ("bytes", 'result["ids"] is a bytes: checkpoint results are plain JSON (str, int, float, bool, None, list, dict '
              'with str keys); use text (base64) or a reference to where the bytes are kept instead'),
    ("a dataclass", 'result["ids"] is a Row: checkpoint results are plain JSON (str, int, float, bool, None, list, '
                    'dict with str keys); use a dict (dataclasses.asdict(value)) instead'),
    ("a datetime", 'result["ids"] is a datetime: checkpoint results are plain JSON (str, int, float, bool, None, '
                   'list, dict with str keys); use an ISO string (value.isoformat()) instead'),
])
async def test_a_checkpoint_result_that_is_not_json_says_what_to_use_for_what_it_is(
        durable_db: str, what: str, says: str) -> None:
    """The error of a result JSON cannot hold says what to use instead, for the value it names: a
    list for a set, not "an id or an ISO string", which fits a datetime only."""
    async with running():
        h = await dj.unplain_checkpoint.aenqueue(what)
        failed = await wait_state(h.id, "failed")
    assert failed.error == f"InvalidResultError: checkpoint 'fetch' {says}", failed.error
    assert failed.attempt == 1


async def test_a_checkpoint_result_too_large_to_store_fails_the_job_at_once(durable_db: str) -> None:
    """A checkpoint result larger than Postgres stores in a jsonb value fails the job at once with
    InvalidResultError naming the checkpoint: every retry would run its body again (its side effects
    too) and meet the same refusal."""
    # A slow heartbeat: encoding a quarter gigabyte holds the loop up long enough that a 0.2 s one
    # would have the runtime presumed dead and the job rescued, which is not what this checks.
    async with running(heartbeat=10.0):
        h = await dj.bad_result.aenqueue("huge checkpoint")
        failed = await wait_state(h.id, "failed", timeout=60.0)
    assert (failed.error or "").startswith("InvalidResultError: checkpoint 'huge' result is too large"), failed.error
    assert "your tables" in (failed.error or ""), failed.error
    assert failed.attempt == 1
    assert bodies(durable_db, h.id) == ["huge"]


async def test_a_checkpoint_result_past_one_message_to_postgres_fails_the_job_at_once(
        durable_db: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A checkpoint result whose JSON passes what one message to Postgres carries (lowered here to
    100,000 bytes) fails the job at once with InvalidResultError naming the checkpoint, before it
    is sent: Postgres closed the connection on such a message, and each retry ran the body again."""
    from livepush.jobs.api import args

    monkeypatch.setattr(args, "SENDABLE", 100_000)
    async with running():
        h = await dj.bad_result.aenqueue("long checkpoint")
        failed = await wait_state(h.id, "failed")
    assert (failed.error or "").startswith("InvalidResultError: checkpoint 'long' result is too large for Postgres "
                                           "to store (past the 1 GiB one message to Postgres carries)"), failed.error
    assert failed.attempt == 1


async def test_a_step_error_inside_a_task_group_fails_the_job_at_once(durable_db: str) -> None:
    """An error a retry would meet again (here InvalidResultError) fails the job at once also when
    an asyncio.TaskGroup raises it inside an exception group."""
    async with running():
        h = await dj.bad_result_in_task_group.aenqueue()
        failed = await wait_state(h.id, "failed")
    assert "InvalidResultError" in (failed.error or "") and "'when'" in (failed.error or ""), failed.error
    assert failed.attempt == 1


async def test_a_duplicate_checkpoint_name_fails_the_job(durable_db: str) -> None:
    """Two checkpoints with one name in a run: DuplicateStepError, no retry."""
    async with running():
        h = await dj.twice.aenqueue()
        failed = await wait_state(h.id, "failed")
    assert "DuplicateStepError" in (failed.error or "") and "'same'" in (failed.error or "")
    assert failed.attempt == 1


async def test_a_checkpoint_name_reused_in_a_loop_fails_saying_how_to_name_each(durable_db: str) -> None:
    """A loop that gives each item's checkpoint the same name fails at its second item, and the
    error says what to do: a name per item. Only the first item's body ran."""
    async with running():
        h = await dj.loop_of_one_name.aenqueue([1, 2, 3])
        failed = await wait_state(h.id, "failed")
    assert (failed.error or "").startswith("DuplicateStepError: a second checkpoint named 'process'"), failed.error
    assert "Give each call its own name" in (failed.error or "") and 'f"process-{i}"' in (failed.error or ""), \
        failed.error
    assert failed.attempt == 1 and bodies(durable_db, h.id) == ["process"]


@pytest.mark.parametrize("job", [dj.retried_in_run, dj.retried_in_run_sync])
async def test_a_checkpoint_whose_function_raised_may_be_called_again_under_its_name(
        durable_db: str, job: Any) -> None:
    """A checkpoint whose function raised stored nothing: the job's own retry of it (a flaky call
    in a retry loop) runs it again, rather than fail the job at once with DuplicateStepError as a
    second checkpoint of that name would."""
    async with running():
        h = await job.aenqueue(2)
        done = await wait_state(h.id, "succeeded")
    assert done.result == {"tries": 3} and done.attempt == 1
    assert bodies(durable_db, h.id) == ["charge"] * 3


@contextlib.contextmanager
def failing_step_stores(url: str, times: int) -> Iterator[None]:
    """The first `times` writes of a durable step fail as a server shutting down fails them
    (DependencyError in the job), whichever statement writes it."""
    q(url, "CREATE SEQUENCE store_failures")
    q(url, f"""CREATE FUNCTION fail_stores() RETURNS trigger LANGUAGE plpgsql AS $$
               BEGIN
                   IF nextval('store_failures') <= {int(times)} THEN
                       RAISE EXCEPTION 'terminating connection due to administrator command' USING ERRCODE = '57P01';
                   END IF;
                   RETURN NEW;
               END $$""")
    q(url, "CREATE TRIGGER fail_stores BEFORE INSERT ON livepush_job_steps FOR EACH ROW EXECUTE FUNCTION fail_stores()")
    try:
        yield
    finally:
        q(url, "DROP TRIGGER fail_stores ON livepush_job_steps")
        q(url, "DROP FUNCTION fail_stores(); DROP SEQUENCE store_failures")


async def test_a_checkpoint_whose_store_lost_postgres_may_be_called_again_under_its_name(durable_db: str) -> None:
    """The store of a checkpoint's result failed (Postgres restarting: DependencyError): the job's
    own retry of the checkpoint, in the same run, looks for what is stored again and runs the body
    again since nothing was, rather than fail the job at once with DuplicateStepError. Here the
    first two stores fail."""
    with failing_step_stores(durable_db, 2):
        async with running():
            h = await dj.store_retried_in_run.aenqueue()
            done = await wait_state(h.id, "succeeded")
    assert done.result == {"charged": True} and done.attempt == 1
    assert bodies(durable_db, h.id) == ["charge"] * 3


async def test_a_sleep_whose_park_lost_postgres_may_be_called_again_under_its_name(durable_db: str) -> None:
    """A durable sleep whose park failed (Postgres restarting: DependencyError), called again by the
    job's own retry in the same run, parks then, rather than fail the job at once with
    DuplicateStepError."""
    with failing_step_stores(durable_db, 2):
        async with running():
            h = await dj.sleep_retried_in_run.aenqueue()
            done = await wait_state(h.id, "succeeded")
    assert done.result == "woke" and done.attempt == 1


async def test_a_signal_wait_retried_after_losing_postgres_is_replayed_where_it_took_its_signal(
        durable_db: str) -> None:
    """A wait for a signal whose transaction lost Postgres (DependencyError), called again by the
    job's own retry in the same run, is the same wait: the replay after the job's next park finds
    the signal it took there, rather than wait for a second one that never comes."""
    h = await dj.wait_retried_in_run.aenqueue()
    await jobs.asignal(h.id, "go", {"by": "ana"})
    with failing_step_stores(durable_db, 1):
        async with running():
            done = await wait_state(h.id, "succeeded")
    assert done.result == {"by": "ana"} and done.attempt == 1


@pytest.mark.parametrize("how, says", [
    ("a date", 'ArgumentValueError: checkpoint \'charge\' input["at"] is a date'),
    ("a number past 2**53", 'ArgumentValueError: checkpoint \'charge\' input["id"] is 9007199254740992, beyond'),
])
async def test_an_input_that_cannot_be_fingerprinted_fails_naming_its_checkpoint(
        durable_db: str, how: str, says: str) -> None:
    """An input= that is not plain JSON, or holds a number past 2**53-1, fails naming the checkpoint
    it was given to, as a result that is not JSON does: in a job of many checkpoints, "input" alone
    did not say which."""
    async with running():
        h = await dj.unfit_input.aenqueue(how)
        failed = await wait_state(h.id, "failed")
    assert (failed.error or "").startswith(says), failed.error


@pytest.mark.parametrize("job, how, says", [
    (dj.misused, "children of an int", "ctx.run_children() takes a list of job requests (some_job.request(*args)), got int 5"),
    (dj.misused, "children of one request", "for one child use ctx.run_child(request)"),
    (dj.misused, "a child that is a function", "ctx.run_child() takes a job request (some_job.request(*args)), got"),
    (dj.misused, "checkpoint", "ctx.checkpoint('not callable', fn, *args) takes a function to call, got int 5"),
    (dj.misused_sync, "children of an int", "ctx.run_children() takes a list of job requests"),
    (dj.misused_sync, "checkpoint", "ctx.checkpoint('not callable', fn, *args) takes a function to call, got int 5"),
    (dj.misused, "keyword arguments", "ctx.checkpoint('charge', fn, *args) passes fn its arguments by position only, "
                                      "got key=: pass functools.partial(fn, key=...) as fn"),
    (dj.misused_sync, "keyword arguments", "passes fn its arguments by position only, got key=: pass functools.partial"),
    # Its own input= misspelt is no keyword for fn: functools.partial would pass it on to charge().
    (dj.misused, "input misspelt", "ctx.checkpoint('charge', fn, *args) takes input= (its fingerprint is compared "
                                   "on a replay), got inputs=; a keyword for fn goes in functools.partial"),
    # An argument left out: Python's own TypeError, raised at the call, was retried as the job's.
    (dj.misuse_retried, "sleep without a name", "ctx.sleep(name, seconds) takes a name first, then the seconds: "
                                         "ctx.sleep('nap', 3600) for ctx.sleep(3600)"),
    (dj.misuse_retried, "sleep without seconds", "ctx.sleep('nap') takes the seconds to sleep (or a timedelta) after its "
                                          "name: ctx.sleep('nap', 3600)"),
    # A bool is neither a name nor seconds: told the call's form, not to give True a number.
    (dj.misuse_retried, "sleep of a bool", "ctx.sleep(name, seconds) takes a name and the seconds to sleep: "
                                           "ctx.sleep('nap', 3600) for ctx.sleep(True)"),
    (dj.misuse_retried, "wait without a name", "ctx.wait_for_signal() takes the name of the signal to wait for: "
                                        "ctx.wait_for_signal('approved', timeout=5)"),
    (dj.misuse_sync, "sleep without seconds", "ctx.sleep('nap') takes the seconds to sleep"),
    (dj.misuse_sync, "wait without a name", "ctx.wait_for_signal() takes the name of the signal to wait for: "
                                             "ctx.wait_for_signal('approved')"),
])
async def test_a_durable_call_given_what_it_does_not_take_fails_naming_it(
        durable_db: str, job: Any, how: str, says: str) -> None:
    """run_children() of something that is not a list of requests, run_child() of a function, a
    checkpoint of something that cannot be called or given keyword arguments for its function: the
    job fails with ArgumentTypeError saying what the call takes, not with Python's "'int' object is
    not iterable" or "got an unexpected keyword argument"."""
    async with running():
        h = await job.aenqueue(how)
        failed = await wait_state(h.id, "failed")
    assert (failed.error or "").startswith("ArgumentTypeError: "), failed.error
    assert says in (failed.error or ""), failed.error


@pytest.mark.parametrize("how, call", [
    ("checkpoint", "ctx.checkpoint('charge')"),
    ("child", "ctx.run_child()"),
    ("sleep", "ctx.sleep('nap')"),
    ("group add", "ctx.group.enqueue()"),
])
async def test_a_durable_call_whose_await_was_forgotten_fails_the_job_at_once_naming_it(
        durable_db: str, how: str, call: str) -> None:
    """An async job that calls ctx.checkpoint (or another durable call, or ctx.group.enqueue)
    without `await` made a coroutine that never ran: the charge never happened, the child was
    never created. The job returned as if they had and succeeded; it fails at once instead
    (every attempt would forget the same await), naming the call and the fix."""
    with jobs.group() as g:  # a member, so that ctx.group.enqueue has a group to add to
        g.enqueue(dj.forgets_await, how)
    (h,) = g.members
    async with running():
        failed = await wait_state(h.id, "failed")
    assert failed.attempt == 1, failed.error
    assert (failed.error or "").startswith(f"InvalidResultError: d.forgets_await returned without awaiting {call}"), \
        failed.error
    assert "write `await ctx." in (failed.error or ""), failed.error
    assert bodies(durable_db, h.id) == []
    assert q(durable_db, "SELECT count(*) FROM livepush_jobs WHERE name = 'd.child'") == [(0,)]


async def test_a_job_that_raises_over_a_durable_call_whose_await_was_forgotten_fails_at_once_naming_it(
        durable_db: str) -> None:
    """`rows = ctx.checkpoint(...)` without await, then `len(rows)`: the job raised "object of type
    'coroutine' has no len()", retried as any TypeError though every attempt meets it, and named
    neither the call nor the fix. It fails at once, naming both and what it raised."""
    async with running():
        h = await dj.forgets_await.aenqueue("result used")
        failed = await wait_state(h.id, "failed")
    assert failed.attempt == 1, failed.error
    assert (failed.error or "").startswith(
        "InvalidResultError: d.forgets_await raised TypeError after it called ctx.checkpoint('fetch') without "
        "`await`"), failed.error
    assert bodies(durable_db, h.id) == []


@pytest.mark.filterwarnings("ignore:coroutine .* was never awaited")
async def test_a_jobs_own_error_raised_before_it_awaits_a_call_it_made_is_retried_as_ever(durable_db: str) -> None:
    async with running():
        h = await dj.forgets_await.aenqueue("raises before awaiting")
        done = await wait_state(h.id, "succeeded")
    assert done.attempt == 2
    assert bodies(durable_db, h.id) == ["charge"]
    gc.collect()  # the first attempt's call, never awaited, warns here (ignored), not in a later test


async def test_a_durable_call_made_first_and_awaited_later_is_no_forgotten_await(durable_db: str) -> None:
    async with running():
        h = await dj.forgets_await.aenqueue("awaited later")
        done = await wait_state(h.id, "succeeded")
    assert done.result == "returned"
    assert bodies(durable_db, h.id) == ["charge"]


@pytest.mark.parametrize("how", [m for m in dj.MISUSES if m not in ("own ValueError", "jobs.signal of an empty name")])
async def test_a_durable_call_made_wrongly_fails_the_job_at_once(durable_db: str, how: str) -> None:
    """A durable call refusing its own arguments (input= not JSON, a bad name, bad seconds, ...)
    makes the same refusal on every attempt: the job fails on its first, as for a result that is
    not JSON, and the code between its steps is not run again by retries that cannot succeed."""
    async with running():
        h = await dj.misuse_retried.aenqueue(how)
        failed = await wait_state(h.id, "failed")
    assert (failed.error or "").startswith(("ArgumentValueError: ", "ArgumentTypeError: ")), failed.error
    assert failed.attempt == 1, failed.error
    assert bodies(durable_db, h.id) == ["first", "between"]


@pytest.mark.parametrize("how", ["negative sleep", "sleep without a name", "sleep without seconds", "wait without a name",
                                 "not callable", "keyword arguments", "children of an int"])
async def test_a_sync_jobs_durable_call_made_wrongly_fails_the_job_at_once(durable_db: str, how: str) -> None:
    """The same in a sync job, whose durable calls go through the sync ctx."""
    async with running():
        h = await dj.misuse_sync.aenqueue(how)
        failed = await wait_state(h.id, "failed")
    assert (failed.error or "").startswith(("ArgumentValueError: ", "ArgumentTypeError: ")), failed.error
    assert failed.attempt == 1, failed.error
    assert bodies(durable_db, h.id) == ["between"]


@pytest.mark.parametrize("how", [r for r in dj.ARGUMENT_REFUSALS if r != "own TypeError"])
async def test_arguments_livepush_refuses_in_a_job_fail_it_at_once(durable_db: str, how: str) -> None:
    """An enqueue, run_child or run_children whose arguments livepush refuses (not JSON, more than
    the target takes) is refused the same way on every attempt: the job fails on its first with
    InvalidArgumentsError, rather than run its code again for retries that cannot succeed."""
    async with running():
        h = await dj.refused_arguments.aenqueue(how)
        failed = await wait_state(h.id, "failed")
    assert (failed.error or "").startswith("InvalidArgumentsError: "), failed.error
    assert failed.attempt == 1, failed.error
    assert bodies(durable_db, h.id) == ["between"]


async def test_arguments_livepush_refuses_in_a_sync_job_fail_it_at_once(durable_db: str) -> None:
    """The same in a sync job."""
    async with running():
        h = await dj.refused_arguments_sync.aenqueue()
        failed = await wait_state(h.id, "failed")
    assert (failed.error or "").startswith("InvalidArgumentsError: "), failed.error
    assert failed.attempt == 1, failed.error
    assert bodies(durable_db, h.id) == ["between"]


async def test_a_jobs_own_type_error_is_retried(durable_db: str) -> None:
    """The job's own TypeError is retried as any other error: livepush cannot tell that the next
    attempt meets it."""
    async with running():
        h = await dj.refused_arguments.aenqueue("own TypeError")
        failed = await wait_state(h.id, "failed")
    assert failed.attempt == 3, failed.error
    assert bodies(durable_db, h.id) == ["between"] * 3


@pytest.mark.parametrize("how", ["own ValueError", "jobs.signal of an empty name"])
async def test_other_value_errors_of_a_durable_job_are_retried(durable_db: str, how: str) -> None:
    """The job's own ValueError, and an argument error of a livepush call that is no durable ctx
    call, are retried as any other error: livepush cannot tell that the next attempt meets them."""
    async with running():
        h = await dj.misuse_retried.aenqueue(how)
        failed = await wait_state(h.id, "failed")
    assert failed.attempt == 3, failed.error
    assert bodies(durable_db, h.id) == ["first", "between", "between", "between"]


# -- children --------------------------------------------------------------------------------------

async def test_children_run_once_and_the_parent_gets_their_results(durable_db: str) -> None:
    """run_child and run_children park the parent (holding no slot: one slot runs them all), create
    each child once, and the parent replays with their results in order, on its first attempt."""
    async with running(concurrency=1) as rt:
        h = await dj.parent.aenqueue([1, 2, 3, 4])
        done = await wait_state(h.id, "succeeded", timeout=15.0)
        assert rt.peak_in_hand == 1
    assert done.result == {"one": {"child": 1, "queue": "default"},
                           "rest": [{"child": v, "queue": "default"} for v in (2, 3, 4)]}
    assert done.attempt == 1
    assert bodies(durable_db, h.id) == ["fetch"]
    children = q(durable_db, "SELECT j.id FROM livepush_jobs j JOIN livepush_groups g ON g.id = j.group_id "
                             "WHERE g.parent_id = %s", (h.id,))
    assert len(children) == 4
    names = names_of(durable_db, h.id)
    assert names.count("waiting/waiting") == 2 and names[-1] == "succeeded/succeeded"


async def test_a_failed_child_raises_child_failed_in_the_parent(durable_db: str) -> None:
    """A child that fails makes run_children raise ChildFailed naming it; the parent may catch it."""
    async with running():
        h = await dj.parent.aenqueue([1, 2, 3], [3])
        done = await wait_state(h.id, "succeeded", timeout=15.0)
    assert done.result["one"] == {"child": 1, "queue": "default"}
    assert len(done.result["failed"]) == 1
    assert "child 3 fails" in done.result["error"] and "1 of 2 children" in done.result["error"]


async def test_a_child_that_succeeds_on_its_own_retry_gives_the_parent_its_result(durable_db: str) -> None:
    """A child's failed attempt that its own retries make good is no failure of the call: the
    parent wakes once the child's last attempt ended, with that attempt's result."""
    async with running():
        h = await dj.parent_of_flaky.aenqueue()
        done = await wait_state(h.id, "succeeded")
    assert done.result == {"child": "x", "attempt": 2}


async def test_a_child_cancelled_on_its_own_fails_the_parent_with_child_failed(durable_db: str) -> None:
    """A child cancelled while its parent waits (not with it) ends the children call with
    ChildFailed naming the child and its state; uncaught, the parent fails without a retry."""
    async with running():
        h = await dj.fan_and_wait.aenqueue(2)
        group = (await wait_state(h.id, "waiting")).waiting["group"]  # type: ignore[index]
        kids = [r[0] for r in q(durable_db, "SELECT id FROM livepush_jobs WHERE group_id = %s ORDER BY id", (group,))]
        await wait_state(kids[1], "waiting")
        await jobs.asignal(kids[0], "go-0")
        assert await jobs.acancel(kids[1])
        failed = await wait_state(h.id, "failed")
    # A cancelled child has no error: the message says it was cancelled, nothing about an error.
    assert failed.error == (f"ChildFailed: 1 of 2 children of job {h.id} did not succeed: "
                            f"job {kids[1]} (d.waiter) was cancelled"), failed.error
    assert failed.attempt == 1


async def test_children_go_to_the_parents_queue_unless_the_request_names_one(durable_db: str) -> None:
    """A child runs on its parent's queue; request(queue=) puts it elsewhere."""
    async with running():
        h = await dj.parent_queues.aenqueue()
        done = await wait_state(h.id, "succeeded", timeout=15.0)
    assert [r["queue"] for r in done.result] == ["default", "default", "elsewhere"]


async def test_a_sync_parent_parks_and_replays(durable_db: str) -> None:
    """A sync job's ctx.run_child parks it the same way."""
    async with running():
        h = await dj.parent_sync.aenqueue(7)
        done = await wait_state(h.id, "succeeded", timeout=15.0)
    assert done.result == {"child": 7, "queue": "default"}


async def test_waiting_parent_shows_what_it_waits_for(durable_db: str) -> None:
    """While children run, the parent is `waiting` for them, with its children's group topic."""
    async with running():
        h = await dj.fan_and_wait.aenqueue(2)
        waiting = await wait_state(h.id, "waiting")
        assert waiting.waiting is not None and waiting.waiting["for"] == "children"
        group = waiting.waiting["group"]
        assert waiting.waiting["name"] == f"group:{group}"
        kids = [r[0] for r in q(durable_db, "SELECT id FROM livepush_jobs WHERE group_id = %s ORDER BY id", (group,))]
        for kid in kids:
            await wait_state(kid, "waiting")
        for i, kid in enumerate(kids):
            await jobs.asignal(kid, f"go-{i}", {"n": i})
        done = await wait_state(h.id, "succeeded")
    assert done.result == [[{"n": 0}], [{"n": 1}]]


async def test_cancelling_a_waiting_parent_cancels_its_unfinished_children(durable_db: str) -> None:
    """cancel() of a parked parent cancels it at once and its children that have not finished."""
    async with running():
        h = await dj.fan_and_wait.aenqueue(3)
        waiting = await wait_state(h.id, "waiting")
        group = waiting.waiting["group"]  # type: ignore[index]
        kids = [r[0] for r in q(durable_db, "SELECT id FROM livepush_jobs WHERE group_id = %s ORDER BY id", (group,))]
        await wait_state(kids[0], "waiting")
        await jobs.asignal(kids[0], "go-0")
        await wait_state(kids[0], "succeeded")
        assert await jobs.acancel(h.id)
        assert (await info(h.id)).state == "cancelled"
        assert (await info(kids[0])).state == "succeeded"
        # A child may still be running (not yet parked) when told: it ends at its worker's turn.
        for k in kids[1:]:
            await wait_state(k, "cancelled")
        assert jobs.get_group(group)["state"] == "cancelled"


async def test_cancel_tagged_counts_tagged_jobs_cancelled_with_their_waiting_parent(durable_db: str) -> None:
    """cancel_tagged() counts every job with the tag that it cancelled or told, also one that
    went with a tagged parent's children (cancelled by the parent's cancel, not its own)."""
    async with running():
        parent = await dj.parent_of_tagged.aenqueue("imp:3", tags=["imp:3"])
        await wait_state(parent.id, "waiting")
        await async_wait_for(lambda: len(jobs.list_tagged("imp:3", unfinished=True)) == 2, 10,
                             message="the child to add its tagged sibling")
        tagged = [j.id for j in jobs.list_tagged("imp:3")]
        assert await jobs.acancel_tagged("imp:3") == 2
        # The sibling may still be running (not yet parked) when told: it ends at its worker's turn.
        for j in tagged:
            await wait_state(j, "cancelled")
        assert jobs.cancel_tagged("imp:3") == 0


async def test_children_whose_cancel_failed_part_way_are_cancelled_by_the_heartbeat(
        durable_db: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """cancel() of a parked parent cancels its children's group after the parent's own cancel
    committed. If that fails part-way (the group marked cancelled, its members not yet), the
    parent is cancelled and nobody will read the children: the heartbeat's sweep of orphaned
    child groups must finish the job, as it does when the children's cancel did not run at all,
    rather than leave them parked (or running) in a group that says cancelled."""
    from psycopg_pool import AsyncConnectionPool

    from livepush.jobs.groups import cancel

    h = await dj.fan_and_wait.aenqueue(3)
    async with running():
        waiting = await wait_state(h.id, "waiting")
        group = waiting.waiting["group"]  # type: ignore[index]
        kids = [r[0] for r in q(durable_db, "SELECT id FROM livepush_jobs WHERE group_id = %s ORDER BY id", (group,))]
        for kid in kids:
            await wait_state(kid, "waiting")

    def dropped(group_id: int, after: int) -> Any:
        raise psycopg.OperationalError("server closed the connection unexpectedly")

    with monkeypatch.context() as patch:
        patch.setattr(cancel, "_chunk_steps", dropped)
        assert await jobs.acancel(h.id)  # the children's cancel fails after the mark; logged
    assert (await info(h.id)).state == "cancelled"
    assert jobs.get_group(group)["state"] == "cancelled"
    async with AsyncConnectionPool(durable_db, min_size=1, max_size=2, open=False) as pool:
        await maintenance.cancel_orphaned_children(pool)
    assert [(await info(k)).state for k in kids] == ["cancelled"] * 3
    view = jobs.get_group(group)
    assert (view["state"], view["cancelled"], view["pending"]) == ("cancelled", 3, 0)
    assert view["finished_at"] is not None


# -- signals ---------------------------------------------------------------------------------------

async def test_signals_sent_before_the_wait_are_kept_in_order(durable_db: str) -> None:
    """Signals sent before the job waits are delivered once each, oldest first."""
    h = await dj.waiter.aenqueue("approval", 2)
    await jobs.asignal(h.id, "approval", {"n": 1})
    await jobs.asignal(h.id, "approval", {"n": 2})
    await jobs.asignal(h.id, "other", {"n": 3})
    async with running():
        done = await wait_state(h.id, "succeeded")
    assert done.result == [{"n": 1}, {"n": 2}]
    assert q(durable_db, "SELECT name FROM livepush_job_signals WHERE job_id = %s", (h.id,)) == [("other",)]


async def test_a_signal_to_a_job_parked_on_something_else_is_kept_for_its_wait(durable_db: str) -> None:
    """A signal sent while the job sleeps does not wake it: the sleep lasts its time, and the wait
    after it takes the signal kept meanwhile without parking."""
    async with running():
        h = await dj.sleep_then_wait.aenqueue(2.0)
        await wait_state(h.id, "waiting")
        await jobs.asignal(h.id, "go", {"by": "ana"})
        still = await info(h.id)
        assert (still.state, still.waiting) == ("waiting", {"for": "sleep", "name": "nap"})
        done = await wait_state(h.id, "succeeded")
    assert done.result == {"by": "ana"}
    names = names_of(durable_db, h.id)
    assert names.count("waiting/waiting") == 1, names  # parked on the sleep only


async def test_a_sync_job_waits_for_signals_and_sleeps_as_an_async_one(durable_db: str) -> None:
    """Sync jobs have the same calls on ctx, blocking (durable.md): a sync job parks on a signal
    and on a sleep (its thread freed), takes the signal's data, and catches a SignalTimeout."""
    async with running():
        h = await dj.waits_and_sleeps_sync.aenqueue()
        parked = await wait_state(h.id, "waiting")
        assert parked.waiting == {"for": "signal", "name": "approval"}
        await jobs.asignal(h.id, "approval", {"by": "ana"})
        done = await wait_state(h.id, "succeeded")
    assert done.result == {"got": {"by": "ana"}, "late": "timeout", "at": "after"} and done.attempt == 1
    assert names_of(durable_db, h.id).count("waiting/waiting") == 2  # the signal, then the sleep
    assert bodies(durable_db, h.id) == ["after"]


async def test_a_signal_wakes_a_parked_job(durable_db: str) -> None:
    """A job parked on a signal waits, holding no slot, until jobs.signal() sends it."""
    async with running(concurrency=1):
        h = await dj.waiter.aenqueue("approval")
        parked = await wait_state(h.id, "waiting")
        assert parked.waiting == {"for": "signal", "name": "approval"}
        assert parked.attempt == 0  # parking gave the attempt back
        other = await dj.steps.aenqueue(1)
        await wait_state(other.id, "succeeded")  # the only slot is free
        await asyncio.to_thread(jobs.signal, h.id, "approval", {"by": "ana"})
        done = await wait_state(h.id, "succeeded")
    assert done.result == [{"by": "ana"}] and done.attempt == 1


async def test_a_limited_job_that_parks_frees_its_key_for_the_next_at_once(durable_db: str) -> None:
    """A job of a concurrency-limited function holds its key's slot while it runs, not while it
    waits parked: a job of the same key, which found the slot taken, starts as soon as the first
    parks, not a poll interval later (the poll here is longer than the wait allows)."""
    dj.KEYED_HOLD["acme"] = hold = asyncio.Event()
    try:
        async with running(poll_interval=30.0) as rt:
            first = await dj.keyed_waiter.aenqueue("acme", "approval")
            await wait_state(first.id, "running")
            second = await dj.keyed_waiter.aenqueue("acme", None)
            await async_wait_for(lambda: ("d.keyed_waiter", "default") in rt._limited_empty, 10,
                                 message="the second job's claim to find the key's one slot taken")
            hold.set()
            await wait_state(first.id, "waiting")
            await wait_state(second.id, "succeeded", timeout=10.0)
    finally:
        del dj.KEYED_HOLD["acme"]


async def test_a_signal_in_a_rolled_back_transaction_is_never_sent(durable_db: str) -> None:
    """signal(conn=) takes part in the caller's transaction."""
    h = await dj.waiter.aenqueue("approval")
    with psycopg.connect(durable_db) as conn:
        jobs.signal(h.id, "approval", 1, conn=conn)
        conn.rollback()
        jobs.signal(h.id, "approval", 2, conn=conn)
        conn.commit()
    async with running():
        done = await wait_state(h.id, "succeeded")
    assert done.result == [2]


async def test_signal_timeout(durable_db: str) -> None:
    """wait_for_signal(timeout=) parks until the timeout, then raises SignalTimeout in the job."""
    async with running():
        t0 = time.monotonic()
        h = await dj.waiter.aenqueue("approval", 1, 0.5)
        await wait_state(h.id, "waiting")
        done = await wait_state(h.id, "succeeded")
    assert done.result == ["timeout"] and time.monotonic() - t0 >= 0.5


async def test_a_signal_timeout_names_the_deadline_the_wait_had(durable_db: str) -> None:
    """The deadline is fixed when a run first reaches the wait: after a deploy that changed
    timeout= under a parked run, SignalTimeout names the timeout and deadline the wait had, not the
    code's new timeout=, which that wait never had."""
    dj.WAIT_TIMEOUT["seconds"] = 0.3
    try:
        async with running():
            h = await dj.redeployed_waiter.aenqueue("approval")
            await wait_state(h.id, "waiting")
            dj.WAIT_TIMEOUT["seconds"] = 3600.0  # the deploy
            failed = await wait_state(h.id, "failed")
    finally:
        dj.WAIT_TIMEOUT["seconds"] = 60.0
    (deadline,) = q(durable_db, "SELECT result ->> 'deadline' FROM livepush_job_steps WHERE job_id = %s "
                                "AND kind = 'signal'", (h.id,))[0]
    assert failed.error is not None and "SignalTimeout" in failed.error
    assert "0.3 s" in failed.error and deadline in failed.error and "3600" not in failed.error, failed.error


@pytest.mark.parametrize("seconds, shown", [(2592000.0, "timeout=2592000 s"), (0.3, "timeout=0.3 s"),
                                            (86400.5, "timeout=86400.5 s")])
def test_a_signal_timeout_writes_its_seconds_as_given(seconds: float, shown: str) -> None:
    """A wait of 30 days says 2592000 s, not 2.592e+06 s."""
    from types import SimpleNamespace

    from livepush.jobs.durable.run import DurableRun

    run = DurableRun(SimpleNamespace(job_id=7))  # type: ignore[arg-type]
    error = run._timeout("approval", {"seconds": seconds, "deadline": "2026-01-31T03:04:05+00:00"})
    assert f"({shown}, fixed when a run first reached the wait)" in str(error), str(error)


async def test_signals_to_missing_or_finished_jobs_are_refused(durable_db: str) -> None:
    """jobs.signal to an unknown or finished job raises a clear error and writes nothing."""
    with pytest.raises(jobs.JobNotFound, match="no job 987654"):
        jobs.signal(987654, "approval")
    for impossible in (2**70, 0, -3):  # ids no job can have: named as given
        with pytest.raises(jobs.JobNotFound, match=f"no job {impossible}:"):
            jobs.signal(impossible, "approval")
    h = await dj.steps.aenqueue(0)
    async with running():
        await wait_state(h.id, "succeeded")
    with pytest.raises(jobs.JobFinishedError, match="has succeeded"):
        await jobs.asignal(h.id, "approval", {"late": True})
    with pytest.raises(jobs.InvalidArgumentsError, match='data\\["x"\\] is a set'):
        jobs.signal(h.id, "approval", {"x": {1}})
    with pytest.raises(ValueError, match="a non-empty str"):
        jobs.signal(h.id, "")
    assert q(durable_db, "SELECT count(*) FROM livepush_job_signals") == [(0,)]


async def test_a_signal_sent_again_with_its_key_is_sent_once(durable_db: str) -> None:
    """jobs.signal(key=): a send retried because its reply was lost (its first try committed) sends
    nothing again and answers the first one's id: the job gets the signal once. So does a retry that
    comes after the job took the signal and finished, instead of JobFinishedError."""
    h = await dj.waiter.aenqueue("approval", 2, 1.0)
    first = await jobs.asignal(h.id, "approval", {"by": "ana"}, key="approval-42")
    again = jobs.signal(h.id, "approval", {"by": "ana"}, key="approval-42")  # the caller's retry
    other = await jobs.asignal(h.id, "approval", {"by": "bo"}, key="approval-43")
    assert again == first and other != first
    async with running():
        done = await wait_state(h.id, "succeeded")
    assert done.result == [{"by": "ana"}, {"by": "bo"}]
    assert await jobs.asignal(h.id, "approval", {"by": "ana"}, key="approval-42") == first
    with pytest.raises(jobs.JobFinishedError, match="has succeeded"):
        await jobs.asignal(h.id, "approval", {"by": "cy"}, key="approval-44")
    with pytest.raises(ValueError, match="key="):
        jobs.signal(h.id, "approval", key="")


async def test_a_signal_key_reused_for_another_signal_is_refused(durable_db: str) -> None:
    """A key names one signal: sent again with another signal's name (a key meant for one signal
    reused for the next), the send is refused and writes nothing, rather than dropped unsaid."""
    h = await dj.waiter.aenqueue("approval")
    await jobs.asignal(h.id, "approval", {"by": "ana"}, key="request-7")
    with pytest.raises(ValueError, match=f"key 'request-7' was sent to job {h.id} with signal 'approval', not 'reject'"):
        jobs.signal(h.id, "reject", {"by": "bo"}, key="request-7")
    assert q(durable_db, "SELECT name FROM livepush_job_signals WHERE job_id = %s", (h.id,)) == [("approval",)]


async def test_two_sends_of_one_signal_key_at_once_send_it_once(durable_db: str) -> None:
    """Two transactions sending the same key at the same moment (a retry racing the first try):
    the second waits for the first and, once it committed, sends nothing and answers its id."""
    h = await dj.waiter.aenqueue("approval", 2, 1.0)
    with psycopg.connect(durable_db) as conn:
        first = jobs.signal(h.id, "approval", {"n": 1}, key="k", conn=conn)  # not committed yet
        racing = asyncio.create_task(asyncio.to_thread(jobs.signal, h.id, "approval", {"n": 2}, key="k"))
        await async_wait_for(lambda: q(durable_db, "SELECT count(*) FROM pg_stat_activity WHERE datname = "
                                               "current_database() AND wait_event_type = 'Lock'") != [(0,)], 10,
                             message="the second send to wait for the first's key")
        conn.commit()
    assert await asyncio.wait_for(racing, 10) == first
    async with running():
        done = await wait_state(h.id, "succeeded")
    assert done.result == [{"n": 1}, "timeout"]


# -- durable sleep ---------------------------------------------------------------------------------

async def test_durable_sleep_parks_then_goes_on(durable_db: str) -> None:
    """ctx.sleep parks the job until its time (state waiting, for sleep), then it replays past it."""
    async with running():
        t0 = time.monotonic()
        h = await dj.sleeper.aenqueue(0.6)
        parked = await wait_state(h.id, "waiting")
        assert parked.waiting == {"for": "sleep", "name": "nap"}
        done = await wait_state(h.id, "succeeded")
    assert time.monotonic() - t0 >= 0.6
    assert done.result == "rested" and bodies(durable_db, h.id) == ["before", "after"]


async def test_a_drain_counts_a_parked_job_in_none_of_its_outcomes_until_one_runs_it_to_its_end(
        durable_db: str) -> None:
    """jobs.adrain() returns counts by outcome: a durable job that parks is not among them (it is
    `waiting`, no outcome yet), and a later drain, once its sleep is over, counts it succeeded."""
    h = await dj.sleeper.aenqueue(0.3)
    assert await jobs.adrain(["default"]) == {}
    assert (await info(h.id)).state == "waiting"

    async def sleep_over() -> bool:
        return bool(q(durable_db, "SELECT run_at <= now() FROM livepush_jobs WHERE id = %s", (h.id,))[0][0])

    await async_wait_for(sleep_over, 5, message="the sleep to end")
    assert await jobs.adrain(["default"]) == {"succeeded": 1}
    assert (await info(h.id)).result == "rested"


async def test_a_durable_sleep_spans_a_drain_and_wakes_under_the_next_runtime(durable_db: str) -> None:
    """A drain (what SIGTERM starts) does not wait for a sleeping job, which holds no slot; the
    sleep ends while no runtime runs, and the next runtime to start runs it on from there, its
    checkpoint before the sleep not run again."""
    rt = Runtime(REGISTRY, install_signals=False, queues=["default"], heartbeat=0.2, poll_interval=0.2)
    task = asyncio.create_task(rt.run())
    await rt.wait_started()
    h = await dj.sleeper.aenqueue(0.3)
    await wait_state(h.id, "waiting")
    rt.stop()  # the drain, not stop(now=True)
    await asyncio.wait_for(task, 10)

    async def sleep_over() -> bool:
        return bool(q(durable_db, "SELECT run_at <= now() FROM livepush_jobs WHERE id = %s", (h.id,))[0][0])

    await async_wait_for(sleep_over, 5, message="the sleep to end while no runtime runs")
    assert (await info(h.id)).state == "waiting"
    async with running():
        done = await wait_state(h.id, "succeeded")
    assert done.result == "rested" and done.attempt == 1
    assert bodies(durable_db, h.id) == ["before", "after"]


async def test_a_sleep_whose_seconds_a_deploy_changed_ends_at_the_time_it_had(durable_db: str) -> None:
    """A sleep's end is fixed when a run first reaches it (durable.md, changing a job's code): a
    deploy that lengthens it under a parked run does not keep that run asleep for the new time."""
    dj.SLEEP_SECONDS["seconds"] = 0.3
    try:
        async with running():
            h = await dj.redeployed_sleeper.aenqueue()
            await wait_state(h.id, "waiting")
            dj.SLEEP_SECONDS["seconds"] = 3600.0  # the deploy
            done = await wait_state(h.id, "succeeded")
    finally:
        dj.SLEEP_SECONDS["seconds"] = 60.0
    assert done.result == "rested"


async def test_a_sleep_replayed_before_its_end_sleeps_on_when_the_apps_clock_is_ahead(
        durable_db: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A sleep is timed by Postgres' clock (durable.md): a run replayed before the sleep's end (woken
    early here) parks again, also when its process's clock runs an hour ahead of the database's."""
    from datetime import datetime, timedelta

    from livepush.jobs.durable import run as durable_run

    class AheadClock(datetime):
        @classmethod
        def now(cls, tz: Any = None) -> Any:
            return datetime.now(tz) + timedelta(hours=1)

    dj.SLEEP_SECONDS["seconds"] = 30.0
    try:
        async with running():
            h = await dj.redeployed_sleeper.aenqueue()
            await wait_state(h.id, "waiting")
            monkeypatch.setattr(durable_run, "datetime", AheadClock)
            q(durable_db, "UPDATE livepush_jobs SET run_at = now() WHERE id = %s", (h.id,))  # woken early

            async def replayed() -> bool:
                names = names_of(durable_db, h.id)
                return names.count("waiting/waiting") == 2 or names[-1] == "succeeded/succeeded"

            await async_wait_for(replayed, 10, message="the early-woken run to park again or end")
            found = await info(h.id)
            await jobs.acancel(h.id)
    finally:
        dj.SLEEP_SECONDS["seconds"] = 60.0
    assert (found.state, found.waiting) == ("waiting", {"for": "sleep", "name": "nap"})


def _days_across_a_clock_change(zone: str) -> int:
    """A whole number of days from now whose end is in another UTC offset of `zone` than now (a
    day either side too, so the test does not depend on the hour it runs)."""
    from datetime import datetime, timedelta
    from zoneinfo import ZoneInfo

    tz = ZoneInfo(zone)
    now = datetime.now(tz)
    for days in range(30, 400, 30):
        ends = [now + timedelta(days=days + d) for d in (-1, 0, 1)]
        if all(end.astimezone(tz).utcoffset() != now.utcoffset() for end in ends):
            return days
    raise AssertionError(f"no clock change in {zone} within a year")


async def test_a_durable_sleep_across_a_daylight_saving_change_lasts_its_seconds(durable_db: str) -> None:
    """A sleep (and a signal's timeout) ends `seconds` after it began, also when the database's time
    zone changes its clocks meanwhile: not an hour early or late, as adding the seconds to the
    local wall-clock time would make it."""
    (db,) = q(durable_db, "SELECT current_database()")[0]
    q(durable_db, f'ALTER DATABASE "{db}" SET timezone TO \'Europe/Paris\'')
    days = _days_across_a_clock_change("Europe/Paris")
    async with running():
        slept = await dj.sleeper.aenqueue(days * 86400.0)
        waits = await dj.waiter.aenqueue("go", 1, days * 86400.0)
        await wait_state(slept.id, "waiting")
        await wait_state(waits.id, "waiting")
        rows = q(durable_db, "SELECT j.id, extract(epoch FROM j.run_at - s.at)::float8 FROM livepush_jobs j "
                             "JOIN livepush_job_steps s ON s.job_id = j.id AND s.kind IN ('sleep', 'signal') "
                             "WHERE j.id = ANY(%s)", ([slept.id, waits.id],))
        for job_id in (slept.id, waits.id):
            await jobs.acancel(job_id)
    assert len(rows) == 2
    for job_id, seconds in rows:
        assert abs(seconds - days * 86400) < 60, (job_id, seconds - days * 86400)


# -- events and retention --------------------------------------------------------------------------

async def test_checkpoint_and_waiting_events_and_the_result_on_the_job_topic(durable_db: str) -> None:
    """job:<id> shows `checkpoint` (naming it), `waiting` (with what for) and the result at the end."""
    async with running():
        h = await dj.sleeper.aenqueue(0.2)
        await wait_state(h.id, "succeeded")
    from tests.support.job_versions import events_of

    events = events_of(durable_db, h.id)
    kinds = [e["event"] for e in events]
    assert kinds[:4] == ["enqueued", "started", "checkpoint", "waiting"]
    assert kinds[-2:] == ["checkpoint", "succeeded"]
    state = (await asyncio.to_thread(read_states, durable_db, [h.topic]))[h.topic]
    final = json.loads(state.data_json())
    assert final["event"] == "succeeded" and final["job"]["result"] == "rested"
    assert state.version == len(events)


async def test_a_parked_job_keeps_showing_its_progress_until_it_ends(durable_db: str) -> None:
    """Parking gives the attempt back, but it is the same run: `waiting` and the replay that follows
    show the progress it reported before it parked."""
    async with running():
        h = await dj.progress_then_sleep.aenqueue(0.2)
        await wait_state(h.id, "succeeded")
    from tests.support.job_versions import events_of

    events = events_of(durable_db, h.id)
    half = {"done": 1, "total": 2, "message": "half way"}
    after = events[[e["event"] for e in events].index("waiting"):]
    assert [e["event"] for e in after][:3] == ["waiting", "enqueued", "started"], [e["event"] for e in events]
    assert all(e["job"]["progress"] == half for e in after), after


async def test_a_retry_that_parks_does_not_show_the_failed_attempts_progress(durable_db: str) -> None:
    """A retry starts again from nothing, also when it parks before it reports progress: `waiting`
    shows no progress, not how far the attempt before it got (parking gives the attempt back, and
    the failed attempt's progress would read as the parked run's)."""
    async with running():
        h = await dj.progress_then_fail_then_wait.aenqueue("go")
        parked = await wait_state(h.id, "waiting")
        await jobs.asignal(h.id, "go", "went")
        await wait_state(h.id, "succeeded")
    from tests.support.job_versions import events_of

    nothing = {"done": 0, "total": None, "message": None}
    assert parked.progress == nothing, parked
    events = events_of(durable_db, h.id)
    retrying = next(e for e in events if e["event"] == "retrying")
    assert retrying["job"]["progress"] == {"done": 1, "total": 2, "message": "first attempt"}
    after = events[[e["event"] for e in events].index("waiting"):]
    assert all(e["job"]["progress"] == nothing for e in after), after


async def test_the_checkpoint_event_names_the_checkpoint(durable_db: str) -> None:
    """A page reading job:<id> right after a checkpoint sees the `checkpoint` event and its name."""
    async with running():
        h = await dj.checkpoint_then_hold.aenqueue("let-go")
        await async_wait_for(lambda: bodies(durable_db, h.id) == ["fetched"], 10.0, message="the checkpoint")

        async def checkpoint_seen() -> dict[str, Any] | None:
            state = (await asyncio.to_thread(read_states, durable_db, [h.topic]))[h.topic]
            data = json.loads(state.data_json())
            return data if data["event"] == "checkpoint" else None

        data = await async_wait_for(checkpoint_seen, 10.0, message="the checkpoint event")
        assert data["job"]["checkpoint"] == "fetched" and data["job"]["state"] == "running"
        q(durable_db, "INSERT INTO job_flags VALUES ('let-go')")
        await wait_state(h.id, "succeeded")


async def test_retention_removes_steps_and_signals_with_their_job(durable_db: str) -> None:
    """Pruning a finished job deletes its stored steps, unread signals and signal keys too."""
    h = await dj.waiter.aenqueue("approval", 1, 0.0)
    await jobs.asignal(h.id, "other", 1, key="other-1")
    async with running():
        await wait_state(h.id, "succeeded")
    assert q(durable_db, "SELECT count(*) FROM livepush_job_steps WHERE job_id = %s", (h.id,)) != [(0,)]
    q(durable_db, "UPDATE livepush_jobs SET finished_at = now() - interval '2 days' WHERE id = %s", (h.id,))
    from livepush.jobs import database

    pool = await database.pools().aget()
    await maintenance.prune(pool, 3600)
    assert await jobs.aget_job(h.id) is None
    assert q(durable_db, "SELECT count(*) FROM livepush_job_steps WHERE job_id = %s", (h.id,)) == [(0,)]
    assert q(durable_db, "SELECT count(*) FROM livepush_job_signals WHERE job_id = %s", (h.id,)) == [(0,)]
    assert q(durable_db, "SELECT count(*) FROM livepush_job_signal_keys WHERE job_id = %s", (h.id,)) == [(0,)]


async def test_get_job_of_an_unknown_id_is_none(durable_db: str) -> None:
    """get_job answers None for an id that names no job, and a TypeError for a non-int."""
    assert jobs.get_job(424242) is None
    with pytest.raises(TypeError, match="job_id must be an int"):
        jobs.get_job("7")  # type: ignore[arg-type]


async def test_a_parked_member_is_listed_with_no_run_at(durable_db: str) -> None:
    """group_members() lists a member parked without a time (its run_at is None, not an error)."""
    async with running():
        h = await dj.fan_and_wait.aenqueue(1)
        waiting = await wait_state(h.id, "waiting")
        group = waiting.waiting["group"]  # type: ignore[index]
        (kid,) = [r[0] for r in q(durable_db, "SELECT id FROM livepush_jobs WHERE group_id = %s", (group,))]
        await wait_state(kid, "waiting")
        members, _ = await asyncio.to_thread(jobs.group_members, group)
        assert [(m["id"], m["state"], m["run_at"]) for m in members] == [(kid, "waiting", None)]
        await jobs.asignal(kid, "go-0")
        await wait_state(h.id, "succeeded")


async def test_retention_keeps_the_children_of_a_job_that_has_not_finished(durable_db: str) -> None:
    """A finished group of children outlives the retention time while its parent still waits."""
    async with running():
        h = await dj.parent.aenqueue([1, 2])
        await wait_state(h.id, "succeeded", timeout=15.0)
    groups = [r[0] for r in q(durable_db, "SELECT id FROM livepush_groups WHERE parent_id = %s", (h.id,))]
    assert len(groups) == 2
    q(durable_db, "UPDATE livepush_groups SET finished_at = now() - interval '2 days' WHERE parent_id = %s", (h.id,))
    q(durable_db, "UPDATE livepush_jobs SET state = 'waiting', finished_at = NULL WHERE id = %s", (h.id,))
    from livepush.jobs import database

    pool = await database.pools().aget()
    await maintenance.prune(pool, 3600)
    assert q(durable_db, "SELECT count(*) FROM livepush_groups WHERE parent_id = %s", (h.id,)) == [(2,)]
    q(durable_db, "UPDATE livepush_jobs SET state = 'succeeded', finished_at = now() - interval '2 days' "
                  "WHERE id = %s", (h.id,))
    await maintenance.prune(pool, 3600)
    assert q(durable_db, "SELECT count(*) FROM livepush_groups WHERE parent_id = %s", (h.id,)) == [(0,)]


@pytest.mark.parametrize("change", ["names", "count"])
async def test_a_children_call_changed_by_a_redeploy_fails_the_job_instead_of_replaying_other_children(
        durable_db: str, change: str) -> None:
    """A parked run whose children call asks, after a redeploy, for other jobs or another number of
    them than the children it stored fails at once with ReplayMismatch naming both, instead of
    returning the stored children's results as this call's."""
    async with running(queues=["default"]):  # its child, on "elsewhere", waits meanwhile
        h = await dj.redeployed_children.aenqueue("deployed", change)
        await wait_state(h.id, "waiting", timeout=15.0)
    q(durable_db, "INSERT INTO durable_inputs VALUES ('deployed', 'true')")
    async with running():
        failed = await wait_state(h.id, "failed", timeout=15.0)
    assert failed.attempt == 1, failed
    assert "ReplayMismatch" in (failed.error or "") and "[d.child_elsewhere]" in (failed.error or ""), failed.error


async def test_retention_keeps_the_children_of_a_failed_job_that_retry_failed_replays(durable_db: str) -> None:
    """A failed durable job can be run again (retry_failed) as long as it exists: its children's
    group is kept as long as it, however long ago the children finished, so the retry replays their
    results instead of failing on a group that retention deleted."""
    h = await dj.child_then_step.aenqueue("go-on")
    async with running():
        failed = await wait_state(h.id, "failed", timeout=15.0)
    assert "the step after the child fails" in (failed.error or "")
    q(durable_db, "UPDATE livepush_groups SET finished_at = now() - interval '2 days' WHERE parent_id = %s", (h.id,))
    from livepush.jobs import database

    pool = await database.pools().aget()
    await maintenance.prune(pool, 3600)  # the job failed just now: it is kept, and what it replays
    q(durable_db, "INSERT INTO durable_inputs VALUES ('go-on', 'true')")
    assert await asyncio.to_thread(jobs.retry_failed, h.id)
    async with running():
        done = await wait_state(h.id, "succeeded", timeout=15.0)
    assert done.result == {"child": "kept", "queue": "default"}


async def test_an_open_signal_transaction_does_not_hold_up_a_running_job(durable_db: str) -> None:
    """jobs.signal(conn=) in a transaction left open does not block the job's own writes."""
    async with running():
        h = await dj.checkpoint_then_hold.aenqueue("release")
        await wait_state(h.id, "running")
        with psycopg.connect(durable_db) as conn:
            jobs.signal(h.id, "later", {"x": 1}, conn=conn)
            q(durable_db, "INSERT INTO job_flags VALUES ('release')")
            await wait_state(h.id, "succeeded")  # its checkpoint and outcome went through meanwhile
            conn.commit()


async def test_a_debounce_queues_behind_a_woken_durable_job_instead_of_replacing_it(durable_db: str) -> None:
    """A durable job woken from its park (available again, its steps stored) has started: a
    debounced enqueue of its key queues a new job behind it, as behind a running or waiting one.
    Replacing its arguments would replay steps stored for the old ones under the new ones."""
    async with running():
        h = await dj.waiter.aenqueue("approval", key="approval-key")
        await wait_state(h.id, "waiting")
    await jobs.asignal(h.id, "approval", {"by": "ana"})
    assert (await info(h.id)).state == "available"
    behind = await dj.waiter.aenqueue("other", key="approval-key", debounce=0)
    assert behind.id != h.id
    assert (await info(h.id)).args == ["approval"]
    async with running():
        done = await wait_state(h.id, "succeeded")
        await wait_state(behind.id, "waiting")
    assert done.result == [{"by": "ana"}]


async def test_an_open_signal_transaction_holds_up_nothing_but_a_park(durable_db: str) -> None:
    """jobs.signal(conn=) in a transaction left open holds up a park of that job and nothing else:
    a queued job is claimed and runs, and jobs.cancel() of another such job returns at once."""
    h = await dj.steps.aenqueue(1)
    other = await dj.waiter.aenqueue("approval")
    with psycopg.connect(durable_db) as conn:
        jobs.signal(h.id, "later", {"x": 1}, conn=conn)
        jobs.signal(other.id, "later", {"x": 2}, conn=conn)
        assert await asyncio.wait_for(jobs.acancel(other.id), 5.0)
        assert (await info(other.id)).state == "cancelled"
        async with running():
            await wait_state(h.id, "succeeded")
        conn.commit()


async def test_parks_held_up_by_open_signal_transactions_do_not_silence_the_runtimes_heartbeat(
        durable_db: str, caplog: pytest.LogCaptureFixture) -> None:
    """Each park that waits on a jobs.signal(conn=) transaction left open holds a connection. With
    more such parks than the runtime's pool has connections, the runtime still beats: it is not
    presumed dead, and its jobs are not run again elsewhere, while the transactions stay open."""
    handles = [await dj.waiter.aenqueue("go") for _ in range(8)]
    conns = [psycopg.connect(durable_db) for _ in handles]
    try:
        for conn, h in zip(conns, handles):
            jobs.signal(h.id, "other", {}, conn=conn)  # holds the job's row until it commits
        async with running(concurrency=10) as rt:
            def parks_waiting() -> bool:
                return q(durable_db, "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                                     "AND datname = current_database()")[0][0] >= 6

            await async_wait_for(parks_waiting, 15.0, message="six parks to wait on the open transactions")

            def beat() -> Any:
                return q(durable_db, "SELECT heartbeat_at FROM livepush_job_runtimes WHERE id = %s", (rt.id,))[0][0]

            first = beat()
            # Three beats (0.2 s each) later the others would presume it dead.
            await async_wait_for(lambda: beat() > first, 5.0, message="the runtime to beat again")
            later = beat()
            await async_wait_for(lambda: beat() > later, 5.0, message="the runtime to beat once more")
            for conn in conns:
                conn.commit()
            await async_wait_for(lambda: all(s == "waiting" for s in q(durable_db, "SELECT array_agg(state) FROM "
                                                                       "livepush_jobs")[0][0]),
                                 15.0, message="every job to park")
    finally:
        for conn in conns:
            conn.close()
    assert "presumed dead" not in caplog.text and "stopped beating" not in caplog.text, caplog.text


async def test_a_signal_from_a_repeatable_read_transaction_is_never_missed(durable_db: str) -> None:
    """jobs.signal(conn=) in a REPEATABLE READ transaction whose snapshot predates the job's park
    cannot see the park, so it cannot wake the job: it must fail loudly (a serialization error,
    the caller's to retry), never keep a signal that the parked job will not wake up for."""
    from livepush.errors import DependencyError

    h = await dj.waiter.aenqueue("approval")
    with psycopg.connect(durable_db) as conn:
        conn.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
        conn.execute("SELECT 1")  # the transaction's snapshot: the job is queued, not parked
        async with running():
            await wait_state(h.id, "waiting")
            try:
                jobs.signal(h.id, "approval", {"by": "ana"}, conn=conn)
                conn.commit()
            except DependencyError:
                conn.rollback()
                await jobs.asignal(h.id, "approval", {"by": "ana"})  # the caller's retry
            done = await wait_state(h.id, "succeeded")
    assert done.result == [{"by": "ana"}]


async def test_sync_checkpoint_functions_run_side_by_side_up_to_the_runtimes_concurrency(durable_db: str) -> None:
    """A checkpoint's sync function runs in a thread of the runtime's, as a sync job does: as many
    run at once as the runtime has slots (the loop's default pool has a few threads, and the others
    waited there with their slots held)."""
    handles = [await dj.checkpoint_together.aenqueue() for _ in range(dj.TOGETHER)]
    async with running(concurrency=dj.TOGETHER):
        for h in handles:
            assert (await wait_state(h.id, "succeeded", timeout=30)).state == "succeeded"


async def test_signal_data_too_large_to_store_is_refused_naming_it(durable_db: str) -> None:
    """jobs.signal()/asignal() data past what one jsonb value holds (256 MiB) raises
    InvalidArgumentsError naming it, and sends nothing: a DependencyError said Postgres had failed,
    for a call that fails the same however often it is tried again."""
    h = await dj.waiter.aenqueue("approval")
    half = "x" * 140_000_000  # twice over the limit; one string, so the test holds it once
    with pytest.raises(jobs.InvalidArgumentsError, match="data is too large for Postgres to store"):
        jobs.signal(h.id, "approval", [half, half])
    with pytest.raises(jobs.InvalidArgumentsError, match="data is too large for Postgres to store"):
        await jobs.asignal(h.id, "approval", [half, half])
    del half
    assert q(durable_db, "SELECT count(*) FROM livepush_job_signals") == [(0,)]
    await jobs.asignal(h.id, "approval", {"by": "ana"})  # the job still takes one


async def test_signal_data_past_one_message_to_postgres_is_refused_leaving_the_callers_transaction_usable(
        durable_db: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """jobs.signal() data whose JSON passes what one message to Postgres carries (lowered here to
    100,000 bytes) raises InvalidArgumentsError naming it before anything is sent, and with conn=
    the caller's transaction goes on: Postgres closed the connection on such a message, which was
    said as an outage."""
    from livepush.jobs.api import args

    monkeypatch.setattr(args, "SENDABLE", 100_000)
    h = await dj.waiter.aenqueue("approval")
    with psycopg.connect(durable_db) as conn:
        conn.execute("INSERT INTO job_flags (name) VALUES ('before')")
        with pytest.raises(jobs.InvalidArgumentsError, match=r"data is too large for Postgres to store \(past the 1 GiB"):
            jobs.signal(h.id, "approval", "x" * 150_000, conn=conn)
        conn.execute("INSERT INTO job_flags (name) VALUES ('after')")
        conn.commit()
    assert q(durable_db, "SELECT name FROM job_flags ORDER BY name") == [("after",), ("before",)]
    assert q(durable_db, "SELECT count(*) FROM livepush_job_signals") == [(0,)]


async def test_children_too_large_to_store_fail_their_parent_naming_them(durable_db: str) -> None:
    """ctx.run_children() whose children's arguments are past what one jsonb value holds (256 MiB)
    fails the parent's attempt with InvalidArgumentsError naming them, and creates no child: a
    DependencyError said Postgres had failed, for children no retry can create."""
    h = await dj.too_large_children.aenqueue()
    async with running():
        failed = await wait_state(h.id, "failed", timeout=30.0)
    assert failed.error.startswith(f"InvalidArgumentsError: the arguments of job {h.id}'s 2 children are too large "
                                   "for Postgres to store"), failed.error
    assert q(durable_db, "SELECT count(*) FROM livepush_jobs") == [(1,)]
