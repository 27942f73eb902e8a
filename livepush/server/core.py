"""The connection core: the listener and its one clock (docs/architecture.md#the-connection-core).

It accepts TCP connections (each a `connection.Connection`), runs each opening handshake through
the server's gate (`PushServer.admit`) in a task that ends with the handshake, and keeps every timer of every connection in one sweep every TICK seconds:

- the open timeout (OPEN_TIMEOUT to send a request and be answered, and as long to take a plain
  HTTP answer that did not fit the socket at once) and the close timeout (CLOSE_TIMEOUT for the
  peer to finish a close handshake), both then abort the connection;
- the slow-client time bound: a connection that has been missing a frame (of its backlog, or a
  replay's next page waiting for it to read) for `connection.BEHIND_SECONDS` is closed with 1013
  (only connections in `behind` are looked at);
- keepalive, every quarter heartbeat: a connection silent for three quarters of a heartbeat gets
  a ping (any data from it answers, and so does its taking frames that waited for it), and one that leaves a ping unanswered for a heartbeat is
  dropped: a dead peer goes within 2.25 heartbeats of its last byte (while the server holds a
  connection's frames unread and waits on itself, not on the peer, it neither pings nor drops it);
- the delivery metrics, counted as plain numbers on the delivery path, added to their
  Prometheus metrics at each tick (`metrics.DeliveryTally`).
"""

from __future__ import annotations

import asyncio
import logging
import sys
import time
from collections.abc import Awaitable
from typing import Any, Protocol

from websockets.frames import CloseCode
from websockets.http11 import Request, Response
from websockets.protocol import OPEN
from websockets.server import ServerProtocol
from websockets.typing import Subprotocol

from .. import metrics, protocol
from ..sessions.handshake import SUBPROTOCOL
from ..tasks import stop as stop_task
from ..tasks import supervise
from . import connection, frames, http
from .connection import Connection

log = logging.getLogger("livepush.server")


class _WarningsOnly(logging.LoggerAdapter[logging.Logger]):
    """What websockets logs through: its warnings and errors, never less. websockets logs request
    paths and headers at DEBUG, `?token=` and session cookies among them. A level set on the
    logger did not hold: dictConfig (a Django project's LOGGING) resets it under a configured
    `livepush` logger, and the app's DEBUG then let every token into the log."""

    def isEnabledFor(self, level: int) -> bool:
        return level >= logging.WARNING and self.logger.isEnabledFor(level)


_WS_LOGGER = _WarningsOnly(logging.getLogger("livepush.websockets"))
_SUBPROTOCOL = Subprotocol(SUBPROTOCOL)

OPEN_TIMEOUT = 10.0  # websockets' default
# File descriptors kept from client connections, of the process's open-file limit: its database
# and Redis connections, listeners and files need them. A client may open connections faster than
# the open timeout ends those that send nothing, and LIVEPUSH_MAX_CONNECTIONS counts only those
# that finished their handshake; without a reserve such a flood took every descriptor, and the
# server could not reconnect to its database. An eighth of the limit, at least this many.
DESCRIPTOR_RESERVE = 128
CLOSE_TIMEOUT = 1.0  # for the peer to answer a close
TICK = 0.25
STOP_SECONDS = 3.0  # how long close() waits for the close handshakes before aborting the rest
# Connections the kernel queues for accept(): asyncio's default of 100 overflowed when a deploy
# sent thousands of clients back at once, and those past it waited 1-3 s on SYN retries. The
# kernel caps it at net.core.somaxconn (docs/operations.md#behind-a-proxy-or-load-balancer).
LISTEN_BACKLOG = 65535


class Server(Protocol):
    """What the core asks of the server (app.PushServer): its gate, its connections, its frames."""

    clients: set[Connection]
    heartbeat: float

    async def admit(self, request: Request) -> Any: ...

    def refuses(self, session: object) -> bool: ...

    def attach(self, client: Connection) -> None: ...

    def detach(self, client: Connection) -> None: ...

    def on_frame(self, client: Connection, cmd: protocol.Command) -> Awaitable[None] | None: ...

    def served_at_once(self, client: Connection, cmd: protocol.Command) -> bool: ...

    def overflowed(self, client: Connection, topic: str) -> bool: ...  # the connection asks it


def descriptor_budget() -> int:
    """How many client connections this process may hold: its open-file limit (as `serve` raised
    it) less DESCRIPTOR_RESERVE or an eighth of it, whichever is more; no bound without a limit."""
    try:
        import resource

        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    except (ImportError, ValueError, OSError):
        return sys.maxsize
    if soft == resource.RLIM_INFINITY:
        return sys.maxsize
    return max(soft - max(DESCRIPTOR_RESERVE, soft // 8), 1)


class _Protocol(ServerProtocol):
    """websockets' sans-I/O server side, selecting `livepush` when offered (a client that offers
    no subprotocol is served too); a method rather than a bound callback per connection."""

    def select_subprotocol(self, subprotocols: Any) -> Any:
        return SUBPROTOCOL if SUBPROTOCOL in subprotocols else None


class ConnectionCore:
    """The listening socket, the handshakes under way, and the sweep."""

    def __init__(self, server: Server) -> None:
        self.server = server
        self.now = 0.0  # the loop's time at the last tick: a connection's `seen`
        self.behind: set[Connection] = set()  # connections with a backlog, or whose replay waits for them
        self._opening: set[Connection] = set()  # accepted, not yet answered
        self._answering: set[Connection] = set()  # of those, the ones whose request the gate is answering
        self._closing: set[Connection] = set()  # waiting for the peer to finish closing
        self._handshakes: set[asyncio.Task[None]] = set()
        self._live = 0  # connections made and not lost
        self._all_lost: asyncio.Event | None = None
        self._listener: asyncio.Server | None = None
        self._sweeper: asyncio.Task[None] | None = None
        self._stopping = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._corked: list[Connection] = []  # connections with frames gathered in this turn
        self._budget = descriptor_budget()  # connections made and not lost, at most

    @property
    def port(self) -> int:
        assert self._listener is not None
        port: int = self._listener.sockets[0].getsockname()[1]
        return port

    async def listen(self, host: str, port: int, *, reuse_port: bool = False) -> None:
        """Listen on host:port; `reuse_port`: one of several processes on the port (serve --workers)."""
        self._loop = asyncio.get_running_loop()
        self.now = self._loop.time()
        self._listener = await self._loop.create_server(lambda: Connection(self), host, port,
                                                        reuse_port=reuse_port or None, backlog=LISTEN_BACKLOG)
        self._sweeper = supervise("livepush-sweep", self._sweep)

    def new_protocol(self) -> ServerProtocol:
        return _Protocol(subprotocols=[_SUBPROTOCOL], max_size=protocol.MAX_FRAME_BYTES, logger=_WS_LOGGER)

    # -- connections ------------------------------------------------------------------------------
    def opened_tcp(self, conn: Connection) -> None:
        self._live += 1
        if self._live > self._budget:
            # Closed before a byte is read: answering would cost what the budget keeps.
            conn.closing = True
            conn.transport.abort()
            return
        conn.deadline = self.now + OPEN_TIMEOUT
        self._opening.add(conn)

    def cork(self, conn: Connection) -> None:
        self._corked.append(conn)
        if len(self._corked) == 1:
            asyncio.get_running_loop().call_soon(self._uncork)

    def _uncork(self) -> None:
        corked, self._corked = self._corked, []
        for conn in corked:
            try:
                conn.uncork()
            except Exception as exc:  # a transport gone under us: its connection_lost follows
                log.debug("could not write to a connection: %s", exc)

    def is_opening(self, conn: Connection) -> bool:
        return conn in self._opening

    def request_received(self, conn: Connection, events: list[Any]) -> None:
        """The handshake request is in: answer it once the gate has spoken; the client's next
        bytes wait until then (what came with the request, in `conn.early`, is read once the
        connection is open, and never after a plain HTTP answer)."""
        request = events[0]
        if not isinstance(request, Request) or conn.closing:
            return
        conn.transport.pause_reading()
        self._answering.add(conn)
        task = asyncio.ensure_future(self._handshake(conn, request))
        self._handshakes.add(task)
        task.add_done_callback(self._handshakes.discard)

    async def _handshake(self, conn: Connection, request: Request) -> None:
        proto = conn.proto
        try:
            verdict: Any = await self.server.admit(request)
        except Exception:
            log.exception("answering a request failed")
            # Worded for any request: the gate answers plain HTTP routes too.
            verdict = http.response(500, b"the server failed to answer this request: see its log\n")
        finally:
            self._answering.discard(conn)
        if conn.closing:
            return  # the client left meanwhile
        if isinstance(verdict, Response):
            response = verdict
        else:
            response = proto.accept(request)
            if response.status_code == 101 and self._stopping:
                response = proto.reject(503, "Server is shutting down.\n")
        if request.method == "HEAD":
            # No answer to a HEAD has a body (RFC 9110 §9.3.2): a route's, the gate's refusal of
            # one that carries the upgrade's headers, or websockets' 405 for it.
            response = http.for_head(response)
        if response.status_code != 101:
            # One request per connection: the answer says so (RFC 9112 §9.6), or an HTTP/1.1
            # client would send its next request on it and never see that answered.
            if "Connection" in response.headers:
                del response.headers["Connection"]
            response.headers["Connection"] = "close"
        self._opening.discard(conn)
        conn.deadline = 0.0
        early, conn.early = conn.early, None
        proto.send_response(response)
        conn.flush()
        conn.transport.resume_reading()
        if proto.state is not OPEN:
            conn.closing = True  # an HTTP answer: the client closes, or the close timeout does
            if conn.transport.get_write_buffer_size():
                # Part of the answer waits for a client that reads slowly (a large /metrics, a
                # page, a slow link): the close timeout would abort the transport with it there,
                # and the client get a truncated answer. It may take as long as a request may.
                conn.deadline = self.now + OPEN_TIMEOUT
            return
        if conn.transport.is_closing():
            # The answer found the client gone (it reset the connection while the gate decided):
            # its connection_lost comes next. Served, the subscribe sent with its request started
            # a task that the loss cancelled before it ran, and Python reported it on stderr.
            conn.closing = True
            return
        conn.session = verdict.session
        if self.server.refuses(conn.session):
            conn.close(protocol.CLOSE_UNAUTHORIZED, "a valid session is required")
            return
        self.server.attach(conn)
        if early:
            conn.data_received(bytes(early))

    def expect_close(self, conn: Connection) -> None:
        """The close handshake is under way: the peer has CLOSE_TIMEOUT to finish it."""
        if conn in self._closing:
            return
        self._opening.discard(conn)
        conn.deadline = (self._loop.time() if self._loop is not None else self.now) + CLOSE_TIMEOUT
        self._closing.add(conn)

    def lost(self, conn: Connection) -> None:
        self._opening.discard(conn)
        self._closing.discard(conn)
        self.behind.discard(conn)
        self.server.detach(conn)
        self._live -= 1
        if self._live == 0 and self._all_lost is not None:
            self._all_lost.set()

    # -- the sweep --------------------------------------------------------------------------------
    async def _sweep(self) -> None:
        loop = asyncio.get_running_loop()
        beat = self.server.heartbeat
        every = beat / 4  # keepalive's period
        tick = min(TICK, every)
        next_beat = loop.time() + every
        while True:
            await asyncio.sleep(tick)
            now = self.now = loop.time()
            metrics.TALLY.flush()
            self._timeouts(now)
            if self.behind:
                self._too_far_behind()
            if now >= next_beat:
                next_beat = now + every
                self._keepalive(now, beat - every, beat)

    def _timeouts(self, now: float) -> None:
        for conns in (self._opening, self._closing):
            for conn in [c for c in conns if c.deadline <= now]:
                conns.discard(conn)
                conn.transport.abort()

    def _too_far_behind(self) -> None:
        now = time.monotonic()  # the backlog's clock
        bound = connection.BEHIND_SECONDS
        for conn in list(self.behind):
            since = conn.behind_since()
            if since is None:
                self.behind.discard(conn)
            elif now - since >= bound:
                connection.too_slow(conn, f"behind for {bound:g} s")

    def _keepalive(self, now: float, quiet: float, answer: float) -> None:
        dead = []
        for conn in self.server.clients:
            if conn.closing:
                continue
            if conn.unread and not conn.paused:
                # Not read while the server serves its subscribes (a slow `authorize` may take
                # several heartbeats): its pongs wait unread, and the wait is the server's own. A
                # replay waiting for the peer (paused) is not: taking its frames shows it alive.
                conn.seen, conn.ping_at = now, 0.0
                continue
            if conn.ping_at:
                if now - conn.ping_at >= answer:
                    dead.append(conn)
            elif now - conn.seen >= quiet:
                conn.ping_at = now
                conn.transport.write(frames.PING)
        for conn in dead:
            log.debug("dropping a connection that left a keepalive ping unanswered for %g s", answer)
            conn.closing = True
            conn.transport.abort()

    # -- stopping ---------------------------------------------------------------------------------
    async def close(self) -> None:
        """Stop listening, close every connection with 1001, answer the requests being answered
        (an upgrade with 503), and wait (at most STOP_SECONDS) for the close handshakes and those
        answers; abort what is left."""
        self._stopping = True
        if self._listener is not None:
            self._listener.close()
        for conn in list(self.server.clients):
            conn.close(CloseCode.GOING_AWAY)
        # A request being answered (a page's action, a scrape of /metrics) gets its answer: dropped,
        # its client saw no response and could not tell whether what it asked for was done.
        for conn in list(self._opening - self._answering):
            conn.transport.abort()
        if self._live:
            self._all_lost = asyncio.Event()
            try:
                await asyncio.wait_for(self._all_lost.wait(), STOP_SECONDS)
            except TimeoutError:
                for conn in list(self._opening) + list(self._closing) + list(self.server.clients):
                    conn.transport.abort()
        await stop_task(self._sweeper)
        for task in list(self._handshakes):
            task.cancel()
