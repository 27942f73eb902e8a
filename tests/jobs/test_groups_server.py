"""A group's topic through a real server: the snapshot first, then progress, then finished."""

from __future__ import annotations

import asyncio
import contextlib

import psycopg

from livepush import api, config
from livepush.jobs import database
from livepush.jobs.api.registry import REGISTRY
from livepush.jobs.runtime.runtime import Runtime
from livepush import jobs
from tests.jobs import group_jobs as gj
from tests.jobs import sample_jobs
from tests.server.conftest import make_settings, start_served
from tests.support.wsclient import WSClient


async def test_subscriber_gets_snapshot_then_progress_then_finished(pg_url: str, secret: str) -> None:
    """Subscribing to group:<id> on a PushServer: the first message is the snapshot, then
    progress events with growing counts, then `finished` with the final counts, and nothing after."""
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute(sample_jobs.RUNS_TABLE)
        conn.execute(gj.CALLBACK_RUNS_TABLE)
    served = await start_served(make_settings("postgres", secret, pg_url, None))
    database.configure(pg_url)
    try:
        with jobs.group(on_finish=gj.callback.request("fin")) as g:
            for i in range(40):
                g.enqueue(gj.slow, 0.03, i)
        client = await WSClient.open(served.url)
        answer = await client.subscribe(served.sign(g.handle.topic))
        assert answer["op"] == "subscribed", answer
        (first,) = await client.messages(1)
        assert first["data"] == {"event": "snapshot", "group": {"id": g.handle.id, "state": "sealed", "total": 40,
                                                                 "pending": 40, "succeeded": 0, "failed": 0,
                                                                 "cancelled": 0}}
        rt = Runtime(REGISTRY, install_signals=False, queues=["default"], concurrency=4, heartbeat=0.5,
                     poll_interval=0.1)
        task = asyncio.create_task(rt.run())
        got = []
        try:
            while True:
                (m,) = await client.messages(1, timeout=15)
                got.append(m["data"])
                if m["data"]["event"] == "finished":
                    break
        except Exception:
            raise AssertionError(f"got {got}, runtime counts {rt.counts}, group {jobs.get_group(g.handle.id)}")
        finally:
            rt.stop(now=True)
            await asyncio.wait_for(task, 10)
        names = [d["event"] for d in got]
        assert names[-1] == "finished" and set(names[:-1]) == {"progress"}, names
        done = [d["group"]["succeeded"] for d in got]
        assert done == sorted(done) and done[-1] == 40
        assert got[-1]["group"] == {"id": g.handle.id, "state": "finished", "total": 40, "pending": 0,
                                    "succeeded": 40, "failed": 0, "cancelled": 0}
        with contextlib.suppress(asyncio.TimeoutError):
            extra = await client.recv(timeout=0.5)
            raise AssertionError(f"nothing may follow finished, got {extra}")
        await client.close()
    finally:
        await served.stop()
        await database.release_loop()
        database.configure(None)
        api.set_default_fanout(None)
        config.set_settings(None)
