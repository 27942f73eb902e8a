"""What the connection core promises beyond the protocol (docs/architecture.md#the-connection-core):
one encoded frame for every subscriber, slow clients' frames queued without a copy, keepalive by
one sweep, and no asyncio task per connection."""

from __future__ import annotations

import asyncio
import json
import logging
import socket
import sys
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
from websockets.frames import Frame, Opcode

import livepush
from livepush import api, protocol, topics
from livepush.config import Settings, set_settings
from livepush.fanout.local import LocalFanOut
from livepush.server import core, frames, http
from livepush.server.app import PageRoute, PushServer
from livepush.server.connection import INBOX_FRAMES, Connection
from livepush.server.limits import FRAMES_PER_SECOND
from livepush.types import Message
from tests.support.http import raw_exchange, upgrade_request
from tests.support.rawws import RawWS, text
from tests.support.waiting import async_wait_for
from tests.support.wsclient import WSClient


@pytest.fixture
async def start_server(secret: str) -> AsyncIterator[Callable[..., Any]]:
    """`await start_server(heartbeat=25.0, app=None, pages=None)`: a started server on the local fan-out."""
    servers: list[PushServer] = []

    async def start(heartbeat: float = 25.0, app: livepush.App | None = None, pages: PageRoute | None = None) -> PushServer:
        settings = Settings(fanout="local", secret=secret, port=0)
        set_settings(settings)
        server = PushServer(settings, LocalFanOut(), heartbeat=heartbeat, app=app, pages=pages)
        await server.start()
        servers.append(server)
        return server

    yield start
    for server in servers:
        await server.stop()
        await server.fanout.aclose()
    api.set_default_fanout(None)
    set_settings(None)


def url(server: PushServer) -> str:
    return f"ws://127.0.0.1:{server.port}/"


def on_server(server: PushServer, client: WSClient) -> Connection:
    port = client.ws.local_address[1]
    return next(c for c in server.clients if c.remote_address[1] == port)


def on_server_raw(server: PushServer, writer: asyncio.StreamWriter) -> Connection:
    """The server's side of a raw client's connection."""
    port = writer.get_extra_info("sockname")[1]
    return next(c for c in server.clients if c.remote_address[1] == port)


# tcpi_state, the first byte of TCP_INFO, of a socket whose peer reset it.
TCP_CLOSE = 7


def tcp_state(sock: Any) -> int:
    """The kernel's TCP state of `sock`, read without taking its pending error."""
    return sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 1)[0]


def record_writes(conn: Connection, monkeypatch: pytest.MonkeyPatch) -> list[bytes]:
    """What the server writes to this connection's transport, as the objects it writes."""
    written: list[bytes] = []
    write = conn.transport.write

    def recording(data: bytes) -> None:
        written.append(data)
        write(data)

    monkeypatch.setattr(conn.transport, "write", recording)
    return written


async def subscribers_recorded(server: PushServer, topic: str, n: int,
                               monkeypatch: pytest.MonkeyPatch) -> tuple[list[WSClient], list[list[bytes]]]:
    """n clients subscribed to `topic`, and what the server writes to each from then on."""
    signed = topics.sign(topic, server.settings.secrets)
    clients = [await WSClient.open(url(server)) for _ in range(n)]
    for client in clients:
        assert (await client.subscribe(signed))["op"] == "subscribed"
    return clients, [record_writes(on_server(server, c), monkeypatch) for c in clients]


async def raw_upgrade(port: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A bare TCP client that completes the opening handshake and then does nothing by itself:
    it answers no ping (a dead peer, as far as WebSocket can tell), and runs no task."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(upgrade_request(port))
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
    assert head.startswith(b"HTTP/1.1 101"), head
    return reader, writer


def is_message(data: bytes) -> bool:
    return b'"op":"message"' in data


async def test_a_message_is_encoded_once_and_the_same_bytes_go_to_every_subscriber(
    start_server: Callable[..., Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Three subscribers of a topic: the message is encoded to a frame once, and the very same bytes object is written to each of the three transports."""
    server = await start_server()
    clients, writes = await subscribers_recorded(server, "room:shared", 3, monkeypatch)
    encoded: list[bytes] = []
    text = frames.text

    def counting(payload: bytes) -> bytes:
        frame = text(payload)
        if is_message(payload):
            encoded.append(frame)
        return frame

    monkeypatch.setattr(frames, "text", counting)
    await server.fanout.apublish("room:shared", {"n": 1})
    for client in clients:
        assert (await client.messages(1))[0]["data"] == {"n": 1}
    assert len(encoded) == 1, "one encode per message, whatever the number of subscribers"
    sent = [[d for d in w if is_message(d)] for w in writes]
    assert all(len(s) == 1 and s[0] is encoded[0] for s in sent), "the same bytes object on every transport"
    for client in clients:
        await client.close()


async def test_a_burst_of_messages_in_one_turn_of_the_loop_is_one_write_per_subscriber(
    start_server: Callable[..., Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ten messages published in one turn of the event loop reach each of two subscribers as one write (one system call, not ten), their frames in order."""
    server = await start_server()
    clients, writes = await subscribers_recorded(server, "room:burst", 2, monkeypatch)
    epoch = server.fanout.epoch  # the local fan-out's offsets: "EPOCH-SEQ"
    prev = server.fanout.latest_offset("room:burst")  # the origin: the topic's first message links to it
    for n in range(10):
        server.hub.on_message(Message("room:burst", f"{epoch}-{n + 1}", prev, json.dumps({"n": n}), None))
        prev = f"{epoch}-{n + 1}"
    for client, written in zip(clients, writes):
        assert [m["data"]["n"] for m in await client.messages(10)] == list(range(10))
        assert len(written) == 1, f"{len(written)} writes for a burst of 10"
        assert written[0].count(b'"op":"message"') == 10


async def test_what_was_sent_before_a_close_in_the_same_turn_goes_before_the_close_frame(
    start_server: Callable[..., Any]
) -> None:
    """A frame sent, then a close, in one turn of the loop: the client reads the frame, then the close code."""
    server = await start_server()
    client = await WSClient.open(url(server))
    conn = on_server(server, client)
    conn.send('{"op":"error","code":"bye"}')
    conn.close(4000, "bye")
    assert await client.recv() == {"op": "error", "code": "bye"}
    assert await client.closed_with() == 4000


async def open_slow(server: PushServer) -> WSClient:
    """A client whose socket receives into a 4 KiB buffer, so that the server's side fills up."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.setblocking(False)
    await asyncio.get_running_loop().sock_connect(sock, ("127.0.0.1", server.port))
    return await WSClient.open(url(server), sock=sock)


async def test_a_paused_transport_queues_the_shared_frames_and_gets_them_all_in_order(
    start_server: Callable[..., Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A subscriber that stops reading: once its transport is paused, each message waits in its backlog as the same bytes the reader's transport got (no copy); reading again, it gets every message in order."""
    server = await start_server()
    topic = topics.sign("room:paused", server.settings.secrets)
    slow, reader = await open_slow(server), await WSClient.open(url(server))
    for client in (slow, reader):
        assert (await client.subscribe(topic))["op"] == "subscribed"
    slow_conn, reader_writes = on_server(server, slow), record_writes(on_server(server, reader), monkeypatch)
    slow.ws.transport.pause_reading()
    count = 100  # ~200 KB: past what the kernel holds, within a topic's share of the backlog
    for n in range(count):
        await server.fanout.apublish("room:paused", {"n": n, "pad": "x" * 2000})
        assert (await reader.recv())["data"]["n"] == n
    assert slow_conn.paused and slow_conn.backlog is not None and slow_conn.backlog_bytes > 0
    waiting = {id(slot.data) for slot in slow_conn.backlog._queue if slot.data is not None}
    shared = {id(d) for d in reader_writes if is_message(d)}
    assert waiting and waiting <= shared, "the backlog holds the broadcast frames themselves"

    slow.ws.transport.resume_reading()
    got = [f["data"]["n"] for f in await slow.messages(count, timeout=10)]
    assert got == list(range(count))
    await async_wait_for(lambda: slow_conn.backlog is None, 5, message="the backlog to empty")
    await slow.close()
    await reader.close()


async def test_the_keepalive_sweep_drops_a_dead_peer_within_its_bound_and_keeps_a_live_one(
    start_server: Callable[..., Any],
) -> None:
    """Heartbeat 0.4 s: a peer that answers nothing is pinged and dropped no sooner than one heartbeat and no later than 2.25 heartbeats (plus a tick) after its last byte; a client that answers pings stays open all along."""
    beat = 0.4
    server = await start_server(heartbeat=beat)
    live = await WSClient.open(url(server))
    reader, writer = await raw_upgrade(server.port)
    last_byte = time.monotonic()
    await async_wait_for(lambda: len(server.clients) == 2, 5, message="both connections open")
    await async_wait_for(lambda: len(server.clients) == 1, 5 * beat, message="the dead peer to be dropped")
    dropped_after = time.monotonic() - last_byte
    assert beat <= dropped_after <= 2.25 * beat + 0.2, dropped_after
    received = await asyncio.wait_for(reader.read(), 5)  # up to the server's abort
    assert frames.PING in received, "it was pinged before it was dropped"
    writer.close()
    assert (await live.subscribe(topics.sign("room:alive", server.settings.secrets)))["op"] == "subscribed"
    assert not on_server(server, live).closing
    await live.close()


async def test_a_client_reading_long_replays_while_its_own_frames_wait_is_not_dropped_by_keepalive(
    start_server: Callable[..., Any],
) -> None:
    """Heartbeat 0.4 s: a client that sends 30 subscribes with `since` at once (the server stops reading its frames while it serves them) and reads the 6 MB of replays through a 4 KiB receive buffer for several heartbeats gets all of them: taking what the server sends shows it alive, though its pongs wait unread."""
    server = await start_server(heartbeat=0.4)
    names = [f"room:resume{k}" for k in range(30)]
    since = {name: await server.fanout.alatest_offset(name) for name in names}
    for name in names:
        for i in range(10):
            await server.fanout.apublish(name, {"i": i, "pad": "x" * 20_000})
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.setblocking(False)
    await asyncio.get_running_loop().sock_connect(sock, ("127.0.0.1", server.port))
    client = await WSClient.open(url(server), sock=sock)
    for name in names:
        signed = topics.sign(name, server.settings.secrets)
        await client.send({"op": "subscribe", "topic": signed, "since": since[name], "ref": name})
    got = 0
    started = time.monotonic()
    while got < 10 * len(names):
        frame = await client.recv(timeout=10)
        if frame["op"] == "message":
            got += 1
            await asyncio.sleep(0.01)  # a client slower than the server: the replays wait for it
    assert time.monotonic() - started > 5 * 0.4, "the replays took several heartbeats"
    assert not on_server(server, client).closing
    await client.close()


async def test_a_client_whose_subscribes_wait_on_a_slow_authorize_is_not_dropped_by_keepalive(
    start_server: Callable[..., Any],
) -> None:
    """Heartbeat 0.4 s: a client that sends 30 subscribes at once to topics an `authorize` taking 0.1 s
    allows (the server stops reading its frames while it serves them, for several heartbeats) gets
    every answer: its pongs wait unread because the server chose not to read them, not because it
    is dead."""
    async def authorize(session: object, topic: str) -> bool:
        await asyncio.sleep(0.1)  # an application's permission check, e.g. a query
        return True

    server = await start_server(heartbeat=0.4, app=livepush.App(authorize=authorize))
    client = await WSClient.open(url(server))
    for k in range(30):
        await client.send({"op": "subscribe", "topic": f"room:slow{k}", "since": None, "ref": k})
    answers = [await client.recv(timeout=10) for _ in range(30)]
    assert [a["op"] for a in answers] == ["subscribed"] * 30
    assert not on_server(server, client).closing
    await client.close()


async def test_a_client_past_its_frame_budget_is_not_dropped_by_keepalive(start_server: Callable[..., Any]) -> None:
    """Heartbeat 0.4 s: a client that sends pings worth several seconds of its frame budget at once
    (the server stops reading it while it serves them at the budget's rate), and that answers no
    WebSocket ping, gets every pong: its silence is the server's, not its own."""
    server = await start_server(heartbeat=0.4)
    client = await RawWS.open(server.port)
    count = int(4 * FRAMES_PER_SECOND)  # 2 s of budget saved, then 2 s at the budget's rate
    await client.send(b"".join(text(json.dumps({"op": "ping", "ref": n})) for n in range(count))
                      + text('{"op":"ping","ref":"last"}'))
    heard = await client.until_pong("last", timeout=20)
    assert not heard.ended and heard.texts == [{"op": "pong", "ref": n} for n in range(count)], heard.close_code
    (conn,) = server.clients
    assert not conn.closing
    await client.close()


async def test_a_dead_peer_whose_frames_wait_behind_a_replay_it_does_not_read_is_dropped_by_keepalive(
    start_server: Callable[..., Any],
) -> None:
    """Heartbeat 0.4 s: a peer that sends 20 subscribes with `since` and then reads nothing (the
    server holds its frames unread while the first replay waits for it) is still dropped within
    the keepalive bound, long before the 20 s slow-client bound: the replay waits on the peer, and
    a peer that takes nothing shows no life."""
    beat = 0.4
    server = await start_server(heartbeat=beat)
    name = "room:dead-replay"
    since = await server.fanout.alatest_offset(name)
    for i in range(40):
        await server.fanout.apublish(name, {"i": i, "pad": "x" * 50_000})
    signed = topics.sign(name, server.settings.secrets)
    reader, writer = await raw_upgrade(server.port)
    subscribes = [json.dumps({"op": "subscribe", "topic": signed, "since": since, "ref": k}).encode() for k in range(20)]
    writer.write(b"".join(Frame(Opcode.TEXT, frame).serialize(mask=True) for frame in subscribes))
    await async_wait_for(lambda: len(server.clients) == 1 and next(iter(server.clients)).unread, 5,
                         message="the server to hold the peer's frames unread")
    await async_wait_for(lambda: not server.clients, 2.25 * beat + 2.0,
                         message="keepalive to drop the dead peer")
    writer.close()


async def test_a_client_that_resets_before_its_replay_goes_out_leaves_no_warning_in_the_log(
    start_server: Callable[..., Any], caplog: pytest.LogCaptureFixture,
) -> None:
    """A subscribe with `since` whose client resets the connection while `authorize` decides (the
    server holds the frames sent behind it unread, so it hears of the reset only when it writes):
    the server stops writing at the first write that finds the connection gone, and the log holds
    no warning, however many writes the replay would have taken."""
    caplog.set_level(logging.DEBUG)
    decide = asyncio.Event()

    async def authorize(session: object, topic: str) -> bool:
        await decide.wait()
        return True

    server = await start_server(app=livepush.App(authorize=authorize, authorize_timeout=30))
    since = await server.fanout.alatest_offset("feed")
    for i in range(200):
        await server.fanout.apublish("feed", {"i": i, "pad": "x" * 1000})
    reader, writer = await raw_upgrade(server.port)
    subscribe = json.dumps({"op": "subscribe", "topic": "feed", "since": since, "ref": 1}).encode()
    pings = [b'{"op":"ping"}'] * INBOX_FRAMES
    writer.write(b"".join(Frame(Opcode.TEXT, frame).serialize(mask=True) for frame in [subscribe, *pings]))
    await async_wait_for(lambda: len(server.clients) == 1 and next(iter(server.clients)).unread, 5,
                         message="the server to hold the client's frames unread")
    held = next(iter(server.clients)).transport.get_extra_info("socket")
    writer.get_extra_info("socket").setsockopt(socket.SOL_SOCKET, socket.SO_LINGER,
                                               (1).to_bytes(4, sys.byteorder) + bytes(4))  # close: reset
    writer.transport.abort()
    # The reset reaches the server's socket, which nobody reads, in the kernel's own time.
    await async_wait_for(lambda: tcp_state(held) == TCP_CLOSE, 5, message="the reset to reach the server's socket")
    decide.set()
    await async_wait_for(lambda: not server.clients, 5, message="the reset connection to go")
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING or r.exc_info], caplog.text


async def test_500_idle_connections_run_no_task(start_server: Callable[..., Any]) -> None:
    """500 connections open and idle: the server runs no asyncio task for any of them."""
    server = await start_server()
    before = len(asyncio.all_tasks())
    peers = [await raw_upgrade(server.port) for _ in range(500)]
    await async_wait_for(lambda: len(server.clients) == 500, 10, message="500 connections open")
    # The server's own periodic tasks come and go (a wait_for runs in one): a few, never 500.
    await async_wait_for(lambda: len(asyncio.all_tasks()) - before < 5, 5,
                         message="no task left per connection once the handshakes are done")
    for _, writer in peers:
        writer.close()
    await async_wait_for(lambda: not server.clients, 10, message="every connection gone")


async def test_an_open_connection_keeps_nothing_of_its_request_head(start_server: Callable[..., Any]) -> None:
    """What the request head's scan needed (its first bytes, to tell a HEAD; its unfinished line;
    its Content-Length values) is not kept once the request is read: an idle connection holds
    only what it must remember."""
    server = await start_server()
    client = await WSClient.open(url(server))
    conn = on_server(server, client)
    assert (conn.start, conn.line, conn.lengths) == (b"", b"", b""), (conn.start, conn.line, conn.lengths)
    await client.close()


async def test_frames_sent_while_a_subscribe_is_served_are_answered_after_it_in_order(
    start_server: Callable[..., Any],
) -> None:
    """subscribe, ping, a fragmented ping, unsubscribe and ping sent at once: the answers come in the order sent (subscribed, then each pong)."""
    server = await start_server()
    client = await WSClient.open(url(server))
    topic = topics.sign("room:burst", server.settings.secrets)
    await client.send({"op": "subscribe", "topic": topic, "since": None, "ref": "s"})
    await client.send({"op": "ping", "ref": 1})
    await client.ws.send(['{"op":"ping",', '"ref":2}'])  # one message in two frames
    await client.send({"op": "unsubscribe", "topic": topic})
    await client.send({"op": "ping", "ref": 3})
    answers = [await client.recv() for _ in range(4)]
    assert [(a["op"], a["ref"]) for a in answers] == [("subscribed", "s"), ("pong", 1), ("pong", 2), ("pong", 3)]
    await async_wait_for(lambda: not on_server(server, client).topics, 5, message="the unsubscribe")
    await client.close()


def unread_bytes(sock: Any) -> int:
    """Bytes the kernel holds for `sock` that the server has not read (FIONREAD)."""
    import fcntl
    import termios

    return int.from_bytes(fcntl.ioctl(sock.fileno(), termios.FIONREAD, bytes(4)), sys.byteorder)


async def test_a_client_whose_subscribe_waits_is_not_read_past_its_inbox(start_server: Callable[..., Any]) -> None:
    """While a subscribe waits (on a slow `authorize`), the server reads at most INBOX_FRAMES more
    of that client's frames (and the rest of the read that brought them); what it sends after
    stays in the socket, unread, so a client cannot make the server hold its frames by the
    thousand. All are answered, in order, once the subscribe is."""
    decide = asyncio.Event()

    async def authorize(session: object, topic: str) -> bool:
        await decide.wait()
        return True

    server = await start_server(app=livepush.App(authorize=authorize, authorize_timeout=30))
    bystander = await WSClient.open(url(server))
    reader, writer = await raw_upgrade(server.port)
    ws = RawWS(reader, writer)
    try:
        subscribe = text(json.dumps({"op": "subscribe", "topic": "feed", "since": None, "ref": "s"}))
        first = [text(json.dumps({"op": "ping", "ref": i})) for i in range(INBOX_FRAMES)]
        await ws.send(subscribe + b"".join(first))
        conn = on_server_raw(server, writer)
        await async_wait_for(lambda: conn.unread, 5, message="the server to stop reading the client")
        more = b"".join(text(json.dumps({"op": "ping", "ref": i})) for i in range(INBOX_FRAMES, 4 * INBOX_FRAMES))
        await ws.send(more)
        # A bystander's ping, sent once those bytes are in the server's socket, is answered in a
        # turn of the server's loop that would have read them too, had it been reading.
        await bystander.send({"op": "ping", "ref": "after"})
        assert await bystander.recv() == {"op": "pong", "ref": "after"}
        assert unread_bytes(conn.transport.get_extra_info("socket")) == len(more)
        assert len(conn.inbox or ()) <= INBOX_FRAMES
        decide.set()
        last = 4 * INBOX_FRAMES - 1
        heard = await ws.until_pong(last, timeout=10)  # type: ignore[arg-type]
        answered = [t["ref"] for t in heard.texts if t["op"] != "hello"]
        assert answered == ["s", *range(last)], heard.texts
    finally:
        await ws.close()
        await bystander.close()


async def test_a_frame_that_waits_behind_a_subscribe_is_parsed_once(
    start_server: Callable[..., Any], monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A frame that came while a subscribe was served was parsed when it came (to see whether it
    could be served at once) and again when its turn came: up to INBOX_FRAMES frames of 64 KiB
    read twice. Each is parsed once, and answered in the order sent as before."""
    decide = asyncio.Event()

    async def authorize(session: object, topic: str) -> bool:
        await decide.wait()
        return True

    server = await start_server(app=livepush.App(authorize=authorize, authorize_timeout=30))
    parsed: list[str | bytes] = []
    parse = protocol.parse

    def counted(raw: str | bytes) -> protocol.Command:
        parsed.append(raw)
        return parse(raw)

    monkeypatch.setattr(protocol, "parse", counted)
    client = await WSClient.open(url(server))
    await client.send({"op": "subscribe", "topic": "room:once", "since": None, "ref": "s"})
    for ref in range(3):
        await client.send({"op": "ping", "ref": ref})
    await client.send({"op": "unsubscribe", "topic": "room:once"})
    await async_wait_for(lambda: len(on_server(server, client).inbox or ()) == 4, 5,
                         message="the frames to wait behind the subscribe")
    decide.set()
    answers = [await client.recv() for _ in range(4)]
    assert [(a["op"], a["ref"]) for a in answers] == [("subscribed", "s"), ("pong", 0), ("pong", 1), ("pong", 2)]
    await async_wait_for(lambda: not on_server(server, client).topics, 5, message="the unsubscribe")
    assert len(parsed) == 5, parsed
    await client.close()


async def test_a_request_is_answered_whatever_follows_it_in_the_same_write(start_server: Callable[..., Any]) -> None:
    """A request is answered before anything sent after it counts: `GET /healthz` followed by a stray CRLF or a pipelined second request gets its 200 (what follows a plain HTTP request is ignored); an upgrade followed by an unmasked frame (which the protocol refuses) gets its 101 and hello, then close 1002."""
    server = await start_server()
    port = server.port
    healthz = f"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n".encode()
    for after in (b"\r\n", healthz):
        answer = await raw_exchange(port, healthz + after)
        assert answer.startswith(b"HTTP/1.1 200") and answer.count(b"HTTP/1.1") == 1, (after, answer[:80])

    upgrade = upgrade_request(port)
    unmasked_ping = b"\x81\x0b" + b'{"op":"x"}\n'
    answer = await raw_exchange(port, upgrade + unmasked_ping)
    head, _, rest = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 101"), answer[:80]
    hello_frame = frames.text(protocol.hello(None, server.heartbeat).encode())
    assert rest.startswith(hello_frame), rest[:80]
    close = rest[len(hello_frame):]
    assert close[0] == 0x88 and int.from_bytes(close[2:4], "big") == 1002, close
    await async_wait_for(lambda: not server.clients, 5, message="the refused connection to go")


async def test_a_client_whose_frames_wait_unread_behind_a_subscribe_still_finishes_a_close_the_server_starts(
    start_server: Callable[..., Any],
) -> None:
    """A client whose 20 subscribes wait on an `authorize` that has not answered (the server has
    stopped reading it) and that the server closes (a drain, a revocation, too slow) gets its close
    answer read: the handshake ends cleanly, not by an abort at the close timeout."""
    answer = asyncio.Event()

    async def authorize(session: object, topic: str) -> bool:
        await answer.wait()  # an application's permission check that takes its time
        return True

    server = await start_server(app=livepush.App(authorize=authorize))
    client = await WSClient.open(url(server))
    for k in range(20):
        await client.send({"op": "subscribe", "topic": f"room:held{k}", "since": None, "ref": k})
    conn = on_server(server, client)
    await async_wait_for(lambda: conn.unread, 5, message="the server to hold the client's frames unread")
    try:
        conn.close(1001)
        assert await client.closed_with() == 1001
        await async_wait_for(lambda: conn not in server.clients, 5, message="the connection to end")
        assert conn.proto.close_rcvd is not None, "the client's answer to the close was never read"
    finally:
        answer.set()


# A plain HTTP answer larger than what the kernel buffers between server and client (a page, a
# /metrics of many queues): part of it waits in the server's transport until the client reads.
LARGE_ANSWER = b"x" * 2_000_000


def _large_page(request: Any) -> Any:
    return http.response(200, LARGE_ANSWER) if request.path == "/large" else None


def _request_large_answer(port: int) -> socket.socket:
    """A client with a small receive buffer that has asked for the large answer and read nothing yet."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.settimeout(10)
    sock.connect(("127.0.0.1", port))
    sock.sendall(b"GET /large HTTP/1.1\r\nHost: x\r\n\r\n")
    return sock


async def test_a_plain_http_answer_reaches_whole_a_client_that_starts_reading_it_after_the_close_timeout(
    start_server: Callable[..., Any],
) -> None:
    """A plain HTTP answer is the client's to take at its pace, not cut off by the close timeout
    (1 s for the peer to finish closing): a slow link, a busy scraper or a page that reads late gets
    the whole answer, not a truncated one followed by a reset."""
    server = await start_server(pages=_large_page)

    def fetch() -> bytes:
        with _request_large_answer(server.port) as sock:
            time.sleep(core.CLOSE_TIMEOUT + 4 * core.TICK)  # a client that reads late: what is tested
            chunks = []
            while chunk := sock.recv(1 << 16):
                chunks.append(chunk)
            return b"".join(chunks)

    raw = await asyncio.to_thread(fetch)
    head, _, body = raw.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200 "), raw[:80]
    assert len(body) == len(LARGE_ANSWER), f"{len(body)} of {len(LARGE_ANSWER)} bytes arrived"


async def test_a_client_that_never_reads_a_plain_http_answer_is_dropped_within_the_open_timeout(
    start_server: Callable[..., Any], monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The time a client has to take an answer is bounded: one that asks and never reads holds its
    connection no longer than a client that never sends its request (the open timeout)."""
    monkeypatch.setattr(core, "OPEN_TIMEOUT", 1.0)
    server = await start_server(pages=_large_page)
    sock = await asyncio.to_thread(_request_large_answer, server.port)
    try:
        assert server._core is not None
        await async_wait_for(lambda: server._core._live == 0, 5, message="the connection to be dropped")
    finally:
        sock.close()


async def _dropped(reader: asyncio.StreamReader) -> bytes:
    """What the server sent before it ended the connection (a reset counts as its end)."""
    try:
        return await asyncio.wait_for(reader.read(), 10)
    except ConnectionResetError:
        return b""


HALF_A_HEAD = b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\n"


async def _trickle(writer: asyncio.StreamWriter, data: bytes, every: float) -> None:
    """Send `data` a byte at a time, `every` seconds apart, until done or the server drops us."""
    try:
        for i in range(len(data)):
            writer.write(data[i:i + 1])
            await writer.drain()
            await asyncio.sleep(every)
    except ConnectionError:
        pass  # dropped: what is tested


@pytest.mark.parametrize("sending", ["nothing", "half a request head", "a request head a byte at a time"])
async def test_a_connection_that_never_finishes_its_request_is_dropped_at_the_open_timeout(
    start_server: Callable[..., Any], monkeypatch: pytest.MonkeyPatch, sending: str,
) -> None:
    """A half-open upgrade (a client that connects and sends nothing, stops part-way through its
    request head, or trickles it in slower than the open timeout) holds its connection and
    descriptor no longer than the open timeout, unanswered: a flood of them must not keep the
    server's connections for ever. The timeout runs from the connection, not from its last byte."""
    monkeypatch.setattr(core, "OPEN_TIMEOUT", 1.0)
    server = await start_server()
    reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
    opened = time.monotonic()
    trickling: asyncio.Future[None] | None = None
    try:
        if sending == "half a request head":
            writer.write(HALF_A_HEAD)
        elif sending == "a request head a byte at a time":
            trickling = asyncio.ensure_future(_trickle(writer, upgrade_request(server.port), 0.1))
        assert await _dropped(reader) == b""
        # Far short of the 10 s of websockets' default, or of never for a timeout counted from the
        # last byte; the rest is slack for a loaded machine, whose loop may lag by a second or more.
        assert time.monotonic() - opened < 5.0
        assert server._core is not None
        await async_wait_for(lambda: server._core._live == 0, 5, message="the connection to be forgotten")
    finally:
        if trickling is not None:
            trickling.cancel()
        writer.close()


async def test_a_client_that_never_answers_the_servers_close_is_dropped_at_the_close_timeout(
    start_server: Callable[..., Any],
) -> None:
    """A client the server closes (here for too many bad frames) that neither answers the close
    frame nor ends its side of the connection is aborted once the close timeout is over: a peer
    cannot hold a closing connection open by keeping silent."""
    server = await start_server()
    ws = await RawWS.open(server.port)
    try:
        await ws.send(b"".join(text("not json") for _ in range(protocol.BAD_FRAMES_PER_MINUTE + 1)))
        heard = await ws.until_pong("never sent", timeout=5)  # reads up to the close frame, answers nothing
        assert heard.close_code == protocol.CLOSE_POLICY
        closed = time.monotonic()
        assert await _dropped(ws.reader) == b""
        assert time.monotonic() - closed < core.CLOSE_TIMEOUT + 4.0  # slack for a loaded machine's loop
        assert server._core is not None
        await async_wait_for(lambda: server._core._live == 0, 5, message="the connection to be forgotten")
    finally:
        ws.writer.close()


def _listen_backlog(port: int) -> int:
    """The backlog of the socket listening on 127.0.0.1:port, as the kernel holds it (`ss`'s
    Send-Q for a listening socket): what it took of listen()'s argument, capped at somaxconn."""
    import subprocess

    out = subprocess.run(["ss", "-Hltn", f"sport = :{port}"], capture_output=True, text=True,
                         timeout=10, check=True).stdout
    return int(out.split()[2])


async def test_the_listening_socket_queues_a_reconnect_storm_not_asyncios_default_100(
        start_server: Callable[..., Any]) -> None:
    server = await start_server()
    with open("/proc/sys/net/core/somaxconn") as f:
        somaxconn = int(f.read())
    assert _listen_backlog(server.port) == min(core.LISTEN_BACKLOG, somaxconn) > 100
