"""One client connection: its frames in, its frames out, its subscriptions.

Writes never await. While a client keeps up (its transport holds no more than the transport's
high-water mark), a frame goes straight into the transport's buffer. Past that, frames wait in
the client's backlog (backlog.py: a state replaces the older one of its topic, a message topic's
share is bounded and replaced by `reset` past the bound), and one task per such client writes
them out, in order, as the transport drains. A client whose backlog passes BACKLOG_BYTES, or
that has been missing a frame for BEHIND_SECONDS, is closed with 1013. A slow client costs the
others nothing: a frame for it is one append (docs/reference.md#8-trust-boundaries-and-abuse).
"""

from __future__ import annotations

import asyncio
import logging
import socket
import time
from collections.abc import Iterable
from typing import Any, Protocol

from websockets.asyncio.server import ServerConnection
from websockets.exceptions import ConnectionClosed, ConnectionClosedError
from websockets.protocol import State

from .. import metrics, protocol
from .backlog import Backlog, Kind
from .limits import TokenBucket

log = logging.getLogger("livepush.server")

# The kernel's send buffer per connection (Linux doubles it). Left to autotuning it grows to
# megabytes for a client that does not read, where no frame can be replaced or dropped.
SOCKET_SEND_BUFFER = 64 * 1024
# The transport's high-water mark: past it, frames wait in the backlog (websockets' default
# write limit, which the classic core keeps; the low-water mark is asyncio's, a quarter of it).
WRITE_HIGH = 32 * 1024
# A client whose waiting frames pass this many bytes, or that has been missing a frame this
# long, is too far behind: closed with 1013.
BACKLOG_BYTES = 2 * 1024 * 1024
BEHIND_SECONDS = 20.0
# Only if writing a backlog fails unexpectedly (a bug): the client reconnects rather than miss
# frames without knowing.
CLOSE_INTERNAL_ERROR = 1011


class Client:
    __slots__ = ("ws", "session", "topics", "bad_frames", "subscribes", "closing", "_close_task", "_high",
                 "_backlog", "_flusher", "_written", "__weakref__")

    def __init__(self, ws: ServerConnection, session: Any = None) -> None:
        self.ws = ws
        self.session = session
        self.topics: set[str] = set()  # plain topics this client is subscribed to
        self.bad_frames = protocol.BadFrameWindow()
        self.subscribes = TokenBucket()
        self.closing = False
        self._close_task: asyncio.Task[None] | None = None
        self._high = ws.transport.get_write_buffer_limits()[1]
        self._backlog: Backlog | None = None  # frames waiting while the transport is full
        self._flusher: asyncio.Task[None] | None = None
        self._written: asyncio.Future[None] | None = None  # for drain(): more of the backlog is written
        bound_send_buffer(ws.transport)

    @property
    def subject(self) -> str | None:
        return getattr(self.session, "subject", None)

    @property
    def backlog_bytes(self) -> int:
        """Bytes of the frames waiting for this client (0 while it keeps up)."""
        return self._backlog.bytes if self._backlog is not None else 0

    def send(self, frame: str) -> None:
        push(self, frame.encode())

    def close(self, code: int, reason: str = "") -> None:
        """Start closing without waiting for it (safe from any callback on the loop)."""
        if self.closing:
            return
        self.closing = True
        self._backlog = None  # what still waits is never sent
        self._wake_drain()
        self._close_task = asyncio.ensure_future(self.ws.close(code, reason))

    async def drain(self) -> None:
        """Until the client has read what was sent to it so far, but for a little (between
        replay pages); raises ConnectionClosed once the client is being closed. Frames added
        to its backlog later are not waited for: a busy topic cannot hold a replay back."""
        backlog = self._backlog
        if backlog is not None:
            place = backlog.last
            while self._backlog is backlog and not backlog.passed(place):
                if self._written is None:
                    self._written = asyncio.get_running_loop().create_future()
                await asyncio.shield(self._written)
        if self.closing:
            await self.wait_closed()
            raise ConnectionClosedError(None, None)
        await self.ws.drain()

    async def wait_closed(self) -> None:
        """Let a close started by close() finish: a handler that returned first would close
        with 1000 instead of the code chosen."""
        if self._close_task is not None:
            await asyncio.shield(self._close_task)

    # -- the backlog ----------------------------------------------------------------------------
    def _queue(self, data: bytes, topic: str | None, kind: Kind | None) -> None:
        backlog = self._backlog
        if backlog is None:
            backlog = self._backlog = Backlog()
            self._flusher = asyncio.ensure_future(self._flush(backlog))
        if queue_frame(backlog, data, topic, kind):
            too_slow(self, f"{backlog.bytes} bytes waiting")

    async def _flush(self, backlog: Backlog) -> None:
        """Write the backlog out as the transport drains; the one task of a slow client."""
        try:
            ws = self.ws
            while self._backlog is backlog and ws.protocol.state is State.OPEN:
                if ws.transport.get_write_buffer_size() <= self._high:
                    data = backlog.pop()
                    if data is None:
                        return  # caught up: writes go straight to the transport again
                    _write(ws, data)
                    continue
                since = backlog.behind_since()
                if since is None:
                    return  # all written; the next frame checks the transport again
                self._wake_drain()
                try:
                    async with asyncio.timeout(since + BEHIND_SECONDS - time.monotonic()):
                        await ws.drain()
                except TimeoutError:
                    if self._backlog is backlog:
                        too_slow(self, f"behind for {BEHIND_SECONDS:g} s")
        except (ConnectionClosed, OSError):
            pass  # the connection broke: its handler sees it close
        except Exception:  # never drop frames silently: the client reconnects and resubscribes
            log.exception("writing a slow client's backlog failed; closing it")
            self.close(CLOSE_INTERNAL_ERROR, "internal error")
        finally:
            if self._backlog is backlog:
                self._backlog = None
            self._flusher = None
            self._wake_drain()

    def _wake_drain(self) -> None:
        written, self._written = self._written, None
        if written is not None and not written.done():
            written.set_result(None)



# -- the slow-client rules, shared by both cores -------------------------------------------------
class Closable(Protocol):
    def close(self, code: int, reason: str = "") -> None: ...


def bound_send_buffer(transport: Any) -> None:
    """Cap the kernel's send buffer of a connection at SOCKET_SEND_BUFFER."""
    sock = transport.get_extra_info("socket")
    if sock is not None:
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SOCKET_SEND_BUFFER)
        except OSError as exc:
            log.debug("could not bound a connection's socket buffer: %s", exc)


def queue_frame(backlog: Backlog, data: bytes, topic: str | None, kind: Kind | None) -> bool:
    """Add a frame to a slow client's backlog and count what the rules did; True when the
    backlog now holds more than BACKLOG_BYTES (the client must be closed)."""
    outcome = backlog.add(data, topic, kind)
    if outcome == "conflated":
        metrics.SLOW_CLIENT_ACTIONS.labels("conflated").inc()
    elif outcome == "reset":
        metrics.SLOW_CLIENT_ACTIONS.labels("reset").inc()
        metrics.RESETS.labels("slow_client").inc()
    return backlog.bytes > BACKLOG_BYTES


def too_slow(client: Closable, why: str) -> None:
    """Close a client that fell too far behind with 1013, and count it."""
    log.debug("closing a client that fell too far behind (%s)", why)
    metrics.SLOW_CLIENT_ACTIONS.labels("closed").inc()
    client.close(protocol.CLOSE_TOO_SLOW, "too slow")


# -- the classic core's writes ----------------------------------------------------------------
def push(client: Client, data: bytes, topic: str | None = None, kind: Kind | None = None) -> None:
    """Send one encoded frame: at once while the client keeps up, else through its backlog."""
    ws = client.ws
    if client.closing or ws.protocol.state is not State.OPEN:
        return
    if client._backlog is None and ws.transport.get_write_buffer_size() <= client._high:
        _write(ws, data)
    else:
        client._queue(data, topic, kind)


def _write(ws: ServerConnection, data: bytes) -> None:
    try:
        ws.protocol.send_text(data)
        ws.send_data()
    except Exception as exc:  # a transport that broke mid-write: the handler will see it close
        log.debug("write failed: %s", exc)


def broadcast(clients: Iterable[Client], frame: str, topic: str | None = None, kind: Kind | None = None) -> None:
    """Encode once, push to each: no task or coroutine per subscriber."""
    data = frame.encode()
    for client in clients:
        push(client, data, topic, kind)
