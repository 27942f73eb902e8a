"""Receiving from a fan-out in tests, as the hub does: doorbells resolved through history, and
history read page by page.

A fan-out hands its receivers a `Message` per live message. The local and Redis fan-outs send
the data along; the Postgres fan-out rings a doorbell (`data_json` None: a notification carries
no data), and the receiver reads the message from `history(topic, message.prev)`, whose first
entry is that message. `history()` answers one page (`History(messages, latest, more)`) or
None; `read_history()` follows the pages to the end.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any

from livepush.fanout.base import FanOut
from livepush.types import Message

WAIT = 10.0  # seconds: the default bound on a wait for deliveries
# Pages read_history() follows at most: a fan-out whose `more` never turns False fails the test
# instead of looping for ever.
MAX_PAGES = 10_000


def offsets_of(messages: list[Message] | None) -> list[str]:
    return [m.offset for m in messages or []]


async def read_history(fanout: FanOut, topic: str, since: str) -> list[Message] | None:
    """Every message after `since`, following history()'s pages while `more`; None when any page
    answers None (the client would get `reset`)."""
    out: list[Message] = []
    cursor = since
    for _ in range(MAX_PAGES):
        page = await fanout.history(topic, cursor)
        if page is None:
            return None
        out.extend(page.messages)
        if not page.more:
            return out
        assert page.messages, f"history({topic!r}, {cursor!r}) says more but returned an empty page"
        cursor = page.messages[-1].offset
    raise AssertionError(f"history({topic!r}) still had more after {MAX_PAGES} pages")


async def resolve(fanout: FanOut, message: Message) -> Message:
    """`message` with its data: as it came, or read from history when it is a doorbell."""
    if message.data_json is not None:
        return message
    page = await fanout.history(message.topic, message.prev, limit=1)
    assert page is not None and page.messages, (
        f"the doorbell for {message.topic} {message.offset} names a message history does not have")
    found = page.messages[0]
    assert (found.offset, found.prev) == (message.offset, message.prev), (
        f"history after {message.prev} starts at {found.offset}, not at the doorbell's {message.offset}")
    assert found.data_json is not None, f"history gave {found.offset} without its data"
    return found


async def payload_of(fanout: FanOut, message: Message) -> Any:
    """The message's data, parsed; read from history when the message is a doorbell."""
    return json.loads((await resolve(fanout, message)).data_json or "null")


class Collector:
    """A receiver that records what a fan-out delivers and lets a test await a condition on it.

    `raw` is every message as it arrived (doorbells included); `messages` are the same messages
    in the same order with their data, doorbells resolved through `fanout`'s history when the
    test waits (so a receiver never awaits, as the contract wants). Without `fanout` doorbells
    stay as they came."""

    def __init__(self, fanout: FanOut | None = None) -> None:
        self.fanout = fanout
        self.raw: list[Message] = []
        self.messages: list[Message] = []
        self._changed = asyncio.Event()

    def __call__(self, message: Message) -> None:
        self.raw.append(message)
        self._changed.set()

    def on(self, topic: str) -> list[Message]:
        return [m for m in self.messages if m.topic == topic]

    async def _resolve_arrived(self) -> None:
        while len(self.messages) < len(self.raw):
            message = self.raw[len(self.messages)]
            self.messages.append(await resolve(self.fanout, message) if self.fanout is not None else message)

    async def wait(self, predicate: Callable[[list[Message]], bool], timeout: float = WAIT) -> None:
        try:
            async with asyncio.timeout(timeout):
                while True:
                    self._changed.clear()
                    await self._resolve_arrived()
                    if predicate(self.messages):
                        return
                    await self._changed.wait()
        except TimeoutError:
            raise AssertionError(
                f"timed out after {timeout} s; received {[(m.topic, m.offset) for m in self.raw]}") from None

    async def wait_count(self, topic: str, n: int, timeout: float = WAIT) -> list[Message]:
        await self.wait(lambda _: len(self.on(topic)) >= n, timeout)
        return self.on(topic)


async def read_on_bounded(fanout: FanOut, cursors: dict[str, str], bound: int) -> tuple[dict[str, list[str]], int]:
    """Read every topic of `cursors` on with histories() until none says `more`, as the server's
    live reads do, each read holding at most `bound` bytes of data and no page being a gap: the
    offsets read per topic, and how many reads it took."""
    got: dict[str, list[str]] = {topic: [] for topic in cursors}
    cursors = dict(cursors)
    reads = 0
    while cursors:
        reads += 1
        assert reads <= 100, "reading on keeps making progress"
        pages = await fanout.histories(cursors)
        held = sum(len(m.data_json or "") for page in pages.values() if page is not None for m in page.messages)
        assert held <= bound, f"one read held {held} bytes of data"
        for topic, page in pages.items():
            assert page is not None, f"{topic} was read as a gap"
            got[topic] += offsets_of(page.messages)
            if page.messages:
                cursors[topic] = page.messages[-1].offset
            if not page.more:
                del cursors[topic]
    return got, reads
