"""State topics through a real server (docs/reference.md §5, §6): `job:<id>` shows the job's row.

Its offset is the row's version. A subscriber gets `subscribed` (offset: the current version,
null when there is no such job), then the current state as a `snapshot` unless its `since` is
that version already, then later versions as they happen (a burst of changes may reach it as
its newest version; the final one always does). A client that was away gets one snapshot,
never a replay of every event it missed.

After a subscribe, a `ping` answered with `pong` as the very next frame shows that the server
sent nothing else for it: the server handles a connection's frames one at a time, and a
subscribe's snapshot goes out before the next frame is read.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from livepush import jobs
from livepush.jobs import database
from livepush.config import Settings, set_settings
from tests.server.conftest import Served, start_served
from tests.support import services
from tests.support.job_versions import events_of
from tests.support.waiting import async_wait_for
from tests.support.wsclient import WSClient


@jobs.job(name="t.state.steps", queue="state-topics")
async def steps(ctx: Any, n: int) -> None:
    for i in range(1, n + 1):
        await ctx.progress(i, n, f"step {i}")


async def nothing_else(client: WSClient, ref: str = "quiet?") -> None:
    """The next frame the server sends is the answer to this ping: nothing was queued before it."""
    await client.send({"op": "ping", "ref": ref})
    assert await client.recv() == {"op": "pong", "ref": ref}


async def test_a_job_topic_sends_the_snapshot_first_then_every_event_in_order(served_jobs: Served, pg_url: str) -> None:
    """job:<id> gives `subscribed` and a `snapshot` at the current version, then later versions as the row had them, ending with the final one; the row went enqueued, started, progress, succeeded."""
    handle = await asyncio.to_thread(steps.enqueue, 3)
    client = await WSClient.open(served_jobs.url)
    answer = await client.subscribe(handle.signed_topic)
    assert answer["op"] == "subscribed" and answer["topic"] == handle.topic == f"job:{handle.id}"
    assert answer["offset"] == "1", "a job just enqueued is at version 1"
    snapshot = (await client.messages(1))[0]
    assert snapshot["data"]["event"] == "snapshot"
    assert snapshot["data"]["job"]["state"] == "available" and snapshot["data"]["job"]["id"] == handle.id
    assert snapshot["offset"] == answer["offset"]

    counts = await asyncio.to_thread(jobs.drain, ["state-topics"])
    assert counts.get("succeeded") == 1, counts
    events = []
    while not events or events[-1]["data"]["event"] != "succeeded":
        events.append((await client.messages(1))[0])
    await nothing_else(client)
    await client.close()

    recorded = dict(enumerate(await asyncio.to_thread(events_of, pg_url, handle.id), start=1))
    names = [recorded[v]["event"] for v in sorted(recorded)]
    assert names[:2] == ["enqueued", "started"] and "progress" in names[2:-1] and names[-1] == "succeeded", names
    assert recorded[1]["job"] == snapshot["data"]["job"], "the snapshot is version 1 as the row had it"
    versions = [int(e["offset"]) for e in events]
    assert versions == sorted(set(versions)) and versions[0] > 1, f"only later versions, rising: {versions}"
    assert versions[-1] == max(recorded), "the final version is never dropped"
    for event, version in zip(events, versions, strict=True):
        assert event["data"] == recorded[version], f"version {version} as the row had it"
    assert events[-1]["data"]["job"]["progress"] == {"done": 3, "total": 3, "message": "step 3"}


async def test_a_client_that_was_away_gets_one_snapshot_never_a_replay(served_jobs: Served) -> None:
    """Resuming from an old version gives one snapshot of the current state, not the events missed; resuming at the current version gives nothing."""
    handle = await asyncio.to_thread(steps.enqueue, 2)
    early = await WSClient.open(served_jobs.url)
    await early.subscribe(handle.signed_topic)
    first = (await early.messages(1))[0]
    await early.close()
    await asyncio.to_thread(jobs.drain, ["state-topics"])

    resumed = await WSClient.open(served_jobs.url)
    answer = await resumed.subscribe(handle.signed_topic, since=first["offset"])
    assert int(answer["offset"]) > int(first["offset"])
    (final,) = await resumed.messages(1)
    assert final["data"]["event"] == "snapshot" and final["offset"] == answer["offset"]
    assert final["data"]["job"]["state"] == "succeeded"
    assert final["data"]["job"]["progress"] == {"done": 2, "total": 2, "message": "step 2"}
    await nothing_else(resumed)
    await resumed.close()

    current = await WSClient.open(served_jobs.url)
    again = await current.subscribe(handle.signed_topic, since=answer["offset"])
    assert (again["op"], again["offset"]) == ("subscribed", answer["offset"])
    await nothing_else(current)
    await current.close()



async def test_a_since_that_is_not_the_current_version_gets_the_snapshot_even_ahead_of_it(served_jobs: Served) -> None:
    """Only a `since` that is the current version goes without a snapshot. One ahead of it (a
    page that held a later version before the jobs' database was restored from a backup) or one
    that is no version at all gets the current state, so the page never keeps a state the row
    does not have."""
    handle = await asyncio.to_thread(steps.enqueue, 1)
    client = await WSClient.open(served_jobs.url)
    for since in ("2", "99", "01", "x"):
        answer = await client.subscribe(handle.signed_topic, since=since)
        assert answer["offset"] == "1", answer
        (snapshot,) = await client.messages(1)
        assert (snapshot["offset"], snapshot["data"]["event"]) == ("1", "snapshot"), (since, snapshot)
        await nothing_else(client, f"after since={since}")
        await client.send({"op": "unsubscribe", "topic": handle.topic})
    await client.close()

async def test_an_unknown_job_topic_subscribes_without_a_snapshot(served_jobs: Served) -> None:
    """job:<id> of a job that does not exist is subscribable: `subscribed` with offset null, and nothing else."""
    client = await WSClient.open(served_jobs.url)
    for since in (None, "3"):
        answer = await client.subscribe(served_jobs.sign("job:987654"), since=since)
        assert (answer["op"], answer["topic"], answer["offset"]) == ("subscribed", "job:987654", None)
        await nothing_else(client, f"after since={since}")
    await client.close()


@pytest.mark.parametrize("topic", ["job:0001", "job:0_1", "job:01", "job:0", "job:-1", "job:1.0",
                                   "group:07", "job:99999999999999999999"])
async def test_state_topics_with_a_non_canonical_id_are_refused(served_jobs: Served, topic: str) -> None:
    """A state topic names its row by its canonical decimal id: job:0001 or job:0_1 is not job 1's topic, signed or not, and is refused invalid_topic."""
    client = await WSClient.open(served_jobs.url)
    assert (await client.subscribe(served_jobs.sign(topic)))["reason"] == "invalid_topic"
    assert (await client.subscribe(topic))["reason"] == "invalid_topic"
    assert (await client.subscribe(served_jobs.sign("job:1")))["op"] == "subscribed", "the canonical id is fine"
    await client.close()


async def test_a_page_waiting_for_a_job_gets_its_enqueued_event(served_jobs: Served) -> None:
    """A subscriber to job:<id> from before the job existed gets its `enqueued` event live, at version 1: a batch enqueue rings the id range it created, a lone one its job's version 1."""

    def next_id() -> int:
        with database.pools().sync().connection() as conn:
            (last,) = conn.execute("SELECT nextval('livepush_jobs_id_seq')").fetchone()  # type: ignore[misc]
        return int(last) + 1

    first = await asyncio.to_thread(next_id)
    client = await WSClient.open(served_jobs.url)
    for topic in (f"job:{first}", f"job:{first + 1}", f"job:{first + 2}"):
        answer = await client.subscribe(served_jobs.sign(topic))
        assert (answer["op"], answer["offset"]) == ("subscribed", None), "no such job yet"
    handles = await asyncio.to_thread(jobs.enqueue_many, [steps.request(1), steps.request(2)])
    handles.append(await asyncio.to_thread(steps.enqueue, 3))
    assert [h.id for h in handles] == [first, first + 1, first + 2]
    got = sorted((m["topic"], m["offset"], m["data"]["event"], m["data"]["job"]["id"], m["data"]["job"]["state"])
                 for m in await client.messages(3))
    assert got == [(f"job:{i}", "1", "enqueued", i, "available") for i in (first, first + 1, first + 2)]
    await nothing_else(client)
    await client.close()


async def test_state_changes_made_while_the_servers_listener_is_away_reach_a_client_that_stayed(
        served_jobs: Served, pg_admin_url: str) -> None:
    """The server's LISTEN backend is killed and kept from coming back while one job watched is
    cancelled and another watched before it existed is enqueued: nobody hears their rings. Once
    the listener is back, the client that stayed connected gets the cancelled state and the new
    job's `enqueued`, since every watched state topic is read again after a reconnect."""
    cancelled = await asyncio.to_thread(steps.enqueue, 1)
    with database.pools().sync().connection() as conn:
        (unborn,) = conn.execute("SELECT last_value + 1 FROM livepush_jobs_id_seq").fetchone()  # type: ignore[misc]
    client = await WSClient.open(served_jobs.url)
    assert (await client.subscribe(cancelled.signed_topic))["offset"] == "1"
    assert (await client.messages(1))[0]["data"]["event"] == "snapshot"
    assert (await client.subscribe(served_jobs.sign(f"job:{unborn}")))["offset"] is None
    dbname = services.dbname_of(served_jobs.settings.database_url)
    with services.pg_refusing_connections(pg_admin_url, dbname):
        assert await asyncio.to_thread(services.pg_terminate, pg_admin_url, dbname, "livepush-listener") == 1
        await async_wait_for(lambda: not served_jobs.fanout.listening, 10, message="the listener to notice its loss")
        # The jobs' pool keeps the connection it opened above: these go through while no new one may.
        assert await asyncio.to_thread(jobs.cancel, cancelled.id)
        born = await asyncio.to_thread(steps.enqueue, 1)
        assert born.id == unborn
    await async_wait_for(lambda: served_jobs.fanout.listening, 15, message="the listener to come back")
    got = {m["topic"]: (m["data"]["event"], m["data"]["job"]["state"]) for m in await client.messages(2, timeout=10)}
    assert got == {cancelled.topic: ("cancelled", "cancelled"), born.topic: ("enqueued", "available")}, got
    await nothing_else(client)
    await client.close()


async def test_a_job_topic_shows_the_jobs_states_through_a_server_on_the_redis_fan_out(
        pg_url: str, redis_url: str, secret: str) -> None:
    """Messages go through Redis, but a job's state lives in the jobs' database: a server on the
    Redis fan-out with that database gives a job topic's snapshot, then its later versions up to
    the final one, as a server on the Postgres fan-out does."""
    settings = Settings(fanout="redis", redis_url=redis_url, database_url=pg_url, secret=secret, port=0, env="test")
    served = await start_served(settings)
    database.configure(pg_url)
    try:
        handle = await asyncio.to_thread(steps.enqueue, 2)
        client = await WSClient.open(served.url)
        assert (await client.subscribe(handle.signed_topic))["offset"] == "1"
        assert (await client.messages(1))[0]["data"]["event"] == "snapshot"
        assert (await asyncio.to_thread(jobs.drain, ["state-topics"])).get("succeeded") == 1
        events = []
        while not events or events[-1]["data"]["event"] != "succeeded":
            events.append((await client.messages(1))[0])
        versions = [int(e["offset"]) for e in events]
        assert versions == sorted(set(versions)) and versions[0] > 1, versions
        assert events[-1]["data"]["job"]["progress"] == {"done": 2, "total": 2, "message": "step 2"}
        await nothing_else(client)
        await client.close()
    finally:
        database.configure(None)
        await served.stop()
        set_settings(None)


@jobs.job(name="t.state.elsewhere", queue="state-topics")
async def in_the_settings_database(ctx: Any) -> None:
    pass


async def test_a_job_topic_shows_the_job_of_the_database_jobs_configure_chose(make_pg_url: Any, secret: str) -> None:
    """With jobs.configure() naming another database than LIVEPUSH_DATABASE_URL (an --app or
    --with-jobs module does it at import), a job topic shows that database's job: its snapshot,
    then its later versions up to the final one. Not nothing, and not the job with the same id in
    the settings' database."""
    settings_db, jobs_db = make_pg_url(), make_pg_url()
    database.configure(settings_db)
    try:
        namesake = await asyncio.to_thread(in_the_settings_database.enqueue)
        database.configure(jobs_db)
        served = await start_served(Settings(fanout="postgres", database_url=settings_db, secret=secret, port=0,
                                             env="test"))
        try:
            handle = await asyncio.to_thread(steps.enqueue, 2)
            assert handle.id == namesake.id  # each database numbers its jobs from 1
            client = await WSClient.open(served.url)
            assert (await client.subscribe(handle.signed_topic))["offset"] == "1"
            snapshot = (await client.messages(1))[0]["data"]
            assert (snapshot["event"], snapshot["job"]["name"]) == ("snapshot", "t.state.steps")
            assert (await asyncio.to_thread(jobs.drain, ["state-topics"])).get("succeeded") == 1
            events = []
            while not events or events[-1]["data"]["event"] != "succeeded":
                events.append((await client.messages(1))[0])
            assert events[-1]["data"]["job"]["progress"] == {"done": 2, "total": 2, "message": "step 2"}
            await client.close()
        finally:
            await served.stop()
    finally:
        database.configure(None)
        set_settings(None)



async def events_until(client: WSClient, final: str) -> list[dict[str, Any]]:
    """The messages the client gets, up to and with the first whose event is `final`."""
    got: list[dict[str, Any]] = []
    while not got or got[-1]["data"]["event"] != final:
        got.extend(await client.messages(1, timeout=15))
    return got


@pytest.mark.parametrize("kind", ["local", "postgres", "redis"])
async def test_a_workflow_and_a_group_topic_show_their_states_through_a_server_on_every_fan_out(
        kind: str, pg_url: str, secret: str, request: pytest.FixtureRequest) -> None:
    """workflow:<id> and group:<id> are state topics as job:<id> is, on every fan-out: a subscriber
    gets `subscribed` at the current version and its snapshot, then only later versions, rising,
    each as the row had it, up to the final one (the run `finished`, the group `finished`), and
    nothing after it."""
    from tests.jobs import durable_jobs as dj
    from tests.jobs import group_jobs as gj
    from tests.jobs import sample_jobs
    from tests.jobs import workflow_defs as wd
    from tests.jobs.conftest import q, read_states, running

    for table in (dj.BODIES_TABLE, sample_jobs.RUNS_TABLE, gj.CALLBACK_RUNS_TABLE):
        q(pg_url, table)
    redis_url = request.getfixturevalue("redis_url") if kind == "redis" else None
    served = await start_served(Settings(fanout=kind, database_url=pg_url, redis_url=redis_url, secret=secret,
                                         port=0, env="test"))
    database.configure(pg_url)
    clients: list[WSClient] = []
    try:
        run = await wd.diamond.astart({"n": 2})
        with jobs.group(on_finish=gj.callback.request("fin")) as g:
            for i in range(5):
                g.enqueue(gj.member, i)
        watched = {run.topic: run.signed_topic, g.handle.topic: served.sign(g.handle.topic)}
        firsts: dict[str, int] = {}
        for topic, signed in watched.items():
            clients.append(client := await WSClient.open(served.url))
            answer = await client.subscribe(signed)
            assert (answer["op"], answer["topic"]) == ("subscribed", topic), answer
            (snapshot,) = await client.messages(1)
            assert (snapshot["offset"], snapshot["data"]["event"]) == (answer["offset"], "snapshot"), snapshot
            firsts[topic] = int(answer["offset"])

        async with running(queues=["flows", "default"]):
            shown = {topic: await events_until(client, "finished") for topic, client in zip(watched, clients)}
        final = await asyncio.to_thread(read_states, pg_url, list(watched))
        for (topic, events), client in zip(shown.items(), clients):
            versions = [int(m["offset"]) for m in events]
            assert versions == sorted(set(versions)) and versions[0] > firsts[topic], f"{topic}: {versions}"
            assert versions[-1] == final[topic].version, f"{topic}: the final version is never dropped"
            assert events[-1]["data"] == json.loads(final[topic].data_json()), f"{topic}: as the row has it"
            await nothing_else(client)
        assert shown[run.topic][-1]["data"]["workflow"]["state"] == "succeeded"
        assert shown[g.handle.topic][-1]["data"]["group"]["succeeded"] == 5
    finally:
        for client in clients:
            await client.close()
        database.configure(None)
        await served.stop()
        set_settings(None)
