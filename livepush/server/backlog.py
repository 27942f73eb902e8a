"""The frames waiting for one slow client, by kind of topic (docs/reference.md#8-trust-boundaries-and-abuse).

Pure bookkeeping, no I/O: the connection adds frames while the client cannot take them and
pops them, in order, as it drains.

- A state frame (`job:`, `group:`, `workflow:`) replaces the unsent one of its topic, in that
  one's place: the client gets the newest state as soon as it reaches that point, and the last
  state added is always the one it gets.
- A live message frame waits in its topic's bounded share. Past the bound, the backlog first
  asks its owner (`overflow`) whether the topic's history can take over: if so the frame waits
  as any other, and the hub sends the client what follows from history as it reads
  (hub.Hub.overflowed), so nothing is dropped. Otherwise that topic's waiting messages and
  waiting `reset` are dropped, one `reset` is queued after everything else, and the message
  follows it: the client refetches, and every message after the reset arrives without a gap.
- Any other frame (`subscribed`, a replay, a snapshot, `pong`) waits in order, never dropped.
  It also ends the conflation of every state waiting before it, so a state that comes later
  never overtakes it. A subscribe's state frames (kind "snapshot": its snapshot, and the changes
  that came while it was read) are such frames, and count as states for the slow-client bound
  (largest_state): a job's final state reaches a client as a snapshot too.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from typing import Literal

from .. import protocol

# What the hub says a frame is; None: any other frame (it only goes out in order), as does a
# "snapshot", which is a state all the same.
Kind = Literal["state", "message", "reset", "snapshot"]
# What add() did: queued, replaced an older state, replaced a topic's messages by `reset`, or
# queued past the topic's share while what follows is read from history.
Outcome = Literal["queued", "conflated", "reset", "replayed"]

TOPIC_FRAMES = 1000  # live messages one message topic may have waiting
TOPIC_BYTES = 256 * 1024  # and their bytes (one larger message may wait alone)


def past_share(frames: int, size: int, adding: int, max_frames: int = TOPIC_FRAMES,
               max_bytes: int = TOPIC_BYTES) -> bool:
    """Whether a frame of `adding` bytes would take a topic's waiting messages (`frames` of them,
    `size` bytes) past its share; a frame larger than the share may wait alone."""
    return frames > 0 and (frames >= max_frames or size + adding > max_bytes)


class _Slot:
    __slots__ = ("data", "topic", "kind", "at", "seq")

    def __init__(self, data: bytes, topic: str | None, kind: Kind | None, at: float, seq: int) -> None:
        self.data: bytes | None = data  # None once dropped
        self.topic = topic
        self.kind = kind
        self.at = at  # when this place in the queue was taken
        self.seq = seq  # its place among every slot ever added


class Backlog:
    """Frames for one client in the order they go out, with each topic's share bounded."""

    def __init__(self, topic_frames: int = TOPIC_FRAMES, topic_bytes: int = TOPIC_BYTES,
                 framing: Callable[[bytes], bytes] | None = None,
                 overflow: Callable[[str], bool] | None = None) -> None:
        self.topic_frames = topic_frames
        self.topic_bytes = topic_bytes
        self.bytes = 0  # of the frames waiting
        self._queue: deque[_Slot] = deque()
        self._dropped = 0  # slots in _queue whose frame was dropped
        self._states: dict[str, _Slot] = {}  # the state that a newer one of its topic replaces
        self._messages: dict[str, deque[_Slot]] = {}  # each message topic's waiting messages
        self._message_bytes: dict[str, int] = {}
        self._resets: dict[str, _Slot] = {}  # each message topic's waiting reset
        self._snapshots: set[_Slot] = set()  # waiting states of subscribes, never replaced
        self.last = 0  # the place of the last frame added (see passed())
        # What turns a frame's text into what is queued: a connection queues whole wire frames.
        self._framing = framing
        # Asked when a message topic passes its share: True if what follows comes from the topic's
        # history instead (no more live frames of it come here until then), False for `reset`.
        self._overflow = overflow

    def __len__(self) -> int:
        return len(self._queue) - self._dropped

    def largest_state(self) -> int:
        """The bytes of the largest waiting state: one that a newer one of its topic would replace,
        or a subscribe's."""
        states = [len(s.data) for s in self._states.values() if s.data is not None]
        return max(states + [len(s.data) for s in self._snapshots if s.data is not None], default=0)

    def passed(self, place: int) -> bool:
        """Whether every frame added up to `place` (a value of `last`) was popped or dropped."""
        self._skip_dropped()
        return not self._queue or self._queue[0].seq > place

    def behind_since(self) -> float | None:
        """Since when (time.monotonic()) the client has been missing something: when the frame
        that goes out next was queued, or a waiting reset's oldest dropped message."""
        self._skip_dropped()
        if not self._queue:
            return None
        return min([self._queue[0].at, *(r.at for r in self._resets.values())])

    def add(self, data: bytes, topic: str | None = None, kind: Kind | None = None) -> Outcome:
        if kind == "state" and topic is not None:
            slot = self._states.get(topic)
            if slot is not None and slot.data is not None:
                self.bytes += len(data) - len(slot.data)
                slot.data = data
                return "conflated"
            self._states[topic] = self._append(data, topic, kind)
            return "queued"
        if kind == "message" and topic is not None:
            outcome: Outcome = "queued"
            waiting = self._messages.get(topic)
            if waiting and past_share(len(waiting), self._message_bytes[topic], len(data),
                                      self.topic_frames, self.topic_bytes):
                if self._overflow is not None and self._overflow(topic):
                    outcome = "replayed"
                else:
                    self._drop_messages(topic, add_reset=True)
                    outcome = "reset"
            self._messages.setdefault(topic, deque()).append(self._append(data, topic, kind))
            self._message_bytes[topic] = self._message_bytes.get(topic, 0) + len(data)
            return outcome
        if kind == "reset" and topic is not None:
            # A reset from the hub covers whatever of the topic is still waiting.
            self._drop_messages(topic, add_reset=False)
            self._resets[topic] = self._append(data, topic, kind)
            return "queued"
        self._states.clear()  # states after this frame queue behind it
        slot = self._append(data, topic, "snapshot" if kind == "snapshot" else None)
        if kind == "snapshot":
            self._snapshots.add(slot)
        return "queued"

    def pop(self) -> bytes | None:
        """The next frame to send, or None when nothing waits."""
        self._skip_dropped()
        if not self._queue:
            return None
        slot = self._queue.popleft()
        data = slot.data
        assert data is not None
        self.bytes -= len(data)
        topic = slot.topic
        if topic is not None:
            if slot.kind == "state" and self._states.get(topic) is slot:
                del self._states[topic]
            elif slot.kind == "message":
                waiting = self._messages[topic]
                waiting.popleft()  # a topic's messages leave in the order they came
                if waiting:
                    self._message_bytes[topic] -= len(data)
                else:
                    del self._messages[topic], self._message_bytes[topic]
            elif slot.kind == "reset" and self._resets.get(topic) is slot:
                del self._resets[topic]
            elif slot.kind == "snapshot":
                self._snapshots.discard(slot)
        return data

    # -- inside ---------------------------------------------------------------------------------
    def _append(self, data: bytes, topic: str | None, kind: Kind | None) -> _Slot:
        self.last += 1
        slot = _Slot(data, topic, kind, time.monotonic(), self.last)
        self._queue.append(slot)
        self.bytes += len(data)
        return slot

    def _drop_messages(self, topic: str, *, add_reset: bool) -> None:
        """Drop the topic's waiting messages and reset; with `add_reset`, queue one reset last,
        standing as long in the queue as the oldest frame it replaces."""
        dropped = list(self._messages.pop(topic, ()))
        self._message_bytes.pop(topic, None)
        old_reset = self._resets.pop(topic, None)
        if old_reset is not None:
            dropped.append(old_reset)
        since = min((s.at for s in dropped), default=time.monotonic())
        for slot in dropped:
            assert slot.data is not None
            self.bytes -= len(slot.data)
            slot.data = None
        self._dropped += len(dropped)
        if add_reset:
            data = protocol.reset(topic).encode()
            reset = self._append(self._framing(data) if self._framing is not None else data, topic, "reset")
            reset.at = since
            self._resets[topic] = reset
        if self._dropped > 64 and self._dropped > len(self._queue) // 2:
            # Dropped slots cost memory until they reach the front: compact now and then.
            self._queue = deque(s for s in self._queue if s.data is not None)
            self._dropped = 0

    def _skip_dropped(self) -> None:
        queue = self._queue
        while queue and queue[0].data is None:
            queue.popleft()
            self._dropped -= 1
