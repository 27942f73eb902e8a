"""A server under churn keeps a flat memory: what it holds grows with what is live, never with
what came and went.

Each test churns a real server (its fan-out on Postgres or on Redis, state topics read from
Postgres) with a few thousand short lives: connections that open, subscribe to topics used once,
resume with `since`, are refused, unsubscribe and close, or leave mid-handshake. Once every
client is gone, every per-topic, per-connection and per-session structure the server keeps is
back to its idle size, the loop runs no more tasks than at idle, and the memory livepush's own
code holds (tracemalloc) has not grown with the number of lives.
"""

from __future__ import annotations

import asyncio
import collections
import re
import socket
import gc
import json
import time
import tracemalloc
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest

from livepush import App, Allow, api, sessions
from livepush.config import Settings, set_settings
from livepush.server.app import PushServer
from livepush.server.connection import Connection
from livepush.server.hub import KEEP_NEW_SECONDS
from tests.server.conftest import Served, start_served
from tests.support import rawws
from tests.support.churn import grown
from tests.support.http import upgrade_request
from tests.support.waiting import async_wait_for
from tests.support.wsclient import WSClient

ROUNDS = 2  # churn rounds after a warm-up round: each must leave the server as the warm-up did
LIVES = 400  # connection lives a round (several topics each): a structure entry a life shows at 400 as at 4,000
PARALLEL = 50  # clients alive at once
# Bytes livepush's own allocations may grow by over a whole round of LIVES lives: a few bytes a
# life (interned strings, a metric's child, a log rate limiter's line) is noise, one structure
# entry a life is not (a dict entry and its key take 100 bytes and more).
GROWTH_PER_LIFE = 20
# And once a round, whatever its size: a set's or a dict's table resized to a round's peak.
GROWTH_ONCE = 16 * 1024


async def _deny_odd(session: Any, topic: str) -> bool:
    """The app's authorize(): allows the even `ask:` topics only, after a loop turn."""
    await asyncio.sleep(0)
    return topic.startswith("ask:") and int(topic.rsplit("-", 1)[1]) % 2 == 0


APP = App(rules=[Allow("churn:*", anonymous=True)], authorize=_deny_odd)


@pytest.fixture(params=["postgres", "redis"])
async def churned(request: pytest.FixtureRequest, secret: str, pg_url: str) -> AsyncIterator[Served]:
    """A server on the Postgres or the Redis fan-out, both with the state topics of `pg_url`."""
    kind = request.param
    rd = request.getfixturevalue("redis_url") if kind == "redis" else None
    settings = Settings(fanout=kind, database_url=pg_url, redis_url=rd, secret=secret, port=0)
    served = await start_served(settings, app=APP)
    try:
        yield served
    finally:
        await served.stop()
        api.set_default_fanout(None)
        set_settings(None)


def sizes(server: PushServer) -> dict[str, int]:
    """The size of every structure the server keeps per connection, per topic or per session."""
    core = server._core
    assert core is not None
    hub = server.hub
    out = {
        "clients": len(server.clients),
        "core.opening": len(core._opening),
        "core.answering": len(core._answering),
        "core.closing": len(core._closing),
        "core.handshakes": len(core._handshakes),
        "core.behind": len(core.behind),
        "core.corked": len(core._corked),
        "core.live": core._live,
        "hub.topics": len(hub._topics),
        "hub.tasks": len(hub._tasks),
        "hub.state_due": sum(len(d) for d in hub._state_due.values()),
        "hub.state_due_sources": len(hub._state_due),
        "hub.state_reading": len(hub._state_reading),
        "hub.unborn": sum(len(d) for d in hub._unborn.values()),
        "hub.unborn_prefixes": len(hub._unborn),
        "hub.read_due": len(hub._read_due),
        "hub.read_failing": len(hub._read_failing),
        "hub.keep_new": len(hub._keep_new),
        "app.stopping": len(server.app._stopping),
        "quiet": len(server._quiet._counts),
        "loop.timers": timers(),
        "connection objects": sum(type(o) is Connection for o in gc.get_objects()),
    }
    for name, count in tasks().items():
        out[f"task {name}"] = count
    return out


def timers() -> int:
    """Timers armed on the loop (call_later, call_at) and not cancelled."""
    scheduled = getattr(asyncio.get_running_loop(), "_scheduled", [])
    return sum(not handle.cancelled() for handle in scheduled)


def tasks() -> collections.Counter[str]:
    """The loop's tasks, by name (numbers left out: asyncio numbers the unnamed ones)."""
    return collections.Counter(re.sub(r"\d+", "N", t.get_name()) for t in asyncio.all_tasks())


def own_bytes() -> int:
    """Bytes that livepush's own code has allocated and still holds."""
    gc.collect()
    snapshot = tracemalloc.take_snapshot().filter_traces([tracemalloc.Filter(True, "*/livepush/*")])
    return sum(stat.size for stat in snapshot.statistics("filename"))


async def read_to_pong(client: WSClient) -> None:
    """Ping, and read what the server sent before its pong."""
    await client.send({"op": "ping", "ref": "quiet?"})
    while (await client.recv())["op"] != "pong":
        pass


async def in_parallel(lives: int, life: Callable[[int], Awaitable[None]]) -> None:
    """Run `lives` lives, PARALLEL at a time."""
    nxt = iter(range(lives))

    async def worker() -> None:
        for i in nxt:
            await life(i)

    await asyncio.wait_for(asyncio.gather(*(worker() for _ in range(PARALLEL))), timeout=300)


async def until_idle(server: PushServer, idle: dict[str, int]) -> dict[str, int]:
    """Wait (bounded) for the server's structures to come back to `idle`; return what they are."""
    try:
        await async_wait_for(lambda: not grown(idle, sizes(server)), timeout=15)
    except AssertionError:
        pass
    return sizes(server)


async def settled(server: PushServer) -> dict[str, int]:
    """The sizes once every client has been gone long enough for the server to notice."""
    await async_wait_for(lambda: not server.clients and server._core is not None and server._core._live == 0,
                         timeout=15)
    # What a burst of subscribes left to do is done within KEEP_NEW_SECONDS (hub.py).
    await asyncio.sleep(KEEP_NEW_SECONDS + 0.5)
    return sizes(server)


def assert_as_idle(idle: dict[str, int], after: dict[str, int]) -> None:
    assert not grown(idle, after), grown(idle, after)


async def churned_back_to_idle(server: PushServer, life: Callable[[int], Awaitable[None]]) -> None:
    """A warm-up of a few lives, then LIVES of them: the sizes after are those after the warm-up."""
    await in_parallel(90, life)
    idle = await settled(server)
    await in_parallel(LIVES, life)
    assert_as_idle(idle, await until_idle(server, idle))


async def test_connections_that_subscribe_resume_and_leave_leave_nothing_behind(churned: Served) -> None:
    """Connections that each subscribe to topics used once (message topics, `job:` topics of no
    job yet, `since` resumes of a topic published to), are refused (forbidden, by authorize(),
    invalid), unsubscribe and close, leave every structure at its idle size and livepush's
    memory flat, round after round."""
    server = churned.server
    url = churned.url
    round_no = 0

    async def life(i: int) -> None:
        tag = f"{round_no}-{i}"
        client = await WSClient.open(url)
        try:
            # A message topic used once, published to, resumed from its origin.
            topic = f"churn:t-{tag}"
            answer = await client.subscribe(topic)
            assert answer["op"] == "subscribed", answer
            await churned.publish(topic, {"n": i})
            [message] = await client.messages(1)
            # The same topic again, from `since`: a resume with a replay.
            again = await client.subscribe(topic, since=answer["offset"])
            assert again["op"] == "subscribed", again
            await read_to_pong(client)  # its replay, if any
            # A state topic of no job (yet): watched for its birth.
            state = await client.subscribe(churned.sign(f"job:{10_000_000 + i}"))
            assert state["op"] == "subscribed", state
            # Refusals: by authorize(), for no rule, and an invalid topic.
            asked = await client.subscribe(f"ask:t-{2 * i + 1}")
            assert asked["op"] == "refused", asked
            assert (await client.subscribe(f"nope:{tag}"))["op"] == "refused"
            assert (await client.subscribe("bad topic!"))["op"] == "refused"
            if i % 2:
                # Half unsubscribe first; the other half just close.
                await client.send({"op": "unsubscribe", "topic": topic})
                await client.send({"op": "unsubscribe", "topic": churned.sign(f"job:{10_000_000 + i}")})
                await read_to_pong(client)
        finally:
            await client.close()

    # The warm-up round makes what is made once (pools, prepared statements, metric children).
    await in_parallel(LIVES // 3, life)
    idle = await settled(server)
    assert idle["hub.topics"] == 0 and idle["clients"] == 0, idle
    tracemalloc.start(1)
    try:
        before = own_bytes()
        growth = []
        for round_no in range(1, ROUNDS + 1):
            started = own_bytes()
            await in_parallel(LIVES, life)
            assert_as_idle(idle, await until_idle(server, idle))
            growth.append(own_bytes() - started)
        total = own_bytes() - before
    finally:
        tracemalloc.stop()
    assert max(growth) <= GROWTH_ONCE + GROWTH_PER_LIFE * LIVES, (
        f"livepush's memory grew by {growth} bytes over rounds of {LIVES} connection lives ({total} in all)")


async def test_clients_that_leave_mid_handshake_or_with_an_expired_session_leave_nothing_behind(
        churned: Served) -> None:
    """Clients that send half a request and leave, send a whole one and leave before its answer,
    or come with a session that runs out while they are connected (closed by the server), leave
    every structure at its idle size."""
    server = churned.server
    port = server.port
    request = (f"GET / HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
               "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n").encode()

    async def life(i: int) -> None:
        kind = i % 3
        if kind == 2:
            # A session that runs out a moment after the handshake: the next subscribe closes it.
            token = sessions.issue(f"user{i}", ttl=3, now=time.time() - 1.5)
            expires_at = sessions.decode(token, churned.settings.secrets).expires_at
            client = await WSClient.open(f"{churned.url}?token={token}")
            assert client.hello["session"] == {"subject": f"user{i}"}, client.hello
            await asyncio.sleep(max(expires_at - time.time(), 0) + 0.05)
            await client.send({"op": "subscribe", "topic": f"churn:s-{i}", "ref": 1})
            assert await client.closed_with() == 4403
            return
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(request if kind == 1 else request[: len(request) // 2])
        if kind == 1:
            writer.write(b"\r\n")
        await writer.drain()
        writer.transport.abort()  # gone before the answer, or in the middle of the request

    await churned_back_to_idle(server, life)


PINGS = b"".join(rawws.text(json.dumps({"op": "ping", "ref": n})) for n in range(600))


async def test_clients_that_leave_in_the_middle_of_their_subscribes_leave_nothing_behind(churned: Served) -> None:
    """Clients that send subscribes (fresh topics, a long replay from `since`, state topics), an
    unsubscribe of one of them while it is served, and some more frames than their budget allows,
    then drop the connection without waiting for any answer, leave every structure at its idle
    size."""
    server = churned.server
    shared = "churn:shared"
    offsets = [await churned.publish(shared, {"n": n, "pad": "x" * 2000}) for n in range(300)]

    async def life(i: int) -> None:
        client = await WSClient.open(churned.url)
        fresh = f"churn:m-{i}"
        await client.send({"op": "subscribe", "topic": fresh, "since": None, "ref": 1})
        await client.send({"op": "subscribe", "topic": shared, "since": offsets[i % 50], "ref": 2})
        await client.send({"op": "unsubscribe", "topic": fresh})
        await client.send({"op": "subscribe", "topic": churned.sign(f"job:{20_000_000 + i}"), "since": None,
                           "ref": 3})
        await client.send({"op": "subscribe", "topic": f"churn:n-{i}", "since": "0-1", "ref": 4})
        if i % 3 == 0:
            # Frames past the connection's budget: the server holds them, reads no more, and
            # arms a timer to serve them once the budget is back.
            client.ws.transport.write(PINGS)
        if i % 2:
            await asyncio.sleep(0.01 * (i % 5))  # some get part of the way
        client.ws.transport.abort()

    await churned_back_to_idle(server, life)


async def slow_client(port: int, topic: str) -> asyncio.StreamWriter:
    """A client that subscribes to `topic`, then reads nothing more (a small receive buffer)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.setblocking(False)
    await asyncio.wait_for(asyncio.get_running_loop().sock_connect(sock, ("127.0.0.1", port)), 5)
    reader, writer = await asyncio.open_connection(sock=sock)
    writer.write(upgrade_request(port))
    writer.write(rawws.text(json.dumps({"op": "subscribe", "topic": topic, "since": None, "ref": 1})))
    await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
    return writer


async def test_slow_clients_handed_to_history_that_leave_leave_nothing_behind(churned: Served) -> None:
    """Clients that stop reading while a burst larger than their share of a topic comes (the hub
    reads on from history for each) and then drop their connections leave every structure at its
    idle size."""
    server = churned.server
    topic = "churn:burst"
    clients = 60

    async def one_round(round_no: int) -> None:
        writers = await asyncio.gather(*(slow_client(server.port, topic) for _ in range(clients)))
        await async_wait_for(lambda: (t := server.hub._topics.get(topic)) is not None and len(t.subscribers) == clients,
                             timeout=15, message="every slow client to be subscribed")
        for n in range(24):
            await churned.publish(topic, {"round": round_no, "n": n, "pad": "x" * 32 * 1024})
        t = server.hub._topics[topic]
        await async_wait_for(lambda: any(b.reading_on for b in t.joining.values()), timeout=15,
                             message="a slow client to be read on for from history")
        for writer in writers:
            writer.transport.abort()

    await one_round(0)
    idle = await settled(server)
    for round_no in range(1, 6):
        await one_round(round_no)
    assert_as_idle(idle, await until_idle(server, idle))
