"""A connection storm against one `livepush serve` process (docs/reference.md §5, §8): 2,000
WebSocket connections opened at once, as after a deploy or a network blip when every browser
reconnects. Each gets `hello` (or, past LIVEPUSH_MAX_CONNECTIONS, a clean HTTP 503), the server
stays healthy, a message published afterwards reaches every one of them, and the server's memory
grows by a bounded amount per connection."""

from __future__ import annotations

import asyncio
import json
import resource
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import InvalidStatus

import livepush
from livepush import topics
from tests.support.procs import ChildProcess, Processes
from tests.support.settings import jobs_settings

STORM = 2_000
# Bounds the whole storm: every handshake, hello included, must be done by then.
OPEN_TIMEOUT = 30.0
RECV_TIMEOUT = 10.0
HEALTHY_WITHIN = 1.0  # seconds: /healthz must answer 200 right after the storm, not eventually
# What one idle connection may add to the server's resident memory, subscribed to one topic:
# room for allocator noise over what one costs (the test prints it), but not for a compressor's
# state per connection (permessage-deflate is off: docs/architecture.md, Memory per connection)
# or a buffer kept per connection.
MAX_BYTES_PER_CONNECTION = 40 * 1024


def raise_fd_limit(needed: int) -> None:
    """Every client socket is a file descriptor of this process: lift the soft limit to the hard one."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    if hard < needed:
        pytest.skip(f"the hard limit on open files ({hard}) is below the {needed} this test needs")


def rss_bytes(pid: int) -> int:
    """The resident memory of process `pid` (VmRSS), in bytes."""
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmRSS for pid {pid}")


async def open_one(url: str) -> tuple[str, Any]:
    """One connection attempt: ("hello", (connection, frame)), ("http", status) when refused at the
    handshake, ("closed", code) when closed before hello, or ("error", text)."""
    try:
        ws = await connect(url, open_timeout=OPEN_TIMEOUT, max_size=None, close_timeout=1)
    except InvalidStatus as exc:
        return "http", exc.response.status_code
    except (OSError, TimeoutError) as exc:
        return "error", repr(exc)
    try:
        raw = await asyncio.wait_for(ws.recv(), RECV_TIMEOUT)
    except Exception as exc:  # closed before hello, or no hello in time: both are findings
        await ws.close()
        code = getattr(getattr(exc, "rcvd", None), "code", None)
        return ("closed", code) if code is not None else ("error", repr(exc))
    return "hello", (ws, json.loads(raw))


async def storm(url: str, count: int) -> tuple[list[ClientConnection], Counter[str], list[Any]]:
    """Open `count` connections at once: (the greeted ones, outcomes counted, anything odd)."""
    results = await asyncio.wait_for(asyncio.gather(*(open_one(url) for _ in range(count))), OPEN_TIMEOUT + 15)
    greeted = [value[0] for kind, value in results if kind == "hello"]
    outcomes = Counter(kind if kind != "http" else f"http {value}" for kind, value in results)
    odd = [(kind, value) for kind, value in results
           if kind in ("closed", "error") or kind == "hello" and value[1]["op"] != "hello"]
    return greeted, outcomes, odd


async def subscribe_all(clients: list[ClientConnection], signed: str) -> list[dict[str, Any]]:
    async def one(i: int, ws: ClientConnection) -> dict[str, Any]:
        await ws.send(json.dumps({"op": "subscribe", "topic": signed, "since": None, "ref": i}))
        return json.loads(await asyncio.wait_for(ws.recv(), RECV_TIMEOUT))

    return list(await asyncio.gather(*(one(i, ws) for i, ws in enumerate(clients))))


async def next_frames(clients: list[ClientConnection]) -> list[dict[str, Any]]:
    async def one(ws: ClientConnection) -> dict[str, Any]:
        return json.loads(await asyncio.wait_for(ws.recv(), RECV_TIMEOUT))

    return list(await asyncio.gather(*(one(ws) for ws in clients)))


async def close_all(clients: list[ClientConnection]) -> None:
    await asyncio.gather(*(ws.close() for ws in clients), return_exceptions=True)


def assert_clean_stderr(child: ChildProcess) -> None:
    err = child.stderr()
    assert "Traceback" not in err and " ERROR " not in err, child.output()


@pytest.fixture
def serve(procs: Processes, livepush_env: Callable[..., dict[str, str]], pg_url: str) -> Callable[..., Any]:
    """`await serve(**settings)`: a `livepush serve` child on the test's database (Postgres fan-out)."""

    async def start(**settings: object) -> ChildProcess:
        return await procs.alivepush("serve", env=livepush_env(database_url=pg_url, **settings))

    return start


async def test_two_thousand_connections_at_once_all_get_hello_and_the_next_message(
        serve: Callable[..., Any], pg_url: str, secret: str) -> None:
    """2,000 connections opened at once: every one gets hello, the server stays healthy, a message
    published afterwards reaches all of them, and its memory grows by a bounded amount each."""
    raise_fd_limit(STORM + 500)
    child = await serve()
    port = child.port
    assert port is not None
    url = f"ws://127.0.0.1:{port}/"
    signed = topics.sign("room:storm", [secret])
    before = rss_bytes(child.pid)

    started = time.monotonic()
    clients, outcomes, odd = await storm(url, STORM)
    opened_in = time.monotonic() - started
    try:
        assert outcomes == {"hello": STORM} and not odd, (outcomes, odd[:5])
        await child.await_healthy(HEALTHY_WITHIN)
        answers = await subscribe_all(clients, signed)
        assert Counter(a["op"] for a in answers) == {"subscribed": STORM}, Counter(a["op"] for a in answers)
        with jobs_settings(pg_url):
            offset = await livepush.apublish("room:storm", {"after": "the storm"})
        sent_at = time.monotonic()
        frames = await next_frames(clients)
        delivered_in = time.monotonic() - sent_at
        wrong = [f for f in frames if (f["op"], f.get("offset"), f.get("data")) != ("message", offset, {"after": "the storm"})]
        assert not wrong, (len(wrong), wrong[:3])
        during = rss_bytes(child.pid)
        per_connection = (during - before) / STORM
        await child.await_healthy(HEALTHY_WITHIN)
    finally:
        await close_all(clients)
    assert child.running, child.output()
    assert_clean_stderr(child)
    print(f"{STORM} connections opened in {opened_in:.2f} s, one message to all in {delivered_in * 1000:.0f} ms; "
          f"server RSS {before / 2**20:.1f} MiB before, {during / 2**20:.1f} MiB with {STORM} subscribed "
          f"connections: {per_connection / 1024:.1f} KiB each")
    assert per_connection <= MAX_BYTES_PER_CONNECTION, f"{per_connection / 1024:.1f} KiB per connection"


async def test_a_storm_past_the_cap_gets_hello_up_to_it_and_a_clean_503_after(
        serve: Callable[..., Any], pg_url: str, secret: str) -> None:
    """With LIVEPUSH_MAX_CONNECTIONS=1500, 2,000 connections at once: 1,500 get hello and 500 get
    HTTP 503, nothing else; the server stays healthy and the connected ones get the next message."""
    cap = 1_500
    raise_fd_limit(STORM + 500)
    child = await serve(max_connections=cap)
    port = child.port
    assert port is not None
    clients, outcomes, odd = await storm(f"ws://127.0.0.1:{port}/", STORM)
    try:
        assert outcomes == {"hello": cap, "http 503": STORM - cap} and not odd, (outcomes, odd[:5])
        await child.await_healthy(HEALTHY_WITHIN)
        answers = await subscribe_all(clients, topics.sign("room:capped", [secret]))
        assert Counter(a["op"] for a in answers) == {"subscribed": cap}
        with jobs_settings(pg_url):
            offset = await livepush.apublish("room:capped", {"n": 1})
        frames = await next_frames(clients)
        assert all((f["op"], f.get("offset")) == ("message", offset) for f in frames)
    finally:
        await close_all(clients)
    assert child.running, child.output()
    assert_clean_stderr(child)
