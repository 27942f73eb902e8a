"""Redis fan-out through a real server: a Redis restart while clients stay subscribed."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import pytest
import redis

from livepush.fanout.redis import RedisFanOut
from livepush.server import hub
from livepush.server.hub import Hub
from tests.server.conftest import Served, make_settings, start_served
from tests.server.test_slow_clients import offsets_read, paused_past_its_share, server_side
from tests.support.waiting import async_wait_for
from tests.support.wsclient import WSClient
from tests.test_fanout_conformance import PrivateRedis, private_redis  # noqa: F401  (a fixture)
from tests.server.test_hub import Sub, fan
from tests.server.test_postgres_delivery import waiting_inside_a_replay
from tests.server.test_server import http_get


@contextlib.asynccontextmanager
async def listening_hub(redis_url: str, **options: Any) -> AsyncIterator[tuple[RedisFanOut, Hub]]:
    """A hub fed by a Redis fan-out that listens, both closed after."""
    fanout = RedisFanOut(redis_url, **options)
    hub = Hub(fanout, fan)
    try:
        await fanout.listen()
        fanout.register(hub.on_message)
        yield fanout, hub
    finally:
        await hub.aclose()
        await fanout.aclose()


@pytest.mark.parametrize("persistent", [True, False], ids=["persistent", "no-persistence"])
async def test_redis_restart_while_clients_stay_subscribed(private_redis: PrivateRedis, secret: str, persistent: bool) -> None:
    """/healthz is 503 while Redis is down; once the listener is back, messages published after
    it arrive. With persistence the client misses nothing and gets no reset; without it, the
    lost history is announced with `reset`, never a silent hole, and every message published
    after the reset arrives live."""
    served = await start_served(make_settings("redis", secret, None, private_redis.url))
    try:
        client = await WSClient.open(served.url)
        await client.subscribe(served.sign("stay"))
        await served.publish("stay", {"i": 0})
        assert (await client.messages(1))[0]["data"] == {"i": 0}

        await asyncio.to_thread(private_redis.stop, save=persistent)
        await async_wait_for(lambda: not served.fanout.listening, 20, message="the listener to notice Redis is gone")
        assert (await http_get(served.server.port, "/healthz"))[0] == 503
        await asyncio.to_thread(private_redis.start)
        await async_wait_for(lambda: served.fanout.listening, 20, message="the listener to come back")
        assert (await http_get(served.server.port, "/healthz"))[0] == 200

        frames = []
        if not persistent:
            # The resync's read finds the history gone and says so by itself. A message published
            # before that reset goes out is covered by the refetch it asks for, not sent live
            # (docs/reference.md §5, reset): the messages that must all arrive are the ones after it.
            frames.append(await client.recv(timeout=10))
        for i in range(1, 6):
            await served.publish("stay", {"i": i})
        while len([f for f in frames if f["op"] == "message"]) < 5:
            frames.append(await client.recv(timeout=10))
        ops = [f["op"] for f in frames]
        if persistent:
            assert ops == ["message"] * 5
        else:
            assert ops == ["reset"] + ["message"] * 5
        assert [f["data"]["i"] for f in frames if f["op"] == "message"] == [1, 2, 3, 4, 5]
        await client.close()
    finally:
        await served.stop()


@pytest.mark.parametrize("published_after", [False, True], ids=["quiet-after", "published-after"])
@pytest.mark.parametrize("persistent", [True, False], ids=["persistent", "no-persistence"])
async def test_a_page_that_rendered_an_origin_resumes_through_a_redis_restart_whole_or_reset(
        private_redis: PrivateRedis, secret: str, persistent: bool, published_after: bool) -> None:
    """A page renders a topic's origin; messages are published while it is away, then Redis
    restarts (and perhaps a message follows). Through the server the page gets every message
    it missed when Redis kept them, and `reset` when it lost them: never only what came after."""
    served = await start_served(make_settings("redis", secret, None, private_redis.url))
    try:
        rendered = await served.fanout.alatest_offset("rendered")
        missed = [await served.publish("rendered", {"i": i}) for i in range(2)]
        await asyncio.to_thread(private_redis.stop, save=persistent)
        await async_wait_for(lambda: not served.fanout.listening, 20, message="the listener to notice Redis is gone")
        await asyncio.to_thread(private_redis.start)
        await async_wait_for(lambda: served.fanout.listening, 20, message="the listener to come back")
        after = [await served.publish("rendered", {"i": 2})] if published_after else []
        client = await WSClient.open(served.url)
        await client.subscribe(served.sign("rendered"), since=rendered)
        if persistent:
            frames = await client.messages(len(missed + after))
            assert [(f["op"], f["offset"]) for f in frames] == [("message", o) for o in missed + after]
        else:
            assert (await client.recv(timeout=10))["op"] == "reset", f"replayed without the lost {missed}"
        await client.close()
    finally:
        await served.stop()

async def test_a_topic_whose_history_redis_evicted_resets_its_subscribers_and_the_server_says_why(
        redis_url: str, caplog: pytest.LogCaptureFixture) -> None:
    """A Redis with an evicting maxmemory-policy drops a watched topic's stream between two
    messages (DEL does what the eviction does): its subscribers get `reset`, never the next
    message as if nothing were missing, and the server says in a WARNING which topic's history
    broke and what may have broken it, where before only the resets metric showed it."""
    async with listening_hub(redis_url) as (fanout, hub):
        sub = Sub()
        await hub.subscribe(sub, "evicted:a", None, 1)
        first = await fanout.apublish("evicted:a", {"i": 0})
        await async_wait_for(lambda: len(sub.frames) == 2, 10, message="the first message")
        redis.Redis.from_url(redis_url).delete(fanout.key_prefix + "evicted:a")
        await fanout.apublish("evicted:a", {"i": 1})
        await async_wait_for(lambda: len(sub.frames) == 3, 10, message="the reset")
    assert sub.frames[2]["op"] == "reset", sub.frames
    said = [r.getMessage() for r in caplog.records if r.levelname == "WARNING" and "'evicted:a'" in r.getMessage()]
    assert len(said) == 1 and first in said[0] and "evict" in said[0], said


async def test_a_topic_anchored_on_an_origin_that_moved_on_gets_its_first_message_without_a_reset(
        redis_url: str) -> None:
    """A subscriber joins a topic nothing was published on, so the hub's cursor is the origin;
    the origin moves on (every half idle time) before the topic's first message, which links to
    the new one: the subscriber gets that message live, not a reset."""
    async with listening_hub(redis_url, history_ttl=0.1, idle_expire=4) as (fanout, hub):
        sub = Sub()
        await hub.subscribe(sub, "anchored:a", None, 1)
        [subscribed] = sub.frames

        async def moved_on() -> bool:
            return await fanout.alatest_offset("anchored:never") != subscribed["offset"]

        await async_wait_for(moved_on, 10, message="the origin to move on")
        offset = await fanout.apublish("anchored:a", {"i": 0})
        await async_wait_for(lambda: len(sub.frames) > 1, 10, message="the first message")
        assert [(f["op"], f.get("offset")) for f in sub.frames[1:]] == [("message", offset)]


async def test_messages_published_while_the_servers_redis_listener_is_away_reach_a_client_that_stayed(
        private_redis: PrivateRedis, secret: str) -> None:
    """Redis drops the server's pub/sub connection and refuses it for a while (its password
    changed), while publishes go on through connections it already holds: nobody hears them
    live. Once the listener is back, the client that stayed connected gets every one of them
    from the history, in order, once, with no reset (Redis lost nothing), then the live stream."""
    served = await start_served(make_settings("redis", secret, None, private_redis.url))
    admin = redis.Redis.from_url(private_redis.url)
    try:
        client = await WSClient.open(served.url)
        await client.subscribe(served.sign("away"))
        await served.publish("away", {"i": 0})
        assert [m["data"]["i"] for m in await client.messages(1)] == [0]
        admin.config_set("requirepass", "rotated-pw")  # connections already open stay authenticated
        try:
            admin.client_kill_filter(_type="pubsub")
            await async_wait_for(lambda: not served.fanout.listening, 10, message="the listener to notice its loss")
            for i in range(1, 6):
                await served.publish("away", {"i": i})
        finally:
            admin.config_set("requirepass", "")
        await async_wait_for(lambda: served.fanout.listening, 20, message="the listener to come back")
        await served.publish("away", {"i": 6})
        frames = [await client.recv(timeout=10) for _ in range(6)]
        assert [(f["op"], f["data"]["i"]) for f in frames] == [("message", i) for i in range(1, 7)], frames
        with pytest.raises(asyncio.TimeoutError):
            await client.recv(timeout=0.3)
        await client.close()
    finally:
        admin.close()
        await served.stop()


async def read_through_a_redis_restart(private_redis: PrivateRedis, client: WSClient, count: int, logged: str,
                                       caplog: pytest.LogCaptureFixture) -> list[str]:
    """The offsets of the next `count` messages `client` reads (its reads resumed, if paused), while
    Redis restarts with persistence: stopped before it reads, started again once `logged` (the
    server's read failed) is in the log."""
    await asyncio.to_thread(private_redis.stop, save=True)
    client.ws.transport.resume_reading()
    read = asyncio.ensure_future(offsets_read(client, count))
    await async_wait_for(lambda: logged in caplog.text or read.done(), 10, message="the read to fail while Redis is down")
    await asyncio.to_thread(private_redis.start)
    return await asyncio.wait_for(read, 30)


async def read_while_redis_stays_down(served: Served, private_redis: PrivateRedis, client: WSClient,
                                      topic: str) -> list[str]:
    """Redis stops while `client` has more of `topic` to read from history, and stays down until the
    client gets `reset`; returns the offsets of the messages it got before it. Once Redis is back,
    a message published on `topic` reaches the client, whose connection stays open."""
    await asyncio.to_thread(private_redis.stop, save=True)
    client.ws.transport.resume_reading()
    frames = []
    while not frames or frames[-1]["op"] != "reset":
        frames.append(await client.recv(timeout=10))
    await asyncio.to_thread(private_redis.start)
    await async_wait_for(lambda: served.fanout.listening, 20, message="the listener to come back")
    after = await served.publish(topic, {"after": True})
    while (frame := await client.recv(timeout=10)).get("offset") != after:
        assert frame["op"] in ("message", "reset"), frame
    assert not server_side(served.server, client).closing
    return [f["offset"] for f in frames[:-1]]


async def test_a_client_reading_on_from_history_through_a_redis_restart_gets_every_message_without_reset(
        private_redis: PrivateRedis, secret: str, caplog: pytest.LogCaptureFixture) -> None:
    """A client past its share reads on from history while Redis restarts (with persistence, so
    history still holds its place): the read-on's failed read is tried again, as a live read is,
    and the client gets every message, in order, none twice, and no `reset`."""
    served = await start_served(make_settings("redis", secret, None, private_redis.url))
    try:
        slow, sent = await paused_past_its_share(served, "room:restart-read-on", 600)
        got = await read_through_a_redis_restart(
            private_redis, slow, len(sent), "could not read on from the history of room:restart-read-on", caplog)
        assert got == sent, "every message once, in order, no reset"
        assert not server_side(served.server, slow).closing
        await slow.close()
    finally:
        await served.stop()


@pytest.fixture
async def redis_served(private_redis: PrivateRedis, secret: str):
    served = await start_served(make_settings("redis", secret, None, private_redis.url))
    try:
        yield served
    finally:
        await served.stop()


async def test_a_replay_through_a_redis_restart_goes_on_from_where_the_client_stands(
        redis_served: Served, private_redis: PrivateRedis, caplog: pytest.LogCaptureFixture) -> None:
    """A client resumes with `since`; after its `subscribed` and part of the replay, Redis restarts
    (with persistence, so history still holds the rest): the replay's failed read is tried again
    from the last message the client was sent, and the client gets every message once, in order,
    no `reset`, and keeps its connection (no 1011, no reconnect of its other subscriptions)."""
    topic = "room:restart-replay"
    client, sent = await waiting_inside_a_replay(redis_served, topic)
    got = await read_through_a_redis_restart(private_redis, client, len(sent), f"could not read the replay of {topic}",
                                             caplog)
    assert got == sent, "every message once, in order, no reset"
    await client.send({"op": "ping", "ref": "after"})
    assert await client.recv(timeout=10) == {"op": "pong", "ref": "after"}
    assert not server_side(redis_served.server, client).closing
    await client.close()


async def test_a_replay_while_redis_stays_down_gets_reset_after_the_bound(
        redis_served: Served, private_redis: PrivateRedis, monkeypatch: pytest.MonkeyPatch) -> None:
    """The same client, but Redis stays down past the retry bound: it gets `reset` (what it was
    sent before it comes first, in order, none twice), then the topic's messages live once Redis is
    back, on the same connection."""
    monkeypatch.setattr(hub, "READ_ON_RETRY_SECONDS", 1.0)
    client, sent = await waiting_inside_a_replay(redis_served, "room:down-replay")
    offsets = await read_while_redis_stays_down(redis_served, private_redis, client, "room:down-replay")
    assert 0 < len(offsets) < len(sent) and offsets == sent[:len(offsets)], "in order, none twice"
    await client.close()


async def test_a_client_reading_on_from_history_while_redis_stays_down_gets_reset_after_the_bound(
        private_redis: PrivateRedis, secret: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The same client, but Redis stays down past the read-on's retry bound: it gets `reset` (what
    it was sent before it comes first, in order), then the topic's messages live once Redis is back."""
    monkeypatch.setattr(hub, "READ_ON_RETRY_SECONDS", 1.0)
    served = await start_served(make_settings("redis", secret, None, private_redis.url))
    try:
        topic = "room:down-read-on"
        slow, sent = await paused_past_its_share(served, topic, 600)
        offsets = await read_while_redis_stays_down(served, private_redis, slow, topic)
        assert offsets == sent[:len(offsets)], "what came before the reset is in order, none twice"
        await slow.close()
    finally:
        await served.stop()
