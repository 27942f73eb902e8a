"""A database login is not trust: a role with no privileges on livepush's tables (it can connect,
LISTEN and NOTIFY, as any role can) reads no message data and makes no server or runtime
deliver, reset, cancel or close anything; malformed notifications stop nothing."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import psycopg
import pytest

from livepush import jobs, sessions
from livepush.fanout.postgres import PostgresFanOut
from livepush.jobs import database
from livepush.jobs.runtime.runtime import Runtime
from livepush.postgres.listener import Listener
from livepush.server.app import RECHECK_PAUSE
from livepush.server.hub import EMPTY_READ_PAUSE
from tests.security import role_jobs
from tests.server.conftest import Served, make_settings, start_served
from tests.support.waiting import async_wait_for
from tests.support.wsclient import WSClient

# How long a test watches for something that must not happen (a loop, a forged delivery). The
# real event that follows each probe is awaited, so a wrong delivery would arrive before it.
QUIET = 0.5

# What the doorbells of the channels livepush uses could be forged into, by someone who can only
# connect: the offsets a parser must refuse (non-ASCII digits, signs, overflows), lines naming
# other topics, an empty one, and junk.
JUNK = ["²-1 x", "-1-1 t", "99999999999999999999-1 t", "1-99999999999999999999 t", "1-1", " ", "",
        "1-1 bad topic", "x" * 7000, "1-0 t", "\x01\x7f", "１-１ t", "1-1 t\n" * 200]


@pytest.fixture
async def served(pg_url: str, secret: str) -> AsyncIterator[Served]:
    s = await start_served(make_settings("postgres", secret, pg_url, None, env="test"))
    try:
        yield s
    finally:
        await s.stop()


def notify(url: str, channel: str, *payloads: str, apart: float = 0.0) -> None:
    """Send each payload on `channel` as the role of `url` (one transaction each), `apart`
    seconds after the one before: a flood spread out in time is the scenario, not a wait."""
    with psycopg.connect(url, autocommit=True) as conn:
        for i, payload in enumerate(payloads):
            if i and apart:
                time.sleep(apart)
            conn.execute("SELECT pg_notify(%s, %s)", (channel, payload))


async def anotify(url: str, channel: str, *payloads: str, apart: float = 0.0) -> None:
    await asyncio.to_thread(functools.partial(notify, url, channel, *payloads, apart=apart))


async def nothing_within(client: WSClient, seconds: float = QUIET) -> None:
    with pytest.raises(asyncio.TimeoutError):
        frame = await client.recv(timeout=seconds)
        raise AssertionError(f"expected nothing, got {frame}")


def test_a_login_without_privileges_reads_no_message_data(pg_url: str, nobody_url: str) -> None:
    """Listening on `livepush` shows only "EPOCH-SEQ TOPIC"; the log, the jobs and livepush_publish() refuse the role."""
    fanout = PostgresFanOut(pg_url)
    with psycopg.connect(nobody_url, autocommit=True) as spy:
        spy.execute("LISTEN livepush")
        offset = fanout.publish("user:alice", {"secret": "alice's private message"})
        notes = list(spy.notifies(timeout=5, stop_after=1))
        for statement in ("SELECT data FROM livepush_messages", "SELECT * FROM livepush_job_payloads",
                          "SELECT * FROM livepush_revoked_sessions", "SELECT livepush_publish('user:bob', '{}')"):
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                spy.execute(statement)  # type: ignore[arg-type]
    fanout.close()
    assert [n.payload for n in notes] == [f"{offset} user:alice"]
    assert "secret" not in notes[0].payload


async def test_forged_doorbells_deliver_reset_or_silence_nothing(served: Served, nobody_url: str) -> None:
    """A subscriber hears only what was published: not a forged next offset, a forged high epoch or seq, nor junk; the next real message still arrives."""
    client = await WSClient.open(served.url)
    topic = "user:alice"
    answer = await client.subscribe(served.sign(topic))
    epoch = int(answer["offset"].split("-")[0]) if "-" in answer["offset"] else 1
    first = await served.publish(topic, {"n": 1})
    assert (await client.messages(1))[0]["offset"] == first
    seq = int(first.split("-")[1])
    await anotify(nobody_url, "livepush", f"{epoch}-{seq + 1} {topic}", f"{epoch + 10**9}-1 {topic}",
                  f"{epoch}-{seq + 10**6} {topic}", *JUNK)
    await nothing_within(client)
    second = await served.publish(topic, {"n": 2})
    (message,) = await client.messages(1)
    assert message["offset"] == second and message["data"] == {"n": 2}
    assert served.server.listening
    await client.close()


class LogReads:
    """Counts the server's live reads of the log (its hub's fan-out `histories` calls)."""

    def __init__(self, served: Served) -> None:
        self.count = 0
        fanout = served.server.hub.fanout
        real_histories = fanout.histories

        async def counted(*args: Any, **kwargs: Any) -> Any:
            self.count += 1
            return await real_histories(*args, **kwargs)

        fanout.histories = counted  # type: ignore[method-assign]


async def subscribed_past_one(served: Served, topic: str) -> tuple[WSClient, int, int]:
    """A client subscribed to `topic`, which has got the one message published to it: the client,
    and that message's epoch and sequence number."""
    client = await WSClient.open(served.url)
    await client.subscribe(served.sign(topic))
    offset = await served.publish(topic, {"n": 1})
    await client.messages(1)
    epoch, seq = (int(p) for p in offset.split("-"))
    return client, epoch, seq


async def test_a_doorbell_ahead_of_history_costs_a_bounded_number_of_reads(served: Served, nobody_url: str) -> None:
    """One forged doorbell ahead of the log, or a flood of them, makes the server read the log a few times, never loop; nothing is sent."""
    reads = LogReads(served)
    client, epoch, seq = await subscribed_past_one(served, "room:flood")
    reads.count = 0
    await anotify(nobody_url, "livepush", f"{epoch}-{seq + 5} room:flood")
    await nothing_within(client)
    assert 1 <= reads.count <= 2, reads.count
    reads.count = 0
    loop = asyncio.get_running_loop()
    flood_started = loop.time()
    await anotify(nobody_url, "livepush", *[f"{epoch}-{seq + 1 + i} room:flood" for i in range(300)])
    flooded = loop.time() - flood_started
    await nothing_within(client, 1.0)
    # Coalesced, with a pause after each read that found nothing: one read per pause while the
    # flood lasts (which a loaded machine stretches: a fixed bound failed it), one for the rings
    # of the last pause, and the one that follows it.
    assert reads.count <= 3 + flooded / EMPTY_READ_PAUSE, (reads.count, flooded)
    await client.close()


async def test_a_flood_of_doorbells_spread_out_in_time_costs_a_bounded_number_of_reads(
        served: Served, nobody_url: str) -> None:
    """Forged doorbells ahead of the log, each a little after the one before (a loaded machine's
    flood, or a patient one): each found the topic not being read and started a read at once, so
    the flood cost a read per doorbell, where doorbells that came during a read waited for the
    pause after it. A read that found nothing makes the next one wait the pause, whenever the
    next doorbell comes; a real message still arrives."""
    reads = LogReads(served)
    client, epoch, seq = await subscribed_past_one(served, "room:spread")
    reads.count = 0
    loop = asyncio.get_running_loop()
    flood_started = loop.time()
    await anotify(nobody_url, "livepush", *[f"{epoch}-{seq + 1 + i} room:spread" for i in range(100)], apart=0.01)
    flooded = loop.time() - flood_started
    await nothing_within(client)
    # One read per pause while the flood lasts, one for the rings of the last pause, and the one
    # that follows it: never one per doorbell.
    assert reads.count <= 3 + flooded / EMPTY_READ_PAUSE, (reads.count, flooded)
    sent = await served.publish("room:spread", {"n": 2})
    (message,) = await client.messages(1)
    assert message["offset"] == sent and message["data"] == {"n": 2}
    await client.close()


async def test_a_forged_revocation_closes_no_session(served: Served, nobody_url: str) -> None:
    """A ring on `livepush_revocations` from a login without privileges makes the server re-check sessions against the store, which closes nothing."""
    token = sessions.issue("carol")
    client = await WSClient.open(served.url, additional_headers={"Cookie": f"livepush_session={token}"})
    assert client.hello["session"] == {"subject": "carol"}
    await anotify(nobody_url, "livepush_revocations", "", '{"subject":"carol","before":9e99}', *JUNK)
    await nothing_within(client)
    await client.send({"op": "ping", "ref": 1})
    assert await client.recv() == {"op": "pong", "ref": 1}
    await asyncio.to_thread(sessions.revoke, token)  # the real one still closes it
    assert await client.closed_with() == 4403  # well before the 60 s re-check, had the ring been lost


@contextlib.asynccontextmanager
async def watching_a_job(served: Served, pg_url: str) -> AsyncIterator[tuple[Any, WSClient, dict[str, Any]]]:
    """A job enqueued, and a client subscribed to its topic: (its handle, the client, the snapshot it got)."""
    database.configure(pg_url)
    try:
        handle = await role_jobs.work.aenqueue(1)
        client = await WSClient.open(served.url)
        await client.subscribe(served.sign(handle.topic))
        (snapshot,) = await client.messages(1)
        assert snapshot["data"]["event"] == "snapshot"
        yield handle, client, snapshot
        await client.close()
    finally:
        await database.release_loop()
        database.configure(None)


async def test_forged_state_rings_show_only_what_the_rows_hold(served: Served, nobody_url: str, pg_url: str) -> None:
    """Lines on `livepush_states` naming a job at a higher version, or junk, send a subscriber nothing; the job's next real change arrives."""
    async with watching_a_job(served, pg_url) as (handle, client, snapshot):
        await anotify(nobody_url, "livepush_states", f"{handle.topic} 999999", f"{handle.topic}", "job:0001 5",
                      "job:-1", "group:x 1", *JUNK)
        await nothing_within(client)
        assert await asyncio.to_thread(jobs.cancel, handle.id)
        (cancelled,) = await client.messages(1)
        assert cancelled["data"]["event"] == "cancelled" and int(cancelled["offset"]) > int(snapshot["offset"])


@contextlib.asynccontextmanager
async def runtime_on(pg_url: str, secret: str, queue: str) -> AsyncIterator[tuple[Runtime, asyncio.Task[None]]]:
    """livepush configured for `pg_url` and a started runtime on `queue` (define its jobs first),
    stopped and unconfigured after."""
    from livepush import config

    config.set_settings(config.Settings(database_url=pg_url, fanout="postgres", env="test", secret=secret))
    database.configure(pg_url)
    runtime = Runtime(queues=[queue], install_signals=False, heartbeat=0.5, poll_interval=0.1)
    task = asyncio.create_task(runtime.run())
    try:
        await asyncio.wait_for(runtime.wait_started(), 10)
        yield runtime, task
    finally:
        runtime.stop(now=True)
        await asyncio.wait_for(task, 15)
        await database.release_loop()
        database.configure(None)
        config.set_settings(None)


async def test_a_forged_cancel_cancels_nothing_and_stops_no_runtime(pg_url: str, nobody_url: str,
                                                                    secret: str) -> None:
    """`livepush_jobs_cancel` with a running job's id, or junk, from a login without privileges: the job runs to success and the runtime keeps running."""
    gate = asyncio.Event()

    @jobs.job(name="t.security.waits", queue="forged-cancel")
    async def waits(ctx: Any) -> None:
        gate.set()
        for i in range(20):
            await ctx.progress(i, 20)
            await asyncio.sleep(0.05)

    async with runtime_on(pg_url, secret, "forged-cancel") as (runtime, task):
        handle = await waits.aenqueue()
        await asyncio.wait_for(gate.wait(), 10)
        await anotify(nobody_url, "livepush_jobs_cancel", str(handle.id), f"{handle.id},{handle.id}", "²", *JUNK)
        async def finished() -> Any:
            state = await asyncio.to_thread(jobs.job_state, handle.id)
            return state if state and state["state"] in ("succeeded", "failed", "cancelled") else None

        state = await async_wait_for(finished, 10, 0.05, message="the job to finish")
        assert state["state"] == "succeeded", state
        assert runtime.healthy and not task.done()



# The advisory-lock namespaces livepush's SQL used to take, which any role could read in pg_proc
# and take itself: debounced enqueues locked (KEY_LOCKS, hashtext(key)), runtimes' starts
# (START_LOCKS, 0); limited claims still try theirs (CLAIM_LOCKS, hashtext(name)).
KEY_LOCKS, CLAIM_LOCKS, START_LOCKS = 1819045236, 1819304812, 1819307123


@pytest.fixture
def held_lock(nobody_url: str) -> Iterator[Callable[[int, str], None]]:
    """`hold(namespace, text)`: the login without privileges takes the session-level advisory lock
    (namespace, hashtext(text)) and keeps it until `release()` or teardown."""
    conn = psycopg.connect(nobody_url, autocommit=True)

    def hold(namespace: int, text: str) -> None:
        conn.execute("SELECT pg_advisory_lock(%s, hashtext(%s))", (namespace, text))

    hold.release = conn.close  # type: ignore[attr-defined]
    yield hold
    conn.close()


async def test_a_login_without_privileges_holds_up_no_debounced_enqueue(
        pg_url: str, held_lock: Callable[[int, str], None], secret: str) -> None:
    """A login without privileges holding an advisory lock on a key's hash, in the namespace livepush's debounce uses, holds up no debounced enqueue of that key."""
    from livepush import config

    config.set_settings(config.Settings(database_url=pg_url, fanout="postgres", env="test", secret=secret))
    database.configure(pg_url)
    try:
        held_lock(KEY_LOCKS, "sync:1")
        handle = await asyncio.wait_for(role_jobs.work.aenqueue(1, key="sync:1", debounce=5), 5)
        assert handle.id
    finally:
        held_lock.release()  # type: ignore[attr-defined]
        await database.release_loop()
        database.configure(None)
        config.set_settings(None)


async def test_a_login_without_privileges_holds_up_no_runtime_start(pg_url: str, nobody_url: str, secret: str) -> None:
    """Starting runtimes take turns writing their functions' limits. A login without privileges
    can take no lock they wait for: the table lock they take needs UPDATE on the table, and an
    advisory lock it holds (any, in the namespace starts once used) holds up no start."""
    with psycopg.connect(nobody_url, autocommit=True) as nobody:
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            with nobody.transaction():
                nobody.execute("LOCK TABLE livepush_job_limits IN SHARE UPDATE EXCLUSIVE MODE")
        nobody.execute("SELECT pg_advisory_lock(%s, 0)", (START_LOCKS,))

        @jobs.job(name="t.security.start_limited", queue="start-lock", rate="100/s")
        async def limited(ctx: Any) -> None:
            pass

        async with runtime_on(pg_url, secret, "start-lock"):
            pass


async def test_a_login_without_privileges_stops_no_runtime_with_an_advisory_lock(
        pg_url: str, held_lock: Callable[[int, str], None], secret: str) -> None:
    """A login without privileges holding the claim lock of a rate-limited function stops no
    runtime: a plain job enqueued after it runs to success, and the limited function's job runs
    once the lock is let go."""
    @jobs.job(name="t.security.limited", queue="held-lock", rate="100/s")
    async def limited(ctx: Any) -> None:
        pass

    @jobs.job(name="t.security.plain", queue="held-lock")
    async def plain(ctx: Any) -> None:
        pass

    async with runtime_on(pg_url, secret, "held-lock"):
        held_lock(CLAIM_LOCKS, "t.security.limited")
        held_up = await limited.aenqueue()
        handle = await plain.aenqueue()

        def finished(job_id: int) -> Any:
            async def check() -> Any:
                state = await asyncio.to_thread(jobs.job_state, job_id)
                return state if state and state["state"] in ("succeeded", "failed", "cancelled") else None
            return check

        state = await async_wait_for(finished(handle.id), 10, 0.05, message="the plain job to finish")
        assert state["state"] == "succeeded", state
        held_lock.release()  # type: ignore[attr-defined]
        state = await async_wait_for(finished(held_up.id), 10, 0.05, message="the limited job to finish")
        assert state["state"] == "succeeded", state


async def test_a_notification_with_a_non_ascii_byte_stops_no_listener(
        sql_ascii_url: str, caplog: pytest.LogCaptureFixture) -> None:
    """On a SQL_ASCII database a payload with a byte past ASCII is handed on like any malformed one: the listener stays connected, logs no error, and the notification committed with it arrives too."""
    caplog.set_level(logging.DEBUG, logger="livepush")
    heard: list[str] = []
    listener = Listener(sql_ascii_url)
    listener.add("livepush", heard.append)
    await listener.start()
    try:
        def forge() -> None:
            with psycopg.connect(sql_ascii_url, autocommit=True) as conn, conn.transaction():
                conn.execute("SELECT pg_notify('livepush', E'1-1 caf\\xe9')")  # one batch with the next
                conn.execute("SELECT pg_notify('livepush', '1-2 after')")

        await asyncio.to_thread(forge)
        await async_wait_for(lambda: "1-2 after" in heard, 5, message="the notification after it was lost")
        assert listener.listening
        trouble = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
        assert trouble == [], trouble
    finally:
        await listener.aclose()


async def test_a_flood_of_forged_revocation_rings_costs_a_bounded_number_of_checks(served: Served,
                                                                                  nobody_url: str) -> None:
    """A flood of rings on `livepush_revocations` from a login without privileges makes the server re-check its sessions a bounded number of times, never back to back for as long as the flood lasts; a real revoke() still closes within a second."""
    store = served.server.store
    checks = 0
    real_revoked_among = store.revoked_among

    async def counted(*args: Any, **kwargs: Any) -> Any:  # the server's re-checks of its sessions
        nonlocal checks
        checks += 1
        return await real_revoked_among(*args, **kwargs)

    store.revoked_among = counted  # type: ignore[method-assign]
    token = sessions.issue("carol")
    client = await WSClient.open(served.url, additional_headers={"Cookie": f"livepush_session={token}"})
    loop = asyncio.get_running_loop()
    flood_started = loop.time()
    await anotify(nobody_url, "livepush_revocations", *[str(i) for i in range(1000)])
    flooded = loop.time() - flood_started
    await nothing_within(client)
    # One re-check per pause while the flood lasts, one for the rings of the last pause, and the
    # one that follows it: never one after another.
    assert checks <= 3 + flooded / RECHECK_PAUSE, (checks, flooded)
    started = asyncio.get_running_loop().time()
    await asyncio.to_thread(sessions.revoke, token)
    assert await client.closed_with(timeout=2) == 4403
    assert asyncio.get_running_loop().time() - started < 1.0


async def test_a_flood_of_forged_state_rings_costs_a_bounded_number_of_reads(served: Served, nobody_url: str,
                                                                              pg_url: str) -> None:
    """A flood of lines on `livepush_states` naming a watched job at ever higher versions, from a
    login without privileges, made the server read the job's row back to back for as long as the
    flood lasted (a read per ring or two), where a forged message doorbell or revocation ring
    pauses after a read that changes nothing. The state reads pause the same way; the job's next
    real change still arrives within a second."""
    async with watching_a_job(served, pg_url) as (handle, client, _):
        source = served.server.hub.source_of(handle.topic)
        assert source is not None
        reads = 0
        real_read = source.read

        async def counted(*args: Any, **kwargs: Any) -> Any:  # the server's reads of state rows
            nonlocal reads
            reads += 1
            return await real_read(*args, **kwargs)

        source.read = counted  # type: ignore[method-assign]
        loop = asyncio.get_running_loop()
        flood_started = loop.time()
        await anotify(nobody_url, "livepush_states", *[f"{handle.topic} {10**6 + i}" for i in range(1000)])
        flooded = loop.time() - flood_started
        await nothing_within(client)
        # One read per pause while the flood lasts, one for the rings of the last pause, and the
        # one that follows it: never one after another.
        assert reads <= 3 + flooded / EMPTY_READ_PAUSE, (reads, flooded)
        started = loop.time()
        assert await asyncio.to_thread(jobs.cancel, handle.id)
        (cancelled,) = await client.messages(1)
        assert cancelled["data"]["event"] == "cancelled" and loop.time() - started < 1.0


async def test_notifications_naming_numbers_no_row_holds_are_dropped_with_a_debug_line(
        served: Served, nobody_url: str, pg_url: str, caplog: pytest.LogCaptureFixture) -> None:
    """A doorbell or a state ring whose offset or version is ASCII digits past the bigint range
    (19 digits fit the parsers' patterns, not a bigint column) was taken as a ring: it cost the
    server a read, and no line said it was dropped, where every other line no row can match is
    dropped with a debug line naming its channel. The server still delivers the next real change."""
    async with watching_a_job(served, pg_url) as (handle, client, _):
        room = await WSClient.open(served.url)
        await room.subscribe(served.sign("room:big"))
        past = "9" * 19
        with caplog.at_level(logging.DEBUG, logger="livepush"):
            await anotify(nobody_url, "livepush", f"{past}-1 room:big", f"1-{past} room:big")
            await anotify(nobody_url, "livepush_states", f"{handle.topic} {past}")
            await nothing_within(client)
            await nothing_within(room, 0.1)
        said = [r.getMessage() for r in caplog.records]
        assert sum(f"{past}-1 room:big" in s or f"1-{past} room:big" in s for s in said
                   if "not a doorbell" in s) == 2, said
        assert any(f"{handle.topic} {past}" in s and "names no state topic" in s for s in said), said
        assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
        offset = await served.publish("room:big", {"n": 1})
        (message,) = await room.messages(1)
        assert message["offset"] == offset
        assert await asyncio.to_thread(jobs.cancel, handle.id)
        (cancelled,) = await client.messages(1)
        assert cancelled["data"]["event"] == "cancelled"
        await room.close()
