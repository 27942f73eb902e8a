"""No client can exhaust a server: subscribes are rate-limited per connection, connections are
capped per process, a slow reader's buffer stays bounded, a replay is read and sent in pages,
and an `authorize` hook that cannot answer says `unavailable`, never `forbidden`."""

from __future__ import annotations

import asyncio
import logging
import math
import os
import socket
import sys
import time
from pathlib import Path
from collections.abc import AsyncIterator, Callable, Iterable
from typing import Any

import pytest
from websockets.exceptions import InvalidStatus

import livepush
from livepush.fanout import HISTORY_PAGE
from livepush import metrics, sessions, topics
from livepush.config import set_settings
from livepush.fanout.local import LocalFanOut
from livepush.server.app import PushServer
from livepush.server.backlog import TOPIC_BYTES
from livepush.server.limits import Quiet
from livepush.sessions import Session
from livepush.sessions.revocations import MemoryRevocations
from tests.server.conftest import Served, make_settings, start_served
from tests.support.http import upgrade_request
from tests.support.procs import Processes
from tests.support.waiting import async_wait_for
from tests.support.wsclient import WSClient


@pytest.fixture
async def served(secret: str) -> AsyncIterator[Served]:
    s = await start_served(make_settings("local", secret, None, None, max_connections=5))
    try:
        yield s
    finally:
        await s.stop()


async def test_subscribes_past_100_a_second_are_refused_with_limit(served: Served) -> None:
    """A burst of 150 subscribes gets 100 `subscribed` (and one more per 10 ms the burst took), then `limit`, without an error frame; a second later subscribing works again."""
    client = await WSClient.open(served.url)
    topic = served.sign("room:burst")
    started = time.monotonic()
    for ref in range(150):
        await client.send({"op": "subscribe", "topic": topic, "since": None, "ref": ref})
    answers = [await client.recv() for _ in range(150)]
    # The bucket refills at 100 a second while the burst is under way: a slow machine earns a
    # token for every 10 ms the 150 took, and no more.
    refilled = math.ceil((time.monotonic() - started) * 100)
    granted = [a["op"] for a in answers].count("subscribed")
    assert [a["op"] for a in answers[:100]] == ["subscribed"] * 100
    assert 100 <= granted <= 100 + refilled, (granted, refilled)
    assert [(a["op"], a.get("reason")) for a in answers if a["op"] != "subscribed"] == [("refused", "limit")] * (150 - granted)
    await asyncio.sleep(1.0)  # the bucket refills at 100 a second: this is the rule being checked
    assert (await client.subscribe(topic))["op"] == "subscribed"
    await client.close()


async def test_a_client_offering_compression_gets_none(served: Served) -> None:
    """permessage-deflate is never negotiated, whatever a client offers: the 64 KiB frame limit then
    bounds what the server reads, with no small compressed frame inflating to megabytes, and no
    compression state kept per connection."""
    port = served.server.port
    offer = [(b"Sec-WebSocket-Extensions", b"permessage-deflate; client_max_window_bits; server_no_context_takeover")]
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(upgrade_request(port, headers=offer))
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
    finally:
        writer.close()
    assert head.startswith(b"HTTP/1.1 101"), head
    assert b"sec-websocket-extensions" not in head.lower(), head


async def test_unsubscribing_a_topic_not_subscribed_does_nothing(served: Served) -> None:
    """An unsubscribe of a topic the connection does not hold gets no answer and counts as no bad frame."""
    client = await WSClient.open(served.url)
    for _ in range(20):
        await client.send({"op": "unsubscribe", "topic": "room:never"})
    await client.send({"op": "ping", "ref": "after"})
    assert await client.recv() == {"op": "pong", "ref": "after"}
    await client.close()


async def test_connections_past_the_cap_get_http_503(served: Served) -> None:
    """With LIVEPUSH_MAX_CONNECTIONS=5 the sixth connection is refused with HTTP 503; once one closes, a new one comes in."""
    clients = [await WSClient.open(served.url) for _ in range(5)]
    with pytest.raises(InvalidStatus) as refused:
        await WSClient.open(served.url)
    assert refused.value.response.status_code == 503
    await clients.pop().close()
    # The server notices the close on its next loop turns: a few milliseconds, but a wait, not
    # what is checked, so bounded for a loaded machine.
    await async_wait_for(lambda: len(served.server.clients) < 5, 10, message="the closed connection is still counted")
    clients.append(await WSClient.open(served.url))
    for c in clients:
        await c.close()


class _OverlappingStore(MemoryRevocations):
    """Revocations that answer only once `together` handshakes are asking at the same time: the
    round trip to a database or Redis that a session's handshake awaits, long enough to overlap."""

    def __init__(self, together: int) -> None:
        super().__init__()
        self.together = together
        self.asking = 0
        self.all_asking = asyncio.Event()

    async def revoked_among(self, sessions: Iterable[Session]) -> set[str]:
        self.asking += 1
        if self.asking >= self.together:
            self.all_asking.set()
        await asyncio.wait_for(self.all_asking.wait(), 5)
        return await super().revoked_among(sessions)


async def test_the_connection_cap_holds_for_handshakes_that_overlap(secret: str) -> None:
    """With LIVEPUSH_MAX_CONNECTIONS=2, four handshakes with a session arrive together and wait on the revocation store together: two are served and two get HTTP 503."""
    settings = make_settings("local", secret, None, None, max_connections=2)
    set_settings(settings)
    server = PushServer(settings, LocalFanOut(), store=_OverlappingStore(together=4))
    await server.start()
    try:
        token = sessions.issue("user-7")
        url = f"ws://127.0.0.1:{server.port}/"
        attempts = await asyncio.gather(
            *(WSClient.open(url, subprotocols=["livepush", f"livepush.token.{token}"]) for _ in range(4)),
            return_exceptions=True)
        admitted = [a for a in attempts if isinstance(a, WSClient)]
        refused = [a.response.status_code for a in attempts if isinstance(a, InvalidStatus)]
        assert (len(admitted), refused) == (2, [503, 503]), attempts
        assert len(server.clients) == 2
        for client in admitted:
            await client.close()
    finally:
        await server.stop()
        await server.fanout.aclose()
        set_settings(None)


def _silent_client(port: int) -> socket.socket:
    """A WebSocket client that completes the handshake and then never reads."""
    sock = socket.create_connection(("127.0.0.1", port))
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.sendall(upgrade_request(port))
    assert sock.recv(4096).startswith(b"HTTP/1.1 101")
    return sock


async def test_what_the_server_holds_for_a_reader_that_never_reads_stays_bounded(served: Served) -> None:
    """While 200 KB messages pile up for a client that never reads, what the server holds for it (its transport's unsent data and its backlog) never passes a topic's share of the backlog plus two frames: past the share, what follows waits in history until it reads; others still get every message."""
    sock = await asyncio.to_thread(_silent_client, served.server.port)
    watcher = await WSClient.open(served.url)
    topic = "room:slow"
    slow_client = next(c for c in served.server.clients if c.remote_address[1] == sock.getsockname()[1])
    frame = "x" * 200_000
    # The silent one subscribes with a raw frame, then reads nothing more.
    sock.sendall(_masked_text(f'{{"op":"subscribe","topic":"{served.sign(topic)}","since":null,"ref":1}}'))
    assert (await watcher.subscribe(served.sign(topic)))["op"] == "subscribed"
    await async_wait_for(lambda: topic in slow_client.topics, 10, message="the silent client never subscribed")
    replayed = metrics.SLOW_CLIENT_ACTIONS.labels("replayed")._value.get()
    high = slow_client.transport.get_write_buffer_limits()[1]
    worst = 0
    for n in range(30):
        await served.publish(topic, {"n": n, "pad": frame})
        await asyncio.sleep(0)
        held = slow_client.transport.get_write_buffer_size() + slow_client.backlog_bytes
        worst = max(worst, held)
        assert (await watcher.messages(1, timeout=5))[0]["data"]["n"] == n
    assert metrics.SLOW_CLIENT_ACTIONS.labels("replayed")._value.get() > replayed, \
        "the silent client's share never filled"
    assert worst <= high + TOPIC_BYTES + 2 * (len(frame) + 1000), worst
    sock.close()
    await watcher.close()


def _masked_text(text: str) -> bytes:
    """A client text frame (clients must mask): FIN, opcode 1, a 16-bit length, a zero mask."""
    payload = text.encode()
    assert len(payload) < 65536
    header = bytes([0x81, 0x80 | 126]) + len(payload).to_bytes(2, "big") + b"\x00\x00\x00\x00"
    return header + payload


def _masked_frame(opcode: int, payload: bytes) -> bytes:
    """A short client frame of any opcode (FIN set), with a zero mask."""
    assert len(payload) < 126
    return bytes([0x80 | opcode, 0x80 | len(payload)]) + b"\x00\x00\x00\x00" + payload


async def test_frames_before_a_close_in_one_write_are_answered_first_and_leave_no_error_in_the_log(
        served: Served, caplog: pytest.LogCaptureFixture) -> None:
    """A ping, a text frame that is not UTF-8 and a close, sent in one write: the pong goes out before the close frame, nothing is written after the connection's end, and the log holds no error and no traceback."""
    caplog.set_level(logging.DEBUG)
    port = served.server.port
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(upgrade_request(port))
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
        assert head.startswith(b"HTTP/1.1 101"), head
        hello = await asyncio.wait_for(reader.readuntil(b"}"), 5)
        assert b'"op":"hello"' in hello, hello
        writer.write(_masked_text('{"op":"ping","ref":"before the close"}') + _masked_frame(0x1, b"\xff\xfe")
                     + _masked_frame(0x8, (1000).to_bytes(2, "big")))
        rest = await asyncio.wait_for(reader.read(), 5)  # to the server's end of the connection
    finally:
        writer.close()
    pong, close = rest.find(b'"op":"pong","ref":"before the close"'), rest.find(b"\x88")
    assert 0 <= pong < close, rest
    await async_wait_for(lambda: not served.server.clients, 5, message="the closed connection to go")
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING or r.exc_info], caplog.text


async def test_a_client_that_resets_after_many_pings_leaves_no_warning_in_the_log(
        served: Served, caplog: pytest.LogCaptureFixture) -> None:
    """Twenty WebSocket pings in one write, then a reset of the connection: the server stops writing at the first pong that finds the connection gone, and the log holds no warning, however often a client does it."""
    caplog.set_level(logging.DEBUG)
    port = served.server.port
    for _ in range(5):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(upgrade_request(port))
        await asyncio.wait_for(reader.readuntil(b'"op":"hello"'), 5)
        writer.get_extra_info("socket").setsockopt(socket.SOL_SOCKET, socket.SO_LINGER,
                                                   (1).to_bytes(4, sys.byteorder) + bytes(4))  # close: reset
        writer.write(_masked_frame(0x9, b"are you there") * 20)
        await writer.drain()
        writer.transport.abort()
        await async_wait_for(lambda: not served.server.clients, 5, message="the reset connection to go")
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING or r.exc_info], caplog.text


async def test_a_replay_is_read_and_sent_in_pages(served: Served) -> None:
    """A subscribe with `since` before more messages than a page holds gets every one of them in order, read a page at a time from history."""
    pages: list[int] = []
    real_history = served.fanout.history

    async def paged(*args: Any, **kwargs: Any) -> Any:
        page = await real_history(*args, **kwargs)
        pages.append(len(page.messages) if page is not None else -1)
        return page

    served.fanout.history = paged  # type: ignore[method-assign]
    since = await served.fanout.alatest_offset("room:replay")
    count = 2 * HISTORY_PAGE + 50
    sent = [await served.publish("room:replay", {"n": n}) for n in range(count)]
    client = await WSClient.open(served.url)
    assert (await client.subscribe(served.sign("room:replay"), since=since))["op"] == "subscribed"
    got = await client.messages(count)
    assert [m["offset"] for m in got] == sent
    assert len(pages) >= 3 and max(pages) <= HISTORY_PAGE, pages
    await client.close()


async def test_an_authorize_that_cannot_answer_says_unavailable() -> None:
    """authorize() that times out, raises, or finds every thread busy answers `unavailable`, never `forbidden`."""
    session = Session(id="s", subject="u", expires_at=9e9, issued_at=1.0)

    def slow(_session: Any, _topic: str) -> bool:
        time.sleep(0.5)
        return True

    def broken(_session: Any, _topic: str) -> bool:
        raise RuntimeError("the user database is down")

    timing_out = livepush.App(authorize=slow, authorize_timeout=0.05)
    assert await timing_out.check(session, "team:a") == "unavailable"
    assert await livepush.App(authorize=broken).check(session, "team:a") == "unavailable"
    assert await livepush.App(authorize=lambda s, t: False).check(session, "team:a") == "forbidden"
    busy = livepush.App(authorize=slow, authorize_timeout=5.0)
    answers = await asyncio.gather(*(busy.check(session, f"team:{i}") for i in range(60)))
    # 8 threads and 32 waiting calls: the rest are told at once, and the queued ones get through.
    assert answers.count("unavailable") == 60 - 40 and answers.count(None) == 40, answers
    for app in (timing_out, busy):
        app.close()


def test_what_clients_can_make_the_server_log_is_at_most_ten_lines_a_minute_per_message(caplog: pytest.LogCaptureFixture) -> None:
    """Bad requests and retries of a failing subscribe are logged, but no client can fill the
    log: each message is written at most 10 times a minute, at its own level."""
    logger = logging.getLogger("livepush.test.quiet")
    quiet = Quiet(logger)
    with caplog.at_level(logging.DEBUG, logger=logger.name):
        for n in range(25):
            quiet.warning("subscribe to %s failed: %s", "room:a", f"attempt {n}")
            quiet.debug("refused a connection from a disallowed origin")
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    debugs = [r for r in caplog.records if r.levelno == logging.DEBUG]
    assert len(warnings) == 10 and len(debugs) == 10
    assert warnings[0].getMessage() == "subscribe to room:a failed: attempt 0"


# The open-file limit the server below runs under: small, so that a flood from this test reaches it.
SMALL_FILE_LIMIT = 256


def open_files(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


# Connections opened at once by hold_silent_connections: fewer than the listen backlog (asyncio's
# default of 100, which the server keeps), so the kernel's accept queue for the server never fills.
SILENT_BATCH = 50


def accept_queue(port: int) -> int:
    """How many connections to 127.0.0.1:`port` the kernel holds that its listener has not accepted yet."""
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        address, state, queues = fields[1], fields[3], fields[4]
        if state == "0A" and int(address.split(":")[1], 16) == port:  # 0A: LISTEN
            return int(queues.split(":")[1], 16)  # a listener's rx_queue is its accept queue
    raise AssertionError(f"nothing listens on port {port}")


async def hold_silent_connections(port: int, count: int) -> list[socket.socket]:
    """`count` connections to `port` that send nothing, every one accepted by its listener.

    Opened a batch at a time, each batch connected and accepted before the next: past a full
    accept queue (a burst while the server's process waits for the CPU) the kernel answers with
    SYN cookies and then drops the client's last ACK, so the client side counts a connection
    the server never gets, and a client that sends nothing never sends the segment that would
    still bring it in."""
    loop = asyncio.get_running_loop()
    held: list[socket.socket] = []
    try:
        async with asyncio.timeout(10):
            while len(held) < count:
                batch = [socket.socket() for _ in range(min(SILENT_BATCH, count - len(held)))]
                held.extend(batch)
                for sock in batch:
                    sock.setblocking(False)
                await asyncio.gather(*(loop.sock_connect(sock, ("127.0.0.1", port)) for sock in batch))
                await async_wait_for(lambda: accept_queue(port) == 0, 10,
                                     message=f"the server to accept {len(held)} silent connections")
    except BaseException:
        for sock in held:
            sock.close()
        raise
    return held


async def most_files_held_in_a_flood(pid: int, port: int) -> int:
    """The most descriptors process `pid` held while SMALL_FILE_LIMIT + 100 connections to `port`
    sent nothing. It accepts what the kernel queued for it within a few turns of its loop; each
    silent connection may be held until its request times out (5 s or more), past this wait."""
    flood: list[socket.socket] = []
    try:
        for _ in range(SMALL_FILE_LIMIT + 100):
            sock = socket.socket()
            sock.setblocking(False)
            sock.connect_ex(("127.0.0.1", port))
            flood.append(sock)
        deadline = time.monotonic() + 3
        most = 0
        while time.monotonic() < deadline:
            most = max(most, open_files(pid))
            await asyncio.sleep(0.05)
        return most
    finally:
        for sock in flood:
            sock.close()


async def test_a_flood_of_silent_connections_leaves_the_server_descriptors_of_its_own(
    procs: Processes, livepush_env: Callable[..., dict[str, str]], secret: str
) -> None:
    """A client that opens connection after connection and sends nothing on them (each may wait
    for its request until the open timeout) never takes every file descriptor of the server, which
    it needs for its own database and Redis connections: past its budget, a new connection is
    closed as it comes. A connection already open is served throughout."""
    env = livepush_env()
    port = int(env["LIVEPUSH_PORT"])
    limited = ("import resource, sys; resource.setrlimit(resource.RLIMIT_NOFILE, ({0}, {0})); "
               "from livepush.cli.commands import main; sys.argv[0] = 'livepush'; sys.exit(main())").format(SMALL_FILE_LIMIT)
    server = procs.start([sys.executable, "-c", limited, "serve"], env=env, port=port, name="livepush serve")
    await server.await_healthy()
    client = await WSClient.open(f"ws://127.0.0.1:{port}/")
    topic = "room:flood"
    assert (await client.subscribe(topics.sign(topic, (secret,))))["op"] == "subscribed"
    most = await most_files_held_in_a_flood(server.pid, port)
    assert most <= SMALL_FILE_LIMIT - 64, f"the server held {most} of its {SMALL_FILE_LIMIT} descriptors"
    await client.send({"op": "ping", "ref": "still here"})
    assert await client.recv() == {"op": "pong", "ref": "still here"}
    await client.close()


async def test_a_flood_of_silent_connections_to_the_runtimes_metrics_port_leaves_it_descriptors(
    procs: Processes, livepush_env: Callable[..., dict[str, str]], pg_url: str
) -> None:
    """The job runtime's `--metrics-port` is exposed to whoever can scrape it: a client that opens
    connection after connection there and sends nothing never takes the descriptors the runtime
    needs for its database connections, and a scrape once the flood ends is answered."""
    env = livepush_env(database_url=pg_url)
    port = int(env["LIVEPUSH_PORT"])
    limited = ("import resource, sys; resource.setrlimit(resource.RLIMIT_NOFILE, ({0}, {0})); "
               "from livepush.cli.commands import main; sys.argv[0] = 'livepush'; sys.exit(main())").format(SMALL_FILE_LIMIT)
    runtime = procs.start([sys.executable, "-c", limited, "jobs", "tests.jobs.sample_jobs", "--metrics-port", str(port)],
                          env=env, port=port, name="livepush jobs")
    await runtime.await_healthy()
    most = await most_files_held_in_a_flood(runtime.pid, port)
    assert most <= SMALL_FILE_LIMIT - 64, f"the runtime held {most} of its {SMALL_FILE_LIMIT} descriptors"
    await runtime.await_healthy(path="/metrics")
    assert runtime.stop(timeout=15) == 0, runtime.output()


async def test_the_connection_budget_counts_the_file_limit_that_serve_raised(
    procs: Processes, livepush_env: Callable[..., dict[str, str]], secret: str
) -> None:
    """`serve` lifts its soft open-file limit to the hard one as it starts: the budget of client
    connections follows the raised limit, not the soft one the process started with (else a
    server started under the common soft limit of 1024 would turn clients away at a few hundred
    connections however high its hard limit)."""
    env = livepush_env()
    port = int(env["LIVEPUSH_PORT"])
    limited = ("import resource, sys; resource.setrlimit(resource.RLIMIT_NOFILE, ({0}, {1})); "
               "from livepush.cli.commands import main; sys.argv[0] = 'livepush'; sys.exit(main())"
               ).format(SMALL_FILE_LIMIT, 4 * SMALL_FILE_LIMIT)
    server = procs.start([sys.executable, "-c", limited, "serve"], env=env, port=port, name="livepush serve")
    await server.await_healthy()
    # Past a budget of the soft limit, well inside the raised one's.
    flood = await hold_silent_connections(port, SMALL_FILE_LIMIT)
    try:
        assert open_files(server.pid) > SMALL_FILE_LIMIT
        client = await WSClient.open(f"ws://127.0.0.1:{port}/")
        assert (await client.subscribe(topics.sign("room:budget", (secret,))))["op"] == "subscribed"
        await client.close()
    finally:
        for sock in flood:
            sock.close()
