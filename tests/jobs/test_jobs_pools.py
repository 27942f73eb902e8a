"""After the server closed every connection (a restart, a failover, pg_terminate_backend), the
next call through a client pool works: no caller is handed a connection the server closed."""

from __future__ import annotations

from typing import Any

import pytest

import livepush
from livepush.jobs import database, job_state
from livepush.jobs.groups import steps
from livepush.jobs.groups.transactions import ain_tx, in_tx
from tests.jobs import sample_jobs
from tests.jobs.conftest import q
from tests.support.procs import fork_running, forked_exit_status
from tests.support.waiting import wait_for

_OTHERS = ("FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid() "
           "AND backend_type = 'client backend'")


def close_every_connection(url: str) -> int:
    """Terminate every other client backend of the database and wait until they are gone."""
    killed = q(url, f"SELECT count(pg_terminate_backend(pid)) {_OTHERS}")[0][0]
    wait_for(lambda: q(url, f"SELECT count(*) {_OTHERS}")[0][0] == 0, 5.0, message="the terminated backends to exit")
    return int(killed)


def test_sync_enqueue_admin_calls_and_publish_survive_closed_connections(jobs_db: str) -> None:
    """enqueue(), job_state() and publish() each work on the first call after their pools'
    connections were closed by the server."""
    before = sample_jobs.record.enqueue("before")
    assert job_state(before.id) is not None
    livepush.publish("pools:t", {"n": 1})
    assert close_every_connection(jobs_db) >= 2  # the jobs' pool and the fan-out's
    after = sample_jobs.record.enqueue("after")
    assert job_state(after.id)["state"] == "available"  # type: ignore[index]
    livepush.publish("pools:t", {"n": 2})
    assert [r[0] for r in q(jobs_db, "SELECT seq FROM livepush_messages WHERE topic = 'pools:t' ORDER BY seq")] == [1, 2]


async def test_aenqueue_survives_closed_connections(jobs_db: str) -> None:
    """aenqueue() works on the first call after its pool's connections were closed."""
    import asyncio

    await sample_jobs.record.aenqueue("before")
    assert await asyncio.to_thread(close_every_connection, jobs_db) >= 1
    after = await sample_jobs.record.aenqueue("after")
    assert job_state(after.id)["state"] == "available"  # type: ignore[index]


def test_sync_code_running_each_call_on_a_new_event_loop_keeps_no_pool_per_call(jobs_db: str) -> None:
    """Sync web code that runs each async call with asyncio.run() (a new loop each time) leaves no
    pool behind per call: a pool holds its loop, so an ended loop's is dropped when the next loop
    opens one."""
    import asyncio
    import gc

    from livepush.postgres.pools import LoopPools

    pools = LoopPools(jobs_db, name="t-runs")

    async def one() -> None:
        async with (await pools.aget()).connection() as conn:
            await conn.execute("SELECT 1")

    try:
        for _ in range(20):
            asyncio.run(one())
        gc.collect()
        assert len(pools._async) == 1
    finally:
        pools.close()


def test_threads_each_running_calls_on_new_event_loops_share_the_pools_without_errors(jobs_db: str) -> None:
    """Worker threads of a sync web server that each run their async calls with asyncio.run():
    every call gets a connection, though the loops' first uses add and drop pools side by side."""
    import asyncio
    import concurrent.futures

    from livepush.postgres.pools import LoopPools

    pools = LoopPools(jobs_db, name="t-threads")

    async def one() -> int:
        async with (await pools.aget()).connection() as conn:
            return (await (await conn.execute("SELECT 1")).fetchone())[0]  # type: ignore[index]

    def calls() -> list[int]:
        return [asyncio.run(one()) for _ in range(5)]

    try:
        with concurrent.futures.ThreadPoolExecutor(8) as threads:
            results = [f.result(timeout=60) for f in [threads.submit(calls) for _ in range(8)]]
        assert results == [[1] * 5] * 8
    finally:
        pools.close()


def test_a_loop_that_ends_while_its_pool_connects_does_not_hang() -> None:
    """A pool left open on its loop (as aenqueue()'s and apublish()'s are) with a connection
    attempt in flight when the loop ends: asyncio.run() returns and the pool is closed.
    psycopg_pool alone takes the cancellation for a failed attempt, schedules another, and
    its worker task lives on, so the loop's shutdown waited forever (postgres.pools.AsyncPool)."""
    import asyncio
    import socket
    import threading

    from livepush.postgres.pools import AsyncPool

    pools: list[AsyncPool] = []
    accepted: list[socket.socket] = []
    with socket.create_server(("127.0.0.1", 0)) as silent:  # accepts, never answers
        silent.settimeout(10)
        port = silent.getsockname()[1]

        async def main() -> None:
            pool = AsyncPool(f"host=127.0.0.1 port={port} user=x dbname=x connect_timeout=60",
                             min_size=1, open=False)
            await pool.open()
            pools.append(pool)
            accepted.append((await asyncio.to_thread(silent.accept))[0])  # its attempt is in flight

        runner = threading.Thread(target=asyncio.run, args=(main(),), daemon=True)
        runner.start()
        runner.join(timeout=20)
        for conn in accepted:
            conn.close()
    assert not runner.is_alive(), "asyncio.run() still waits for the pool's tasks"
    assert accepted and pools[0].closed


def test_a_server_out_of_a_resource_is_not_reported_unreachable() -> None:
    """Out of shared memory (lock table, say) names the resource and Postgres' hint, not "cannot
    reach Postgres"; too many connections is still an outage to retry, said as a server that is
    up and full."""
    import psycopg

    from livepush import DependencyError
    from livepush.postgres.connect import translate

    url = "postgresql://app:secret@db.example:5432/app"
    err = translate(url, psycopg.errors.OutOfMemory("out of shared memory"))
    assert "ran out of a resource" in str(err) and "out of shared memory" in str(err)
    assert "secret" not in str(err) and "cannot reach" not in str(err)
    err = translate(url, psycopg.errors.TooManyConnections("sorry, too many clients already"))
    assert isinstance(err, DependencyError) and "no connection slot left" in str(err), err


def test_a_runtime_loop_whose_pool_could_not_connect_warns_naming_the_database_and_the_reason() -> None:
    """A beat, promotion or housekeeping round that waited out its pool while Postgres was down (or
    out of connection slots) is warned of as a claim is: which database, why, what to check; not
    psycopg_pool's "couldn't get a connection after 30.00 sec", which named neither."""
    import psycopg
    from psycopg_pool import PoolTimeout

    from livepush.postgres.connect import PoolUnreachable, as_warned

    url = "postgresql://app:secret@db.example:5432/app"
    full = PoolUnreachable("livepush-jobs-beat-async", 30.0,
                           psycopg.errors.TooManyConnections("sorry, too many clients already"))
    said = str(as_warned(url, full))
    assert "db.example:5432/app" in said and "no connection slot left" in said and "secret" not in said, said
    said = str(as_warned(url, PoolTimeout("couldn't get a connection after 30.00 sec")))
    assert "cannot reach Postgres at db.example:5432/app" in said, said


def test_a_deadlock_is_reported_as_a_conflict_to_retry_not_as_unreachable() -> None:
    """Deadlocks and serialization failures are psycopg OperationalErrors, but the server is
    there: the error says the transaction was rolled back and should be run again."""
    import psycopg

    from livepush.postgres.connect import translate

    url = "postgresql://app:secret@db.example:5432/app"
    for exc in (psycopg.errors.DeadlockDetected("deadlock detected"),
                psycopg.errors.SerializationFailure("could not serialize access")):
        err = translate(url, exc)
        assert "rolled back the transaction" in str(err) and "run the whole transaction again" in str(err)
        assert "cannot reach" not in str(err) and "secret" not in str(err)


def test_a_lock_timeout_is_reported_as_a_timeout_not_as_unreachable(jobs_db: str) -> None:
    """A lock_timeout set on the database (or role) that ends a publish is a DependencyError naming the
    timeout and saying the server is up, not "cannot reach Postgres ... check that the server is
    running"; a statement_timeout, or a cancel, likewise."""
    import psycopg

    from livepush import DependencyError
    from livepush.postgres.connect import translate

    livepush.publish("timeout:t", {"n": 0})
    dbname = psycopg.conninfo.conninfo_to_dict(jobs_db)["dbname"]
    q(jobs_db, f"ALTER DATABASE {dbname} SET lock_timeout = '100ms'")
    close_every_connection(jobs_db)  # the pools' next connections take the database's setting
    with psycopg.connect(jobs_db) as holder:
        holder.execute("SELECT FROM livepush_topics WHERE topic = 'timeout:t' FOR UPDATE")
        with pytest.raises(DependencyError, match="lock timeout") as raised:
            livepush.publish("timeout:t", {"n": 1})
    assert "lock_timeout" in str(raised.value) and "server is up" in str(raised.value)
    assert "cannot reach" not in str(raised.value)
    err = translate(jobs_db, psycopg.errors.QueryCanceled("canceling statement due to statement timeout"))
    assert "statement timeout" in str(err) and "server is up" in str(err) and "cannot reach" not in str(err)


def test_a_forked_child_publishes_and_enqueues_on_connections_of_its_own(jobs_db: str) -> None:
    """A process that forks after it published and enqueued (a server's master that loads the app and
    then forks its workers): the child publishes and enqueues on connections of its own, never on the
    ones it inherited, so parent and child both go on working at the same time and lose nothing."""
    import os

    from livepush import jobs

    livepush.publish("fork:t", {"from": "parent", "i": 0})
    sample_jobs.record.enqueue("parent", tags=["fork"])
    pid = os.fork()
    if pid == 0:  # the child: its exit status is its verdict, and it never returns into pytest
        status = 1
        try:
            for i in range(50):
                livepush.publish("fork:t", {"from": "child", "i": i})
            sample_jobs.record.enqueue("child", tags=["fork"])
            status = 0
        finally:
            os._exit(status)
    try:
        for i in range(50):
            livepush.publish("fork:t", {"from": "parent", "i": i + 1})
        sample_jobs.record.enqueue("parent", tags=["fork"])
    finally:
        # A child hung on an inherited connection is killed: it must not outlive the test.
        status = forked_exit_status(pid, 20.0)
    assert status == 0, "the child failed to publish or enqueue"
    seqs = [r[0] for r in q(jobs_db, "SELECT seq FROM livepush_messages WHERE topic = 'fork:t' ORDER BY seq")]
    assert seqs == list(range(1, 102))
    assert sorted(j.args[0] for j in jobs.list_tagged("fork")) == ["child", "parent", "parent"]


def test_a_child_forked_while_a_parent_thread_was_making_the_jobs_pools_enqueues(jobs_db: str) -> None:
    """A process forked while another of its threads held the lock under which an enqueue finds
    the jobs' pools (a master that enqueues from a thread, then forks its workers) enqueues in the
    child all the same: the lock the child inherited, held by a thread it does not have, was never
    released, and the child's first enqueue waited for ever."""
    from livepush import jobs
    from livepush.jobs import database

    sample_jobs.record.enqueue("parent", tags=["fork-lock"])
    with database._lock:  # as a parent thread inside database.pools() holds it at the fork
        pid = fork_running(lambda: sample_jobs.record.enqueue("child", tags=["fork-lock"]))
    assert forked_exit_status(pid, 20.0) == 0, "the child failed to enqueue"
    sample_jobs.record.enqueue("parent", tags=["fork-lock"])
    assert sorted(j.args[0] for j in jobs.list_tagged("fork-lock")) == ["child", "parent", "parent"]


def _isolation() -> Any:
    """A transaction's steps that read its isolation level."""
    rows = yield steps.Query("SELECT current_setting('transaction_isolation') AS level", {})
    return rows[0]["level"]


async def test_livepushs_own_transactions_read_committed_whatever_the_databases_default(jobs_db: str) -> None:
    """livepush's decisions (a group's finish, a workflow's next steps, a claim) read, in a later
    statement, what the holder of a lock committed: READ COMMITTED's snapshot per statement. Under
    a database or role whose default is REPEATABLE READ (`ALTER DATABASE ... SET
    default_transaction_isolation`) every statement would read the transaction's first snapshot,
    and a group could stay unfinished for ever. livepush's pools begin their own transactions
    READ COMMITTED, sync and async, whatever the default. (A statement run on its own, in
    autocommit, still takes the default: see docs/operations.md.)"""
    q(jobs_db, "DO $$ BEGIN EXECUTE format('ALTER DATABASE %I SET default_transaction_isolation = %L', "
               "current_database(), 'repeatable read'); END $$")
    database.close_pools()  # new connections, which take the new default
    assert q(jobs_db, "SHOW default_transaction_isolation") == [("repeatable read",)]
    assert in_tx(_isolation, None) == "read committed"
    assert await ain_tx(_isolation, None) == "read committed"
