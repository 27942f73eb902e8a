"""Named types shared across livepush."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeAlias

JSON: TypeAlias = Any  # plain JSON: str, int, float, bool, None, list, dict[str, JSON]
Topic: TypeAlias = str
Offset: TypeAlias = str  # opaque on the wire; comparable through offset_key()


@dataclass(frozen=True, slots=True)
class Message:
    """One published message as a fan-out hands it to receivers.

    `data_json` is the JSON text exactly as published, so the server encodes a frame once
    without parsing and re-serialising the payload. `prev` is the offset of the message
    before it on the same topic (for the first: "0" on Postgres and local, "0-0" on
    Redis, the same value latest_offset() gives for a topic never published), which lets the hub spot a gap.
    `data_json` is None when the transport could not carry the payload (a large message on
    Postgres NOTIFY): the receiver reads it from history.
    """

    topic: Topic
    offset: Offset
    prev: Offset
    data_json: str | None


def offset_key(offset: Offset) -> tuple[int, ...]:
    """Order offsets of one topic: "17" (Postgres, local) or "1700000000000-3" (Redis)."""
    return tuple(int(part) for part in offset.split("-"))


# A receiver gets live messages and control events from a fan-out, on the event loop.
Receiver: TypeAlias = Callable[[Message], None]
# Called with no argument after the fan-out reconnected its listener: whatever was
# published while it was away must be fetched from history.
ResyncHandler: TypeAlias = Callable[[], Awaitable[None] | None]
