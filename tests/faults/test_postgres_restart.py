"""PostgreSQL restarted under load: servers on the Postgres fan-out, job runtimes, WebSocket
clients, a publisher and an enqueuer, all running through the restart (docs/reference.md §7)."""

from __future__ import annotations

import pytest

from livepush.fanout.postgres import PostgresFanOut
from tests.faults.fleet import Fleet, postgres_down
from tests.faults.traffic import Traffic
from tests.jobs import sample_jobs

TOPICS = ["room:a", "room:b", "room:c"]
# Seconds, after PostgreSQL accepts connections again, within which every server is healthy:
# the listener's reconnect delay is capped at 1 s, drawn from 50-150 %, with room for a loaded machine.
HEALTH_BOUND = 10.0
# Seconds PostgreSQL stays down once every server noticed, and the runtimes' heartbeat: the
# outage is longer than three beats.
OUTAGE, HEARTBEAT = 1.5, 0.3
# Publishes that must return before the restart, and again after it (enqueues: a quarter).
LOAD = 60


@pytest.mark.parametrize("mode", ["fast", "immediate"])
async def test_postgres_restart_loses_no_job_and_no_message_for_connected_clients(fleet: Fleet, mode: str) -> None:
    """PostgreSQL stopped (fast: clients disconnected; immediate: a crash) and started again:
    servers turn healthy again by themselves within a bound, every enqueued job succeeds, and
    every message whose publish() returned an offset reaches every subscribed client, in order,
    once. A reset is allowed only where history was really lost: a crash empties the unlogged
    message log (a new epoch), so then each client gets at most one per topic; a clean stop
    keeps the log, so then none."""
    servers = await fleet.serve(2)
    await fleet.runtimes(2, "--concurrency", "8", heartbeat=HEARTBEAT)
    traffic = await Traffic.start(fleet, servers, PostgresFanOut(fleet.url), TOPICS, job=sample_jobs.record)
    # Longer than three heartbeats: when they are back, a runtime finds the other presumed dead,
    # so the jobs that one holds are released and run again.
    recovery = await traffic.through(postgres_down(mode), hold=OUTAGE, bound=HEALTH_BOUND, load=LOAD)

    report = await traffic.delivered()
    if mode == "fast":
        assert traffic.resets() == [0] * len(traffic.clients), (
            f"a clean restart keeps history: no reset is due\n{report}\n{fleet.server_log('reset', 'history')}")
    else:
        epochs = {t: {p.offset.split("-")[0] for p in traffic.publisher.published if p.topic == t} for t in TOPICS}
        assert all(len(e) == 2 for e in epochs.values()), (
            f"the crash did not start a new epoch of each topic's log, so no reset is explained: {epochs}")
        assert all(c.resets(t) <= 1 for c in traffic.clients for t in TOPICS), f"more than one reset per crash:\n{report}"

    # Each server says what happened in livepush's own lines: no traceback, and no line of
    # psycopg's per pooled connection the restart closed.
    assert not fleet.server_log("Traceback", "discarding closed connection"), fleet.server_log()
    await traffic.ends_cleanly(fleet)
    print(f"\nPostgreSQL {mode} restart: down {recovery.down} s; servers at 200 {recovery.healthy_after} s after; "
          f"{traffic.summary()}; runtimes found presumed dead: {len(fleet.runtime_log('presumed dead').splitlines())}")
