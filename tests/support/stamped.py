"""A bare WebSocket client that tells when the server *sent* its close frame, not when this test
got round to reading it: the kernel's receive time of the frame (SO_TIMESTAMP). On loopback that
is the server's send time to within microseconds, so a test process that a loaded machine stalls
for a few hundred milliseconds does not see a paced drain's closes bunched together.

Only the opening handshake, the server's first frame (`hello`) and the close are spoken; the
client answers the close so that the server's close handshake ends at once.
"""

from __future__ import annotations

import asyncio
import os
import socket
import struct
from dataclasses import dataclass

from tests.support.http import upgrade_request

# Linux's value; Python's socket module does not name it. For TCP the kernel reports the receive
# time of the last segment read, which here is the close frame's alone (nothing else is unread).
SO_TIMESTAMP = getattr(socket, "SO_TIMESTAMP", 29)
TIMEVAL = struct.Struct("qq")
OP_CLOSE = 0x8


@dataclass(frozen=True)
class StampedClose:
    at: float  # the kernel's receive time, on the time.time() clock
    code: int | None
    reason: str


def _frame(buf: bytes) -> tuple[int, bytes, int] | None:
    """(opcode, payload, length used) of the first whole unmasked frame in `buf`, or None."""
    if len(buf) < 2:
        return None
    size, at = buf[1] & 0x7F, 2
    if size == 126:
        if len(buf) < 4:
            return None
        size, at = struct.unpack_from("!H", buf, 2)[0], 4
    elif size == 127:
        if len(buf) < 10:
            return None
        size, at = struct.unpack_from("!Q", buf, 2)[0], 10
    if len(buf) < at + size:
        return None
    return buf[0] & 0x0F, buf[at:at + size], at + size


def _masked_close(payload: bytes) -> bytes:
    mask = os.urandom(4)
    return bytes([0x80 | OP_CLOSE, 0x80 | len(payload)]) + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(payload))


class StampedWS:
    def __init__(self, sock: socket.socket, buffered: bytes) -> None:
        self.sock = sock
        self._buf = buffered
        self._stamp: float | None = None
        self.closed: asyncio.Future[StampedClose | None] = asyncio.get_running_loop().create_future()
        sock.setblocking(False)
        asyncio.get_running_loop().add_reader(sock, self._readable)

    @classmethod
    async def open(cls, host: str, port: int) -> StampedWS:
        """Connected, upgraded and past the server's `hello`; from then on watching for the close."""
        sock, rest = await asyncio.to_thread(cls._handshake, host, port)
        return cls(sock, rest)

    @staticmethod
    def _handshake(host: str, port: int) -> tuple[socket.socket, bytes]:
        sock = socket.create_connection((host, port), timeout=5)
        sock.sendall(upgrade_request(port, host=host))
        buf = b""
        while b"\r\n\r\n" not in buf or _frame(buf.split(b"\r\n\r\n", 1)[1]) is None:
            chunk = sock.recv(65536)
            assert chunk, f"the server hung up during the handshake: {buf!r}"
            buf += chunk
        head, rest = buf.split(b"\r\n\r\n", 1)
        assert head.startswith(b"HTTP/1.1 101"), head
        hello = _frame(rest)
        assert hello is not None and b'"hello"' in hello[1], rest
        # Stamps from here on: the hello has been read, so the next segment is the close.
        sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMP, 1)
        return sock, rest[hello[2]:]

    @property
    def is_open(self) -> bool:
        return not self.closed.done()

    def _readable(self) -> None:
        try:
            data, ancillary, _, _ = self.sock.recvmsg(65536, socket.CMSG_SPACE(TIMEVAL.size))
        except BlockingIOError:
            return
        except OSError:
            self._finish(None)
            return
        for level, kind, value in ancillary:
            if level == socket.SOL_SOCKET and kind == SO_TIMESTAMP:
                seconds, micros = TIMEVAL.unpack(value[:TIMEVAL.size])
                self._stamp = seconds + micros / 1e6
        if not data:
            self._finish(None)
            return
        self._buf += data
        while (frame := _frame(self._buf)) is not None:
            opcode, payload, used = frame
            self._buf = self._buf[used:]
            if opcode == OP_CLOSE:
                code = struct.unpack_from("!H", payload)[0] if len(payload) >= 2 else None
                self.sock.send(_masked_close(payload[:2]))
                if self._stamp is None:
                    self._finish(AssertionError("the kernel gave no receive time (SO_TIMESTAMP) for the close"))
                else:
                    self._finish(StampedClose(self._stamp, code, payload[2:].decode()))
                return

    def _finish(self, close: StampedClose | BaseException | None) -> None:
        asyncio.get_running_loop().remove_reader(self.sock)
        self.sock.close()
        if self.closed.done():
            return
        if isinstance(close, BaseException):
            self.closed.set_exception(close)
        else:
            self.closed.set_result(close)
