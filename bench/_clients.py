"""Cheap WebSocket subscribers for the benchmarks, spread over child processes.

The benchmark machine has two cores shared by the server, the clients and the databases, so
the client must cost as little as possible per frame: a raw asyncio Protocol that does the
HTTP upgrade by hand, splits server frames (never masked, never fragmented by `websockets`),
counts the `message` frames and reads only the publish timestamp out of the ones whose
latency is recorded. No JSON parsing, no task per connection.

Two halves:
- `ClientPool` (in the benchmark process) starts N `_clients.py` processes, tells them what
  to connect to over a Unix socket, and hears back how far every connection got.
- `main()` (in each child) runs the connections and reports.

Counting: a connection's k-th `message` frame is message k (per-topic order is guaranteed,
every connection hears one topic, and a benchmark on several topics publishes in rounds of one
message per topic, so there k is the round), so a process reports "all my connections have
message k" with O(1) work per frame: `reached[k]` counts the connections that got it.

Dialects: what a connection says after the upgrade is a list of steps, each "when a frame
starting with PREFIX arrives, send TEXT" (TEXT null: the connection is ready). livepush is
(any frame: the hello -> subscribe), (`{"op":"subscribed"` -> ready); a bare server that takes
its topic from the path has no steps; Socket.IO is (`0` open -> `40`), (`40` -> a join event
with an ack id), (`431` its ack -> ready). `{topic}` in the path and the step texts is replaced
by the connection's topic (connection i gets topics[i % len(topics)]). With `deflate` the
upgrade offers permessage-deflate as browsers do, and compressed frames are inflated.

Control lines (JSON, one per line), benchmark -> child:
  {"cmd":"run","host","port","n","dialect":{...Dialect},"lat_from":K,"lat_to":K,"source":IP}
  {"cmd":"collect"}  -> child answers "stats", then closes its connections
  {"cmd":"exit"}
child -> benchmark:
  {"ev":"ready","ok":N,"failed":N,"error":TEXT|null}
  "T <k> <unix time>"  every connection of this child has message k (cheap, not JSON)
  {"ev":"stats","frames":N,"closed":N,"codes":{code:count},"deflated":N,"lat":BASE64 of float64 seconds}
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import dataclasses
import json
import os
import resource
import socket
import subprocess
import sys
import tempfile
import time
import zlib
from array import array
from collections import Counter
from collections.abc import Callable
from typing import Any

HANDSHAKE = (
    "GET {path} HTTP/1.1\r\nHost: {host}:{port}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
    "Sec-WebSocket-Key: bGl2ZXB1c2gtYmVuY2gtMQ==\r\nSec-WebSocket-Version: 13\r\n{extra}\r\n"
)
# What a browser offers (Chrome and Firefox send exactly this).
DEFLATE_OFFER = "Sec-WebSocket-Extensions: permessage-deflate; client_max_window_bits\r\n"
LIVEPUSH_MESSAGE = '{"op":"message"'
TIME_FIELD = b'"t":'
CONNECT_CONCURRENCY = 50
IP_BIND_ADDRESS_NO_PORT = getattr(socket, "IP_BIND_ADDRESS_NO_PORT", 24)  # Linux


@dataclasses.dataclass(frozen=True)
class Dialect:
    """How a subscriber of one kind of server subscribes and recognises a message frame."""

    path: str = "/"
    steps: tuple[tuple[str, str | None], ...] = ()  # (frame prefix, text to send; None: ready)
    topics: tuple[str, ...] = ("",)  # connection i fills `{topic}` with topics[i % len(topics)]
    message_prefix: str = LIVEPUSH_MESSAGE
    pong: tuple[str, str] | None = None  # (text frame, answer): a protocol-level ping
    deflate: bool = False  # offer permessage-deflate in the upgrade, as browsers do


def livepush_dialect(subscribes: list[str] | tuple[str, ...], deflate: bool = False) -> Dialect:
    """livepush: `subscribes` are `subscribe` frames (JSON), one per topic."""
    return Dialect(steps=(("", "{topic}"), ('{"op":"subscribed"', None)), topics=tuple(subscribes), deflate=deflate)


def raise_fd_limit(want: int = 65536) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = want if hard == resource.RLIM_INFINITY else min(want, hard)
    if soft < target:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))


def masked_frame(opcode: int, payload: bytes) -> bytes:
    """A client frame. The mask key is zero (legal; servers do not check its randomness),
    so the payload goes out as it is."""
    n = len(payload)
    if n < 126:
        head = bytes([0x80 | opcode, 0x80 | n])
    elif n < 65536:
        head = bytes([0x80 | opcode, 0x80 | 126]) + n.to_bytes(2, "big")
    else:
        head = bytes([0x80 | opcode, 0x80 | 127]) + n.to_bytes(8, "big")
    return head + b"\0\0\0\0" + payload


def time_of(buf: bytes, start: int, end: int) -> float:
    """The `"t":<unix time>` a benchmark message carries (the first field of its data)."""
    i = buf.find(TIME_FIELD, start, end) + 4
    while buf[i] == 32:  # a space after the colon, from encoders that put one there
        i += 1
    j = i
    while buf[j] in b"0123456789.":
        j += 1
    return float(buf[i:j])


class Script:
    """A dialect made ready to send: per topic, the upgrade request and the step frames."""

    def __init__(self, d: Dialect, host: str, port: int) -> None:
        extra = DEFLATE_OFFER if d.deflate else ""
        self.requests = [HANDSHAKE.format(path=d.path.replace("{topic}", t), host=host, port=port, extra=extra).encode()
                         for t in d.topics]
        self.steps = [[(p.encode(), None if text is None else masked_frame(1, text.replace("{topic}", t).encode()))
                       for p, text in d.steps] for t in d.topics]
        self.message_prefix = d.message_prefix.encode()
        self.ping = d.pong[0].encode() if d.pong else None
        self.pong = masked_frame(1, d.pong[1].encode()) if d.pong else None


class Group:
    """The connections of one run in this process and what they received."""

    def __init__(self, n: int, lat_from: int, lat_to: int, report: Callable[[int, float], None]) -> None:
        self.n = n  # connections still alive
        self.lat_from = lat_from  # record latency of messages lat_from..lat_to (0: never)
        self.lat_to = lat_to
        self.report = report
        self.reached = array("l", bytes(8 * 4096))
        self.reported = 0
        self.lat = array("d")
        self.frames = 0
        self.deflated = 0  # connections whose server accepted permessage-deflate
        self.codes: Counter[int] = Counter()
        self.conns: list[Conn] = []
        self.subscribe_sent_at = 0.0  # of the last connection to subscribe
        self.others: list[bytes] = []  # first few non-message frames after `subscribed` (e.g. reset)

    def got(self, k: int, now: float) -> None:
        reached = self.reached
        if k >= len(reached):
            reached.extend(bytes(8 * max(4096, k - len(reached) + 1)))
        reached[k] += 1
        if reached[k] >= self.n and k == self.reported + 1:
            self._advance(now)

    def _advance(self, now: float) -> None:
        reached = self.reached
        while self.reported + 1 < len(reached) and reached[self.reported + 1] >= self.n > 0:
            self.reported += 1
        self.report(self.reported, now)

    def lost(self, conn: Conn) -> None:
        if conn.ready:
            self.n -= 1
            self._advance(time.time())


class Conn(asyncio.Protocol):
    """One subscriber: upgrade, the dialect's steps, then count message frames."""

    def __init__(self, group: Group, script: Script, topic: int, on_ready: asyncio.Future[None]) -> None:
        self.group = group
        self.script = script
        self.topic = topic
        self.on_ready = on_ready
        self.transport: asyncio.Transport | None = None
        self.buf = b""
        self.upgraded = False
        self.step = 0
        self.ready = False
        self.count = 0
        self.inflate: Any = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        transport.write(self.script.requests[self.topic])  # type: ignore[attr-defined]

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.on_ready.done():
            self.on_ready.set_exception(ConnectionError(f"closed before ready ({exc})"))
        self.group.lost(self)
        self.ready = False

    def data_received(self, data: bytes) -> None:
        buf = self.buf + data if self.buf else data
        pos = 0
        if not self.upgraded:
            end = buf.find(b"\r\n\r\n")
            if end < 0:
                self.buf = buf
                return
            if not buf.startswith(b"HTTP/1.1 101"):
                self.on_ready.set_exception(ConnectionError(buf[: buf.find(b"\r\n")].decode(errors="replace")))
                self.transport.close()  # type: ignore[union-attr]
                return
            self.upgraded = True
            if b"permessage-deflate" in buf[:end].lower():
                self.inflate = zlib.decompressobj(-15)
                self.group.deflated += 1
            pos = end + 4
            if not self.script.steps[self.topic]:
                self._set_ready()
        size = len(buf)
        now = 0.0
        group = self.group
        script = self.script
        while size - pos >= 2:
            length = buf[pos + 1] & 0x7F
            head = 2
            if length == 126:
                if size - pos < 4:
                    break
                length = int.from_bytes(buf[pos + 2 : pos + 4], "big")
                head = 4
            elif length == 127:
                if size - pos < 10:
                    break
                length = int.from_bytes(buf[pos + 2 : pos + 10], "big")
                head = 10
            start = pos + head
            end = start + length
            if end > size:
                break
            opcode = buf[pos] & 0x0F
            frame = buf
            if buf[pos] & 0x40:  # RSV1: a compressed message (permessage-deflate)
                frame = self.inflate.decompress(buf[start:end] + b"\x00\x00\xff\xff")
                start, end = 0, len(frame)
            pos = end if frame is buf else pos + head + length
            if opcode == 1:
                if frame.startswith(script.message_prefix, start):
                    if not now:
                        now = time.time()  # one clock read per read(): these frames arrived together
                    self.count += 1
                    group.frames += 1
                    if group.lat_from and group.lat_from <= self.count <= group.lat_to:
                        group.lat.append(now - time_of(frame, start, end))
                    group.got(self.count, now)
                elif not self.ready:
                    self._control_frame(frame, start)
                elif script.ping is not None and frame[start:end] == script.ping:
                    self.transport.write(script.pong)  # type: ignore[union-attr]
                elif len(group.others) < 10:
                    group.others.append(frame[start : min(end, start + 200)])
            elif opcode == 9:  # ping: answer, or the server's keepalive drops us
                self.transport.write(masked_frame(0xA, frame[start:end]))  # type: ignore[union-attr]
            elif opcode == 8:
                code = int.from_bytes(frame[start : start + 2], "big") if end - start >= 2 else 1005
                group.codes[code] += 1
                self.transport.close()  # type: ignore[union-attr]
                return
        self.buf = buf[pos:]

    def _control_frame(self, buf: bytes, start: int) -> None:
        steps = self.script.steps[self.topic]
        prefix, reply = steps[self.step]
        if not buf.startswith(prefix, start):
            text = buf[start : start + 200].decode(errors="replace")
            if not self.on_ready.done():
                self.on_ready.set_exception(ConnectionError(f"expected {prefix!r}, got {text}"))
            return
        self.step += 1
        if reply is None:
            self._set_ready()
        else:
            self.group.subscribe_sent_at = time.time()
            self.transport.write(reply)  # type: ignore[union-attr]

    def _set_ready(self) -> None:
        self.ready = True
        if not self.on_ready.done():
            self.on_ready.set_result(None)


async def open_group(
    host: str,
    port: int,
    n: int,
    dialect: Dialect,
    lat_from: int,
    lat_to: int,
    report: Callable[[int, float], None],
    source: str | None = None,
    first: int = 0,
) -> tuple[Group, int, str | None]:
    """Open `n` subscribers (the `first`-th of the whole pool onwards, which picks their
    topics); returns the group, how many failed, and the first error."""
    loop = asyncio.get_running_loop()
    group = Group(n, lat_from, lat_to, report)
    script = Script(dialect, host, port)
    limit = asyncio.Semaphore(CONNECT_CONCURRENCY)
    errors: list[str] = []

    async def one(i: int) -> None:
        async with limit:
            ready = loop.create_future()
            try:
                sock = socket.socket()
                sock.setblocking(False)
                if source:
                    # The port is picked at connect(), not bind(): a bind to port 0 searches the
                    # whole range for a port free for every destination, ~1 ms a connection.
                    sock.setsockopt(socket.SOL_IP, IP_BIND_ADDRESS_NO_PORT, 1)
                    sock.bind((source, 0))
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                await asyncio.wait_for(loop.sock_connect(sock, (host, port)), timeout=10)
                _, conn = await loop.create_connection(lambda: Conn(group, script, i % len(dialect.topics), ready),
                                                       sock=sock)
                await asyncio.wait_for(ready, timeout=15)
                group.conns.append(conn)
            except Exception as exc:
                errors.append(f"{type(exc).__name__}: {exc}")

    await asyncio.gather(*(one(first + i) for i in range(n)))
    group.n = len(group.conns)
    return group, len(errors), (errors[0] if errors else None)


# -- child process ---------------------------------------------------------------------
async def _child(control_path: str) -> None:
    reader, writer = await asyncio.open_unix_connection(control_path, limit=2**26)
    group: Group | None = None

    def report(k: int, at: float) -> None:
        writer.write(f"T {k} {at:.6f}\n".encode())

    while line := await reader.readline():
        cmd = json.loads(line)
        if cmd["cmd"] == "run":
            d = cmd["dialect"]
            dialect = Dialect(d["path"], tuple(tuple(s) for s in d["steps"]), tuple(d["topics"]), d["message_prefix"],
                              tuple(d["pong"]) if d["pong"] else None, d["deflate"])
            group, failed, error = await open_group(
                cmd["host"], cmd["port"], cmd["n"], dialect, cmd["lat_from"], cmd["lat_to"], report,
                cmd.get("source"), cmd.get("first", 0),
            )
            writer.write(json.dumps({"ev": "ready", "ok": len(group.conns), "failed": failed, "error": error}).encode() + b"\n")
        elif cmd["cmd"] == "collect":
            if group is None:  # nothing was opened (the server failed to start)
                group = Group(0, 0, 0, report)
            closed = sum(1 for c in group.conns if not c.ready)
            stats = {
                "ev": "stats",
                "frames": group.frames,
                "closed": closed,
                "codes": {str(k): v for k, v in group.codes.items()},
                "deflated": group.deflated,
                "lat": base64.b64encode(group.lat.tobytes()).decode(),
            }
            for conn in group.conns:
                conn.ready = False
                if conn.transport is not None:
                    conn.transport.abort()
            group = None
            writer.write(json.dumps(stats).encode() + b"\n")
        elif cmd["cmd"] == "exit":
            break
        await writer.drain()


def main() -> None:
    raise_fd_limit()
    try:
        import uvloop

        uvloop.run(_child(sys.argv[1]))
    except ImportError:
        asyncio.run(_child(sys.argv[1]))


# -- benchmark side --------------------------------------------------------------------
def _source(base: str | None, i: int) -> str | None:
    """Process i's source address: `base` + i, so every process has the whole ephemeral port
    range of an address of its own (10,000 connections and more never run short)."""
    if base is None:
        return None
    a, b, c, d = (int(x) for x in base.split("."))
    return f"{a}.{b}.{c}.{d + i}"


class ClientPool:
    """`processes` child processes of subscribers, driven over a Unix socket. They connect
    from `source`, `source` + 1, ... (one address each)."""

    def __init__(self, processes: int = 2, source: str | None = "127.0.0.2") -> None:
        self.processes = processes
        self.source = source
        self._dir = tempfile.mkdtemp(prefix="livepush-bench-clients-")
        self._path = os.path.join(self._dir, "control.sock")
        self._procs: list[subprocess.Popen[bytes]] = []
        self._streams: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []
        self._through: list[int] = []
        self._at: list[dict[int, float]] = []
        self._replies: list[asyncio.Queue[dict]] = []
        self._changed = asyncio.Event()
        self._readers: list[asyncio.Task[None]] = []

    async def start(self) -> None:
        accepted: asyncio.Queue[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = asyncio.Queue()
        server = await asyncio.start_unix_server(
            lambda r, w: accepted.put_nowait((r, w)), self._path, limit=2**26
        )
        for _ in range(self.processes):
            self._procs.append(subprocess.Popen([sys.executable, os.path.abspath(__file__), self._path]))
        for i in range(self.processes):
            self._streams.append(await asyncio.wait_for(accepted.get(), timeout=30))
            self._through.append(0)
            self._at.append({})
            self._replies.append(asyncio.Queue())
            self._readers.append(asyncio.create_task(self._read(i), name=f"bench-client-reader-{i}"))
        server.close()

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self._procs]

    async def _read(self, i: int) -> None:
        reader = self._streams[i][0]
        while line := await reader.readline():
            if line.startswith(b"T "):
                _, k, at = line.split()
                self._through[i] = int(k)
                self._at[i][int(k)] = float(at)
                self._changed.set()
            else:
                self._replies[i].put_nowait(json.loads(line))

    async def _send_all(self, cmd: dict) -> list[dict]:
        for _, writer in self._streams:
            writer.write(json.dumps(cmd).encode() + b"\n")
        return [await asyncio.wait_for(q.get(), timeout=120) for q in self._replies]

    async def open(
        self, host: str, port: int, n: int, *, subscribe: str | None = None, dialect: Dialect | None = None,
        lat_from: int = 0, lat_to: int = 0,
    ) -> int:
        """Open `n` subscribers spread over the processes; returns how many are ready.
        `subscribe`: one livepush `subscribe` frame for all (else `dialect`; neither: no steps)."""
        if dialect is None:
            dialect = livepush_dialect([subscribe]) if subscribe is not None else Dialect()
        self._through = [0] * self.processes
        self._at = [{} for _ in range(self.processes)]
        first = 0
        for i, (_, writer) in enumerate(self._streams):
            share = n // self.processes + (1 if i < n % self.processes else 0)
            cmd = {"cmd": "run", "host": host, "port": port, "n": share, "dialect": dataclasses.asdict(dialect),
                   "lat_from": lat_from, "lat_to": lat_to, "source": _source(self.source, i), "first": first}
            first += share
            writer.write(json.dumps(cmd).encode() + b"\n")
        replies = [await asyncio.wait_for(q.get(), timeout=300) for q in self._replies]
        errors = [r["error"] for r in replies if r["error"]]
        if errors:
            print(f"  ! {sum(r['failed'] for r in replies)} subscribers failed to connect, e.g. {errors[0]}", file=sys.stderr)
        return sum(r["ok"] for r in replies)

    @property
    def through(self) -> int:
        """Every subscriber has every message up to this number."""
        return min(self._through)

    def delivered_at(self, k: int) -> float:
        """When the last subscriber got message k (unix time)."""
        return max(at.get(k, 0.0) for at in self._at)

    async def wait_through(self, k: int, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while self.through < k:
            self._changed.clear()
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._changed.wait(), remaining)
        return True

    async def collect(self) -> dict:
        """Latency samples (seconds) and counts from every process; closes the subscribers."""
        replies = await self._send_all({"cmd": "collect"})
        lat = array("d")
        codes: Counter[str] = Counter()
        for r in replies:
            lat.frombytes(base64.b64decode(r["lat"]))
            codes.update(r["codes"])
        return {"frames": sum(r["frames"] for r in replies), "closed": sum(r["closed"] for r in replies),
                "codes": dict(codes), "deflated": sum(r["deflated"] for r in replies), "lat": lat}

    async def close(self) -> None:
        for _, writer in self._streams:
            with contextlib.suppress(Exception):
                writer.write(b'{"cmd":"exit"}\n')
                await writer.drain()
                writer.close()
        for task in self._readers:
            task.cancel()
        for proc in self._procs:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        with contextlib.suppress(OSError):
            os.unlink(self._path)
            os.rmdir(self._dir)


if __name__ == "__main__":
    main()
