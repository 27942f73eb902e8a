"""A server's read of the message log fails (its backend is killed mid-query, as in a restart or
a failover) while the log still holds what it was reading: the read is tried again, and
connected clients get every message, never a needless `reset` (docs/reference.md §7: recovery
holds across a Postgres reconnect)."""

from __future__ import annotations

import asyncio

import psycopg

from livepush.fanout.postgres import PostgresFanOut
from tests.faults.clients import ResumingClient
from tests.faults.fleet import Fleet
from tests.support import services
from tests.support.waiting import async_wait_for

LOCKER_APP_NAME = "fault-test-locker"


def backends_waiting_for_a_lock(admin_url: str, dbname: str, *, but: int) -> list[int]:
    """The pids of the backends on `dbname`, other than `but`, that wait for a lock."""
    with psycopg.connect(admin_url, autocommit=True) as conn:
        rows = conn.execute("SELECT pid FROM pg_stat_activity WHERE datname = %s AND wait_event_type = 'Lock' "
                            "AND pid <> %s", (dbname, but)).fetchall()
    return [r[0] for r in rows]


def terminate(admin_url: str, pid: int) -> bool:
    with psycopg.connect(admin_url, autocommit=True) as conn:
        row = conn.execute("SELECT pg_terminate_backend(%s, 5000)", (pid,)).fetchone()
    return bool(row and row[0])


async def test_a_failed_history_read_is_retried_and_never_becomes_a_reset(fleet: Fleet, pg_admin_url: str) -> None:
    """The server's read for a doorbell is held on a lock and its backend killed: once the lock
    is gone the message arrives, with no `reset` (the log holds it) and no reconnect."""
    (server,) = await fleet.serve(1)
    client = await ResumingClient.open(server.url, {"room:a": fleet.sign("room:a")})
    dbname = services.dbname_of(fleet.url)
    fanout = PostgresFanOut(fleet.url)
    publisher = await psycopg.AsyncConnection.connect(fleet.url)
    locker = await psycopg.AsyncConnection.connect(fleet.url, application_name=LOCKER_APP_NAME)
    try:
        first = await fanout.apublish("room:a", {"n": 1})
        await async_wait_for(lambda: client.offsets["room:a"] == first, 5, message="the first message")

        # The locker queues for the log behind the publishing transaction, so it holds the log
        # from the publish's commit on: the read its doorbell starts waits behind it.
        second = await fanout.apublish("room:a", {"n": 2}, conn=publisher)
        lock = asyncio.ensure_future(locker.execute("LOCK TABLE livepush_messages IN ACCESS EXCLUSIVE MODE"))
        locker_pid = locker.info.backend_pid
        await async_wait_for(lambda: asyncio.to_thread(backends_waiting_for_a_lock, pg_admin_url, dbname, but=-1), 5,
                             message="the locker to queue behind the publish")
        await publisher.commit()
        await lock
        (reader,) = await async_wait_for(
            lambda: asyncio.to_thread(backends_waiting_for_a_lock, pg_admin_url, dbname, but=locker_pid), 5,
            message="the server's read to wait for the log")
        assert await asyncio.to_thread(terminate, pg_admin_url, reader)
        await async_wait_for(lambda: "could not read the history of room:a" in fleet.server_log(), 5,
                             message="the server to see its read fail")
        await locker.rollback()

        await async_wait_for(lambda: client.offsets["room:a"] == second or client.resets(), 10,
                             message="the second message")
        assert client.events["room:a"] == [("message", first), ("message", second)], fleet.server_log()
        assert client.reconnects == 0 and not client.not_newer
    finally:
        await publisher.close()
        await locker.close()
        await fanout.aclose()
        await client.close()
    assert list(fleet.stop_all().values()) == [0]
