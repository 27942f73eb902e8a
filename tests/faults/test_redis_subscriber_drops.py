"""Redis drops the servers' pub/sub connection while messages are published, Redis itself staying
up: an operator's CLIENT KILL, again and again, and the subscriber's output buffer passing
`client-output-buffer-limit pubsub`, which makes Redis close it. Each loss shows on /healthz and
heals by itself, the server says what happened and why in one line at most once a minute (no
traceback, no line of an outage: Redis never was away), and connected clients miss nothing: the
history held everything, so no `reset` either (docs/guarantees.md, recovery across the server's
own listener gaps)."""

from __future__ import annotations

import asyncio
import re
import time

import redis

from livepush.fanout.redis import RedisFanOut
from tests.faults.clients import ResumingClient, delivery_report, wait_delivered
from tests.faults.fleet import Fleet
from tests.faults.load import Published
from tests.faults.traffic import Traffic
from tests.support.waiting import async_wait_for

TOPICS = ["room:a", "room:b", "room:c"]
# The client name every server's subscription starts with (livepush.redis.client.listener_name).
LISTENER_NAME = "livepush-listener:"
KILLS = 10
# Publishes that must return between one recovery and the next kill.
LOAD_BETWEEN = 20
# Seconds within which a server notices the loss and subscribes again (reconnects start at 0.05-0.15 s).
RECOVERY_BOUND = 10.0
# A pub/sub output limit far below one burst of the test (Redis closes a subscriber past it at once).
SMALL_PUBSUB_LIMIT = "pubsub 64kb 0 0"
# The bursts: each a publish_many of 12 messages of about 16 KB on three topics, one pub/sub frame
# past the limit above; per topic, what a gap misses stays below a client's share of waiting
# messages (256 KiB, docs/reference.md §8), so that a `reset` could only come from the gap.
BURSTS, BURST, PAD = 5, 12, "x" * 16_000
# What a server says when Redis closed its subscription and took it back at once.
CLOSED = "Redis closed this server's subscription"
# Its cause and where the operator reads more, in the same line.
CAUSE = "(it was killed, or passed client-output-buffer-limit pubsub: see docs/operations.md#redis-closing-a-subscription)"
# What it adds to a line said after others it kept quiet.
QUIET = "more like it in the last"


def listener_ids(admin: redis.Redis) -> list[int]:
    """The ids of the servers' pub/sub connections on this Redis."""
    return [int(c["id"]) for c in admin.client_list(_type="pubsub") if str(c.get("name", "")).startswith(LISTENER_NAME)]


def kill_listeners(admin: redis.Redis) -> int:
    """CLIENT KILL each server's pub/sub connection (by id: nothing else of the test is touched)."""
    return sum(int(admin.client_kill_filter(_id=i)) for i in listener_ids(admin))


def said_closed(child_log: str, losses: int, seconds: float) -> None:
    """One server's log after `losses` subscriptions Redis closed within `seconds`: a line that
    names the cause at the first, then at most one a minute, each counting the ones kept quiet
    since the last (those after the last line are not said), and no line of an outage (lost /
    back), since Redis never was away."""
    lines = [line for line in child_log.splitlines() if CLOSED in line]
    assert lines and CAUSE in lines[0] and QUIET not in lines[0], child_log
    assert len(lines) <= 1 + seconds // 60, f"said more than once a minute:\n{child_log}"
    quiet = sum(int(re.search(rf"\((\d+) {QUIET}", line).group(1)) for line in lines[1:])  # type: ignore[union-attr]
    assert len(lines) + quiet <= losses, child_log
    assert "lost the Redis listener" not in child_log and "is back after" not in child_log, child_log


async def test_killing_the_servers_redis_subscription_again_and_again_turns_healthz_503_then_200_and_loses_no_message(
        fleet: Fleet, redis_url: str) -> None:
    """CLIENT KILL of every server's pub/sub connection, 10 times while publishing: each time every
    server answers 503 and then 200 again, says so in a line without a traceback, no server exits,
    and every published message reaches every client, in order, once, without a reset (Redis kept
    every stream) or a reconnect."""
    servers = await fleet.serve(2, fanout="redis", redis_url=redis_url)
    traffic = await Traffic.start(fleet, servers, RedisFanOut(redis_url), TOPICS)
    admin = redis.Redis.from_url(redis_url, socket_timeout=5)
    started = time.monotonic()
    try:
        for kill in range(1, KILLS + 1):
            await traffic.reaches(LOAD_BETWEEN * kill)
            mark = traffic.watch.mark()
            killed = await asyncio.to_thread(kill_listeners, admin)
            assert killed == len(servers), f"kill {kill}: {killed} subscriptions, not one per server"
            await async_wait_for(lambda: traffic.watch.dipped_and_back(mark), RECOVERY_BOUND,
                                 message=f"kill {kill}: every server to answer 503 and then 200")
            assert fleet.still_running() == [], f"kill {kill}: a server exited"
    finally:
        await traffic.stop()
        admin.close()

    report = await traffic.delivered()
    assert traffic.resets() == [0] * len(traffic.clients), (
        f"Redis kept every stream: no reset is due\n{report}\n{fleet.server_log('reset', 'history')}")
    for server in servers:
        said_closed(server.child.stderr(), KILLS, time.monotonic() - started)
    assert "Traceback" not in fleet.server_log(), fleet.server_log()
    await traffic.ends_cleanly(fleet)


async def test_a_subscription_redis_drops_past_its_pubsub_output_limit_heals_and_its_clients_miss_nothing(
        fleet: Fleet, redis_url: str) -> None:
    """With `client-output-buffer-limit pubsub` below one burst of publish_many, each burst makes
    Redis close the server's subscription: the server says so in a line (no traceback), subscribes
    again, reads what it missed from the streams, and its clients get every message in order,
    once, with no reset and no reconnect; it answers 200 again once the limit is back."""
    (server,) = await fleet.serve(1, fanout="redis", redis_url=redis_url)
    admin = redis.Redis.from_url(redis_url, socket_timeout=5)
    before = admin.config_get("client-output-buffer-limit")["client-output-buffer-limit"]
    fanout = RedisFanOut(redis_url)
    clients = [await ResumingClient.open(server.url, {t: fleet.sign(t) for t in TOPICS}, name=f"client{i}")
               for i in range(2)]
    published: list[Published] = []
    started = time.monotonic()

    try:
        admin.config_set("client-output-buffer-limit", SMALL_PUBSUB_LIMIT)
        for b in range(BURSTS):
            # Subscribed again (healthy) before each burst, so that each burst drops it once more.
            await server.child.await_healthy(RECOVERY_BOUND)
            subscribed = listener_ids(admin)
            batch = [(TOPICS[i % len(TOPICS)], {"n": b * BURST + i, "pad": PAD}) for i in range(BURST)]
            offsets = await fanout.apublish_many(batch)
            published += [Published(t, o, d["n"], 0.0) for (t, d), o in zip(batch, offsets, strict=True)]
            # The server's lines are said at most once a minute: a new subscription shows each drop.
            await async_wait_for(lambda: listener_ids(admin) not in ([], subscribed), RECOVERY_BOUND,
                                 message=f"burst {b}: Redis to drop the subscription past its output limit")
        admin.config_set("client-output-buffer-limit", before)
        await server.child.await_healthy(RECOVERY_BOUND)
        await wait_delivered(published, clients, 20)
        report = delivery_report(published, clients)
        assert all(not c.not_newer for c in clients), f"duplicates or disorder:\n{report}"
        assert all(c.reconnects == 0 for c in clients), f"a client was disconnected:\n{report}"
        assert all(c.resets() == 0 for c in clients), (
            f"Redis kept every stream: no reset is due\n{report}\n{fleet.server_log()}")
    finally:
        admin.config_set("client-output-buffer-limit", before)
        admin.close()
        for c in clients:
            await c.close()
        await fanout.aclose()
    said_closed(server.child.stderr(), BURSTS, time.monotonic() - started)
    assert "Traceback" not in fleet.server_log(), fleet.server_log()
    assert fleet.still_running() == []
    assert set(fleet.stop_all().values()) == {0}
