"""Session tokens: an itsdangerous-signed, URL-safe string carrying a random session id, the
subject (who the session belongs to), when it was issued and when it expires.

`decode()` is pure: signature, then shape, then expiry, no I/O. Tokens are credentials: no
message, log line or exception here ever contains one.
"""

from __future__ import annotations

import hashlib
import math
import re
import secrets as _secrets
import time
from collections.abc import Sequence
from dataclasses import dataclass

from itsdangerous import BadData, BadSignature, URLSafeSerializer

from ..config import get_settings
from ..errors import ArgumentTypeError, ArgumentValueError, InvalidSession
from ..postgres.text import unstorable
from ..types import Seconds, as_seconds, shown

MAX_TOKEN_LENGTH = 4096
MAX_SUBJECT_LENGTH = 200
# Sessions live at most this long. It bounds how long a subject revocation must be kept:
# past revoked_at + MAX_TTL no session it covers can still be valid (on a clock in step: see
# revocations.SUBJECT_KEPT), so the row may go.
MAX_TTL = 366 * 86400.0
# now= at most: 9999-12-31T23:59:59Z, the last second Python's datetime can write.
MAX_NOW = 253402300799.0

_SALT = "livepush.session"
_FORMAT = 1  # first element of the payload, so a future format can be told apart
# URL-safe base64 and itsdangerous' "." separator: anything else is not our token.
_TOKEN_RE = re.compile(r"[A-Za-z0-9_.\-]+")


@dataclass(frozen=True)
class Session:
    """A verified session. Times are seconds since the epoch (millisecond precision)."""

    id: str
    subject: str
    expires_at: float
    issued_at: float = 0.0

    def expired(self, now: float | None = None) -> bool:
        return (time.time() if now is None else now) >= self.expires_at


# -- tokens ---------------------------------------------------------------------------


def _serializer(secrets: Sequence[str]) -> URLSafeSerializer:
    # itsdangerous signs with the LAST key and verifies with any: livepush lists the
    # signing secret first (Settings.secrets), so reverse.
    return URLSafeSerializer(
        list(reversed(secrets)), salt=_SALT, signer_kwargs={"digest_method": hashlib.sha256}
    )


def check_subject(subject: object, call: str = "issue()") -> str:
    """`subject` if `call` may take it as a session subject, else ArgumentValueError naming `call`
    (a ValueError for a subject of another type too, as it has always been)."""
    if not isinstance(subject, str):
        raise ArgumentValueError(f"{call} takes the session subject as a str (e.g. str(user.id)), "
                                 f"got {type(subject).__name__}")
    if not subject:
        raise ArgumentValueError(f"{call}: a session subject must not be empty: use the user's id")
    bad = unstorable(subject)
    if bad:  # a revocation stores the subject in Postgres
        raise ArgumentValueError(f"{call}: a session subject must not contain {bad}: use the user's id")
    if len(subject) > MAX_SUBJECT_LENGTH:
        raise ArgumentValueError(
            f"{call}: a session subject is at most {MAX_SUBJECT_LENGTH} characters, got {len(subject)}: "
            "use an id, not a document"
        )
    return subject


def _check_ttl(given: object, call: str) -> float:
    ttl = as_seconds(given)  # a timedelta is checked as its seconds, with the errors a number gets
    if isinstance(ttl, bool) or not isinstance(ttl, (int, float)):
        raise ArgumentValueError(f"{call}(ttl=) takes a number of seconds or a timedelta, got {type(ttl).__name__} "
                                 f"{shown(ttl, width=60)}")
    # Compared, not passed to math.isfinite(): an int past a float's range (10**400) raised a bare
    # OverflowError there.
    if not ttl > 0:  # NaN too
        raise ArgumentValueError(f"{call}(ttl=) must be a positive number of seconds, got {shown(ttl, width=60)}")
    if ttl > MAX_TTL:
        raise ArgumentValueError(f"{call}(ttl=) is at most {int(MAX_TTL)} seconds (366 days), got {shown(ttl, width=60)}: "
                                 "issue a new token instead")
    return float(ttl)


def issue(subject: str, ttl: Seconds = 86400, *, now: float | None = None) -> str:
    """A new session token for `subject`, valid for `ttl` seconds or a timedelta (at most 366 days).

    Signed with LIVEPUSH_SECRET (ConfigError when it is not set). Put it in the
    `__Host-livepush_session` cookie (HttpOnly, Secure, SameSite; `livepush_session` over plain
    HTTP), or hand it to the page's JS client, which sends it in the Sec-WebSocket-Protocol header
    (other clients: the `token` query parameter); what the page passes counts before the cookie.
    """
    return issue_for("issue", subject, ttl, now=now)


def issue_for(call: str, subject: object, ttl: object, *, now: float | None = None) -> str:
    """issue(), for a helper named `call` that takes the subject and ttl from the app: a bad one is
    named as an argument of the call the app wrote, not of issue(), which it never called."""
    subject = check_subject(subject, f"{call}()")
    seconds = _check_ttl(ttl, call)
    _check_now(now, call)
    settings = get_settings()
    settings.require_secret()
    return _encode(subject, seconds, settings.secrets, now=now)


def stamp_ms(now: float | None = None) -> int:
    """`now` (default: the clock) in whole milliseconds, cut down: how a token stamps its issue
    time. A subject revocation's cut-off is stamped the same way, so that only the sessions
    issued in its own millisecond or before count as revoked; rounded, a cut-off late in its
    millisecond would also cover the sessions of the next one."""
    return int((time.time() if now is None else now) * 1000)


def _check_now(now: object, call: str) -> None:
    """`now=`, the clock a test stands in for: None, or a finite number of seconds since the epoch.
    Anything else failed in the token's arithmetic with a bare TypeError or OverflowError."""
    if now is None:
        return
    if isinstance(now, bool) or not isinstance(now, (int, float)):
        raise ArgumentTypeError(f"{call}(now=) takes seconds since the epoch (or None: the clock), "
                                f"got {shown(now, typed=True)}")
    if not 0 <= now <= MAX_NOW:  # NaN too
        raise ArgumentValueError(f"{call}(now=) takes seconds since the epoch, from 0 to {MAX_NOW:.0f} "
                                 f"(or None: the clock), got {shown(now)}")


def _encode(subject: str, ttl: float, secrets: Sequence[str], *, now: float | None = None) -> str:
    start = time.time() if now is None else now
    issued_ms = stamp_ms(start)
    # Rounded up, as a signed topic's expiry: the issue time cut down to its millisecond plus the
    # ttl cut down too lost up to two milliseconds of the ttl, and a ttl under a millisecond made
    # a token that had expired before issue() returned it.
    expires_ms = max(math.ceil((start + ttl) * 1000), issued_ms + 1)
    payload = [_FORMAT, _secrets.token_urlsafe(16), subject, issued_ms, expires_ms]
    return _serializer(secrets).dumps(payload)


def _usable(secrets: Sequence[str] | str | None) -> tuple[str, ...]:
    """The secrets a token may be verified with. An empty one is dropped: an empty key is public,
    and a caller's os.environ.get("LIVEPUSH_SECRET", "") where the variable was missing accepted
    a token anyone had signed with it, as any subject. One that is not a str is the caller's
    mistake: itsdangerous failed on bytes with a bare TypeError about ints."""
    if secrets is None:
        return ()
    if isinstance(secrets, str):
        return (secrets,) if secrets else ()
    if isinstance(secrets, (bytes, bytearray)):
        wrong = type(secrets).__name__
    else:
        try:
            secrets = tuple(secrets)
        except TypeError:
            # The settings themselves (decode(token, get_settings())) or a number: a bare "object is
            # not iterable" from in here named neither the argument nor what it takes.
            secrets, wrong = (), type(secrets).__name__
        else:
            wrong = next((type(s).__name__ for s in secrets if not isinstance(s, str)), "")
    if wrong:
        hint = ": decode bytes first" if wrong in ("bytes", "bytearray") else ""
        raise ArgumentTypeError(f"decode() takes the secrets as str or a list of str (LIVEPUSH_SECRET's text, "
                                f"e.g. get_settings().secrets), got {wrong}{hint}")
    return tuple(s for s in secrets if s)


def loads(token: object, secrets: Sequence[str] | str) -> Session:
    """The session inside `token`, signature and shape checked, expiry NOT checked."""
    secrets = _usable(secrets)
    # Cheap refusals first, before any parsing: a 100 KB cookie or a non-ASCII value is
    # not ours and must cost nothing.
    if not isinstance(token, str) or not token:
        raise InvalidSession("the session token is empty or not a string", "malformed")
    if len(token) > MAX_TOKEN_LENGTH:
        raise InvalidSession(f"the session token is over {MAX_TOKEN_LENGTH} characters", "malformed")
    if not token.isascii() or not _TOKEN_RE.fullmatch(token):
        raise InvalidSession("the session token has characters a livepush token never has", "malformed")
    if not secrets:
        raise InvalidSession("cannot verify session tokens without LIVEPUSH_SECRET: set it", "bad_signature")
    try:
        payload = _serializer(secrets).loads(token)
    except BadSignature:
        raise InvalidSession(
            "the session token's signature does not match LIVEPUSH_SECRET or any LIVEPUSH_SECRET_FALLBACKS",
            "bad_signature",
        ) from None
    except (BadData, ValueError, UnicodeError):  # signed by us but undecodable: cannot happen unless forged
        raise InvalidSession("the session token's content is unreadable", "malformed") from None
    if not (
        isinstance(payload, list)
        and len(payload) == 5
        and payload[0] == _FORMAT
        and isinstance(payload[1], str)
        and isinstance(payload[2], str)
        and 0 < len(payload[2]) <= MAX_SUBJECT_LENGTH
        and all(isinstance(v, int) and not isinstance(v, bool) for v in payload[3:5])
    ):
        raise InvalidSession("the session token's content has an unknown shape", "malformed")
    _, sid, subject, issued_ms, expires_ms = payload
    return Session(id=sid, subject=subject, expires_at=expires_ms / 1000, issued_at=issued_ms / 1000)


def decode(token: object, secrets: Sequence[str] | str, *, now: float | None = None) -> Session:
    """The session inside `token`, or InvalidSession with `.reason` in
    ``malformed | bad_signature | expired``.

    Pure: no I/O, no logging. `secrets` is ordered like `Settings.secrets`: the signing
    secret first, then fallbacks; any of them verifies. Revocation is not checked here
    (see `RevocationStore`).
    """
    session = loads(token, secrets)
    if session.expired(now):
        raise InvalidSession("the session token has expired: sign in again to get a fresh one", "expired")
    return session


