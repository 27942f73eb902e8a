"""The hub: which connection hears which topic, and the order they hear it in.

Per topic the hub keeps a cursor, the offset of the last message it delivered. A message
whose `prev` is the cursor goes out at once; one at or below the cursor is a duplicate; one
that skips ahead (a missed notification, a listener gap) or carries no payload (too large
for NOTIFY) makes the hub read the range from history first. A range history cannot fill
becomes a `reset` to every subscriber: recovery is never partial.

A new subscriber is "joining" while its replay is read: live messages for it are buffered,
then sent after the replay without a duplicate at the seam (its `floor` is the last offset
it was sent). Everything here runs on the event loop; nothing awaits per subscriber.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import Protocol

from .. import protocol
from ..fanout import FanOut
from ..types import Message, Offset, offset_key

log = logging.getLogger("livepush.hub")

Key = tuple[int, ...]
NO_KEY: Key = ()
# Returns (offset, data_json) of a state topic's current state, or None when the topic
# has no state (not a state topic, or an unknown job/group).
SnapshotProvider = Callable[[str], Awaitable[tuple[Offset, str] | None]]


class Subscriber(Protocol):
    def send(self, frame: str) -> None: ...


Broadcast = Callable[[Iterable[Subscriber], str], None]


@dataclass(eq=False)
class _Topic:
    name: str
    subscribers: set[Subscriber] = field(default_factory=set)
    # Subscribers reading their replay; live frames wait in their buffer (key None = reset).
    joining: dict[Subscriber, list[tuple[Key | None, str]]] = field(default_factory=dict)
    # Subscribers whose replay went past the cursor: skip live frames up to their floor.
    floors: dict[Subscriber, Key] = field(default_factory=dict)
    cursor: Offset | None = None
    # While nothing was delivered yet (no cursor): the lowest floor of the subscribers that
    # finished joining. Everyone has everything up to it, so once nobody is still joining
    # it becomes the cursor, and a listener gap before the first live message is caught.
    low_floor: Offset | None = None
    fetching: bool = False
    pending: list[Message] = field(default_factory=list)

    @property
    def idle(self) -> bool:
        return not self.subscribers and not self.joining


def is_state_topic(topic: str) -> bool:
    return topic.startswith(("job:", "group:"))


class Hub:
    def __init__(
        self,
        fanout: FanOut,
        broadcast: Broadcast,
        *,
        snapshot: SnapshotProvider | None = None,
    ) -> None:
        self.fanout = fanout
        self._broadcast = broadcast
        self._snapshot = snapshot
        self._topics: dict[str, _Topic] = {}
        self._control: dict[str, Callable[[Message], None]] = {}
        self._tasks: set[asyncio.Task[None]] = set()

    # -- wiring -----------------------------------------------------------------------
    def on_control(self, topic: str, handler: Callable[[Message], None]) -> None:
        """Route messages of a reserved topic (e.g. revocations) to `handler`."""
        self._control[topic] = handler

    @property
    def snapshot_provider(self) -> SnapshotProvider | None:
        return self._snapshot

    # -- live path --------------------------------------------------------------------
    def on_message(self, message: Message) -> None:
        """The fan-out's receiver: called on the loop for every live message."""
        handler = self._control.get(message.topic)
        if handler is not None:
            handler(message)
            return
        state = self._topics.get(message.topic)
        if state is not None:
            self._accept(state, message)

    def _accept(self, state: _Topic, message: Message) -> None:
        if state.fetching:
            state.pending.append(message)
            return
        if state.cursor is not None:
            if offset_key(message.offset) <= offset_key(state.cursor):
                return  # already delivered (a replayed range, or a notification twice)
            if message.prev != state.cursor or message.data_json is None:
                self._fetch(state, state.cursor, message)
                return
        elif message.data_json is None:
            self._fetch(state, message.prev, message)
            return
        self._emit(state, message.offset, message.data_json)  # type: ignore[arg-type]

    def _emit(self, state: _Topic, offset: Offset, data_json: str) -> None:
        state.cursor = offset
        state.low_floor = None
        frame = protocol.message(state.name, offset, data_json)
        key = offset_key(offset)
        recipients: Iterable[Subscriber] = state.subscribers
        if state.floors:
            recipients = [s for s in state.subscribers if state.floors.get(s, NO_KEY) < key]
            for sub in [s for s, floor in state.floors.items() if floor <= key]:
                del state.floors[sub]
        self._broadcast(recipients, frame)
        for buffer in state.joining.values():
            buffer.append((key, frame))

    def _fetch(self, state: _Topic, since: Offset, first: Message | None) -> None:
        state.fetching = True
        state.pending = [first] if first is not None else []
        self._spawn(self._fill(state, since), f"livepush-fill-{state.name}")

    async def _fill(self, state: _Topic, since: Offset) -> None:
        try:
            missed = await self.fanout.history(state.name, since)
        except Exception as exc:  # a history read that fails is a gap we cannot fill
            log.warning("could not read history of %s (%s): subscribers get reset", state.name, exc)
            missed = None
        if missed is None:
            self._reset_all(state)
        else:
            floor = offset_key(state.cursor) if state.cursor is not None else NO_KEY
            for message in missed:
                if offset_key(message.offset) > floor and message.data_json is not None:
                    self._emit(state, message.offset, message.data_json)
        state.fetching = False
        pending, state.pending = state.pending, []
        for message in pending:
            self._accept(state, message)
        self._forget_if_idle(state)

    def _reset_all(self, state: _Topic) -> None:
        """A gap that history cannot fill: every subscriber refetches, then goes on live."""
        frame = protocol.reset(state.name)
        self._broadcast(state.subscribers, frame)
        for buffer in state.joining.values():
            buffer.append((None, frame))
        state.floors.clear()
        if state.pending:
            # What arrived during the failed read is covered by the refetch.
            state.cursor = max((m.offset for m in state.pending), key=offset_key)
            state.pending = []
        else:
            state.cursor = None

    async def resync(self) -> None:
        """After a listener gap: read what every active topic missed."""
        for state in list(self._topics.values()):
            since = state.cursor if state.cursor is not None else state.low_floor
            if since is not None and not state.fetching:
                self._fetch(state, since, None)

    # -- subscribing ------------------------------------------------------------------
    async def subscribe(self, sub: Subscriber, topic: str, since: Offset | None, ref: protocol.Ref) -> None:
        """Send `subscribed`, then the state or the missed messages, then go live."""
        state = self._topics.get(topic)
        if state is None:
            state = self._topics[topic] = _Topic(topic)
        if sub in state.subscribers or sub in state.joining:
            self._leave(state, sub)
        buffer: list[tuple[Key | None, str]] = []
        state.joining[sub] = buffer
        try:
            floor_offset = await self._catch_up(sub, topic, since, ref)
        except BaseException:
            if state.joining.get(sub) is buffer:
                del state.joining[sub]
            self._forget_if_idle(state)
            raise
        if state.joining.get(sub) is not buffer:
            return  # unsubscribed while catching up
        floor = offset_key(floor_offset)
        for key, frame in buffer:
            if key is None or key > floor:
                sub.send(frame)
                floor = key if key is not None else floor
        del state.joining[sub]
        state.subscribers.add(sub)
        if state.cursor is None:
            if state.low_floor is None or offset_key(floor_offset) < offset_key(state.low_floor):
                state.low_floor = floor_offset
            if not state.joining:
                # Not while someone is still joining: its read may predate a message whose
                # notification is in flight, which a higher cursor would drop as a duplicate.
                state.cursor, state.low_floor = state.low_floor, None
        cursor_key = offset_key(state.cursor) if state.cursor is not None else NO_KEY
        if floor > cursor_key:
            state.floors[sub] = floor

    async def _catch_up(self, sub: Subscriber, topic: str, since: Offset | None, ref: protocol.Ref) -> Offset:
        """Send `subscribed` and what precedes the live stream; return the last offset sent."""
        if since is not None:
            missed = await self.fanout.history(topic, since)
            if missed is not None:
                last = missed[-1].offset if missed else since
                sub.send(protocol.subscribed(ref, topic, last))
                for message in missed:
                    data = message.data_json if message.data_json is not None else "null"
                    sub.send(protocol.message(topic, message.offset, data))
                return last
            # Older than the history kept, or unknown: the client refetches.
            latest = await self.fanout.alatest_offset(topic)
            sub.send(protocol.subscribed(ref, topic, latest))
            sub.send(protocol.reset(topic))
            if is_state_topic(topic):
                return await self._send_snapshot(sub, topic, latest)
            return latest
        if is_state_topic(topic) and self._snapshot is not None:
            snap = await self._snapshot(topic)
            if snap is not None:
                offset, data_json = snap
                sub.send(protocol.subscribed(ref, topic, offset))
                sub.send(protocol.message(topic, offset, data_json))
                return offset
        latest = await self.fanout.alatest_offset(topic)
        sub.send(protocol.subscribed(ref, topic, latest))
        return latest

    async def _send_snapshot(self, sub: Subscriber, topic: str, latest: Offset) -> Offset:
        if self._snapshot is not None:
            snap = await self._snapshot(topic)
            if snap is not None:
                sub.send(protocol.message(topic, snap[0], snap[1]))
                return snap[0]
        return latest

    def unsubscribe(self, sub: Subscriber, topic: str) -> None:
        state = self._topics.get(topic)
        if state is not None:
            self._leave(state, sub)
            self._forget_if_idle(state)

    def _leave(self, state: _Topic, sub: Subscriber) -> None:
        state.subscribers.discard(sub)
        state.joining.pop(sub, None)
        state.floors.pop(sub, None)

    def _forget_if_idle(self, state: _Topic) -> None:
        if state.idle and not state.fetching and self._topics.get(state.name) is state:
            del self._topics[state.name]

    # -- tasks ------------------------------------------------------------------------
    def _spawn(self, coro: Awaitable[None], name: str) -> None:
        task = asyncio.ensure_future(coro)
        task.set_name(name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def aclose(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        if self._tasks:
            await asyncio.wait(self._tasks, timeout=1)
