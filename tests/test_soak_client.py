"""The soak's clients (bench/_soak_children.py) count what the protocol promises, no more: a
message they had already, or one out of order, is a duplicate; one that follows a refetch's
`subscribed` at or below its offset, sent once, is not (docs/protocol.md: subscribing again to a
topic the connection follows goes on from where its stream stands)."""

from __future__ import annotations

import json
import sys
from array import array
from collections.abc import AsyncIterator
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
from _soak_children import Client, Pair  # noqa: E402


class Connection:
    """A server that sends `frames` after its hello, and keeps what the client sends."""

    def __init__(self, frames: list[dict]) -> None:
        self.frames = frames
        self.sent: list[dict] = []

    async def recv(self) -> str:
        return json.dumps({"op": "hello", "session": None, "heartbeat": 25})

    async def send(self, text: str) -> None:
        self.sent.append(json.loads(text))

    async def __aiter__(self) -> AsyncIterator[str]:
        for frame in self.frames:
            yield json.dumps(frame)


def message(offset: str, k: int) -> dict:
    return {"op": "message", "topic": "t", "offset": offset, "data": {"k": k, "t": 0.0}}


async def seen(*connections: Connection) -> Pair:
    """What one client saw of topic `t` over `connections`, one after the other."""
    pair = Pair("t", "t")
    client = Client(1, "ws://server", [pair], array("d"), array("d"))
    for connection in connections:
        await client._session(connection)
    return pair


async def test_a_message_after_a_refetchs_subscribed_at_its_offset_is_no_duplicate() -> None:
    """After `reset` the client subscribes again with no `since`; the server goes on from where the
    connection stood, so the message published after the reset follows that `subscribed`, whose
    offset it is. Sent once, it is delivered: no duplicate, and the client stands there."""
    pair = await seen(Connection([
        {"op": "subscribed", "ref": "t|:first", "topic": "t", "offset": "1-0"},
        message("2-0", 2),
        {"op": "reset", "topic": "t"},
        {"op": "subscribed", "ref": "t|:refetch", "topic": "t", "offset": "5-0"},
        message("5-0", 5),
        message("6-0", 6),
    ]))
    assert (pair.dups, pair.ks, pair.last, pair.reset_to) == (0, [2, 5, 6], "6-0", "5-0")


async def test_a_message_sent_twice_or_out_of_order_is_a_duplicate_whatever_came_between() -> None:
    """A message at or below the newest one delivered is a duplicate, a refetch between or not;
    a first subscribe's stream starts after its offset, so one at or below that is one too."""
    pair = await seen(Connection([
        {"op": "subscribed", "ref": "t|:first", "topic": "t", "offset": "1-0"},
        message("1-0", 1),
        message("2-0", 2),
        message("2-0", 2),
        {"op": "reset", "topic": "t"},
        {"op": "subscribed", "ref": "t|:refetch", "topic": "t", "offset": "5-0"},
        message("5-0", 5),
        message("4-0", 4),
        message("5-0", 5),
    ]))
    assert (pair.dups, pair.ks) == (4, [2, 5])


async def test_a_reconnect_resumes_from_what_a_refetch_covered() -> None:
    """The refetch covers up to its `subscribed` offset: the next connection resumes from there,
    not from the last message seen before the reset (which the reset says history no longer
    holds), and a message at or below it on that connection is a duplicate."""
    first = Connection([
        {"op": "subscribed", "ref": "t|:first", "topic": "t", "offset": "1-0"},
        message("2-0", 2),
        {"op": "reset", "topic": "t"},
        {"op": "subscribed", "ref": "t|:refetch", "topic": "t", "offset": "5-0"},
    ])
    again = Connection([
        {"op": "subscribed", "ref": "t|:since", "topic": "t", "offset": "6-0"},
        message("4-0", 4),
        message("6-0", 6),
    ])
    pair = await seen(first, again)
    assert again.sent == [{"op": "subscribe", "topic": "t", "since": "5-0", "ref": "t|:since"}]
    assert (pair.dups, pair.ks, pair.last) == (1, [2, 6], "6-0")
