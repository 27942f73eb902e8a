"""Raw HTTP/1.1 with a test server, for what a client library hides: the exact status and headers
of a HEAD, a POST or a 405, and the opening handshake of a WebSocket client written by hand."""

from __future__ import annotations

import asyncio
import base64
import os
from collections.abc import Sequence


def upgrade_headers(port: int, *, host: str = "127.0.0.1") -> list[tuple[str, str]]:
    """The headers of a well-formed opening handshake to `host`:`port`, with a fresh
    Sec-WebSocket-Key (16 random bytes in base64, as RFC 6455 asks of a client)."""
    return [("Host", f"{host}:{port}"), ("Upgrade", "websocket"), ("Connection", "Upgrade"),
            ("Sec-WebSocket-Key", base64.b64encode(os.urandom(16)).decode()), ("Sec-WebSocket-Version", "13")]


def upgrade_request(port: int, *, host: str = "127.0.0.1", target: bytes = b"/",
                    headers: Sequence[tuple[bytes, bytes]] = ()) -> bytes:
    """The opening handshake's request for `target`, then `headers` (raw bytes, so a test may
    send what a client library refuses to)."""
    lines = [b"GET " + target + b" HTTP/1.1",
             *(f"{name}: {value}".encode() for name, value in upgrade_headers(port, host=host)),
             *(name + b": " + value for name, value in headers)]
    return b"\r\n".join(lines) + b"\r\n\r\n"


async def http_exchange(port: int, method: str, path: str,
                        headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], bytes]:
    """One request with `method` (and `headers`) to 127.0.0.1:`port`, read until the server ends
    the answer: (status, headers with lowercase names, body)."""
    extra = "".join(f"{name}: {value}\r\n" for name, value in (headers or {}).items())
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n{extra}Content-Length: 0\r\n\r\n".encode())
        raw = await asyncio.wait_for(reader.read(), timeout=5)  # the server ends an HTTP answer with EOF
    finally:
        writer.close()
    head, _, body = raw.partition(b"\r\n\r\n")
    status_line, *lines = head.decode().split("\r\n")
    headers = {name.lower(): value.strip() for name, _, value in (line.partition(":") for line in lines)}
    return int(status_line.split()[1]), headers, body


async def raw_exchange(port: int, request: bytes) -> bytes:
    """`request` as is to 127.0.0.1:`port`; what the server sent until it ended the connection."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(request)
        return await asyncio.wait_for(reader.read(), timeout=5)
    finally:
        writer.close()
