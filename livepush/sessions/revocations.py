"""Where revocations are kept (Postgres, Redis, or one process's memory), and the pure rule
that tells whether an announcement revokes a session."""

from __future__ import annotations

import abc
import math
import asyncio
import time
from collections.abc import Iterable
from typing import Any
from urllib.parse import urlsplit

from ..config import Settings, get_settings
from ..errors import DependencyError
from ..postgres import connect as db
from .tokens import MAX_TTL, Session

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


