"""The fan-out seam: one narrow interface, three implementations (local, Postgres, Redis).

A fan-out moves published messages from any process to every server that listens, and keeps
each topic's recent history so a client can resume from an offset.

Contract (docs/reference.md#4-python-api, #7-guarantees):
- `publish`/`apublish` assign the message its offset and return it. Offsets increase per
  topic in commit order. Data over 1 MiB of JSON raises PayloadTooLarge before anything is
  written. `conn=` (Postgres only) publishes inside that psycopg transaction.
- `publish_many`/`apublish_many` publish a batch of (topic, data) pairs in one go and return
  their offsets in batch order; a topic's messages of one batch take its next offsets in batch
  order. Every item is checked before anything is written. Postgres: one transaction (the
  caller's with `conn=`), all or nothing. Redis: in order, one script call per 1,000 messages
  or 4 MiB.
- Nothing subscribes until `await listen()`, called once; it returns when the subscription is
  in effect, or raises ListenError. A publish-only process never listens.
- `register(receiver)` before `listen()` raises NotListeningError. A receiver gets a
  `Message` per live message; one whose `data_json` is None is a doorbell: the receiver reads
  the message from `history()`.
- A lost listener reconnects with capped, jittered backoff; `listening` is False meanwhile;
  after it is back, every `on_resync` handler runs so missed messages are read from history.
- `history(topic, since)` returns a page of the messages after `since`, in order, or None when
  `since` is older than what is kept or unknown (the client must get `reset`). `histories()`
  reads a page of each of many topics at once (the server's live reads after doorbells); a page
  may hold no message and say `more` when the read's byte bound was reached before its topic (read
  it again); it raises DependencyError when the store cannot be reached, and answers None for a
  topic whose read failed otherwise.
- `keep_chains(topics)` keeps each topic's chain (its offsets, so its next message follows its
  last) from being forgotten as idle for another `idle_expire` seconds: a server calls it for the
  topics its subscribers watch (the hub, more often than that), so a page live all along gets a
  rarely published topic's next message, not `reset`. A topic nothing was ever published on, or
  already forgotten, has no chain and is left as it is; one published to or kept within the last
  quarter of the idle time may be left as it is too (kept long enough already).
"""

from __future__ import annotations

import abc
import asyncio
import json
import logging
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .. import metrics
from ..channels import Handlers
from ..errors import ArgumentTypeError, DependencyError, InvalidTopic, NotListeningError, PayloadTooLarge
from ..topics import TOPIC_RE
from ..types import JSON, Message, Offset, Receiver, ResyncHandler, Topic, shown

MAX_PAYLOAD_BYTES = 1024 * 1024
# Messages per history read: a replay or a catch-up of any length is read and sent page by
# page, never held whole in memory. Each page costs a round trip, so a page is as long as the
# byte bound below allows for small messages.
HISTORY_PAGE = 1000
# Every fan-out also ends a page at the message that takes its data past this many bytes (a page
# always has one message), so a page of large messages stays about a MiB, not 1,000 of them.
HISTORY_PAGE_BYTES = 1024 * 1024
# Bytes of data one histories() call holds at most, past the page that crosses it: each topic's
# page has its first message whatever its size, so a read of the 500 topics a batch of doorbells
# or a resync names, each a MiB behind, held 500 MiB at once. A topic past the bound gets an empty
# page that says `more`, which the server reads again.
READ_BYTES = 4 * HISTORY_PAGE_BYTES
# Topics the default histories() reads at once; it counts what they hold before it reads more.
READ_AT_ONCE = 8
# Seconds without a publish after which a topic's offsets are forgotten (at least twice the
# history's TTL, so a live topic keeps its chain): its next message starts a new chain, and a
# client still holding an older offset gets `reset`. Topics that are never published again
# (a user's, a document's) would otherwise be kept for ever.
IDLE_EXPIRE = 86_400.0


def idle_expiry(idle_expire: float, history_ttl: float) -> float:
    """The seconds an idle topic is kept: at least twice its history's TTL, or a live topic would
    lose its chain."""
    return max(idle_expire, 2 * history_ttl)


# The origin of a topic never published ("0-NUMBER") moves on in whole steps of half the idle
# time, from an epoch that a loss of the history changes: a forgotten topic reads as never
# published, so only an origin younger than the idle time can vouch that nothing was forgotten
# since it was given out. The local and Postgres fan-outs share this arithmetic (Redis keeps its
# two newest origins in Redis instead). All in microseconds.
def origin_number(epoch: int, now: int, step: int) -> int:
    """The origin given out at `now`: `epoch` moved on by whole steps, so that its age shows."""
    return epoch + max(now - epoch, 0) // step * step


def good_origin(number: int, epoch: int | None, now: int, step: int, idle: int) -> bool:
    """Whether origin `number` lies on `epoch`'s steps (the history was not lost since) and was
    given out less than `idle` ago; an older one may have seen its topic published and forgotten
    since, which left nothing to tell it by."""
    return epoch is not None and epoch <= number <= now and (number - epoch) % step == 0 and now - number < idle


log = logging.getLogger("livepush.fanout")


# One encoder for every publish: json.dumps() with options builds a new one at each call, which
# was a quarter of the ~3 µs it takes to encode a small message.
_encode = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode


def encode_payload(data: JSON, what: str = "publish() data") -> str:
    """JSON text of `data`, refusing NaN and anything over 1 MiB. `what` names it in errors."""
    try:
        text = _encode(data)
    except (TypeError, ValueError) as exc:
        if "integer string conversion" in str(exc):
            # Python's own words name neither the value nor the limit's way out, which is not
            # sys.set_int_max_str_digits(): a client's JSON.parse would lose the digits anyway.
            raise ArgumentTypeError(f"{what} must be plain JSON: it holds an int of more than "
                                    f"{sys.get_int_max_str_digits()} digits, which Python will not write; "
                                    "send it as a string") from None
        raise ArgumentTypeError(f"{what} must be plain JSON: {exc}") from None
    except RecursionError:
        # The encoder follows nesting on the interpreter's stack: a few KiB of lists in lists
        # go past it.
        raise ArgumentTypeError(f"{what} must be plain JSON: it is nested too deeply to encode; flatten it") from None
    try:
        size = len(text.encode("utf-8"))
    except UnicodeEncodeError as exc:
        # json.dumps keeps a lone surrogate (what Python makes of undecodable bytes, e.g. a file
        # name) as it is, and no store or client can take text that is not Unicode.
        bad = text[exc.start:exc.end]
        raise ArgumentTypeError(f"{what} must be plain JSON: it holds a lone surrogate ({bad!r}), "
                                "not Unicode text") from None
    if size > MAX_PAYLOAD_BYTES:
        raise PayloadTooLarge(
            f"{what} is {size} bytes of JSON, over the 1 MiB limit: send a reference "
            "(an id or URL) and let the page fetch the rest"
        )
    return text


def batch_pairs(messages: Iterable[tuple[Topic, JSON]]) -> list[tuple[Topic, JSON]]:
    """The items of a publish_many as a list, each checked to be a (str topic, data) pair; an
    error names the item."""
    if isinstance(messages, (str, bytes, dict)) or not isinstance(messages, Iterable):
        raise ArgumentTypeError(f"publish_many() takes an iterable of (topic, data) pairs, got {type(messages).__name__}")
    items = list(messages)
    for i, item in enumerate(items):
        if not isinstance(item, tuple) or len(item) != 2:
            raise ArgumentTypeError(f"publish_many() takes (topic, data) pairs: item {i} is {shown(item, width=60)}")
        if not isinstance(item[0], str):
            raise ArgumentTypeError(f"publish_many() item {i}: the topic must be a str, got {type(item[0]).__name__}")
    return items


def plain_topic(topic: Any) -> Topic:
    """`topic` when a subscriber could name it, else InvalidTopic naming it. Every fan-out checks
    this before it writes anything (the module API checks more first: reserved prefixes, state
    topics' ids): a message on any other topic would reach no one, or be dropped by every listener
    with the others of its frame."""
    if isinstance(topic, str) and TOPIC_RE.fullmatch(topic):
        return topic
    # Cut before repr() (a topic may be megabytes), yet past the width, so shown() marks the cut:
    # a topic cut to fit between quotes read as a valid one.
    raise InvalidTopic(f"invalid topic {shown(topic[:100] if isinstance(topic, str) else topic, width=80)}: "
                       "use 1 to 200 characters from A-Z a-z 0-9 _ . : / -")


def encode_batch(messages: Iterable[tuple[Topic, JSON]]) -> list[tuple[Topic, str]]:
    """The (topic, data) pairs of a publish_many with each data as JSON text, every item checked
    as publish() checks one before anything is written; an error names the item."""
    return [(plain_topic(topic), encode_payload(data, f"publish_many() item {i}'s data"))
            for i, (topic, data) in enumerate(batch_pairs(messages))]


@dataclass(frozen=True, slots=True)
class History:
    """One page of a topic's history after some offset.

    `messages` come in offset order; `latest` is the topic's newest offset when the page was
    read (the replay a subscriber needs ends there); `more` says whether messages remain
    between the last one returned and `latest` (read them with another call from there)."""

    messages: list[Message]
    latest: Offset
    more: bool


class FanOut(abc.ABC):
    """Base of the three fan-outs. Subclasses implement the abstract methods."""

    name: str = "abstract"
    # Seconds without a publish (or a keep_chains()) after which a topic is forgotten: each fan-out
    # sets it from idle_expiry().
    idle_expire: float = IDLE_EXPIRE

    def __init__(self) -> None:
        self._heard: Handlers[Message] = Handlers(f"the {self.name} fan-out", log)
        self._listen_called = False
        # A subscription of the server's is in effect: listen() succeeded and aclose() has not
        # ended it since. aclose() closes the subscription, so a listen() after it subscribes
        # again rather than return as if still listening (receivers stay: _listen_called).
        self._subscribed = False
        self._published = metrics.PUBLISHED.labels(self.name)  # counted once a publish returns its offset

    # -- listening --------------------------------------------------------------------
    @abc.abstractmethod
    async def listen(self) -> None: ...

    @property
    @abc.abstractmethod
    def listening(self) -> bool:
        """True while the subscription is in effect (drives /healthz)."""

    def relisten(self, reason: str) -> None:
        """Drop the connection the subscription listens on and open it again, then run every
        resync handler (replay from history, else `reset`), as after a loss; `reason` is logged
        at WARNING. For a subscription `listening` calls in effect that hears nothing, which only
        readiness's canary can tell. The local fan-out has no connection to lose: nothing to do."""

    def register(self, receiver: Receiver) -> None:
        if not self._listen_called:
            raise NotListeningError(
                f"register() on the {self.name} fan-out before listen(): call `await fanout.listen()` once at boot first"
            )
        self._heard.handlers.append(receiver)

    def on_resync(self, handler: ResyncHandler) -> None:
        if not self._listen_called:
            raise NotListeningError(
                f"on_resync() on the {self.name} fan-out before listen(): call `await fanout.listen()` once at boot first"
            )
        self._heard.resyncs.append(handler)

    # -- publishing -------------------------------------------------------------------
    @abc.abstractmethod
    def publish(self, topic: Topic, data: JSON, *, conn: Any = None) -> Offset: ...

    @abc.abstractmethod
    async def apublish(self, topic: Topic, data: JSON, *, conn: Any = None) -> Offset: ...

    @abc.abstractmethod
    def publish_many(self, messages: Iterable[tuple[Topic, JSON]], *, conn: Any = None) -> list[Offset]: ...

    @abc.abstractmethod
    async def apublish_many(self, messages: Iterable[tuple[Topic, JSON]], *, conn: Any = None) -> list[Offset]: ...

    # -- history ----------------------------------------------------------------------
    @abc.abstractmethod
    async def history(self, topic: Topic, since: Offset, *, limit: int = HISTORY_PAGE,
                      timeout: float | None = None) -> History | None:
        """The page of `topic` after `since` (None: history cannot serve it). `timeout`: seconds the
        read may wait for the store (a pool's connection, a call's answer) before it raises
        DependencyError, so that a caller with a deadline (the hub's replay retries) keeps it
        whatever the store's own waits are; None leaves those. A fan-out that never waits ignores it."""

    async def histories(self, reads: Mapping[Topic, Offset]) -> dict[Topic, History | None]:
        """A page after each topic's offset, as `history()` reads it, READ_AT_ONCE topics at a
        time until the pages hold READ_BYTES of data; fan-outs whose store can answer many topics
        in one round trip do so."""
        topics = list(reads)
        found: dict[Topic, History | None] = {}
        held = 0
        for start in range(0, len(topics), READ_AT_ONCE):
            chunk = topics[start:start + READ_AT_ONCE]
            if held >= READ_BYTES:
                # Not read: the page says only that there may be more (its `latest` is not read).
                found.update((topic, History([], reads[topic], True)) for topic in chunk)
                continue
            pages = await asyncio.gather(*(self.history(t, reads[t]) for t in chunk), return_exceptions=True)
            for topic, page in zip(chunk, pages):
                if isinstance(page, DependencyError):
                    raise page
                if isinstance(page, BaseException):
                    if not isinstance(page, Exception):
                        raise page
                    log.warning("could not read the history of %s (%s)", topic, page)
                    page = None
                found[topic] = page
                if page is not None:
                    held += sum(len(m.data_json or "") for m in page.messages)
        return found

    @abc.abstractmethod
    async def alatest_offset(self, topic: Topic, *, timeout: float | None = None) -> Offset:
        """The offset a subscriber of `topic` from now stands on. `timeout`: as history()'s, the
        most the read may wait for the store before it raises DependencyError (the hub's
        subscribes keep their bound with it); None leaves the store's own waits."""

    @abc.abstractmethod
    async def keep_chains(self, topics: Sequence[Topic]) -> None:
        """Keep the chains of `topics` for another `idle_expire` seconds, as a publish would, but
        without a message: their subscribers stand on their last offsets. One round trip per few
        thousand topics; raises DependencyError when the store cannot be reached."""

    @abc.abstractmethod
    def latest_offset(self, topic: Topic) -> Offset: ...

    async def prune(self) -> int:
        """Drop history past the TTL; a bounded amount of work per call. Returns rows dropped."""
        return 0

    async def aopen(self) -> None:
        """Open what publishing from the running loop uses, so that an unreachable database or
        Redis fails when a web app starts rather than at its first publish."""

    @abc.abstractmethod
    async def aclose(self) -> None: ...

    async def release_loop(self) -> None:
        """Close what this fan-out opened on the running loop (a loop about to end, e.g. one
        run by asyncio.run()), keeping everything else. The next async call opens anew."""

    def close(self) -> None:
        """Release sync (publish-side) resources."""
