"""One client connection: its frames in, its frames out, its subscriptions.

Writes never await: a frame goes straight into the transport's buffer. A frame that would take
a client's unsent data past SEND_BUFFER_LIMIT is not written: the client is too slow to keep
up, it is closed with 1013 and skipped from then on, so it never slows the others
(docs/reference.md#5-wire-protocol). A buffer never holds more than the limit, or one frame
when it was empty.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable
from typing import Any

from websockets.asyncio.server import ServerConnection
from websockets.protocol import State

from .. import protocol
from .limits import TokenBucket

log = logging.getLogger("livepush.server")

SEND_BUFFER_LIMIT = 1024 * 1024


class Client:
    __slots__ = ("ws", "session", "topics", "bad_frames", "subscribes", "closing", "_close_task", "__weakref__")

    def __init__(self, ws: ServerConnection, session: Any = None) -> None:
        self.ws = ws
        self.session = session
        self.topics: set[str] = set()  # plain topics this client is subscribed to
        self.bad_frames = protocol.BadFrameWindow()
        self.subscribes = TokenBucket()
        self.closing = False
        self._close_task: asyncio.Task[None] | None = None

    @property
    def subject(self) -> str | None:
        return getattr(self.session, "subject", None)

    def send(self, frame: str) -> None:
        write(self, frame.encode())

    def close(self, code: int, reason: str = "") -> None:
        """Start closing without waiting for it (safe from any callback on the loop)."""
        if self.closing:
            return
        self.closing = True
        self._close_task = asyncio.ensure_future(self.ws.close(code, reason))

    async def drain(self) -> None:
        """Until the client has read most of what was written to it (between replay pages)."""
        await self.ws.drain()

    async def wait_closed(self) -> None:
        """Let a close started by close() finish: a handler that returned first would close
        with 1000 instead of the code chosen."""
        if self._close_task is not None:
            await asyncio.shield(self._close_task)


def write(client: Client, data: bytes) -> None:
    ws = client.ws
    if client.closing or ws.protocol.state is not State.OPEN:
        return
    unsent = ws.transport.get_write_buffer_size()
    if unsent and unsent + len(data) > SEND_BUFFER_LIMIT:
        log.debug("closing a client that fell behind (%d bytes unsent)", unsent)
        client.close(protocol.CLOSE_TOO_SLOW, "too slow")
        return
    try:
        ws.protocol.send_text(data)
        ws.send_data()
    except Exception as exc:  # a transport that broke mid-write: the handler will see it close
        log.debug("write failed: %s", exc)


def broadcast(clients: Iterable[Client], frame: str) -> None:
    """Encode once, write to each: no task or coroutine per subscriber."""
    data = frame.encode()
    for client in clients:
        write(client, data)
