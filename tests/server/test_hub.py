"""The hub's ordering logic, driven directly with the in-memory fan-out and fake subscribers.

The local fan-out hands receivers each message with its data; `DoorbellLocal` hands them only
doorbells (offset and prev, no data), as the Postgres fan-out does, so the hub must read every
message from history."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator, Mapping
from typing import Any

import pytest

from livepush.errors import ConfigError, DependencyError
from livepush.fanout.base import HISTORY_PAGE, FanOut, History
from livepush.fanout.local import LocalFanOut, _new_epoch
from livepush.server.hub import KEEP_NEW_SECONDS, Hub
from livepush.types import Message, Receiver
from tests.support.fanouts import WAIT
from tests.support.waiting import async_wait_for
from tests.test_fanout_conformance import MakeFanOut, kind, make_fanout  # noqa: F401  (fixtures)


class Sub:
    def __init__(self) -> None:
        self.frames: list[dict] = []

    def send(self, frame: str) -> None:
        self.frames.append(json.loads(frame))

    def data(self) -> list:
        return [f["data"] for f in self.frames if f["op"] == "message"]

    async def drain(self) -> None:
        """A client that has read everything sent to it as soon as it was sent."""


def fan(subs, frame: str, *_topic_and_kind: object) -> None:
    for sub in subs:
        sub.send(frame)


async def settle() -> None:
    for _ in range(20):
        await asyncio.sleep(0)


class YieldingLocal(LocalFanOut):
    """Reads that yield to the loop, as a real database read does: joins can overlap."""

    async def alatest_offset(self, topic: str, *, timeout: float | None = None) -> str:
        await asyncio.sleep(0)
        return await super().alatest_offset(topic)

    async def history(self, topic: str, since: str, *, limit: int = HISTORY_PAGE,
                      timeout: float | None = None) -> History | None:
        await asyncio.sleep(0)
        return await super().history(topic, since, limit=limit)


class DoorbellLocal(YieldingLocal):
    """Receivers get doorbells only, as from the Postgres fan-out; history reads are counted,
    and each waits for `gate` (open unless a test closes it): before it reads, or, with
    `snapshot_first`, after it read (as a database read answers from its snapshot)."""

    def __init__(self, snapshot_first: bool = False) -> None:
        super().__init__()
        self.reads = 0
        self.batches: list[int] = []  # topics per histories() call: the hub's live reads
        self.gate = asyncio.Event()
        self.gate.set()
        self.snapshot_first = snapshot_first

    def register(self, receiver: Receiver) -> None:
        # Every receiver hears a doorbell only, as from Postgres: the hub reads the data itself.
        super().register(lambda m: receiver(Message(m.topic, m.offset, m.prev, None)))

    async def histories(self, reads: Mapping[str, str]) -> dict[str, History | None]:
        self.batches.append(len(reads))
        return await super().histories(reads)

    async def history(self, topic: str, since: str, *, limit: int = HISTORY_PAGE,
                      timeout: float | None = None) -> History | None:
        self.reads += 1
        if self.snapshot_first:
            page = await super().history(topic, since, limit=limit)
            await self.gate.wait()
            return page
        await self.gate.wait()
        return await super().history(topic, since, limit=limit)


async def make(fanout: LocalFanOut | None = None) -> tuple[LocalFanOut, Hub]:
    fanout = fanout or YieldingLocal()
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


def lose_unheard(fanout: LocalFanOut, topic: str) -> None:
    """After one message: publish a second while the listener is away, and lose it from history
    too, so that the next message reveals a gap history cannot fill."""
    publish_unheard(fanout, topic, "lost")
    fanout._logs[topic].entries.clear()
    fanout._logs[topic].dropped_through = 2


async def test_a_listener_gap_during_a_read_is_caught_up_once_that_read_ends() -> None:
    """A listener that comes back while a read of a topic is under way (that read answering from
    a snapshot taken before the gap): what was published while nobody listened is read and sent
    once that read ends, not left for the topic's next message, which may never come."""
    fanout, hub = await make(DoorbellLocal(snapshot_first=True))
    assert isinstance(fanout, DoorbellLocal)
    sub = Sub()
    await hub.subscribe(sub, "t", None, 1)
    fanout.gate.clear()
    fanout.publish("t", "rung")
    await async_wait_for(lambda: fanout.reads == 1, timeout=5, message="a read under way, its snapshot taken")
    publish_unheard(fanout, "t", "while nobody listened")
    await hub.resync()  # the listener is back
    fanout.gate.set()
    await async_wait_for(lambda: len(sub.data()) == 2, timeout=5, message="the message the listener gap missed")
    assert sub.data() == ["rung", "while nobody listened"]


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


class GatedReads(YieldingLocal):
    """Reads (latest offsets and history) that wait for `gate`, as a slow database does."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = asyncio.Event()

    async def alatest_offset(self, topic: str, *, timeout: float | None = None) -> str:
        await self.gate.wait()
        return await super().alatest_offset(topic)

    async def history(self, topic: str, since: str, *, limit: int = HISTORY_PAGE,
                      timeout: float | None = None) -> History | None:
        await self.gate.wait()
        return await super().history(topic, since, limit=limit)


async def test_a_joiner_that_leaves_during_the_first_read_leaves_the_others_joining() -> None:
    """The first subscriber of a topic goes away (its connection lost) while the topic's first
    read is under way: the one that joined behind it still gets `subscribed` and live messages."""
    fanout = GatedReads()
    fanout, hub = await make(fanout)
    a, b = Sub(), Sub()
    first = asyncio.ensure_future(hub.subscribe(a, "t", None, 1))
    await settle()
    second = asyncio.ensure_future(hub.subscribe(b, "t", None, 2))
    await settle()
    first.cancel()
    await settle()
    fanout.gate.set()
    await asyncio.wait_for(second, 5)
    assert [f["op"] for f in b.frames] == ["subscribed"]
    fanout.publish("t", 1)
    await async_wait_for(lambda: b.data() == [1], timeout=5)
    assert first.cancelled() and a.frames == []


async def test_subscribing_again_from_now_to_a_topic_the_connection_follows_loses_nothing() -> None:
    """A page's second subscription to a topic (no `since`) subscribes the connection again:
    what is published while that subscribe reads still reaches it, once, in order."""
    fanout = GatedReads()
    fanout, hub = await make(fanout)
    fanout.gate.set()
    sub = Sub()
    await hub.subscribe(sub, "t", None, 1)
    fanout.publish("t", 1)
    await async_wait_for(lambda: sub.data() == [1], timeout=5)
    fanout.gate.clear()
    again = asyncio.ensure_future(hub.subscribe(sub, "t", None, 2))
    await settle()
    fanout.publish("t", 2)
    fanout.publish("t", 3)
    await settle()
    fanout.gate.set()
    await asyncio.wait_for(again, 5)
    fanout.publish("t", 4)
    await async_wait_for(lambda: len(sub.data()) >= 4, timeout=5)
    await settle()
    assert sub.data() == [1, 2, 3, 4]


async def test_subscribing_again_from_an_offset_ahead_of_the_connection_loses_nothing_for_the_first() -> None:
    """A page's second subscription to a topic the connection follows, with a `since` ahead of
    what the connection was sent (read from the database while this server's listener lags
    behind it): the connection has one stream of the topic, so it goes on from where it stands,
    and the messages in between still reach the page's first subscription."""
    fanout, hub = await make()
    sub = Sub()
    await hub.subscribe(sub, "t", None, 1)
    fanout.publish("t", 1)
    await async_wait_for(lambda: sub.data() == [1], timeout=5)
    publish_unheard(fanout, "t", 2)
    publish_unheard(fanout, "t", 3)
    ahead = await fanout.alatest_offset("t")  # what the page read: the listener has not heard 2, 3
    await hub.subscribe(sub, "t", ahead, 2)
    fanout.publish("t", 4)
    await async_wait_for(lambda: 4 in sub.data(), timeout=5)
    assert sub.data() == [1, 2, 3, 4]


async def test_subscribing_again_with_a_since_history_cannot_resume_from_loses_nothing_for_the_first() -> None:
    """A page's second subscription to a topic the connection follows, with a `since` history
    cannot resume from (a page cached from an earlier epoch of the topic): that subscription gets
    `subscribed` and `reset`, and the connection's one stream of the topic goes on from where it
    stood, so what the first subscription had not been sent yet still reaches it, in order."""
    fanout, hub = await make()
    sub = Sub()
    await hub.subscribe(sub, "t", None, 1)
    fanout.publish("t", 1)
    await async_wait_for(lambda: sub.data() == [1], timeout=5)
    publish_unheard(fanout, "t", 2)  # committed, not heard live yet: the first one was not sent it
    publish_unheard(fanout, "t", 3)
    await hub.subscribe(sub, "t", "1-1", 2)
    fanout.publish("t", 4)
    await async_wait_for(lambda: 4 in sub.data(), timeout=5)
    await settle()
    assert [f["op"] for f in sub.frames] == ["subscribed", "message", "subscribed", "reset", "message", "message", "message"]
    assert sub.frames[3] == {"op": "reset", "topic": "t", "ref": 2}  # the second's alone: it names its subscribe
    assert sub.data() == [1, 2, 3, 4]


async def test_subscribing_again_with_a_stale_since_to_a_topic_with_no_message_yet_gets_a_reset() -> None:
    """On a topic with no message in its current epoch, the connection's stream stands at the
    topic's origin (`0-EPOCH`), below any real offset: a page's second subscription with a `since`
    of an earlier epoch (a page cached before a restart) compares as ahead of it, yet history cannot
    resume from it. It gets `reset`, as it would alone, not a quiet `subscribed` that leaves the
    page showing what it had; and the topic's first message then reaches the connection once."""
    fanout, hub = await make()
    alone = Sub()
    await hub.subscribe(alone, "u", "1-1", 1)
    assert [f["op"] for f in alone.frames] == ["subscribed", "reset"]
    sub = Sub()
    await hub.subscribe(sub, "t", None, 1)
    await hub.subscribe(sub, "t", "1-1", 2)
    assert [f["op"] for f in sub.frames] == ["subscribed", "subscribed", "reset"]
    assert sub.frames[2] == {"op": "reset", "topic": "t", "ref": 2}
    fanout.publish("t", 1)
    await async_wait_for(lambda: sub.data() == [1], timeout=5)
    await settle()
    assert sub.data() == [1]


async def test_a_reset_that_answers_a_subscribe_names_its_ref_and_one_for_falling_behind_names_none() -> None:
    """A `reset` that answers a subscribe (its `since` history cannot resume from) is about that
    subscription alone, and carries its `ref`, whether it is the connection's first subscription
    of the topic or a second one (a null ref names nothing, so none is sent); a `reset` for a
    subscriber that fell behind is about the topic's stream, heard by every subscription of it on
    the page, and names none."""
    fanout, hub = await make()
    first = Sub()
    await hub.subscribe(first, "u", "1-1", "mine")
    assert first.frames[1] == {"op": "reset", "topic": "u", "ref": "mine"}
    again = Sub()
    await hub.subscribe(again, "u", None, 1)
    await hub.subscribe(again, "u", "1-1", 2)
    assert again.frames[2] == {"op": "reset", "topic": "u", "ref": 2}
    unnamed = Sub()
    await hub.subscribe(unnamed, "u", "1-1", None)
    assert unnamed.frames[1] == {"op": "reset", "topic": "u"}

    behind = await read_on_past_its_buffer(LostHistory(), reset=True)
    assert [f for f in behind.frames if f["op"] == "reset"] == [{"op": "reset", "topic": "burst"}]


async def test_a_reset_for_where_the_connections_stream_stands_names_no_subscribe() -> None:
    """A page's second subscription of a topic from now resumes the connection's stream from where
    it stands: when history no longer holds that place, the stream goes on from the latest
    offset, and the page's first subscription lost what lies between as much as the second. The
    `reset` is the stream's, so it names no subscribe and every subscription hears it."""
    fanout, hub = await make()
    sub = Sub()
    await hub.subscribe(sub, "t", None, 1)
    fanout.publish("t", "a")
    await async_wait_for(lambda: sub.data() == ["a"], message="the first message")
    lose_unheard(fanout, "t")  # the message after "a" is gone from history, unheard
    await hub.subscribe(sub, "t", None, 2)
    assert [f["op"] for f in sub.frames] == ["subscribed", "message", "subscribed", "reset"]
    assert sub.frames[3] == {"op": "reset", "topic": "t"}


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


@pytest.mark.parametrize("moved_on", [False, True], ids=["same-origin", "origin-moved-on"])
async def test_a_topic_anchored_on_an_origin_gets_its_first_message_without_a_reset(moved_on: bool) -> None:
    """A subscriber joins a topic nothing was published on, so the hub's cursor is the origin;
    the topic's first message goes out to it, also when the origin moved on (every half idle
    time) before it: never a reset."""
    fanout, hub = await make(YieldingLocal(history_ttl=0.1, idle_expire=4))
    sub = Sub()
    await hub.subscribe(sub, "anchored:a", None, 1)
    [subscribed] = sub.frames
    if moved_on:

        async def origin_moved_on() -> bool:
            return await fanout.alatest_offset("anchored:never") != subscribed["offset"]

        await async_wait_for(origin_moved_on, 10, message="the origin to move on")
    offset = fanout.publish("anchored:a", "first")
    await async_wait_for(lambda: len(sub.frames) > 1, 10, message="the first message")
    await settle()
    assert [(f["op"], f.get("offset")) for f in sub.frames[1:]] == [("message", offset)]


@contextlib.asynccontextmanager
async def watching(make_fanout: MakeFanOut, topic: str) -> AsyncIterator[tuple[FanOut, Sub]]:
    """A hub on a fan-out of the test's kind whose idle time is a second, and a subscriber of
    `topic` on it (subscribed from now); the hub is closed after."""
    fanout = await make_fanout(history_ttl=0.1, idle_expire=1)
    hub = Hub(fanout, fan)
    fanout.register(hub.on_message)
    try:
        sub = Sub()
        await hub.subscribe(sub, topic, None, 1)
        yield fanout, sub
    finally:
        await hub.aclose()


async def test_a_subscriber_live_through_its_topics_idle_time_gets_the_next_message_without_a_reset(
        make_fanout: MakeFanOut) -> None:
    """A page kept open on a topic published less than once per idle time (a day; here a second)
    has received every message: its next one reaches it as that message, never as `reset`. The hub
    keeps the chains of the topics its subscribers watch, so the fan-out does not forget them while
    they are watched, however long nothing is published and however often history is pruned."""
    async with watching(make_fanout, "kept:a") as (fanout, sub):
        first = await fanout.apublish("kept:a", "first")
        await async_wait_for(lambda: len(sub.frames) > 1, WAIT, message="the first message")
        quiet_since = time.monotonic()

        async def idle_time_passed() -> bool:
            await fanout.prune()  # what every server does meanwhile
            return time.monotonic() - quiet_since > 2 * fanout.idle_expire

        await async_wait_for(idle_time_passed, WAIT, interval=0.05, message="twice the idle time to pass")
        second = await fanout.apublish("kept:a", "second")
        await async_wait_for(lambda: len(sub.frames) > 2, WAIT, message="an answer to the next message")
        await settle()
        assert [(f["op"], f.get("offset")) for f in sub.frames[1:]] == [("message", first), ("message", second)]


async def test_a_subscriber_live_before_a_topics_first_message_gets_it_past_the_idle_time_without_a_reset(
        make_fanout: MakeFanOut) -> None:
    """A subscriber joins a topic nothing was published on, so the hub's cursor is the origin. The
    topic's first message comes more than the idle time later: an origin that old can no longer
    vouch that nothing was published and forgotten meanwhile, but the hub re-reads its topics
    within the idle time and moves its cursor to the origin of the moment while nothing is
    published, so the subscriber, live all along, gets that message, not `reset`."""
    async with watching(make_fanout, "late:a") as (fanout, sub):
        [subscribed] = sub.frames
        seen = {subscribed["offset"]}

        async def past_the_idle_time() -> bool:
            # The origin moves on every half idle time: a third one is past the idle time of the first.
            seen.add(await fanout.alatest_offset("late:never"))
            return len(seen) >= 3

        await async_wait_for(past_the_idle_time, WAIT, interval=0.05, message="the idle time to pass")
        first = await fanout.apublish("late:a", "first")
        await async_wait_for(lambda: len(sub.frames) > 1, WAIT, message="an answer to the first message")
        await settle()
        assert [(f["op"], f.get("offset")) for f in sub.frames[1:]] == [("message", first)]


def keepers() -> list[asyncio.Task[Any]]:
    return [t for t in asyncio.all_tasks() if t.get_name() == "livepush-keep-chains"]


async def test_the_task_that_keeps_the_watched_chains_ends_with_the_last_topic_watched_and_comes_back() -> None:
    """The hub keeps the chains of the message topics watched while any is watched: once the last
    subscriber leaves, that task ends (within KEEP_NEW_SECONDS), rather than wait out a quarter
    of the fan-out's idle time (six hours) for nothing; a topic watched later starts it again, and
    its chain is kept within KEEP_NEW_SECONDS."""
    fanout, hub = await make()
    try:
        for round_no in range(2):
            sub = Sub()
            await hub.subscribe(sub, f"watched:{round_no}", None, 1)
            await async_wait_for(lambda: len(keepers()) == 1, WAIT, message="the keeper to start")
            await asyncio.sleep(KEEP_NEW_SECONDS + 0.2)  # its first keep, of the topic newly watched
            hub.unsubscribe(sub, f"watched:{round_no}")
            await async_wait_for(lambda: not keepers(), KEEP_NEW_SECONDS + WAIT,
                                 message="the keeper to end once no topic is watched")
            assert hub._keeping is None
    finally:
        await hub.aclose()


async def test_duplicates_are_dropped_and_replay_meets_live_without_a_seam() -> None:
    """A replayed message that also arrives live is delivered once."""
    fanout, hub = await make()
    offsets = [fanout.publish("t", i) for i in range(5)]
    await settle()
    sub = Sub()
    task = asyncio.ensure_future(hub.subscribe(sub, "t", offsets[1], 1))
    fanout.publish("t", 5)  # arrives while the replay is read
    await task
    await settle()
    # Offset N carries data N-1: after N=2 come offsets 3, 4, 5 (replayed) and 6 (live).
    assert sub.data() == [2, 3, 4, 5]


async def following_past_a_lost_message() -> tuple[LocalFanOut, Hub, Sub]:
    """A hub and a subscriber of "t" that was sent "a"; then a message history lost, and "b",
    whose arrival shows the gap (the reset is on its way)."""
    fanout, hub = await make()
    sub = Sub()
    await hub.subscribe(sub, "t", None, 1)
    fanout.publish("t", "a")
    await settle()
    lose_unheard(fanout, "t")
    fanout.publish("t", "b")
    return fanout, hub, sub


async def test_a_gap_history_cannot_fill_becomes_reset_then_live() -> None:
    """If the missed range is gone, subscribers get reset, then the live stream goes on."""
    fanout, _, sub = await following_past_a_lost_message()
    await settle()
    ops = [f["op"] for f in sub.frames if f["op"] in ("message", "reset")]
    assert ops == ["message", "reset"] and sub.data() == ["a"]
    assert sub.frames[-1] == {"op": "reset", "topic": "t"}  # the stream's: it names no subscribe
    fanout.publish("t", "c")
    await settle()
    assert sub.data() == ["a", "c"]


class RefusedHistory(DoorbellLocal):
    """Doorbells only, and every history read refused, as by a role whose SELECT was revoked."""

    async def histories(self, reads: Mapping[str, str]) -> dict[str, History | None]:
        raise ConfigError("permission denied for table livepush_messages: run livepush migrate --runtime-role ROLE")


async def test_a_lost_history_is_said_naming_the_topic_and_a_refused_read_is_not_taken_for_one(
        caplog: pytest.LogCaptureFixture) -> None:
    """A gap the store's history cannot fill is said in a WARNING naming the topic and what may
    have lost it; a read the store refused resets its subscribers too, but is said as that
    refusal alone, never as a history the store lost (a restart, a flush), which it was not."""
    _, _, sub = await following_past_a_lost_message()
    await async_wait_for(lambda: "reset" in [f["op"] for f in sub.frames], message="the reset")
    lost = [r.getMessage() for r in caplog.records if "no longer follows on" in r.getMessage()]
    assert len(lost) == 1 and "'t'" in lost[0] and "restart without persistence" in lost[0], lost
    caplog.clear()

    fanout, hub = await make(RefusedHistory())
    refused = Sub()
    await hub.subscribe(refused, "r", None, 1)
    fanout.publish("r", "a")
    await async_wait_for(lambda: "reset" in [f["op"] for f in refused.frames], message="the reset")
    said = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert any("permission denied" in line for line in said), said
    assert not any("no longer follows on" in line for line in said), said


async def test_a_refetch_after_a_reset_gets_what_came_after_the_reset_once_after_its_subscribed() -> None:
    """A client that refetches after `reset` by subscribing again with no `since` (the connection
    follows the topic still) goes on from where its stream stood: the reset's latest offset. A
    message published after that read, not yet heard live, comes after the new `subscribed`,
    whose offset it is (at or below it, as a replay's), once; then the live stream, in order."""
    fanout, hub = await make()
    sub = Sub()
    await hub.subscribe(sub, "t", None, 1)
    fanout.publish("t", "a")
    await async_wait_for(lambda: sub.data() == ["a"], message="the first message")
    lose_unheard(fanout, "t")
    fanout.publish("t", "b")
    await async_wait_for(lambda: "reset" in [f["op"] for f in sub.frames], message="the reset")
    await settle()
    publish_unheard(fanout, "t", "c")  # after the reset's read; its live frame not here yet
    await hub.subscribe(sub, "t", None, 2)  # the refetch
    fanout.publish("t", "d")
    await async_wait_for(lambda: "d" in sub.data(), message="the next live message")
    await settle()
    assert [f["op"] for f in sub.frames] == ["subscribed", "message", "reset", "subscribed", "message", "message"]
    refetch = sub.frames[3]
    assert refetch["offset"] == sub.frames[4]["offset"]  # "c": at the new subscribed's offset, after it
    assert sub.data() == ["a", "c", "d"]


class FlakyHistory(DoorbellLocal):
    """Doorbells only, and the next `failures` history reads raise, as while Postgres restarts."""

    def __init__(self) -> None:
        super().__init__()
        self.failures = 0

    async def history(self, topic: str, since: str, *, limit: int = HISTORY_PAGE,
                      timeout: float | None = None) -> History | None:
        if self.failures:
            self.failures -= 1
            self.reads += 1
            raise DependencyError("cannot reach Postgres (terminating connection due to administrator command)")
        return await super().history(topic, since, limit=limit)


async def test_a_history_read_that_fails_for_a_moment_is_read_again_not_reset() -> None:
    """A read the database fails (a restart under way) is no gap: the log still holds the range,
    so the messages arrive once it answers again, in order, and nobody gets reset."""
    fanout, hub = await make(FlakyHistory())
    assert isinstance(fanout, FlakyHistory)
    sub = Sub()
    await hub.subscribe(sub, "t", None, 1)
    fanout.failures = 2
    fanout.publish("t", "a")
    fanout.publish("t", "b")
    await async_wait_for(lambda: len(sub.data()) == 2, timeout=5, message="the messages after the failed reads")
    assert sub.data() == ["a", "b"]
    assert [f["op"] for f in sub.frames] == ["subscribed", "message", "message"]
    assert fanout.reads >= 3, "two failed reads, then one that delivered"


async def test_a_topic_subscribed_again_while_the_read_it_was_left_out_of_runs_still_gets_its_messages() -> None:
    """A topic's last subscriber leaves while the read of its doorbell waits to be tried again (the
    database failed it), so the next try reads only the other topics of its batch; a new
    subscriber comes during that try, and a message rings. The message reaches the new
    subscriber once the try ends, without waiting for another message on the topic."""
    fanout, hub = await make(FlakyHistory())
    assert isinstance(fanout, FlakyHistory)
    left, other, new = Sub(), Sub(), Sub()
    await hub.subscribe(left, "t", None, 1)
    await hub.subscribe(other, "busy", None, 2)
    fanout.failures = 2  # the first read of both topics fails
    fanout.publish("t", 0)
    fanout.publish("busy", "x")
    await async_wait_for(lambda: fanout.reads >= 2 and not fanout.failures, message="the failed read")
    hub.unsubscribe(left, "t")  # while the read waits to be tried again
    fanout.gate.clear()
    await async_wait_for(lambda: fanout.reads >= 3, timeout=5, message="the next try, of the other topic only")
    await hub.subscribe(new, "t", None, 3)
    fanout.publish("t", 1)
    await settle()
    fanout.gate.set()
    await async_wait_for(lambda: new.data() == [1], timeout=5, message="the message to reach the new subscriber")
    await async_wait_for(lambda: other.data() == ["x"], timeout=5, message="the other topic's message")
    assert left.data() == []


class OneTopicRefused(DoorbellLocal):
    """Doorbells only, and every read that includes `refused` raises, as a store that answers
    every other topic does when it refuses one (a Redis ACL that does not cover its key)."""

    refused = "t3"

    async def histories(self, reads: Mapping[str, str]) -> dict[str, History | None]:
        self.batches.append(len(reads))
        if self.refused in reads:
            raise DependencyError(f"Redis failed while reading the history of {self.refused!r} (NOPERM)")
        return await LocalFanOut.histories(self, reads)


async def test_a_read_that_always_fails_for_one_topic_stalls_none_of_the_topics_read_with_it() -> None:
    """A history read that keeps failing while the store answers (its listener hears) is split
    apart after a few tries: every other topic of the batch gets its messages, and the topic
    whose read fails is read on its own after a pause, holding up no later batch either; its
    messages arrive once its read succeeds."""
    fanout, hub = await make(OneTopicRefused())
    assert isinstance(fanout, OneTopicRefused)
    subs = {f"t{i}": Sub() for i in range(8)}
    for i, (topic, sub) in enumerate(subs.items()):
        await hub.subscribe(sub, topic, None, i)
    fanout.gate.clear()  # the first read waits: every doorbell lands in one batch
    fanout.publish("t0", "first")
    await async_wait_for(lambda: fanout.reads >= 1, timeout=5, message="a read under way")
    for topic in subs:
        fanout.publish(topic, 1)
    fanout.gate.set()
    others = [s for t, s in subs.items() if t != "t3"]
    await async_wait_for(lambda: all(s.data()[-1:] == [1] for s in others), timeout=5,
                         message="every other topic's message")
    fanout.publish("t5", 2)  # a later batch is not held up by the refused topic
    await async_wait_for(lambda: subs["t5"].data()[-1:] == [2], timeout=5, message="a later message")
    assert subs["t3"].data() == []
    fanout.refused = ""  # its read succeeds again
    await async_wait_for(lambda: subs["t3"].data() == [1], timeout=5, message="the refused topic's message")
    assert [f["op"] for f in subs["t3"].frames] == ["subscribed", "message"]
    await hub.aclose()


async def test_doorbells_on_many_topics_cost_one_read_per_batch_not_one_each() -> None:
    """Doorbells on 200 topics that ring while a read is under way are served by one more read of
    all the topics it does not cover, each topic's messages in order."""
    fanout, hub = await make(DoorbellLocal())
    assert isinstance(fanout, DoorbellLocal)
    subs = {f"t{i}": Sub() for i in range(200)}
    for i, (topic, sub) in enumerate(subs.items()):
        await hub.subscribe(sub, topic, None, i)
    fanout.publish("t0", "first")
    await async_wait_for(lambda: fanout.batches == [1], timeout=5, message="the first read")
    fanout.gate.clear()  # the next read waits: doorbells pile up meanwhile
    fanout.publish("t0", "second")
    await async_wait_for(lambda: len(fanout.batches) == 2, timeout=5, message="a read under way")
    for topic in subs:
        fanout.publish(topic, 1)
        fanout.publish(topic, 2)
    fanout.gate.set()
    await async_wait_for(lambda: all(len(s.data()) >= 2 for s in subs.values()), timeout=5, message="every topic read")
    await settle()
    assert subs["t0"].data() == ["first", "second", 1, 2]
    assert all(s.data() == [1, 2] for t, s in subs.items() if t != "t0")
    # t0's read under way (it reads after the gate) covered its own; the other 199 in one read.
    assert fanout.batches[2:] == [199], fanout.batches


class ByteBoundReads(DoorbellLocal):
    """Live reads that, as the Postgres fan-out's past its bytes per statement, give only the first
    topic of each read its page and every other an empty one that says `more`."""

    async def histories(self, reads: Mapping[str, str]) -> dict[str, History | None]:
        pages = await super().histories(reads)
        first = next(iter(reads))
        return {t: p if t == first or p is None else History([], p.latest, True) for t, p in pages.items()}


async def test_topics_a_read_defers_past_its_byte_bound_are_read_on_and_arrive_whole() -> None:
    """Pages a live read leaves empty with `more` (the read's byte bound was reached before them)
    are read again: every topic's messages arrive, in order, once."""
    fanout, hub = await make(ByteBoundReads())
    assert isinstance(fanout, ByteBoundReads)
    subs = {f"t{i}": Sub() for i in range(5)}
    for i, (topic, sub) in enumerate(subs.items()):
        await hub.subscribe(sub, topic, None, i)
    for n in range(3):
        for topic in subs:
            fanout.publish(topic, n)
    await async_wait_for(lambda: all(len(s.data()) >= 3 for s in subs.values()), timeout=5,
                         message="every topic's messages")
    await settle()
    assert all(s.data() == [0, 1, 2] for s in subs.values())


async def test_doorbells_are_read_from_history_in_order_and_once() -> None:
    """Messages that arrive as doorbells go out with their data from history, in order, each once."""
    fanout, hub = await make(DoorbellLocal())
    sub = Sub()
    await hub.subscribe(sub, "t", None, 1)
    offsets = [fanout.publish("t", i) for i in range(5)]
    await settle()
    assert sub.data() == [0, 1, 2, 3, 4]
    assert [f["offset"] for f in sub.frames if f["op"] == "message"] == offsets


@pytest.mark.parametrize(("snapshot_first", "reads"), [(True, 2), (False, 1)])
async def test_doorbells_that_ring_during_a_read_cost_one_more_read_not_one_each(snapshot_first: bool, reads: int) -> None:
    """Fifty doorbells arriving while the log is read are served by one more read, or by none
    when the read under way already reached what they name; everything arrives, in order."""
    fanout, hub = await make(DoorbellLocal(snapshot_first))
    assert isinstance(fanout, DoorbellLocal)
    sub = Sub()
    await hub.subscribe(sub, "t", None, 1)
    fanout.gate.clear()
    fanout.publish("t", 0)
    await settle()
    assert fanout.reads == 1, "the first doorbell started a read, which waits"
    for i in range(1, 51):
        fanout.publish("t", i)
    await settle()
    fanout.gate.set()
    await settle()
    assert sub.data() == list(range(51))
    assert fanout.reads == reads, f"{fanout.reads} reads for 51 doorbells"


class SlowReader(Sub):
    """A client that reads what was sent to it only when let: drain() waits for `reading`."""

    def __init__(self) -> None:
        super().__init__()
        self.reading = asyncio.Event()

    async def drain(self) -> None:
        await self.reading.wait()


def waiting_for(hub: Hub, topic: str, sub: Sub) -> int:
    """Live frames the hub holds for `sub` until its replay ends."""
    return len(hub._topics[topic].joining[sub])


async def test_a_replay_waiting_for_a_slow_client_holds_a_bounded_number_of_live_frames_for_it() -> None:
    """A client replaying a busy topic slower than it is published: the live messages meanwhile
    wait for it within a live client's share of the topic, not all of them; the replay, read on
    from history, still gives it every one, in order, once it reads."""
    from livepush.server.backlog import TOPIC_FRAMES

    fanout, hub = await make()
    origin = fanout.latest_offset("busy")
    for i in range(HISTORY_PAGE + 1):  # two pages: the replay waits for the client between them
        fanout.publish("busy", i)
    sub = SlowReader()
    joining = asyncio.create_task(hub.subscribe(sub, "busy", origin, 1))
    await async_wait_for(lambda: len(sub.data()) == HISTORY_PAGE, message="the first page to be sent")
    total = 5 * TOPIC_FRAMES
    for i in range(HISTORY_PAGE + 1, total):
        fanout.publish("busy", i)
    await settle()
    assert waiting_for(hub, "busy", sub) <= TOPIC_FRAMES
    sub.reading.set()
    await asyncio.wait_for(joining, 5)
    fanout.publish("busy", total)
    await settle()
    assert [f["op"] for f in sub.frames if f["op"] != "message"] == ["subscribed"]
    assert sub.data() == list(range(total + 1))


async def test_live_messages_dropped_while_the_last_replay_page_waits_for_a_slow_client_are_read_from_history() -> None:
    """The live messages that wait for a slow client past its share, while the last page of its
    replay goes out, are dropped and read from history after it: the client gets every message
    once, in order, and no `reset`."""
    from livepush.server.backlog import TOPIC_FRAMES

    fanout, hub = await make()
    origin = fanout.latest_offset("heavy")
    for i in range(300):  # one page of 300 KiB: the replay waits for the client within it
        fanout.publish("heavy", {"i": i, "pad": "x" * 1024})
    sub = SlowReader()
    joining = asyncio.create_task(hub.subscribe(sub, "heavy", origin, 1))
    await async_wait_for(lambda: sub.data(), message="the replay to start")
    total = 300 + 2 * TOPIC_FRAMES
    for i in range(300, total):
        fanout.publish("heavy", {"i": i})
    await settle()
    assert waiting_for(hub, "heavy", sub) <= TOPIC_FRAMES
    sub.reading.set()
    await asyncio.wait_for(joining, 5)
    fanout.publish("heavy", {"i": total})
    await settle()
    assert [f["op"] for f in sub.frames if f["op"] != "message"] == ["subscribed"]
    assert [d["i"] for d in sub.data()] == list(range(total + 1))


class Rows:
    """A state source over a dict of rows: `job:<id>` has a state once its row is created."""

    prefixes = ("job:",)

    def __init__(self) -> None:
        self.rows: dict[int, int] = {}  # id -> version
        self.asked: list[list[str]] = []

    async def read(self, topics, *, timeout=None):  # type: ignore[no-untyped-def]
        from livepush.types import State

        self.asked.append(list(topics))
        out = {}
        for topic in topics:
            ident = int(topic.partition(":")[2])
            if ident in self.rows and topic == f"job:{ident}":
                out[topic] = State(self.rows[ident], "enqueued", "job", f'{{"id":{ident}}}')
        return out


async def test_a_ring_of_created_rows_reads_only_the_watched_topics_among_them_that_had_no_state() -> None:
    """A page may watch a job before its transaction commits; the creation ring of a range of ids
    reads those of its topics, not every watched topic without a state (nor one whose id is not
    written the way the source names topics, which can never have one)."""
    rows = Rows()
    hub = Hub(LocalFanOut(), fan, states=[rows])
    subs = {}
    for topic in ["job:5", "job:6", "job:900", "job:05"] + [f"job:{10_000 + i}" for i in range(2000)]:
        subs[topic] = Sub()
        await hub.subscribe(subs[topic], topic, None, topic)  # type: ignore[arg-type]
    rows.asked.clear()

    rows.rows.update({5: 1, 6: 1})
    hub.on_state_created("job:", 1, 8)
    await async_wait_for(lambda: subs["job:6"].data(), 5.0)
    assert rows.asked == [["job:5", "job:6"]]
    assert subs["job:5"].data() == [{"event": "enqueued", "job": {"id": 5}}]

    rows.asked.clear()
    rows.rows[900] = 1
    hub.on_state_created("job:", 100, 9_999)  # a range wider than the count of watched topics
    await async_wait_for(lambda: subs["job:900"].data(), 5.0)
    assert rows.asked == [["job:900"]]
    hub.on_state_created("job:", 900, 900)  # born: not read again
    hub.on_state_created("group:", 1, 10)  # no watched topic of that prefix
    await settle()
    assert rows.asked == [["job:900"]]
    await hub.aclose()


async def test_subscribing_again_to_a_state_with_its_version_as_since_still_sends_it_to_the_connection() -> None:
    """A page's second subscription to a state topic the connection follows, with `since` the
    state's version read from the database before this server heard of that version: the
    connection has one stream of the topic, and its first subscription has not been sent that
    version, so the snapshot goes out (the second one drops it), and the first one gets it."""
    rows = Rows()
    rows.rows[5] = 1
    hub = Hub(LocalFanOut(), fan, states=[rows])
    sub = Sub()
    await hub.subscribe(sub, "job:5", None, 1)  # type: ignore[arg-type]
    assert [f["offset"] for f in sub.frames if f["op"] == "message"] == ["1"]
    rows.rows[5] = 2  # committed; its ring has not reached this server yet
    await hub.subscribe(sub, "job:5", "2", 2)  # type: ignore[arg-type]
    hub.on_state_change("job:5", 2)
    await async_wait_for(lambda: "2" in [f["offset"] for f in sub.frames if f["op"] == "message"], 5.0,
                         message="version 2 to reach the connection")
    # A `since` past the current version (kept from a database since restored): its `subscribed`
    # says 2, and the snapshot follows, which the client then takes.
    sub.frames.clear()
    await hub.subscribe(sub, "job:5", "7", 3)  # type: ignore[arg-type]
    assert [(f["op"], f.get("offset")) for f in sub.frames] == [("subscribed", "2"), ("message", "2")]
    await hub.aclose()


class FlakyRows(Rows):
    """Rows whose reads fail while `down` is set, as a database that restarts."""

    def __init__(self) -> None:
        super().__init__()
        self.down = False
        self.failed = 0

    async def read(self, topics, *, timeout=None):  # type: ignore[no-untyped-def]
        if self.down:
            self.failed += 1
            raise DependencyError("the database is restarting")
        return await super().read(topics)


async def test_state_reads_that_keep_failing_warn_once_not_every_retry(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """While the database is away, the watched state topics are read again every second: the log
    says so once, not once a retry, and the state reaches its subscriber once the database is back."""
    from livepush.server import hub as hub_module

    monkeypatch.setattr(hub_module, "STATE_RETRY_SECONDS", 0.01)
    rows = FlakyRows()
    rows.rows[5] = 1
    hub = Hub(LocalFanOut(), fan, states=[rows])
    sub = Sub()
    await hub.subscribe(sub, "job:5", None, 1)  # type: ignore[arg-type]
    rows.down = True
    rows.rows[5] = 2
    with caplog.at_level("DEBUG", logger="livepush.hub"):
        hub.on_state_change("job:5", 2)
        await async_wait_for(lambda: rows.failed >= 5, 5.0, message="several retries")
        rows.down = False
        await async_wait_for(lambda: "2" in [f["offset"] for f in sub.frames if f["op"] == "message"], 5.0,
                             message="version 2 once the database is back")
    warnings = [r for r in caplog.records if r.name == "livepush.hub" and r.levelname == "WARNING"]
    assert len(warnings) == 1, [r.getMessage() for r in warnings]
    await hub.aclose()

async def test_a_replay_whose_rest_is_trimmed_while_the_client_reads_its_first_page_ends_with_reset() -> None:
    """Each page of a replay is checked whole before it goes out, but a long replay is read page by
    page while the client reads: when the rest of its range is trimmed meanwhile (here the local
    history's 10,000-message bound; on every fan-out, its TTL), the client has the pages already
    sent, then `reset`, then every live message, never a hole."""
    from livepush.fanout.local import MAX_KEPT_PER_TOPIC

    fanout, hub = await make()
    since = fanout.latest_offset("long")
    for i in range(2 * HISTORY_PAGE):
        fanout.publish("long", i)
    sub = SlowReader()
    joining = asyncio.create_task(hub.subscribe(sub, "long", since, 1))
    await async_wait_for(lambda: len(sub.data()) == HISTORY_PAGE, message="the first page to be sent")
    fanout.publish_many([("long", n) for n in range(2 * HISTORY_PAGE, MAX_KEPT_PER_TOPIC + 2 * HISTORY_PAGE)])
    sub.reading.set()
    await asyncio.wait_for(joining, 5)
    fanout.publish("long", "live")
    await async_wait_for(lambda: "live" in sub.data(), message="the live message")
    ops = [f["op"] for f in sub.frames]
    assert ops == ["subscribed", *["message"] * HISTORY_PAGE, "reset", "message"]
    # Cut short after its `subscribed`, the replay is the connection's stream of the topic: its
    # reset is about every subscription of it, and names none.
    assert sub.frames[-2] == {"op": "reset", "topic": "long"}
    assert sub.data() == [*range(HISTORY_PAGE), "live"]


class Overflowing(Sub):
    """A subscriber whose share of its topic fills at its `at`-th live message: the broadcast
    asks the hub to send it what follows from history, as a connection's backlog does
    (server/backlog.py), after taking that message."""

    def __init__(self, at: int) -> None:
        super().__init__()
        self.at = at
        self.live = 0
        self.handed_over: list[bool] = []


def overflowing_hub(fanout: LocalFanOut) -> Hub:
    def broadcast(subs, frame: str, topic: str, kind: str) -> None:
        for sub in subs:
            sub.send(frame)
            if isinstance(sub, Overflowing) and kind == "message":
                sub.live += 1
                if sub.live == sub.at:
                    sub.handed_over.append(hub.overflowed(sub, topic))

    hub = Hub(fanout, broadcast)
    fanout.register(hub.on_message)
    return hub


async def burst_past_the_share(fanout: LocalFanOut, sub: Overflowing, *others: Sub) -> Hub:
    """`sub` (and `others`) subscribed to topic `burst`, which gets ten messages: the share of
    `sub` fills at its `at`-th."""
    await fanout.listen()
    hub = overflowing_hub(fanout)
    for s in (sub, *others):
        await hub.subscribe(s, "burst", None, 1)
    for i in range(10):
        fanout.publish("burst", i)
    return hub


async def test_a_subscriber_whose_share_fills_reads_on_from_history_then_goes_live_again() -> None:
    """A live subscriber whose share of a topic fills in the middle of a burst gets the rest of the
    burst from history, every message once and in order, with no `reset`, then live messages
    again."""
    sub, other = Overflowing(at=3), Sub()
    fanout = YieldingLocal()
    hub = await burst_past_the_share(fanout, sub, other)
    await async_wait_for(lambda: len(sub.data()) == 10, message="the burst")
    assert sub.handed_over == [True]
    await async_wait_for(lambda: sub in hub._topics["burst"].subscribers, message="the subscriber to go live again")
    fanout.publish("burst", "live")
    await async_wait_for(lambda: "live" in sub.data(), message="the live message")
    assert sub.data() == [*range(10), "live"]
    assert [f["op"] for f in sub.frames] == ["subscribed", *["message"] * 11]
    assert other.data() == sub.data()


class OverflowingSlowly(Overflowing):
    """An Overflowing subscriber that reads what was sent to it only when let."""

    def __init__(self, at: int) -> None:
        super().__init__(at)
        self.reading = asyncio.Event()

    async def drain(self) -> None:
        await self.reading.wait()


async def test_subscribing_again_from_now_while_reading_on_from_history_loses_nothing() -> None:
    """A connection that subscribes to a topic again (a page's second subscription, from now)
    while it reads on from history past its share goes on from where it stood: the page's first
    subscription misses nothing."""
    sub = OverflowingSlowly(at=3)
    fanout = YieldingLocal()
    hub = await burst_past_the_share(fanout, sub)
    await async_wait_for(lambda: sub in hub._topics["burst"].joining, message="the share to fill")
    again = asyncio.create_task(hub.subscribe(sub, "burst", None, 2))
    await settle()
    sub.reading.set()
    await asyncio.wait_for(again, 5)
    fanout.publish("burst", "live")
    await async_wait_for(lambda: "live" in sub.data(), message="the live message")
    assert sub.data() == [*range(10), "live"]


class LostHistory(YieldingLocal):
    """History that no longer holds anything the hub asks for (pruned past it)."""

    async def history(self, topic: str, since: str, *, limit: int = HISTORY_PAGE,
                      timeout: float | None = None) -> History | None:
        await asyncio.sleep(0)
        return None


async def past_its_join_buffer(fanout: LocalFanOut, hub: Hub, sub: OverflowingSlowly) -> None:
    """While `sub` (of `burst_past_the_share`) waits to read on, two messages on `burst` too large
    for its join buffer together: the buffer drops what waited, so it covers nothing."""
    await async_wait_for(lambda: sub in hub._topics["burst"].joining, message="the read-on")
    buffer = hub._topics["burst"].joining[sub]
    for n in (1, 2):
        fanout.publish("burst", {"big": n, "pad": "x" * 200_000})
    await async_wait_for(lambda: not buffer.whole, message="the join buffer to drop what waited")


async def read_on_past_its_buffer(fanout: LocalFanOut, *, reset: bool) -> OverflowingSlowly:
    """A subscriber of `burst_past_the_share` whose join buffer drops what waited for it
    (`past_its_join_buffer`) before it reads on from `fanout`'s history; returned once it went
    live again (after its `reset`, when one is expected) and got the live message "live"."""
    sub = OverflowingSlowly(at=3)
    hub = await burst_past_the_share(fanout, sub)
    await past_its_join_buffer(fanout, hub, sub)
    sub.reading.set()
    if reset:
        await async_wait_for(lambda: "reset" in [f["op"] for f in sub.frames], message="the reset")
    await async_wait_for(lambda: sub in hub._topics["burst"].subscribers, message="the subscriber to go live again")
    fanout.publish("burst", "live")
    await async_wait_for(lambda: "live" in sub.data(), message="the live message")
    return sub


def big_as_number(data: list) -> list:
    return [d["big"] if isinstance(d, dict) else d for d in data]


async def test_a_subscriber_whose_share_fills_gets_reset_when_history_no_longer_holds_its_place() -> None:
    """Where history cannot serve what follows the last message a subscriber whose share filled
    was given, and the live messages that waited for it meanwhile were dropped (past its share),
    it gets `reset` (it refetches), then live messages, never a hole."""
    sub = await read_on_past_its_buffer(LostHistory(), reset=True)
    assert [f["op"] for f in sub.frames] == ["subscribed", "message", "message", "message", "reset", "message"]
    assert sub.data() == [0, 1, 2, "live"]


async def test_a_subscriber_whose_share_fills_gets_what_waited_for_it_when_that_covers_what_history_lost() -> None:
    """Where history cannot serve what follows the last message a subscriber whose share filled
    was given, but every live message since waited for it (fewer than its share), those cover
    it: it gets them, then live messages, with no `reset` (there is nothing to refetch)."""
    sub = Overflowing(at=3)
    fanout = LostHistory()
    hub = await burst_past_the_share(fanout, sub)
    await async_wait_for(lambda: sub in hub._topics["burst"].subscribers and len(sub.data()) == 10,
                         message="the burst, and the subscriber to go live again")
    fanout.publish("burst", "live")
    await async_wait_for(lambda: "live" in sub.data(), message="the live message")
    assert sub.handed_over == [True]
    assert [f["op"] for f in sub.frames] == ["subscribed", *["message"] * 11]
    assert sub.data() == [*range(10), "live"]


class SlowFirstAnchor(DoorbellLocal):
    """Doorbells only; the first latest-offset read (a topic's first anchor) answers only once
    `anchor_gate` opens, from before it waited, as a database read that is slow just then answers
    from its snapshot."""

    def __init__(self) -> None:
        super().__init__()
        self.anchor_gate = asyncio.Event()
        self.anchors = 0

    async def alatest_offset(self, topic: str, *, timeout: float | None = None) -> str:
        self.anchors += 1
        latest = await super().alatest_offset(topic)
        if self.anchors == 1:
            await self.anchor_gate.wait()
        return latest


async def test_a_topic_left_while_its_first_read_was_slow_never_stalls_its_next_subscribers() -> None:
    """The only subscriber of a topic goes away while the topic's first read is slow, after a
    message rang; a new subscriber comes and the topic is read for it. When the old read ends at
    last, it is of a topic nobody follows any more: the new subscriber still gets every message."""
    fanout, hub = await make(SlowFirstAnchor())
    a, b, c = Sub(), Sub(), Sub()
    first = asyncio.ensure_future(hub.subscribe(a, "t", None, 1))
    await settle()
    fanout.publish("t", 0)  # rings while the first read is under way
    first.cancel()  # its connection is lost
    await settle()
    await hub.subscribe(b, "t", None, 2)
    await hub.subscribe(c, "busy", None, 3)
    fanout.gate.clear()  # the log reader is busy with another topic...
    fanout.publish("busy", "x")
    await async_wait_for(lambda: fanout.reads >= 1, message="the read of the other topic to start")
    fanout.publish("t", 1)  # ...when this one's read is asked for
    await settle()
    fanout.anchor_gate.set()  # the old first read ends now
    await settle()
    fanout.gate.set()
    await async_wait_for(lambda: b.data() == [1], message="the message to reach the new subscriber")
    fanout.publish("t", 2)
    await async_wait_for(lambda: b.data() == [1, 2], message="the next message to reach it")
    assert first.cancelled() and a.frames == []


class SlowLatestWhenAsked(YieldingLocal):
    """The next latest-offset read, once `slow_next` is set, answers only when `gate` opens, from
    before it waited (a database read answers from its snapshot)."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = asyncio.Event()
        self.slow_next = False
        self.waiting = False

    async def alatest_offset(self, topic: str, *, timeout: float | None = None) -> str:
        latest = await super().alatest_offset(topic)
        if self.slow_next:
            self.slow_next, self.waiting = False, True
            await self.gate.wait()
        return latest


async def test_a_subscriber_that_joined_during_a_reset_gets_neither_the_reset_nor_what_it_stood_past() -> None:
    """A gap history cannot fill resets the topic's subscribers from the latest offset read then.
    One that subscribed while that read was under way stands past it already (its `subscribed`
    said so): it missed nothing, so it gets no `reset`, and never a message at or below where it
    stands, only what comes after."""
    fanout, hub = await make(SlowLatestWhenAsked())
    old, new = Sub(), Sub()
    await hub.subscribe(old, "t", None, 1)
    fanout.publish("t", "a")
    await async_wait_for(lambda: old.data() == ["a"], message="the first message")
    lose_unheard(fanout, "t")
    fanout.slow_next = True
    fanout.publish("t", "b")
    await async_wait_for(lambda: fanout.waiting, message="the reset's read of the latest offset")
    fanout.publish("t", "c")
    answer = asyncio.ensure_future(hub.subscribe(new, "t", None, 2))
    await asyncio.wait_for(answer, 5)
    assert new.frames[0]["offset"] == fanout.latest_offset("t")  # it stands past "c"
    fanout.gate.set()
    await settle()
    fanout.publish("t", "d")
    await async_wait_for(lambda: "d" in old.data() and "d" in new.data(), message="the next message")
    await settle()
    assert [f["op"] for f in old.frames] == ["subscribed", "message", "reset", "message", "message"]
    assert old.data() == ["a", "c", "d"]
    assert [f["op"] for f in new.frames] == ["subscribed", "message"] and new.data() == ["d"]


class ShortPagesFailingAfter(YieldingLocal):
    """History in pages of 5 messages; every read after the first `served` raises, as a store
    that goes away in the middle of a read-on does."""

    def __init__(self, served: int) -> None:
        super().__init__()
        self.served = served

    async def history(self, topic: str, since: str, *, limit: int = HISTORY_PAGE,
                      timeout: float | None = None) -> History | None:
        if self.served == 0:
            await asyncio.sleep(0)
            raise DependencyError("cannot reach Postgres (terminating connection due to administrator command)")
        self.served -= 1
        return await super().history(topic, since, limit=5)


async def test_a_subscriber_whose_read_on_from_history_fails_midway_gets_no_message_twice(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A subscriber whose share filled reads on from history, and the live messages that wait for
    it meanwhile pass its share; after a page of history went out, the next read fails past the
    read-on's retry bound (none here), so it gets `reset`: the live message still waiting follows
    the reset, never one it had already (in order, once)."""
    from livepush.server import hub as hub_module
    monkeypatch.setattr(hub_module, "READ_ON_RETRY_SECONDS", 0.0)
    sub = await read_on_past_its_buffer(ShortPagesFailingAfter(served=1), reset=True)
    offsets = [f["offset"] for f in sub.frames if f["op"] == "message"]
    assert len(offsets) == len(set(offsets)), f"sent twice: {big_as_number(sub.data())}"
    assert big_as_number(sub.data()) == [*range(8), 2, "live"]
    assert [f["op"] for f in sub.frames] == ["subscribed", *["message"] * 8, "reset", "message", "message"]


class ShortPagesFailingOnce(ShortPagesFailingAfter):
    """History in pages of 5 messages; the read after the first `served` raises once, as a store
    that restarts in the middle of a read-on does, then every read succeeds."""

    async def history(self, topic: str, since: str, *, limit: int = HISTORY_PAGE,
                      timeout: float | None = None) -> History | None:
        if self.served == 0:
            self.served = -1
            raise DependencyError("cannot reach Postgres (terminating connection due to administrator command)")
        self.served = max(self.served - 1, -1)
        return await YieldingLocal.history(self, topic, since, limit=5)


async def test_a_read_on_from_history_that_fails_midway_goes_on_from_where_it_stood(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A read-on whose read fails once after a page went out, while the live messages that wait
    for it pass its share (so they cannot stand in for history), is tried again, from the last
    message it sent: the subscriber gets every message once, in order, and no `reset`."""
    from livepush.server import hub as hub_module
    monkeypatch.setattr(hub_module, "READ_RETRY_SECONDS", 0.01)
    fanout = ShortPagesFailingOnce(served=1)
    sub = await read_on_past_its_buffer(fanout, reset=False)
    assert fanout.served == -1, "the read never failed: this test shows nothing"
    assert big_as_number(sub.data()) == [*range(10), 1, 2, "live"]
    assert [f["op"] for f in sub.frames] == ["subscribed", *["message"] * 13]


class SlowPagesFailingOnce(ShortPagesFailingOnce):
    """ShortPagesFailingOnce whose pages served before the failure take `slow` seconds each, as a
    long read-on does when its client reads slowly between pages."""

    def __init__(self, served: int, slow: float) -> None:
        super().__init__(served)
        self.slow = slow

    async def history(self, topic: str, since: str, *, limit: int = HISTORY_PAGE,
                      timeout: float | None = None) -> History | None:
        if self.served > 0:
            await asyncio.sleep(self.slow)  # the time a long read-on takes, not a wait for an event
        return await super().history(topic, since, limit=limit)


async def test_a_read_on_that_fails_after_reading_for_longer_than_its_retry_bound_is_still_retried(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The read-on's retry bound counts from the read that failed, not from the start of the
    read-on: one that has been reading a long backlog for longer than the bound (a slow client)
    when Postgres restarts waits the restart out like any other, and its client gets every
    message once, in order, with no `reset`."""
    from livepush.server import hub as hub_module
    monkeypatch.setattr(hub_module, "READ_RETRY_SECONDS", 0.01)
    monkeypatch.setattr(hub_module, "READ_ON_RETRY_SECONDS", 0.2)
    fanout = SlowPagesFailingOnce(served=1, slow=0.3)
    sub = await read_on_past_its_buffer(fanout, reset=False)
    assert fanout.served == -1, "the read never failed: this test shows nothing"
    assert big_as_number(sub.data()) == [*range(10), 1, 2, "live"]
    assert [f["op"] for f in sub.frames] == ["subscribed", *["message"] * 13]


async def test_a_replay_whose_read_fails_once_after_it_ran_longer_than_the_retry_bound_goes_on(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The retry bound counts from when the store began to fail, not from when the replay began: a
    client that read its first page for longer than the bound, whose next read then fails once (a
    blip), is read again from where it stands and gets the rest, in order, once, and no `reset`."""
    from livepush.server import hub as hub_module
    monkeypatch.setattr(hub_module, "READ_ON_RETRY_SECONDS", 0.05)
    monkeypatch.setattr(hub_module, "READ_RETRY_SECONDS", 0.01)
    fanout = ShortPagesFailingOnce(served=1)
    since = fanout.publish("t", 0)
    for n in range(1, 13):
        fanout.publish("t", n)
    hub = Hub(fanout, fan)
    sub = SlowReader()
    try:
        subscribe = asyncio.ensure_future(hub.subscribe(sub, "t", since, 1))
        await async_wait_for(lambda: len(sub.frames) == 6, message="the first page")
        await asyncio.sleep(0.2)  # the client reads it past the bound: time is what this test is about
        sub.reading.set()
        await asyncio.wait_for(subscribe, 10)
    finally:
        await hub.aclose()
    assert fanout.served == -1, "the read never failed: this test shows nothing"
    assert [f["op"] for f in sub.frames] == ["subscribed", *["message"] * 12]
    assert sub.data() == list(range(1, 13))


class HeldLatest(YieldingLocal):
    """Latest-offset reads that each answer from the moment they are asked (a database read
    answers from its snapshot) but only once the gate queued for them opens: `hold()` queues one
    for the next read and returns it; `held` counts the reads that are waiting."""

    def __init__(self) -> None:
        super().__init__()
        self.gates: list[asyncio.Event] = []
        self.held = 0

    def hold(self) -> asyncio.Event:
        gate = asyncio.Event()
        self.gates.append(gate)
        return gate

    async def alatest_offset(self, topic: str, *, timeout: float | None = None) -> str:
        latest = self.latest_offset(topic)
        if self.gates:
            gate = self.gates.pop(0)
            self.held += 1
            await gate.wait()
            self.held -= 1
        return latest

    def lose_history(self) -> None:
        """What a Postgres crash does to the unlogged log, or a Redis restart without persistence:
        every topic and the epoch go, and a topic's latest offset is a new epoch's origin, whose key
        sorts below every offset given out before."""
        self._logs.clear()
        self.epoch = _new_epoch()


async def test_a_subscriber_whose_subscribe_ends_while_a_history_loss_is_reset_still_gets_its_reset() -> None:
    """A subscriber whose `subscribed` offset was read before the history was lost, and whose
    subscribe ends while the hub reads the latest offset to reset the topic's subscribers, gets
    `reset` as they do: that offset is of the epoch before the loss, and what was published after
    it is gone. Its key sorts above the new epoch's origin the reset goes on from, which says
    nothing across a loss (the client would otherwise never learn what it missed)."""
    fanout, hub = await make(HeldLatest())
    assert isinstance(fanout, HeldLatest)
    old, new = Sub(), Sub()
    await hub.subscribe(old, "t", None, 1)
    fanout.publish("t", "a")
    await async_wait_for(lambda: old.data() == ["a"], message="the first message")
    publish_unheard(fanout, "t", "before its subscribe")  # its `subscribed` stands past the hub's cursor
    subscribe_read = fanout.hold()
    joining = asyncio.ensure_future(hub.subscribe(new, "t", None, 2))
    await async_wait_for(lambda: fanout.held == 1, message="the subscribe's read of the latest offset")
    publish_unheard(fanout, "t", "lost")  # after its `subscribed`: the loss takes it
    fanout.lose_history()
    reset_read = fanout.hold()
    await hub.resync()  # the listener is back: the read finds the gap and resets the topic
    await async_wait_for(lambda: fanout.held == 2, message="the reset's read of the latest offset")
    subscribe_read.set()
    await asyncio.wait_for(joining, WAIT)  # live, while the reset's read is still under way
    reset_read.set()
    await settle()
    fanout.publish("t", "b")
    await async_wait_for(lambda: "b" in old.data() and "b" in new.data(), message="the next message")
    assert [f["op"] for f in old.frames] == ["subscribed", "message", "reset", "message"]
    assert [f["op"] for f in new.frames] == ["subscribed", "reset", "message"] and new.data() == ["b"]


class StoreAway(YieldingLocal):
    """History in pages of 5 messages; a read of a topic in `down` raises, as while the store
    restarts, and is counted per topic."""

    def __init__(self) -> None:
        super().__init__()
        self.down: set[str] = set()
        self.failed: dict[str, int] = {}

    async def history(self, topic: str, since: str, *, limit: int = HISTORY_PAGE,
                      timeout: float | None = None) -> History | None:
        await asyncio.sleep(0)
        if topic in self.down:
            self.failed[topic] = self.failed.get(topic, 0) + 1
            raise DependencyError("cannot reach Postgres (the database system is starting up)")
        return await YieldingLocal.history(self, topic, since, limit=5)


async def test_a_second_outage_warns_while_a_replay_that_waited_out_the_first_still_runs(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """A replay that waited out one outage and goes on (its client reading a long backlog slowly)
    is no longer failing: a second outage meanwhile, which fails another client's replay, is said
    with a warning as the first was, not only in debug lines."""
    from livepush.server import hub as hub_module
    monkeypatch.setattr(hub_module, "READ_RETRY_SECONDS", 0.01)
    fanout = StoreAway()
    since = {topic: fanout.publish(topic, 0) for topic in ("a", "b")}
    for n in range(1, 16):
        fanout.publish("a", n)
        fanout.publish("b", n)
    hub = Hub(fanout, fan)
    a, b = SlowReader(), SlowReader()
    subscribes = []
    try:
        with caplog.at_level("DEBUG", logger="livepush.hub"):
            subscribes.append(asyncio.ensure_future(hub.subscribe(a, "a", since["a"], 1)))
            await async_wait_for(lambda: len(a.frames) == 6, message="a's first page")
            fanout.down.add("a")  # the first outage
            a.reading.set()
            await async_wait_for(lambda: fanout.failed.get("a"), message="a's read failing")
            a.reading.clear()  # a's client is slow: its replay waits for it after its next page
            fanout.down.clear()
            await async_wait_for(lambda: len(a.frames) == 11, message="a's second page, after the outage")

            subscribes.append(asyncio.ensure_future(hub.subscribe(b, "b", since["b"], 1)))
            await async_wait_for(lambda: len(b.frames) == 6, message="b's first page")
            fanout.down.add("b")  # the second outage, while a's replay still runs
            b.reading.set()
            await async_wait_for(lambda: fanout.failed.get("b"), message="b's read failing")
            fanout.down.clear()
            a.reading.set()
            await asyncio.wait_for(asyncio.gather(*subscribes), 10)
    finally:
        for subscribe in subscribes:
            subscribe.cancel()
        await hub.aclose()
    assert a.data() == list(range(1, 16)) and b.data() == list(range(1, 16))
    warnings = [r.getMessage() for r in caplog.records if r.name == "livepush.hub" and r.levelname == "WARNING"]
    assert [w.split(" (")[0] for w in warnings] == ["could not read the replay of a", "could not read the replay of b"]


class StoreSlowThenAway(YieldingLocal):
    """A store whose latest offset comes only after `latest_takes` s (a pool slow to hand out a
    connection), and whose history reads wait out their whole `timeout`, then fail, as reads
    waiting for a pool that never frees do. Records each read's `timeout`."""

    def __init__(self, latest_takes: float) -> None:
        super().__init__()
        self.latest_takes = latest_takes
        self.timeouts: list[tuple[str, float | None]] = []

    async def alatest_offset(self, topic: str, *, timeout: float | None = None) -> str:
        self.timeouts.append(("latest", timeout))
        await asyncio.sleep(self.latest_takes)  # the store's own time, not a wait for an event
        return await super().alatest_offset(topic)

    async def history(self, topic: str, since: str, *, limit: int = HISTORY_PAGE,
                      timeout: float | None = None) -> History | None:
        self.timeouts.append(("history", timeout))
        await asyncio.sleep(30.0 if timeout is None else timeout)  # the pool's own wait without one
        raise DependencyError("cannot reach Postgres (couldn't get a connection)")


async def test_the_reads_before_a_subscribed_share_one_bound_counted_from_the_subscribe(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A subscribe with `since` to a new topic whose anchor read takes most of the retry bound,
    and whose history read then waits for a store that never answers: that read waits only what
    is left of the bound, so the subscribe fails (answered `refused unavailable`) within the bound
    from its start, with nothing sent, not after the anchor's time and a whole bound more (nor a
    pool's 30 s)."""
    from livepush.server import hub as hub_module
    monkeypatch.setattr(hub_module, "READ_ON_RETRY_SECONDS", 1.0)
    monkeypatch.setattr(hub_module, "READ_RETRY_SECONDS", 0.1)
    fanout = StoreSlowThenAway(latest_takes=0.6)
    hub = Hub(fanout, fan)
    sub = Sub()
    topic = "room:slow-then-away"
    loop = asyncio.get_running_loop()
    began = loop.time()
    try:
        with pytest.raises(DependencyError):
            await asyncio.wait_for(hub.subscribe(sub, topic, fanout.latest_offset(topic), 1), 10)
        took = loop.time() - began
    finally:
        await hub.aclose()
    assert sub.frames == []
    assert took < 1.0 + 0.3, took
    (latest, anchor_timeout), (history, history_timeout) = fanout.timeouts
    assert (latest, history) == ("latest", "history")
    assert anchor_timeout is not None and 0.9 < anchor_timeout <= 1.0, anchor_timeout
    assert history_timeout is not None and history_timeout <= 0.45, history_timeout


class PrunedThenAway(YieldingLocal):
    """History in pages of 5 messages whose rest is pruned after the first page (every later read
    finds nothing to serve), and a store that goes away after the topic's anchor was read: each
    later latest-offset read waits out its whole `timeout`, then fails, as one waiting for a pool
    that never frees does."""

    def __init__(self) -> None:
        super().__init__()
        self.pages = 0
        self.latest_reads: list[float | None] = []

    async def alatest_offset(self, topic: str, *, timeout: float | None = None) -> str:
        self.latest_reads.append(timeout)
        if len(self.latest_reads) == 1:
            return await super().alatest_offset(topic)
        await asyncio.sleep(30.0 if timeout is None else timeout)  # the pool's own wait without one
        raise DependencyError("cannot reach Postgres (couldn't get a connection)")

    async def history(self, topic: str, since: str, *, limit: int = HISTORY_PAGE,
                      timeout: float | None = None) -> History | None:
        self.pages += 1
        return await super().history(topic, since, limit=5) if self.pages == 1 else None


async def test_a_replay_whose_rest_is_pruned_while_the_store_goes_away_gets_reset_within_the_bound(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A replay whose rest was pruned reads the topic's latest offset before its `reset`; when the
    store is away then, that read waits only the replay's retry bound, not the pool's own 30 s: the
    client gets its first page, then `reset`, within the bound."""
    from livepush.server import hub as hub_module
    monkeypatch.setattr(hub_module, "READ_ON_RETRY_SECONDS", 1.0)
    monkeypatch.setattr(hub_module, "READ_RETRY_SECONDS", 0.1)
    fanout = PrunedThenAway()
    topic = "room:pruned-then-away"
    since = fanout.latest_offset(topic)
    fanout.publish_many([(topic, n) for n in range(10)])
    hub = Hub(fanout, fan)
    sub = Sub()
    loop = asyncio.get_running_loop()
    began = loop.time()
    try:
        await asyncio.wait_for(hub.subscribe(sub, topic, since, 1), 10)
        took = loop.time() - began
    finally:
        await hub.aclose()
    assert [f["op"] for f in sub.frames] == ["subscribed", *["message"] * 5, "reset"]
    assert sub.data() == list(range(5))
    assert took < 1.0 + 0.5, took
    assert fanout.latest_reads[1] is not None and fanout.latest_reads[1] <= 1.0, fanout.latest_reads
