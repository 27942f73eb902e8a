"""The servers' LISTEN backend killed again and again while messages are published: each loss
shows on /healthz and heals by itself, and connected clients miss nothing (docs/reference.md §5
HTTP routes, §7)."""

from __future__ import annotations

import asyncio
import logging

import psycopg
import pytest

from livepush.fanout.postgres import PostgresFanOut
from tests.faults.clients import ResumingClient
from tests.faults.fleet import JOB_MODULE, Fleet, Server
from tests.faults.traffic import Traffic
from tests.jobs.conftest import q
from tests.support import services
from tests.support.waiting import async_wait_for

TOPICS = ["room:a", "room:b", "room:c"]
# The application_name of a server's one LISTEN connection (livepush/postgres/listener.py).
LISTENER_APP_NAME = "livepush-listener"
KILLS = 10
# Publishes that must return between one recovery and the next kill.
LOAD_BETWEEN = 20
# Seconds within which a server notices the loss and listens again (first reconnect delay: 0.05-0.15 s).
RECOVERY_BOUND = 10.0
# Seconds within which a message published once the listener is back reaches a client.
DELIVER_BOUND = 3.0
# What a server says once its listener is back after a loss.
BACK = "the Postgres listener is back after"


async def test_killing_the_listener_backend_again_and_again_turns_healthz_503_then_200_and_loses_no_message(
    fleet: Fleet, pg_admin_url: str
) -> None:
    """pg_terminate_backend on every server's LISTEN backend (found in pg_stat_activity by its
    application_name), 10 times while publishing: each time every server answers 503 and then
    200 again, no server exits, and every published message reaches every client, in order,
    once, without a reset (the log held everything) or a reconnect."""
    servers = await fleet.serve(2)
    dbname = services.dbname_of(fleet.url)
    traffic = await Traffic.start(fleet, servers, PostgresFanOut(fleet.url), TOPICS)
    loop = asyncio.get_running_loop()
    recoveries = []
    try:
        for kill in range(1, KILLS + 1):
            await traffic.reaches(LOAD_BETWEEN * kill)
            mark = traffic.watch.mark()
            killed_at = loop.time()
            killed = await asyncio.to_thread(services.pg_terminate, pg_admin_url, dbname, LISTENER_APP_NAME)
            assert killed == len(servers), f"kill {kill}: {killed} LISTEN backends, not one per server"
            await async_wait_for(lambda: traffic.watch.dipped_and_back(mark), RECOVERY_BOUND,
                                 message=f"kill {kill}: every server to answer 503 and then 200")
            recoveries.append(round(loop.time() - killed_at, 2))
            assert fleet.still_running() == [], f"kill {kill}: a server exited"
    finally:
        await traffic.stop()

    report = await traffic.delivered()
    assert traffic.resets() == [0] * len(traffic.clients), (
        f"the log held every message: no reset is due\n{report}\n{fleet.server_log('reset', 'history')}")
    await traffic.ends_cleanly(fleet)
    print(f"\n{KILLS} listener kills: every server back to 200 after {recoveries} s; {traffic.summary()}")


async def test_a_part_slow_to_read_what_it_missed_after_a_listener_loss_holds_up_no_other(
    fleet: Fleet, pg_admin_url: str
) -> None:
    """`serve --with-jobs`: the server and the runtime beside it share one listener. After it is
    lost and back, each part reads what it missed; while one part's read waits (here the groups
    table is locked, as a migration or a slow database would hold it), the other parts hear
    their notifications all the same: a message published after the loss reaches a subscribed
    client within seconds, not once that read is done."""
    env = fleet.env()
    child = fleet.procs.livepush("serve", "--with-jobs", JOB_MODULE, env=env, wait_healthy=False)
    await child.await_healthy()
    fleet.servers.append(Server(child, int(env["LIVEPUSH_PORT"])))
    client = await ResumingClient.open(fleet.servers[0].url, {"room:a": fleet.sign("room:a")})
    fanout = PostgresFanOut(fleet.url)
    loop = asyncio.get_running_loop()
    try:
        with psycopg.connect(fleet.url) as holder:  # the lock is held until this transaction ends
            holder.execute("LOCK TABLE livepush_groups IN ACCESS EXCLUSIVE MODE")
            killed = await asyncio.to_thread(services.pg_terminate, pg_admin_url, services.dbname_of(fleet.url),
                                             LISTENER_APP_NAME)
            assert killed == 1, f"{killed} LISTEN backends, not the one the server and its runtime share"
            listening = ("SELECT count(*) FROM pg_stat_activity WHERE application_name = %s "
                         "AND datname = current_database()")
            await async_wait_for(lambda: asyncio.to_thread(lambda: q(fleet.url, listening, (LISTENER_APP_NAME,))
                                                           == [(1,)]), RECOVERY_BOUND,
                                 message="the shared listener to connect again")
            listened = listening + " AND state = 'idle' AND query ILIKE 'LISTEN %%'"
            await async_wait_for(lambda: asyncio.to_thread(lambda: q(fleet.url, listened, (LISTENER_APP_NAME,))
                                                           == [(1,)]), RECOVERY_BOUND,
                                 message="the shared listener to LISTEN again")
            back_at = loop.time()
            sent: list[str] = []
            while not set(sent) & {o for kind, o in client.events["room:a"] if kind == "message"}:
                assert loop.time() - back_at < DELIVER_BOUND, (
                    f"no message published since the listener was back arrived within {DELIVER_BOUND:g} s "
                    f"({len(sent)} published)\n{fleet.server_log()}")
                sent.append(await fanout.apublish("room:a", {"n": len(sent)}))
                await asyncio.sleep(0.1)
            holder.rollback()
    finally:
        await client.close()
        await fanout.aclose()
    assert fleet.still_running() == []


async def test_killing_every_backend_of_a_server_logs_livepushs_own_lines_and_none_of_psycopgs(
        fleet: Fleet, pg_admin_url: str, caplog: pytest.LogCaptureFixture) -> None:
    """pg_terminate_backend on every backend of the database (the listener and every pooled
    connection of the server and of this publishing process, as a failover's connection reset or
    an operator's purge does), while Postgres stays up: the server says so in its own words (the
    listener lost, then back) and replaces its pooled connections without a WARNING of psycopg's
    naming a connection object, one per pooled connection, and so do the publisher's sync and
    async pools; a subscribed client gets the next messages with no reset."""
    caplog.set_level(logging.WARNING, logger="psycopg")
    (server,) = await fleet.serve(1)
    client = await ResumingClient.open(server.url, {t: fleet.sign(t) for t in TOPICS})
    fanout = PostgresFanOut(fleet.url)
    try:
        for round_ in range(3):
            sent = [await fanout.apublish(t, {"round": round_}) for t in TOPICS[:-1]]
            sent.append(await asyncio.to_thread(fanout.publish, TOPICS[-1], {"round": round_}))
            await async_wait_for(lambda: [client.offsets[t] for t in TOPICS] == sent, DELIVER_BOUND,
                                 message=f"round {round_}: every topic's message")
            killed = await asyncio.to_thread(services.pg_terminate, pg_admin_url, services.dbname_of(fleet.url))
            assert killed >= 2, f"round {round_}: {killed} backends: the listener and the server's pool at least"
            # /healthz answers 200 until the server's loop has read of the loss: wait for this
            # round's line that the listener is back, which the next round's deliveries need.
            await async_wait_for(lambda: len(fleet.server_log(BACK).splitlines()) > round_, RECOVERY_BOUND,
                                 message=f"round {round_}: the listener to be back")
            await server.child.await_healthy(RECOVERY_BOUND)
        sent = [await fanout.apublish(t, {"round": "last"}) for t in TOPICS]
        await async_wait_for(lambda: [client.offsets[t] for t in TOPICS] == sent, DELIVER_BOUND,
                             message="the last round's messages")
        assert client.resets() == 0 and client.reconnects == 0 and not client.not_newer, fleet.server_log()
    finally:
        await client.close()
        await fanout.aclose()
    assert fleet.server_log("lost the Postgres listener"), fleet.server_log()
    assert not fleet.server_log("psycopg", "Traceback"), fleet.server_log()
    assert [r.getMessage() for r in caplog.records if r.name.startswith("psycopg")] == []
    assert list(fleet.stop_all().values()) == [0]


async def test_a_listener_is_not_ended_by_an_idle_session_timeout_shorter_than_its_ping(
        pg_url: str, caplog: pytest.LogCaptureFixture) -> None:
    """An idle_session_timeout set on the database or role (to reap forgotten sessions) shorter
    than the listener's 5 s ping ended its LISTEN connection again and again, two WARNINGs and a
    catch-up each time. The listener waits idle by design: it keeps its one connection, and a
    notification sent after several such timeouts reaches it on that same connection."""
    from livepush.postgres.listener import Listener

    dbname = services.dbname_of(pg_url)
    with psycopg.connect(pg_url, autocommit=True) as admin:
        admin.execute(psycopg.sql.SQL("ALTER DATABASE {} SET idle_session_timeout = '200ms'").format(
            psycopg.sql.Identifier(dbname)))
    heard: list[str] = []
    listener = Listener(pg_url, name="livepush-idle-test")
    listener.add("livepush_idle_test", heard.append)

    async def listening_pids() -> list[int]:
        async with await psycopg.AsyncConnection.connect(pg_url, autocommit=True) as conn:
            rows = await (await conn.execute(
                "SELECT pid FROM pg_stat_activity WHERE application_name = 'livepush-idle-test'")).fetchall()
        return [row[0] for row in rows]

    await listener.start()
    try:
        before = await listening_pids()
        # Idle for five timeouts' length: what is checked is that nothing happens meanwhile.
        await asyncio.sleep(1.0)
        async with await psycopg.AsyncConnection.connect(pg_url, autocommit=True) as conn:
            await conn.execute("NOTIFY livepush_idle_test, 'after the timeouts'")
        await async_wait_for(lambda: heard == ["after the timeouts"], 5, message="the notification to be heard")
        assert await listening_pids() == before and len(before) == 1, before
        lost = [r.getMessage() for r in caplog.records if "lost the Postgres listener" in r.getMessage()]
        assert lost == [], lost
    finally:
        await listener.aclose()
