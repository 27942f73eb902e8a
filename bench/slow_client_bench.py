#!/usr/bin/env python
"""Slow-client suite: the publish-to-deliver latency of 1,000 subscribers (500 with --quick) with
and without one client that never reads, on the same topic, on the same server, in the same run
(docs/reference.md §8, slow clients). tests/faults/test_slow_client.py asserts the same
measurement through run_rounds().

One `python -m livepush serve` process on the Redis fan-out; the benchmark publishes from its own
process, as an application would, ~200-byte messages carrying their publish time (the
subscribers, spread over child processes by bench/_clients.py, subtract it from their clock).
Each round runs two phases in turn on the same server:
- `alone`: the subscribers only;
- `slow`: the same, plus one client subscribed to the topic that reads nothing after its
  handshake. Before the phase, ~1 MB goes to a second topic only it hears: the kernel's
  buffers for it are full then, so every frame of the measured topic waits in its backlog
  during the phase, and the second topic's share of the backlog has passed its bound (the rest
  of that topic waits in history for it: `replayed` in the server's /metrics).
20 messages a second for 5 s per phase (2 s with --quick), after a second of warm-up; 2 rounds
(1 with --quick). Figures, each the slow phase's against the alone phase's (medians over the
rounds): p50 and p99 over every delivery, the server's CPU per delivery while the phase
published (less sensitive than latency to load from elsewhere on the machine), and its resident
memory at the end of the phase. Whether the slow client's share passed its bound is printed as
progress.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import re
import secrets
import socket
import sys
import time
import urllib.request
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import report  # noqa: E402
from _clients import ClientPool, masked_frame, raise_fd_limit  # noqa: E402
from _procstat import cpu_seconds, percentile  # noqa: E402

TOPIC = "bench:slow"
FILL_TOPIC = "bench:slow-fill"  # heard by the slow client only
FILL_MESSAGES, FILL_BYTES = 16, 64 * 1024

Publish = Callable[[str, object], Awaitable[object]]


@dataclass
class Phase:
    name: str
    p50_ms: float
    p99_ms: float
    max_ms: float
    samples: int
    rss_mib: float
    cpu_us: float  # server CPU per delivery while the phase published
    closed: dict[str, int]


class SilentClient:
    """A WebSocket client that completes its handshake, subscribes, and then never reads."""

    def __init__(self, port: int, signed_topics: list[str]) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port))
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        key = base64.b64encode(os.urandom(16)).decode()
        self.sock.sendall((f"GET / HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nUpgrade: websocket\r\n"
                           f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n").encode())
        answer = b""
        while b"\r\n\r\n" not in answer:
            answer += self.sock.recv(1)  # byte by byte: nothing past the handshake is read
        assert answer.startswith(b"HTTP/1.1 101"), answer
        for ref, topic in enumerate(signed_topics):
            frame = {"op": "subscribe", "topic": topic, "since": None, "ref": ref}
            self.sock.sendall(masked_frame(1, json.dumps(frame).encode()))

    def close(self) -> None:
        self.sock.close()


def replayed(port: int) -> float:
    """The server's count of slow clients' shares that passed their bound (the rest of the topic
    then waits in history for them), from its /metrics."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as answer:
        text = answer.read().decode()
    found = re.search(r'^livepush_slow_client_actions_total\{action="replayed"\} (\S+)$', text, re.M)
    return float(found.group(1)) if found else 0.0


def rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


async def run_phase(name: str, pool: ClientPool, port: int, pid: int, publish: Publish, sign: Callable[[str], str],
                    *, subscribers: int, rate: float, seconds: float, warmup: float,
                    slow: SilentClient | None = None) -> Phase:
    """Open the subscribers, publish at `rate` for `warmup` + `seconds`, and measure the latter."""
    warm, measured = max(1, int(warmup * rate)), int(seconds * rate)
    subscribe = json.dumps({"op": "subscribe", "topic": sign(TOPIC), "since": None, "ref": 1})
    n = await pool.open("127.0.0.1", port, subscribers, subscribe=subscribe, lat_from=warm + 1, lat_to=warm + measured)
    if n < subscribers:
        raise RuntimeError(f"only {n} of {subscribers} subscribers connected")
    if slow is not None:
        for _ in range(FILL_MESSAGES):
            await publish(FILL_TOPIC, {"pad": "x" * FILL_BYTES})
    loop = asyncio.get_running_loop()
    cpu0 = cpu_seconds(pid)
    t0 = loop.time()
    for k in range(1, warm + measured + 1):
        delay = t0 + (k - 1) / rate - loop.time()  # an absolute schedule: no drift from publish time
        if delay > 0:
            await asyncio.sleep(delay)
        await publish(TOPIC, {"t": time.time(), "k": k, "p": "x" * 150})
    if not await pool.wait_through(warm + measured, timeout=30):
        raise RuntimeError(f"subscribers got only through message {pool.through} of {warm + measured}")
    cpu = cpu_seconds(pid) - cpu0
    rss = rss_mib(pid)
    stats = await pool.collect()
    lat = sorted(stats["lat"])
    return Phase(name, percentile(lat, 0.5) * 1000, percentile(lat, 0.99) * 1000, (lat[-1] if lat else 0) * 1000,
                 len(lat), rss, cpu / ((warm + measured) * n) * 1e6, stats["codes"])


async def run_rounds(pool: ClientPool, port: int, pid: int, publish: Publish, sign: Callable[[str], str], *,
                     rounds: int, subscribers: int, rate: float, seconds: float, warmup: float,
                     report: Callable[[str], None] = print) -> tuple[list[tuple[Phase, Phase]], int]:
    """`rounds` pairs of phases (alone, slow); returns them and in how many the slow client's share
    of a topic passed its bound."""
    pairs = []
    passed = 0
    options = dict(subscribers=subscribers, rate=rate, seconds=seconds, warmup=warmup)
    for i in range(1, rounds + 1):
        alone = await run_phase("alone", pool, port, pid, publish, sign, **options)  # type: ignore[arg-type]
        report(format_phase(alone, i))
        before = await asyncio.to_thread(replayed, port)
        slow = await asyncio.to_thread(SilentClient, port, [sign(TOPIC), sign(FILL_TOPIC)])
        try:
            with_slow = await run_phase("slow", pool, port, pid, publish, sign, slow=slow, **options)  # type: ignore[arg-type]
            passed += await asyncio.to_thread(replayed, port) > before
        finally:
            slow.close()
        report(format_phase(with_slow, i))
        pairs.append((alone, with_slow))
    return pairs, passed


def format_phase(p: Phase, round_no: int) -> str:
    closed = f"  closed {p.closed}" if p.closed else ""
    return (f"round {round_no} {p.name:<6} p50 {p.p50_ms:6.2f} ms  p99 {p.p99_ms:6.2f} ms  max {p.max_ms:6.1f} ms  "
            f"({p.samples} deliveries)  server {p.cpu_us:4.1f} us CPU/delivery, RSS {p.rss_mib:6.1f} MiB{closed}")


async def measure(ctx: report.Context) -> tuple[list[tuple[Phase, Phase]], int]:
    """The rounds of phases on one `livepush serve` on the harness' Redis."""
    from _servers import start_livepush_cli
    from _services import free_port, redis_fanout_available

    from livepush import topics
    from livepush.config import Settings
    from livepush.fanout import from_env

    why = redis_fanout_available()
    if why:
        raise RuntimeError(f"the Redis fan-out is not available: {why}")
    secret = secrets.token_urlsafe(48)
    pool = ClientPool(2)
    server = fanout = None
    try:
        env = {k: v for k, v in os.environ.items() if not k.startswith("LIVEPUSH_") and k != "DATABASE_URL"}
        env.update(LIVEPUSH_SECRET=secret, LIVEPUSH_FANOUT="redis", LIVEPUSH_REDIS_URL=ctx.redis_url)
        server = await asyncio.to_thread(start_livepush_cli, free_port(), env, os.path.join(ctx.workdir, "slow.log"))
        fanout = from_env(Settings(secret=secret, fanout="redis", redis_url=ctx.redis_url))
        await pool.start()
        quick = ctx.quick
        return await run_rounds(
            pool, server.port, server.proc.pid, fanout.apublish, lambda t: topics.sign(t, [secret]),
            rounds=1 if quick else 2, subscribers=500 if quick else 1000, rate=20.0, seconds=2.0 if quick else 5.0,
            warmup=1.0, report=report.note)
    finally:
        await pool.close()
        if fanout is not None:
            await fanout.aclose()
        if server is not None:
            await server.stop()


def figures(ctx: report.Context) -> list[report.Figure]:
    """Each phase figure beside the slow client against the same without it."""
    import uvloop  # a dependency of livepush wherever `livepush serve` runs

    raise_fd_limit()
    pairs, passed = uvloop.run(measure(ctx))
    report.note(f"  the slow client's share of a topic passed its bound in {passed} of {len(pairs)} round(s)")
    rounds = report.Rounds()
    for alone, slow in pairs:
        for system, phase in (("alone", alone), ("slow", slow)):
            rounds.add(system, {"p50": phase.p50_ms, "p99": phase.p99_ms, "cpu": phase.cpu_us, "rss": phase.rss_mib})
    base = "the same subscribers alone"
    return [report.Figure(label, rounds.median("slow", key) or 0.0, unit, base, rounds.median("alone", key),
                          higher_is_better=False)
            for label, key, unit in (("delivery p50 beside a client that never reads", "p50", "ms"),
                                     ("delivery p99 beside a client that never reads", "p99", "ms"),
                                     ("server CPU per delivery beside a client that never reads", "cpu", "us"),
                                     ("server memory beside a client that never reads", "rss", "MiB"))]
