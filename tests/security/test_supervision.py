"""Supervised background tasks: a listener or runtime task that dies of anything unexpected is
logged with its traceback, marks the process not listening meanwhile, and is restarted; a part
that keeps failing stops its process with a non-zero status, never silently with 0."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

import psycopg
import pytest

from livepush.postgres.listener import Listener
from livepush.tasks import GaveUp, supervise
from tests.server.conftest import make_settings, start_served
from tests.support.procs import Processes
from tests.support.waiting import async_wait_for
from tests.support.wsclient import WSClient


async def test_a_handler_that_raises_costs_only_its_notification(pg_url: str, caplog: pytest.LogCaptureFixture) -> None:
    """A channel handler that raises is logged with its traceback; the next notification reaches every handler."""
    listener = Listener(pg_url)
    got: list[str] = []

    def picky(payload: str) -> None:
        if payload == "boom":
            raise ValueError("a handler bug")
        got.append(payload)

    listener.add("livepush_probe", picky)
    await listener.start()
    try:
        with psycopg.connect(pg_url, autocommit=True) as conn:
            for payload in ("boom", "after"):
                conn.execute("SELECT pg_notify('livepush_probe', %s)", (payload,))
        await async_wait_for(lambda: got == ["after"], 5, message="the notification after the failing one")
        assert any(r.exc_info and "a handler bug" in str(r.exc_info[1]) for r in caplog.records)
        assert listener.listening
    finally:
        await listener.aclose()


async def test_an_unexpected_error_in_the_listener_reconnects_and_resyncs(pg_url: str, secret: str,
                                                                          caplog: pytest.LogCaptureFixture) -> None:
    """A bug inside the server's listener loop is logged with its traceback, /healthz turns 503 meanwhile, and the server listens again and delivers what was published."""
    served = await start_served(make_settings("postgres", secret, pg_url, None))
    try:
        listener = served.parts.listener
        assert listener is not None
        real, reconnect = listener._dispatch, listener._reconnect
        while_away: list[bool] = []

        def once(channel: str, payload: str) -> None:
            listener._dispatch = real
            raise RuntimeError("a bug in the loop itself")

        async def watched() -> Any:
            while_away.append(served.server.listening)  # what /healthz answers during the outage
            return await reconnect()

        listener._reconnect = watched

        client = await WSClient.open(served.url)
        await client.subscribe(served.sign("room:sup"))
        listener._dispatch = once
        lost = await served.publish("room:sup", {"n": 1})  # its doorbell trips the bug
        await async_wait_for(lambda: any("failed unexpectedly" in r.getMessage() and r.exc_info for r in caplog.records),
                             5, message="the listener's error to be logged")
        (m,) = await client.messages(1, timeout=10)  # read from history after the reconnect
        assert m["offset"] == lost
        await async_wait_for(lambda: served.server.listening, 10, message="the listener to be back")
        assert while_away == [False]
        await client.close()
    finally:
        await served.stop()


async def test_a_supervised_task_is_restarted_then_given_up_on(caplog: pytest.LogCaptureFixture) -> None:
    """A task that raises is logged with its traceback and run again after a backoff; one that keeps failing ends with GaveUp."""
    caplog.set_level(logging.ERROR)
    runs = 0

    async def flaky() -> None:
        nonlocal runs
        runs += 1
        if runs < 3:
            raise RuntimeError(f"failure {runs}")

    await asyncio.wait_for(supervise("t-flaky", flaky, backoff=(0.01, 0.02)), 5)
    assert runs == 3 and sum(1 for r in caplog.records if r.exc_info) == 2

    async def broken() -> None:
        raise RuntimeError("always")

    with pytest.raises(GaveUp):
        await asyncio.wait_for(supervise("t-broken", broken, backoff=(0.01, 0.02), give_up=4), 5)


async def test_serve_with_jobs_exits_non_zero_when_its_runtime_fails_for_good(
    pg_url: str, livepush_env: Callable[..., dict[str, str]], procs: Processes
) -> None:
    """`serve --with-jobs` whose runtime part keeps failing closes its connections and exits 1, saying why in one line."""
    child = await procs.alivepush("serve", "--with-jobs", "tests.security.failing_runtime",
                                  env=livepush_env(database_url=pg_url))
    code = await child.await_exit(30)
    assert code == 1, child.output()
    assert "the job runtime stopped" in child.stderr() and "a bug in the promoter" in child.stderr()


