"""The wire protocol (docs/reference.md#5-wire-protocol) as pure code: client frames in, typed commands or errors
out, and the server's frames as text. No sockets here: tests call it directly.
"""

from __future__ import annotations

import json
import math
import sys
from dataclasses import dataclass
from typing import Any, TypeAlias

from .types import Offset

MAX_FRAME_BYTES = 64 * 1024
BAD_FRAMES_PER_MINUTE = 10

# Close codes (docs/reference.md#5-wire-protocol).
CLOSE_POLICY = 1008
CLOSE_TOO_SLOW = 1013
CLOSE_UNAUTHORIZED = 4401
CLOSE_REVOKED = 4403

Ref: TypeAlias = str | int | float | None


@dataclass(frozen=True, slots=True)
class Subscribe:
    topic: str  # plain or signed; checked by the server
    since: Offset | None
    ref: Ref


@dataclass(frozen=True, slots=True)
class Unsubscribe:
    topic: str


@dataclass(frozen=True, slots=True)
class Ping:
    ref: Ref


@dataclass(frozen=True, slots=True)
class BadFrame:
    """A frame the server answers with `error` (and counts against the client)."""

    reason: str  # bad_frame | unknown_op
    detail: str


Command: TypeAlias = Subscribe | Unsubscribe | Ping | BadFrame


def _encodable(text: str) -> bool:
    try:
        text.encode()
    except UnicodeEncodeError:
        return False
    return True


def _ref(frame: dict[str, Any]) -> Ref | BadFrame:
    ref = frame.get("ref")
    if ref is None or isinstance(ref, (str, int, float)) and not isinstance(ref, bool):
        if isinstance(ref, str) and len(ref) > 200:
            return BadFrame("bad_frame", "ref is longer than 200 characters")
        # json.loads reads "\ud800" as a lone surrogate, which no UTF-8 text frame can carry:
        # echoed, it would fail the encoding of the answer.
        if isinstance(ref, str) and not ref.isascii() and not _encodable(ref):
            return BadFrame("bad_frame", "ref must be valid Unicode text (a lone surrogate is not)")
        # The decoder reads 1e999 as a float that no JSON can carry back (inf): echoed, it would
        # make a frame the client cannot parse.
        if isinstance(ref, float) and not math.isfinite(ref):
            return BadFrame("bad_frame", "ref must be a finite number")
        return ref
    return BadFrame("bad_frame", "ref must be a string, a number or null")


class _NotJSON(Exception):
    """What the decoder reads and a frame must not hold; args[0] says what, for the client."""


def _no_constant(name: str) -> Any:
    raise _NotJSON(f"not valid JSON: {name} is no number (JSON has no NaN or Infinity)")


def _unique_names(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    obj = dict(pairs)
    if len(obj) < len(pairs):  # the common case costs one comparison
        seen: set[str] = set()
        for name, _ in pairs:
            if name in seen:
                # json.dumps escapes what an answer may not carry (a lone surrogate); 40
                # characters name it.
                raise _NotJSON(f"the name {json.dumps(name[:40])} twice in one object: give each name once")
            seen.add(name)
    return obj


# Built once, as _dump is. A frame with NaN anywhere is no JSON, and is refused as such: read, it
# was served when the NaN stood in a field no op reads, and refused only as a ref. A name twice
# in one object is refused too: readers differ on which one counts (RFC 8259 leaves it open), so
# a proxy or a log reading the frame could see another subscribe than the server served.
_load = json.JSONDecoder(parse_constant=_no_constant, object_pairs_hook=_unique_names).decode


def parse(raw: str | bytes) -> Command:
    """Decode one client frame. Never raises: anything wrong becomes a BadFrame."""
    if isinstance(raw, bytes):
        return BadFrame("bad_frame", "binary frames are not accepted: send JSON text frames")
    try:
        frame = _load(raw)
    except _NotJSON as exc:
        return BadFrame("bad_frame", exc.args[0])
    except json.JSONDecodeError as exc:
        if raw.startswith("\ufeff"):
            # Some encoders write one before UTF-8 text; the decoder would only say it expected a value.
            return BadFrame("bad_frame", "not valid JSON: the frame begins with a byte order mark (U+FEFF): send none")
        # exc.msg is the decoder's own wording ("Expecting value"), never the client's text.
        return BadFrame("bad_frame", f"not valid JSON: {exc.msg} at character {exc.pos}")
    except RecursionError:
        # Valid JSON the decoder gives up on: "not valid JSON" would send the client looking
        # for a syntax error that is not there.
        return BadFrame("bad_frame", "JSON nested too deeply: a frame's values nest a few levels at most")
    except ValueError:
        # The one other ValueError of json.loads: an integer past Python's limit on digits.
        return BadFrame("bad_frame", f"a number of more than {sys.get_int_max_str_digits()} digits: "
                                     "no field of a frame takes one")
    if not isinstance(frame, dict):
        return BadFrame("bad_frame", "a frame must be a JSON object")
    op = frame.get("op")
    if not isinstance(op, str):
        # "missing" only when it is: a client that sent "op":5 would look for a typo in the name.
        problem = 'missing "op"' if "op" not in frame else '"op" must be a string'
        return BadFrame("bad_frame", f'{problem}: expected "subscribe", "unsubscribe" or "ping"')
    ref = _ref(frame)
    if isinstance(ref, BadFrame):
        return ref
    if op == "subscribe":
        topic = frame.get("topic")
        if not isinstance(topic, str):
            return BadFrame("bad_frame", 'subscribe needs "topic" as a string')
        since = frame.get("since")
        if since is not None and not isinstance(since, str):
            return BadFrame("bad_frame", 'subscribe "since" must be an offset string or null')
        if since is not None and len(since) > 100:
            return BadFrame("bad_frame", 'subscribe "since" is too long to be an offset')
        return Subscribe(topic, since, ref)
    if op == "unsubscribe":
        topic = frame.get("topic")
        if not isinstance(topic, str):
            return BadFrame("bad_frame", 'unsubscribe needs "topic" as a string')
        return Unsubscribe(topic)
    if op == "ping":
        return Ping(ref)
    return BadFrame("unknown_op", f"unknown op {op[:40]!r}: expected subscribe, unsubscribe or ping")


# -- server frames ---------------------------------------------------------------------
# Built once: json.dumps() with options builds an encoder at every call.
_dump = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False).encode


def hello(subject: str | None, heartbeat: float) -> str:
    session = {"subject": subject} if subject is not None else None
    # A whole number of seconds goes out as one (`25`, as documented, not `25.0`): a client that
    # reads it into an integer type would fail on the float.
    beat = int(heartbeat) if float(heartbeat).is_integer() else heartbeat
    return _dump({"op": "hello", "session": session, "heartbeat": beat})


def subscribed(ref: Ref, topic: str, offset: Offset | None) -> str:
    return _dump({"op": "subscribed", "ref": ref, "topic": topic, "offset": offset})


def refused(ref: Ref, reason: str) -> str:
    return _dump({"op": "refused", "ref": ref, "reason": reason})


def message(topic: str, offset: Offset, data_json: str) -> str:
    """Built by concatenation: data_json is already JSON, so the payload is never re-encoded.
    Topics and offsets are drawn from JSON-safe alphabets (see topics.TOPIC_RE)."""
    return '{"op":"message","topic":"' + topic + '","offset":"' + offset + '","data":' + data_json + "}"


def reset(topic: str, ref: Ref = None) -> str:
    """`ref`: the subscribe this reset answers, which it is about alone; None for a reset about the
    topic's stream, which every subscription of the topic on the connection hears. A subscribe
    whose ref was null cannot be told apart by one, so its reset names none either."""
    if ref is None:
        return _dump({"op": "reset", "topic": topic})
    return _dump({"op": "reset", "topic": topic, "ref": ref})


def pong(ref: Ref) -> str:
    return _dump({"op": "pong", "ref": ref})


def error(reason: str, detail: str) -> str:
    return _dump({"op": "error", "reason": reason, "detail": detail})


class BadFrameWindow:
    """Counts bad frames in a sliding minute; `add()` says when the client must be closed."""

    def __init__(self, limit: int = BAD_FRAMES_PER_MINUTE, window: float = 60.0) -> None:
        self.limit = limit
        self.window = window
        self._times: list[float] = []

    def add(self, now: float) -> bool:
        cutoff = now - self.window
        self._times = [t for t in self._times if t > cutoff]
        self._times.append(now)
        return len(self._times) > self.limit
