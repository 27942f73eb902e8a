"""Sessions: tokens, their revocation, the handshake's checks and the topic rules (SPEC §4, §5).

A session token is an itsdangerous-signed, URL-safe string carrying a random session id,
the subject (who the session belongs to), when it was issued and when it expires:

    token = livepush.sessions.issue("user-7", ttl=86400)   # cookie value or ?token=
    livepush.sessions.revoke(token)                        # that session, everywhere
    livepush.sessions.revoke_subject("user-7")             # every session issued to user-7 so far

`decode()` is pure: signature, then shape, then expiry, no I/O. Whether a session was
revoked is a question for a `RevocationStore` (Postgres, Redis, or memory), which servers
ask at the handshake and, in batches, every `reverify_interval`. A revocation is stored
first (so new handshakes are refused), then announced on the reserved fan-out topic
`_livepush.revocations` so every server closes the matching open connections at once;
`revocation_matches()` is how a server reads that announcement.

Tokens are credentials: no message, log line or exception here ever contains one.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from .revocations import (
    MEMORY,
    MemoryRevocations,
    PostgresRevocations,
    RedisRevocations,
    RevocationStore,
    _ms,
    default_store,
    revocation_matches,
    set_default_store,
    store_from_settings,
)
from .tokens import MAX_TOKEN_LENGTH, MAX_TTL, Session, _check_subject, _loads, decode, issue
from ..config import get_settings

log = logging.getLogger("livepush.sessions")

REVOCATIONS_TOPIC = "_livepush.revocations"


# -- revoking -------------------------------------------------------------------------


def _session_of(token: str | Session) -> Session:
    if isinstance(token, Session):
        return token
    # Expired tokens are still revoked (their connections may be open until the next
    # re-check), but a bad signature is the caller's mistake: InvalidSession.
    return _loads(token, get_settings().secrets)


def _announce(data: dict[str, Any]) -> None:
    from ..api import default_fanout

    try:
        default_fanout().publish(REVOCATIONS_TOPIC, data)
    except Exception as exc:  # stored already: servers still catch it at their next re-check
        log.warning(
            "revocation stored, but announcing it on the fan-out failed (%s: %s); open connections "
            "will be closed at the servers' next re-check (reverify_interval)",
            type(exc).__name__,
            exc,
        )


async def _aannounce(data: dict[str, Any]) -> None:
    from ..api import default_fanout

    try:
        await default_fanout().apublish(REVOCATIONS_TOPIC, data)
    except Exception as exc:
        log.warning(
            "revocation stored, but announcing it on the fan-out failed (%s: %s); open connections "
            "will be closed at the servers' next re-check (reverify_interval)",
            type(exc).__name__,
            exc,
        )


def revoke(token: str | Session, *, store: RevocationStore | None = None) -> Session:
    """Revoke one session (a token or a Session): new handshakes with it are refused
    and every server closes its open connections with 4403. Returns the session.

    Raises InvalidSession when `token` is not a token signed with our secrets, and
    DependencyError when the store cannot be reached (nothing was revoked then).
    """
    session = _session_of(token)
    (store or default_store()).add_session(session.id, session.expires_at)
    _announce({"session": session.id})
    return session


async def arevoke(token: str | Session, *, store: RevocationStore | None = None) -> Session:
    """Async revoke()."""
    session = _session_of(token)
    await (store or default_store()).aadd_session(session.id, session.expires_at)
    await _aannounce({"session": session.id})
    return session


def revoke_subject(subject: str, *, store: RevocationStore | None = None, now: float | None = None) -> float:
    """Revoke every session of `subject` issued up to now ("sign out everywhere");
    sessions issued afterwards are unaffected. Returns the cut-off time."""
    _check_subject(subject)
    before = _ms(time.time() if now is None else now) / 1000
    (store or default_store()).add_subject(subject, before)
    _announce({"subject": subject, "before": before})
    return before


async def arevoke_subject(subject: str, *, store: RevocationStore | None = None, now: float | None = None) -> float:
    """Async revoke_subject()."""
    _check_subject(subject)
    before = _ms(time.time() if now is None else now) / 1000
    await (store or default_store()).aadd_subject(subject, before)
    await _aannounce({"subject": subject, "before": before})
    return before


__all__ = [
    "MAX_TOKEN_LENGTH",
    "MAX_TTL",
    "MEMORY",
    "REVOCATIONS_TOPIC",
    "MemoryRevocations",
    "PostgresRevocations",
    "RedisRevocations",
    "RevocationStore",
    "Session",
    "arevoke",
    "arevoke_subject",
    "decode",
    "default_store",
    "issue",
    "revocation_matches",
    "revoke",
    "revoke_subject",
    "set_default_store",
    "store_from_settings",
]
