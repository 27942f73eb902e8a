"""Named types shared across livepush, and the two seams the server reads through: fan-outs
(messages, `livepush.fanout`) and state sources (state topics, `StateSource` here)."""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Protocol, TypeAlias, overload

JSON: TypeAlias = Any  # plain JSON: str, int, float, bool, None, list, dict[str, JSON]
Topic: TypeAlias = str
Offset: TypeAlias = str  # opaque on the wire; comparable through offset_key()
# What an argument of seconds takes, all over livepush (delays, timeouts, ttl=): a number, or a
# timedelta (as_seconds).
Seconds: TypeAlias = float | timedelta


# Typed for the checker: a Seconds gives a float. At run time any value passes through (a user's
# unchecked argument), to be refused by its own check.
@overload
def as_seconds(value: Seconds) -> float: ...
@overload
def as_seconds(value: Seconds | None) -> float | None: ...
@overload
def as_seconds(value: object) -> object: ...
def as_seconds(value: Any) -> Any:
    """A `timedelta` given where livepush takes seconds, as its seconds; any other value as given.
    Every seconds-valued argument goes through here before its own check, which then refuses a
    negative or zero one, or one past its limit, with the error it gives the same number."""
    return value.total_seconds() if isinstance(value, timedelta) else value


def is_finite(value: float) -> bool:
    """math.isfinite(value), and False for an int no float holds (10**400): isfinite raises on
    it, and a comparison with math.inf lets it pass, to fail later in asyncio or timedelta with a
    bare OverflowError. The checks of seconds arguments use this for their upper end."""
    try:
        return math.isfinite(value)
    except OverflowError:
        return False


def shown(value: object, *, typed: bool = False, width: int = 60) -> str:
    """A user's value as a refusal echoes it: its repr, cut to `width` characters, and for an int
    past 128 bits (39 digits) its size ("an int of 1329 bits"): Python refuses to write an int of
    over 4,300 digits (a bare ValueError that names nothing), and a shorter one would still flood
    the message. An id past a bigint (2**70) is still written whole, as the caller can find it.
    typed=True puts the value's type first ("str '5'"), which a long int's words, and a repr such
    as Decimal('1E+9'), already say.
    Every refusal that echoes an argument writes it through here."""
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 128:
        return f"{'a negative' if value < 0 else 'an'} int of {value.bit_length()} bits"
    try:
        text = repr(value)
    except ValueError:  # a long int inside: a Fraction's, or a tuple's (concurrency=("tenant", N))
        if isinstance(value, (tuple, list)):
            inner = ", ".join(shown(item, width=width) for item in value[:10])
            text = f"({inner})" if isinstance(value, tuple) else f"[{inner}]"
        else:
            return f"a {type(value).__name__} too long to write"
    if len(text) > width:
        text = text[:max(width - 3, 1)] + "..."
    if typed and not text.startswith(f"{type(value).__name__}("):  # Decimal('1E+9') names its type already
        return f"{type(value).__name__} {text}"
    return text


@dataclass(frozen=True, slots=True)
class Message:
    """One published message as a fan-out hands it to receivers.

    `data_json` is the JSON text exactly as published, so the server encodes a frame once
    without parsing and re-serialising the payload. `prev` is the offset of the message before
    it on the same topic (for the first, "EPOCH-0" on Postgres, and on local and Redis the origin
    "0-…" that latest_offset() gave for the topic, never published, when it was published), which
    lets the hub spot a gap.
    `data_json` is None for a doorbell, which only names the offset: the receiver reads the
    message from history (the Postgres fan-out's notifications are all doorbells).
    """

    topic: Topic
    offset: Offset
    prev: Offset
    data_json: str | None
    # When it was published, in seconds since the epoch, where the fan-out knows (for the
    # publish-to-deliver lag metric; None for a doorbell).
    at: float | None = None


def offset_key(offset: Offset) -> tuple[int, ...]:
    """Order offsets of one topic: "17" (a state's version) or "1700000000000-3". Raises ValueError for anything
    that is not ASCII digits separated by "-"."""
    parts = offset.split("-")
    if not all(p.isascii() and p.isdigit() and len(p) <= 20 for p in parts):
        raise ValueError(f"not an offset: {offset[:40]!r}")
    return tuple(int(p) for p in parts)


# A receiver gets live messages from a fan-out, on the event loop.
Receiver: TypeAlias = Callable[[Message], None]
# Called with no argument after the fan-out reconnected its listener: whatever was
# published while it was away must be fetched from history.
ResyncHandler: TypeAlias = Callable[[], Awaitable[None] | None]


@dataclass(frozen=True, slots=True)
class State:
    """The current state of a state topic: its version (the topic's offset) and the JSON text of
    the object it describes under `key`, e.g. key "job" and view '{"id":7,...}'."""

    version: int
    event: str
    key: str
    view_json: str

    def data_json(self, *, snapshot: bool = False) -> str:
        """The `data` of the topic's message: {"event": ..., KEY: VIEW}."""
        event = "snapshot" if snapshot else self.event
        return '{"event":"' + event + '","' + self.key + '":' + self.view_json + "}"


class RingPath(Protocol):
    """A part that hears changes on a listener of its own and can ring its own channel, so that
    readiness can send a ring round and, when none comes back in time, make it listen anew: a
    state source, and the revocation store where no other ring goes through its listener."""

    async def ring_canary(self, token: str) -> None:
        """Ring the part's changes' channel with `token` (ASCII letters, digits and `-`), from
        a connection other than the one it listens on: heard back, it shows that changes are
        heard, which a listener that looks connected may not (readiness)."""

    @property
    def listening(self) -> bool: ...

    def relisten(self, reason: str) -> None:
        """Drop the connection changes are heard on and open it again, then resync, as after a
        loss; `reason` is logged. For a listener that looks connected and hears nothing, which
        only `ring_canary` sent round can tell (readiness)."""


class StateSource(RingPath, Protocol):
    """Where the server reads state topics (`job:<id>`, `group:<id>`, ...) from: their owner's
    rows. Registered with the server for its `prefixes` at wiring time."""

    prefixes: tuple[str, ...]

    def watch(self, on_change: Callable[[Topic, int | None], None], on_resync: Callable[[], None],
              on_created: Callable[[str, int, int], None],
              on_canary: Callable[[str], None] | None = None) -> None:
        """Call `on_change(topic, version or None)` when a state topic may have changed,
        `on_created(prefix, first, last)` when the rows with ids first..last may have been
        created (only topics without a state yet need a read), `on_resync()` when changes
        may have been missed (every watched topic must be read again, also after `relisten`),
        and `on_canary(token)` when a ring of `ring_canary(token)` is heard."""

    async def listen(self) -> None:
        """Start watching; returns once changes are heard (raises ListenError otherwise)."""

    async def read(self, topics: Sequence[Topic], *, timeout: float | None = None) -> dict[Topic, State]:
        """The current state of each topic that has one (an unknown id has none). `timeout`: the
        most the read may wait for the store (a pool's connection) before it raises
        DependencyError, as FanOut.history()'s; None leaves the store's own waits."""

    async def aclose(self) -> None: ...
