"""A raw HTTP/1.1 exchange with a test server, for what an HTTP client library hides: the exact
status and headers of a HEAD, a POST or a 405."""

from __future__ import annotations

import asyncio


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
