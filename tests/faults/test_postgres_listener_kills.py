"""The servers' LISTEN backend killed again and again while messages are published: each loss
shows on /healthz and heals by itself, and connected clients miss nothing (docs/reference.md §5
HTTP routes, §7)."""

from __future__ import annotations

import asyncio

from livepush.fanout.postgres import PostgresFanOut
from tests.faults.fleet import Fleet
from tests.faults.traffic import Traffic
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
