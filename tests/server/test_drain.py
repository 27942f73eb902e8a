"""Paced drain on SIGTERM (`livepush serve --drain-seconds S`, docs/reference.md#3-commands): the
schedule as a pure function, the setting, and real `livepush serve` processes being stopped."""

from __future__ import annotations

import asyncio
import http.client
import re
import signal
import time

import pytest
from websockets.exceptions import InvalidStatus

from livepush.config import MAX_DRAIN_SECONDS, Settings
from livepush.errors import ConfigError
from livepush.server import drain
from tests.server.conftest import make_settings, start_served
from tests.support.stamped import StampedWS
from tests.support.waiting import async_wait_for
from tests.support.wsclient import WSClient

RETRY = re.compile(r"^retry=(\d+)$")


def retry_of(reason: str) -> int:
    match = RETRY.match(reason)
    assert match, f"close reason {reason!r} is not retry=MS"
    return int(match.group(1))


async def open_clients(url: str, count: int) -> list[WSClient]:
    return list(await asyncio.gather(*(WSClient.open(url) for _ in range(count))))


async def closes(clients: list[WSClient], timeout: float) -> list[tuple[float, int | None, str]]:
    """(monotonic time, code, reason) of each client's close, in the clients' order."""

    async def one(client: WSClient) -> tuple[float, int | None, str]:
        frame = await client.close_frame(timeout)
        return time.monotonic(), (frame.code if frame else None), (frame.reason if frame else "")

    return list(await asyncio.gather(*(one(c) for c in clients)))


async def first_close(clients: list[WSClient], timeout: float) -> None:
    """Until any of `clients` is closed (fails after `timeout` s)."""
    waits = [asyncio.ensure_future(c.ws.wait_closed()) for c in clients]
    done, pending = await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED, timeout=timeout)
    for wait in pending:
        wait.cancel()
    assert done, f"no connection was closed within {timeout:g} s"


def http_status(port: int, path: str) -> int:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    try:
        conn.request("GET", path)
        return conn.getresponse().status
    finally:
        conn.close()


async def refused_status(url: str) -> tuple[int, str | None]:
    """The HTTP status and Retry-After a new WebSocket upgrade gets (fails if it is accepted)."""
    with pytest.raises(InvalidStatus) as refused:
        client = await WSClient.open(url)
        await client.close()
    response = refused.value.response
    return response.status_code, response.headers.get("Retry-After")


# ---- the schedule ---------------------------------------------------------------------------


def test_schedule_spreads_batches_every_100ms_over_the_drain_with_fair_sizes() -> None:
    """50 connections over 2 s: 20 batches 100 ms apart, the first at once, sizes 2 or 3, all closed."""
    batches = drain.schedule(50, 2.0)
    assert [round(b.at, 6) for b in batches] == [round(i * 0.1, 6) for i in range(20)]
    assert sum(b.size for b in batches) == 50
    assert {b.size for b in batches} == {2, 3}


def test_schedule_with_few_connections_spreads_one_per_batch_over_the_drain() -> None:
    """Fewer connections than 100 ms slots: one per batch, still spread over the whole drain."""
    assert drain.schedule(4, 2.0) == [drain.Batch(0.0, 1), drain.Batch(0.5, 1), drain.Batch(1.0, 1), drain.Batch(1.5, 1)]
    assert drain.schedule(1, 30.0) == [drain.Batch(0.0, 1)]
    assert len(drain.schedule(10, 0.3)) == 3  # 0.3 / 0.1 is 2.999…: still 3 batches


def test_schedule_without_a_drain_or_without_connections() -> None:
    """Zero seconds: one batch of everything at once; no connections: no batch."""
    assert drain.schedule(1000, 0) == [drain.Batch(0.0, 1000)]
    assert drain.schedule(0, 2.0) == []


def test_retry_delays_are_uniform_over_the_documented_window() -> None:
    """retry=MS is drawn from 500 ms to 1000 × max(S, 1) ms, and reads as retry=<integer>."""
    assert drain.retry_ms(2.0, lambda: 0.0) == 500
    assert drain.retry_ms(2.0, lambda: 0.999999) == 1999
    assert drain.retry_ms(0.2, lambda: 0.999999) == 999  # a short drain still spreads over a second
    assert drain.retry_ms(MAX_DRAIN_SECONDS, lambda: 0.999999) < 300_000  # the JS client's cap
    draws = [drain.retry_ms(2.0) for _ in range(2000)]
    assert min(draws) >= 500 and max(draws) <= 2000
    assert min(draws) < 600 and max(draws) > 1900
    assert retry_of(drain.reason(1234)) == 1234


class Recorded:
    """A connection as close_paced() sees it, noting when it was closed."""

    def __init__(self, closes: list[float]) -> None:
        self.closing = False
        self._closes = closes

    def close(self, code: int, reason: str) -> None:
        self.closing = True
        self._closes.append(asyncio.get_running_loop().time())


async def test_a_drain_that_falls_behind_spreads_the_rest_instead_of_catching_up_at_once() -> None:
    """The loop is blocked for 0.35 s right after the first batch (a busy server): the batches it
    missed are not closed in one burst; the rest is spread over the time left, and the drain
    still ends within its 2 s."""
    closes: list[float] = []
    clients = [Recorded(closes) for _ in range(50)]
    loop = asyncio.get_running_loop()
    began = loop.time()
    loop.call_soon(time.sleep, 0.35)
    assert await drain.close_paced(lambda: clients, 2.0) == 50
    assert len(closes) == 50 and all(c.closing for c in clients)
    busiest = max(sum(1 for t in closes if at <= t < at + 0.05) for at in closes)
    assert busiest <= 3, f"{busiest} closes within 50 ms: {[round(t - began, 3) for t in closes]}"
    assert closes[-1] - began <= 2.0 + 0.1


# ---- the setting ----------------------------------------------------------------------------


@pytest.mark.parametrize("value", ["soon", "-1", "301", "nan", "inf"])
def test_a_bad_drain_setting_names_it(value: str) -> None:
    """LIVEPUSH_DRAIN_SECONDS that is not a number from 0 to 300 is a ConfigError naming it."""
    with pytest.raises(ConfigError, match="LIVEPUSH_DRAIN_SECONDS"):
        Settings.from_env({"LIVEPUSH_DRAIN_SECONDS": value})


def test_the_drain_setting_defaults_to_0_and_the_flag_overrides_the_variable() -> None:
    """Unset: 0 (close at once); the variable sets it; --drain-seconds overrides it, validated too."""
    assert Settings.from_env({}).drain_seconds == 0
    settings = Settings.from_env({"LIVEPUSH_DRAIN_SECONDS": "12.5"})
    assert settings.drain_seconds == 12.5
    assert settings.replace(drain_seconds=3.0).drain_seconds == 3.0
    with pytest.raises(ConfigError, match="^LIVEPUSH_DRAIN_SECONDS=-2 is out of range"):
        settings.replace(drain_seconds=-2.0)
    serve = Settings.from_env({"LIVEPUSH_DRAIN_SECONDS": "12.5"}, flags={"drain_seconds": "--drain-seconds"})
    with pytest.raises(ConfigError, match="^--drain-seconds -2 is out of range"):
        serve.replace(drain_seconds=-2.0)


def test_serve_with_a_bad_drain_flag_exits_2_with_one_line(procs, livepush_env) -> None:
    """`serve --drain-seconds -5` ends at once with status 2 and one line naming the flag as typed."""
    child = procs.livepush("serve", "--drain-seconds", "-5", env=livepush_env(), wait_healthy=False)
    assert child.wait(15) == 2
    lines = child.stderr().strip().splitlines()
    assert len(lines) == 1 and "--drain-seconds -5 is out of range" in lines[0], lines
    assert "Traceback" not in child.stderr(), lines


# ---- in process -----------------------------------------------------------------------------


async def test_draining_is_visible_and_refuses_new_websockets_while_it_lasts(secret: str) -> None:
    """From the start of a drain `server.draining` is true and a new upgrade gets 503 with
    Retry-After, while open connections are still being closed one batch at a time."""
    served = await start_served(make_settings("local", secret, None, None, drain_seconds=1.0))
    try:
        clients = await open_clients(served.url, 5)
        assert served.server.draining is False
        draining = asyncio.create_task(served.server.close_connections(1.0))
        await async_wait_for(lambda: served.server.draining, 2, message="the drain to begin")
        # Counted now, before any round trip: the drain (on this loop) has closed its first batch
        # and sleeps until the next. Counted after the two requests below, a loaded machine could
        # let the pacing close all but one meanwhile and fail a drain that paced.
        not_closing = sum(1 for c in served.server.clients if not c.closing)
        assert not_closing == 4, f"the drain did not pace its closes: {not_closing} of 5 left after the first batch"
        assert await refused_status(served.url) == (503, "1")
        assert await asyncio.to_thread(http_status, served.server.port, "/healthz") == 200  # probes still answered
        seen = await closes(clients, timeout=5)
        await asyncio.wait_for(draining, 5)
        assert {code for _, code, _ in seen} == {1001}
        assert all(500 <= retry_of(reason) <= 1000 for _, _, reason in seen)
    finally:
        await served.stop()


async def test_retry_after_during_a_drain_is_the_time_left_not_the_whole_drain(secret: str) -> None:
    """An upgrade refused late in a drain is told to come back when the drain ends (the seconds
    left, rounded up), not after the whole drain again."""
    served = await start_served(make_settings("local", secret, None, None, drain_seconds=3.0))
    try:
        clients = await open_clients(served.url, 10)
        draining = asyncio.create_task(served.server.close_connections(3.0))
        await async_wait_for(lambda: served.server.draining, 2, message="the drain to begin")
        assert await refused_status(served.url) == (503, "3")
        # Ten closes paced over 3 s: the sixth goes 1.5 s in, when at most 1.5 s are left.
        await async_wait_for(lambda: len(served.server.clients) <= 4, 5, message="six closes")
        status, retry_after = await refused_status(served.url)
        assert status == 503 and retry_after in ("1", "2")
        await closes(clients, timeout=5)
        await asyncio.wait_for(draining, 5)
    finally:
        await served.stop()


# ---- `livepush serve` -----------------------------------------------------------------------


async def test_sigterm_with_drain_seconds_2_paces_50_closes_over_2_seconds(procs, livepush_env) -> None:
    """--drain-seconds 2, 50 clients, SIGTERM: new upgrades are refused at once, the closes come
    spread over about 2 s, each 1001 with retry=MS from 500 to 2000 ms (spread too), and the
    process exits 0 soon after. The times are when the server sent each close (the kernel's
    receive time on loopback), not when this test read it."""
    env = livepush_env()
    child = await procs.alivepush("serve", "--drain-seconds", "2", env=env)
    port = int(env["LIVEPUSH_PORT"])
    clients = list(await asyncio.gather(*(StampedWS.open("127.0.0.1", port) for _ in range(50))))
    started, started_wall = time.monotonic(), time.time()
    child.signal(signal.SIGTERM)
    done, _ = await asyncio.wait([c.closed for c in clients], timeout=5, return_when=asyncio.FIRST_COMPLETED)
    assert done, "no connection was closed within 5 s of SIGTERM"
    assert await refused_status(f"ws://127.0.0.1:{port}/") == (503, "2")
    still_open = sum(1 for c in clients if c.is_open)
    assert still_open >= 25, f"only {still_open} of 50 connections still open right after the first close"

    seen = await asyncio.wait_for(asyncio.gather(*(c.closed for c in clients)), 10)
    status = await child.await_exit(5)
    stopped = time.monotonic() - started
    assert all(seen), f"{seen.count(None)} connections ended without a close frame"
    times = sorted(close.at - started_wall for close in seen if close)
    report = {"first_s": times[0], "last_s": times[-1], "stopped_s": stopped,
              "in_first_100ms": sum(1 for t in times if t - times[0] < 0.1)}
    assert status == 0, child.output()
    assert [close.code for close in seen if close] == [1001] * 50
    retries = [retry_of(close.reason) for close in seen if close]
    assert all(500 <= ms <= 2000 for ms in retries), retries
    assert max(retries) - min(retries) >= 750, f"retry delays not spread: {sorted(retries)}"
    assert report["in_first_100ms"] <= 10, report
    assert 1.5 <= times[-1] - times[0] <= 2.5, report
    assert stopped < 2 + 3, report
    assert "Traceback" not in child.stderr()


async def test_sigterm_without_drain_closes_everything_at_once_with_1001(procs, livepush_env) -> None:
    """The default (0): SIGTERM closes all 50 connections at once with 1001 and no retry reason,
    as before (times: when the server sent each close)."""
    env = livepush_env()
    child = await procs.alivepush("serve", env=env)
    clients = list(await asyncio.gather(*(StampedWS.open("127.0.0.1", int(env["LIVEPUSH_PORT"])) for _ in range(50))))
    started = time.time()
    child.signal(signal.SIGTERM)
    seen = await asyncio.wait_for(asyncio.gather(*(c.closed for c in clients)), 5)
    assert await child.await_exit(5) == 0, child.output()
    assert all(seen), f"{seen.count(None)} connections ended without a close frame"
    times = sorted(close.at for close in seen if close)
    assert [close.code for close in seen if close] == [1001] * 50
    assert {close.reason for close in seen if close} == {""}
    assert times[-1] - times[0] < 0.5 and times[-1] - started < 2.0, (times[0] - started, times[-1] - started)


async def test_a_second_signal_ends_a_long_drain_at_once(procs, livepush_env) -> None:
    """--drain-seconds 60: a second SIGTERM closes the rest with 1001 at once, and the process exits 0."""
    env = livepush_env()
    child = await procs.alivepush("serve", "--drain-seconds", "60", env=env)
    clients = await open_clients(f"ws://127.0.0.1:{env['LIVEPUSH_PORT']}/", 10)
    watching = asyncio.create_task(closes(clients, timeout=10))
    child.signal(signal.SIGTERM)
    await first_close(clients, 5)  # one every 6 s: the drain is under way
    started = time.monotonic()
    child.signal(signal.SIGTERM)
    seen = await watching
    assert await child.await_exit(5) == 0, child.output()
    assert [code for _, code, _ in seen] == [1001] * 10
    assert max(t for t, _, _ in seen) - started < 2.0


async def test_drain_beside_a_job_runtime_stays_bounded(procs, livepush_env, pg_url) -> None:
    """serve --with-jobs --drain-seconds 1 with a 3 s job in hand: the connection closes with a
    retry reason within the drain, the runtime finishes its job as before, and the process exits
    0 within the longer of the two plus a margin."""
    from tests.support.slow_jobs import started_slow_job

    env = livepush_env(database_url=pg_url, drain_seconds=1)
    child = await procs.alivepush("serve", "--with-jobs", "tests.support.slow_jobs", env=env)
    state = await started_slow_job(pg_url, 3.0)
    client = await WSClient.open(f"ws://127.0.0.1:{env['LIVEPUSH_PORT']}/")
    started = time.monotonic()
    child.signal(signal.SIGTERM)
    frame = await client.close_frame(timeout=5)
    assert frame is not None and frame.code == 1001 and 500 <= retry_of(frame.reason) <= 1000
    assert time.monotonic() - started < 1.5
    assert await child.await_exit(15) == 0, child.output()
    assert time.monotonic() - started < 3.0 + 1.0 + 3.0
    assert state() == "succeeded"
