"""Topic names and signed topics (SPEC §5).

A plain topic matches [A-Za-z0-9_.:/-]{1,200}. A signed topic is the topic, `~`, and an
itsdangerous signature; with a TTL the signed value also carries the expiry time:
`job:42~SIG` or `job:42~1767225600~SIG`. `~` never appears in a plain topic, so a server
tells the two apart by that character alone.
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Sequence

from itsdangerous import BadSignature, Signer

from .errors import InvalidTopic

TOPIC_RE = re.compile(r"[A-Za-z0-9_.:/-]{1,200}")
RESERVED_PREFIX = "_livepush."
SEP = "~"
_SALT = "livepush.topic"


def validate_topic(topic: object, *, allow_reserved: bool = False) -> str:
    """Return `topic` if it is a valid plain topic, else raise InvalidTopic."""
    if not isinstance(topic, str) or not TOPIC_RE.fullmatch(topic):
        shown = repr(topic)[:60]
        raise InvalidTopic(
            f"invalid topic {shown}: use 1 to 200 characters from A-Z a-z 0-9 _ . : / -",
            "invalid_topic",
        )
    if not allow_reserved and topic.startswith(RESERVED_PREFIX):
        raise InvalidTopic(f"topic {topic!r} is reserved: topics starting with {RESERVED_PREFIX!r} are livepush's own")
    return topic


def is_signed(topic: str) -> bool:
    return SEP in topic


def _signer(secrets: Sequence[str]) -> Signer:
    # itsdangerous signs with the last key and verifies with any: newest last.
    return Signer(list(reversed(secrets)), salt=_SALT, sep=SEP)


def sign(topic: str, secrets: Sequence[str], ttl: float | None = None, *, now: float | None = None) -> str:
    validate_topic(topic)
    if not secrets:
        raise InvalidTopic("cannot sign a topic without LIVEPUSH_SECRET: set it (32+ random characters)")
    value = topic
    if ttl is not None:
        if isinstance(ttl, bool) or not isinstance(ttl, (int, float)) or not ttl > 0 or ttl == math.inf:
            raise ValueError(f"ttl must be a positive, finite number of seconds (or None: no expiry), got {ttl!r}")
        value = f"{topic}{SEP}{int((time.time() if now is None else now) + ttl)}"
    return _signer(secrets).sign(value).decode("ascii")


def verify(signed: object, secrets: Sequence[str], *, now: float | None = None) -> str:
    """The plain topic inside `signed`, or InvalidTopic with reason invalid_signature/expired."""
    if not isinstance(signed, str) or len(signed) > 400 or SEP not in signed:
        raise InvalidTopic("not a signed topic: expected TOPIC~SIGNATURE from livepush.sign_topic()", "invalid_signature")
    if not secrets:
        raise InvalidTopic("cannot verify signed topics without LIVEPUSH_SECRET", "invalid_signature")
    try:
        value = _signer(secrets).unsign(signed).decode("ascii")
    except (BadSignature, UnicodeError):
        raise InvalidTopic("the signed topic's signature does not match: sign it again with sign_topic()", "invalid_signature") from None
    topic, _, expires = value.partition(SEP)
    if expires:
        if not expires.isdigit():
            raise InvalidTopic("the signed topic is malformed", "invalid_signature")
        if (time.time() if now is None else now) >= int(expires):
            raise InvalidTopic("the signed topic has expired: render the page again to get a fresh one", "expired")
    return validate_topic(topic)
