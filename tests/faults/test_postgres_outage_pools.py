"""livepush's connection pools through a Postgres outage (docs/operations.md, Deploys and
restarts): calls made while it is down wait for it or fail with livepush's error, and the pools
connect again within about a second of its return, as the listeners do."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import psycopg
import pytest
from psycopg_pool import PoolTimeout

import livepush
from livepush.fanout.postgres import PostgresFanOut
from livepush.postgres.connect import translate
from livepush.postgres import pools as pools_module
from livepush.postgres.pools import LoopPools
from tests.faults.fleet import postgres_down
from tests.support import services

# Seconds Postgres stays down while calls wait: psycopg_pool alone tries again after 1, 2, 4, 8 s,
# so its next attempt after this outage would come about 7 s after Postgres is back.
OUTAGE = 8.0
# Seconds after Postgres accepts connections again within which a waiting call goes through.
BACK_WITHIN = 3.0


async def test_publishes_waiting_when_postgres_returns_go_through_within_seconds(
        pg_url: str, caplog: pytest.LogCaptureFixture) -> None:
    """publish() and apublish() made while Postgres is down, still waiting for their pools when
    it comes back, return their offsets within a few seconds of its return (the pools retry at
    least every second), not when a doubling backoff next happens to try; and the attempts that
    fail meanwhile are logged once per pool, not once each."""
    caplog.set_level(logging.INFO)
    fanout = PostgresFanOut(pg_url)
    try:
        await fanout.apublish("outage:t", {"n": 0})
        await asyncio.to_thread(fanout.publish, "outage:t", {"n": 0})
        loop = asyncio.get_running_loop()
        async with postgres_down("fast"):
            waiting = [asyncio.create_task(fanout.apublish("outage:t", {"n": 1})),
                       asyncio.ensure_future(asyncio.to_thread(fanout.publish, "outage:t", {"n": 2}))]
            await asyncio.sleep(OUTAGE)
            assert not any(w.done() for w in waiting), [w.result() for w in waiting if w.done()]
        back = loop.time()
        done, _ = await asyncio.wait(waiting, timeout=BACK_WITHIN + 30)
        took = round(loop.time() - back, 2)
        assert len(done) == 2 and all(w.exception() is None for w in waiting), [
            w.exception() for w in done]
        assert took <= BACK_WITHIN, f"the waiting publishes went through only {took} s after Postgres was back"
        failed = [r.getMessage() for r in caplog.records if r.getMessage().startswith("the Postgres pool ")]
        assert 1 <= len(failed) <= 2, f"{len(failed)} lines for the pools' failed attempts: {failed[:4]}"
        assert not [r for r in caplog.records if r.getMessage().startswith("error connecting in")], (
            "psycopg_pool's own lines beside livepush's")
    finally:
        await fanout.aclose()


async def test_a_publish_on_a_callers_connection_the_server_closed_raises_dependency_error(
        pg_url: str, pg_admin_url: str) -> None:
    """publish(), publish_many(), apublish() and apublish_many() with conn= on a connection whose
    server side went away (a restart, a failover, a killed backend) raise livepush's
    DependencyError naming the database, as they do without conn=, not the driver's own error
    (which they raise for the caller's own transaction's errors, docs/reference.md §4)."""
    fanout = PostgresFanOut(pg_url)
    dbname = services.dbname_of(pg_url)
    try:
        for call in ("publish", "publish_many", "apublish", "apublish_many"):
            if call.startswith("a"):
                conn: Any = await psycopg.AsyncConnection.connect(pg_url)
            else:
                conn = await asyncio.to_thread(psycopg.connect, pg_url)
            try:
                assert await asyncio.to_thread(services.pg_terminate, pg_admin_url, dbname) >= 1
                args = [[("outage:t", {"n": 1})]] if call.endswith("many") else ["outage:t", {"n": 1}]
                with pytest.raises(livepush.DependencyError, match=rf"cannot reach Postgres at \S+:[0-9]+/{dbname}\b"):
                    if call.startswith("a"):
                        await getattr(fanout, call)(*args, conn=conn)
                    else:
                        await asyncio.to_thread(lambda: getattr(fanout, call)(*args, conn=conn))
            finally:
                await conn.close() if call.startswith("a") else conn.close()
    finally:
        await fanout.aclose()


async def test_a_pool_that_cannot_connect_says_why_in_livepushs_words_and_never_that_it_is_busy(
        pg_url: str, pg_admin_url: str, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    """A pool whose connection the server closed, while no new one can be made, has its callers'
    waits run out with the reason its attempts fail: psycopg_pool counts the connection it is
    replacing as held, and the wait was said as every connection of the pool staying busy (a
    lock to look for), on a database that was down. Those attempts are said once until one
    succeeds (however long that takes: here past the once-a-minute bound, shortened), in
    livepush's words, naming the database, not in a line of psycopg_pool's each."""
    monkeypatch.setattr(pools_module._ConnectFailures, "EVERY", 0.2)
    caplog.set_level(logging.INFO)
    dbname = services.dbname_of(pg_url)
    pools = LoopPools(pg_url, name="livepush-outage-test", max_size=1)
    try:
        pool = await pools.aget()
        with services.pg_refusing_connections(pg_admin_url, dbname):
            assert await asyncio.to_thread(services.pg_terminate, pg_admin_url, dbname) == 1
            with pytest.raises(PoolTimeout) as raised:
                async with pool.connection(timeout=2.5):
                    pass
        said = str(translate(pg_url, raised.value))
        assert "busy" not in said and "is not currently accepting connections" in said, said
        assert f"/{dbname}" in said, said
        lines = [r.getMessage() for r in caplog.records if r.name.startswith(("livepush", "psycopg"))]
        assert [line for line in lines if "livepush-outage-test" in line] == [
            f"the Postgres pool livepush-outage-test-async cannot connect, trying again about every 1 s (said once "
            f"until it connects): {translate(pg_url, pool.connect_failures.last or raised.value)}"], lines
    finally:
        await pools.aclose()


def test_a_pool_that_fails_again_within_the_minute_of_its_last_line_says_it_once_the_minute_is_out(
        caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    """Connections that come and go are said at most once a minute per pool; but a run of failures
    that began within that minute is still said, at its first attempt once the minute is out, not
    kept quiet for as long as it lasts (an hour of no connection slot, said by nothing else)."""
    monkeypatch.setattr(pools_module._ConnectFailures, "_said", {})
    caplog.set_level(logging.WARNING, logger="livepush.postgres.pools")
    refused = psycopg.OperationalError("connection refused")
    failures = pools_module._ConnectFailures("livepush-flapping-async", "postgresql://app@db.example:5432/app")

    def said() -> list[str]:
        return [r.getMessage() for r in caplog.records if "livepush-flapping-async" in r.getMessage()]

    failures.failed(refused)
    failures.connected()
    failures.failed(refused)  # a new run within the minute: quiet for now
    assert len(said()) == 1, said()
    failures._said["livepush-flapping-async"] -= failures.EVERY  # the minute is out
    failures.failed(refused)  # the same run's next attempt
    assert len(said()) == 2 and "cannot reach Postgres at db.example:5432/app" in said()[1], said()
    failures.failed(refused)
    assert len(said()) == 2, "said again within the same run"
