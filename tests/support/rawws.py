"""A WebSocket client written by hand, for frames no client library sends: fragments, control
frames of any size, unmasked or reserved-bit frames, bytes that are not UTF-8. It reads the
server's frames as they come, each wait bounded."""

from __future__ import annotations

import asyncio
import json
import os
import struct
from dataclasses import dataclass, field
from typing import Any

from tests.support.http import upgrade_request

TEXT, BINARY, CONT, CLOSE, PING, PONG = 0x1, 0x2, 0x0, 0x8, 0x9, 0xA


def frame(opcode: int, payload: bytes | str, *, fin: bool = True, masked: bool = True, rsv1: bool = False) -> bytes:
    """One client frame as it goes on the wire, whatever RFC 6455 says of it."""
    data = payload.encode() if isinstance(payload, str) else payload
    first = (0x80 if fin else 0) | (0x40 if rsv1 else 0) | opcode
    mask_bit = 0x80 if masked else 0
    if len(data) < 126:
        head = bytes((first, mask_bit | len(data)))
    elif len(data) < 65536:
        head = struct.pack("!BBH", first, mask_bit | 126, len(data))
    else:
        head = struct.pack("!BBQ", first, mask_bit | 127, len(data))
    if not masked:
        return head + data
    key = os.urandom(4)
    return head + key + bytes(b ^ key[i % 4] for i, b in enumerate(data))


def text(payload: bytes | str, *, fin: bool = True) -> bytes:
    return frame(TEXT, payload, fin=fin)


@dataclass
class Heard:
    """What the server sent: its text frames (parsed), its control frames, and its close."""

    texts: list[dict[str, Any]] = field(default_factory=list)
    pongs: list[bytes] = field(default_factory=list)
    close_code: int | None = None
    close_reason: str = ""
    ended: bool = False  # the server closed (a close frame, or the connection's end)


class RawWS:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer

    @classmethod
    async def open(cls, port: int) -> RawWS:
        """Connected, upgraded and past the server's `hello`."""
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(upgrade_request(port))
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
        assert head.startswith(b"HTTP/1.1 101"), head
        ws = cls(reader, writer)
        heard = Heard()
        await ws._read_one(heard, 5)
        assert heard.texts and heard.texts[0]["op"] == "hello", heard
        return ws

    async def send(self, data: bytes) -> None:
        self.writer.write(data)
        await self.writer.drain()

    async def until_pong(self, ref: str, *, control_pongs: int = 0, timeout: float = 5.0) -> Heard:
        """Read until the `pong` answering `ref` (and `control_pongs` WebSocket pongs, which the
        server may send after the answers to the frames that came with their pings) or the
        server's close; what came before it."""
        heard = Heard()
        answered = False
        async with asyncio.timeout(timeout):
            while not heard.ended and not (answered and len(heard.pongs) >= control_pongs):
                await self._read_one(heard, timeout)
                if heard.texts and heard.texts[-1] == {"op": "pong", "ref": ref}:
                    heard.texts.pop()
                    answered = True
        return heard

    async def until_pongs(self, count: int, *, timeout: float = 5.0) -> Heard:
        """Read until `count` WebSocket pongs came, or the server's close; what came with them."""
        heard = Heard()
        async with asyncio.timeout(timeout):
            while not heard.ended and len(heard.pongs) < count:
                await self._read_one(heard, timeout)
        return heard

    async def _read_one(self, heard: Heard, timeout: float) -> None:
        try:
            head = await asyncio.wait_for(self.reader.readexactly(2), timeout)
            size = head[1] & 0x7F
            if size == 126:
                size = struct.unpack("!H", await self.reader.readexactly(2))[0]
            elif size == 127:
                size = struct.unpack("!Q", await self.reader.readexactly(8))[0]
            data = await self.reader.readexactly(size)
        except (asyncio.IncompleteReadError, ConnectionResetError):
            heard.ended = True
            return
        opcode = head[0] & 0x0F
        if opcode == TEXT:
            heard.texts.append(json.loads(data))
        elif opcode == PONG:
            heard.pongs.append(data)
        elif opcode == CLOSE:
            heard.ended = True
            if len(data) >= 2:
                heard.close_code = struct.unpack("!H", data[:2])[0]
                heard.close_reason = data[2:].decode()

    async def close(self) -> None:
        self.writer.close()
        try:
            await asyncio.wait_for(self.writer.wait_closed(), 5)
        except (ConnectionError, TimeoutError):
            pass
