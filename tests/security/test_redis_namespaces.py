"""Deployments on one Redis stay apart: every channel and key is under LIVEPUSH_REDIS_PREFIX
(default `livepush:<db number>`), so two deployments on databases 11 and 12 of one server hear
neither each other's messages nor each other's revocations."""

from __future__ import annotations


import time
from collections.abc import AsyncIterator

import pytest
import redis

from livepush import sessions
from livepush.fanout.redis import RedisFanOut
from livepush.sessions.revocations import RedisRevocations
from tests.server.conftest import Served, make_settings, start_served
from tests.support.wsclient import WSClient


def on_db(url: str, db: int) -> str:
    return url.rsplit("/", 1)[0] + f"/{db}"


@pytest.fixture
async def two_deployments(redis_url: str, secret: str) -> AsyncIterator[tuple[Served, Served]]:
    a = await start_served(make_settings("redis", secret, None, on_db(redis_url, 11)))
    b = await start_served(make_settings("redis", secret, None, on_db(redis_url, 12)))
    try:
        yield a, b
    finally:
        await a.stop()
        await b.stop()


async def test_a_deployment_does_not_hear_another_ones_messages(two_deployments: tuple[Served, Served]) -> None:
    """A message published by deployment 11 reaches its own subscriber and not deployment 12's, on the same topic."""
    a, b = two_deployments
    ours, theirs = await WSClient.open(a.url), await WSClient.open(b.url)
    for client, served in ((ours, a), (theirs, b)):
        assert (await client.subscribe(served.sign("room:shared")))["op"] == "subscribed"
    await a.publish("room:shared", {"from": "deployment 11"})
    assert (await ours.messages(1))[0]["data"] == {"from": "deployment 11"}
    await b.publish("room:shared", {"from": "deployment 12"})
    (got,) = await theirs.messages(1)
    assert got["data"] == {"from": "deployment 12"}  # the first thing 12 heard is its own
    await ours.close()
    await theirs.close()


async def test_a_deployment_does_not_revoke_another_ones_sessions(two_deployments: tuple[Served, Served]) -> None:
    """revoke_subject() on deployment 11 closes its session of that subject and leaves deployment 12's open."""
    a, b = two_deployments
    token = sessions.issue("dave")
    ours = await WSClient.open(a.url, additional_headers={"Cookie": f"livepush_session={token}"})
    theirs = await WSClient.open(b.url, additional_headers={"Cookie": f"livepush_session={token}"})
    store = RedisRevocations(a.settings.redis_url)  # type: ignore[arg-type]
    try:
        await store.aadd_subject("dave", time.time())
    finally:
        await store.aclose()
    assert await ours.closed_with(timeout=2) == 4403
    await theirs.send({"op": "ping", "ref": 1})
    assert await theirs.recv() == {"op": "pong", "ref": 1}
    await theirs.close()


def test_every_key_and_channel_is_under_the_prefix(redis_url: str) -> None:
    """After a publish and a revocation, every key in Redis starts with the deployment's prefix, and the pub/sub channel does too."""
    fanout = RedisFanOut(on_db(redis_url, 11))
    store = RedisRevocations(on_db(redis_url, 11))
    assert fanout.prefix == store.prefix == "livepush:11"
    fanout.publish("room:keys", {"n": 1})
    store.add_session("sid", time.time() + 60)
    store.add_subject("erin", time.time())
    raw = redis.Redis.from_url(on_db(redis_url, 11))
    keys = [k.decode() for k in raw.keys("*")]
    raw.close()
    fanout.close()
    assert keys and all(k.startswith("livepush:11:") for k in keys), keys
    assert fanout.channel.startswith("livepush:11:") and store.channel.startswith("livepush:11:")
    custom = RedisFanOut(redis_url, prefix="staging")
    assert custom.channel == "staging:pub" and custom.key_prefix == "staging:h:"


