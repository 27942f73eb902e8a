"""State topics through a real server: a job's current state first, then its events (SPEC §5, §6)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest

from livepush import jobs
from livepush.jobs import database
from tests.server.conftest import Served, make_settings, start_served
from tests.support.wsclient import WSClient


@jobs.job(name="t.state.steps", queue="state-topics")
async def steps(ctx: Any, n: int) -> None:
    for i in range(1, n + 1):
        await ctx.progress(i, n, f"step {i}")


@pytest.fixture
async def served_jobs(pg_url: str, secret: str) -> AsyncIterator[Served]:
    served = await start_served(make_settings("postgres", secret, pg_url, None, env="test"))
    database.configure(pg_url)
    try:
        yield served
    finally:
        database.configure(None)
        await served.server.stop()


async def test_a_job_topic_sends_the_snapshot_first_then_every_event_in_order(served_jobs: Served) -> None:
    """Subscribing to job:<id> gives `subscribed`, the current state as `snapshot`, then
    started, at least one progress, and succeeded, in order."""
    handle = await asyncio.to_thread(steps.enqueue, 3)
    client = await WSClient.open(served_jobs.url)
    answer = await client.subscribe(handle.signed_topic)
    assert answer["op"] == "subscribed" and answer["topic"] == handle.topic == f"job:{handle.id}"
    snapshot = (await client.messages(1))[0]
    assert snapshot["data"]["event"] == "snapshot"
    assert snapshot["data"]["job"]["state"] == "available" and snapshot["data"]["job"]["id"] == handle.id
    assert snapshot["offset"] == answer["offset"]

    counts = await asyncio.to_thread(jobs.drain, ["state-topics"])
    assert counts.get("succeeded") == 1, counts
    events = []
    while not events or events[-1]["data"]["event"] != "succeeded":
        events.append((await client.messages(1))[0])
    names = [e["data"]["event"] for e in events]
    assert names[0] == "started" and "progress" in names and names[-1] == "succeeded", names
    assert events[-1]["data"]["job"]["progress"] == {"done": 3, "total": 3, "message": "step 3"}
    await client.close()


async def test_a_late_subscriber_gets_the_final_state_and_since_replays_the_events(served_jobs: Served) -> None:
    """After the job finished, a new subscriber's snapshot says succeeded; one resuming from
    the enqueue-time snapshot gets the events it missed instead."""
    handle = await asyncio.to_thread(steps.enqueue, 2)
    early = await WSClient.open(served_jobs.url)
    await early.subscribe(handle.signed_topic)
    first = (await early.messages(1))[0]
    await early.close()
    await asyncio.to_thread(jobs.drain, ["state-topics"])

    late = await WSClient.open(served_jobs.url)
    await late.subscribe(handle.signed_topic)
    final = (await late.messages(1))[0]
    assert final["data"]["event"] == "snapshot" and final["data"]["job"]["state"] == "succeeded"
    await late.close()

    resumed = await WSClient.open(served_jobs.url)
    await resumed.subscribe(handle.signed_topic, since=first["offset"])
    replay = []
    while not replay or replay[-1]["data"]["event"] != "succeeded":
        replay.append((await resumed.messages(1))[0])
    assert replay[0]["data"]["event"] == "started"
    await resumed.close()


async def test_an_unknown_job_topic_subscribes_without_a_snapshot(served_jobs: Served) -> None:
    """job:<id> of a job that does not exist is subscribable; it just has no state to send."""
    client = await WSClient.open(served_jobs.url)
    assert (await client.subscribe(served_jobs.sign("job:987654")))["op"] == "subscribed"
    with pytest.raises(asyncio.TimeoutError):
        await client.recv(timeout=0.3)
    await client.close()


async def test_a_page_waiting_for_a_job_gets_its_enqueued_event(served_jobs: Served) -> None:
    """A subscriber to job:<id> from before the job existed gets the job's `enqueued` event
    live. A batch enqueue rings only offset and topic (queries.ENQUEUE_MANY_PUBLISHING_FRESH):
    the server reads the event from history for the topics someone watches."""
    def next_id() -> int:
        with database.sync_pool().connection() as conn:
            (last,) = conn.execute("SELECT nextval('livepush_jobs_id_seq')").fetchone()  # type: ignore[misc]
        return int(last) + 1

    first = await asyncio.to_thread(next_id)
    client = await WSClient.open(served_jobs.url)
    for topic in (f"job:{first}", f"job:{first + 1}"):
        assert (await client.subscribe(served_jobs.sign(topic)))["op"] == "subscribed"
    handles = await asyncio.to_thread(jobs.enqueue_many, [steps.request(1), steps.request(2)])
    assert [h.id for h in handles] == [first, first + 1]
    got = sorted((m["topic"], m["offset"].split("-")[1], m["data"]["event"], m["data"]["job"]["id"])
                 for m in await client.messages(2))
    assert got == [(f"job:{first}", "1", "enqueued", first), (f"job:{first + 1}", "1", "enqueued", first + 1)]
    await client.close()
