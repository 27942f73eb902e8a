"""Sessions: who is connecting, and what they may hear (docs/reference.md#4-python-api).

    token = livepush.sessions.issue("user-7", ttl=86400)   # cookie value, subprotocol or ?token=
    livepush.sessions.revoke(token)                        # that session, everywhere
    livepush.sessions.revoke_subject("user-7")             # every session issued to user-7 so far

The parts: `tokens` (the signed token and `decode()`), `revocations` (where revocations are kept
and how servers hear of them), `handshake` (the server's checks at connect time) and `rules`
(which plain topics a session may subscribe to). A revocation is stored first, so new
handshakes are refused; its store then rings every server, which re-checks its open sessions
against the store and closes the revoked ones with 4403.

Tokens are credentials: no message, log line or exception here ever contains one.
"""

from __future__ import annotations

import asyncio
import os
import threading
import time

from ..blocking import warn_if_on_event_loop
from ..config import get_settings
from ..errors import ArgumentTypeError, ConfigError
from .revocations import (
    CLOCK_ALLOWANCE,
    MEMORY,
    MemoryRevocations,
    PostgresRevocations,
    RedisRevocations,
    RevocationStore,
    store_from_settings,
)
from .tokens import MAX_TOKEN_LENGTH, MAX_TTL, Session, check_subject, decode, issue, loads, stamp_ms

_default: RevocationStore | None = None
# revoke() may be called from any thread: two first calls at once made a store each, and the one
# overwritten kept its pool's connections open, unclosed, for the life of the process.
_default_lock = threading.Lock()


def _new_lock_after_fork() -> None:
    # A thread of the parent may have held the lock at the fork: the child's first revoke() would
    # wait for it for ever.
    global _default_lock
    _default_lock = threading.Lock()


os.register_at_fork(after_in_child=_new_lock_after_fork)


def default_store() -> RevocationStore:
    """The store `revoke*` write to, created from this process's settings on first use."""
    global _default
    store = _default
    if store is None:
        with _default_lock:
            if _default is None:
                _default = store_from_settings(get_settings())
            store = _default
    return store


def set_default_store(store: RevocationStore | None) -> None:
    """Install the store `revoke*` use (tests; a web process with its own). None: from the settings."""
    _check_store(store, "set_default_store()")
    global _default
    with _default_lock:
        old, _default = _default, store
    if old is not None and old is not store:
        old.close()


def _check_store(store: object, call: str) -> None:
    # A URL or a store's name where the store goes failed later, inside livepush, with an
    # AttributeError that named neither the argument nor what it takes.
    if store is not None and not isinstance(store, RevocationStore):
        raise ArgumentTypeError(f"{call} takes a RevocationStore (e.g. PostgresRevocations(url) or "
                                f"RedisRevocations(url)), or None for the one the settings name, got "
                                f"{type(store).__name__}")


def _shared(store: RevocationStore | None, call: str) -> RevocationStore:
    _check_store(store, f"{call}(store=)")
    chosen = store or default_store()
    if not chosen.shared:
        raise ConfigError(
            "revocation needs a shared store, and this process has neither a database nor Redis: set "
            "LIVEPUSH_DATABASE_URL (or LIVEPUSH_REDIS_URL) to the one the servers use"
        )
    return chosen


def _session_of(token: str | Session, call: str) -> Session:
    if isinstance(token, Session):
        return token
    if token is not None and not isinstance(token, str):
        # Said as InvalidSession ("not a token of ours"), sign-out code skipped it as a stale
        # cookie, though the same token as text is one every server accepts: the session stayed open.
        raise ArgumentTypeError(_not_a_token(token, call))
    # Expired tokens are still revoked (their connections may be open until the next re-check),
    # but a bad signature is the caller's mistake: InvalidSession.
    settings = get_settings()
    # Without a secret no token verifies. Said as InvalidSession, it read as "not a token of ours",
    # which sign-out code skips as a stale cookie: the session stayed open, and nothing said why.
    settings.require_secret()
    return loads(token, settings.secrets)


def _not_a_token(value: object, call: str) -> str:
    kind = type(value).__name__
    if isinstance(value, (bytes, bytearray, memoryview)):
        return f"{call} takes the session token as a str, got {kind}: decode it first (token.decode('ascii'))"
    return (f"{call} takes a session token (a str) or a Session, got {kind}: to revoke every session of a "
            "subject (a user id), call revoke_subject(str(user_id))")


def revoke(token: str | Session, *, store: RevocationStore | None = None) -> Session:
    """Revoke one session (a token or a Session): new handshakes with it are refused and every
    server closes its open connections with 4403. Returns the session.

    Raises InvalidSession when `token` is not a token signed with our secrets (None too: no
    cookie, nothing to revoke), ArgumentTypeError when it is neither a str nor a Session (bytes
    among them: decode them first) or when `store` is no RevocationStore, ConfigError when
    this process has no shared store or no LIVEPUSH_SECRET, and DependencyError when the store
    cannot be reached, or a lock on its table holds the write past READ_TIMEOUT (nothing was
    revoked then)."""
    warn_if_on_event_loop("livepush.sessions.revoke()", "livepush.sessions.arevoke()")
    chosen = _shared(store, "revoke")
    session = _session_of(token, "revoke()")
    chosen.add_session(session.id, session.expires_at + CLOCK_ALLOWANCE)
    return session


async def arevoke(token: str | Session, *, store: RevocationStore | None = None) -> Session:
    """Async revoke()."""
    chosen = _shared(store, "arevoke")
    session = _session_of(token, "arevoke()")
    await chosen.aadd_session(session.id, session.expires_at + CLOCK_ALLOWANCE)
    return session


# A subject revocation covers the sessions issued in its own millisecond too: returning within
# it, revoke_subject() let a session issued at once afterwards ("sign out everywhere", then this
# device back in, in one request) count as revoked. It returns once the clock has left it.
_TICK = 0.0002


def _within(cutoff_ms: int) -> bool:
    """Whether a session issued now would fall in the cut-off's millisecond. False too for a
    cut-off further ahead (a `now=` given ahead, a clock stepped back): no wait is unbounded."""
    return 0 <= cutoff_ms - stamp_ms() < 2


def revoke_subject(subject: str, *, store: RevocationStore | None = None, now: float | None = None) -> float:
    """Revoke every session of `subject` issued up to now ("sign out everywhere"); sessions
    issued afterwards (once this returns) are unaffected. Returns the cut-off time."""
    warn_if_on_event_loop("livepush.sessions.revoke_subject()", "livepush.sessions.arevoke_subject()")
    check_subject(subject, "revoke_subject()")  # the caller's mistake first, whatever the store
    chosen = _shared(store, "revoke_subject")
    cutoff_ms = stamp_ms(now)
    chosen.add_subject(subject, cutoff_ms / 1000)
    while _within(cutoff_ms):
        time.sleep(_TICK)
    return cutoff_ms / 1000


async def arevoke_subject(subject: str, *, store: RevocationStore | None = None, now: float | None = None) -> float:
    """Async revoke_subject()."""
    check_subject(subject, "arevoke_subject()")
    chosen = _shared(store, "arevoke_subject")
    cutoff_ms = stamp_ms(now)
    await chosen.aadd_subject(subject, cutoff_ms / 1000)
    while _within(cutoff_ms):
        await asyncio.sleep(_TICK)
    return cutoff_ms / 1000


# What the docs describe (docs/reference.md, docs/security.md). The revocation stores, their
# constants and default_store()/set_default_store() stay importable for livepush's own modules
# and tests, but are its plumbing, not API: they are not exported.
__all__ = [
    "CLOCK_ALLOWANCE",
    "Session",
    "arevoke",
    "arevoke_subject",
    "decode",
    "issue",
    "revoke",
    "revoke_subject",
]
