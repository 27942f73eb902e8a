"""The hub: which connection hears which topic, and the order they hear it in.

Two kinds of topic.

Message topics (the fan-out's log). Per topic the hub keeps a cursor: the offset of the last
message it delivered, anchored to the topic's latest offset when its first subscriber comes.
A live message whose `prev` is the cursor goes out at once; one at or below the cursor is a
duplicate. A doorbell (a message without data, as every Postgres notification is) or a message
that skips ahead makes the hub read the log from its own cursor, a page at a time: whatever a
notification claims, only what the log holds is delivered, and a notification that does not
check out costs one read. Doorbells that come during a read are served by one more read, never
by one read each. A range the log cannot fill becomes a `reset` to every subscriber: recovery
is never partial. The fan-out forgets a topic nothing was published on for its idle time (a day),
and a cursor on a forgotten chain cannot show that nothing was published and forgotten after it:
so the hub keeps the chains of the topics it watches (`_keep_chains`, every quarter of the idle
time, and a topic newly watched within a second), and a page live all along on a topic published
less than once a day gets its next message, not `reset`. A topic nothing was published on has an
origin as its cursor, which vouches for the idle time only: the same pass reads every watched
topic, and an empty page moves such a cursor on to the origin of the moment.

State topics (`job:<id>`, `group:<id>`, `workflow:<id>`: a StateSource's rows). Their offset is the state's
version. A change rings the source; the hub reads the current state of every rung topic it
watches, in one read per batch (which also conflates a burst of changes to the newest), and
sends it when its version is newer than the one it sent last. A subscriber first gets the
current state as a snapshot, unless its `since` is that version already.

A new subscriber is "joining" while its replay or snapshot is read: live frames for it are
buffered, then sent after the replay without a duplicate at the seam (its `floor` is the last
offset it was sent). A replay waits for its client, so on a message topic the buffer is bounded as
a live client's share of the topic is (server/backlog.py): past it the frames waiting are dropped,
and the replay reads on from the log until it reaches past them.
A live subscriber whose share of a message topic fills in its connection's backlog (a burst
larger than it, from one publish_many or a listener gap) is handed back to that same state
(`overflowed`): it reads on from the log after the last message it was given, at its own pace,
and joins again; only a log that no longer holds that offset makes it a `reset`.
Everything here runs on the event loop; nothing awaits per subscriber.

Live frames go out through `broadcast` with their topic and kind ("state", "message", "reset"):
what a subscriber that cannot keep up may replace or drop (server/backlog.py). The frames of a
subscribe (`subscribed`, the replay or snapshot, the join buffer) only keep their order: they go
through `send`, but for a state topic's states, which go through `broadcast` as "snapshot" (in
order all the same, and counted as states by the slow-client bound).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from websockets.exceptions import ConnectionClosed

from .. import metrics, protocol
from ..errors import DependencyError
from ..fanout import FanOut
from ..fanout.base import History
from ..repeats import Repeats
from ..types import Message, Offset, StateSource, offset_key
from .backlog import Kind, past_share

log = logging.getLogger("livepush.hub")

Key = tuple[int, ...]
NO_KEY: Key = ()
# After a read that a doorbell asked for and that found nothing new, the next read of that
# topic (of a state source: of any of its topics) waits this long: a flood of forged doorbells or
# state rings costs a bounded number of reads.
EMPTY_READ_PAUSE = 0.05
# A state read that failed is tried again after this long, while someone still watches.
STATE_RETRY_SECONDS = 1.0
# A history read that Postgres or Redis failed (a restart under way) is tried again after this
# long, while someone still listens: the log still holds the range, so it is no gap.
READ_RETRY_SECONDS = 0.5
# How long a replay from history (a subscribe's after its `subscribed`, or a read-on: Hub._read_on)
# goes on trying a read that Postgres or Redis failed, every READ_RETRY_SECONDS, before its client
# gets `reset`: a restart or a blip is no gap, and this is as long as a client may be missing a
# frame before it is closed as too slow (server/connection.py); its live messages meanwhile wait
# in its bounded join buffer. It counts from when the first failing read began, and each read
# waits for the store only what is left of it (at least READ_RETRY_SECONDS, the last try's
# chance): the give-up comes within READ_ON_RETRY_SECONDS + READ_RETRY_SECONDS of that read's
# start whatever the pool does, the silence a client's liveness check allows for
# (docs/protocol.md, "Connecting"; livepush.js REPLAY_SILENCE_MS). The reads a subscribe makes
# before its `subscribed` share as long from the subscribe's start, and a store down past it makes
# the answer `refused unavailable`, within the same silence.
READ_ON_RETRY_SECONDS = 20.0
# Tries of a batch's read, failing while the fan-out still hears (so the store answers), before
# the batch is split apart: a read that fails the same way every time (the store refuses one
# topic's key) would otherwise hold up every topic batched with it, for ever.
SPLIT_AFTER = 3
# Topics per log read at most, so that a topic rung among thousands waits for one read, not for
# all of them (the Postgres fan-out reads as many in one statement).
READ_BATCH = 500
# The chains of the watched message topics are kept (FanOut.keep_chains) every this share of the
# fan-out's idle time, so that a keep that comes late, or fails once, still comes in time.
KEEP_SHARE = 0.25
# A topic newly watched is kept within this long, with every other one watched meanwhile in one
# call: its last message may be most of an idle time old already.
KEEP_NEW_SECONDS = 1.0
# A keep that failed (the store away) is tried again after this long, while anyone watches.
KEEP_RETRY_SECONDS = 1.0
# A replay waits for the client after about this many bytes of frames, within a page too: a page
# holds up to a MiB of data before its last message, which may be a MiB itself, and all of it
# sent at once would wait past the 2 MiB a client may have waiting (server/connection.py), so a
# client reading as fast as it can would be closed as too slow.
REPLAY_DRAIN_BYTES = 256 * 1024


def _ahead(offset: Offset, key: Key) -> bool:
    """Whether `offset` is past `key` (False for one that is no offset: the read refuses it)."""
    try:
        return offset_key(offset) > key
    except ValueError:
        return False


def _names(topics: Iterable[str], shown: int = 3) -> str:
    """Topics for a log line: 'a', 'a, b' or 'a, b, c and 7 more'."""
    names = list(topics)
    head = ", ".join(names[:shown])
    return head if len(names) <= shown else f"{head} and {len(names) - shown} more"


def _time_left(deadline: float, now: float | None = None) -> float:
    """How long a read beginning `now` (loop time; by default the loop's time) may wait for the
    store (a fan-out read's `timeout`) to end by `deadline`: what is left of it, and never less
    than READ_RETRY_SECONDS, the read's chance."""
    if now is None:
        now = asyncio.get_running_loop().time()
    return max(deadline - now, READ_RETRY_SECONDS)


class Interrupted(Exception):
    """A subscribe failed after its `subscribed` went out. A subscribe has one answer, and a
    client takes the first for it: a `refused` now would go unheard, and the client would keep a
    subscription the server no longer serves. Its cause is the failure."""


class Subscriber(Protocol):
    def send(self, frame: str) -> None: ...

    async def drain(self) -> None:
        """Until the subscriber's unsent data is small again (between pages of a replay)."""


# (recipients, frame, topic, kind): encode once, write to each.
Broadcast = Callable[[Iterable[Subscriber], str, str, Kind], None]


class _Waiting:
    """The live frames a joining subscriber gets once its replay or snapshot is sent (key None:
    a reset). A replay waits for its client, which may read slower than the topic is published:
    on a message topic at most a live client's share waits (backlog.past_share, one larger
    frame alone); past it every frame waiting is dropped, and `dropped` remembers the
    newest key dropped, which the replay then reads on to from the log."""

    __slots__ = ("frames", "bytes", "dropped", "whole", "bounded", "stands", "reading_on")

    def __init__(self, bounded: bool, stands: Offset | None = None, *, reading_on: bool = False) -> None:
        self.frames: list[tuple[Key | None, str]] = []
        self.bytes = 0
        self.dropped: Key = NO_KEY
        self.whole = True  # nothing dropped: every live frame since it began is here (resets too)
        self.bounded = bounded  # a message topic's; a state topic's waits for one read only
        # The last offset a replay from history sent it (None: none yet), where a read that failed
        # midway goes on from, and where a second subscription of its connection goes on from.
        self.stands = stands
        # A subscriber reading on from history past its share (Hub._read_on), not a subscribe's.
        self.reading_on = reading_on

    def __len__(self) -> int:
        return len(self.frames)

    def add(self, key: Key | None, frame: str) -> None:
        if self.bounded and past_share(len(self.frames), self.bytes, len(frame)):
            # Keys only grow, so the last keyed frame is the newest dropped. A reset dropped
            # with them was for a gap the replay checks for itself in what it reads.
            self.dropped = max(self.dropped, *(k for k, _ in self.frames if k is not None), NO_KEY)
            self.frames, self.bytes, self.whole = [], 0, False
        self.frames.append((key, frame))
        self.bytes += len(frame)


class _Retries:
    """The retry bound of one replay or read-on (`Hub._replay_retrying`): when its read under way
    began, and, once reads fail where the client stands, where and until when they may go on
    failing. Counted from the start of the first failing read, not its failure: a read may wait
    for the store (a pool's connection) long before it fails."""

    __slots__ = ("began", "give_up", "failed_at")

    def __init__(self) -> None:
        self.began = 0.0
        self.give_up = 0.0
        self.failed_at: Offset | None = None  # where the client stood at the run's first failure

    def timeout(self, stands: Offset, now: float) -> float:
        """How long a read beginning `now` where the client stands at `stands` may wait for the
        store: the bound left of the failing run it continues, or the whole bound for a read that
        may be a run's first; never less than READ_RETRY_SECONDS, the last try's chance."""
        self.began = now
        return _time_left(self.give_up if self.failed_at == stands else now + READ_ON_RETRY_SECONDS, now)

    def failed(self, stands: Offset) -> bool:
        """A read where the client stands at `stands` failed; whether it is the first of its run
        (the first failure, or the first since the read got further)."""
        if self.failed_at == stands:
            return False
        self.give_up, self.failed_at = self.began + READ_ON_RETRY_SECONDS, stands
        return True


@dataclass(eq=False)
class _Topic:
    name: str
    source: StateSource | None  # None: a message topic of the fan-out
    subscribers: set[Subscriber] = field(default_factory=set)
    # Subscribers reading their replay; live frames wait in their buffer (key None = reset).
    joining: dict[Subscriber, _Waiting] = field(default_factory=dict)
    # Subscribers whose replay went past the cursor: skip live frames up to their floor.
    floors: dict[Subscriber, Key] = field(default_factory=dict)
    # State topics: subscribers whose subscribe waits for them to read its snapshot (live already).
    settling: set[Subscriber] = field(default_factory=set)
    # Subscribers whose share of the topic filled during the broadcast under way: they read on
    # from history once it is done (Hub.overflowed).
    overflowed: list[Subscriber] = field(default_factory=list)
    # The last offset (message topics) or version (state topics) delivered live, and its key
    # (set together by move(): every live message is compared with the key).
    cursor: Offset | None = None
    cursor_key: Key = NO_KEY
    # Message topics: set once the cursor is anchored; joiners read their replay after it.
    anchored: asyncio.Future[None] | None = None
    reading: bool = False
    # The newest offset a doorbell named, during a read or before the anchor, past the cursor
    # then: if the read leaves the cursor below it, read once more.
    wanted: Key = ()
    pending: list[Message] = field(default_factory=list)  # messages with data that came during a read
    found: bool = False  # whether the read round under way delivered anything
    # The listener came back during the read round under way, whose reads may have answered from
    # before the gap: what was published while nobody listened rang nothing, so read once more.
    resynced: bool = False
    # Loop time before which a doorbell waits to be read: a round that found nothing pauses the
    # next read whenever its doorbell comes, not only when it came during the round.
    quiet_until: float = 0.0

    @property
    def idle(self) -> bool:
        return not self.subscribers and not self.joining

    def move(self, cursor: Offset | None, key: Key | None = None) -> None:
        """Set the cursor and its key (`key`: when the caller has it already)."""
        self.cursor = cursor
        if key is not None:
            self.cursor_key = key
        elif cursor is None:
            self.cursor_key = NO_KEY
        else:
            self.cursor_key = (int(cursor),) if self.source is not None else offset_key(cursor)


class Hub:
    def __init__(self, fanout: FanOut, broadcast: Broadcast, *, states: Sequence[StateSource] = ()) -> None:
        self.fanout = fanout
        self._broadcast = broadcast
        self._sources: dict[str, StateSource] = {}
        for source in states:
            for prefix in source.prefixes:
                self._sources[prefix] = source
        self._topics: dict[str, _Topic] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        # State topics to read, per source, each with the highest version its rings claimed (None:
        # read it whatever it shows, as after a ring without a version), and whether a read of that
        # source is under way.
        self._state_due: dict[int, dict[str, int | None]] = {}
        self._state_reading: set[int] = set()
        # Watched state topics whose row was not found (yet): what a creation ring may concern,
        # by prefix and id, so that a ring of a few new rows costs a few lookups however many
        # such topics are watched.
        self._unborn: dict[str, dict[int, str]] = {}
        # Message topics whose log read is due, in the order asked, and whether a reader runs.
        self._read_due: dict[str, _Topic] = {}
        # Topics whose read failed on its own while the store answered: read alone, after a
        # pause, until a read of theirs succeeds (`_read_apart`).
        self._read_failing: set[str] = set()
        self._log_reading = False
        # Replays and read-ons from history (`_replay_retrying`) whose reads are failing now, and
        # whether one of them gave up meanwhile: an outage is said once, not once per client.
        self._read_ons_failing = 0
        self._read_on_gave_up = False
        # Message topics anchored since the last keep of their chains, the event that says one
        # came (or that a topic went), and the task that keeps them (running while any message
        # topic is watched: it ends once the last one goes).
        self._keep_new: set[str] = set()
        self._keep_woken = asyncio.Event()
        self._keeping: asyncio.Task[None] | None = None
        self._closed = False
        self._tally = metrics.TALLY
        # Gaps history could not fill, said at most once a minute: a loss of the whole history
        # (a restart without persistence) breaks every watched topic at once.
        self._gaps = Repeats(log)

    def source_of(self, topic: str) -> StateSource | None:
        prefix, sep, _ = topic.partition(":")
        return self._sources.get(prefix + sep) if sep else None

    # -- message topics: the live path --------------------------------------------------
    def on_message(self, message: Message) -> None:
        """The fan-out's receiver: called on the loop for every live message."""
        t = self._topics.get(message.topic)
        if t is not None and t.source is None:
            self._accept(t, message)

    def _accept(self, t: _Topic, message: Message) -> None:
        try:
            key = offset_key(message.offset)
        except ValueError:
            return
        if t.reading or t.cursor is None:
            # Served by the read under way (one more if it may have started too early and did
            # not reach this offset), or by the first read once the cursor is anchored.
            if message.data_json is not None and t.reading:
                t.pending.append(message)
            elif key > t.cursor_key:
                t.wanted = max(t.wanted, key)
            return
        if key <= t.cursor_key:
            return  # already delivered (a replayed range, or a notification twice)
        if message.data_json is not None and message.prev == t.cursor:
            self._emit(t, message.offset, message.data_json, key, message.at)
            return
        self._start_read(t)

    def _emit(self, t: _Topic, offset: Offset, data_json: str, key: Key, at: float | None) -> None:
        t.move(offset, key)
        if at is not None:
            self._tally.lag(time.time() - at)
        self._deliver(t, key, protocol.message(t.name, offset, data_json))

    def _deliver(self, t: _Topic, key: Key, frame: str) -> None:
        recipients: Iterable[Subscriber] = t.subscribers
        if t.floors:
            recipients = [s for s in t.subscribers if t.floors.get(s, NO_KEY) < key]
            for sub in [s for s, floor in t.floors.items() if floor <= key]:
                del t.floors[sub]
        self._broadcast(recipients, frame, t.name, "message" if t.source is None else "state")
        self._tally.frames += len(recipients)  # type: ignore[arg-type]
        for buffer in t.joining.values():
            buffer.add(key, frame)
        if t.overflowed:
            self._read_on(t)

    def overflowed(self, sub: Subscriber, topic: str) -> bool:
        """Called by the broadcast when `sub`, a subscriber too slow for the message being
        delivered live, has its share of message topic `topic` full (server/backlog.py). That
        message still waits for it; whatever follows it comes from history, as for a replay
        (`_read_on`), so that a burst larger than the share (a publish_many, what a listener gap
        missed) reaches a client reading as fast as it can without a `reset`. False where the hub
        has no live stream of the topic to hand over: the backlog queues `reset` as before."""
        t = self._topics.get(topic)
        if t is None or t.source is not None or t.cursor is None or self._closed or sub not in t.subscribers:
            return False
        t.overflowed.append(sub)
        return True

    def _read_on(self, t: _Topic) -> None:
        """Move the subscribers whose share overflowed in the broadcast that just ended out of the
        live set, as joiners (their live frames now wait in a bounded join buffer), and read each
        one's messages after the one just delivered from history at its own pace. Done after the
        broadcast, which may still be going through `t.subscribers`."""
        since = t.cursor
        assert since is not None
        for sub in t.overflowed:
            if sub not in t.subscribers:
                continue
            t.subscribers.discard(sub)
            t.floors.pop(sub, None)
            buffer = _Waiting(bounded=True, stands=since, reading_on=True)
            t.joining[sub] = buffer
            self._spawn(self._read_on_from(sub, t, since, buffer), "livepush-read-on")
        t.overflowed.clear()

    async def _read_on_from(self, sub: Subscriber, t: _Topic, since: Offset, buffer: _Waiting) -> None:
        """Send `sub` the messages of `t` after `since` from history, waiting for it between pages,
        then join it to the live stream again without a gap or a duplicate (`_go_live`)."""
        try:
            floor = await self._history_after(sub, t, since, buffer)
        except ConnectionClosed:
            floor = None  # the connection is closing: its subscriptions go with it
        except BaseException:  # cancelled: the hub is closing
            self._drop_joiner(t, sub, buffer)
            raise
        if floor is None or self._left(t, sub, buffer):
            self._drop_joiner(t, sub, buffer)
        else:
            self._go_live(sub, t, buffer, floor)

    async def _history_after(self, sub: Subscriber, t: _Topic, since: Offset, buffer: _Waiting) -> Key:
        """The replay of `_read_on_from`; return the key of the last offset sent. A read that
        Postgres or Redis fails is tried again (`_replay_retrying`); history that no longer holds
        the client's place, a read that fails otherwise, or the store still down past the retry
        bound ends in `reset` (unless the join buffer holds all it missed: `_reset_joiner`)."""
        # First the client reads what waits for it already (its share, and the rest of its
        # backlog): read on before that, and the replay's frames would wait beside them.
        await sub.drain()
        if self._left(t, sub, buffer):
            return offset_key(since)
        try:
            return await self._replay_retrying(sub, t, since, None, buffer,
                                               f"read on from the history of {t.name} for a client behind on it")
        except ConnectionClosed:
            raise
        except Exception as exc:
            log.warning("could not read on from the history of %s for a client behind on it (%s); %s",
                        t.name, exc, self._then(buffer))
            return await self._reset_joiner(sub, t, buffer, latest=False)

    async def _replay_retrying(self, sub: Subscriber, t: _Topic, since: Offset, page: History | None,
                               buffer: _Waiting, what: str) -> Key:
        """Send `sub` the messages of `t` after `since` from history (`page` first: the first page,
        read already, or None) with `_replay`; return the key of the last offset sent. A read that
        Postgres or Redis fails (a restart, a blip) is no gap, as for a live read: it is tried again
        every READ_RETRY_SECONDS from the last offset sent (nothing is sent twice), for up to
        READ_ON_RETRY_SECONDS; past that the client gets `reset` (`_reset_joiner`). Any other
        failure is the caller's to answer. `what` names the read in the log."""
        loop = asyncio.get_running_loop()
        # The bound runs from the first failing read where the client stands: a read-on that reads
        # a long backlog for a slow client may have run past it before the store fails once.
        retries, failures = _Retries(), 0
        counted = False  # among the reads failing now (`_read_ons_failing`)
        try:
            while True:
                # Where the client stands: after a failure midway, what was sent is not sent again.
                last = buffer.stands if buffer.stands is not None else since
                try:
                    if page is None:
                        page = await self.fanout.history(t.name, last, timeout=retries.timeout(last, loop.time()))
                        if counted:
                            # The store answers again: this replay is no longer failing, though it
                            # may run long yet (a slow client), and a next outage is said anew.
                            counted = False
                            self._read_on_recovered()
                        if page is None:  # pruned meanwhile: the client refetches
                            return await self._reset_joiner(sub, t, buffer, timeout=retries.timeout(last, loop.time()))
                    return await self._replay(sub, t, last, page, buffer, retries)
                except DependencyError as exc:
                    page = None
                    if retries.failed(buffer.stands if buffer.stands is not None else since):
                        failures = 0
                    failures += 1
                    if not counted:
                        counted = True
                        self._read_ons_failing += 1
                    if loop.time() >= retries.give_up:
                        self._say_read_on_gave_up(what, exc, buffer)
                        return await self._reset_joiner(sub, t, buffer, latest=False)
                    # One outage fails every client's read at once: said once, not once a client.
                    said = failures == 1 and self._read_ons_failing == 1
                    (log.warning if said else log.debug)(
                        "could not %s (%s); reading again every %g s", what, exc, READ_RETRY_SECONDS)
                    # The last try comes by the bound at the latest, so the give-up comes in time.
                    await asyncio.sleep(min(READ_RETRY_SECONDS, retries.give_up - loop.time()))
                    if self._left(t, sub, buffer):
                        return offset_key(buffer.stands if buffer.stands is not None else since)
        finally:
            if counted:
                self._read_on_recovered()

    def _read_on_recovered(self) -> None:
        """A replay or read-on counted among the failing ones (`_read_ons_failing`) read again, or
        ended (done, given up, or its client gone)."""
        self._read_ons_failing -= 1
        if not self._read_ons_failing:
            self._read_on_gave_up = False  # the outage is over: the next one is said again

    def _say_read_on_gave_up(self, what: str, exc: Exception, buffer: _Waiting) -> None:
        """The line of a replay or read-on that gives up on a store down past READ_ON_RETRY_SECONDS:
        the first of an outage is a warning, the other clients' that give up in it are debug lines."""
        (log.debug if self._read_on_gave_up else log.warning)(
            "could not %s for %g s (%s); %s", what, READ_ON_RETRY_SECONDS, exc, self._then(buffer))
        self._read_on_gave_up = True

    def _drop_joiner(self, t: _Topic, sub: Subscriber, buffer: _Waiting) -> None:
        if t.joining.get(sub) is buffer:
            del t.joining[sub]
        self._forget_if_idle(t)

    async def _reset_joiner(self, sub: Subscriber, t: _Topic, buffer: _Waiting, *, latest: bool = True,
                            timeout: float | None = None) -> Key:
        """Send a joiner `reset`; return the key it goes on live from: the topic's latest offset
        (read first, waiting for the store `timeout` at most, a replay's retry bound, so a refetch
        after the reset covers everything up to it), or, without
        `latest`, what its join buffer dropped (the frames it holds come after that). Never below
        what its replay (`stands`) sent it already: the frames waiting from before a read failed
        midway would go out to it a second time. With `latest`, nor below the frames waiting for it
        before that offset was read: published before it, they are what the refetch covers, and
        after a crash emptied the log the latest offset is an origin or a new epoch's, whose key
        does not compare with theirs.

        No reset for a read-on whose join buffer dropped nothing: made as the read-on began, at the
        cursor, it holds every live message since (and a `reset` wherever the live stream had a
        gap), all that history would have sent: the joiner goes on from where it stands. (A
        subscribe's join buffer began at the cursor, past what its replay had to send.)

        The reset names no subscribe: past a `subscribed`, the replay is the connection's one stream
        of the topic, which every subscription of it on the page follows (a second subscription's
        replay carries the first one's messages too), so all of them lost what it could not send."""
        if self._covered(buffer):
            assert buffer.stands is not None
            return offset_key(buffer.stands)
        waited = max((k for k, _ in buffer.frames if k is not None), default=NO_KEY) if latest else NO_KEY
        floor = offset_key(await self.fanout.alatest_offset(t.name, timeout=timeout)) if latest else buffer.dropped
        if not self._left(t, sub, buffer):
            sub.send(protocol.reset(t.name))
            metrics.RESETS.labels("history").inc()
        sent = offset_key(buffer.stands) if buffer.stands is not None else NO_KEY
        return max(floor, waited, buffer.dropped, sent)

    @classmethod
    def _then(cls, buffer: _Waiting) -> str:
        """What a replay or read-on that history cannot serve ends in, for its log line."""
        return "the live messages that waited for it cover that" if cls._covered(buffer) else "it gets reset"

    @staticmethod
    def _covered(buffer: _Waiting) -> bool:
        """Whether `buffer` is a read-on's that dropped nothing: what its history read was for
        waits in it already (`_reset_joiner`)."""
        return buffer.reading_on and buffer.stands is not None and buffer.whole

    def _start_read(self, t: _Topic) -> None:
        if not t.reading:
            t.reading = True
            wait = t.quiet_until - asyncio.get_running_loop().time()
            if wait > 0:
                # Doorbells that come meanwhile are served by this read (it reads to the log's end).
                asyncio.get_running_loop().call_later(wait, self._read_again, t)
            else:
                self._queue_read(t, new_round=True)

    def _queue_read(self, t: _Topic, *, new_round: bool) -> None:
        """Read `t` in the next batch: a new round (after which pending messages and doorbells
        are looked at again) or the next page of the round under way."""
        if new_round:
            t.wanted, t.found, t.resynced = NO_KEY, False, False
        self._read_due[t.name] = t
        if not self._log_reading:
            self._log_reading = True
            self._spawn(self._read_log(), "livepush-read-log")

    async def _read_log(self) -> None:
        """Read the log for every topic due, up to READ_BATCH topics a read: doorbells on many
        topics cost one read per batch, not one each. Each topic reads until it is caught up
        and no doorbell it heard is outstanding."""
        batch: list[_Topic] = []
        try:
            while self._read_due:
                batch = self._next_batch()
                if not batch:
                    continue
                pages = await self._read_pages(batch)
                for t in batch:
                    if t.name in pages:
                        await self._take_page(t, pages[t.name])
                    elif t.idle or t.cursor is None:
                        self._stop_reading(t)  # nobody listened by the time of the read
                    elif t.name in self._read_failing:
                        # Its read failed on its own: tried again after a pause, alone, while
                        # the other topics go on being read. Its round goes on where it was.
                        asyncio.get_running_loop().call_later(READ_RETRY_SECONDS, self._read_again, t, False)
                    else:
                        # Left out as idle (its subscribers left while a failed read waited to be
                        # tried again), and subscribed again while the others were read: what rang
                        # meanwhile waits in its round, which stopped here would never deliver it.
                        self._queue_read(t, new_round=False)
                batch = []
        finally:
            self._log_reading = False
            for t in [*batch, *self._read_due.values()]:  # cancelled: the hub is closing
                self._stop_reading(t)
            self._read_due.clear()

    def _next_batch(self) -> list[_Topic]:
        """The next topics to read, up to READ_BATCH, in the order they became due; a topic whose
        read keeps failing on its own is read alone, so that it fails no other topic's read."""
        batch: list[_Topic] = []
        for t in list(self._read_due.values()):
            if len(batch) == READ_BATCH:
                break
            alone = t.name in self._read_failing
            if alone and batch:
                continue  # read in a batch of its own, later
            del self._read_due[t.name]
            if t.idle:
                self._stop_reading(t)
                continue
            batch.append(t)
            if alone:
                break
        return batch

    async def _read_pages(self, batch: list[_Topic], *, apart: bool = False) -> dict[str, History | None]:
        """A page of each topic of `batch` that someone still listens to, read again while the
        store is unreachable (a restart under way: the log still holds the range, so it is no
        gap); a read that fails otherwise is a gap we cannot fill (None: reset). A read that
        keeps failing while the fan-out hears (the store answers) is split apart (`_read_apart`);
        `apart`: this is one part of such a read, split again at its first failure."""
        failures = 0
        while True:
            live = {t.name: t.cursor for t in batch if not t.idle and t.cursor is not None}
            if not live:
                return {}
            try:
                pages = await self.fanout.histories(live)
            except DependencyError as exc:
                failures += 1
                failing_alone = len(live) == 1 and not live.keys().isdisjoint(self._read_failing)
                if not (apart or failing_alone):
                    (log.warning if failures == 1 else log.debug)(
                        "could not read the history of %s (%s); reading again every %g s", _names(live), exc,
                        READ_RETRY_SECONDS)
                # While the fan-out does not hear, the store is away for every topic: splitting
                # would only read each alone once it is back.
                if self.fanout.listening and (apart or failing_alone or failures >= SPLIT_AFTER):
                    return await self._read_apart([t for t in batch if t.name in live], exc)
                await asyncio.sleep(READ_RETRY_SECONDS)
            except Exception as exc:
                log.warning("could not read the history of %s (%s): their subscribers get reset", _names(live), exc)
                return dict.fromkeys(live)
            else:
                self._read_failing.difference_update(live)  # read fine: batched as any other again
                if None in pages.values():  # most reads: every page there, nothing to look for
                    self._say_gaps(pages)
                return pages

    def _say_gaps(self, pages: dict[str, History | None]) -> None:
        """Say a gap the store's answer shows (no page: its history no longer holds the cursor),
        else only the resets metric showed it. Here, not at the reset: a read that failed resets
        too, but is said as that failure, and no loss of history."""
        for name, page in pages.items():
            if page is None and (t := self._topics.get(name)) is not None:
                self._gaps.warning(
                    "the history of %r no longer follows on from %s, where its subscribers stand (most likely the "
                    "store lost it: a restart without persistence, a flush, a Redis maxmemory-policy that evicts, a "
                    "Postgres crash; or it was trimmed before it could be read): %d subscribers get reset",
                    t.name, t.cursor, len(set(t.subscribers) | set(t.joining)))

    async def _read_apart(self, topics: list[_Topic], exc: DependencyError) -> dict[str, History | None]:
        """The pages of `topics`, whose read together keeps failing while the store answers: each
        half read on its own, and split again while it fails, so that every topic is delivered
        but those whose read fails on its own. Those are left out (no page: no reset, the log
        still holds their range) and marked to be read alone after a pause (`_read_log`)."""
        if len(topics) == 1:
            name = topics[0].name
            if name not in self._read_failing:
                log.warning("could not read the history of %s (%s) while the other topics' reads succeed; "
                            "reading it on its own again every %g s", name, exc, READ_RETRY_SECONDS)
                self._read_failing.add(name)
            return {}
        half = len(topics) // 2
        pages = await self._read_pages(topics[:half], apart=True)
        pages.update(await self._read_pages(topics[half:], apart=True))
        return pages

    async def _take_page(self, t: _Topic, page: History | None) -> None:
        """Deliver what a page read after the cursor holds, then read on or stop."""
        assert t.cursor is not None
        if page is None:
            await self._reset_all(t)
            t.found = True
        else:
            cursor_key = t.cursor_key
            for m in page.messages:
                if m.data_json is None:
                    continue
                key = offset_key(m.offset)
                if key > cursor_key:
                    self._emit(t, m.offset, m.data_json, key, m.at)
                    cursor_key = key
                    t.found = True
            if page.more and not t.idle:
                self._queue_read(t, new_round=False)
                return
            if not page.messages and not page.more and _ahead(page.latest, t.cursor_key):
                # Nothing lies between the cursor and the topic's latest offset (History's `more`):
                # an origin that moved on while nothing was published. Standing on the newer one
                # keeps the cursor young enough to vouch that nothing was published and forgotten.
                t.move(page.latest)
        # The round is over: what came live meanwhile goes out, or asks for one more round.
        pending, t.pending = t.pending, []
        for m in pending:
            key = offset_key(m.offset)
            if t.cursor is not None and key <= t.cursor_key:
                continue
            if t.cursor is not None and m.prev == t.cursor and m.data_json is not None:
                self._emit(t, m.offset, m.data_json, key, m.at)
            else:
                t.wanted = max(t.wanted, key)
        if not (t.found or t.resynced):
            t.quiet_until = asyncio.get_running_loop().time() + EMPTY_READ_PAUSE
        if t.idle or (t.wanted <= t.cursor_key and not t.resynced):
            self._stop_reading(t)  # what every doorbell named is delivered
        elif t.found or t.resynced:
            self._queue_read(t, new_round=True)
        else:
            asyncio.get_running_loop().call_later(EMPTY_READ_PAUSE, self._read_again, t)

    def _read_again(self, t: _Topic, new_round: bool = True) -> None:
        if self._closed:
            self._stop_reading(t)
        else:
            self._queue_read(t, new_round=new_round)

    def _stop_reading(self, t: _Topic) -> None:
        self._read_failing.discard(t.name)  # its next reader starts afresh
        t.reading = False
        t.pending = []
        self._forget_if_idle(t)

    async def _reset_all(self, t: _Topic) -> None:
        """A gap history cannot fill: every subscriber refetches, then goes on live from the
        topic's latest offset. That offset is read before the reset goes out: a refetch (which
        follows the reset) covers everything up to it, and everything after it is live.

        A subscriber whose subscribe began while that offset was read stands where its own read said
        (its floor), read after the gap was found: at or past that offset it missed nothing, so it
        gets no reset. One already joining when the gap was found gets the reset, whether its
        subscribe ends before that offset is read or after (then from its join buffer): its own read
        may have been answered before a loss of the history, whose offsets' keys sort above the
        origin the topic has after it, and say nothing across it. Floors are kept: each
        skips what its subscriber was sent already, and goes once live messages pass it; a reset
        subscriber's goes with the reset, which covers what it skipped (and a floor from before a
        loss of the history would hold back the next chain)."""
        before = set(t.subscribers) | set(t.joining)
        latest: Offset | None = None
        try:
            latest = await self.fanout.alatest_offset(t.name)
        except Exception as exc:
            log.warning("could not read the latest offset of %s (%s); reading again at the next message", t.name, exc)
        recipients = list(t.subscribers)
        if latest is not None:
            resumes = offset_key(latest)
            recipients = [s for s in recipients if s in before or t.floors.get(s, NO_KEY) < resumes]
        frame = protocol.reset(t.name)
        self._broadcast(recipients, frame, t.name, "reset")
        for sub in recipients:
            t.floors.pop(sub, None)
        metrics.RESETS.labels("history").inc(len(recipients) + len(t.joining))
        for buffer in t.joining.values():
            buffer.add(None, frame)
        if latest is not None:
            t.move(latest)  # messages pending from the read are kept: those past it go out next

    async def resync(self) -> None:
        """After a listener gap: read what every active message topic missed (a topic being read
        now reads once more when that read ends)."""
        for t in list(self._topics.values()):
            if t.source is None and t.cursor is not None:
                if t.reading:
                    t.resynced = True
                self._start_read(t)

    # -- state topics: the live path ------------------------------------------------------
    def on_state_change(self, topic: str, version: int | None) -> None:
        """A source's doorbell: `topic` may have changed (to `version`, when it says)."""
        t = self._topics.get(topic)
        if t is None or t.source is None:
            return
        if version is not None and t.cursor is not None and version <= int(t.cursor):
            return  # already sent
        due = self._state_due.get(id(t.source))
        if version is not None and due is not None and topic in due:
            claimed = due[topic]
            if claimed is None or claimed >= version:
                return  # already due for as much
            due[topic] = version
            return
        self._due(t.source, [topic], version)

    def on_state_created(self, prefix: str, first: int, last: int) -> None:
        """A source's doorbell for rows `first`..`last` that may have been created: read the
        watched topics among them that had no state (the rest already show a newer one)."""
        ids = self._unborn.get(prefix)
        if not ids:
            return
        if last - first < len(ids):
            born = [ids[i] for i in range(first, last + 1) if i in ids]
        else:
            born = [name for i, name in ids.items() if first <= i <= last]
        for name in born:
            t = self._topics.get(name)
            if t is not None and t.source is not None:
                self._due(t.source, [name])

    def _await_birth(self, topic: str) -> None:
        """Watch for the row of `topic` until a read finds it. Only a canonical id (digits, no
        leading zero) can be created: a source names the topics it reads so."""
        prefix, _, ident = topic.partition(":")
        if ident.isascii() and ident.isdigit() and str(int(ident)) == ident:
            self._unborn.setdefault(prefix + ":", {})[int(ident)] = topic

    def _born(self, topic: str) -> None:
        prefix, _, ident = topic.partition(":")
        ids = self._unborn.get(prefix + ":")
        if ids is not None and ident.isascii() and ident.isdigit() and ids.get(int(ident)) == topic:
            del ids[int(ident)]
            if not ids:
                del self._unborn[prefix + ":"]

    def on_state_resync(self, source: StateSource) -> None:
        """A source missed changes: read every topic of it that someone watches."""
        self._due(source, [t.name for t in self._topics.values() if t.source is source])

    def _due(self, source: StateSource, topics: Iterable[str], version: int | None = None) -> None:
        due = self._state_due.setdefault(id(source), {})
        for topic in topics:
            due[topic] = None if topic in due else version
        if due and id(source) not in self._state_reading:
            self._state_reading.add(id(source))
            self._spawn(self._read_states(source), "livepush-read-states")

    async def _read_states(self, source: StateSource) -> None:
        failures = 0  # reads in a row that failed
        try:
            while True:
                due = self._state_due.get(id(source))
                # A topic that a read since showed at the version its rings claimed is not read
                # again: rings that came while a read was under way claim what it found.
                batch = sorted(n for n, claimed in (due or {}).items()
                               if (t := self._topics.get(n)) is not None
                               and (claimed is None or t.cursor is None or claimed > int(t.cursor)))
                if due:
                    due.clear()
                if not batch:
                    return
                try:
                    states = await source.read(batch)
                except Exception as exc:
                    # Once per outage, as for history reads: retried every second, a warning each
                    # time filled the log for as long as the database was away.
                    failures += 1
                    (log.warning if failures == 1 else log.debug)(
                        "could not read %d state topics (%s); trying again every %g s", len(batch), exc,
                        STATE_RETRY_SECONDS)
                    await asyncio.sleep(STATE_RETRY_SECONDS)
                    self._state_due.setdefault(id(source), {}).update(dict.fromkeys(batch))
                    continue
                failures = 0
                found = False
                for name in batch:
                    t = self._topics.get(name)
                    state = states.get(name)
                    if t is None or state is None:
                        continue
                    self._born(name)
                    if t.cursor is None or state.version > int(t.cursor):
                        version = str(state.version)
                        t.move(version, (state.version,))
                        frame = protocol.message(name, version, state.data_json())
                        self._deliver(t, (state.version,), frame)
                        found = True
                if not found:
                    # Nothing new: the rings claimed versions no row has (forged: any login may send
                    # them) or none. Those that come meanwhile wait for one read after the pause,
                    # not one each, back to back for as long as a flood lasts.
                    await asyncio.sleep(EMPTY_READ_PAUSE)
        finally:
            self._state_reading.discard(id(source))

    # -- subscribing ------------------------------------------------------------------
    async def subscribe(self, sub: Subscriber, topic: str, since: Offset | None, ref: protocol.Ref) -> None:
        """Send `subscribed`, then the state or the missed messages, then go live."""
        # The reads before the answer wait for the store until then at most (a pool waits 30 s
        # for a connection): a client's liveness check allows a subscribe no more.
        deadline = asyncio.get_running_loop().time() + READ_ON_RETRY_SECONDS
        t = self._topics.get(topic)
        if t is None:
            t = self._topics[topic] = _Topic(topic, self.source_of(topic))
            if t.source is not None:
                self._await_birth(topic)
        # Where the connection's stream of a message topic it follows already stands: a `since`
        # history cannot resume from resets the new subscription, and the stream goes on from here.
        stood: Offset | None = None
        if sub in t.subscribers or sub in t.joining:
            if sub in t.subscribers:
                stood = self._stands(t, sub)
                since = self._resumes_from(t, sub, since)
            elif t.joining[sub].reading_on and (stands := t.joining[sub].stands) is not None:
                # Reading on from history past its share, it is live all the same: as above.
                stood = stands
                since = stands if since is None else since
            self._leave(t, sub)
        buffer = _Waiting(bounded=t.source is None)
        t.joining[sub] = buffer
        try:
            if t.source is None:
                await self._anchor(t, deadline)
                floor = await self._catch_up(sub, t, since, ref, buffer, deadline, stood)
            else:
                floor = await self._snapshot(sub, t, since, ref, buffer, deadline)
        except BaseException:
            if t.joining.get(sub) is buffer:
                del t.joining[sub]
            self._forget_if_idle(t)
            raise
        if t.joining.get(sub) is not buffer:
            return  # unsubscribed while catching up
        self._go_live(sub, t, buffer, floor)
        if t.source is not None:
            # The subscribe ends once the client has read its state, as a replay does: the
            # snapshots of subscribes sent together (a page watching many finished jobs with large
            # results) would otherwise pile up past what a client may have waiting. Live states
            # meanwhile go the live way, where a newer one replaces the one waiting.
            t.settling.add(sub)
            try:
                await sub.drain()
            finally:
                t.settling.discard(sub)

    def _go_live(self, sub: Subscriber, t: _Topic, buffer: _Waiting, floor: Key) -> None:
        """A joiner that was sent everything up to `floor` gets what its join buffer holds past it,
        then joins the live set (skipping, by its floor, what it was sent already)."""
        if buffer.dropped > floor:
            # Live messages past a `subscribed` or a reset were dropped while a read went on (a
            # replay reads on past them): the client refetches.
            sub.send(protocol.reset(t.name))
            metrics.RESETS.labels("slow_client").inc()
        for key, frame in buffer.frames:
            if key is None or key > floor:
                if t.source is None or key is None:
                    sub.send(frame)
                else:
                    self._send_state(sub, t.name, frame)
                floor = key if key is not None else floor
        del t.joining[sub]
        t.subscribers.add(sub)
        if floor > t.cursor_key:
            t.floors[sub] = floor

    @staticmethod
    def _resumes_from(t: _Topic, sub: Subscriber, since: Offset | None) -> Offset | None:
        """The `since` a subscriber that follows `t` already subscribes again with (a page's second
        subscription): the connection has one stream of the topic, which goes on from where it
        stands (_catch_up, told where that is), or from `since` when that is older. "From now"
        would drop what lies between for the page's other subscription, so it is where the stream
        stands; a `since` ahead of it (read from a database this server's listener lags behind, or
        of an earlier epoch, above a topic's `0-EPOCH` origin) stays, for history to say whether it
        resumes or resets. On a state topic, a `since` ahead would drop the state it has not been
        sent, which may be the final one."""
        stands = max(t.cursor_key, t.floors.get(sub, NO_KEY))
        if t.source is not None:
            # A state's snapshot goes out unless `since` is its version: past what the connection
            # was sent, `since` is no version its stream had, and the snapshot goes out (also to
            # a `since` past the current version, whose `subscribed` tells the client to take it).
            return None if since is not None and _ahead(since, stands) else since
        if t.cursor is None:
            return since
        return "-".join(map(str, stands)) if since is None else since

    @staticmethod
    def _stands(t: _Topic, sub: Subscriber) -> Offset | None:
        """The last offset of message topic `t` that its subscriber `sub` was sent (None on a state
        topic, or on a message topic with no cursor yet)."""
        if t.source is not None or t.cursor is None:
            return None
        return "-".join(map(str, max(t.cursor_key, t.floors.get(sub, NO_KEY))))

    async def _anchor(self, t: _Topic, deadline: float) -> None:
        """The first joiner of a message topic starts the read of its latest offset: the cursor
        live reads start from. Every joiner reads its replay after it, so nothing falls between.
        The read is a task of its own: a joiner that leaves (its connection lost) ends its own
        wait, never the read the others wait for. It waits for the store until the first joiner's
        `deadline`: the later joiners' come after it, and its failure is their answer too."""
        if t.anchored is None:
            t.anchored = self._spawn(self._read_anchor(t, deadline), "livepush-anchor")
            t.anchored.add_done_callback(_retrieve)  # its error is its joiners', who may all have left
        await asyncio.shield(t.anchored)

    async def _read_anchor(self, t: _Topic, deadline: float) -> None:
        try:
            t.move(await self.fanout.alatest_offset(t.name, timeout=_time_left(deadline)))
        except BaseException:
            t.anchored = None  # the next joiner reads again
            raise
        # Its joiners may all have left during the read, and the hub forgot the topic: a read
        # queued for it now would take the place of the one due for the topic of that name that
        # newer subscribers follow, whose messages would then wait for ever.
        if t.wanted > t.cursor_key and self._topics.get(t.name) is t:
            self._start_read(t)
        if self._topics.get(t.name) is t:
            self._keep(t)

    # -- keeping the watched topics' chains ------------------------------------------------
    def _keep(self, t: _Topic) -> None:
        """Keep the chain of `t`, newly anchored, within KEEP_NEW_SECONDS, then with the others."""
        self._keep_new.add(t.name)
        self._keep_woken.set()
        if self._keeping is None and not self._closed:
            self._keeping = self._spawn(self._keep_chains(), "livepush-keep-chains")

    async def _keep_chains(self) -> None:
        """While anyone watches a message topic: keep the chains of the topics newly watched, and
        every quarter of the fan-out's idle time those of every topic watched, so that none is
        forgotten under its subscribers. A keep that fails is tried again (with every topic) after
        KEEP_RETRY_SECONDS; one that comes too late all the same (the store away for most of a
        day) leaves the topic forgotten, whose next message is a `reset`, as before."""
        loop = asyncio.get_running_loop()
        every = self.fanout.idle_expire * KEEP_SHARE
        due = loop.time() + every
        failures = 0
        try:
            while True:
                if failures:
                    await asyncio.sleep(KEEP_RETRY_SECONDS)
                else:
                    if not self._keep_new:
                        # Once the last topic watched has gone (_forget_if_idle wakes us, or it went
                        # while we kept), there is nothing to keep: waiting out the pass for nothing
                        # held this task and its timer for hours after.
                        if not self._watches_messages():
                            return
                        self._keep_woken.clear()
                        with contextlib.suppress(TimeoutError):
                            await asyncio.wait_for(self._keep_woken.wait(), max(due - loop.time(), 0))
                        if not self._keep_new and not self._watches_messages():
                            return
                    # Topics watched in a burst of subscribes are kept together.
                    await asyncio.sleep(max(min(KEEP_NEW_SECONDS, due - loop.time()), 0))
                every_one = bool(failures) or loop.time() >= due
                # Between the passes over every topic only the new ones are looked at: a burst of
                # subscribes costs what it brings, not a walk of every topic watched.
                names = [name for name in (self._topics if every_one else self._keep_new)
                         if (t := self._topics.get(name)) is not None and t.source is None and t.cursor is not None]
                self._keep_new.clear()
                if every_one:
                    due = loop.time() + every
                    if not names:
                        return  # nobody watches a message topic: the next one watched starts it again
                if not names:
                    continue  # the new topics went within the second
                try:
                    await self.fanout.keep_chains(names)
                except Exception as exc:
                    failures += 1
                    (log.warning if failures == 1 else log.debug)(
                        "could not keep the history of %s (%s); trying again every %g s (a topic forgotten "
                        "meanwhile gets its subscribers reset at its next message)", _names(names), exc,
                        KEEP_RETRY_SECONDS)
                    continue
                failures = 0
                if every_one:
                    # A topic nothing was published on has no chain to keep: its cursor is an
                    # origin, good for the idle time only. A read now finds nothing after it and
                    # moves the cursor to the origin of the moment (_take_page), so that the
                    # topic's first message, however late, still follows on from it.
                    for t in list(self._topics.values()):
                        if t.source is None and t.cursor is not None and not t.idle:
                            self._start_read(t)
        finally:
            self._keeping = None

    @staticmethod
    def _left(t: _Topic, sub: Subscriber, buffer: _Waiting) -> bool:
        """Whether `sub` unsubscribed while its subscribe (whose join buffer is `buffer`) awaited a
        read or the client: only the subscribe's answer goes to it then, nothing more of `t`."""
        return t.joining.get(sub) is not buffer

    async def _catch_up(self, sub: Subscriber, t: _Topic, since: Offset | None, ref: protocol.Ref,
                        buffer: _Waiting, deadline: float, stood: Offset | None = None) -> Key:
        """Send `subscribed` and what precedes the live stream; return the key of the last offset
        sent. The reads before `subscribed` wait for the store until `deadline` (loop time).
        `stood`: where the connection's stream stood, when it followed the topic already."""
        topic = t.name
        if since is None:
            latest = await self.fanout.alatest_offset(topic, timeout=_time_left(deadline))
            sub.send(protocol.subscribed(ref, topic, latest))
            return offset_key(latest)
        page = await self.fanout.history(topic, since, timeout=_time_left(deadline))
        if page is None:
            # Older than the history kept, or unknown: the client refetches.
            latest = await self.fanout.alatest_offset(topic, timeout=_time_left(deadline))
            sub.send(protocol.subscribed(ref, topic, latest))
            if self._left(t, sub, buffer):
                return offset_key(latest)
            # Where the connection's stream stands itself (a second subscription from now), the
            # stream goes on from `latest`, and every subscription of the topic on the page lost
            # what lies between: the reset is the stream's. Otherwise it is this subscribe's own,
            # and names it, so that a subscription beside it that lost nothing does not refetch.
            streams = stood is not None and stood == since
            sub.send(protocol.reset(topic, None if streams else ref))
            metrics.RESETS.labels("history").inc()
            if stood is None or streams:
                return offset_key(latest)
            # A second subscription of the page, from a `since` older than the stream: the reset is
            # its own, and the connection's one stream goes on from where it stood, or the page's
            # first subscription would lose what it had not been sent yet. The new one drops that:
            # its `subscribed` named `latest`.
            since = stood
        else:
            metrics.RECOVERIES.inc()
            sub.send(protocol.subscribed(ref, topic, page.latest))
            if stood is not None and _ahead(since, offset_key(stood)):
                # History resumes from `since`, which is ahead of the connection's stream: the
                # stream goes on from where it stood, as above, and the new subscription drops
                # what it had (up to its `since`).
                since, page = stood, None
        try:
            # Past its `subscribed`, a store that is away for a moment only delays the replay.
            return await self._replay_retrying(sub, t, since, page, buffer, f"read the replay of {topic}")
        except ConnectionClosed:
            raise
        except Exception as exc:
            raise Interrupted(f"the replay of {topic} failed after its subscribed: {exc}") from exc

    async def _replay(self, sub: Subscriber, t: _Topic, since: Offset, page: History, buffer: _Waiting,
                      retries: _Retries) -> Key:
        """Send the messages of `page` and the pages after it, waiting for the client between
        them; return the key of the last offset sent. An unsubscribe while a page was read, or
        while the client read, ends it: the client wants no more. Each read waits for the store
        as long as `retries` allows."""
        topic = t.name
        last = since
        unread = 0
        while True:
            if self._left(t, sub, buffer):
                return offset_key(last)
            for message in page.messages:
                if unread >= REPLAY_DRAIN_BYTES:
                    await sub.drain()
                    unread = 0
                    if self._left(t, sub, buffer):
                        return offset_key(last)
                frame = protocol.message(topic, message.offset, message.data_json or "null")
                sub.send(frame)
                last = message.offset
                buffer.stands = last
                unread += len(frame)
            if not page.more:
                if unread:
                    # The replay ends once the client has read it: the replays of subscribes sent
                    # together (a client resuming many topics) would otherwise each leave a little
                    # unread, and together pass what a client may have waiting.
                    await sub.drain()
                    unread = 0
                if buffer.dropped <= offset_key(last):
                    return offset_key(last)
            # More to read, or live messages past the replay were dropped while the client read
            # it (_Waiting): the log holds them, so the replay reads on.
            await sub.drain()  # a replay of any length waits for the client, page by page
            unread = 0
            if self._left(t, sub, buffer):
                return offset_key(last)
            next_page = await self.fanout.history(topic, last,
                                                  timeout=retries.timeout(last, asyncio.get_running_loop().time()))
            if next_page is None:  # pruned while we read: the client refetches
                return await self._reset_joiner(
                    sub, t, buffer, timeout=retries.timeout(last, asyncio.get_running_loop().time()))
            page = next_page

    async def _snapshot(self, sub: Subscriber, t: _Topic, since: Offset | None, ref: protocol.Ref,
                        buffer: _Waiting, deadline: float) -> Key:
        """Send `subscribed` and the state topic's current state; its read waits for the store
        until `deadline` (loop time), as a message topic's reads before `subscribed` do."""
        assert t.source is not None
        state = (await t.source.read([t.name], timeout=_time_left(deadline))).get(t.name)
        if state is None:
            sub.send(protocol.subscribed(ref, t.name, None))  # no such job or group (yet): nothing to show
            return NO_KEY
        self._born(t.name)
        version = str(state.version)
        sub.send(protocol.subscribed(ref, t.name, version))
        if since != version and not self._left(t, sub, buffer):
            self._send_state(sub, t.name, protocol.message(t.name, version, state.data_json(snapshot=True)))
        return (state.version,)

    def _send_state(self, sub: Subscriber, topic: str, frame: str) -> None:
        """A state frame of a subscribe: in order after its `subscribed`, never replaced, and
        counted as a state by the slow-client bound (a final state larger than the bound arrives
        as a snapshot too)."""
        self._broadcast((sub,), frame, topic, "snapshot")

    def joining(self, sub: Subscriber, topic: str) -> bool:
        """Whether `sub`'s subscribe to `topic` is under way: its replay or snapshot being read or
        sent, or waiting for the client to read it."""
        t = self._topics.get(topic)
        return t is not None and (sub in t.joining or sub in t.settling)

    def unsubscribe(self, sub: Subscriber, topic: str) -> None:
        t = self._topics.get(topic)
        if t is not None:
            self._leave(t, sub)
            self._forget_if_idle(t)

    def _leave(self, t: _Topic, sub: Subscriber) -> None:
        t.subscribers.discard(sub)
        t.joining.pop(sub, None)
        t.floors.pop(sub, None)
        t.settling.discard(sub)

    def _forget_if_idle(self, t: _Topic) -> None:
        if t.idle and not t.reading and self._topics.get(t.name) is t:
            del self._topics[t.name]
            self._born(t.name)
            if t.source is None and self._keeping is not None:
                self._keep_woken.set()  # it may have been the last one watched: _keep_chains ends then

    def _watches_messages(self) -> bool:
        """Whether any message topic is watched, its cursor anchored: what _keep_chains keeps."""
        return any(t.source is None and t.cursor is not None for t in self._topics.values())

    # -- tasks ------------------------------------------------------------------------
    def _spawn(self, coro: Awaitable[None], name: str) -> asyncio.Task[None]:
        task = asyncio.ensure_future(coro)
        task.set_name(name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def aclose(self) -> None:
        self._closed = True
        for task in list(self._tasks):
            task.cancel()
        if self._tasks:
            await asyncio.wait(self._tasks, timeout=1)


def _retrieve(task: asyncio.Task[None]) -> None:
    if not task.cancelled():
        task.exception()
