"""Redis restarted under load: servers on the Redis fan-out, job runtimes on PostgreSQL, WebSocket
clients, a publisher and an enqueuer, all running through the restart (docs/reference.md §7)."""

from __future__ import annotations

import pytest

from livepush.fanout.redis import RedisFanOut
from tests.faults.fleet import Fleet, redis_down
from tests.faults.traffic import Traffic
from tests.jobs import sample_jobs

TOPICS = ["room:a", "room:b", "room:c"]
# Seconds, after Redis answers again, within which every server is healthy: the subscriber's
# reconnect delay is capped at 1 s, drawn from 50-150 %, with room for a loaded machine.
HEALTH_BOUND = 10.0
# Seconds Redis stays down once every server and the publisher noticed: publishes fail meanwhile,
# and the reconnect delays grow.
OUTAGE = 1.0
# Publishes that must return before the restart, and again after it (enqueues: a quarter).
LOAD = 60


@pytest.mark.parametrize("hard", [False, True], ids=["sigterm", "sigkill"])
async def test_redis_restart_loses_no_job_and_no_message_for_connected_clients(fleet: Fleet, redis_url: str,
                                                                               hard: bool) -> None:
    """Redis stopped (SIGTERM, or SIGKILL as in a crash) and started again, empty: servers turn
    healthy again by themselves within a bound, jobs (on PostgreSQL) all succeed, and every
    message whose publish() returned an offset reaches every subscribed client in order, once,
    unless the client got `reset` for that topic: the restart lost Redis' history, so each
    client gets at most one per topic, and nothing else is missing."""
    servers = await fleet.serve(2, fanout="redis", redis_url=redis_url)
    await fleet.runtimes(2, "--concurrency", "8", fanout="redis", redis_url=redis_url)
    traffic = await Traffic.start(fleet, servers, RedisFanOut(redis_url), TOPICS, job=sample_jobs.record)
    recovery = await traffic.through(redis_down(hard=hard), hold=OUTAGE, bound=HEALTH_BOUND, load=LOAD,
                                     noticed=lambda: traffic.publisher.failures > 0)

    report = await traffic.delivered()
    assert all(c.resets(t) <= 1 for c in traffic.clients for t in TOPICS), (
        f"more than one reset per topic for one lost history:\n{report}\n{fleet.server_log('reset', 'history')}")

    assert "Traceback" not in fleet.server_log(), fleet.server_log()
    await traffic.ends_cleanly(fleet)
    print(f"\nRedis {'SIGKILL' if hard else 'SIGTERM'} restart: down {recovery.down} s; servers at 200 "
          f"{recovery.healthy_after} s after; {traffic.summary()}")
