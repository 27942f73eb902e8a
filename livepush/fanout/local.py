"""The local fan-out: one process, history in memory.

For development, the demo without Postgres, and tests of pure logic. Publishing from
another process is impossible by construction: use Postgres or Redis for that.

Offsets are "EPOCH-SEQ", EPOCH the microsecond this fan-out first published on the topic (never
the same for two topics, and past the fan-out's own epoch): a restarted server numbers its topics
from 1 again, and a client resuming with an offset of the process before must get `reset`, not
that many of the new process's messages as if they followed its own; and a page resuming a topic
with an offset of another one (one `since` rendered for two topics) has seen none of it, so it
gets `reset` too, as on Postgres, rather than the topic's messages numbered past it.

A topic nothing is published on for a day (or twice the TTL), whose messages are all pruned, is
forgotten, as on Postgres and Redis, unless keep_chains() was called for it meanwhile (the hub
does, for the topics its subscribers watch): a process that serves many short-lived topics (a user's, a
document's) would otherwise keep each one for ever. Published again, it takes a new EPOCH, so a
forgotten topic's numbers are never given out again.

A topic this fan-out does not know has an origin as its offset, "0-ORIGIN": EPOCH moved on by
whole steps of half the idle time, as on Postgres and Redis. A forgotten topic reads as never
published, so an origin given out more than the idle time ago may have seen the topic published
and forgotten since, and gets `reset`; a younger one replays the topic from its first message
(which links to the origin of its time). Epoch 0 puts an origin below every offset a topic will
have, and an origin below EPOCH is one of a process before.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import threading
import time
import weakref
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..types import JSON, Message, Offset, Topic
from ..errors import ArgumentValueError
from .base import (HISTORY_PAGE, HISTORY_PAGE_BYTES, IDLE_EXPIRE, FanOut, History, encode_batch, encode_payload,
                   good_origin, idle_expiry, origin_number, plain_topic)

# Per topic: bounded memory even with a long TTL.
MAX_KEPT_PER_TOPIC = 10_000

_epochs_lock = threading.Lock()
_last_epoch = 0
# Every local fan-out of the process, for _after_fork.
_EVERY: weakref.WeakSet[LocalFanOut] = weakref.WeakSet()


def _after_fork() -> None:
    """In a forked child: a thread of the parent may have held a lock at the fork (inside a
    publish), and no thread of the child would ever release it."""
    global _epochs_lock
    _epochs_lock = threading.Lock()
    for fanout in list(_EVERY):
        fanout._lock = threading.Lock()


os.register_at_fork(after_in_child=_after_fork)


def _new_epoch() -> int:
    """Microseconds since 1970, and never the same twice in a process (fan-outs made in one
    microsecond keep their histories apart too)."""
    global _last_epoch
    with _epochs_lock:
        _last_epoch = max(time.time_ns() // 1000, _last_epoch + 1)
        return _last_epoch


@dataclass
class _Log:
    prefix: str  # "EPOCH-" of this topic's offsets
    origin: Offset  # the `prev` of its first message: the origin when it was made
    last: int = 0
    touched: float = 0.0  # time.monotonic() of the last publish, or of the last keep_chains()
    # seq, time, json, its size in bytes (counted once, at publish, for the page limit)
    entries: deque[tuple[int, float, str, int]] = field(default_factory=deque)
    dropped_through: int = 0  # every seq <= this one is gone


class LocalFanOut(FanOut):
    name = "local"

    def __init__(self, *, history_ttl: float = 300.0, idle_expire: float = IDLE_EXPIRE) -> None:
        super().__init__()
        self.history_ttl = history_ttl
        self.idle_expire = idle_expiry(idle_expire, history_ttl)
        self.epoch = _new_epoch()
        # Origins are counted from here on the monotonic clock, which prune() forgets topics by:
        # a step of the wall clock could make an old origin look young.
        self._made = time.monotonic()
        self._origin_step = max(int(self.idle_expire * 1_000_000) // 2, 1)  # microseconds
        self._logs: dict[Topic, _Log] = {}
        # publish() may come from worker threads (sync jobs): one lock orders a topic's offsets.
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        _EVERY.add(self)

    async def listen(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._listen_called = True

    @property
    def listening(self) -> bool:
        return self._listen_called

    def publish(self, topic: Topic, data: JSON, *, conn: Any = None) -> Offset:
        if conn is not None:
            raise ArgumentValueError("conn= needs the Postgres fan-out: set LIVEPUSH_FANOUT=postgres")
        topic, text = plain_topic(topic), encode_payload(data)
        with self._lock:
            offset = self._append(topic, text)
        self._published.inc()
        return offset

    def publish_many(self, messages: Iterable[tuple[Topic, JSON]], *, conn: Any = None) -> list[Offset]:
        if conn is not None:
            raise ArgumentValueError("conn= needs the Postgres fan-out: set LIVEPUSH_FANOUT=postgres")
        encoded = encode_batch(messages)
        with self._lock:
            offsets = [self._append(topic, text) for topic, text in encoded]
        self._published.inc(len(offsets))
        return offsets

    async def apublish_many(self, messages: Iterable[tuple[Topic, JSON]], *, conn: Any = None) -> list[Offset]:
        return self.publish_many(messages, conn=conn)

    def _append(self, topic: Topic, text: str) -> Offset:
        """Logs and dispatches one message; under the lock."""
        log = self._logs.get(topic)
        if log is None:
            log = self._logs[topic] = _Log(f"{_new_epoch()}-", self._origin())
        log.last += 1
        seq = log.last
        log.touched = time.monotonic()
        log.entries.append((seq, log.touched, text, len(text.encode("utf-8"))))
        while len(log.entries) > MAX_KEPT_PER_TOPIC:
            log.dropped_through = log.entries.popleft()[0]
        message = Message(topic, f"{log.prefix}{seq}", self._prev(log, seq), text, time.time())
        # Dispatch under the lock so the loop sees a topic's messages in offset order.
        self._deliver(message)
        return message.offset

    def _deliver(self, message: Message) -> None:
        loop = self._loop
        if loop is None or loop.is_closed():
            return
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is loop:
            loop.call_soon(self._heard.deliver, message)
        else:
            loop.call_soon_threadsafe(self._heard.deliver, message)

    async def apublish(self, topic: Topic, data: JSON, *, conn: Any = None) -> Offset:
        return self.publish(topic, data, conn=conn)

    async def history(self, topic: Topic, since: Offset, *, limit: int = HISTORY_PAGE,
                      timeout: float | None = None) -> History | None:
        with self._lock:
            origin = self._origin()
            good_origin = self._good_origin(since)
            log = self._logs.get(topic)
            if log is None:  # never published, or forgotten: only a good origin stands before it
                return History([], origin, False) if good_origin else None
            # A good origin replays a topic from its first message, whatever its epoch.
            after = 0 if good_origin else self._seq_of(since, log.prefix)
            if after is None:
                return None
            if after > log.last or after < log.dropped_through:
                return None  # an offset this topic never had, or one whose successors are gone
            cutoff = time.monotonic() - self.history_ttl
            out: list[Message] = []
            used = 0
            last = after
            # Entries hold consecutive seqs (appended in order, dropped from the front), so the page
            # starts at a known index: islice skips what came before it without a Python loop.
            start = max(0, after + 1 - log.entries[0][0]) if log.entries else 0
            for seq, at, text, size in itertools.islice(log.entries, start, None):
                if at < cutoff:
                    return None  # a missed message has expired: never a silent hole
                if len(out) == limit or used >= HISTORY_PAGE_BYTES:
                    break
                out.append(Message(topic, f"{log.prefix}{seq}", self._prev(log, seq), text))
                used += size
                last = seq
            return History(out, f"{log.prefix}{log.last}", last < log.last)

    @staticmethod
    def _prev(log: _Log, seq: int) -> Offset:
        return f"{log.prefix}{seq - 1}" if seq > 1 else log.origin

    def _elapsed(self) -> int:
        """Microseconds since this fan-out was made, on the monotonic clock."""
        return int((time.monotonic() - self._made) * 1_000_000)

    def _origin(self) -> Offset:
        """The origin given out now (base.origin_number)."""
        return f"0-{origin_number(self.epoch, self.epoch + self._elapsed(), self._origin_step)}"

    def _good_origin(self, since: Offset) -> bool:
        """Whether `since` is an origin of this fan-out given out less than the idle time (two
        steps) ago. An older one may have seen its topic published and forgotten since (a topic
        is forgotten once idle that long, and it was published after the origin was given out),
        which left nothing to tell it by."""
        moved = self._seq_of(since, "0-")
        # Not an origin, or one of a process before (below its epoch), or off its steps or old.
        return moved is not None and good_origin(moved, self.epoch, self.epoch + self._elapsed(),
                                                 self._origin_step, 2 * self._origin_step)

    @staticmethod
    def _seq_of(since: Offset, prefix: str) -> int | None:
        """The sequence number of an offset under `prefix` (a topic's epoch); None for one of
        another topic, of another process (or a fan-out before a restart), of a topic since
        forgotten, and for anything never given out."""
        if not (isinstance(since, str) and since.startswith(prefix)):
            return None
        tail = since[len(prefix):]
        if not (tail.isascii() and tail.isdigit()) or str(int(tail)) != tail:
            # Zero-padded: never given out, and past 20 digits no offset key the hub can compare
            # (the empty page's `since` is where the client stands).
            return None
        return int(tail)

    def latest_offset(self, topic: Topic) -> Offset:
        with self._lock:
            log = self._logs.get(topic)
            return f"{log.prefix}{log.last}" if log else self._origin()

    async def alatest_offset(self, topic: Topic, *, timeout: float | None = None) -> Offset:
        return self.latest_offset(topic)

    async def keep_chains(self, topics: Sequence[Topic]) -> None:
        now = time.monotonic()
        with self._lock:
            for topic in topics:
                log = self._logs.get(topic)
                if log is not None:
                    log.touched = now

    async def prune(self) -> int:
        now = time.monotonic()
        cutoff = now - self.history_ttl
        idle_since = now - self.idle_expire
        dropped = 0
        with self._lock:
            idle = []
            for topic, log in self._logs.items():
                while log.entries and log.entries[0][1] < cutoff:
                    log.dropped_through = log.entries.popleft()[0]
                    dropped += 1
                if not log.entries and log.touched < idle_since:
                    idle.append(topic)
            for topic in idle:
                del self._logs[topic]
        return dropped + len(idle)

    async def aclose(self) -> None:
        self._loop = None
