"""Faults on the publishing side of the Postgres fan-out, against a real server: a publisher's
connection that dies inside its transaction, and one transaction that publishes on thousands of
topics, its doorbells filling notifications up to Postgres' 8,000-byte payload limit. A
subscribed client gets exactly what committed, in order, once, without a `reset`, and the server
keeps serving (docs/guarantees.md: transactional publish, many publishers on one topic)."""

from __future__ import annotations

import asyncio
import sys

import psycopg
import psycopg.sql
import pytest

from livepush.errors import DependencyError
from livepush.fanout.postgres import PostgresFanOut
from tests.faults.clients import ResumingClient, delivery_report, wait_delivered
from tests.faults.fleet import Fleet
from tests.faults.load import Published
from tests.faults.test_history_reads import backends_waiting_for_a_lock, terminate
from tests.support import services
from tests.support.waiting import async_wait_for

# Seconds within which a message that committed reaches a subscribed client.
DELIVER_BOUND = 10.0
# One transaction's topics: short ones published one call each, long ones in one publish_many.
SHORT_TOPICS, LONG_TOPICS = 1500, 1500
# The longest topic there is (livepush.topics.MAX_TOPIC_LENGTH): the longest doorbell line.
LONG_TOPIC_LENGTH = 200
# Every how many topics of each kind a client subscribes to (a client subscribes to at most 100
# topics at once: livepush/server/limits.py).
SAMPLE_EVERY = 50


async def gets_exactly(fleet: Fleet, client: ResumingClient, offsets: list[str]) -> None:
    """Wait until `client` got the last of `offsets` on room:a; it got exactly those, in order,
    once, with no reset and no reconnect."""
    await async_wait_for(lambda: client.offsets["room:a"] == offsets[-1], DELIVER_BOUND, message="the last message")
    assert client.events["room:a"] == [("message", o) for o in offsets], fleet.server_log()
    assert client.reconnects == 0 and not client.not_newer


async def test_a_publisher_whose_connection_dies_before_its_commit_delivers_nothing_and_holds_up_no_one(
        fleet: Fleet, pg_admin_url: str) -> None:
    """A transaction publishes on a topic with conn= while another publisher of the topic waits for
    its row; the first one's backend is killed before it commits. Its commit fails (psycopg's
    error: the caller's own transaction), nothing of it is delivered, the waiting publisher goes
    on at once and takes the offset the dead one was given, and the subscribed client gets that
    message, with no reset, no duplicate and no reconnect."""
    (server,) = await fleet.serve(1)
    client = await ResumingClient.open(server.url, {"room:a": fleet.sign("room:a")})
    fanout = PostgresFanOut(fleet.url)
    dying = await psycopg.AsyncConnection.connect(fleet.url)
    try:
        first = await fanout.apublish("room:a", {"n": 0})
        lost = await fanout.apublish("room:a", {"n": 1}, conn=dying)
        waiting = asyncio.ensure_future(fanout.apublish("room:a", {"n": 2}))
        await async_wait_for(lambda: asyncio.to_thread(backends_waiting_for_a_lock, pg_admin_url,
                                                       services.dbname_of(fleet.url), but=-1), 5,
                             message="the second publisher to wait for the topic's row")
        assert await asyncio.to_thread(terminate, pg_admin_url, dying.info.backend_pid)
        second = await asyncio.wait_for(waiting, DELIVER_BOUND)
        with pytest.raises(psycopg.OperationalError):
            await dying.commit()
        assert second == lost, "the killed transaction's offset was not given back"

        await gets_exactly(fleet, client, [first, second, await fanout.apublish("room:a", {"n": 3})])
    finally:
        await dying.close()
        await client.close()
        await fanout.aclose()
    assert "Traceback" not in fleet.server_log(), fleet.server_log()
    assert list(fleet.stop_all().values()) == [0]


async def test_a_publish_whose_connection_dies_while_it_waits_for_the_topic_raises_dependency_error(
        fleet: Fleet, pg_admin_url: str) -> None:
    """A publish with conn= waiting for a topic's row behind another transaction has its backend
    killed: it raises livepush's DependencyError saying the connection was lost (not a driver
    error), the other transaction commits and is delivered, and nothing of the killed one is."""
    (server,) = await fleet.serve(1)
    client = await ResumingClient.open(server.url, {"room:a": fleet.sign("room:a")})
    fanout = PostgresFanOut(fleet.url)
    holder = await psycopg.AsyncConnection.connect(fleet.url)
    waiter = await psycopg.AsyncConnection.connect(fleet.url)
    try:
        held = await fanout.apublish("room:a", {"n": 0}, conn=holder)
        waiting = asyncio.ensure_future(fanout.apublish("room:a", {"n": 1}, conn=waiter))
        await async_wait_for(lambda: asyncio.to_thread(backends_waiting_for_a_lock, pg_admin_url,
                                                       services.dbname_of(fleet.url), but=-1), 5,
                             message="the second publisher to wait for the topic's row")
        assert await asyncio.to_thread(terminate, pg_admin_url, waiter.info.backend_pid)
        with pytest.raises(DependencyError) as raised:
            await asyncio.wait_for(waiting, DELIVER_BOUND)
        assert "Traceback" not in str(raised.value) and "\n" not in str(raised.value), raised.value
        await holder.commit()
        await gets_exactly(fleet, client, [held, await fanout.apublish("room:a", {"n": 2})])
    finally:
        for conn in (holder, waiter):
            await conn.close()
        await client.close()
        await fanout.aclose()
    assert list(fleet.stop_all().values()) == [0]


# A publisher process that freezes inside its transaction, as on a paused machine: it publishes
# on room:a with conn=, prints the offset it was given and stops itself before it commits.
FROZEN_PUBLISHER = """
import os, signal, sys
import psycopg
from livepush.fanout.postgres import PostgresFanOut
conn = psycopg.connect(sys.argv[1])
print(PostgresFanOut(sys.argv[1]).publish("room:a", {"n": "frozen"}, conn=conn), flush=True)
os.kill(os.getpid(), signal.SIGSTOP)
"""
# The application role's idle_in_transaction_session_timeout that docs/operations.md advises.
IDLE_IN_TRANSACTION = "1s"


async def test_a_publisher_frozen_in_its_transaction_is_ended_by_the_idle_timeout_and_holds_up_no_one(
        fleet: Fleet) -> None:
    """A publisher process freezes after its publish with conn=, before its commit: its backend
    stays idle in its transaction, holding the topic's row. With the idle_in_transaction_session_timeout
    docs/operations.md advises, Postgres ends that transaction: nothing of it is delivered, and the
    publisher that waited for the row goes on with the offset it was given, which the subscribed
    client gets, with no reset."""
    with psycopg.connect(fleet.url, autocommit=True) as conn:
        conn.execute(psycopg.sql.SQL("ALTER DATABASE {} SET idle_in_transaction_session_timeout = {}").format(
            psycopg.sql.Identifier(services.dbname_of(fleet.url)), psycopg.sql.Literal(IDLE_IN_TRANSACTION)))
    (server,) = await fleet.serve(1)
    client = await ResumingClient.open(server.url, {"room:a": fleet.sign("room:a")})
    fanout = PostgresFanOut(fleet.url)
    first = await fanout.apublish("room:a", {"n": 0})
    frozen = fleet.procs.start([sys.executable, "-c", FROZEN_PUBLISHER, fleet.url], env=fleet.env())
    try:
        await async_wait_for(lambda: frozen.stdout().strip() != "", 10,
                             message=f"the frozen publisher's offset\n{frozen.output()}")
        lost = frozen.stdout().strip()
        second = await asyncio.wait_for(fanout.apublish("room:a", {"n": 1}), DELIVER_BOUND)
        assert second == lost, "the frozen transaction's offset was not given back"
        await gets_exactly(fleet, client, [first, second])
    finally:
        frozen.kill()
        await client.close()
        await fanout.aclose()
    assert list(fleet.stop_all().values()) == [0]


def long_topic(i: int) -> str:
    """A topic of the longest length, told apart by `i` at its end."""
    tail = f":{i:05d}"
    return "long:" + "x" * (LONG_TOPIC_LENGTH - len("long:") - len(tail)) + tail


async def test_one_transaction_publishing_on_3000_topics_reaches_every_subscriber_of_each_once(
        fleet: Fleet) -> None:
    """One transaction publishes on 1,500 topics one call each (1,500 notifications) and on 1,500
    topics of 200 characters in one publish_many (doorbell lines of the longest kind, grouped
    under the 8,000-byte payload limit): nothing is delivered before the commit, and after it
    every client gets the one message of each topic it subscribed to, once, with no reset, while
    the server goes on delivering a message published after it."""
    servers = await fleet.serve(2)
    short = [f"many:{i:05d}" for i in range(SHORT_TOPICS)]
    long = [long_topic(i) for i in range(LONG_TOPICS)]
    watched = short[::SAMPLE_EVERY] + short[-1:] + long[::SAMPLE_EVERY] + long[-1:]
    clients = [await ResumingClient.open(s.url, {t: fleet.sign(t) for t in watched}, name=f"client@{s.port}")
               for s in servers]
    fanout = PostgresFanOut(fleet.url)
    published: list[Published] = []
    try:
        async with await psycopg.AsyncConnection.connect(fleet.url) as conn:
            for i, topic in enumerate(short):
                published.append(Published(topic, await fanout.apublish(topic, {"n": i}, conn=conn), i, 0.0))
            offsets = await fanout.apublish_many([(t, {"n": i}) for i, t in enumerate(long)], conn=conn)
            published += [Published(t, o, i, 0.0) for i, (t, o) in enumerate(zip(long, offsets, strict=True))]
            assert all(not events for c in clients for events in c.events.values()), "delivered before the commit"
            await conn.commit()
        after = await fanout.apublish(short[0], {"n": -1})
        published.append(Published(short[0], after, -1, 0.0))
        mine = [p for p in published if p.topic in set(watched)]
        await wait_delivered(mine, clients, DELIVER_BOUND)
        report = delivery_report(mine, clients)
        assert all(c.resets() == 0 for c in clients), f"everything is in the log: no reset is due\n{report}"
        assert all(not c.not_newer and c.reconnects == 0 for c in clients), report
        expected = {t: [("message", p.offset) for p in mine if p.topic == t] for t in watched}
        assert all(c.events == expected for c in clients), report
    finally:
        for c in clients:
            await c.close()
        await fanout.aclose()
    assert "Traceback" not in fleet.server_log(), fleet.server_log()
    assert set(fleet.stop_all().values()) == {0}
