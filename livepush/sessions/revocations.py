"""Where revocations are kept: Postgres, Redis, or one process's memory.

A session is revoked when its id was revoked, or when its subject was revoked at or after the
moment it was issued. Servers ask the store at the handshake and, in batches, every
`reverify_interval`. Each revocation also rings the store's doorbell (`watch()`): every server
then re-checks its open sessions against the store at once. The ring carries nothing: a forged
one costs a check and closes nothing, since only what the store holds revokes. In Postgres and
in Redis a server's readiness check may ring the doorbell too, with "canary TOKEN"
(`ring_canary`), where no other ring shows that the store's listener hears: that ring re-checks
nothing.

Writes come in a sync and an async flavour because `revoke()` is called from sync web code and
`arevoke()` from async code.
"""

from __future__ import annotations

import abc
import contextlib
import logging
import re
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import psycopg

from ..config import Settings
from ..errors import DependencyError, ListenError
from ..postgres.connect import translated
from ..postgres.urls import redact
from ..channels import ListenerSlot
from ..postgres.listener import Listener
from ..postgres.pools import LoopPools
from ..redis.client import (LoopClients, answered_at_start, async_client, client_kwargs, deployment_prefix, failed,
                            known_script, listener_name, namespace, own_url)
from ..redis.subscriber import Subscriber
from .tokens import MAX_TTL, Session

log = logging.getLogger("livepush.sessions.revocations")

OnRevoked = Callable[[], None]
OnCanary = Callable[[str], None]

# How long a read of the store may take where a request waits on it (a server's handshake and
# re-checks, a web app's session check) before it counts as failed: a read that blocks (a
# migration holding a revocation table's lock, a frozen connection) held each of them until the
# lock went, where a failure is answered as temporary (HTTP 503) and tried again.
READ_TIMEOUT = 5.0


# How much longer than the session it revokes a revocation is kept. Each server checks a token's
# expiry on its own clock, while the store forgets the revocation on its own (Postgres' now(), or
# Redis counting down a TTL worked out on this host's clock): without this, a server whose clock
# lags the store's by a minute let a revoked token back in for that minute, and one whose clock
# lags this host's found nothing stored at all for a token this host saw as just expired. A
# subject revocation is kept as much longer than the longest session it covers, for the same reason.
CLOCK_ALLOWANCE = 300.0
# How long a subject revocation is kept past its cut-off: the longest a session it covers can live
# (issued at the cut-off with the longest ttl), plus the allowance for the clocks that check it.
SUBJECT_KEPT = MAX_TTL + CLOCK_ALLOWANCE


def ms(seconds: float) -> int:
    return int(round(seconds * 1000))


class RevocationStore(abc.ABC):
    """Where revocations are kept. Servers read it and watch it; `revoke*` write it."""

    # Whether other processes see this store's revocations (the memory store's they do not).
    shared: bool = True

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

    @abc.abstractmethod
    async def watch(self, on_revoked: OnRevoked, *, on_canary: OnCanary | None = None) -> None:
        """Call `on_revoked()` soon after any process revokes anything (returns once watching),
        and `on_canary(token)` when a ring of `ring_canary(token)` is heard."""

    @property
    def listening(self) -> bool:
        return True

    async def ring_canary(self, token: str) -> None:
        """Ring the doorbell with `token` (ASCII letters, digits and `-`) from a connection other
        than the one the store listens on, for readiness (types.RingPath): only a store whose
        listener no other ring goes through is asked, which the wiring decides."""
        raise NotImplementedError(f"{type(self).__name__} rings no canary")

    def relisten(self, reason: str) -> None:
        """Drop the connection the doorbell is heard on and open it again, then call `on_revoked`
        as after a loss; `reason` is logged. Nothing to do for a store that listens on nothing."""

    async def prune(self) -> int:
        """Forget revocations that can no longer matter (their sessions expired)."""
        return 0

    async def aopen(self) -> None:
        """Open what `arevoke*()` and `revoked_among()` use on the running loop, so that an
        unreachable store fails when a web app starts rather than at its first check."""

    async def aclose(self) -> None:
        """Release async resources (servers call this at shutdown)."""

    def close(self) -> None:
        """Release sync resources."""


class MemoryRevocations(RevocationStore):
    """One process's revocations, in memory: what a server without a database or Redis checks
    (nothing is ever revoked in it from elsewhere; `revoke()` refuses it), and tests."""

    shared = False

    def __init__(self) -> None:
        self._sessions: dict[str, int] = {}  # session id -> expires (ms)
        self._subjects: dict[str, int] = {}  # subject -> revoked at (ms)
        self._watchers: list[OnRevoked] = []

    def clear(self) -> None:
        self._sessions.clear()
        self._subjects.clear()

    async def revoked_among(self, sessions: Iterable[Session]) -> set[str]:
        found = set()
        for s in sessions:
            before = self._subjects.get(s.subject)
            if s.id in self._sessions or (before is not None and ms(s.issued_at) <= before):
                found.add(s.id)
        return found

    def add_session(self, session_id: str, expires_at: float) -> None:
        self._prune_now()
        self._sessions[session_id] = max(self._sessions.get(session_id, 0), ms(expires_at))
        self._ring()

    async def aadd_session(self, session_id: str, expires_at: float) -> None:
        self.add_session(session_id, expires_at)

    def add_subject(self, subject: str, before: float) -> None:
        self._prune_now()
        self._subjects[subject] = max(self._subjects.get(subject, 0), ms(before))
        self._ring()

    async def aadd_subject(self, subject: str, before: float) -> None:
        self.add_subject(subject, before)

    async def watch(self, on_revoked: OnRevoked, *, on_canary: OnCanary | None = None) -> None:
        self._watchers.append(on_revoked)

    def _ring(self) -> None:
        for watcher in self._watchers:
            watcher()

    async def prune(self) -> int:
        return self._prune_now()

    def _prune_now(self) -> int:
        now = ms(time.time())
        gone = [k for k, exp in self._sessions.items() if exp <= now]
        gone_subjects = [k for k, at in self._subjects.items() if at + ms(SUBJECT_KEPT) <= now]
        for k in gone:
            del self._sessions[k]
        for k in gone_subjects:
            del self._subjects[k]
        return len(gone) + len(gone_subjects)


# The tables (sql/0002_sessions.sql) and the channel this store owns. Its payload is empty (a
# revocation, livepush_revocations_changed()) or "canary TOKEN" (a server's readiness check,
# livepush_revocations_canary(), sql/0002_sessions.sql); any other payload is a
# revocation's doorbell too: it costs a re-check and closes nothing. The Redis store's channel
# carries the same payloads.
CHANNEL = "livepush_revocations"
_CANARY = re.compile(r"canary ([0-9A-Za-z-]{1,64})")


def _rang(payload: str, on_revoked: OnRevoked | None, on_canary: OnCanary | None) -> None:
    """A ring of a store's channel, in Postgres or Redis: a canary's token to `on_canary` (it
    re-checks nothing), anything else to `on_revoked`."""
    canary = _CANARY.fullmatch(payload)
    if canary is None:
        if on_revoked is not None:
            on_revoked()
    elif on_canary is not None:
        on_canary(canary.group(1))

# name: ring_revocations_canary -- a server's readiness check (PostgresRevocations.ring_canary):
# "canary TOKEN" on the store's channel (livepush_revocations_canary(), sql/0002_sessions.sql),
# which every server hears and only the one that rang it counts; no server re-checks its sessions
# for it. Writes nothing; delivered at commit.
_PG_RING_CANARY = "SELECT livepush_revocations_canary(%(token)s)"

# name: add_session -- an upsert: revoking the same session twice (or from two processes at
# once) leaves one row, with the later expiry. Rings the doorbell in the same transaction.
_PG_ADD_SESSION = """
WITH added AS (
    INSERT INTO livepush_revoked_sessions (session_id, expires_at)
    VALUES (%s, to_timestamp(%s))
    ON CONFLICT (session_id) DO UPDATE
    SET expires_at = greatest(livepush_revoked_sessions.expires_at, excluded.expires_at)
)
SELECT livepush_revocations_changed()
"""

# name: add_subject -- greatest() makes concurrent revocations of one subject commit in any
# order and still keep the latest cut-off (a later revocation covers more sessions).
_PG_ADD_SUBJECT = """
WITH added AS (
    INSERT INTO livepush_revoked_subjects (subject, revoked_at, expires_at)
    VALUES (%s, to_timestamp(%s), to_timestamp(%s))
    ON CONFLICT (subject) DO UPDATE
    SET revoked_at = greatest(livepush_revoked_subjects.revoked_at, excluded.revoked_at),
        expires_at = greatest(livepush_revoked_subjects.expires_at, excluded.expires_at)
)
SELECT livepush_revocations_changed()
"""

# name: revoked_among -- read-only; one statement for a whole batch of sessions. A revocation
# committed after this snapshot rings, which makes the server check again.
_PG_REVOKED_AMONG = """
SELECT q.id
FROM unnest(%s::text[], %s::text[], %s::float8[]) AS q(id, subject, issued_at)
WHERE EXISTS (SELECT 1 FROM livepush_revoked_sessions r WHERE r.session_id = q.id)
   OR EXISTS (SELECT 1 FROM livepush_revoked_subjects s
              WHERE s.subject = q.subject AND to_timestamp(q.issued_at) <= s.revoked_at)
"""

# name: prune -- bounded batches; SKIP LOCKED lets two servers prune at once without waiting on
# each other, and a row being re-revoked right now is simply left for later.
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

# name: write_lock_timeout -- first in each write's transaction (`true`: this transaction only).
# A migration or a transaction left open holding a revocation table's lock held the write, and
# the sign-out that made it, for as long; given up after READ_TIMEOUT, the write revoked nothing
# and says so.
_PG_WRITE_LOCK_TIMEOUT = "SELECT set_config('lock_timeout', %(ms)s, true)"


class PostgresRevocations(RevocationStore):
    """Revocations in Postgres (sql/0002_sessions.sql), shared by every server. `listener`: the
    process's shared Postgres listener (else one of its own, opened by `watch()`)."""

    def __init__(self, url: str, *, listener: Listener | None = None) -> None:
        self.url = url
        self._pools = LoopPools(url, name="livepush-revocations")
        self._listener = ListenerSlot(listener, lambda: Listener(url))
        self._on_revoked: OnRevoked | None = None
        self._on_canary: OnCanary | None = None

    async def _execute(self, statement: str, params: Any, *, fetch: bool = False) -> list[tuple[Any, ...]]:
        with translated(self.url):
            async with (await self._pools.aget()).connection() as conn:
                cur = await conn.execute(statement, params)
                return await cur.fetchall() if fetch else []

    def _write(self, statement: str, params: Any) -> None:
        with self._lock_bounded(), self._pools.sync().connection() as conn, conn.transaction():
            conn.execute(_PG_WRITE_LOCK_TIMEOUT, {"ms": f"{ms(READ_TIMEOUT)}ms"})
            conn.execute(statement, params)
            # Every write also drops a bounded batch of dead rows, so the tables stay small
            # without a separate maintenance job. In the write's transaction: a write that raises
            # has revoked nothing, and may simply be tried again.
            conn.execute(_PG_PRUNE, {"limit": _PRUNE_BATCH})

    async def _awrite(self, statement: str, params: Any) -> None:
        with self._lock_bounded():
            async with (await self._pools.aget()).connection() as conn, conn.transaction():
                await conn.execute(_PG_WRITE_LOCK_TIMEOUT, {"ms": f"{ms(READ_TIMEOUT)}ms"})
                await conn.execute(statement, params)
                await conn.execute(_PG_PRUNE, {"limit": _PRUNE_BATCH})

    @contextlib.contextmanager
    def _lock_bounded(self) -> Iterator[None]:
        """Around a write: its lock wait given up (_PG_WRITE_LOCK_TIMEOUT) said as what it is."""
        # Inside translated(): our DependencyError passes through it, the driver's other errors
        # are translated as on every read.
        with translated(self.url):
            try:
                yield
            except psycopg.errors.LockNotAvailable as exc:
                raise DependencyError(
                    f"the revocation store at {redact(self.url)} could not take the revocation within "
                    f"{READ_TIMEOUT:g} s: another session holds a lock on its table (a migration, or a "
                    "transaction left open); nothing was revoked: try again") from exc

    async def revoked_among(self, sessions: Iterable[Session]) -> set[str]:
        batch = list(sessions)
        if not batch:
            return set()
        rows = await self._execute(
            _PG_REVOKED_AMONG,
            ([s.id for s in batch], [s.subject for s in batch], [ms(s.issued_at) / 1000 for s in batch]),
            fetch=True,
        )
        return {row[0] for row in rows}

    def add_session(self, session_id: str, expires_at: float) -> None:
        self._write(_PG_ADD_SESSION, (session_id, ms(expires_at) / 1000))

    async def aadd_session(self, session_id: str, expires_at: float) -> None:
        await self._awrite(_PG_ADD_SESSION, (session_id, ms(expires_at) / 1000))

    def add_subject(self, subject: str, before: float) -> None:
        self._write(_PG_ADD_SUBJECT, (subject, ms(before) / 1000, ms(before + SUBJECT_KEPT) / 1000))

    async def aadd_subject(self, subject: str, before: float) -> None:
        await self._awrite(_PG_ADD_SUBJECT, (subject, ms(before) / 1000, ms(before + SUBJECT_KEPT) / 1000))

    async def watch(self, on_revoked: OnRevoked, *, on_canary: OnCanary | None = None) -> None:
        self._on_revoked, self._on_canary = on_revoked, on_canary
        listener = self._listener.get()
        # After a reconnect a revocation may have rung unheard: check again too. One bound method,
        # added once however often a watch that failed to start is tried again.
        listener.add(CHANNEL, self._heard, on_resync=on_revoked)
        await listener.start()

    def _heard(self, payload: str) -> None:
        _rang(payload, self._on_revoked, self._on_canary)

    @property
    def listening(self) -> bool:
        return self._listener.listening

    async def ring_canary(self, token: str) -> None:
        # From the pool: a listener that hears nothing from other sessions (a frozen backend, a
        # proxy that dropped it) may still hear its own session's rings.
        await self._execute(_PG_RING_CANARY, {"token": token})

    def relisten(self, reason: str) -> None:
        # The listener's other channels, if it is shared, resync too: they heard nothing either.
        self._listener.get().relisten(reason)

    async def prune(self) -> int:
        rows = await self._execute(_PG_PRUNE, {"limit": _PRUNE_BATCH}, fetch=True)
        return int(rows[0][0]) if rows else 0

    async def aopen(self) -> None:
        await self._pools.aget()

    async def aclose(self) -> None:
        await self._listener.aclose()
        await self._pools.aclose()

    def close(self) -> None:
        self._pools.close()


# Keep the cut-off only if it is later than the one stored: revocations from two processes may
# arrive in any order. Atomic, since Redis runs a script as one command. Rings the doorbell.
_REDIS_ADD_SUBJECT = known_script("""
local cur = tonumber(redis.call('GET', KEYS[1]))
if cur == nil or cur < tonumber(ARGV[1]) then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
end
redis.call('PUBLISH', ARGV[3], '')
return 1
""")
_REDIS_ADD_SESSION = known_script("""
redis.call('SET', KEYS[1], '1', 'PX', ARGV[1])
redis.call('PUBLISH', ARGV[2], '')
return 1
""")

# name: revoked_read -- each key's value, as MGET gives it (nil where none), but the integer 0 for a
# key that holds another type of value than text (a hash, a list, ...): MGET answers nil for it too,
# which read a revocation something else overwrote as none. One command, like the MGET it replaces;
# any other refusal (an ACL's) is raised as MGET's was.
_REDIS_REVOKED_READ = known_script("""
local out = {}
for i, key in ipairs(KEYS) do
  local value = redis.pcall('GET', key)
  if type(value) == 'table' and value.err then
    if string.sub(value.err, 1, 9) ~= 'WRONGTYPE' then
      return value
    end
    value = 0
  end
  out[i] = value
end
return out
""")
# What _REDIS_REVOKED_READ answers for a key of another type.
_OTHER_TYPE = 0

_REDIS_CHUNK = 1000
# What deleting a subject's key of another type costs (it holds no cut-off livepush can read), for
# the error of the revocation it refused.
_SUBJECT_KEY_DELETED = "then revoke the subject again: its revocation is stored anew"


class RedisRevocations(RevocationStore):
    """Revocations in Redis, for a deployment with Redis and no database, under the deployment's
    prefix P, in braces (redis.client.namespace()): `{P}:revoked:session:<id>` expires with the
    session, `{P}:revoked:subject:<subject>` holds the cut-off time (ms) for SUBJECT_KEPT (no covered
    session outlives it, on any clock within CLOCK_ALLOWANCE), and `{P}:revoked` is the doorbell
    channel (its payloads those of CHANNEL: empty, or a readiness check's "canary TOKEN")."""

    def __init__(self, url: str, *, prefix: str | None = None, subscriber: Subscriber | None = None) -> None:
        self.url = url
        self.prefix = deployment_prefix(url, prefix)
        self.session_prefix = f"{namespace(self.prefix)}:revoked:session:"
        self.subject_prefix = f"{namespace(self.prefix)}:revoked:subject:"
        self.channel = f"{namespace(self.prefix)}:revoked"
        self._subscriber = ListenerSlot(subscriber, lambda: Subscriber(url, name=listener_name(self.prefix)))
        # A client per event loop (asyncio.run or async_to_sync in sync web code run their own).
        self._clients: LoopClients[Any] = LoopClients(
            lambda: async_client(self.url, "livepush-revocations", socket_timeout=5))
        self._on_revoked: OnRevoked | None = None
        self._on_canary: OnCanary | None = None

    def _aclient(self) -> Any:
        return self._clients.get()

    def _sync_client(self) -> Any:
        import redis

        return redis.Redis.from_url(own_url(self.url), socket_timeout=5, **client_kwargs("livepush-revocations"))

    async def revoked_among(self, sessions: Iterable[Session]) -> set[str]:
        import redis

        batch = list(sessions)
        if not batch:
            return set()
        subjects = sorted({s.subject for s in batch})
        keys = [self.session_prefix + s.id for s in batch] + [self.subject_prefix + s for s in subjects]
        try:
            # EVAL, not EVALSHA: a pipeline of registered scripts checks them with SCRIPT EXISTS
            # first, a round trip more on every handshake.
            pipe = self._aclient().pipeline(transaction=False)
            for i in range(0, len(keys), _REDIS_CHUNK):
                chunk = keys[i : i + _REDIS_CHUNK]
                pipe.eval(_REDIS_REVOKED_READ, len(chunk), *chunk)
            values = [v for chunk in await pipe.execute() for v in chunk]
        except (redis.RedisError, OSError) as exc:
            raise failed(self.url, exc, "reading revocations", reads=True) from exc
        session_hits = values[: len(batch)]
        for s, hit in zip(batch, session_hits, strict=True):
            if hit == _OTHER_TYPE:
                self._warn_other_type(self.session_prefix + s.id, "its session counts as revoked")
        cutoffs = {subject: self._cutoff(subject, v)
                   for subject, v in zip(subjects, values[len(batch) :], strict=True) if v is not None}
        found = set()
        for s, hit in zip(batch, session_hits, strict=True):
            cutoff = cutoffs.get(s.subject)
            if hit is not None or (cutoff is not None and ms(s.issued_at) <= cutoff):
                found.add(s.id)
        return found

    def _cutoff(self, subject: str, value: bytes | int) -> float:
        """A subject's cut-off (ms) as stored. Text that is none, or a value of another type
        (something else wrote the key), is a revocation of unknown extent: it covers every session
        of the subject, since letting one in that it may cover is the worse mistake, and raising
        failed every check, the server's re-check of all its sessions included. revoke_subject()
        writes over text; a key of another type has to be deleted first."""
        key = self.subject_prefix + subject
        if value == _OTHER_TYPE:
            self._warn_other_type(key, "every session of its subject counts as revoked")
            return float("inf")
        try:
            return int(value)
        except ValueError:
            assert isinstance(value, bytes)  # int() takes every int
            log.warning("livepush: %r in Redis holds %r, not a cut-off; every session of its subject counts as "
                        "revoked until revoke_subject() writes one over it", key, value[:40])
            return float("inf")

    @staticmethod
    def _warn_other_type(key: str, outcome: str) -> None:
        # revoke_subject() refuses to write over another type (failed() names the key), so the way
        # out is to delete the key: said here, where the operator first meets it.
        log.warning("livepush: %r in Redis holds another type of value than text, not a cut-off; %s until the key "
                    "is deleted (something else writes under LIVEPUSH_REDIS_PREFIX: give it a prefix of its own)",
                    key, outcome)

    @staticmethod
    def _session_ttl_ms(expires_at: float) -> int:
        return ms(expires_at) - ms(time.time())

    # An expired session needs no key (decode() refuses it anyway), but connections opened while
    # it was valid may still be open: ring anyway, and the servers' re-check closes them as
    # expired now rather than at their next periodic check.
    def add_session(self, session_id: str, expires_at: float) -> None:
        import redis

        ttl = self._session_ttl_ms(expires_at)
        try:
            with self._sync_client() as client:
                if ttl <= 0:
                    client.publish(self.channel, "")
                else:
                    client.eval(_REDIS_ADD_SESSION, 1, self.session_prefix + session_id, ttl, self.channel)
        except (redis.RedisError, OSError) as exc:
            raise failed(self.url, exc, "storing a revocation") from exc

    async def aadd_session(self, session_id: str, expires_at: float) -> None:
        import redis

        ttl = self._session_ttl_ms(expires_at)
        try:
            if ttl <= 0:
                await self._aclient().publish(self.channel, "")
            else:
                await self._aclient().eval(_REDIS_ADD_SESSION, 1, self.session_prefix + session_id, ttl, self.channel)
        except (redis.RedisError, OSError) as exc:
            raise failed(self.url, exc, "storing a revocation") from exc

    def add_subject(self, subject: str, before: float) -> None:
        import redis

        try:
            with self._sync_client() as client:
                client.eval(_REDIS_ADD_SUBJECT, 1, self.subject_prefix + subject, ms(before), ms(SUBJECT_KEPT), self.channel)
        except (redis.RedisError, OSError) as exc:
            raise failed(self.url, exc, "storing a revocation", key=self.subject_prefix + subject,
                         deleting=_SUBJECT_KEY_DELETED) from exc

    async def aadd_subject(self, subject: str, before: float) -> None:
        import redis

        try:
            await self._aclient().eval(_REDIS_ADD_SUBJECT, 1, self.subject_prefix + subject, ms(before), ms(SUBJECT_KEPT),
                                       self.channel)
        except (redis.RedisError, OSError) as exc:
            raise failed(self.url, exc, "storing a revocation", key=self.subject_prefix + subject,
                         deleting=_SUBJECT_KEY_DELETED) from exc

    async def watch(self, on_revoked: OnRevoked, *, on_canary: OnCanary | None = None) -> None:
        await self._check_reads(ListenError, while_loading=True)
        self._on_revoked, self._on_canary = on_revoked, on_canary
        subscriber = self._subscriber.get()
        # One bound method, added once however often a watch that failed to start is tried again.
        subscriber.add(self.channel, self._heard, on_resync=on_revoked)
        await subscriber.start()

    def _heard(self, frame: bytes) -> None:
        _rang(frame.decode("utf-8", "replace"), self._on_revoked, self._on_canary)

    @property
    def listening(self) -> bool:
        return self._subscriber.listening

    async def ring_canary(self, token: str) -> None:
        import redis

        # Through the store's client, not the subscriber's connection, whose silence it is to show.
        try:
            await self._aclient().publish(self.channel, f"canary {token}")
        except (redis.RedisError, OSError) as exc:
            raise failed(self.url, exc, "ringing the revocation channel") from exc

    def relisten(self, reason: str) -> None:
        # The subscriber's other channels, if it is shared, resync too: they heard nothing either.
        self._subscriber.get().relisten(reason)

    async def aopen(self) -> None:
        await self._check_reads(DependencyError, while_loading=False)

    async def _check_reads(self, cls: type[DependencyError], *, while_loading: bool) -> None:
        """Raise `cls` saying why unless Redis answers the read every check of a session makes
        (_REDIS_REVOKED_READ of the store's keys): on a Sentinel or a Cluster node a server
        answered every handshake 503."""
        await answered_at_start(self.url, self._aclient().eval(_REDIS_REVOKED_READ, 1, self.subject_prefix), cls,
                                while_loading=while_loading)

    async def aclose(self) -> None:
        await self._subscriber.aclose()
        await self._clients.release_loop()
        self._clients.forget()


# The store of a process without a database or Redis: a server there can revoke nothing.
MEMORY = MemoryRevocations()


def store_from_settings(settings: Settings, *, listener: Listener | None = None,
                        subscriber: Subscriber | None = None) -> RevocationStore:
    """Postgres when a database URL is set, else Redis when a Redis URL is set, else the
    process's in-memory store (which `revoke()` refuses: revocation needs a shared store)."""
    if settings.database_url:
        return PostgresRevocations(settings.database_url, listener=listener)
    if settings.redis_url:
        return RedisRevocations(settings.redis_url, prefix=settings.redis_prefix, subscriber=subscriber)
    return MEMORY


__all__ = ["MEMORY", "READ_TIMEOUT", "MemoryRevocations", "PostgresRevocations", "RedisRevocations",
           "RevocationStore", "store_from_settings"]

