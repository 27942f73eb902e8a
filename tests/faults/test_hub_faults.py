"""The hub's newest paths together under the faults users meet: clients reading on from history
past their share (server/hub.py `_read_on`), the keeping of watched topics' chains
(`_keep_chains`), through a Postgres restart or a Redis restart, with an in-process server
(tests/server/conftest.py) and real WebSocket clients. Each checks what a client gets (every
message once, in order, or `reset`; never a wrong or duplicated one) and that the server says
each cause once, not once per client or per retry."""

from __future__ import annotations

import asyncio
import logging

import psycopg
import pytest

from tests.faults.fleet import postgres_down
from tests.faults.test_history_reads import backends_waiting_for_a_lock, terminate
from tests.server.conftest import Served, make_settings, start_served
from tests.server.test_slow_clients import count, open_client, server_side
from tests.support import services
from tests.support.waiting import async_wait_for
from tests.support.wsclient import WSClient


def warnings_with(caplog: pytest.LogCaptureFixture, words: str) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING and words in r.getMessage()]


async def paused_clients(served: Served, topic: str, clients: int, count_sent: int) -> tuple[list[WSClient], list[str]]:
    """`clients` clients subscribed to `topic` that stop reading while `count_sent` messages of 2 KB
    go out (far past a client's share): returns once the server reads on from history for each."""
    subs = [await open_client(served.url) for _ in range(clients)]
    for sub in subs:
        assert (await sub.subscribe(served.sign(topic)))["op"] == "subscribed"
        sub.ws.transport.pause_reading()
    replayed = count("replayed")
    sent = [await served.publish(topic, {"n": n, "pad": "x" * 2000}) for n in range(count_sent)]
    await async_wait_for(lambda: count("replayed") >= replayed + clients, 10,
                         message="the server to read on from history for every client")
    return subs, sent


async def frames_read(client: WSClient, count: int, timeout: float = 30.0) -> list[str]:
    """The offsets of the next `count` frames, each a message (no `reset`), each within `timeout`."""
    got: list[str] = []
    while len(got) < count:
        frame = await client.recv(timeout=timeout)
        assert frame["op"] == "message", (frame, len(got))
        got.append(frame["offset"])
    return got


async def test_clients_reading_on_through_a_postgres_restart_get_every_message(
        pg_url: str, secret: str) -> None:
    """Several clients past their share read on from history while Postgres restarts: their reads
    wait for the pool to connect again, and each gets every message once, in order, without `reset`."""
    served = await start_served(make_settings("postgres", secret, pg_url, None))
    topic = "room:restart-read-ons"
    try:
        slow, sent = await paused_clients(served, topic, 4, 600)
        async with postgres_down():
            reads = [asyncio.ensure_future(frames_read(sub, len(sent))) for sub in slow]
            for sub in slow:
                sub.ws.transport.resume_reading()
            await asyncio.sleep(2)  # the outage: nothing to await, it is time passing
            assert not any(r.done() for r in reads)
        for read in reads:
            assert await asyncio.wait_for(read, 40) == sent, "every message once, in order, no reset"
        assert all(not server_side(served.server, sub).closing for sub in slow)
        for sub in slow:
            await sub.close()
    finally:
        await served.stop()


async def test_clients_whose_read_ons_are_killed_together_get_every_message_and_one_warning(
        pg_url: str, pg_admin_url: str, secret: str, caplog: pytest.LogCaptureFixture) -> None:
    """Several clients past their share read on from history; their reads wait behind a lock and
    every backend is killed (as in a failover): each gets every message once, in order, without
    `reset`, and the server says the failed reads once, not once per client."""
    caplog.set_level(logging.INFO, logger="livepush")
    served = await start_served(make_settings("postgres", secret, pg_url, None))
    topic = "room:killed-read-ons"
    clients = 4
    try:
        slow, sent = await paused_clients(served, topic, clients, 600)
        locker = await psycopg.AsyncConnection.connect(pg_url)
        try:
            await locker.execute("LOCK TABLE livepush_messages IN ACCESS EXCLUSIVE MODE")
            reads = [asyncio.ensure_future(frames_read(sub, len(sent))) for sub in slow]
            for sub in slow:
                sub.ws.transport.resume_reading()
            dbname, locker_pid = services.dbname_of(pg_url), locker.info.backend_pid
            await async_wait_for(
                lambda: asyncio.to_thread(lambda: len(backends_waiting_for_a_lock(pg_admin_url, dbname,
                                                                                  but=locker_pid)) >= clients),
                10, message="every read-on's read to wait for the log")
            for pid in await asyncio.to_thread(backends_waiting_for_a_lock, pg_admin_url, dbname, but=locker_pid):
                await asyncio.to_thread(terminate, pg_admin_url, pid)
            await async_wait_for(lambda: warnings_with(caplog, "could not read on from the history"), 10,
                                 message="the read-ons to fail")
            await locker.rollback()
        finally:
            await locker.close()
        for read in reads:
            assert await asyncio.wait_for(read, 40) == sent, "every message once, in order, no reset"
        said = warnings_with(caplog, "could not read on from the history")
        assert len(said) == 1, said
        for sub in slow:
            await sub.close()
    finally:
        await served.stop()
