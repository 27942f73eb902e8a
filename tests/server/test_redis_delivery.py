"""Redis fan-out through a real server: a Redis restart while clients stay subscribed."""

from __future__ import annotations

import asyncio

import pytest

from tests.server.conftest import make_settings, start_served
from tests.support.waiting import async_wait_for
from tests.support.wsclient import WSClient
from tests.test_fanout_conformance import PrivateRedis, private_redis  # noqa: F401  (a fixture)
from tests.server.test_server import http_get


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
