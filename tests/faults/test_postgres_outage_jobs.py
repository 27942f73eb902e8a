"""Job runtimes that stay alive through a Postgres outage (docs/jobs.md, Deploys, shutdown and
crashes): the outage is no runtime's silence, so nothing they hold is taken from them."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import psycopg
import psycopg.sql
import pytest

from livepush import jobs
from tests.faults.fleet import Fleet, postgres_down
from tests.jobs import sample_jobs
from tests.jobs.conftest import q
from tests.support import services
from tests.support.waiting import async_wait_for

# The runtimes' heartbeat (s), and how long Postgres stays down: many more than three beats.
# Three beats outlast a pool's reconnect cadence (a second), as docs/jobs.md asks of a runtime
# that lives through an outage: it must beat again within three beats of the outage's end.
HEARTBEAT = 0.6
OUTAGE = 6.0
# The read-only test's: a read-only spell of ten short beats.
READ_ONLY_HEARTBEAT = 0.3
READ_ONLY_SPELL = 3.0
# Long enough for failing claims to back off to their cap (5 s, jittered to 2.5-7.5 s), and how
# soon after Postgres is back a job enqueued then must have run all the same.
LONG_OUTAGE = 10.0
PROMPT = 2.0
# How long each job runs: it is running when Postgres stops, and ends well after it is back.
HOLD = OUTAGE + 8.0


@contextlib.asynccontextmanager
async def database_away(url: str, mode: str) -> AsyncIterator[None]:
    """The database is out of reach inside the block: PostgreSQL stopped ("fast", "immediate"),
    or ("refused") every connection to the database closed and new ones refused, PostgreSQL
    itself running on (as a network cut between the runtimes and it would look)."""
    if mode != "refused":
        async with postgres_down(mode):
            yield
        return
    admin_url = services.db_url(url, "postgres")
    with services.pg_refusing_connections(admin_url, services.dbname_of(url)):
        await asyncio.to_thread(services.pg_terminate, admin_url, services.dbname_of(url))
        yield


async def commits_written(url: str) -> None:
    """Wait until Postgres has written out its WAL as far as it reached now. Claims commit
    asynchronously (docs/jobs.md): their commit records wait in the WAL buffers for the WAL
    writer's next turn, and a crash ("immediate") before it forgets them."""
    ((reached,),) = await asyncio.to_thread(q, url, "SELECT pg_current_wal_insert_lsn()::text")
    await async_wait_for(lambda: asyncio.to_thread(
        lambda: q(url, "SELECT pg_current_wal_flush_lsn() >= %s::pg_lsn", (reached,))[0][0]), 10.0,
        message="the WAL to be written out past the claims' commits")


@pytest.mark.parametrize("mode", ["fast", "immediate", "refused"])
async def test_runtimes_alive_through_an_outage_keep_their_jobs(fleet: Fleet, mode: str) -> None:
    """Two runtimes, each running one job, while the database is out of their reach for ten
    heartbeats (PostgreSQL stopped, crashed, or refusing them while it runs on): once it is
    back, neither runtime is presumed dead by the other, so each job runs once, on its first
    attempt, and succeeds; the silence was the outage's, not theirs."""
    await fleet.runtimes(2, "--concurrency", "1", heartbeat=HEARTBEAT)
    ids = [(await sample_jobs.hold.aenqueue(HOLD)).id for _ in range(2)]

    def started() -> bool:
        return len(q(fleet.url, "SELECT DISTINCT pid FROM job_runs WHERE phase = 'start'")) == 2

    await async_wait_for(lambda: asyncio.to_thread(started), 15.0, message="each runtime to start its job")
    await commits_written(fleet.url)
    async with database_away(fleet.url, mode):
        await asyncio.sleep(OUTAGE)

    await fleet.wait_jobs_done(ids, timeout=HOLD + 30)
    starts = q(fleet.url, "SELECT job_id, attempt FROM job_runs WHERE phase = 'start' ORDER BY job_id, attempt")
    assert starts == [(i, 1) for i in ids], (
        f"a job ran again although its runtime was alive: {starts}\n{fleet.runtime_log('dead', 'released')}")
    assert q(fleet.url, "SELECT id, attempt FROM livepush_jobs ORDER BY id") == [(i, 1) for i in ids]
    assert fleet.runtime_log("presumed dead", "stopped beating") == ""
    assert fleet.still_running() == []


async def test_runtimes_after_a_failover_to_a_copy_that_lacks_a_registration_keep_ids_of_their_own(
        fleet: Fleet) -> None:
    """A failover to a copy of the database that lacks the last registrations (a restored backup,
    a standby that was behind): a runtime that still runs there and one that starts there each
    register and beat a row of their own, never one id for both (which made one beat, claim and,
    at its stop, give back the other's jobs as its own)."""
    (old,) = await fleet.runtimes(1, heartbeat=HEARTBEAT)
    ((old_id,),) = q(fleet.url, "SELECT id FROM livepush_job_runtimes WHERE pid = %s", (old.pid,))
    # The copy: the old runtime's row is not there, nor are the values any sequence gave since.
    q(fleet.url, """
        WITH gone AS (DELETE FROM livepush_job_runtimes WHERE id = %(id)s)
        SELECT setval(pg_get_serial_sequence('livepush_job_runtimes', 'id'), %(id)s, false)""", {"id": old_id})
    (new,) = await fleet.runtimes(1, heartbeat=HEARTBEAT)

    def both_registered() -> bool:
        return {pid for (pid,) in q(fleet.url, "SELECT pid FROM livepush_job_runtimes")} == {old.pid, new.pid}

    await async_wait_for(lambda: asyncio.to_thread(both_registered), 10.0,
                         message="each runtime to beat a row of its own")
    ids = q(fleet.url, "SELECT id, pid FROM livepush_job_runtimes ORDER BY pid")
    assert len({i for i, _ in ids}) == 2, ids
    assert fleet.still_running() == []


async def test_claims_backed_off_through_a_long_outage_resume_as_soon_as_postgres_is_back(fleet: Fleet) -> None:
    """Claims that fail through a long outage wait longer and longer between tries (up to 7.5 s);
    a job enqueued once Postgres is back starts at once all the same: the enqueue's ring (and the
    listener's return) wakes the claims, which do not sit out the rest of their backoff."""
    (runtime,) = await fleet.runtimes(1, heartbeat=HEARTBEAT)
    async with database_away(fleet.url, "refused"):
        await asyncio.sleep(LONG_OUTAGE)
    # From before the enqueue to the job's run, both on the database's clock: not the outcome's
    # write and this test's polling for it, which a loaded machine can add a second to.
    ((before,),) = q(fleet.url, "SELECT clock_timestamp()")
    handle = await sample_jobs.record.aenqueue("after the outage")
    await fleet.wait_jobs_done([handle.id], timeout=30)
    ((ran,),) = q(fleet.url, "SELECT min(at) FROM job_runs WHERE job_id = %s", (handle.id,))
    took = (ran - before).total_seconds()
    assert took < PROMPT, f"the job started {took:.1f} s after its enqueue\n{runtime.output(3000)}"
    assert fleet.still_running() == []


def _read_only(admin_url: str, url: str, on: bool) -> None:
    """Every new session of the database is read-only (on) or not, as a standby not yet promoted
    or a primary demoted during a failover refuses writes; open sessions are closed so that the
    runtime's next ones are new."""
    dbname = services.dbname_of(url)
    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(psycopg.sql.SQL("ALTER DATABASE {} SET default_transaction_read_only = {}").format(
            psycopg.sql.Identifier(dbname), psycopg.sql.SQL("on" if on else "off")))
    services.pg_terminate(admin_url, dbname)


async def test_a_runtime_whose_outcomes_meet_a_read_only_database_waits_for_it_to_take_writes(
        fleet: Fleet, pg_admin_url: str) -> None:
    """Jobs that end while the database refuses writes (a failover's standby, not yet promoted):
    the runtime keeps their outcomes and writes them once it takes writes again, so each job
    succeeds once, on its first attempt, and the runtime runs on; it neither gives up its
    outcomes nor stops, which left the jobs running until a rescue ran them again."""
    q(fleet.url, sample_jobs.FLAGS_TABLE)
    (runtime,) = await fleet.runtimes(1, "--concurrency", "2", heartbeat=READ_ONLY_HEARTBEAT)
    ids = [(await sample_jobs.progress_then_wait.aenqueue("waiting", "go")).id for _ in range(2)]

    def running() -> bool:
        return q(fleet.url, "SELECT count(*) FROM livepush_jobs j JOIN livepush_job_payloads p USING (id) "
                            "WHERE j.state = 'running' AND p.progress IS NOT NULL") == [(2,)]

    await async_wait_for(lambda: asyncio.to_thread(running), 15.0, message="both jobs to run and report progress")
    await asyncio.to_thread(_read_only, pg_admin_url, fleet.url, True)
    try:
        with psycopg.connect(fleet.url, autocommit=True) as conn:
            conn.execute("SET default_transaction_read_only = off")
            conn.execute("INSERT INTO job_flags (name) VALUES ('go')")  # the jobs end now
        await asyncio.sleep(READ_ONLY_SPELL)
        assert runtime.running, runtime.output()
    finally:
        await asyncio.to_thread(_read_only, pg_admin_url, fleet.url, False)

    await fleet.wait_jobs_done([], timeout=30)
    assert q(fleet.url, "SELECT id, state, attempt FROM livepush_jobs ORDER BY id") == [(i, "succeeded", 1) for i in ids]
    assert fleet.still_running() == []


@pytest.mark.parametrize("mode", ["fast", "immediate"])
async def test_a_workflow_run_through_a_postgres_restart_mid_step_runs_each_step_once(fleet: Fleet, mode: str) -> None:
    """PostgreSQL stops (or crashes) while a workflow's first step runs, and starts again: the
    run goes on from where it was, its fan-out step's batch, its wait for a person's signal and
    its last step, and ends succeeded with each step's job and each batch member created once,
    the running step on its first attempt: the restart lost no step's work and doubled none."""
    from tests.faults import outage_flow_defs as od

    await fleet.runtimes(2, "--queues", f"{od.QUEUE},default", "--concurrency", "4", heartbeat=HEARTBEAT,
                         module="tests.faults.outage_flow_defs")
    run = await od.flow.astart({"hold": HOLD, "n": 3})

    def first_started() -> bool:
        return q(fleet.url, "SELECT count(*) FROM job_runs WHERE phase = 'start'") == [(1,)]

    await async_wait_for(lambda: asyncio.to_thread(first_started), 15.0, message="the first step to start")
    await commits_written(fleet.url)
    async with database_away(fleet.url, mode):
        await asyncio.sleep(OUTAGE)

    async def waits_for_go() -> bool:
        got = await asyncio.to_thread(jobs.workflows.get, run.id)
        return got is not None and got["steps"]["approve"]["state"] == "waiting"

    await async_wait_for(waits_for_go, HOLD + 30, interval=0.2, message="the run to wait for its signal")
    await jobs.workflows.asignal(run.id, "go", {"by": "ana"}, actor="ana")

    async def ended() -> dict[str, Any] | None:
        got = await asyncio.to_thread(jobs.workflows.get, run.id)
        return got if got is not None and got["state"] in ("succeeded", "failed", "cancelled") else None

    done = await async_wait_for(ended, 30.0, interval=0.2, message="the run to end")
    assert done["state"] == "succeeded", (done, fleet.runtime_log("error", "Error", "failed"))
    assert {n: (s["state"], s["attempt"]) for n, s in done["steps"].items()} == {
        "first": ("succeeded", 1), "spread": ("succeeded", 1), "approve": ("succeeded", 1), "last": ("succeeded", 1)}
    assert done["steps"]["last"]["output"] == {
        "members": {"total": 3, "succeeded": 3, "failed": 0, "cancelled": 0}, "by": {"by": "ana"}}
    assert q(fleet.url, "SELECT name, count(*) FROM livepush_jobs GROUP BY name ORDER BY name") == [
        ("outage_flow.approve", 1), ("outage_flow.first", 1), ("outage_flow.last", 1), ("outage_flow.spread", 1),
        ("t.record", 3)]
    assert q(fleet.url, "SELECT key, count(*) FROM job_runs WHERE key IS NOT NULL GROUP BY key ORDER BY key") == [
        (f"member-{i}", 1) for i in range(3)]
    assert fleet.runtime_log("presumed dead", "stopped beating") == ""
    assert fleet.still_running() == []
