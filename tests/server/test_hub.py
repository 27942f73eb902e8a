"""The hub's ordering logic, driven directly with the in-memory fan-out and fake subscribers."""

from __future__ import annotations

import asyncio
import json

from livepush.fanout.local import LocalFanOut
from livepush.server.hub import Hub


class Sub:
    def __init__(self) -> None:
        self.frames: list[dict] = []

    def send(self, frame: str) -> None:
        self.frames.append(json.loads(frame))

    def data(self) -> list:
        return [f["data"] for f in self.frames if f["op"] == "message"]


def fan(subs, frame: str) -> None:
    for sub in subs:
        sub.send(frame)


async def settle() -> None:
    for _ in range(20):
        await asyncio.sleep(0)


class YieldingLocal(LocalFanOut):
    """Reads that yield to the loop, as a real database read does: joins can overlap."""

    async def alatest_offset(self, topic: str) -> str:
        await asyncio.sleep(0)
        return await super().alatest_offset(topic)

    async def history(self, topic: str, since: str):  # type: ignore[no-untyped-def]
        await asyncio.sleep(0)
        return await super().history(topic, since)


async def make() -> tuple[LocalFanOut, Hub]:
    fanout = YieldingLocal()
    await fanout.listen()
    hub = Hub(fanout, fan)
    fanout.register(hub.on_message)
    return fanout, hub


def publish_unheard(fanout: LocalFanOut, topic: str, data: object) -> None:
    """Publish while the listener is away: history gets it, no receiver hears it."""
    loop, fanout._loop = fanout._loop, None
    try:
        fanout.publish(topic, data)
    finally:
        fanout._loop = loop


async def test_subscribers_that_joined_together_are_caught_up_after_a_listener_gap() -> None:
    """Two subscribers joining at once on a quiet topic still get what a listener gap missed."""
    fanout, hub = await make()
    for i in range(3):
        fanout.publish("t", i)
    await settle()
    a, b = Sub(), Sub()
    await asyncio.gather(hub.subscribe(a, "t", None, 1), hub.subscribe(b, "t", None, 2))
    publish_unheard(fanout, "t", 3)
    publish_unheard(fanout, "t", 4)
    await hub.resync()
    await settle()
    assert a.data() == [3, 4] and b.data() == [3, 4]


async def test_a_message_that_skips_ahead_is_filled_from_history_in_order() -> None:
    """A live message whose prev is not the cursor makes the hub read the gap first."""
    fanout, hub = await make()
    sub = Sub()
    await hub.subscribe(sub, "t", None, 1)
    fanout.publish("t", "first")
    await settle()
    publish_unheard(fanout, "t", "missed")
    fanout.publish("t", "after")
    await settle()
    assert sub.data() == ["first", "missed", "after"]


async def test_duplicates_are_dropped_and_replay_meets_live_without_a_seam() -> None:
    """A replayed message that also arrives live is delivered once."""
    fanout, hub = await make()
    for i in range(5):
        fanout.publish("t", i)
    await settle()
    sub = Sub()
    task = asyncio.ensure_future(hub.subscribe(sub, "t", "2", 1))
    fanout.publish("t", 5)  # arrives while the replay is read
    await task
    await settle()
    # Offset N carries data N-1: after "2" come offsets 3, 4, 5 (replayed) and 6 (live).
    assert sub.data() == [2, 3, 4, 5]


async def test_a_gap_history_cannot_fill_becomes_reset_then_live() -> None:
    """If the missed range is gone, subscribers get reset, then the live stream goes on."""
    fanout, hub = await make()
    sub = Sub()
    await hub.subscribe(sub, "t", None, 1)
    fanout.publish("t", "a")
    await settle()
    publish_unheard(fanout, "t", "lost")
    fanout._logs["t"].entries.clear()  # the history lost it
    fanout._logs["t"].dropped_through = 2
    fanout.publish("t", "b")
    await settle()
    ops = [f["op"] for f in sub.frames if f["op"] in ("message", "reset")]
    assert ops == ["message", "reset"] and sub.data() == ["a"]
    fanout.publish("t", "c")
    await settle()
    assert sub.data() == ["a", "c"]
