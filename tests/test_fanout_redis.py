"""What only the Redis fan-out does: streams chained by `p`, Lua publish, trims, its own reconnects.

The shared contract is tested in test_fanout_conformance.py; these tests look inside Redis
(keys under the deployment's prefix, CLIENT LIST, PAUSE, restarts without persistence) to check
how it is kept. Keys and the channel are the fan-out's own: `fanout.key_prefix` + topic and
`fanout.channel`, both under `{fanout.prefix}` ("livepush:<db>" by default).
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import logging
import os
import re
import shutil
import signal
import socket
import subprocess
import threading
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

import livepush
from livepush.fanout import redis as fanout_redis
from livepush.fanout.base import MAX_PAYLOAD_BYTES, READ_AT_ONCE, READ_BYTES, History
from livepush.fanout.redis import CALL_TIMEOUT, FRAME_BYTES, PRUNE_SCAN_COUNT, RedisFanOut, parse_frames
from livepush.redis import client as redis_client
from livepush.redis.client import LoopClients, failed
from livepush.server.hub import Hub
from livepush.sessions.revocations import RedisRevocations
from livepush.types import offset_key
from tests.support.fanouts import WAIT, Collector, offsets_of, read_history, read_on_bounded
from tests.support.procs import fork_running, forked_exit_status, free_port
from tests.support.redis_acl import documented_user
from tests.support.services import process_gone
from tests.support.waiting import async_wait_for, wait_for
from tests.test_fanout_conformance import (  # noqa: F401  (private_redis is a fixture)
    PrivateRedis,
    private_redis,
    publish_from_child,
)

MakeRedis = Callable[..., Any]


@pytest.fixture
async def make_redis(redis_url: str) -> AsyncIterator[MakeRedis]:
    """Factory of RedisFanOut on the test Redis (or `url=`), each closed after the test."""
    made: list[RedisFanOut] = []

    async def make(*, listen: bool = True, url: str | None = None, **options: Any) -> RedisFanOut:
        fanout = RedisFanOut(url or redis_url, **options)
        made.append(fanout)
        if listen:
            await fanout.listen()
        return fanout

    yield make
    for fanout in made:
        await fanout.aclose()


@pytest.fixture
def raw(redis_url: str) -> Any:
    client = redis.Redis.from_url(redis_url, decode_responses=True)
    # Tests count the listener connections on the shared Redis: an earlier test's, closed by its
    # teardown, may still be listed for a moment on a loaded machine. (Made before this test's own.)
    wait_for(lambda: not listeners(client), 10, message="the listeners of earlier tests to close")
    yield client
    client.close()


@pytest.fixture
def raw_private(private_redis: PrivateRedis) -> Any:
    """A client of the test's private Redis, whose memory limit is put back before it stops."""
    client = redis.Redis.from_url(private_redis.url, decode_responses=True)
    yield client
    client.config_set("maxmemory", 0)
    client.close()


def listeners(client: redis.Redis) -> list[dict[str, Any]]:
    return [c for c in client.client_list() if c.get("name", "").startswith("livepush-listener:")]


# ---- offsets and the chain ----------------------------------------------------------------------


async def test_offsets_are_stream_ids_chained_from_the_deployments_origin(make_redis: MakeRedis, raw: redis.Redis) -> None:
    """Offsets are the stream's ids; each entry names its predecessor, and the first names the
    deployment's origin "0-EPOCH", which is also the offset of every topic never published."""
    fanout = await make_redis()
    got = Collector()
    fanout.register(got)
    origin = fanout.latest_offset("chain:a")
    assert origin == f"0-{raw.get(fanout.origin_key)}" and origin != "0-0"
    assert fanout.latest_offset("chain:never") == origin and await fanout.alatest_offset("chain:never") == origin
    offsets = [fanout.publish("chain:a", {"i": i}) for i in range(3)]
    assert offset_key(origin) < offset_key(offsets[0])
    received = await got.wait_count("chain:a", 3)
    assert [m.prev for m in received] == [origin, *offsets[:2]]
    assert fanout.prefix == "livepush:0" and fanout.key_prefix == "{livepush:0}:h:"
    assert fanout.origin_key == "{livepush:0}:origin"
    entries = raw.xrange(fanout.key_prefix + "chain:a")
    assert [e[0] for e in entries] == offsets
    assert [e[1]["p"] for e in entries] == [origin, *offsets[:2]]
    assert [json.loads(e[1]["d"]) for e in entries] == [{"i": i} for i in range(3)]


async def test_publish_survives_a_script_flush(make_redis: MakeRedis, raw: redis.Redis) -> None:
    """After SCRIPT FLUSH (or a restart) EVALSHA's NOSCRIPT is answered by loading the script again."""
    fanout = await make_redis(listen=False)
    first = fanout.publish("flush:a", {"i": 0})
    await fanout.apublish("flush:a", {"i": 1})
    raw.script_flush()
    second = fanout.publish("flush:a", {"i": 2})
    third = await fanout.apublish("flush:a", {"i": 3})
    assert offsets_of(await read_history(fanout, "flush:a", first))[1:] == [second, third]


async def test_history_is_none_when_the_chain_is_broken(make_redis: MakeRedis, raw: redis.Redis) -> None:
    """An entry missing in the middle (trimmed or lost) makes history from before it None, never a hole."""
    fanout = await make_redis()
    offsets = [fanout.publish("chain:b", {"i": i}) for i in range(5)]
    raw.xdel(fanout.key_prefix + "chain:b", offsets[2])
    assert await fanout.history("chain:b", offsets[0]) is None
    assert await fanout.history("chain:b", offsets[1]) is None
    assert offsets_of(await read_history(fanout, "chain:b", offsets[2])) == offsets[3:]


async def test_a_topic_whose_key_holds_no_stream_gets_reset_and_holds_up_no_other_topic(
        make_redis: MakeRedis, raw: redis.Redis) -> None:
    """Another type of value under a topic's key (written there by something else) is no history
    of that topic: its subscribers get `reset`, as for a malformed stream, and the read that the
    listener's resync makes of every watched topic at once delivers the others' messages."""
    fanout = await make_redis(prefix=f"wrongtype-{uuid.uuid4().hex}")  # no other test's prune meets the key
    frames: dict[str, list[dict[str, Any]]] = {"good": [], "bad": []}

    class Sub:
        def __init__(self, name: str) -> None:
            self.name = name

        def send(self, frame: str) -> None:
            frames[self.name].append(json.loads(frame))

        async def drain(self) -> None:
            """Reads everything as soon as it is sent."""

    def fan(subs: Any, frame: str, *_topic_and_kind: object) -> None:
        for sub in subs:
            sub.send(frame)

    hub = Hub(fanout, fan)
    fanout.register(hub.on_message)
    good, bad = f"wt:good:{uuid.uuid4().hex}", f"wt:bad:{uuid.uuid4().hex}"
    fanout.publish(bad, {"i": 0})
    await hub.subscribe(Sub("good"), good, None, 1)
    await hub.subscribe(Sub("bad"), bad, None, 2)
    raw.delete(fanout.key_prefix + bad)
    raw.set(fanout.key_prefix + bad, "not a stream")

    await hub.resync()  # as the listener does once it is back: every watched topic is read
    offset = fanout.publish(good, {"i": 1})
    await async_wait_for(lambda: any(f["op"] == "message" for f in frames["good"]), WAIT,
                         message="the good topic's message never came: the bad key's read held it up")
    assert [(f["offset"], f["data"]) for f in frames["good"] if f["op"] == "message"] == [(offset, {"i": 1})]
    await async_wait_for(lambda: any(f["op"] == "reset" for f in frames["bad"]), WAIT)
    assert await fanout.history(bad, "1-0") is None
    await hub.aclose()
    raw.delete(fanout.key_prefix + bad)


async def test_a_publish_on_a_topic_whose_key_holds_no_stream_says_what_wrote_there_not_that_redis_is_down(
        make_redis: MakeRedis, raw: redis.Redis) -> None:
    """Redis answered: its refusal of a key of another type names the prefix that something else
    writes under, never "check that Redis is running"."""
    fanout = await make_redis(listen=False, prefix=f"wrongtype-{uuid.uuid4().hex}")  # as above
    topic = f"wt:pub:{uuid.uuid4().hex}"
    raw.set(fanout.key_prefix + topic, "not a stream")
    for publish in (lambda: fanout.publish(topic, {"i": 1}), lambda: fanout.publish_many([(topic, {"i": 2})])):
        with pytest.raises(livepush.DependencyError) as caught:
            publish()
        said = str(caught.value)
        assert "is up" in said and "LIVEPUSH_REDIS_PREFIX" in said and repr(topic) in said, said
        assert repr(fanout.key_prefix + topic) in said and "the topic's history is lost" in said, said
        assert "Redis is running" not in said, said
    with pytest.raises(livepush.DependencyError, match="LIVEPUSH_REDIS_PREFIX"):
        await fanout.apublish(topic, {"i": 3})
    raw.delete(fanout.key_prefix + topic)


async def test_an_origin_key_of_another_type_is_named_in_every_error_and_warning(
        make_redis: MakeRedis, raw: redis.Redis, caplog: pytest.LogCaptureFixture) -> None:
    """A value of another type at `{P}:origin` made every publish of a new topic fail without
    naming that key, and history reads warn that the topic's key was no stream; and the advice
    said the topic's history would be lost with the key. Each names the origin key and what
    deleting it costs; a topic's key is named as before."""
    fanout = await make_redis(listen=False, prefix=f"wrongtype-{uuid.uuid4().hex}")  # as above
    topic = f"wt:origin:{uuid.uuid4().hex}"
    since = fanout.latest_offset(topic)
    raw.delete(fanout.origin_key)
    raw.rpush(fanout.origin_key, "not an origin")
    calls = {"publish": lambda: fanout.publish(topic, {"i": 1}),
             "publish_many": lambda: fanout.publish_many([(topic, {"i": 2})]),
             "latest_offset": lambda: fanout.latest_offset(topic)}
    for name, call in calls.items():
        with pytest.raises(livepush.DependencyError) as caught:
            call()
        said = str(caught.value)
        assert repr(fanout.origin_key) in said and "LIVEPUSH_REDIS_PREFIX" in said, (name, said)
        assert "history is lost" not in said and "new origin" in said, (name, said)
    for acall in (lambda: fanout.apublish(topic, {"i": 3}), lambda: fanout.alatest_offset(topic)):
        with pytest.raises(livepush.DependencyError, match=re.escape(repr(fanout.origin_key))):
            await acall()
    with caplog.at_level(logging.WARNING, logger="livepush.fanout.redis"):
        assert await fanout.history(topic, since) is None
    warned = [r.getMessage() for r in caplog.records if r.name == "livepush.fanout.redis"]
    assert len(warned) == 1 and repr(fanout.origin_key) in warned[0], warned
    assert repr(fanout.key_prefix + topic) not in warned[0], warned
    raw.delete(fanout.origin_key)
    assert fanout.publish(topic, {"i": 4})  # deleted, a new origin is made
    raw.delete(fanout.key_prefix + topic, f"{fanout.origin_key}:prev", fanout.origin_key)


async def test_a_revocation_key_of_another_type_is_named_with_advice_for_revocations(redis_url: str,
                                                                                     raw: redis.Redis) -> None:
    """A subject's revocation key holding another type of value failed revoke_subject() with the
    advice that "the topic's history is lost" with the key, which holds no history: the error
    names the key and says to revoke again once it is deleted."""
    store = RedisRevocations(redis_url, prefix=f"wrongtype-{uuid.uuid4().hex}")
    subject = f"user-{uuid.uuid4().hex}"
    key = store.subject_prefix + subject
    raw.rpush(key, "not a cut-off")
    try:
        with pytest.raises(livepush.DependencyError) as caught:
            store.add_subject(subject, 1.0)
        said = str(caught.value)
        assert repr(key) in said and "history" not in said and "revoke" in said.split(repr(key), 1)[1], said
        with pytest.raises(livepush.DependencyError, match=re.escape(repr(key))):
            await store.aadd_subject(subject, 1.0)
    finally:
        raw.delete(key)
        await store.aclose()


async def test_history_pages_through_long_replays(make_redis: MakeRedis) -> None:
    """A replay longer than one XRANGE page comes back whole and in order, page after page, the chain checked across pages."""
    fanout = await make_redis()
    origin = fanout.latest_offset("page:a")
    offsets = [fanout.publish("page:a", {"i": i}) for i in range(450)]
    assert offsets_of(await read_history(fanout, "page:a", origin)) == offsets


async def test_a_burst_of_reads_waits_for_connections_instead_of_failing(make_redis: MakeRedis) -> None:
    """1,000 latest-offset reads at once (a burst of subscribes to new topics) all answer: past
    the client's connections they wait their turn, never "Too many connections"."""
    fanout = await make_redis()
    fanout.publish("burst:0", {"i": 0})
    got = await asyncio.wait_for(asyncio.gather(*(fanout.alatest_offset(f"burst:{i}") for i in range(1000))), 30)
    assert got[0] is not None and len(got) == 1000


async def test_a_history_read_copies_about_a_page_not_the_next_1000_entries(
    make_redis: MakeRedis, private_redis: PrivateRedis
) -> None:
    """A history read is one script, and Redis serves nobody else while it runs. With 200
    messages of 1 MiB waiting, a page holds two of them: the read copies about that much, not
    the 200 MiB of entries that follow, so no read holds Redis for as long as a quarter second,
    and the replay still comes whole."""
    fanout = await make_redis(url=private_redis.url, listen=False)
    since = fanout.latest_offset("big:a")
    blob = "y" * (MAX_PAYLOAD_BYTES - 30)
    offsets = [fanout.publish("big:a", {"i": i, "p": blob}) for i in range(200)]
    admin = redis.Redis.from_url(private_redis.url)
    try:
        admin.config_set("slowlog-log-slower-than", 250_000)  # microseconds
        admin.slowlog_reset()
        page = await fanout.history("big:a", since)
        assert page is not None and offsets_of(page.messages) == offsets[:2] and page.more
        assert [entry["command"][:7] for entry in admin.slowlog_get()] == [], "a history read held Redis"
        assert offsets_of(await read_history(fanout, "big:a", since)) == offsets
    finally:
        admin.close()


async def test_a_read_of_many_topics_behind_by_large_messages_holds_a_bounded_amount_and_defers_the_rest(
        make_redis: MakeRedis) -> None:
    """One read of many topics that each missed messages near 1 MiB (what the server reads after a
    resync) holds a bounded amount of data, not a page of each topic at once, which was up to
    2 MiB per topic for the 500 topics of a batch; the topics past that bound come back as empty
    pages that say `more`, and reading on delivers every message once, in order."""
    fanout = await make_redis(listen=False)
    big = "x" * 900_000
    topics = [f"big:{i}" for i in range(3 * READ_AT_ONCE)]
    cursors = {topic: fanout.publish(topic, "small") for topic in topics}
    sent = {topic: [fanout.publish(topic, {"n": n, "pad": big}) for n in range(2)] for topic in topics}
    # Past the bound only the pages read with the one that crossed it: two messages each.
    got, reads = await read_on_bounded(fanout, cursors, READ_BYTES + READ_AT_ONCE * 2 * MAX_PAYLOAD_BYTES)
    assert got == sent
    assert reads > 1, "the topics did not all fit in one read"


async def test_concurrent_publishers_agree_on_one_order(make_redis: MakeRedis) -> None:
    """Two processes publishing on one topic at once: delivery order, offsets and history all
    agree, and each process's own messages keep its call order."""
    fanout = await make_redis()
    got = Collector()
    fanout.register(got)
    origin = fanout.latest_offset("race:a")
    a, b = await asyncio.gather(
        publish_from_child("redis", fanout.url, "race:a", 200),
        publish_from_child("redis", fanout.url, "race:a", 200),
    )
    received = await got.wait_count("race:a", 400)
    offsets = [m.offset for m in received]
    assert sorted(offsets, key=offset_key) == offsets
    assert set(offsets) == set(a) | set(b) and len(set(offsets)) == 400
    assert [m.prev for m in received] == [origin, *offsets[:-1]]
    assert offsets_of(await read_history(fanout, "race:a", origin)) == offsets
    for own in (a, b):
        mine = set(own)
        assert [o for o in offsets if o in mine] == own, "a process's messages arrive in its call order"


# ---- retention ----------------------------------------------------------------------------------


async def test_prune_drops_expired_entries_but_keeps_the_newest(make_redis: MakeRedis, raw: redis.Redis) -> None:
    """prune() drops entries past the TTL except a topic's newest, so since=latest replays nothing, not reset."""
    fanout = await make_redis(history_ttl=0.2)
    offsets = [fanout.publish("prune:a", {"i": i}) for i in range(3)]
    await asyncio.sleep(0.4)  # wall-clock expiry: no event to await
    assert await fanout.prune() == 2
    assert [e[0] for e in raw.xrange(fanout.key_prefix + "prune:a")] == offsets[-1:]
    assert await read_history(fanout, "prune:a", offsets[-1]) == []
    assert await fanout.history("prune:a", offsets[0]) is None
    assert fanout.latest_offset("prune:a") == offsets[-1]
    fresh = fanout.publish("prune:a", {"i": 3})
    assert offsets_of(await read_history(fanout, "prune:a", offsets[-1])) == [fresh]


async def test_a_topic_key_holding_no_stream_costs_prune_nothing_but_that_key(make_redis: MakeRedis,
                                                                             raw: redis.Redis) -> None:
    """A key of another type among a deployment's topic keys is passed over: prune() trims the
    others and returns, rather than fail every pass that meets it."""
    fanout = await make_redis(history_ttl=0.2, listen=False, prefix=f"wrongtype-{uuid.uuid4().hex}")
    offsets = [fanout.publish("prune:kept", {"i": i}) for i in range(3)]
    raw.set(fanout.key_prefix + "prune:other", "not a stream")
    try:
        await asyncio.sleep(0.4)  # wall-clock expiry: no event to await
        assert await fanout.prune() == 2
        assert [e[0] for e in raw.xrange(fanout.key_prefix + "prune:kept")] == offsets[-1:]
        assert raw.get(fanout.key_prefix + "prune:other") == "not a stream"
    finally:
        raw.delete(fanout.key_prefix + "prune:other")


async def test_prune_keeps_to_its_own_prefix_whatever_characters_it_holds(make_redis: MakeRedis) -> None:
    """LIVEPUSH_REDIS_PREFIX may hold any printable character but spaces and braces. prune() trims its own
    deployment's streams and never another's: a prefix with glob characters (`app[1]`) is not a
    pattern that matches deployment `app1`, whose history must outlive this one's shorter TTL."""
    ours = await make_redis(history_ttl=0.2, prefix="app[1]", listen=False)
    theirs = await make_redis(history_ttl=300, prefix="app1", listen=False)
    origin = theirs.latest_offset("shared:a")
    kept = [theirs.publish("shared:a", {"i": i}) for i in range(3)]
    expired = [ours.publish("shared:a", {"i": i}) for i in range(3)]
    await asyncio.sleep(0.4)  # wall-clock expiry: no event to await
    assert await ours.prune() == len(expired) - 1, "its own expired entries, all but the newest"
    assert offsets_of(await read_history(theirs, "shared:a", origin)) == kept, "another deployment's history was trimmed"


async def test_a_prefix_that_extends_another_shares_none_of_its_keys(make_redis: MakeRedis) -> None:
    """Deployments `prod` and `prod:h` on one Redis (one prefix is the other's, then the separator
    and a part of the key layout): neither's history shows the other's messages, and prune() of
    `prod`, with a shorter TTL, trims nothing of `prod:h`'s history."""
    outer = await make_redis(history_ttl=0.2, prefix="prod", listen=False)
    inner = await make_redis(history_ttl=300, prefix="prod:h", listen=False)
    origin = inner.latest_offset("room")
    kept = [inner.publish("room", {"i": i}) for i in range(3)]
    outer_origin = outer.latest_offset("h:room")
    assert outer_origin.startswith("0-") and await read_history(outer, "h:room", outer_origin) == [], \
        "deployment prod reads deployment prod:h's topic as one of its own"
    expired = [outer.publish("room", {"i": i}) for i in range(3)]
    await asyncio.sleep(0.4)  # wall-clock expiry: no event to await
    assert await outer.prune() == len(expired) - 1, "its own expired entries, all but the newest"
    assert offsets_of(await read_history(inner, "room", origin)) == kept, "another deployment's history was trimmed"


async def test_prune_does_bounded_work_per_call(make_redis: MakeRedis, raw: redis.Redis) -> None:
    """One prune() call visits about one SCAN batch of topics; repeated calls cover them all."""
    fanout = await make_redis(history_ttl=0.2, listen=False)
    topics = 3 * PRUNE_SCAN_COUNT
    for t in range(topics):
        fanout.publish(f"many:{t}", {"i": 0})
        fanout.publish(f"many:{t}", {"i": 1})
    await asyncio.sleep(0.4)
    first = await fanout.prune()
    assert 0 < first < topics, "one call trims a batch, not every topic"
    total, calls = first, 1
    while total < topics:
        total += await fanout.prune()
        calls += 1
        assert calls < 50, f"pruning never finished: {total} of {topics}"
    assert all(raw.xlen(fanout.key_prefix + f"many:{t}") == 1 for t in range(topics))


async def test_a_prune_cycle_reaches_topics_past_a_batch_with_nothing_to_drop(make_redis: MakeRedis,
                                                                                raw: redis.Redis) -> None:
    """A server calls prune() until a call drops nothing, every cycle: expired entries of topics
    that SCAN reaches only after batches of topics with nothing to drop are trimmed in that cycle
    all the same, not one batch of topics a cycle."""
    fanout = await make_redis(history_ttl=0.2, listen=False, prefix=f"prunecycle:{uuid.uuid4().hex[:8]}")
    topics = 5 * PRUNE_SCAN_COUNT
    for t in range(topics):
        fanout.publish(f"many:{t}", {"i": 0})  # a topic's newest entry is kept: nothing to drop
    batches, cursor = [], 0
    while True:  # the batches prune() sees, in its order
        cursor, keys = raw.scan(cursor, match=fanout.key_prefix + "*", count=PRUNE_SCAN_COUNT)
        if keys:
            batches.append(keys)
        if cursor == 0:
            break
    assert len(batches) > 1
    late = batches[-1]
    for key in late:
        fanout.publish(key.removeprefix(fanout.key_prefix), {"i": 1})
    await asyncio.sleep(0.4)  # past the TTL: each late topic has one entry to drop
    calls = 0
    while await fanout.prune():  # one cycle, as a server runs it
        calls += 1
        assert calls < 100
    assert all(raw.xlen(key) == 1 for key in late), "the late topics' expired entries are still there"


async def test_a_message_stays_recoverable_for_the_servers_history_ttl_whatever_the_publishers_is(
        make_redis: MakeRedis) -> None:
    """The history is kept for the servers' LIVEPUSH_HISTORY_TTL, as on Postgres: a web process
    left at the default 300 s publishing after more than its own TTL trims nothing that a server
    keeping an hour still promises (it trimmed whole radix nodes of older entries, and every
    client away longer than the publisher's TTL got `reset`)."""
    server = await make_redis(history_ttl=3600, listen=False)
    app = await make_redis(history_ttl=0.1, listen=False)
    origin = server.latest_offset("ttlgov:a")
    early = app.publish_many([("ttlgov:a", {"i": i}) for i in range(300)])  # three radix nodes
    await asyncio.sleep(0.3)  # past the publisher's TTL by the clock: no event to await
    later = app.publish("ttlgov:a", {"i": 300})
    assert await server.prune() == 0, "nothing is past the server's TTL"
    assert offsets_of(await read_history(server, "ttlgov:a", origin)) == [*early, later]


async def test_an_idle_topic_is_kept_for_the_servers_idle_time_whatever_the_publishers_is(
        make_redis: MakeRedis, raw: redis.Redis) -> None:
    """A topic is forgotten once idle for the servers' idle time (twice their TTL when that is
    longer than a day), not for the shorter one of a process that only publishes: its messages
    stay recoverable for the servers' TTL after it goes quiet."""
    server = await make_redis(history_ttl=10, idle_expire=30, listen=False)
    # Redis's clock runs on while this process waits for a core: at 0.5 s the key was gone before
    # the server's prune came to it on a loaded machine. 2 s leaves that time, at 1.5 s more a run.
    app = await make_redis(history_ttl=0.1, idle_expire=2.0, listen=False)
    sent = [app.publish("idlegov:a", {"i": i}) for i in range(3)]
    assert raw.pttl(app.key_prefix + "idlegov:a") <= 2_000
    assert await server.prune() == 0
    assert raw.pttl(app.key_prefix + "idlegov:a") > 20_000, "the server's prune keeps it for its own idle time"
    await asyncio.sleep(2.2)  # past the publisher's idle time by the clock: no event to await
    assert offsets_of(await read_history(server, "idlegov:a", sent[0])) == sent[1:]


async def test_max_len_bounds_a_busy_topic_and_resets_beyond_it(make_redis: MakeRedis, raw: redis.Redis) -> None:
    """A topic past max_len keeps about max_len entries; older offsets get None, recent ones replay."""
    fanout = await make_redis(max_len=100, listen=False)
    offsets = [fanout.publish("busy:a", {"i": i}) for i in range(1000)]
    assert raw.xlen(fanout.key_prefix + "busy:a") < 400
    assert await fanout.history("busy:a", offsets[0]) is None
    assert offsets_of(await read_history(fanout, "busy:a", offsets[-51])) == offsets[-50:]



async def test_a_busy_topic_keeps_at_least_its_newest_10000_messages(make_redis: MakeRedis) -> None:
    """The memory bound trims a topic to about its newest 10,000 entries, never fewer
    (docs/guarantees.md): a client whose next message is among the newest 10,000 replays all of
    them, however many more were published before."""
    fanout = await make_redis(listen=False)
    offsets = fanout.publish_many([("kept:busy", {"i": i}) for i in range(12_000)])
    since = offsets[-10_001]  # the newest 10,000 come after it
    assert offsets_of(await read_history(fanout, "kept:busy", since)) == offsets[-10_000:]

async def test_idle_topic_key_expires(make_redis: MakeRedis, raw: redis.Redis) -> None:
    """Each publish sets the topic's key to expire after idle_expire, so dead topics free their memory."""
    fanout = await make_redis(listen=False, history_ttl=10, idle_expire=60)
    fanout.publish("idle:a", {"i": 0})
    assert 0 < raw.pttl(fanout.key_prefix + "idle:a") <= 60_000


async def test_a_topic_redis_forgot_reads_as_never_published_and_its_old_offsets_get_reset(
        make_redis: MakeRedis, raw: redis.Redis) -> None:
    """Once an idle topic's key has expired, the topic reads as never published (latest_offset()
    gives the origin), its next message starts a new chain from that origin, and a client holding
    an offset of a message from before gets None (`reset`), never the new chain as if it followed
    on from it."""
    fanout = await make_redis(listen=False, history_ttl=0.1, idle_expire=0.5)
    old = [fanout.publish("forgot:b", {"i": i}) for i in range(3)]
    await async_wait_for(lambda: not raw.exists(fanout.key_prefix + "forgot:b"), WAIT,
                         message="the idle topic to be forgotten")
    origin = fanout.latest_offset("forgot:never")
    assert fanout.latest_offset("forgot:b") == origin
    again = [fanout.publish("forgot:b", {"i": i}) for i in range(2)]
    for held in old:
        assert await fanout.history("forgot:b", held) is None, f"{held} replayed the new chain {again}"
    assert offsets_of(await read_history(fanout, "forgot:b", origin)) == again


async def test_an_origin_held_while_its_topic_was_published_and_forgotten_gets_reset(
        make_redis: MakeRedis, raw: redis.Redis) -> None:
    """A page renders a topic's origin and is away while messages are published and the idle
    topic is forgotten: the topic reads as never published again, but the page missed those
    messages, so its origin gets None (reset), never an empty replay."""
    fanout = await make_redis(listen=False, history_ttl=0.1, idle_expire=0.5)
    rendered = fanout.latest_offset("forgot:a")
    missed = [fanout.publish("forgot:a", {"i": i}) for i in range(3)]
    await async_wait_for(lambda: not raw.exists(fanout.key_prefix + "forgot:a"), WAIT,
                         message="the idle topic to be forgotten")
    assert await fanout.history("forgot:a", rendered) is None, f"the origin replayed nothing of {missed}"


async def test_an_origin_from_before_the_origin_moved_on_still_replays_everything(
        make_redis: MakeRedis, raw: redis.Redis) -> None:
    """The origin moves on every half idle time (so that one held past the idle time is known
    stale): an origin given out just before, on a topic whose first message comes after, still
    replays that message, and on a topic still never published, replays nothing, without a reset."""
    fanout = await make_redis(history_ttl=0.1, idle_expire=4)
    got = Collector()
    fanout.register(got)
    rendered = fanout.latest_offset("moved:a")

    async def moved_on() -> bool:
        return await fanout.alatest_offset("moved:never") != rendered

    await async_wait_for(moved_on, WAIT, message="the origin to move on")
    current = fanout.latest_offset("moved:never")
    assert offset_key(rendered) < offset_key(current) and raw.exists(fanout.key_prefix + "moved:a") == 0
    first = fanout.publish("moved:a", {"i": 0})
    [message] = await got.wait_count("moved:a", 1)
    assert message.prev == current, "a topic's first message links to the origin of its time"
    assert offsets_of(await read_history(fanout, "moved:a", rendered)) == [first]
    assert await read_history(fanout, "moved:never", rendered) == []


async def test_a_redis_out_of_memory_still_answers_reads_when_the_origin_is_due_to_move_on(
        make_redis: MakeRedis, private_redis: PrivateRedis) -> None:
    """A Redis at its maxmemory (policy noeviction) refuses writes: a publish fails, but pages go
    on rendering and clients on resuming. The origin due to move on then stays as it is, rather
    than fail the read that would move it."""
    # The reads below come once the origin is due to move on (half the idle time) and before the
    # topic is forgotten (the whole of it), by Redis's clock, which runs on while this process
    # waits for a core: 4 s leaves that wait 1.8 s, where 1 s left it 0.4 s.
    fanout = await make_redis(url=private_redis.url, listen=False, history_ttl=0.1, idle_expire=4)
    offset = fanout.publish("full:a", {"i": 0})
    # Nothing reads the origin between this render and the memory filling up, so it cannot move
    # on before, however long this process waits for a core (a publish in between moved it).
    rendered = fanout.latest_offset("full:never")
    admin = redis.Redis.from_url(private_redis.url)
    try:
        admin.config_set("maxmemory-policy", "noeviction")
        admin.config_set("maxmemory", 1)
        with pytest.raises(livepush.DependencyError):
            fanout.publish("full:a", {"i": 1})
        await asyncio.sleep(2.2)  # past half the idle time, on the wall clock: no event to await
        assert fanout.latest_offset("full:never") == rendered
        assert await fanout.history("full:a", offset) == History([], offset, False)
        assert await read_history(fanout, "full:never", rendered) == []
    finally:
        admin.config_set("maxmemory", 0)
        admin.close()


async def test_an_origin_that_could_not_move_on_still_gets_reset_past_the_idle_time(
        make_redis: MakeRedis, private_redis: PrivateRedis, raw_private: redis.Redis) -> None:
    """While Redis is out of memory the origin cannot move on, but a topic still expires: a page
    holding the origin while the topic was published and forgotten gets None (reset), even
    though that origin is still the newest."""
    # The publish must find the origin not yet due to move on (half the idle time after it was
    # made, by Redis's clock, which runs on while this process waits for a core): 0.5 s was not
    # enough on a loaded machine, 1.5 s is.
    fanout = await make_redis(url=private_redis.url, listen=False, history_ttl=0.1, idle_expire=3)
    rendered = fanout.latest_offset("full:a")
    missed = fanout.publish("full:a", {"i": 0})
    raw_private.config_set("maxmemory-policy", "noeviction")
    raw_private.config_set("maxmemory", 1)
    await async_wait_for(lambda: not raw_private.exists(fanout.key_prefix + "full:a"), WAIT,
                         message="the idle topic to be forgotten")
    assert fanout.latest_offset("full:a") == rendered, "the origin stayed: Redis is out of memory"
    assert await fanout.history("full:a", rendered) is None, f"the origin replayed nothing of [{missed!r}]"


# ---- errors -------------------------------------------------------------------------------------


async def test_unreachable_redis_raises_dependency_error_without_the_password() -> None:
    """Every call against a closed port raises DependencyError at once: one line, the setting, no password."""
    fanout = RedisFanOut(f"redis://someone:s3cret-pw@127.0.0.1:{free_port()}/0", connect_timeout=2)
    try:
        calls = [
            lambda: fanout.publish("down:a", {"i": 0}),
            lambda: fanout.latest_offset("down:a"),
        ]
        for call in calls:
            with pytest.raises(livepush.DependencyError) as caught:
                call()
            text = str(caught.value)
            assert "LIVEPUSH_REDIS_URL" in text and "\n" not in text and "s3cret-pw" not in text
        for acall in (fanout.apublish("down:a", {"i": 0}), fanout.history("down:a", "0-0"), fanout.prune()):
            with pytest.raises(livepush.DependencyError) as caught:
                await asyncio.wait_for(acall, 5)
            assert "s3cret-pw" not in str(caught.value)
        with pytest.raises(livepush.ListenError) as caught:
            await asyncio.wait_for(fanout.listen(), 5)
        assert "s3cret-pw" not in str(caught.value)
    finally:
        await fanout.aclose()


async def publish_refused(url: str) -> str:
    """What a publish to `url`, where no Redis answers, raises."""
    fanout = RedisFanOut(url, connect_timeout=2)
    try:
        with pytest.raises(livepush.DependencyError) as caught:
            await asyncio.wait_for(fanout.apublish("down:a", {"i": 0}), 5)
        return str(caught.value)
    finally:
        await fanout.aclose()


async def test_an_unreachable_unix_socket_is_named_by_the_url_as_written(tmp_path: Path) -> None:
    """The error named `unix:///run/redis.sock` as `unix:/run/redis.sock`, a URL livepush refuses
    ("not a Redis URL"): a user who pasted it back to try it made things worse. It shows the URL
    as written, credentials aside."""
    socket_path = tmp_path / "redis.sock"  # nothing listens there
    said = await publish_refused(f"unix://{socket_path}?db=3")
    assert f"Redis at unix://{socket_path}?db=3 failed" in said, said
    assert redis_client.redact(f"unix://:s3cret-pw@{socket_path}?password=pw") == f"unix://***@{socket_path}?password=***"


async def test_a_unix_url_naming_its_database_in_the_path_says_to_use_the_db_parameter(tmp_path: Path) -> None:
    """`unix:///run/redis.sock/2`, the database written as in a redis:// URL, is a socket path
    below the socket: "Not a directory", and "check that Redis is running" for a Redis that runs.
    The error says where the database number goes."""
    socket_path = tmp_path / "redis.sock"
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as listening:
        listening.bind(str(socket_path))  # a socket there, as a running Redis' is
        said = await publish_refused(f"unix://{socket_path}/2")
    assert f"unix://{socket_path}?db=2" in said, said


async def test_a_redis_that_refuses_says_why_rather_than_to_check_that_it_runs(
        make_redis: MakeRedis, redis_url: str, private_redis: PrivateRedis, raw_private: redis.Redis) -> None:
    """A Redis that is up but refuses (out of memory, a read-only replica, wrong password, an ACL
    without the deployment's keys) raises DependencyError naming what to change, not 'check that
    Redis is running'; the listener's ListenError too."""
    refusing = await make_redis(url=private_redis.url, listen=False)
    refusing.publish("refused:a", {"i": 0})
    raw_private.config_set("maxmemory-policy", "noeviction")
    raw_private.config_set("maxmemory", 1)
    with pytest.raises(livepush.DependencyError, match="raise its maxmemory") as caught:
        refusing.publish("refused:a", {"i": 1})
    assert "Redis is running" not in str(caught.value)
    raw_private.config_set("maxmemory", 0)
    raw_private.execute_command("REPLICAOF", "127.0.0.1", free_port())  # a primary it never reaches
    try:
        with pytest.raises(livepush.DependencyError, match="point LIVEPUSH_REDIS_URL at the primary") as caught:
            refusing.publish("refused:a", {"i": 1})
        assert "Redis is running" not in str(caught.value)
    finally:
        raw_private.execute_command("REPLICAOF", "NO", "ONE")

    wrong_password = redis_url.replace("redis://", "redis://nobody:wrong-pw@", 1)
    with documented_user(redis_url, "refused:other") as other_deployments_user:
        for url, expected in ((wrong_password, "correct them in LIVEPUSH_REDIS_URL"),
                              (other_deployments_user, "the ACL that docs/security.md shows")):
            fanout = await make_redis(url=url, listen=False, prefix="refused:mine")
            with pytest.raises(livepush.DependencyError, match=expected) as caught:
                fanout.publish("refused:a", {"i": 0})
            assert "Redis is running" not in str(caught.value) and "wrong-pw" not in str(caught.value)
            with pytest.raises(livepush.ListenError, match=expected) as listening:
                await asyncio.wait_for(fanout.listen(), WAIT)
            # A refused password is a setting to correct (the CLI's exit 2); an ACL that denies
            # the deployment's keys is a refusal after the login, a setting to correct in Redis.
            refused = url == wrong_password
            assert isinstance(caught.value, livepush.LoginRefused) is refused, caught.value
            assert isinstance(listening.value, livepush.ListenLoginRefused) is refused, listening.value
            assert isinstance(caught.value, livepush.AclRefused) is not refused, caught.value
            assert isinstance(listening.value, livepush.ListenAclRefused) is not refused, listening.value


@pytest.mark.parametrize("left_out, call", [
    ("+xadd", lambda fanout: fanout.apublish("acl:a", {"i": 0})),
    ("+xrange", lambda fanout: fanout.history("acl:a", "0-0")),
    ("+time", lambda fanout: fanout.aopen()),
    ("+pexpire", lambda fanout: fanout.keep_chains(["acl:a"])),
])
async def test_an_acl_that_leaves_out_a_command_a_script_runs_is_named_in_one_line(
        make_redis: MakeRedis, redis_url: str, left_out: str, call: Callable[[RedisFanOut], Awaitable[Any]]) -> None:
    """Redis refuses a command that the ACL denies inside a script without naming it ("The user
    executing the script can't run this command", the script's hash and line): the error names
    the rule the user lacks, so the operator adds that one rather than compare the whole line.
    The error is an AclRefused carrying that rule: a setting to correct, and a DependencyError still."""
    with documented_user(redis_url, "acl:mine", without=left_out) as user_url:
        fanout = await make_redis(url=user_url, listen=False, prefix="acl:mine")
        with pytest.raises(livepush.AclRefused) as caught:
            await call(fanout)
    said = str(caught.value)
    assert f"lacks {left_out} " in said and "docs/security.md" in said, said
    assert "\n" not in said
    assert caught.value.rule == left_out and isinstance(caught.value, livepush.DependencyError)


@pytest.mark.parametrize("users_prefix, without, rule, said", [
    ("acl:theirs", None, "~{P}:*", "denies the deployment's keys"),  # another deployment's user
    ("acl:mine", "&{acl:mine}:*", "&{P}:*", "denies the deployment's channels"),  # its keys, not its channels
])
async def test_an_acl_that_denies_the_deployments_keys_or_channels_says_which_and_how_they_are_named(
        make_redis: MakeRedis, redis_url: str, users_prefix: str, without: str | None, rule: str, said: str) -> None:
    """Redis says only that "one of the keys" (or channels) is denied. An operator who wrote the
    prefix without its braces (`~livepush:12:*`), or another deployment's, is told the patterns
    the user needs, braces and all, and which of the two was denied: a user given the keys but
    not the channels is told the channels, at the publish script's PUBLISH and at the subscribe."""
    with documented_user(redis_url, users_prefix, without=without) as user_url:
        fanout = await make_redis(url=user_url, listen=False, prefix="acl:mine")
        with pytest.raises(livepush.AclRefused) as publishing:
            await fanout.apublish("acl:a", {"i": 0})
        with pytest.raises(livepush.ListenAclRefused) as listening:
            await asyncio.wait_for(fanout.listen(), WAIT)
    for caught in (publishing, listening):
        assert "`~{P}:*` and `&{P}:*`" in str(caught.value) and said in str(caught.value), caught.value
        assert caught.value.rule == rule, caught.value


async def test_a_user_that_may_not_ping_is_refused_at_listen_rather_than_lost_at_every_heartbeat(
        make_redis: MakeRedis, redis_url: str) -> None:
    """The listener PINGs a quiet subscription (its heartbeat). A user without +ping subscribed,
    then lost the listener at every beat and subscribed again: two warnings, and a read of every
    watched topic's history, every 5 s for ever. listen() refuses it, naming the command."""
    with documented_user(redis_url, "acl:mine", without="+ping") as user_url:
        fanout = await make_redis(url=user_url, listen=False, prefix="acl:mine", heartbeat=0.2)
        with pytest.raises(livepush.ListenError, match="the 'ping' command") as caught:
            await asyncio.wait_for(fanout.listen(), WAIT)
    assert "the ACL that docs/security.md shows" in str(caught.value)
    assert isinstance(caught.value, livepush.ListenAclRefused) and caught.value.rule == "+ping", caught.value


async def test_a_redis_that_wants_a_password_says_what_the_url_lacks(private_redis: PrivateRedis) -> None:
    """A Redis with a password, and a URL with none, or with the password where the user goes
    (`redis://s3cret@host`, the colon forgotten), said "refused the user or password: correct
    them", of a URL that gave no password. Each says what the URL lacks, never the password."""
    host = private_redis.url.split("://", 1)[1]
    admin = redis.Redis.from_url(private_redis.url)
    admin.config_set("requirepass", "s3cret")
    try:
        said = await publish_refused(f"redis://{host}")
        assert "needs a password" in said and "redis://:PASSWORD@" in said, said
        said = await publish_refused(f"redis://s3cret@{host}")
        assert "no password" in said and "redis://:PASSWORD@" in said and "s3cret" not in said, said
        said = await publish_refused(f"redis://:wrong@{host}")
        assert "refused the user or password" in said, said
    finally:
        with redis.Redis.from_url(private_redis.url, password="s3cret") as authed:
            authed.config_set("requirepass", "")
        admin.close()


async def test_a_url_naming_a_database_redis_does_not_have_says_so(make_redis: MakeRedis, redis_url: str,
                                                                   raw: redis.Redis) -> None:
    """A URL whose database number is past what Redis has raises DependencyError (ListenError for
    listen()) saying to name a database it has, not to check that Redis is running."""
    databases = int(raw.config_get("databases")["databases"])
    fanout = await make_redis(url=redis_url.rsplit("/", 1)[0] + f"/{databases}", listen=False)
    with pytest.raises(livepush.DependencyError, match="name one below its `databases` setting") as caught:
        fanout.publish("nodb:a", {"i": 0})
    assert "Redis is running" not in str(caught.value)
    with pytest.raises(livepush.ListenError, match="name one below its `databases` setting"):
        await asyncio.wait_for(fanout.listen(), WAIT)


def test_a_redis_still_loading_after_a_restart_says_to_try_again_not_to_check_that_it_runs() -> None:
    """What Redis answers while it loads its data after a restart (LOADING, redis-py's
    BusyLoadingError) reads as a Redis that is up and will answer soon."""
    error = failed("redis://127.0.0.1:6379/0", redis.BusyLoadingError("Redis is loading the dataset in memory"),
                   "publishing on 'load:a'")
    assert "try again once it has loaded" in str(error) and "Redis is running" not in str(error)


@pytest.mark.parametrize("refusal, said, rule", [
    (redis.exceptions.NoPermissionError, "this user has no permissions to access one of the keys used as arguments",
     "~{P}:*"),
    (redis.exceptions.NoPermissionError, "this user has no permissions to access one of the channels used as "
                                         "arguments", "&{P}:*"),
    (redis.ResponseError, "The user executing the script can't access at least one of the keys mentioned in the "
                          "command script: 0123, on @user_script:4.", "~{P}:*"),
    (redis.ResponseError, "The user executing the script can't publish to the channel mentioned in the command "
                          "script: 0123, on @user_script:4.", "&{P}:*"),
    # Redis 7.2 and later (and Valkey), a command's and a script's.
    (redis.exceptions.NoPermissionError, "No permissions to access a key", "~{P}:*"),
    (redis.exceptions.NoPermissionError, "No permissions to access a channel", "&{P}:*"),
    (redis.ResponseError, "ACL failure in script: No permissions to access a key script: 0123, on @user_script:4.",
     "~{P}:*"),
])
def test_an_acl_that_denies_the_deployments_keys_or_channels_is_told_their_patterns_in_each_redis_wording(
        refusal: type[Exception], said: str, rule: str) -> None:
    """Redis 7.2 and later word a denied key or channel anew ("No permissions to access a key"):
    it is told the `~{P}:*` and `&{P}:*` patterns as Redis 7.0's wording is, never to check that
    Redis runs, and the error's rule is the pattern it was refused; a command denied to a user
    whose name holds "channel" is not taken for one."""
    error = failed("redis://127.0.0.1:6379/0", refusal(said), "publishing on 'acl:a'")
    assert "`~{P}:*` and `&{P}:*`" in str(error) and "Redis is running" not in str(error), error
    assert isinstance(error, livepush.AclRefused) and error.rule == rule, error
    command = failed("redis://127.0.0.1:6379/0", redis.exceptions.NoPermissionError(
        "User channel_app has no permissions to run the 'ping' command"), "subscribing")
    assert "`~{P}:*`" not in str(command) and "lacks +ping (a command livepush runs)" in str(command), command
    assert isinstance(command, livepush.AclRefused) and command.rule == "+ping", command


@pytest.mark.parametrize("said", [
    "User app has no permissions to run the 'publish' command",
    # Redis 7.2 and later name the command a script was refused.
    "ACL failure in script: No permissions to run the 'publish' command script: 0123, on @user_script:4.",
])
def test_an_acl_refusal_that_names_its_command_is_told_the_rule_to_add(said: str) -> None:
    """Where Redis names the refused command, the error names the rule of the documented ACL that
    allows it, whatever script it ran in."""
    refusal = redis.ResponseError(said) if "script" in said else redis.exceptions.NoPermissionError(said)
    error = failed("redis://127.0.0.1:6379/0", refusal, "publishing on 'acl:a'")
    assert isinstance(error, livepush.AclRefused) and error.rule == "+publish", error
    assert "lacks +publish " in str(error) and "docs/security.md" in str(error), error


@pytest.mark.parametrize("said", [
    # A history read: XRANGE with an exclusive start, "(ID", came with Redis 6.2.
    "Error running script (call to f_0123): @user_script:13: ERR Invalid stream ID specified as stream command argument",
    # prune(): XTRIM MINID came with Redis 6.2.
    "Error running script (call to f_4567): @user_script:12: ERR syntax error",
])
def test_a_redis_older_than_6_2_says_to_upgrade_it_not_to_check_that_it_runs(said: str) -> None:
    """What a Redis before 6.2 answers the stream commands livepush's scripts run (it takes them for
    a malformed id or option) reads as a Redis that is up and too old, naming the version needed."""
    error = failed("redis://127.0.0.1:6379/0", redis.ResponseError(said), "reading the history of 'old:a'")
    assert "Redis 6.2 or newer" in str(error) and "Redis is running" not in str(error)


@pytest.fixture
def tls_redis(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """A Redis that takes only TLS, with a self-signed certificate for 127.0.0.1: its rediss://
    URL, and the certificate (its own CA)."""
    server, openssl = shutil.which("redis-server"), shutil.which("openssl")
    if server is None or openssl is None:
        pytest.skip("redis-server and openssl are needed: run the tests with bin/test")
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run([openssl, "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=127.0.0.1",
                    "-addext", "subjectAltName=IP:127.0.0.1", "-keyout", str(key), "-out", str(cert)],
                   check=True, capture_output=True, timeout=30)
    port, pidfile = free_port(), tmp_path / "redis.pid"
    subprocess.run([server, "--port", "0", "--tls-port", str(port), "--bind", "127.0.0.1", "--tls-cert-file", str(cert),
                    "--tls-key-file", str(key), "--tls-ca-cert-file", str(cert), "--tls-auth-clients", "no",
                    "--daemonize", "yes", "--pidfile", str(pidfile), "--dir", str(tmp_path), "--save", "",
                    "--appendonly", "no", "--logfile", str(tmp_path / "redis.log")],
                   check=True, capture_output=True, timeout=10)
    url = f"rediss://127.0.0.1:{port}/0"
    admin = redis.Redis.from_url(url, ssl_ca_certs=str(cert), socket_timeout=2, retry=None)
    try:
        wait_for(admin.ping, 10, message="the TLS Redis to answer", ignore=(redis.RedisError,))
        yield url, cert
    finally:
        with contextlib.suppress(redis.ConnectionError):
            admin.shutdown(nosave=True)
        admin.close()


async def test_rediss_works_with_its_ca_and_says_what_to_do_without_it(
        make_redis: MakeRedis, tls_redis: tuple[str, Path]) -> None:
    """Over rediss:// with the URL naming Redis' CA, a server listens and a publish reaches it; a
    URL without it raises DependencyError (ListenError for listen()) saying to give that CA,
    not to check that Redis is running."""
    url, ca = tls_redis
    fanout = await make_redis(url=f"{url}?ssl_ca_certs={ca}")
    got = Collector()
    fanout.register(got)
    offset = await fanout.apublish("tls:a", {"i": 0})
    assert offsets_of(await got.wait_count("tls:a", 1)) == [offset]

    untrusted = await make_redis(url=url, listen=False, connect_timeout=2)
    with pytest.raises(livepush.DependencyError, match="give its CA in LIVEPUSH_REDIS_URL") as caught:
        untrusted.publish("tls:a", {"i": 1})
    assert "Redis is running" not in str(caught.value)
    with pytest.raises(livepush.ListenError, match="give its CA in LIVEPUSH_REDIS_URL"):
        await asyncio.wait_for(untrusted.listen(), WAIT)


async def test_a_url_whose_scheme_does_not_match_the_ports_tls_says_which_scheme_to_try(
        tls_redis: tuple[str, Path], private_redis: PrivateRedis) -> None:
    """redis:// to a port that takes only TLS (Redis resets the connection), or rediss:// to a
    plain one (the handshake never completes), said to check that Redis is running, of a Redis
    that ran and answered. Each error now names the other scheme."""
    tls_url, _ = tls_redis
    said = await publish_refused(tls_url.replace("rediss://", "redis://", 1))
    assert "rediss://" in said.split("):", 1)[1], said
    said = await publish_refused(private_redis.url.replace("redis://", "rediss://", 1))
    assert "use redis://" in said, said


def outside_address() -> str:
    """An address of this machine that is not loopback (where a default route leaves from), or skip."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect(("192.0.2.1", 9))  # TEST-NET-1: no packet is sent for a UDP connect
            address = probe.getsockname()[0]
        except OSError:
            address = "127.0.0.1"
    if address.startswith("127."):
        pytest.skip("this machine has no address but loopback to reach Redis from the outside by")
    return address


async def test_a_redis_in_protected_mode_says_to_give_it_a_password_not_to_check_that_it_runs(tmp_path: Path) -> None:
    """A Redis with no password takes connections from its own host only (protected mode), and
    refuses others with a paragraph of its own: the error ended "check that Redis is running", of
    a Redis that had answered. It now says what to change."""
    server, port, pidfile = shutil.which("redis-server"), free_port(), tmp_path / "redis.pid"
    if server is None:
        pytest.skip("redis-server is needed: run the tests with bin/test")
    address = outside_address()
    subprocess.run([server, "--port", str(port), "--bind", "*", "--protected-mode", "yes", "--daemonize", "yes",
                    "--pidfile", str(pidfile), "--dir", str(tmp_path), "--save", "", "--appendonly", "no",
                    "--logfile", str(tmp_path / "redis.log")], check=True, capture_output=True, timeout=10)
    admin = redis.Redis(port=port, socket_timeout=2, retry=None)
    try:
        wait_for(admin.ping, 10, message="the protected Redis to answer", ignore=(redis.RedisError,))
        said = await publish_refused(f"redis://{address}:{port}/0")
        remedy = said.rsplit("):", 1)[1]
        assert "protected mode" in remedy and "password" in remedy and "Redis is running" not in remedy, said
    finally:
        with contextlib.suppress(redis.ConnectionError):
            admin.shutdown(nosave=True)
        admin.close()


async def test_a_redis_at_its_maxclients_says_so_rather_than_to_check_that_it_runs(
        make_redis: MakeRedis, private_redis: PrivateRedis, raw_private: redis.Redis) -> None:
    """A Redis that refuses new connections because it serves its maxclients already raises
    DependencyError (ListenError for listen()) saying to raise maxclients, not to check the URL."""
    fanout = await make_redis(url=private_redis.url, listen=False)
    raw_private.config_set("maxclients", 1)  # this connection is the one
    try:
        with pytest.raises(livepush.DependencyError, match="raise maxclients") as caught:
            fanout.publish("full:a", {"i": 0})
        assert "Redis is running" not in str(caught.value)
        with pytest.raises(livepush.ListenError, match="raise maxclients"):
            await asyncio.wait_for(fanout.listen(), WAIT)
    finally:
        raw_private.config_set("maxclients", 10000)
    offset = fanout.publish("full:a", {"i": 1})
    assert fanout.latest_offset("full:a") == offset


@pytest.fixture
def spare_redis(tmp_path: Path) -> Iterator[Callable[..., int]]:
    """`start(*config_lines, sentinel=False)`: a redis-server of the test's own (a cluster node, a
    Sentinel) on a free port, with those lines in its configuration: its port. Each is stopped
    after the test."""
    binary = shutil.which("redis-server")
    if binary is None:
        pytest.skip("redis-server is not installed: run the tests with bin/test")
    pidfiles: list[Path] = []

    def start(*config_lines: str, sentinel: bool = False) -> int:
        port = free_port()
        home = tmp_path / f"redis-{port}"
        home.mkdir()
        pidfile = home / "redis.pid"
        config = home / "redis.conf"  # a Sentinel rewrites its configuration: a file of its own
        config.write_text("\n".join([f"port {port}", "bind 127.0.0.1", "daemonize yes", f"pidfile {pidfile}",
                                      f"dir {home}", f"logfile {home / 'redis.log'}", *config_lines]) + "\n")
        subprocess.run([binary, str(config), *(["--sentinel"] if sentinel else [])],
                       check=True, capture_output=True, timeout=10)
        pidfiles.append(pidfile)
        client = redis.Redis(host="127.0.0.1", port=port, socket_timeout=2, socket_connect_timeout=2)
        try:
            wait_for(client.ping, 10, message=f"the spare Redis on {port} to answer", ignore=(redis.RedisError,))
        finally:
            client.close()
        return port

    yield start
    for pidfile in pidfiles:
        with contextlib.suppress(FileNotFoundError, ValueError, ProcessLookupError):
            pid = int(pidfile.read_text().strip())
            os.kill(pid, signal.SIGTERM)
            wait_for(lambda: process_gone(pid), 10, message=f"the spare Redis (pid {pid}) to exit")


@pytest.fixture
def cluster_node_without_the_prefix(spare_redis: Callable[..., int]) -> str:
    """The URL of a node of a two-node Redis Cluster whose other node holds the hash slot of the
    default prefix's keys (`{livepush:0}`), as a URL given by mistake would lead to."""
    def node() -> tuple[int, int]:
        # The bus port free as well: by default it is the port plus 10,000, which may be taken.
        bus = free_port()
        return spare_redis("cluster-enabled yes", "cluster-config-file nodes.conf", f"cluster-port {bus}",
                           "save \"\"", "appendonly no"), bus

    (ours, _), (theirs, their_bus) = node(), node()
    a, b = (redis.Redis(host="127.0.0.1", port=port, socket_timeout=5) for port in (ours, theirs))
    try:
        slot = int(a.execute_command("CLUSTER", "KEYSLOT", "{livepush:0}"))
        a.execute_command("CLUSTER", "ADDSLOTS", *[s for s in range(16384) if s != slot])
        b.execute_command("CLUSTER", "ADDSLOTS", slot)
        a.execute_command("CLUSTER", "MEET", "127.0.0.1", theirs, their_bus)
        wait_for(lambda: b"cluster_state:ok" in a.execute_command("CLUSTER", "INFO"), 20,
                 message="the two-node cluster to agree on its slots")
    finally:
        a.close()
        b.close()
    return f"redis://127.0.0.1:{ours}/0"


async def _refused_everywhere(fanout: RedisFanOut, says: str) -> str:
    """publish() and aopen() raise DependencyError, and listen() ListenError, each saying `says`,
    and the fan-out does not listen; returns what publish() said."""
    with pytest.raises(livepush.DependencyError, match=says) as caught:
        fanout.publish("refused:a", {"i": 0})
    with pytest.raises(livepush.DependencyError, match=says):
        await asyncio.wait_for(fanout.aopen(), WAIT)
    with pytest.raises(livepush.ListenError, match=says):
        await asyncio.wait_for(fanout.listen(), WAIT)
    assert not fanout.listening
    return str(caught.value)


async def test_a_url_leading_to_a_redis_cluster_node_says_livepush_needs_a_standalone_redis(
        make_redis: MakeRedis, cluster_node_without_the_prefix: str) -> None:
    """A URL that leads to a node of a Redis Cluster (which answers a key of another node with a
    redirection, and a database number with a refusal) makes publish() raise DependencyError,
    and aopen() and listen() too, saying that livepush needs a standalone Redis, not to check
    that Redis is running: a server there never starts to fail every publish and history read."""
    url = cluster_node_without_the_prefix
    for fanout in (await make_redis(url=url, listen=False),
                   await make_redis(url=url.rsplit("/", 1)[0] + "/3", listen=False)):
        said = await _refused_everywhere(fanout, "a node of a Redis Cluster")
        assert "Redis is running" not in said


async def test_a_url_leading_to_a_redis_sentinel_says_to_point_it_at_the_primary(
        make_redis: MakeRedis, spare_redis: Callable[..., int], private_redis: PrivateRedis) -> None:
    """A URL that leads to a Redis Sentinel (which answers PING and SUBSCRIBE, and knows none of
    livepush's other commands) makes publish(), aopen() and listen() raise DependencyError saying
    that it is a Sentinel and to point the URL at the primary, not to check that Redis is running."""
    sentinel = spare_redis(f"sentinel monitor primary 127.0.0.1 {private_redis.port} 1", sentinel=True)
    fanout = await make_redis(url=f"redis://127.0.0.1:{sentinel}/0", listen=False)
    said = await _refused_everywhere(fanout, "Sentinel")
    assert "Redis is running" not in said and "the Redis primary" in said


async def test_a_redis_revocation_store_on_a_sentinel_or_a_cluster_node_is_refused_when_watched(
        spare_redis: Callable[..., int], private_redis: PrivateRedis, cluster_node_without_the_prefix: str) -> None:
    """The Redis revocation store (a deployment without a database) whose URL leads to a Sentinel
    or to a node of a Redis Cluster raises DependencyError from aopen(), and ListenError from
    watch() (a server's start), saying which: PING and SUBSCRIBE succeed there, and a server
    started on one answered every handshake 503, its store's reads failing."""
    sentinel = spare_redis(f"sentinel monitor primary 127.0.0.1 {private_redis.port} 1", sentinel=True)
    for url, said in ((f"redis://127.0.0.1:{sentinel}/0", "Sentinel"),
                      (cluster_node_without_the_prefix, "a node of a Redis Cluster")):
        store = RedisRevocations(url)
        try:
            with pytest.raises(livepush.DependencyError, match=said):
                await asyncio.wait_for(store.aopen(), WAIT)
            with pytest.raises(livepush.ListenError, match=said):
                await asyncio.wait_for(store.watch(lambda: None), WAIT)
        finally:
            await store.aclose()


@contextlib.asynccontextmanager
async def silent_redis(accepted: list[asyncio.StreamWriter] | None = None) -> AsyncIterator[str]:
    """The URL of a server that takes connections and never answers, as a Redis cut off without a
    reset; each connection's writer goes to `accepted` when given."""
    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if accepted is not None:
            accepted.append(writer)
        await reader.read()  # never answers; ends when the client gives up
        writer.close()

    server = await asyncio.start_server(silent, "127.0.0.1", 0)
    try:
        yield f"redis://127.0.0.1:{server.sockets[0].getsockname()[1]}/0"
    finally:
        server.close()


async def test_a_publish_to_a_redis_that_never_answers_fails_within_the_call_timeout(make_redis: MakeRedis) -> None:
    """A Redis that takes the connection and never answers (cut off without a reset) makes
    publish(), apublish() and history() raise DependencyError within livepush's own call
    timeout, whatever redis-py's default is (none before redis-py 8)."""
    async with silent_redis() as url:
        fanout = await make_redis(url=url, listen=False)
        sync, _ = fanout._sync_client()
        assert sync.connection_pool.connection_kwargs["socket_timeout"] == CALL_TIMEOUT
        side = fanout._loops.get()
        assert side.client.connection_pool.connection_kwargs["socket_timeout"] == CALL_TIMEOUT
        bound = CALL_TIMEOUT + 10
        with pytest.raises(livepush.DependencyError, match="did not answer in time"):
            await asyncio.wait_for(asyncio.to_thread(fanout.publish, "silent:a", {"i": 0}), bound)
        with pytest.raises(livepush.DependencyError, match="did not answer in time"):
            await asyncio.wait_for(fanout.apublish("silent:a", {"i": 0}), bound)
        with pytest.raises(livepush.DependencyError):
            await asyncio.wait_for(fanout.history("silent:a", "0-1"), bound)
        await fanout.release_loop()


@pytest.mark.parametrize("read", ["history", "alatest_offset"])
async def test_a_read_given_a_timeout_fails_within_it_not_the_call_timeout(make_redis: MakeRedis, read: str) -> None:
    """history(timeout=) and alatest_offset(timeout=) on a Redis that takes the connection and
    never answers raise DependencyError within that timeout, not CALL_TIMEOUT (nor a wait for a
    pool connection and a connect before it): the hub's subscribes and replay retries keep their
    bound (docs/reference.md §5)."""
    async with silent_redis() as url:
        fanout = await make_redis(url=url, listen=False)
        loop = asyncio.get_running_loop()
        began = loop.time()
        reading = fanout.history("silent:a", "0-1", timeout=0.5) if read == "history" else \
            fanout.alatest_offset("silent:a", timeout=0.5)
        with pytest.raises(livepush.DependencyError) as raised:
            await asyncio.wait_for(reading, CALL_TIMEOUT + 10)
        took = loop.time() - began
        assert took < CALL_TIMEOUT / 2, took
        said = str(raised.value)
        assert "no answer within 0.5 s" in said and "check LIVEPUSH_REDIS_URL and that Redis is running" in said, said
        await fanout.release_loop()


async def test_a_read_from_a_redis_that_never_answers_says_to_check_the_url_not_a_publishs_advice(
        make_redis: MakeRedis, monkeypatch: pytest.MonkeyPatch) -> None:
    """latest_offset(), alatest_offset() and history() on a Redis that takes the connection and
    never answers raise DependencyError saying to check LIVEPUSH_REDIS_URL and that Redis runs, as
    a part's first read does: they write nothing of the user's, so a publish's advice (look at the
    topic's latest offset before publishing again) has no place there."""
    monkeypatch.setattr(fanout_redis, "CALL_TIMEOUT", 0.3)  # read as each client is made
    async with silent_redis() as url:
        fanout = await make_redis(url=url, listen=False)
        reads: dict[str, Callable[[], Any]] = {
            "latest_offset()": lambda: asyncio.to_thread(fanout.latest_offset, "silent:a"),
            "alatest_offset()": lambda: fanout.alatest_offset("silent:a"),
            "history()": lambda: fanout.history("silent:a", "0-1")}
        for call, read in reads.items():
            with pytest.raises(livepush.DependencyError) as raised:
                await asyncio.wait_for(read(), WAIT)
            said = str(raised.value)
            assert "did not answer in time" in said and "check LIVEPUSH_REDIS_URL and that Redis is running" in said, \
                (call, said)
            assert "publishing again" not in said, (call, said)
        await fanout.release_loop()


async def test_a_call_that_finds_every_connection_of_its_pool_busy_says_so_not_that_redis_is_down(
        make_redis: MakeRedis, monkeypatch: pytest.MonkeyPatch) -> None:
    """More calls at once than an event loop's pool has connections, while Redis answers none of
    them, leave a call waiting for a connection: past the pool's wait it raises DependencyError
    saying the connections stayed busy and the call was never sent, not to check the URL and
    that Redis is running."""
    monkeypatch.setattr(redis_client, "POOL_CONNECTIONS", 2)  # read as each loop's client is made
    monkeypatch.setattr(redis_client, "POOL_WAIT_SECONDS", 0.5)
    accepted: list[asyncio.StreamWriter] = []
    holding: list[asyncio.Task[str]] = []
    async with silent_redis(accepted) as url:
        try:
            fanout = await make_redis(url=url, listen=False)
            holding += [asyncio.create_task(fanout.apublish("pool:a", {"i": i})) for i in range(2)]
            await async_wait_for(lambda: len(accepted) == 2, WAIT, message="both connections of the pool in use")
            with pytest.raises(livepush.DependencyError, match="stayed in use for 0.5 s") as caught:
                await asyncio.wait_for(fanout.apublish("pool:a", {"i": 2}), WAIT)
            assert "never sent" in str(caught.value) and "Redis is running" not in str(caught.value)
        finally:
            for task in holding:
                task.cancel()
            await asyncio.gather(*holding, return_exceptions=True)


def test_threads_publishing_at_once_past_the_pools_connections_wait_their_turn_rather_than_fail(
        private_redis: PrivateRedis, raw_private: redis.Redis, monkeypatch: pytest.MonkeyPatch) -> None:
    """Sync publishes from more threads at once than the process may hold connections to Redis (a
    threaded web server's burst) wait for one to free up and all succeed, on at most that many
    connections: redis-py's own pool refused each call past its 100th connection at once ("Too
    many connections"), told to check that Redis is running."""
    monkeypatch.setattr(redis_client, "POOL_CONNECTIONS", 4)  # read as the sync client is made
    monkeypatch.setattr(redis_client, "POOL_WAIT_SECONDS", WAIT)
    fanout = RedisFanOut(private_redis.url)
    threads = 120  # past redis-py's own limit of 100, so that a pool of its own refuses some
    try:
        fanout.publish("burst:warm", {})  # loads the script
        offsets: list[str] = []
        errors: list[Exception] = []
        start = threading.Barrier(threads)

        def publish(i: int) -> None:
            start.wait(WAIT)
            try:
                offsets.append(fanout.publish("burst:a", {"i": i}))
            except Exception as exc:
                errors.append(exc)

        # Redis holds every write for a moment, so that the publishes are all in flight at once.
        raw_private.execute_command("CLIENT", "PAUSE", 500, "WRITE")
        workers = [threading.Thread(target=publish, args=(i,)) for i in range(threads)]
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join(2 * WAIT)
        assert errors == [], f"{len(errors)} publishes failed, the first: {errors[0]}"
        assert len(set(offsets)) == threads
        held = [c for c in raw_private.client_list() if c.get("name") == "livepush-publisher"]
        assert len(held) <= 4, f"{threads} threads held {len(held)} connections"
    finally:
        fanout.close()


def test_a_sync_call_that_finds_every_connection_busy_says_so_not_that_redis_is_down(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A sync publish that waits past the pool's wait for a connection, every one held by a call
    that Redis does not answer, raises DependencyError saying that they stayed in use and that
    the call was never sent, not to check the URL and that Redis is running."""
    monkeypatch.setattr(redis_client, "POOL_CONNECTIONS", 2)
    monkeypatch.setattr(redis_client, "POOL_WAIT_SECONDS", 0.5)
    listening = socket.create_server(("127.0.0.1", 0))
    accepted: list[socket.socket] = []

    def accept() -> None:  # takes every connection and never answers
        with contextlib.suppress(OSError):
            while True:
                accepted.append(listening.accept()[0])

    threading.Thread(target=accept, daemon=True).start()
    fanout = RedisFanOut(f"redis://127.0.0.1:{listening.getsockname()[1]}/0")
    holding = [threading.Thread(target=lambda: pytest.raises(livepush.DependencyError, fanout.publish, "pool:a", {}))
               for _ in range(2)]
    try:
        for thread in holding:
            thread.start()
        wait_for(lambda: len(accepted) == 2, WAIT, message="both connections of the pool in use")
        with pytest.raises(livepush.DependencyError, match="stayed in use for 0.5 s") as caught:
            fanout.publish("pool:a", {"i": 2})
        assert "never sent" in str(caught.value) and "Redis is running" not in str(caught.value)
    finally:
        for thread in holding:
            thread.join(CALL_TIMEOUT + WAIT)
        fanout.close()
        listening.close()
        for conn in accepted:
            conn.close()


# A script that holds Redis for 9 s, well past the client's 5 s timeout (Redis' clock, read in the loop).
_BUSY_LUA = "local s = redis.call('TIME')[1]; while tonumber(redis.call('TIME')[1]) - s < 9 do end; return 1"


def held(url: str) -> bool:
    """Whether Redis leaves a PING unanswered for 200 ms (a script holds it)."""
    probe = redis.Redis.from_url(url, socket_timeout=0.2, retry=None)
    try:
        probe.ping()
        return False
    except redis.TimeoutError:
        return True
    finally:
        probe.close()


async def test_a_publish_that_redis_answers_too_late_says_it_may_have_been_made(
        make_redis: MakeRedis, private_redis: PrivateRedis, raw_private: redis.Redis) -> None:
    """A publish whose answer does not come within the client's timeout (Redis busy with a long
    script) raises DependencyError saying the message may have been published all the same, as
    it is once Redis goes on; not 'check that Redis is running'."""
    fanout = await make_redis(url=private_redis.url, listen=False)
    fanout.publish("late:warm", {})  # loads the script: the late call is the publish itself
    before = fanout.latest_offset("late:a")
    raw_private.config_set("busy-reply-threshold", 20_000)  # others wait for the script, not get BUSY
    busy = redis.Redis.from_url(private_redis.url, socket_timeout=30)
    holding = asyncio.create_task(asyncio.to_thread(busy.eval, _BUSY_LUA, 0))
    try:
        await async_wait_for(lambda: asyncio.to_thread(held, private_redis.url), WAIT,
                             message="the long script to hold Redis")
        with pytest.raises(livepush.DependencyError, match="may have been done all the same") as caught:
            await asyncio.to_thread(fanout.publish, "late:a", {"i": 0})
        assert "Redis is running" not in str(caught.value)
    finally:
        await asyncio.wait_for(holding, 30)
        busy.close()
    assert fanout.latest_offset("late:a") != before, "the publish that timed out was made once Redis went on"


async def test_a_publish_that_no_server_hears_says_so_once_naming_the_prefix(
        make_redis: MakeRedis, redis_url: str, caplog: pytest.LogCaptureFixture) -> None:
    """A web process whose LIVEPUSH_REDIS_URL names another database than the servers' (so
    another default prefix), or another LIVEPUSH_REDIS_PREFIX, publishes where no server listens:
    every publish returned an offset and nothing reached a page, without a word. The first
    publish that no server hears logs a warning naming the prefix and what to compare; once."""
    prefix = f"unheard-{uuid.uuid4().hex[:8]}"
    alone = await make_redis(prefix=prefix, listen=False)
    heard = await make_redis(prefix=f"heard-{uuid.uuid4().hex[:8]}")  # a server of its own deployment listens
    with caplog.at_level(logging.WARNING, logger="livepush.fanout.redis"):
        await heard.apublish("unheard:a", {"i": 0})
        heard.publish("unheard:a", {"i": 1})
        assert not caplog.records, caplog.text
        alone.publish("unheard:a", {"i": 0})
        await alone.apublish_many([("unheard:a", {"i": 1}), ("unheard:b", {"i": 2})])
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 1 and f"{{{prefix}}}:pub" in warnings[0] and "LIVEPUSH_REDIS_PREFIX" in warnings[0], warnings


async def test_a_failing_receiver_does_not_stop_delivery(make_redis: MakeRedis) -> None:
    """A receiver that raises is logged, costs the receivers after it nothing, and the listener stays up: every message still arrives."""
    fanout = await make_redis()

    def broken(message: Any) -> None:
        raise RuntimeError("receiver bug")

    got = Collector()
    fanout.register(broken)  # first: the one after it must still get every message
    fanout.register(got)
    offsets = [fanout.publish("bug:a", {"i": i}) for i in range(3)]
    assert [m.offset for m in await got.wait_count("bug:a", 3)] == offsets
    assert fanout.listening


async def test_a_malformed_frame_on_the_channel_is_ignored(make_redis: MakeRedis, raw: redis.Redis) -> None:
    """Garbage published on the fan-out's channel (P:pub) is skipped; the next real message arrives."""
    fanout = await make_redis()
    assert fanout.channel == "{" + fanout.prefix + "}:pub"
    got = Collector()
    fanout.register(got)
    raw.publish(fanout.channel, "junk without newlines")
    offset = fanout.publish("junk:a", {"ok": True})
    assert [m.offset for m in await got.wait_count("junk:a", 1)] == [offset]
    assert [m.topic for m in got.messages] == ["junk:a"]


async def test_a_batch_shares_frames_of_about_256_kib(make_redis: MakeRedis, redis_url: str) -> None:
    """publish_many sends its messages in few pub/sub frames (four lines a message), each ending at
    the message that takes it past FRAME_BYTES, so no frame nears Redis' pub/sub output limit; the
    listening fan-out gets every message in order."""
    fanout = await make_redis()
    got = Collector()
    fanout.register(got)
    watcher = redis.Redis.from_url(redis_url)
    pubsub = watcher.pubsub()
    pubsub.subscribe(fanout.channel)
    try:
        assert pubsub.get_message(timeout=WAIT)["type"] == "subscribe"  # type: ignore[index]
        big = "x" * (200 * 1024)
        batch = [("frames:a", {"i": i, "s": big if i in (3, 4, 5) else ""}) for i in range(20)]
        offsets = await fanout.apublish_many(batch)
        frames = []
        while sum(len(parse_frames(f) or []) for f in frames) < 20:
            message = pubsub.get_message(timeout=WAIT)
            assert message is not None, "a frame of the batch never came"
            frames.append(message["data"])
    finally:
        pubsub.close()
        watcher.close()
    assert [len(parse_frames(f) or []) for f in frames] == [5, 15]
    assert all(len(f) < FRAME_BYTES + 210 * 1024 for f in frames)
    assert offsets_of(await got.wait_count("frames:a", 20)) == offsets


async def test_a_batch_of_40_mb_reaches_a_listening_server_that_stays_subscribed(make_redis: MakeRedis,
                                                                                raw: redis.Redis) -> None:
    """A publish_many of 1,000 messages of 40 KB (more than Redis keeps for a pub/sub client before it
    drops it, if one script call published them all) goes in calls of about 4 MiB: the listener
    gets every message and keeps its one subscription."""
    fanout = await make_redis()
    got = Collector()
    fanout.register(got)
    [before] = listeners(raw)
    offsets = await fanout.apublish_many([("heavy:redis", {"i": i, "s": "x" * 40_000}) for i in range(1000)])
    received = await got.wait_count("heavy:redis", 1000, timeout=60)
    assert offsets_of(received) == offsets
    [after] = listeners(raw)
    assert after["id"] == before["id"], "the listener was dropped and reconnected"


async def test_a_batch_of_text_beyond_ascii_goes_in_calls_of_at_most_4_mib_of_bytes(
        make_redis: MakeRedis, private_redis: PrivateRedis, raw_private: redis.Redis) -> None:
    """The 4 MiB a publish_many script call carries at most are bytes, as Redis holds them: a batch
    of 16 MiB of three-byte characters (5.3 million of them) goes in four calls, not two, and
    arrives whole."""
    fanout = await make_redis(url=private_redis.url)
    got = Collector()
    fanout.register(got)
    fanout.publish("wide:warm", {})  # loads the script, so that the batch's calls are all that count below
    raw_private.config_resetstat()
    chars = (256 * 1024 - 20) // 3
    offsets = await fanout.apublish_many([("wide:a", {"i": i, "s": "語" * chars}) for i in range(64)])
    calls = int(raw_private.info("commandstats")["cmdstat_evalsha"]["calls"])
    assert calls == 4, f"the batch went in {calls} script calls of {64 // calls * 256} KiB each"
    received = await got.wait_count("wide:a", 64, timeout=60)
    assert offsets_of(received) == offsets and all(json.loads(m.data_json)["s"] == "語" * chars for m in received)


async def test_a_topic_that_listeners_would_drop_is_refused_before_anything_is_published(
        make_redis: MakeRedis) -> None:
    """The fan-out object refuses a topic its listeners could not parse (non-ASCII, a newline, too
    long) with InvalidTopic, and nothing of the batch is written: published, it would take the
    batch's other messages in its frame down with it."""
    fanout = await make_redis()
    got = Collector()
    fanout.register(got)
    before = fanout.latest_offset("plain:a")
    for bad in ("café:b", "line\nbreak", "x" * 201):
        with pytest.raises(livepush.InvalidTopic):
            fanout.publish(bad, {"i": 0})
        with pytest.raises(livepush.InvalidTopic):
            await fanout.apublish_many([("plain:a", {"i": 0}), (bad, {"i": 1})])
    assert fanout.latest_offset("plain:a") == before
    offset = fanout.publish("plain:a", {"i": 2})
    assert offsets_of(await got.wait_count("plain:a", 1)) == [offset]


async def test_a_topic_that_is_not_a_str_is_refused_as_an_invalid_topic(make_redis: MakeRedis) -> None:
    """publish() on the fan-out object with a topic that is not text (an id passed as it is)
    raises InvalidTopic naming it, as livepush.publish() does, not a TypeError from a regex."""
    fanout = await make_redis(listen=False)
    for bad in (123, None):
        with pytest.raises(livepush.InvalidTopic, match=f"invalid topic {bad!r}"):
            fanout.publish(bad, {"i": 0})  # type: ignore[arg-type]
        with pytest.raises(livepush.InvalidTopic, match=f"invalid topic {bad!r}"):
            await fanout.apublish(bad, {"i": 0})  # type: ignore[arg-type]


def test_a_frame_with_a_bad_message_or_a_broken_line_count_is_not_ours() -> None:
    """parse_frames takes a frame of one message (four lines) or of several after a `*` line (which
    a server from before batch frames refuses as a topic); a frame whose lines do not add up, or
    with one bad message, is refused whole."""
    one = b"t:a\n5-0\n0-0\n{}"
    two = b"*\n" + one + b"\n" + b"t:b\n6-0\n0-0\n[1]"
    assert [m.topic for m in parse_frames(two) or []] == ["t:a", "t:b"]
    assert [m.data_json for m in parse_frames(one) or []] == ["{}"]
    assert parse_frames(two[2:]) is None, "several messages come only after a '*' line"
    assert parse_frames(two + b"\nextra") is None
    assert parse_frames(b"*\n" + one + b"\n" + b"t:b\nnot-an-id\n0-0\n[1]") is None
    assert parse_frames(b"") is None and parse_frames(b"*") is None


# ---- connections --------------------------------------------------------------------------------


def test_calls_on_two_live_event_loops_keep_one_connection_each(private_redis: PrivateRedis,
                                                                raw_private: redis.Redis) -> None:
    """apublish() and history() from two event loops that both stay alive (a web app's and a worker
    thread's) keep a connection per loop: taking turns opens no new one each time, and
    release_loop() on each closes its own. (One thread runs both loops, so the turns are certain.)"""
    fanout = RedisFanOut(private_redis.url)
    loops = [asyncio.new_event_loop() for _ in range(2)]
    try:
        before = int(raw_private.info("stats")["total_connections_received"])
        for i in range(20):
            loop = loops[i % 2]
            offset = loop.run_until_complete(fanout.apublish("turns:a", {"i": i}))
            assert loop.run_until_complete(fanout.history("turns:a", offset)) == History([], offset, False)
        opened = int(raw_private.info("stats")["total_connections_received"]) - before
        assert opened == 2, f"40 calls taking turns on two loops opened {opened} connections"
        for loop in loops:
            loop.run_until_complete(fanout.release_loop())
        # Redis sees a closed connection go at its next turn, which may come after our CLIENT LIST.
        wait_for(lambda: [c for c in raw_private.client_list() if c.get("name") == "livepush-publisher"] == [],
                 message="Redis to see both loops' connections closed")
    finally:
        for loop in loops:
            loop.close()
        fanout.close()


def test_sync_code_running_each_call_on_a_new_event_loop_keeps_no_connection_per_call(
        private_redis: PrivateRedis, raw_private: redis.Redis) -> None:
    """Sync web code that runs each async call with asyncio.run() (a new loop each time) leaves no
    client behind per call: a loop that ended is dropped, and its connection closes."""
    fanout = RedisFanOut(private_redis.url)
    try:
        for i in range(30):
            asyncio.run(fanout.apublish("runs:a", {"i": i}))
        gc.collect()
        assert len(fanout._loops._clients) == 1
        # Redis sees a closed connection go at its next turn, which may come after our CLIENT LIST.
        wait_for(lambda: len([c for c in raw_private.client_list() if c.get("name") == "livepush-publisher"]) <= 1,
                 message="30 calls, each on its own loop, to leave at most one connection open")
    finally:
        fanout.close()


@pytest.mark.parametrize("other", ["takes its first client", "releases its client"])
def test_a_loop_taking_its_client_while_another_threads_loop_changes_its_own_gets_one(other: str) -> None:
    """An event loop takes its first client while a loop in another thread (sync code calling
    asyncio.run() in worker threads) takes or releases its own at the same moment: the call
    returns a client, rather than fail with 'dictionary changed size during iteration' while it
    drops the loops that ended."""
    checking, changed = threading.Event(), threading.Event()

    class EndedLoop:
        """A loop that ended, whose check holds the first thread inside its walk for a moment."""

        def is_closed(self) -> bool:
            checking.set()
            changed.wait(2)  # the other loop's change lands now, unless it has to wait its turn
            return True

    class Client:
        async def aclose(self) -> None: ...

    clients: LoopClients[Client] = LoopClients(Client)
    failures: list[BaseException] = []

    async def take() -> None:
        clients.get()

    def first() -> None:
        try:
            asyncio.run(take())
        except BaseException as exc:
            failures.append(exc)

    thread = threading.Thread(target=first)

    async def meanwhile() -> None:
        if other == "releases its client":
            clients.get()
        clients._clients[EndedLoop()] = Client()  # type: ignore[index]
        thread.start()
        assert await asyncio.to_thread(checking.wait, WAIT)
        if other == "releases its client":
            await clients.release_loop()
        else:
            clients.get()
        changed.set()

    asyncio.run(meanwhile())
    thread.join(WAIT)
    assert not thread.is_alive() and failures == []


def test_a_child_forked_while_a_parent_thread_was_inside_publish_publishes(redis_url: str, raw: redis.Redis) -> None:
    """A process forked while another of its threads was inside publish() (holding the fan-out's
    lock for its client: a server's master that publishes from threads, then forks its workers)
    publishes in the child all the same, and the parent goes on."""
    fanout = RedisFanOut(redis_url)
    try:
        first = fanout.publish("forked:a", {"from": "parent"})
        with fanout._sync_lock:  # as a parent thread inside publish() holds it at the fork
            pid = fork_running(lambda: fanout.publish("forked:a", {"from": "child"}))
        assert forked_exit_status(pid, WAIT) == 0, "the child failed to publish"
        fanout.publish("forked:a", {"from": "parent"})
        entries = raw.xrange(fanout.key_prefix + "forked:a", first, "+")
        assert [json.loads(fields["d"])["from"] for _, fields in entries] == ["parent", "child", "parent"]
    finally:
        fanout.close()


async def test_a_url_written_for_another_client_still_listens_replays_and_names_the_listener(
        redis_url: str, make_redis: MakeRedis, raw: redis.Redis) -> None:
    """A LIVEPUSH_REDIS_URL written for another client (`?protocol=3&decode_responses=true&
    client_name=app`) changes nothing of livepush's connections: the fan-out listens, delivers
    and replays history (RESP3 left the SUBSCRIBE unconfirmed, text replies made every replay a
    reset), and its listener keeps the name `livepush status` finds it by."""
    fanout = await make_redis(url=f"{redis_url}?protocol=3&decode_responses=true&client_name=app")
    assert len(listeners(raw)) == 1
    got = Collector()
    fanout.register(got)
    rendered = await fanout.alatest_offset("shapes:a")
    offsets = [fanout.publish("shapes:a", {"i": i}) for i in range(3)]
    assert offsets_of(await got.wait_count("shapes:a", 3)) == offsets
    assert offsets_of(await read_history(fanout, "shapes:a", rendered)) == offsets


async def test_listen_holds_one_subscription_and_aclose_releases_it(make_redis: MakeRedis, raw: redis.Redis) -> None:
    """listen() opens one pub/sub connection; constructing and publishing open none; aclose() releases it."""
    fanout = await make_redis(listen=False)
    fanout.publish("conn:a", {"i": 0})
    assert listeners(raw) == []
    await fanout.listen()
    [listener] = listeners(raw)
    assert listener["sub"] == "1" or listener["sub"] == 1
    await fanout.listen()  # a second call changes nothing
    assert len(listeners(raw)) == 1
    await fanout.aclose()
    await async_wait_for(lambda: listeners(raw) == [], WAIT, message="the listener connection to close")
    assert not fanout.listening


async def test_listen_after_aclose_subscribes_again_and_delivers(make_redis: MakeRedis, raw: redis.Redis) -> None:
    """A fan-out closed and then listened on again (an app's lifespan run twice) holds a
    subscription again and delivers to its receivers, rather than return as if it listened."""
    fanout = await make_redis()
    got = Collector()
    fanout.register(got)
    await fanout.aclose()
    await async_wait_for(lambda: listeners(raw) == [], WAIT, message="the listener connection to close")
    await fanout.listen()
    assert fanout.listening
    assert len(listeners(raw)) == 1
    offset = await fanout.apublish("relisten:a", {"i": 0})
    assert offsets_of(await got.wait_count("relisten:a", 1)) == [offset]


async def test_two_listen_calls_at_once_hold_one_subscription_and_deliver_each_message_once(
    make_redis: MakeRedis, raw: redis.Redis
) -> None:
    """listen() called twice concurrently (two tasks of an app's startup) opens one pub/sub
    connection and one reader: each message arrives once, and aclose() leaves none subscribed."""
    fanout = await make_redis(listen=False)
    await asyncio.wait_for(asyncio.gather(fanout.listen(), fanout.listen()), WAIT)
    got = Collector()
    fanout.register(got)
    offsets = [await fanout.apublish("twice:a", {"i": i}) for i in range(3)]
    await got.wait_count("twice:a", 3)
    assert offsets_of(got.raw) == offsets
    assert len(listeners(raw)) == 1
    await fanout.aclose()
    await async_wait_for(lambda: listeners(raw) == [], WAIT, message="every listener connection to close")


async def test_a_listener_that_redis_refuses_to_take_back_says_why_at_once(
    make_redis: MakeRedis, private_redis: PrivateRedis, raw_private: redis.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    """A listener whose connection was dropped and whom Redis then refuses (its password changed)
    warns with the reason and the fix at its first failed attempt, not only in debug lines, saying
    how often it tries again, and is back once Redis takes it again."""
    fanout = await make_redis(url=private_redis.url)
    resynced = asyncio.Event()
    fanout.on_resync(resynced.set)
    with caplog.at_level(logging.WARNING, logger="livepush.redis.subscriber"):
        raw_private.config_set("requirepass", "rotated-pw")  # this connection stays authenticated
        try:
            raw_private.client_kill_filter(_type="pubsub")
            await async_wait_for(
                lambda: any("needs a password, which LIVEPUSH_REDIS_URL does not give" in r.getMessage()
                            for r in caplog.records), WAIT, message="a warning saying the password was refused")
        finally:
            raw_private.config_set("requirepass", "")
        await asyncio.wait_for(resynced.wait(), WAIT)
    assert fanout.listening
    assert "rotated-pw" not in caplog.text
    assert "still cannot subscribe again, trying again about every 1 s" in caplog.text, caplog.text


async def test_restart_without_persistence_resets_and_keeps_delivering(
    make_redis: MakeRedis, private_redis: PrivateRedis, caplog: pytest.LogCaptureFixture
) -> None:
    """After Redis restarts empty, old offsets get None (reset), the listener is back, one warning per outage."""
    fanout = await make_redis(url=private_redis.url)
    got = Collector()
    fanout.register(got)
    resynced = asyncio.Event()
    fanout.on_resync(resynced.set)
    offsets = [fanout.publish("empty:a", {"i": i}) for i in range(3)]
    await got.wait_count("empty:a", 3)

    with caplog.at_level(logging.DEBUG, logger="livepush.redis.subscriber"):
        private_redis.stop(save=False)
        await async_wait_for(lambda: not fanout.listening, WAIT, message="listening to drop")
        # Let several reconnect attempts fail: still one warning for the outage.
        await async_wait_for(
            lambda: sum("reconnect failed" in r.getMessage() for r in caplog.records) >= 3, WAIT, message="3 failed attempts"
        )
        private_redis.start()
        await asyncio.wait_for(resynced.wait(), WAIT)
    lost = [r for r in caplog.records if r.levelno == logging.WARNING and "lost the Redis listener" in r.getMessage()]
    assert len(lost) == 1

    assert await fanout.history("empty:a", offsets[-1]) is None, "the chain is gone: the client must reset"
    origin = fanout.latest_offset("empty:a")
    assert origin.startswith("0-") and offset_key(origin) < offset_key(offsets[0])
    fresh = fanout.publish("empty:a", {"i": 3})
    received = await got.wait_count("empty:a", 4)
    assert (received[-1].offset, received[-1].prev) == (fresh, origin)


@pytest.mark.xfail(strict=True, reason=(
    "a restored snapshot holds a chain that looks whole: the first message published after the "
    "restart names the snapshot's newest entry as its predecessor, so nothing in Redis shows the "
    "lost tail; either the fan-out learns of restarts (an epoch that a restart changes) or the "
    "guarantees promise recovery across a restart only with appendfsync always (docs/guarantees.md "
    "names this hole)"))
async def test_a_restart_from_a_snapshot_that_lost_the_newest_messages_resets_a_client_from_before_them(
    make_redis: MakeRedis, private_redis: PrivateRedis
) -> None:
    """Redis with RDB persistence restarts from its last snapshot, which lacks the messages
    published after it. A client that saw a message from before the snapshot and resumes after
    the restart (and a new publish) must get `reset` (None), not the snapshot's rest and the new
    message with the lost ones silently left out."""
    fanout = await make_redis(url=private_redis.url, listen=False)
    saved = [fanout.publish("tail:a", {"i": i}) for i in range(3)]
    snapshot = redis.Redis.from_url(private_redis.url)
    try:
        snapshot.save()  # what `save 60 1000` does now and then
    finally:
        snapshot.close()
    lost = [fanout.publish("tail:a", {"i": i}) for i in range(3, 5)]
    private_redis.stop(save=False)  # a crash: what came after the snapshot is gone
    private_redis.start()
    fanout = await make_redis(url=private_redis.url, listen=False)
    after = fanout.publish("tail:a", {"i": 5})
    replay = await read_history(fanout, "tail:a", saved[0])
    assert replay is None, f"since={saved[0]} replayed {offsets_of(replay)} (then {after}), hiding the lost {lost}"


async def test_a_listen_that_failed_and_is_tried_again_delivers_each_message_once(
    make_redis: MakeRedis, private_redis: PrivateRedis
) -> None:
    """Redis is away at boot: listen() raises ListenError; called again once Redis is back, it
    listens, and each message reaches a receiver once (the first try's handler is not kept twice)."""
    fanout = await make_redis(url=private_redis.url, listen=False)
    private_redis.stop(save=False)
    with pytest.raises(livepush.ListenError):
        await asyncio.wait_for(fanout.listen(), 15)
    private_redis.start()
    await asyncio.wait_for(fanout.listen(), 15)
    got = Collector()
    fanout.register(got)
    offsets = [await fanout.apublish("retry:a", {"i": i}) for i in range(3)]
    await got.wait_count("retry:a", 3)
    # In order: a second copy of a message would have come before the next message.
    assert offsets_of(got.raw[:3]) == offsets and len(got.raw) == 3


async def test_a_silent_server_is_detected_by_the_heartbeat(make_redis: MakeRedis, private_redis: PrivateRedis) -> None:
    """A Redis that stops answering without closing the socket is declared lost within a few heartbeats."""
    fanout = await make_redis(url=private_redis.url, heartbeat=0.1)
    got = Collector()
    fanout.register(got)
    resynced = asyncio.Event()
    fanout.on_resync(resynced.set)
    admin = redis.Redis.from_url(private_redis.url)
    try:
        admin.execute_command("CLIENT", "PAUSE", "1500", "ALL")  # PING goes unanswered meanwhile
        await async_wait_for(lambda: not fanout.listening, WAIT, message="listening to drop")
        await asyncio.wait_for(resynced.wait(), WAIT)
        assert fanout.listening
        offset = await fanout.apublish("pause:a", {"back": True})
        assert [m.offset for m in await got.wait_count("pause:a", 1)] == [offset]
    finally:
        admin.close()
