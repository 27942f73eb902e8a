"""A TCP relay between the code under test and a real Postgres or Redis, that can go silent on
chosen connections: it stops forwarding, both ways, and closes nothing. A proxy or NAT that
dropped a long-lived connection without a word looks like this to both ends, while connections
opened afterwards go through as usual.

It runs on an event loop of its own, in a thread: the code under test makes blocking calls
(a server's start checks the schema over a sync connection), which would stall a relay on the
test's loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from urllib.parse import urlsplit, urlunsplit


class _Link:
    def __init__(self) -> None:
        self.sent = bytearray()  # the first bytes the client sent, to tell what the connection is for
        self.silent = False


class Relay:
    def __init__(self, url: str) -> None:
        parts = urlsplit(url)
        assert parts.hostname and parts.port, f"a URL with a host and a port, not {url!r}"
        self._target = (parts.hostname, parts.port)
        self._parts = parts
        self._links: list[_Link] = []
        self._tasks: set[asyncio.Task[None]] = set()
        self._writers: list[asyncio.StreamWriter] = []
        self._server: asyncio.Server | None = None
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="relay", daemon=True)

    def start(self) -> str:
        """Listen; the URL given with its host and port swapped for the relay's."""
        self._thread.start()
        started = asyncio.run_coroutine_threadsafe(asyncio.start_server(self._accept, "127.0.0.1", 0), self._loop)
        self._server = started.result(10.0)
        port = self._server.sockets[0].getsockname()[1]
        user = self._parts.netloc.rpartition("@")[0]
        netloc = f"{user}@127.0.0.1:{port}" if user else f"127.0.0.1:{port}"
        return urlunsplit(self._parts._replace(netloc=netloc))

    def silence(self, marker: bytes) -> int:
        """Stop forwarding on every open connection whose client sent `marker`; how many. (A flag
        the relay's thread reads before each forward.)"""
        chosen = [link for link in self._links if marker in link.sent]
        for link in chosen:
            link.silent = True
        return len(chosen)

    def close(self) -> None:
        asyncio.run_coroutine_threadsafe(self._aclose(), self._loop).result(10.0)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10.0)
        self._loop.close()

    async def _aclose(self) -> None:
        if self._server is not None:
            self._server.close()
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        for writer in self._writers:
            writer.close()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection(*self._target)
        self._writers += [writer, up_writer]
        link = _Link()
        self._links.append(link)
        for task in (self._pump(reader, up_writer, link, record=True), self._pump(up_reader, writer, link)):
            running = asyncio.ensure_future(task)
            self._tasks.add(running)

    @staticmethod
    async def _pump(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, link: _Link,
                    record: bool = False) -> None:
        with contextlib.suppress(OSError):
            while data := await reader.read(65536):
                if record and len(link.sent) < 65536:
                    link.sent += data
                if link.silent:
                    continue  # swallowed: neither end hears of it
                writer.write(data)
                await writer.drain()
        if not link.silent:
            writer.close()
