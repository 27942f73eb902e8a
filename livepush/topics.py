"""Topic names and signed topics (docs/reference.md#5-wire-protocol).

A plain topic matches [A-Za-z0-9_.:/-]{1,200}. A signed topic is the topic, `~`, and an
HMAC-SHA-256 signature (itsdangerous); with a TTL the signed value also carries the expiry
time: `job:42~SIG` or `job:42~1767225600~SIG`. `~` never appears in a plain topic, so a server
tells the two apart by that character alone.

State topics (`job:<id>`, `group:<id>`, `workflow:<id>`) name a row by its canonical decimal
id: `job:0001` or `job:0_1` are not job 1's topic, they are invalid, and so is an id past a bigint.
"""

from __future__ import annotations

import hashlib
import math
import re
import time
from collections.abc import Sequence

from itsdangerous import BadSignature, Signer

from .errors import ArgumentValueError, InvalidTopic
from .postgres.text import BIGINT_MAX
from .types import Seconds, as_seconds, shown

MAX_TOPIC_LENGTH = 200
TOPIC_RE = re.compile(rf"[A-Za-z0-9_.:/-]{{1,{MAX_TOPIC_LENGTH}}}")
RESERVED_PREFIX = "_livepush."
SEP = "~"
_SALT = "livepush.topic"
STATE_PREFIXES = ("job:", "group:", "workflow:")
# The job runtimes' own state, for operators' pages: each runtime's, and every runtime's.
RUNTIME_PREFIX = "runtime:"
RUNTIMES_TOPIC = "runtimes"
# A state topic's id: canonical decimal of at most 19 digits; state_topic_id() also holds it within a
# bigint, which no pattern of this length can say.
STATE_ID_PATTERN = "[1-9][0-9]{0,18}"
_STATE_ID = re.compile(STATE_ID_PATTERN)
# The latest expiry a signed topic carries (the end of the year 9999, UTC): a longer ttl signs
# until then. Its digits keep the longest topic's signed form within what verify() reads.
MAX_EXPIRES = 253402300799
MAX_SIGNED_LENGTH = 400


def validate_topic(topic: object) -> str:
    """Return `topic` if it is a valid plain topic, else raise InvalidTopic."""
    if not isinstance(topic, str) or not TOPIC_RE.fullmatch(topic):
        if isinstance(topic, str) and SEP in topic:
            # A signed topic where a plain one goes (publish(handle.signed_topic, ...)): say which
            # topic is meant, and show no signature, a capability whoever reads the error could use.
            plain = plain_part(topic)
            raise InvalidTopic(
                f"invalid topic {plain[:60]!r}~...: that is a signed topic, which a page subscribes with; "
                f"give the plain topic here, {plain[:60]!r}",
                "invalid_topic",
            )
        raise InvalidTopic(
            f"invalid topic {shown(topic)}: use 1 to 200 characters from A-Z a-z 0-9 _ . : / -",
            "invalid_topic",
        )
    if topic.startswith(RESERVED_PREFIX):
        raise InvalidTopic(f"topic {topic!r} is reserved: topics starting with {RESERVED_PREFIX!r} are livepush's own")
    return topic


def state_topic_id(topic: str) -> int | None:
    """The id in a state topic (`job:42` -> 42); None for any other topic. Raises
    InvalidTopic for a state topic whose id is not canonical decimal."""
    prefix, sep, ident = topic.partition(":")
    if not sep or prefix + sep not in STATE_PREFIXES:
        return None
    if not _STATE_ID.fullmatch(ident):
        raise InvalidTopic(
            f"invalid topic {topic[:60]!r}: a {prefix} topic is {prefix}:<id> with the id in plain decimal "
            "(no sign, leading zero or separator)",
            "invalid_topic",
        )
    # Past a bigint no row has the id: a subscribe would be answered `subscribed` and hear nothing, ever.
    if int(ident) > BIGINT_MAX:
        raise InvalidTopic(f"invalid topic {topic[:60]!r}: a {prefix} topic's id is at most {BIGINT_MAX}",
                           "invalid_topic")
    return int(ident)


def check_state_topic(topic: str) -> None:
    """InvalidTopic unless `topic` is either no state topic or one with a canonical id."""
    state_topic_id(topic)


def is_signed(topic: str) -> bool:
    return SEP in topic


def plain_part(topic: str) -> str:
    """The plain topic `topic` names: itself, or a signed topic's part before its signature, which
    is not verified here (what finds a subscription the connection already holds, or an error)."""
    return topic.split(SEP, 1)[0]


def _signer(secrets: Sequence[str]) -> Signer:
    # itsdangerous signs with the last key and verifies with any: newest last.
    return Signer(list(reversed(secrets)), salt=_SALT, sep=SEP, digest_method=hashlib.sha256)


# What ttl=None means where a topic is signed for a page (a handle's sign(), the frameworks'
# helpers): the default lifetime, not sign()'s no expiry.
PAGE_TTL_DEFAULT = "LIVEPUSH_SIGNED_TOPIC_TTL, the default lifetime"


def check_ttl(ttl: object, *, none_means: str = "no expiry", call: str = "sign_topic()") -> float:
    """`ttl` in seconds if it is a lifetime a signed topic can carry: a positive, finite number of
    seconds or a timedelta of them; else ArgumentValueError naming `call`, the user's call that took
    it. `none_means` is what the caller does with None, which the message names: a user told the
    wrong one would pass None for what it does not do."""
    seconds = as_seconds(ttl)
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not seconds > 0 or seconds == math.inf:
        # The seconds a timedelta was checked as, not its repr: timedelta(seconds=-1) reads
        # timedelta(days=-1, seconds=86399).
        raise ArgumentValueError(f"{call}: ttl must be a positive, finite number of seconds or a timedelta (or None: "
                                 f"{none_means}), got {shown(seconds, width=60)}")
    return seconds


def sign(topic: str, secrets: Sequence[str], ttl: Seconds | None = None, *, now: float | None = None,
         call: str = "sign_topic()") -> str:
    """`topic` signed with the first of `secrets`, valid for `ttl` (None: for ever); a bad ttl is
    refused naming `call`."""
    validate_topic(topic)
    if not secrets:
        raise InvalidTopic("cannot sign a topic without LIVEPUSH_SECRET: set it (32+ random characters)")
    value = topic
    if ttl is not None:
        ttl = check_ttl(ttl, call=call)
        # Rounded up: cut down to the second before, a topic would lose up to a second of its
        # ttl, and one with a ttl under a second could be expired as it is made.
        # A huge ttl (10**100 for "never") wrote an expiry of as many digits, past what verify()
        # reads, or overflowed the float sum: either way no subscribe could use it.
        start = time.time() if now is None else now
        expires = MAX_EXPIRES if ttl >= MAX_EXPIRES else min(math.ceil(start + ttl), MAX_EXPIRES)
        value = f"{topic}{SEP}{expires}"
    return _signer(secrets).sign(value).decode("ascii")


def verify(signed: object, secrets: Sequence[str], *, now: float | None = None) -> str:
    """The plain topic inside `signed`, or InvalidTopic with reason invalid_signature/expired."""
    if not isinstance(signed, str) or len(signed) > MAX_SIGNED_LENGTH or SEP not in signed:
        raise InvalidTopic("not a signed topic: expected TOPIC~SIGNATURE from livepush.sign_topic()", "invalid_signature")
    if not secrets:
        raise InvalidTopic("cannot verify signed topics without LIVEPUSH_SECRET", "invalid_signature")
    try:
        value = _signer(secrets).unsign(signed).decode("ascii")
    except (BadSignature, UnicodeError):
        raise InvalidTopic("the signed topic's signature does not match: sign it again with sign_topic()", "invalid_signature") from None
    topic, _, expires = value.partition(SEP)
    if expires:
        if not (expires.isascii() and expires.isdigit()):
            raise InvalidTopic("the signed topic is malformed", "invalid_signature")
        if (time.time() if now is None else now) >= int(expires):
            raise InvalidTopic("the signed topic has expired: render the page again to get a fresh one", "expired")
    return validate_topic(topic)


def livepush_owned(topic: str) -> str | None:
    """The start of `topic` that names it as livepush's own (a state topic's prefix, a runtime's
    prefix, or the runtimes' topic), or None for an app's topic."""
    if topic == RUNTIMES_TOPIC:
        return topic
    for prefix in (*STATE_PREFIXES, RUNTIME_PREFIX):
        if topic.startswith(prefix):
            return prefix
    return None
