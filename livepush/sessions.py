"""Session tokens and their revocation (SPEC §4, §5).

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

import abc
import asyncio
import hashlib
import logging
import math
import re
import secrets as _secrets
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from itsdangerous import BadData, BadSignature, URLSafeSerializer

from . import db
from .config import Settings, get_settings
from .errors import DependencyError, InvalidSession

log = logging.getLogger("livepush.sessions")

REVOCATIONS_TOPIC = "_livepush.revocations"
MAX_TOKEN_LENGTH = 4096
MAX_SUBJECT_LENGTH = 200
# Sessions live at most this long. It bounds how long a subject revocation must be kept:
# past revoked_at + MAX_TTL no session it covers can still be valid, so the row may go.
MAX_TTL = 366 * 86400.0

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


def _check_subject(subject: object) -> str:
    if not isinstance(subject, str):
        raise ValueError(f"a session subject must be a string (e.g. a user id), got {type(subject).__name__}")
    if not subject:
        raise ValueError("a session subject must not be empty: use the user's id")
    bad = db.unstorable(subject)
    if bad:  # a revocation stores the subject in Postgres
        raise ValueError(f"a session subject must not contain {bad}: use the user's id")
    if len(subject) > MAX_SUBJECT_LENGTH:
        raise ValueError(
            f"a session subject is at most {MAX_SUBJECT_LENGTH} characters, got {len(subject)}: use an id, not a document"
        )
    return subject


def _check_ttl(ttl: object) -> float:
    if isinstance(ttl, bool) or not isinstance(ttl, (int, float)) or not math.isfinite(ttl) or ttl <= 0:
        raise ValueError(f"ttl must be a positive number of seconds, got {ttl!r}")
    if ttl > MAX_TTL:
        raise ValueError(f"ttl is at most {int(MAX_TTL)} seconds (366 days), got {ttl!r}: issue a new token instead")
    return float(ttl)


def issue(subject: str, ttl: float = 86400, *, now: float | None = None) -> str:
    """A new session token for `subject`, valid for `ttl` seconds (at most 366 days).

    Signed with LIVEPUSH_SECRET (ConfigError when it is not set). Put it in the
    `livepush_session` cookie (preferred: HttpOnly, Secure, SameSite) or pass it as the
    `token` query parameter.
    """
    _check_subject(subject)
    ttl = _check_ttl(ttl)
    settings = get_settings()
    settings.require_secret()
    return _encode(subject, ttl, settings.secrets, now=now)


def _encode(subject: str, ttl: float, secrets: Sequence[str], *, now: float | None = None) -> str:
    issued_ms = int((time.time() if now is None else now) * 1000)
    payload = [_FORMAT, _secrets.token_urlsafe(16), subject, issued_ms, issued_ms + int(ttl * 1000)]
    return _serializer(secrets).dumps(payload)


def _loads(token: object, secrets: Sequence[str] | str) -> Session:
    """The session inside `token`, signature and shape checked, expiry NOT checked."""
    # Cheap refusals first, before any parsing: a 100 KB cookie or a non-ASCII value is
    # not ours and must cost nothing.
    if not isinstance(token, str) or not token:
        raise InvalidSession("the session token is empty or not a string", "malformed")
    if len(token) > MAX_TOKEN_LENGTH:
        raise InvalidSession(f"the session token is over {MAX_TOKEN_LENGTH} characters", "malformed")
    if not token.isascii() or not _TOKEN_RE.fullmatch(token):
        raise InvalidSession("the session token has characters a livepush token never has", "malformed")
    if isinstance(secrets, str):
        secrets = (secrets,)
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
    session = _loads(token, secrets)
    if session.expired(now):
        raise InvalidSession("the session token has expired: sign in again to get a fresh one", "expired")
    return session


# -- revocation, pure part ------------------------------------------------------------


def _ms(seconds: float) -> int:
    return int(round(seconds * 1000))


def revocation_matches(data: object, session: Session) -> bool:
    """True when a message on `_livepush.revocations` revokes `session`.

    `{"session": id}` revokes that one session; `{"subject": s, "before": t}` revokes
    every session of subject `s` issued at or before `t` (seconds since the epoch).
    Anything else matches nothing.
    """
    if not isinstance(data, dict):
        return False
    sid = data.get("session")
    if isinstance(sid, str):
        return sid == session.id
    subject, before = data.get("subject"), data.get("before")
    if (
        isinstance(subject, str)
        and isinstance(before, (int, float))
        and not isinstance(before, bool)
        and math.isfinite(before)
    ):
        return subject == session.subject and _ms(session.issued_at) <= _ms(before)
    return False


# -- revocation stores ----------------------------------------------------------------


class RevocationStore(abc.ABC):
    """Where revocations are kept. Servers read it; `revoke*` write it.

    A session is revoked when its id was revoked, or when its subject was revoked at or
    after the moment it was issued. Writes come in a sync and an async flavour because
    `revoke()` is called from sync web code and `arevoke()` from async code.
    """

    async def is_revoked(self, session: Session) -> bool:
        return bool(await self.revoked_among([session]))

    @abc.abstractmethod
    async def revoked_among(self, sessions: Iterable[Session]) -> set[str]:
        """The ids of the revoked sessions among `sessions`, in one round trip."""

    @abc.abstractmethod
    def add_session(self, session_id: str, expires_at: float) -> None: ...

    @abc.abstractmethod
    async def aadd_session(self, session_id: str, expires_at: float) -> None: ...

    @abc.abstractmethod
    def add_subject(self, subject: str, before: float) -> None: ...

    @abc.abstractmethod
    async def aadd_subject(self, subject: str, before: float) -> None: ...

    async def prune(self) -> int:
        """Forget revocations that can no longer matter (their sessions expired)."""
        return 0

    async def aclose(self) -> None:
        """Release async resources (servers call this at shutdown)."""

    def close(self) -> None:
        """Release sync resources."""


class MemoryRevocations(RevocationStore):
    """One process's revocations, in memory: for the local fan-out, the demo and tests."""

    def __init__(self) -> None:
        self._sessions: dict[str, int] = {}  # session id -> expires (ms)
        self._subjects: dict[str, int] = {}  # subject -> revoked at (ms)

    def clear(self) -> None:
        self._sessions.clear()
        self._subjects.clear()

    async def revoked_among(self, sessions: Iterable[Session]) -> set[str]:
        found = set()
        for s in sessions:
            before = self._subjects.get(s.subject)
            if s.id in self._sessions or (before is not None and _ms(s.issued_at) <= before):
                found.add(s.id)
        return found

    def add_session(self, session_id: str, expires_at: float) -> None:
        self._prune_now()
        self._sessions[session_id] = max(self._sessions.get(session_id, 0), _ms(expires_at))

    async def aadd_session(self, session_id: str, expires_at: float) -> None:
        self.add_session(session_id, expires_at)

    def add_subject(self, subject: str, before: float) -> None:
        self._prune_now()
        self._subjects[subject] = max(self._subjects.get(subject, 0), _ms(before))

    async def aadd_subject(self, subject: str, before: float) -> None:
        self.add_subject(subject, before)

    async def prune(self) -> int:
        return self._prune_now()

    def _prune_now(self) -> int:
        now = _ms(time.time())
        gone = [k for k, exp in self._sessions.items() if exp <= now]
        gone_subjects = [k for k, at in self._subjects.items() if at + _ms(MAX_TTL) <= now]
        for k in gone:
            del self._sessions[k]
        for k in gone_subjects:
            del self._subjects[k]
        return len(gone) + len(gone_subjects)


# name: add_session -- an upsert: revoking the same session twice (or from two processes
# at once) leaves one row, with the later expiry.
_PG_ADD_SESSION = """
INSERT INTO livepush_revoked_sessions (session_id, expires_at)
VALUES (%s, to_timestamp(%s))
ON CONFLICT (session_id) DO UPDATE
SET expires_at = greatest(livepush_revoked_sessions.expires_at, excluded.expires_at)
"""

# name: add_subject -- greatest() makes concurrent revocations of one subject commit in
# any order and still keep the latest cut-off (a later revocation covers more sessions).
_PG_ADD_SUBJECT = """
INSERT INTO livepush_revoked_subjects (subject, revoked_at, expires_at)
VALUES (%s, to_timestamp(%s), to_timestamp(%s))
ON CONFLICT (subject) DO UPDATE
SET revoked_at = greatest(livepush_revoked_subjects.revoked_at, excluded.revoked_at),
    expires_at = greatest(livepush_revoked_subjects.expires_at, excluded.expires_at)
"""

# name: revoked_among -- read-only; one statement for a whole batch of sessions. A
# revocation committed after this snapshot is caught by the fan-out message or the next check.
_PG_REVOKED_AMONG = """
SELECT q.id
FROM unnest(%s::text[], %s::text[], %s::float8[]) AS q(id, subject, issued_at)
WHERE EXISTS (SELECT 1 FROM livepush_revoked_sessions r WHERE r.session_id = q.id)
   OR EXISTS (SELECT 1 FROM livepush_revoked_subjects s
              WHERE s.subject = q.subject AND to_timestamp(q.issued_at) <= s.revoked_at)
"""

# name: prune -- bounded batches; SKIP LOCKED lets two servers prune at once without
# waiting on each other, and a row being re-revoked right now is simply left for later.
_PG_PRUNE = """
WITH s AS (
    DELETE FROM livepush_revoked_sessions WHERE session_id IN (
        SELECT session_id FROM livepush_revoked_sessions
        WHERE expires_at < now() LIMIT %(limit)s FOR UPDATE SKIP LOCKED)
    RETURNING 1
), u AS (
    DELETE FROM livepush_revoked_subjects WHERE subject IN (
        SELECT subject FROM livepush_revoked_subjects
        WHERE expires_at < now() LIMIT %(limit)s FOR UPDATE SKIP LOCKED)
    RETURNING 1
)
SELECT (SELECT count(*) FROM s) + (SELECT count(*) FROM u)
"""

_PRUNE_BATCH = 1000


class PostgresRevocations(RevocationStore):
    """Revocations in Postgres (`sql/0002_sessions.sql`), shared by every server.

    Reads go through a small async pool opened on first use; sync writes (from web
    code calling `revoke()`) use a short-lived connection each, since they are rare.
    """

    def __init__(self, url: str, *, max_connections: int = 4) -> None:
        self.url = url
        self._max = max_connections
        self._pool: Any = None
        self._pool_lock = asyncio.Lock()

    async def _get_pool(self) -> Any:
        async with self._pool_lock:
            if self._pool is None:
                # One direct attempt first: a refused connection fails at once with our
                # error, where the pool would retry in the background until its timeout.
                probe = await db.aconnect(self.url)
                await probe.close()
                pool = db.AsyncPool(
                    self.url,
                    min_size=1,
                    max_size=self._max,
                    open=False,
                    timeout=5,
                    kwargs={"autocommit": True, "connect_timeout": 5},
                    name="livepush-revocations",
                )
                try:
                    await pool.open(wait=True, timeout=5)
                except Exception as exc:
                    await pool.close()
                    raise db.unreachable(self.url, exc) from exc
                self._pool = pool
            return self._pool

    async def _execute(self, sql: str, params: Any, *, fetch: bool = False) -> list[tuple[Any, ...]]:
        import psycopg
        from psycopg_pool import PoolTimeout

        pool = await self._get_pool()
        try:
            async with pool.connection() as conn:
                cur = await conn.execute(sql, params)
                return await cur.fetchall() if fetch else []
        except (psycopg.OperationalError, PoolTimeout) as exc:
            raise db.unreachable(self.url, exc) from exc

    def _execute_sync(self, sql: str, params: Any) -> None:
        import psycopg

        try:
            with db.connect(self.url) as conn:
                conn.execute(sql, params)
                # Every write also drops a bounded batch of dead rows, so the tables stay
                # small without a separate maintenance job.
                conn.execute(_PG_PRUNE, {"limit": _PRUNE_BATCH})
        except psycopg.OperationalError as exc:
            raise db.unreachable(self.url, exc) from exc

    async def revoked_among(self, sessions: Iterable[Session]) -> set[str]:
        batch = list(sessions)
        if not batch:
            return set()
        rows = await self._execute(
            _PG_REVOKED_AMONG,
            ([s.id for s in batch], [s.subject for s in batch], [_ms(s.issued_at) / 1000 for s in batch]),
            fetch=True,
        )
        return {row[0] for row in rows}

    def add_session(self, session_id: str, expires_at: float) -> None:
        self._execute_sync(_PG_ADD_SESSION, (session_id, _ms(expires_at) / 1000))

    async def aadd_session(self, session_id: str, expires_at: float) -> None:
        await self._execute(_PG_ADD_SESSION, (session_id, _ms(expires_at) / 1000))
        await self.prune()

    def add_subject(self, subject: str, before: float) -> None:
        self._execute_sync(_PG_ADD_SUBJECT, (subject, _ms(before) / 1000, _ms(before + MAX_TTL) / 1000))

    async def aadd_subject(self, subject: str, before: float) -> None:
        await self._execute(_PG_ADD_SUBJECT, (subject, _ms(before) / 1000, _ms(before + MAX_TTL) / 1000))
        await self.prune()

    async def prune(self) -> int:
        rows = await self._execute(_PG_PRUNE, {"limit": _PRUNE_BATCH}, fetch=True)
        return int(rows[0][0]) if rows else 0

    async def aclose(self) -> None:
        pool, self._pool = self._pool, None
        if pool is not None:
            await pool.close()


# Keep the cut-off only if it is later than the one stored: revocations from two
# processes may arrive in any order. Atomic, since Redis runs a script as one command.
_REDIS_ADD_SUBJECT = """
local cur = tonumber(redis.call('GET', KEYS[1]))
if cur == nil or cur < tonumber(ARGV[1]) then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
end
return 1
"""

_REDIS_CHUNK = 1000


def _redact_redis(url: str) -> str:
    try:
        parts = urlsplit(url)
        return f"{parts.hostname or 'localhost'}:{parts.port or 6379}{parts.path or ''}"
    except ValueError:
        return "(unparseable URL)"


class RedisRevocations(RevocationStore):
    """Revocations in Redis, for a deployment with Redis and no database.

    A revoked session is a key that expires with the session; a revoked subject is a key
    holding the cut-off time (ms), kept for MAX_TTL since no covered session outlives it.
    """

    SESSION_PREFIX = "livepush:revoked:session:"
    SUBJECT_PREFIX = "livepush:revoked:subject:"

    def __init__(self, url: str) -> None:
        self.url = url
        self._client: Any = None

    def _unreachable(self, exc: BaseException) -> DependencyError:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        return DependencyError(
            f"cannot reach Redis at {_redact_redis(self.url)} ({first}): check LIVEPUSH_REDIS_URL and that the server is running"
        )

    def _aclient(self) -> Any:
        import redis.asyncio

        if self._client is None:
            self._client = redis.asyncio.Redis.from_url(self.url, socket_connect_timeout=5, socket_timeout=5, protocol=2)
        return self._client

    async def revoked_among(self, sessions: Iterable[Session]) -> set[str]:
        import redis

        batch = list(sessions)
        if not batch:
            return set()
        subjects = sorted({s.subject for s in batch})
        keys = [self.SESSION_PREFIX + s.id for s in batch] + [self.SUBJECT_PREFIX + s for s in subjects]
        try:
            pipe = self._aclient().pipeline(transaction=False)
            for i in range(0, len(keys), _REDIS_CHUNK):
                pipe.mget(keys[i : i + _REDIS_CHUNK])
            values = [v for chunk in await pipe.execute() for v in chunk]
        except redis.RedisError as exc:
            raise self._unreachable(exc) from exc
        session_hits = values[: len(batch)]
        cutoffs = {
            subject: int(v) for subject, v in zip(subjects, values[len(batch) :], strict=True) if v is not None
        }
        found = set()
        for s, hit in zip(batch, session_hits, strict=True):
            cutoff = cutoffs.get(s.subject)
            if hit is not None or (cutoff is not None and _ms(s.issued_at) <= cutoff):
                found.add(s.id)
        return found

    @staticmethod
    def _session_ttl_ms(expires_at: float) -> int:
        return _ms(expires_at) - _ms(time.time())

    def add_session(self, session_id: str, expires_at: float) -> None:
        import redis

        ttl = self._session_ttl_ms(expires_at)
        if ttl <= 0:
            return  # already expired: decode() refuses it anyway
        try:
            with redis.Redis.from_url(self.url, socket_connect_timeout=5, socket_timeout=5, protocol=2) as client:
                client.set(self.SESSION_PREFIX + session_id, b"1", px=ttl)
        except redis.RedisError as exc:
            raise self._unreachable(exc) from exc

    async def aadd_session(self, session_id: str, expires_at: float) -> None:
        import redis

        ttl = self._session_ttl_ms(expires_at)
        if ttl <= 0:
            return
        try:
            await self._aclient().set(self.SESSION_PREFIX + session_id, b"1", px=ttl)
        except redis.RedisError as exc:
            raise self._unreachable(exc) from exc

    def add_subject(self, subject: str, before: float) -> None:
        import redis

        try:
            with redis.Redis.from_url(self.url, socket_connect_timeout=5, socket_timeout=5, protocol=2) as client:
                client.eval(_REDIS_ADD_SUBJECT, 1, self.SUBJECT_PREFIX + subject, _ms(before), _ms(MAX_TTL))
        except redis.RedisError as exc:
            raise self._unreachable(exc) from exc

    async def aadd_subject(self, subject: str, before: float) -> None:
        import redis

        try:
            await self._aclient().eval(_REDIS_ADD_SUBJECT, 1, self.SUBJECT_PREFIX + subject, _ms(before), _ms(MAX_TTL))
        except redis.RedisError as exc:
            raise self._unreachable(exc) from exc

    async def aclose(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            await client.aclose()


# One in-memory store per process, so revoke() and a server in the same process agree.
MEMORY = MemoryRevocations()


def store_from_settings(settings: Settings) -> RevocationStore:
    """Postgres when a database URL is set, else Redis when a Redis URL is set, else the
    process's in-memory store (local fan-out, demo, tests)."""
    if settings.database_url:
        return PostgresRevocations(settings.database_url)
    if settings.redis_url:
        return RedisRevocations(settings.redis_url)
    return MEMORY


_default: RevocationStore | None = None


def default_store() -> RevocationStore:
    """The process-wide store `revoke*` write to, created from the settings on first use."""
    global _default
    if _default is None:
        _default = store_from_settings(get_settings())
    return _default


def set_default_store(store: RevocationStore | None) -> None:
    """Install the store `revoke*` use (tests; a server sharing its own). None: re-read settings."""
    global _default
    _default = store


# -- revoking -------------------------------------------------------------------------


def _session_of(token: str | Session) -> Session:
    if isinstance(token, Session):
        return token
    # Expired tokens are still revoked (their connections may be open until the next
    # re-check), but a bad signature is the caller's mistake: InvalidSession.
    return _loads(token, get_settings().secrets)


def _announce(data: dict[str, Any]) -> None:
    from .api import default_fanout

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
    from .api import default_fanout

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
