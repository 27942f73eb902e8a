"""The frame budget (docs/reference.md#8-trust-boundaries-and-abuse): a client that sends valid
frames faster than the budget is read no faster than it, loses nothing and is not closed, and the
other connections are served meanwhile; a normal client is never paused."""

from __future__ import annotations

import asyncio
import json
import logging
import struct
from typing import Any

import pytest

from livepush import metrics, protocol
from livepush.server import core, limits
from livepush.server.connection import Connection
from tests.server.conftest import Served
from tests.server.test_hostile_frames import warnings_in
from tests.support.rawws import CLOSE, PING, RawWS, frame, text
from tests.support.waiting import async_wait_for
from tests.support.wsclient import WSClient

# The server's clock for the budget is its sweep's (a tick of 0.25 s), and a frame is served while
# any budget is left: what a client may get ahead of the rate, beyond the budget itself.
SLACK_SECONDS = 0.5


def cost(frame: bytes) -> float:
    """What one frame takes of the budget, in seconds."""
    return limits.FRAME_SECONDS + len(frame) * limits.FRAME_BYTE_SECONDS


def numbered_ping(ref: int, size: int) -> bytes:
    """A ping text frame whose payload is `size` bytes (at least its JSON without padding)."""
    head = f'{{"op":"ping","ref":{ref},"pad":"'
    return text(head + "a" * max(size - len(head) - 2, 0) + '"}')


async def read_pongs(client: RawWS, got: list[tuple[Any, float]], count: int, start: float) -> None:
    """Append the ref of each of the next `count` frames, each a pong, and when it came (seconds after `start`)."""
    loop = asyncio.get_running_loop()
    while len(got) < count:
        head = await client.reader.readexactly(2)
        size = head[1] & 0x7F
        if size == 126:
            size = int.from_bytes(await client.reader.readexactly(2), "big")
        frame = json.loads(await client.reader.readexactly(size))
        assert frame["op"] == "pong", frame
        got.append((frame["ref"], loop.time() - start))


@pytest.mark.parametrize("fanout_kind", ["local"])
@pytest.mark.parametrize("size", [40, 65536], ids=["small pings", "64 KiB pings"])
async def test_a_client_flooding_pings_is_read_at_its_budget_and_gets_every_pong_in_order(
        served: Served, size: int, caplog: pytest.LogCaptureFixture) -> None:
    """Pings worth three budgets, in one write: every pong comes, in order, no faster than the
    budget refills once the saved budget is spent, the connection stays open, and a bystander's
    message and pong come promptly while the flood is still being read."""
    caplog.set_level(logging.DEBUG)
    bystander = await WSClient.open(served.url)
    assert (await bystander.subscribe(served.sign("room:calm")))["op"] == "subscribed"
    pings = [numbered_ping(ref, size) for ref in range(int(3 * limits.FRAME_BUDGET_SECONDS / cost(numbered_ping(0, size))))]
    count = len(pings)
    each = max(cost(p) for p in pings)
    pauses = metrics.FRAME_BUDGET_PAUSES._value.get()
    flooder = await RawWS.open(served.server.port)
    loop = asyncio.get_running_loop()
    got: list[tuple[Any, float]] = []
    start = loop.time()
    sending = asyncio.ensure_future(flooder.send(b"".join(pings)))  # at 64 KiB, more than the sockets hold
    reading = asyncio.ensure_future(read_pongs(flooder, got, count, start))
    try:
        # Half the saved budget answered: the flood is being read, and goes on for seconds.
        await async_wait_for(lambda: len(got) >= limits.FRAME_BUDGET_SECONDS / each / 2 or reading.done(), 10,
                             message="the flood's first pongs")
        await served.publish("room:calm", {"n": 1})
        assert (await bystander.messages(1, timeout=2))[0]["data"] == {"n": 1}
        await bystander.send({"op": "ping", "ref": "calm"})
        assert await bystander.recv(timeout=2) == {"op": "pong", "ref": "calm"}
        assert len(got) < count, "the whole flood was answered at once"
        await asyncio.wait_for(asyncio.shield(reading), 30)
        await asyncio.wait_for(asyncio.shield(sending), 5)
    finally:
        sending.cancel()
        reading.cancel()
    assert [ref for ref, _ in got] == list(range(count))
    # Never ahead of the budget: the n-th pong no sooner than n frames' cost, less the saved budget.
    for n, (_, at) in enumerate(got, 1):
        assert n * each <= limits.FRAME_BUDGET_SECONDS + at + SLACK_SECONDS, (n, at)
    await flooder.send(text('{"op":"ping","ref":"after"}'))
    assert (await flooder.until_pong("after", timeout=10)).texts == []
    assert len(served.server.clients) == 2
    assert metrics.FRAME_BUDGET_PAUSES._value.get() > pauses  # what an operator sees of it
    await flooder.close()
    await bystander.close()
    assert not warnings_in(caplog), caplog.text


@pytest.mark.parametrize("fanout_kind", ["local"])
async def test_a_page_at_its_subscription_limit_is_never_paused(served: Served, monkeypatch: pytest.MonkeyPatch) -> None:
    """A page that subscribes to as many topics as it may hold, at once, then pings and hears
    messages, as a page does: the server never stops reading it."""
    past_budget: list[int] = []
    within_budget = Connection._within_budget

    def spy(conn: Connection, events: list[Any], now: float) -> list[Any]:
        past_budget.append(len(events))
        return within_budget(conn, events, now)

    # Only a read that takes a client past its budget gets here (its reads also pause, for a
    # while, as a subscribe's next frames wait: that pause is not the budget's).
    monkeypatch.setattr(Connection, "_within_budget", spy)
    pauses = metrics.FRAME_BUDGET_PAUSES._value.get()
    client = await WSClient.open(served.url)
    names = [f"room:page{n}" for n in range(served.server.app.max_subscriptions)]
    for t in names:  # written without waiting for an answer: together, as far as TCP gathers them
        await client.send({"op": "subscribe", "topic": served.sign(t), "ref": t})
    answers = [await client.recv() for _ in names]
    assert [(a["op"], a["ref"]) for a in answers] == [("subscribed", t) for t in names]
    for ref in range(5):
        await client.send({"op": "ping", "ref": ref})
        assert await client.recv() == {"op": "pong", "ref": ref}
        await served.publish(names[ref], {"n": ref})
        assert (await client.messages(1))[0]["data"] == {"n": ref}
    assert past_budget == []
    assert metrics.FRAME_BUDGET_PAUSES._value.get() == pauses
    await client.close()


@pytest.mark.parametrize("fanout_kind", ["local"])
async def test_a_burst_of_the_smallest_frames_waits_for_its_budget_unparsed(
        served: Served, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """64 KiB of empty WebSocket pings (6 bytes a frame, about 11,000 of them) in one write: while
    the server serves them at the budget's rate it holds fewer parsed than a full budget's worth
    (400), the rest as the bytes they came in, and it answers them in turn. Parsed all at once,
    each waited as an object of about 130 bytes for the minute the budget took: twenty times what
    the client sent, per connection, for as long."""
    caplog.set_level(logging.DEBUG)
    held: list[int] = []
    within_budget = Connection._within_budget

    def spy(conn: Connection, events: list[Any], now: float) -> list[Any]:
        served_now = within_budget(conn, events, now)
        held.append(len(conn.held or ()))
        return served_now

    monkeypatch.setattr(Connection, "_within_budget", spy)
    flooder = await RawWS.open(served.server.port)
    await flooder.send(frame(PING, b"") * (65536 // 6))
    # More than the budget saves: answered through several of its refills.
    heard = await flooder.until_pongs(2 * int(limits.FRAME_BUDGET_SECONDS / limits.FRAME_SECONDS), timeout=15)
    assert not heard.ended and set(heard.pongs) == {b""}
    assert held and 0 < max(held) < limits.FRAME_BUDGET_SECONDS / limits.FRAME_SECONDS, held
    flooder.writer.transport.abort()
    await async_wait_for(lambda: not served.server.clients, 5, message="the flooder to go")
    assert not warnings_in(caplog), caplog.text


@pytest.mark.parametrize("fanout_kind", ["local"])
async def test_a_client_closed_while_its_read_waits_for_the_budget_has_its_answer_to_the_close_read(
        served: Served, monkeypatch: pytest.MonkeyPatch) -> None:
    """A flooder the server closes (a revocation, a drain) while part of a read waits for the
    budget unparsed gets its answer to the close read: what waited is parsed first, so the
    answer is read as the frame it is and the handshake ends cleanly. Dropped unparsed, the
    parser read the answer as the middle of a frame cut at a 2 KiB part, and the connection
    waited for the close timeout (lengthened here, so that only a clean close ends it)."""
    monkeypatch.setattr(core, "CLOSE_TIMEOUT", 30.0)
    flooder = await RawWS.open(served.server.port)
    (conn,) = served.server.clients
    # 131 bytes a frame: no 2 KiB part of the read ends where a frame does.
    ping = frame(PING, b"p" * 125)
    await flooder.send(ping * int(2 * limits.FRAME_BUDGET_SECONDS / limits.FRAME_SECONDS))
    await async_wait_for(lambda: conn.unfed is not None, 5, message="part of a read to wait unparsed")
    conn.close(protocol.CLOSE_REVOKED, "session revoked")
    heard = await flooder.until_pongs(10**6, timeout=10)  # the pongs already parsed, then the close
    assert heard.close_code == protocol.CLOSE_REVOKED, heard.close_code
    await flooder.send(frame(CLOSE, struct.pack("!H", 1000)))
    await async_wait_for(lambda: conn.proto.close_rcvd is not None, 10, message="the server to read the answer")
    assert conn.proto.close_rcvd.code == 1000
    await asyncio.wait_for(flooder.reader.read(), 10)  # the server ends the connection: it heard the answer
    await flooder.close()
    await async_wait_for(lambda: conn not in served.server.clients, 5, message="the connection to end")
