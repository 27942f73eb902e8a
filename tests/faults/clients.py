"""WebSocket clients that keep their subscriptions the way the JS client does, and the check
that every published message reached them (or that they were told, with `reset`, they missed it)."""

from __future__ import annotations

import asyncio
import bisect
import json
from collections.abc import Mapping, Sequence
from typing import Any

from websockets.asyncio.client import connect
from websockets.exceptions import InvalidHandshake, WebSocketException

from livepush.tasks import Backoff
from livepush.types import Offset, offset_key
from tests.faults.load import Published, stop_tasks
from tests.support.waiting import async_wait_for


class ResumingClient:
    """A WebSocket client holding subscriptions the way the JS client does (docs/reference.md §5,
    §7): per topic it keeps the last offset it delivered and drops any message not newer (counted
    in `not_newer`: the server promises no duplicate and no disorder); `reset` forgets the
    offset; a lost connection is reopened after a jittered, doubling delay and every topic is
    subscribed again with `since` = its offset. A topic's first `subscribed` offset is where it
    starts (a page that embedded `latest_offset()`).

    `events[topic]` is what it delivered, in order: ("message", offset) or ("reset", None)."""

    def __init__(self, url: str, subscriptions: Mapping[str, str], *, name: str = "client") -> None:
        self.url = url
        self.name = name
        self.subscriptions = dict(subscriptions)  # plain topic -> what to send (signed topic)
        self.offsets: dict[str, Offset | None] = dict.fromkeys(self.subscriptions)
        self.start_offsets: dict[str, Offset] = {}
        self.events: dict[str, list[tuple[str, Offset | None]]] = {t: [] for t in self.subscriptions}
        self.not_newer: list[tuple[str, Offset]] = []
        self.connections = 0
        self.refusals: list[dict[str, Any]] = []
        self.failure: str | None = None  # what stopped the client, if anything did (a bug of the test's)
        self._subscribed_all = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._closing = False
        self._ws: Any = None
        self._ref = 0
        self._refs: dict[int, str] = {}

    @classmethod
    async def open(cls, url: str, subscriptions: Mapping[str, str], *, name: str = "client",
                   timeout: float = 10.0) -> ResumingClient:
        """Connect, subscribe to every topic, and return once each is subscribed."""
        client = cls(url, subscriptions, name=name)
        client._task = asyncio.create_task(client._run(), name=f"ws-{name}")
        ready = asyncio.ensure_future(client._subscribed_all.wait())
        done, _ = await asyncio.wait([ready, client._task], timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        if ready not in done:
            ready.cancel()
            await client.close()
            raise AssertionError(f"{name}: not subscribed to {list(subscriptions)} within {timeout:g} s")
        return client

    @property
    def reconnects(self) -> int:
        return max(self.connections - 1, 0)

    def resets(self, topic: str | None = None) -> int:
        names = [topic] if topic else list(self.events)
        return sum(1 for t in names for kind, _ in self.events[t] if kind == "reset")

    async def close(self) -> None:
        """Close the connection and stop (bounded)."""
        self._closing = True
        if self._ws is not None:
            await self._ws.close()  # ends the read loop even if a cancellation below is lost
        if self._task is not None:
            await stop_tasks([self._task])

    async def _run(self) -> None:
        retry = Backoff(0.1, 2.0)
        while not self._closing:
            try:
                async with connect(self.url, open_timeout=5, max_size=None, close_timeout=1) as ws:
                    self._ws = ws
                    self.connections += 1
                    await self._session(ws, retry)
            except (OSError, TimeoutError, WebSocketException, InvalidHandshake):
                pass  # lost or refused: reconnect, as the JS client does
            except Exception as exc:  # a frame this client did not expect: say so in every report
                self.failure = f"{type(exc).__name__}: {exc}"
                raise
            if not self._closing:
                await retry.wait()

    async def _session(self, ws: Any, retry: Backoff) -> None:
        hello = json.loads(await asyncio.wait_for(ws.recv(), 5))
        assert hello["op"] == "hello", hello
        pending = set(self.subscriptions)
        for topic in self.subscriptions:
            await self._subscribe(ws, topic)
        async for raw in ws:
            frame = json.loads(raw)
            op = frame["op"]
            if op == "subscribed":
                topic = self._refs.pop(frame["ref"])
                self.start_offsets.setdefault(topic, frame["offset"])
                if self.offsets[topic] is None:
                    self.offsets[topic] = frame["offset"]
                pending.discard(topic)
                if not pending:
                    retry.reset()
                    self._subscribed_all.set()
            elif op == "refused":
                # `unavailable` is transient: ask again on this connection, as the JS client does.
                self.refusals.append(frame)
                topic = self._refs.pop(frame["ref"])
                await asyncio.sleep(0.2)
                await self._subscribe(ws, topic)
            elif op == "message":
                self._on_message(frame["topic"], frame["offset"])
            elif op == "reset":
                self.offsets[frame["topic"]] = None
                self.events[frame["topic"]].append(("reset", None))

    async def _subscribe(self, ws: Any, topic: str) -> None:
        self._ref += 1
        self._refs[self._ref] = topic
        await ws.send(json.dumps({"op": "subscribe", "topic": self.subscriptions[topic],
                                  "since": self.offsets[topic], "ref": self._ref}))

    def _on_message(self, topic: str, offset: Offset) -> None:
        last = self.offsets[topic]
        if last is not None and offset_key(offset) <= offset_key(last):
            self.not_newer.append((topic, offset))
            return
        self.offsets[topic] = offset
        self.events[topic].append(("message", offset))


def unaccounted(published: Sequence[Published], client: ResumingClient) -> dict[str, list[Offset]]:
    """Per topic, the offsets in `published` (past the topic's start for this client) that the
    client neither received nor was told it missed: a message is told missed when a `reset`
    arrived between the last message received before it and the first received after it."""
    lost: dict[str, list[Offset]] = {}
    for topic, events in client.events.items():
        if topic not in client.start_offsets:
            continue
        start = offset_key(client.start_offsets[topic])
        keys: list[tuple[int, ...]] = []  # received offsets, increasing (arrival order is offset order)
        positions: list[int] = []  # their index in `events`
        resets: list[int] = []
        for i, (kind, offset) in enumerate(events):
            if kind == "reset":
                resets.append(i)
            else:
                assert offset is not None
                keys.append(offset_key(offset))
                positions.append(i)
        received = set(keys)
        for p in published:
            key = offset_key(p.offset)
            if p.topic != topic or key <= start or key in received:
                continue
            at = bisect.bisect_left(keys, key)
            before = positions[at - 1] if at > 0 else -1
            after = positions[at] if at < len(positions) else len(events)
            first_reset_after = bisect.bisect_right(resets, before)
            if not (first_reset_after < len(resets) and resets[first_reset_after] < after):
                lost.setdefault(topic, []).append(p.offset)
    return lost


def delivery_report(published: Sequence[Published], clients: Sequence[ResumingClient]) -> str:
    """One line per client: what it missed without a reset, resets, duplicates, reconnects."""
    lines = []
    for c in clients:
        missed = unaccounted(published, c)
        shown = {t: (len(o), o[:5]) for t, o in missed.items()}
        lines.append(f"{c.name}: unaccounted {shown}, resets {c.resets()}, not newer {c.not_newer[:5]}, "
                     f"reconnects {c.reconnects}, refusals {len(c.refusals)}, failure {c.failure}")
    return "\n".join(lines)


async def wait_delivered(published: Sequence[Published], clients: Sequence[ResumingClient],
                         timeout: float = 20.0) -> None:
    """Wait until every client accounted for every message in `published` (received or reset)."""
    await async_wait_for(lambda: all(not unaccounted(published, c) for c in clients), timeout,
                         interval=0.1, message="every published message to reach every client (or a reset)\n"
                         + delivery_report(published, clients))
