"""A slow client's backlog, called directly (docs/reference.md §8, slow clients): a newer state
replaces the waiting one of its topic in its place; a message topic past its bound gets one
`reset` after everything else, followed by the messages after it; other frames keep their order
and end the conflation of states before them; per topic, nothing goes out of order."""

from __future__ import annotations

import json
import random

from livepush import protocol
from livepush.server.backlog import Backlog
from livepush.server.connection import BACKLOG_BYTES, past_bound


def state(topic: str, version: int) -> bytes:
    return protocol.message(topic, str(version), '{"event":"progress"}').encode()


def message(topic: str, n: int) -> bytes:
    return protocol.message(topic, str(n), str(n)).encode()


def control(text: str) -> bytes:
    return protocol.pong(text).encode()


def drained(backlog: Backlog) -> list[tuple[str, str, str | None]]:
    """Every frame popped, as (op, topic or ref, offset)."""
    out = []
    while (data := backlog.pop()) is not None:
        frame = json.loads(data)
        out.append((frame["op"], frame.get("topic", frame.get("ref")), frame.get("offset")))
    assert backlog.bytes == 0 and len(backlog) == 0
    return out


def test_a_newer_state_replaces_the_waiting_one_in_its_place() -> None:
    """1,000 versions of a job's state behind one message: the client gets the message and the newest version, in the place the first one took."""
    b = Backlog()
    assert b.add(state("job:1", 1), "job:1", "state") == "queued"
    assert b.add(message("room", 1), "room", "message") == "queued"
    outcomes = {b.add(state("job:1", v), "job:1", "state") for v in range(2, 1001)}
    assert outcomes == {"conflated"}
    assert b.bytes == len(state("job:1", 1000)) + len(message("room", 1))
    assert drained(b) == [("message", "job:1", "1000"), ("message", "room", "1")]


def test_a_state_after_an_ordered_frame_never_overtakes_it() -> None:
    """A `subscribed` or snapshot sent after a waiting state ends that state's conflation: the next version queues after it, and replaces only what came after it."""
    b = Backlog()
    b.add(state("job:1", 5), "job:1", "state")
    b.add(control("subscribed"))
    assert b.add(state("job:1", 6), "job:1", "state") == "queued"
    assert b.add(state("job:1", 7), "job:1", "state") == "conflated"
    assert drained(b) == [("message", "job:1", "5"), ("pong", "subscribed", None), ("message", "job:1", "7")]


def test_a_message_topic_past_its_bound_gets_reset_then_the_messages_after_it() -> None:
    """With room for 3 messages, the 4th drops the topic's waiting ones and queues `reset` after everything else, then itself; another topic keeps its messages."""
    b = Backlog(topic_frames=3)
    b.add(message("a", 1), "a", "message")
    b.add(message("b", 1), "b", "message")
    for n in (2, 3):
        assert b.add(message("a", n), "a", "message") == "queued"
    b.add(control("x"))
    assert b.add(message("a", 4), "a", "message") == "reset"
    assert b.add(message("a", 5), "a", "message") == "queued"
    assert drained(b) == [("message", "b", "1"), ("pong", "x", None), ("reset", "a", None),
                          ("message", "a", "4"), ("message", "a", "5")]


def test_a_second_overflow_moves_the_reset_after_everything_waiting() -> None:
    """A topic that overflows again before its reset went out gets one reset, placed after what waits now: the messages after it still have no gap."""
    b = Backlog(topic_frames=2)
    for n in range(1, 4):
        b.add(message("a", n), "a", "message")  # 3 overflows: reset, 3
    b.add(message("b", 1), "b", "message")
    for n in range(4, 6):
        b.add(message("a", n), "a", "message")  # 5 overflows: reset moves after b's 1
    assert drained(b) == [("message", "b", "1"), ("reset", "a", None), ("message", "a", "5")]


def test_a_message_bigger_than_the_bound_waits_alone() -> None:
    """The byte bound lets one message larger than it wait when none of its topic waits."""
    b = Backlog(topic_bytes=100)
    big = protocol.message("a", "1", '"' + "x" * 500 + '"').encode()
    assert b.add(big, "a", "message") == "queued"
    assert b.add(message("a", 2), "a", "message") == "reset"
    assert [op for op, _, _ in drained(b)] == ["reset", "message"]


def test_one_large_state_may_pass_the_client_bound_alone_but_not_with_other_frames() -> None:
    """A job's final state bigger than the bound on what a client may have waiting is still
    delivered (it cannot be replaced or dropped); anything waiting besides it counts as usual."""
    big = protocol.message("job:1", "9", '"' + "x" * BACKLOG_BYTES + '"').encode()
    b = Backlog()
    b.add(state("job:1", 1), "job:1", "state")
    assert b.add(big, "job:1", "state") == "conflated"
    assert b.bytes > BACKLOG_BYTES and not past_bound(b.bytes, b)
    for n in range(8):  # messages of another topic, each within its share
        b.add(protocol.message(f"room:{n}", "1", '"' + "y" * (BACKLOG_BYTES // 8) + '"').encode(),
              f"room:{n}", "message")
    assert past_bound(b.bytes, b)
    assert past_bound(BACKLOG_BYTES + 1, None)


def test_a_reset_from_the_hub_covers_the_waiting_messages_of_its_topic() -> None:
    b = Backlog()
    b.add(message("a", 1), "a", "message")
    b.add(message("b", 1), "b", "message")
    assert b.add(protocol.reset("a").encode(), "a", "reset") == "queued"
    b.add(message("a", 9), "a", "message")
    assert drained(b) == [("message", "b", "1"), ("reset", "a", None), ("message", "a", "9")]


def test_a_waiting_reset_keeps_the_age_of_the_oldest_message_it_replaced() -> None:
    """How long the client has been missing something does not restart with each reset."""
    b = Backlog(topic_frames=1)
    b.add(message("a", 1), "a", "message")
    first = b.behind_since()
    for n in range(2, 50):
        b.add(message("a", n), "a", "message")
    assert b.behind_since() == first


def test_dropped_frames_do_not_pile_up_in_memory() -> None:
    """A topic that overflows for ever keeps the queue at its bound, not at everything ever dropped."""
    b = Backlog(topic_frames=10)
    for n in range(100_000):
        b.add(message("a", n), "a", "message")
    assert len(b) <= 11 and len(b._queue) <= 200
    ops = drained(b)
    assert ops[0][0] == "reset" and ops[-1] == ("message", "a", "99999")


def test_a_place_is_passed_once_everything_added_up_to_it_is_popped_or_dropped() -> None:
    """What a replay waits for between pages: the frames queued so far, not the ones added later."""
    b = Backlog(topic_frames=1)
    b.add(message("a", 1), "a", "message")
    b.add(control("page"))
    place = b.last
    b.add(message("b", 1), "b", "message")
    assert not b.passed(place)
    b.pop()
    assert not b.passed(place)
    b.pop()
    assert b.passed(place), "the later message of b is not waited for"
    b.add(message("c", 1), "c", "message")
    place = b.last
    b.add(message("c", 2), "c", "message")  # drops c's 1, queues reset and c's 2 after b's 1
    assert not b.passed(place)
    assert b.pop() == message("b", 1)
    assert b.passed(place), "a dropped frame is passed; what replaced it came later"


def test_per_topic_order_holds_whatever_the_mix() -> None:
    """Random mixes of states, messages, resets and ordered frames over a few topics: per state topic, versions rise and the last added is the last sent; per message topic, messages rise, and after its last reset they run without a gap to the last one added (or the hub's reset, when that came last); ordered frames keep their order."""
    for seed in range(200):
        rng = random.Random(seed)
        b = Backlog(topic_frames=rng.randint(1, 5))
        versions = {"job:1": 0, "job:2": 0}
        counts = {"a": 0, "b": 0}
        controls = 0
        reset_last = False  # the hub's reset was the last thing added on "a"
        sent: list[tuple[str, str, str | None]] = []
        for _ in range(rng.randint(1, 80)):
            r = rng.random()
            if r < 0.35:
                topic = rng.choice(list(versions))
                versions[topic] += 1
                b.add(state(topic, versions[topic]), topic, "state")
            elif r < 0.8:
                topic = rng.choice(list(counts))
                counts[topic] += 1
                b.add(message(topic, counts[topic]), topic, "message")
                reset_last = reset_last and topic != "a"
            elif r < 0.85:
                b.add(protocol.reset("a").encode(), "a", "reset")
                reset_last = True
            elif r < 0.95:
                controls += 1
                b.add(control(str(controls)))
            else:
                sent.extend(_pop_some(b, rng.randint(1, 5)))
        sent.extend(drained(b))
        assert [ref for op, ref, _ in sent if op == "pong"] == [str(n) for n in range(1, controls + 1)], seed
        for topic, last in versions.items():
            seen = [int(o) for op, t, o in sent if t == topic and o is not None]
            assert seen == sorted(set(seen)) and (not last or seen[-1] == last), (seed, topic, seen)
        for topic, last in counts.items():
            frames = [(op, o) for op, t, o in sent if t == topic]
            seen = [int(o) for op, o in frames if op == "message"]
            assert seen == sorted(set(seen)), (seed, topic, frames)
            if topic == "a" and reset_last:
                assert frames[-1] == ("reset", None), (seed, frames)
                continue
            assert not last or seen[-1] == last, (seed, topic, frames)
            if ("reset", None) in frames:
                tail = [int(o) for op, o in frames[len(frames) - frames[::-1].index(("reset", None)):]]
                assert tail == list(range(last - len(tail) + 1, last + 1)), (seed, topic, frames)


def _pop_some(b: Backlog, n: int) -> list[tuple[str, str, str | None]]:
    out = []
    for _ in range(n):
        data = b.pop()
        if data is None:
            break
        frame = json.loads(data)
        out.append((frame["op"], frame.get("topic", frame.get("ref")), frame.get("offset")))
    return out


def test_a_subscribes_snapshot_keeps_its_place_and_counts_as_a_state_for_the_bound() -> None:
    """A 3 MiB snapshot waits in order after its `subscribed`, a later state of its topic queues behind it rather than replacing it, and the bound does not count it: the client is not too slow for a state it must get; once it is sent, the bound counts everything again."""
    b = Backlog()
    big = protocol.message("job:1", "7", '{"event":"snapshot","pad":"' + "x" * (3 * 1024 * 1024) + '"}').encode()
    b.add(protocol.subscribed(1, "job:1", "7").encode())
    b.add(big, "job:1", "snapshot")
    b.add(state("job:1", 8), "job:1", "state")
    assert b.largest_state() == len(big)
    assert not past_bound(b.bytes, b)
    assert drained(b) == [("subscribed", "job:1", "7"), ("message", "job:1", "7"), ("message", "job:1", "8")]
    assert b.largest_state() == 0
