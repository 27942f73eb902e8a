"""The hub's newest paths together under the faults users meet: clients reading on from history
past their share (server/hub.py `_read_on`), the keeping of watched topics' chains
(`_keep_chains`), the per-connection frame budget, through a Postgres restart, crash or backend
kill, or a Redis restart. An in-process server (tests/server/conftest.py) with real WebSocket
clients, or, where the fan-out's idle time must be short (IDLE), a hub on a real fan-out with
recording subscribers. Each checks what a client gets (every message once, in order, or
`reset`; never a wrong or duplicated one) and that the server says each cause once, not once
per client or per retry."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Sequence

import psycopg
import pytest

from livepush import metrics
from livepush.errors import DependencyError
from livepush.fanout.base import HISTORY_PAGE, IDLE_EXPIRE, FanOut
from livepush.fanout.postgres import PostgresFanOut
from livepush.fanout.redis import RedisFanOut
from livepush.jobs.events.source import JobStates
from livepush.postgres.pools import LoopPools
from livepush.server import hub, limits
from livepush.server.hub import Hub
from livepush.types import offset_key
from tests.faults.fleet import postgres_down
from tests.faults.test_history_reads import backends_waiting_for_a_lock, terminate
from tests.server.conftest import Served, make_settings, start_served
from tests.server.test_hub import SlowReader, Sub, fan
from tests.server.test_slow_clients import count, open_client, server_side
from tests.support import services
from tests.support.waiting import async_wait_for
from tests.support.wsclient import WSClient
from tests.test_fanout_conformance import PrivateRedis, private_redis  # noqa: F401  (fixture)


def warnings_with(caplog: pytest.LogCaptureFixture, words: str) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING and words in r.getMessage()]


async def paused_clients(served: Served, topic: str, clients: int, count_sent: int) -> tuple[list[WSClient], list[str]]:
    """`clients` clients subscribed to `topic` that stop reading while `count_sent` messages of 2 KB
    go out (far past a client's share): returns once the server reads on from history for each."""
    subs = [await open_client(served.url) for _ in range(clients)]
    for sub in subs:
        assert (await sub.subscribe(served.sign(topic)))["op"] == "subscribed"
        sub.ws.transport.pause_reading()
    replayed = count("replayed")
    sent = [await served.publish(topic, {"n": n, "pad": "x" * 2000}) for n in range(count_sent)]
    await async_wait_for(lambda: count("replayed") >= replayed + clients, 10,
                         message="the server to read on from history for every client")
    return subs, sent


async def frames_read(client: WSClient, count: int, timeout: float = 30.0) -> list[str]:
    """The offsets of the next `count` frames, each a message (no `reset`), each within `timeout`."""
    got: list[str] = []
    while len(got) < count:
        frame = await client.recv(timeout=timeout)
        assert frame["op"] == "message", (frame, len(got))
        got.append(frame["offset"])
    return got


async def test_clients_reading_on_through_a_postgres_restart_get_every_message(
        pg_url: str, secret: str) -> None:
    """Several clients past their share read on from history while Postgres restarts: their reads
    wait for the pool to connect again, and each gets every message once, in order, without `reset`."""
    served = await start_served(make_settings("postgres", secret, pg_url, None))
    topic = "room:restart-read-ons"
    try:
        slow, sent = await paused_clients(served, topic, 4, 600)
        async with postgres_down():
            reads = [asyncio.ensure_future(frames_read(sub, len(sent))) for sub in slow]
            for sub in slow:
                sub.ws.transport.resume_reading()
            await asyncio.sleep(2)  # the outage: nothing to await, it is time passing
            assert not any(r.done() for r in reads)
        for read in reads:
            assert await asyncio.wait_for(read, 40) == sent, "every message once, in order, no reset"
        assert all(not server_side(served.server, sub).closing for sub in slow)
        for sub in slow:
            await sub.close()
    finally:
        await served.stop()


async def test_clients_whose_read_ons_are_killed_together_get_every_message_and_one_warning(
        pg_url: str, pg_admin_url: str, secret: str, caplog: pytest.LogCaptureFixture) -> None:
    """Several clients past their share read on from history; their reads wait behind a lock and
    every backend is killed (as in a failover): each gets every message once, in order, without
    `reset`, and the server says the failed reads once, not once per client."""
    caplog.set_level(logging.INFO, logger="livepush")
    served = await start_served(make_settings("postgres", secret, pg_url, None))
    topic = "room:killed-read-ons"
    clients = 4
    try:
        slow, sent = await paused_clients(served, topic, clients, 600)
        locker = await psycopg.AsyncConnection.connect(pg_url)
        try:
            await locker.execute("LOCK TABLE livepush_messages IN ACCESS EXCLUSIVE MODE")
            reads = [asyncio.ensure_future(frames_read(sub, len(sent))) for sub in slow]
            for sub in slow:
                sub.ws.transport.resume_reading()
            dbname, locker_pid = services.dbname_of(pg_url), locker.info.backend_pid
            await async_wait_for(
                lambda: asyncio.to_thread(lambda: len(backends_waiting_for_a_lock(pg_admin_url, dbname,
                                                                                  but=locker_pid)) >= clients),
                10, message="every read-on's read to wait for the log")
            for pid in await asyncio.to_thread(backends_waiting_for_a_lock, pg_admin_url, dbname, but=locker_pid):
                await asyncio.to_thread(terminate, pg_admin_url, pid)
            await async_wait_for(lambda: warnings_with(caplog, "could not read on from the history"), 10,
                                 message="the read-ons to fail")
            await locker.rollback()
        finally:
            await locker.close()
        for read in reads:
            assert await asyncio.wait_for(read, 40) == sent, "every message once, in order, no reset"
        said = warnings_with(caplog, "could not read on from the history")
        assert len(said) == 1, said
        for sub in slow:
            await sub.close()
    finally:
        await served.stop()


IDLE = 2.0  # seconds: the fan-outs' idle time in the tests below (a day in production)


async def watched(fanout: FanOut, topics: list[str]) -> tuple[Hub, dict[str, Sub]]:
    """A hub on `fanout` listening, and a subscriber of each of `topics` (subscribed from now)."""
    hub = Hub(fanout, fan)
    await fanout.listen()
    fanout.register(hub.on_message)
    subs = {topic: Sub() for topic in topics}
    for topic, sub in subs.items():
        await hub.subscribe(sub, topic, None, 1)
    return hub, subs


def delivered_or_reset(sub: Sub, published: list[str]) -> None:
    """What `sub` got after its `subscribed`: messages in order, none twice and none not published,
    each one of `published`; without a `reset`, every one of them."""
    frames = sub.frames[1:]
    offsets = [f["offset"] for f in frames if f["op"] == "message"]
    assert len(offsets) == len(set(offsets)), frames
    assert set(offsets) <= set(published), frames
    assert offsets == sorted(offsets, key=offset_key), frames
    if not any(f["op"] == "reset" for f in frames):
        assert offsets == published, frames  # no reset: nothing may be missing


async def delivered_at_last(fanout: FanOut, subs: dict[str, Sub], published: dict[str, list[str]],
                            topics: list[str]) -> None:
    """Publish on each of `topics` until a message reaches its subscriber as a message (one
    published before a `reset` the hub read the topic's latest offset for is covered by it, not
    sent), recording each offset in `published`."""
    for topic in topics:
        for attempt in range(5):
            published[topic].append(await fanout.apublish(topic, {"attempt": attempt}))
            with contextlib.suppress(AssertionError):
                await async_wait_for(lambda: subs[topic].frames[-1].get("offset") == published[topic][-1], 5,
                                     message=f"the message on {topic}")
                break
        else:
            raise AssertionError(f"{topic}: no message reached its subscriber: {subs[topic].frames}")


@pytest.mark.parametrize("published_before", [True, False], ids=["chain", "origin"])
async def test_a_kept_topic_whose_postgres_is_down_past_the_idle_time_gets_its_next_message_or_reset(
        pg_url: str, published_before: bool, caplog: pytest.LogCaptureFixture) -> None:
    """A topic watched all along (its last message before the outage, or none: its cursor an
    origin) while Postgres is down for longer than the idle time, so that its keeps fail and the
    log may forget it before the next keep: its subscriber gets the next message, or `reset` and
    then the next message, never a wrong or duplicated one; the failed keeps are said once."""
    caplog.set_level(logging.INFO, logger="livepush")
    fanout = PostgresFanOut(pg_url, history_ttl=IDLE / 2, idle_expire=IDLE)
    topic = "kept:pg"
    hub, subs = await watched(fanout, [topic])
    try:
        published = [await fanout.apublish(topic, {"n": 0})] if published_before else []
        await async_wait_for(lambda: len(subs[topic].frames) > len(published), 10, message="the first message")
        async with postgres_down():
            await asyncio.sleep(IDLE * 1.5)  # the outage: time passing, nothing to await
        await async_wait_for(lambda: fanout.listening, 20, message="the listener to come back")
        for _ in range(3):
            await fanout.prune()  # what every server does meanwhile
            await asyncio.sleep(0.3)
        await delivered_at_last(fanout, subs, {topic: published}, [topic])
        delivered_or_reset(subs[topic], published)
        said = warnings_with(caplog, "could not keep the history")
        assert len(said) <= 1, said
    finally:
        await hub.aclose()
        await fanout.aclose()


@pytest.mark.parametrize("save", [True, False], ids=["persistent", "no-persistence"])
async def test_thousands_of_kept_redis_topics_through_a_restart_past_the_idle_time_get_their_next_message_or_reset(
        private_redis: PrivateRedis, save: bool, caplog: pytest.LogCaptureFixture) -> None:
    """2,000 watched topics (kept in batches), some published before, while Redis is down for
    longer than the idle time (with persistence its keys expire meanwhile; without, all is
    lost): each subscriber gets its topic's next messages, or `reset` and then them, never a wrong
    or duplicated one; the failed keeps and reads are said once each."""
    caplog.set_level(logging.INFO, logger="livepush")
    fanout = RedisFanOut(private_redis.url, history_ttl=IDLE / 2, idle_expire=IDLE)
    names = [f"many:{i}" for i in range(2000)]
    hub, subs = await watched(fanout, names)
    try:
        published: dict[str, list[str]] = {name: [] for name in names}
        for name in names[::100]:
            published[name].append(await fanout.apublish(name, {"before": True}))
        await async_wait_for(lambda: all(len(subs[n].frames) > len(published[n]) for n in names[::100]), 10,
                             message="the messages before the outage")
        await asyncio.to_thread(private_redis.stop, save=save)
        await asyncio.sleep(IDLE * 1.5)  # the outage: time passing, nothing to await
        await asyncio.to_thread(private_redis.start)
        await async_wait_for(lambda: fanout.listening, 20, message="the listener to come back")
        await fanout.prune()
        picked = names[::100] + names[1::100]
        for round_ in range(2):
            for name in picked:
                published[name].append(await fanout.apublish(name, {"after": round_}))
        await delivered_at_last(fanout, subs, published, picked)
        for name in picked:
            delivered_or_reset(subs[name], published[name])
        for words in ("could not keep the history", "could not read the history"):
            said = warnings_with(caplog, words)
            assert len(said) <= 1, said
    finally:
        await hub.aclose()
        await fanout.aclose()


async def test_pages_subscribing_in_a_burst_after_a_server_restart_are_kept_together_within_a_second(
        pg_url: str, secret: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A server restarts and 20 pages resubscribe at once to 100 topics each, whose rows were last
    touched most of an idle time ago: the server keeps all 2,000 in about one call a second while
    they come (each one statement: up to 5,000 topics), not one call per topic. (How many seconds
    the subscribes take depends on the machine's load, so the calls are counted against them.)"""
    calls: list[int] = []
    keep = PostgresFanOut.keep_chains

    async def counted(self: PostgresFanOut, topics: Sequence[str]) -> None:
        calls.append(len(topics))
        await keep(self, topics)

    monkeypatch.setattr(PostgresFanOut, "keep_chains", counted)
    names = [f"burst:{i}" for i in range(2000)]
    first = await start_served(make_settings("postgres", secret, pg_url, None))
    try:
        await first.fanout.apublish_many([(name, {"n": 1}) for name in names])
    finally:
        await first.stop()
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute("UPDATE livepush_topics SET touched_at = now() - interval '23 hours'")
    served = await start_served(make_settings("postgres", secret, pg_url, None))
    pages: list[WSClient] = []
    try:
        pages = [await WSClient.open(served.url) for _ in range(20)]

        async def subscribe_all(page: WSClient, topics: list[str]) -> None:
            for topic in topics:
                assert (await page.subscribe(served.sign(topic)))["op"] == "subscribed"

        began = asyncio.get_running_loop().time()
        await asyncio.gather(*(subscribe_all(page, names[i::20]) for i, page in enumerate(pages)))

        def stale() -> int:
            with psycopg.connect(pg_url, autocommit=True) as conn:
                row = conn.execute("SELECT count(*) FROM livepush_topics "
                                   "WHERE touched_at < now() - interval '1 hour'").fetchone()
            return int(row[0]) if row else -1

        await async_wait_for(lambda: asyncio.to_thread(lambda: stale() == 0), 5, message="every topic to be kept")
        seconds = asyncio.get_running_loop().time() - began
        assert sum(calls) == len(names) and len(calls) <= seconds + 2, (calls, seconds)
    finally:
        for page in pages:
            await page.close()
        await served.stop()


async def frames_upto_reset(client: WSClient, count: int, timeout: float = 30.0) -> tuple[list[str], bool]:
    """The offsets of the next `count` message frames, or of those before a `reset`; and whether
    one came."""
    got: list[str] = []
    while len(got) < count:
        frame = await client.recv(timeout=timeout)
        if frame["op"] == "reset":
            return got, True
        assert frame["op"] == "message", (frame, len(got))
        got.append(frame["offset"])
    return got, False


async def live_again(served: Served, client: WSClient, topic: str) -> None:
    """Publish on `topic` until a message reaches `client` as a message; before it only `reset`s
    may come (one for which the server read the topic's latest offset after a publish covers it)."""
    for attempt in range(3):
        offset = await served.publish(topic, {"attempt": attempt})
        with contextlib.suppress(TimeoutError):
            while (frame := await client.recv(timeout=3)).get("offset") != offset:
                assert frame["op"] == "reset", frame  # of this topic or another the page watches
            return
    raise AssertionError(f"no message on {topic} reached the client")


@pytest.mark.parametrize("mode", ["fast", "immediate"])
async def test_a_postgres_restart_while_a_client_reads_on_and_the_server_keeps_its_topics(
        mode: str, pg_url: str, secret: str, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    """Postgres restarts while a client past its share reads on from history and the server keeps
    the chains of 500 watched topics (every half second here): the slow client gets every message
    once, in order, without `reset` (after a crash, which empties the log: those it was sent
    before, in order, then `reset`); then its next message, and the pages watching the other
    topics theirs (after a crash, `reset` first); the failed reads and keeps are each said at
    most once."""
    caplog.set_level(logging.INFO, logger="livepush")
    monkeypatch.setattr(hub, "KEEP_SHARE", 0.5 / IDLE_EXPIRE)
    served = await start_served(make_settings("postgres", secret, pg_url, None))
    names = [f"watched:{i}" for i in range(500)]
    pages: list[WSClient] = []
    try:
        pages = [await WSClient.open(served.url) for _ in range(5)]
        for i, page in enumerate(pages):
            for topic in names[i::5]:
                assert (await page.subscribe(served.sign(topic)))["op"] == "subscribed"
        slow, sent = await paused_clients(served, "room:slow", 1, 600)
        async with postgres_down(mode):
            reads = [asyncio.ensure_future(frames_upto_reset(sub, len(sent))) for sub in slow]
            for sub in slow:
                sub.ws.transport.resume_reading()
            # The outage: time passing (the reads and keeps under way wait for the pool meanwhile).
            await asyncio.sleep(2)
        await async_wait_for(lambda: served.fanout.listening, 20, message="the listener to come back")
        for read in reads:
            got, reset = await asyncio.wait_for(read, 40)
            assert got == (sent[:len(got)] if mode == "immediate" else sent), "in order, none twice"
            assert reset == (mode == "immediate" and len(got) < len(sent))
        for sub in [*slow, *pages]:
            await live_again(served, sub, "room:slow" if sub in slow else names[pages.index(sub)])
        for words in ("could not keep the history", "could not read on from the history",
                      "could not read the history"):
            said = warnings_with(caplog, words)
            assert len(said) <= 1, said
        for sub in slow:
            await sub.close()
    finally:
        for page in pages:
            await page.close()
        await served.stop()


async def test_a_client_reading_on_through_a_redis_restart_that_lost_everything_gets_reset_never_an_old_message(
        private_redis: PrivateRedis, secret: str) -> None:
    """A client past its share reads on from history while Redis restarts without persistence
    (history and origins lost): it gets the messages it was sent before, in order, then `reset`,
    then only messages published after it."""
    served = await start_served(make_settings("redis", secret, None, private_redis.url))
    try:
        (slow,), sent = await paused_clients(served, "room:lost", 1, 600)
        await asyncio.to_thread(private_redis.stop, save=False)
        read = asyncio.ensure_future(frames_upto_reset(slow, len(sent)))
        slow.ws.transport.resume_reading()
        await asyncio.sleep(1)  # the outage: time passing, nothing to await
        await asyncio.to_thread(private_redis.start)
        got, reset = await asyncio.wait_for(read, 40)
        assert got == sent[:len(got)], "in order, none twice"
        assert reset or got == sent
        await async_wait_for(lambda: served.fanout.listening, 20, message="the listener to come back")
        await live_again(served, slow, "room:lost")
        await slow.close()
    finally:
        await served.stop()


async def test_a_client_reading_on_through_a_postgres_restart_while_past_its_frame_budget_gets_everything(
        pg_url: str, secret: str) -> None:
    """A client past its share reads on from history while Postgres restarts, and meanwhile sends
    pings worth three frame budgets (the server stops reading it for a while): it gets every
    message once, in order, without `reset`, every pong in order, and stays connected."""
    served = await start_served(make_settings("postgres", secret, pg_url, None))
    try:
        (slow,), sent = await paused_clients(served, "room:budget", 1, 600)
        pings = 3 * int(limits.FRAME_BUDGET_SECONDS * limits.FRAMES_PER_SECOND)
        messages: list[str] = []
        pongs: list[int] = []
        pauses = metrics.FRAME_BUDGET_PAUSES._value.get()

        async def read_all() -> None:
            while len(messages) < len(sent) or len(pongs) < pings:
                frame = await slow.recv(timeout=30)
                if frame["op"] == "pong":
                    pongs.append(frame["ref"])
                else:
                    assert frame["op"] == "message", frame
                    messages.append(frame["offset"])

        async with postgres_down():
            reading = asyncio.ensure_future(read_all())
            slow.ws.transport.resume_reading()
            for ref in range(pings):
                await slow.send({"op": "ping", "ref": ref})
            await asyncio.sleep(1)  # the outage: time passing, nothing to await
        await asyncio.wait_for(reading, 60)
        assert messages == sent, "every message once, in order, no reset"
        assert pongs == list(range(pings))
        assert metrics.FRAME_BUDGET_PAUSES._value.get() > pauses, "the budget never held its reads back"
        assert not server_side(served.server, slow).closing
        await slow.close()
    finally:
        await served.stop()


@pytest.fixture
def short_retry_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    """The hub's retry bound 1 s, its reads tried again every 0.1 s, so that a test of the bound
    takes a second rather than 20."""
    monkeypatch.setattr(hub, "READ_ON_RETRY_SECONDS", 1.0)
    monkeypatch.setattr(hub, "READ_RETRY_SECONDS", 0.1)


@contextlib.asynccontextmanager
async def pool_held(pools: LoopPools) -> AsyncIterator[None]:
    """Inside the block every connection of this loop's pool of `pools` is taken, as while
    Postgres restarts, so a read waits for one (psycopg_pool waits up to 30 s); given back after
    it, whatever happens, before the pool is closed."""
    pool = await pools.aget()
    held: list[psycopg.AsyncConnection] = []
    try:
        for _ in range(pool.max_size):
            held.append(await pool.getconn())
        yield
    finally:
        for conn in held:
            await pool.putconn(conn)


@pytest.mark.usefixtures("short_retry_bound")
async def test_a_replay_whose_reads_wait_for_a_pool_that_never_frees_gets_reset_within_the_bound(pg_url: str) -> None:
    """A client resumes with `since`; after its `subscribed` and first page, every connection of
    the server's pool is held (as while Postgres restarts: psycopg_pool waits up to 30 s for one):
    the replay's next read waits only the time left of the retry bound, counted from when that
    read began, so the client gets `reset` within the bound, not after the pool's own wait."""
    fanout = PostgresFanOut(pg_url)
    topic = "room:pool-held"
    since = await fanout.alatest_offset(topic)
    await fanout.apublish_many([(topic, n) for n in range(HISTORY_PAGE)])
    await fanout.apublish(topic, HISTORY_PAGE)  # two pages: the replay reads again between them
    the_hub, _ = await watched(fanout, [])
    sub = SlowReader()
    loop = asyncio.get_running_loop()
    try:
        subscribe = asyncio.ensure_future(the_hub.subscribe(sub, topic, since, 1))
        await async_wait_for(lambda: len(sub.frames) == 1 + HISTORY_PAGE, 10, message="the first page")
        async with pool_held(fanout._pools):
            began = loop.time()
            sub.reading.set()
            await asyncio.wait_for(subscribe, 10)
            took = loop.time() - began
    finally:
        await the_hub.aclose()
        await fanout.aclose()
    assert [f["op"] for f in sub.frames] == ["subscribed", *["message"] * HISTORY_PAGE, "reset"]
    assert took < hub.READ_ON_RETRY_SECONDS + 1.0, took


@pytest.mark.usefixtures("short_retry_bound")
@pytest.mark.parametrize("resumes", [False, True], ids=["from-now", "with-since"])
async def test_a_subscribe_whose_reads_wait_for_a_pool_that_never_frees_is_refused_within_the_bound(
        pg_url: str, resumes: bool) -> None:
    """A client subscribes to a topic new to the server (from now, or with `since`) while every
    connection of the server's pool is held (as while Postgres restarts: psycopg_pool waits up to
    30 s for one): the reads before its `subscribed` share the retry bound from the subscribe's
    start, so it is refused (`unavailable`: the subscribe raises DependencyError) within the
    bound, before the client's liveness check gives up on it, not after the pool's own waits.
    A second subscriber joining the same anchor read meanwhile is refused with it."""
    fanout = PostgresFanOut(pg_url)
    topic = "room:pool-held-subscribe"
    since = await fanout.alatest_offset(topic) if resumes else None
    the_hub, _ = await watched(fanout, [])
    first, second = Sub(), Sub()
    loop = asyncio.get_running_loop()
    try:
        async with pool_held(fanout._pools):
            began = loop.time()
            subscribes = [asyncio.ensure_future(the_hub.subscribe(sub, topic, since, 1)) for sub in (first, second)]
            answers = await asyncio.wait_for(asyncio.gather(*subscribes, return_exceptions=True), 10)
            took = loop.time() - began
    finally:
        await the_hub.aclose()
        await fanout.aclose()
    assert all(isinstance(a, DependencyError) for a in answers), answers
    assert first.frames == second.frames == []
    assert took < hub.READ_ON_RETRY_SECONDS + 1.0, took


@pytest.mark.usefixtures("short_retry_bound")
async def test_a_state_topic_subscribe_whose_read_waits_for_a_pool_that_never_frees_is_refused_within_the_bound(
        pg_url: str) -> None:
    """As for a message topic: a subscribe to `job:<id>` while every connection of the states'
    pool is held (as while Postgres restarts) is refused (`unavailable`) within the retry bound from
    the subscribe's start, before the client's liveness check gives up on it, not after the pool's
    own 30 s wait."""
    fanout = PostgresFanOut(pg_url)
    states = JobStates(pg_url)
    the_hub = Hub(fanout, fan, states=[states])
    await states.read(["job:1"])  # the pool is open: what follows waits for one of its connections
    sub = Sub()
    loop = asyncio.get_running_loop()
    try:
        async with pool_held(states._pools):
            began = loop.time()
            with pytest.raises(DependencyError):
                await asyncio.wait_for(the_hub.subscribe(sub, "job:1", None, 1), 10)
            took = loop.time() - began
    finally:
        await the_hub.aclose()
        await states.aclose()
        await fanout.aclose()
    assert sub.frames == []
    assert took < hub.READ_ON_RETRY_SECONDS + 1.0, took
