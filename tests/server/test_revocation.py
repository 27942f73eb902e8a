"""Revocation reaches open connections (docs/reference.md §4, §5, §8): revoke() in one process
closes the matching connections on every server process with 4403 within a second, through
Postgres and through Redis. The store rings a doorbell (NOTIFY livepush_revocations, PUBLISH
P:revoked) that carries nothing: on it each server re-checks its open sessions against the store,
so a forged ring closes nothing. Each server's periodic re-check closes sessions that expired
while connected, or whose ring it missed."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import time
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import psycopg
import pytest
import redis
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed, InvalidStatus

from livepush import api, sessions
from livepush.config import Settings, get_settings, set_settings
from livepush.errors import DependencyError
from livepush.fanout.local import LocalFanOut
from livepush.jobs import database
from livepush.server.app import PushServer
from livepush.sessions import (
    MemoryRevocations,
    PostgresRevocations,
    RedisRevocations,
    RevocationStore,
    Session,
)
from livepush.sessions.revocations import ms
from livepush.sessions.rules import Allow, App
from tests.server.conftest import Served, make_settings, start_served
from tests.support import services
from tests.support.procs import ChildProcess, Processes
from tests.support.waiting import async_wait_for
from tests.support.wsclient import WSClient

CLOSE_REVOKED = 4403
REVOCATION_DEADLINE = 1.0  # seconds from revoke() returning to the close frame (docs/security.md: within a second of the revocation)

try:  # the Postgres half stands without the Redis fan-out module
    import livepush.fanout.redis  # noqa: F401

    REDIS_FANOUT_ERROR: str | None = None
except Exception as exc:  # pragma: no cover - only while the module is broken
    REDIS_FANOUT_ERROR = f"livepush.fanout.redis is not importable ({type(exc).__name__}: {exc})"

BACKENDS = [
    pytest.param("postgres", id="postgres"),
    pytest.param(
        "redis",
        id="redis",
        marks=pytest.mark.xfail(REDIS_FANOUT_ERROR is not None, reason=REDIS_FANOUT_ERROR or "", run=False),
    ),
]


# -- a deployment: its environment, its servers, and this process as the "web app" ----------


class Deployment:
    """One backend's environment. This test process plays the web app that calls revoke()."""

    def __init__(self, backend: str, env_for: Callable[..., dict[str, str]], procs: Processes) -> None:
        self.backend = backend
        self.env_for = env_for
        self.procs = procs
        self.env = env_for()
        self.settings = Settings.from_env(self.env)

    async def serve(self, *args: str) -> ChildProcess:
        """One more `livepush serve` process of this deployment, on its own port."""
        return await self.procs.alivepush("serve", *args, env=self.env_for())

    def store(self) -> RevocationStore:
        if self.backend == "postgres":
            return PostgresRevocations(self.settings.require_database())
        assert self.settings.redis_url
        return RedisRevocations(self.settings.redis_url)

    def store_without_ring(self, *, session: Session | None = None, subject: str | None = None) -> None:
        """Write a revocation straight into the store's table or key, as a ring the servers missed
        leaves it: stored, and nobody told."""
        if self.backend == "postgres":
            with psycopg.connect(self.settings.require_database(), autocommit=True) as conn:
                if session is not None:
                    conn.execute("INSERT INTO livepush_revoked_sessions (session_id, expires_at) "
                                 "VALUES (%s, to_timestamp(%s))", (session.id, session.expires_at))
                if subject is not None:
                    conn.execute("INSERT INTO livepush_revoked_subjects (subject, revoked_at, expires_at) "
                                 "VALUES (%s, now(), now() + interval '1 day')", (subject,))
            return
        store = self.store()
        assert isinstance(store, RedisRevocations) and self.settings.redis_url
        with redis.Redis.from_url(self.settings.redis_url) as client:
            if session is not None:
                client.set(store.session_prefix + session.id, "1", px=ms(session.expires_at - time.time()))
            if subject is not None:
                client.set(store.subject_prefix + subject, str(ms(time.time())), px=86_400_000)


@pytest.fixture(params=BACKENDS)
def deployment(
    request: pytest.FixtureRequest, livepush_env: Callable[..., dict[str, str]], procs: Processes
) -> Iterator[Deployment]:
    """A Postgres or a Redis deployment; while the test runs, this process's settings, default
    fan-out and default revocation store are that deployment's (restored afterwards)."""
    backend = request.param
    if backend == "postgres":
        url = request.getfixturevalue("pg_url")

        def env_for(**kw: Any) -> dict[str, str]:
            return livepush_env(database_url=url, **kw)
    else:
        url = request.getfixturevalue("redis_url")

        def env_for(**kw: Any) -> dict[str, str]:
            return livepush_env(redis_url=url, **kw)

    dep = Deployment(backend, env_for, procs)
    assert dep.settings.fanout == backend
    set_settings(dep.settings)
    api.set_default_fanout(None)
    sessions.set_default_store(None)
    try:
        yield dep
    finally:
        api.set_default_fanout(None)  # closes the publishing fan-out revoke() created
        sessions.set_default_store(None)
        set_settings(None)


async def connect_as(child: ChildProcess, token: str) -> WSClient:
    client = await WSClient.open(f"ws://127.0.0.1:{child.port}/", additional_headers={"Cookie": f"livepush_session={token}"})
    assert client.hello["session"] == {"subject": sessions.decode(token, get_settings().secrets).subject}
    return client


async def still_open(client: WSClient) -> bool:
    await client.send({"op": "ping", "ref": "alive?"})
    # A closed connection raises at once: the default bound only stops a hang.
    return await client.recv() == {"op": "pong", "ref": "alive?"}


async def closed_within(client: WSClient, t0: float, timeout: float = 5.0) -> tuple[int | None, float]:
    """(close code, seconds from t0 (loop time) until the close frame arrived)."""
    code = await client.closed_with(timeout=timeout)
    return code, asyncio.get_running_loop().time() - t0


# -- revoke() and revoke_subject() through the store's doorbell ------------------------------


async def test_revoke_closes_the_session_on_every_server_within_a_second(deployment: Deployment) -> None:
    """revoke(token) in another process closes that session's connections on two server processes with 4403 in < 1 s."""
    servers = [await deployment.serve(), await deployment.serve()]
    token = sessions.issue("user-7")
    bystander_token = sessions.issue("user-7")  # same subject, another session: untouched
    victims = [await connect_as(s, token) for s in servers]
    bystanders = [await connect_as(s, bystander_token) for s in servers]

    sessions.revoke(token)
    t0 = asyncio.get_running_loop().time()
    results = await asyncio.gather(*(closed_within(v, t0) for v in victims))

    assert [code for code, _ in results] == [CLOSE_REVOKED, CLOSE_REVOKED]
    assert max(elapsed for _, elapsed in results) < REVOCATION_DEADLINE, results
    for client in bystanders:
        assert await still_open(client)
        await client.close()
    # The revocation is stored too: a new handshake with the token comes in anonymous.
    again = await WSClient.open(
        f"ws://127.0.0.1:{servers[1].port}/", additional_headers={"Cookie": f"livepush_session={token}"}
    )
    assert again.hello["session"] is None
    await again.close()
    for server in servers:
        assert token not in server.stderr() + server.stdout()


async def test_revoke_subject_closes_every_session_of_that_subject(deployment: Deployment) -> None:
    """revoke_subject() closes every connection of that subject's sessions, on any server, with 4403 in < 1 s."""
    first, second = await deployment.serve(), await deployment.serve()
    victims = [
        await connect_as(first, sessions.issue("user-7")),
        await connect_as(second, sessions.issue("user-7")),
        await connect_as(second, sessions.issue("user-7")),
    ]
    other = await connect_as(first, sessions.issue("user-8"))

    sessions.revoke_subject("user-7")
    t0 = asyncio.get_running_loop().time()
    results = await asyncio.gather(*(closed_within(v, t0) for v in victims))

    assert [code for code, _ in results] == [CLOSE_REVOKED] * 3
    assert max(elapsed for _, elapsed in results) < REVOCATION_DEADLINE, results
    assert await still_open(other)
    await other.close()


async def test_arevoke_from_async_code_closes_too(deployment: Deployment) -> None:
    """arevoke() (async web code) closes the session's connection on a server process with 4403 in < 1 s."""
    server = await deployment.serve()
    token = sessions.issue("user-9")
    client = await connect_as(server, token)
    await sessions.arevoke(token)
    t0 = asyncio.get_running_loop().time()
    code, elapsed = await closed_within(client, t0)
    assert code == CLOSE_REVOKED and elapsed < REVOCATION_DEADLINE


# -- the periodic re-check -------------------------------------------------------------------


async def test_a_missed_revocation_is_caught_by_the_recheck(deployment: Deployment) -> None:
    """A revocation stored without a ring (the server missed it) closes the session with 4403 at the next periodic re-check."""
    server = await deployment.serve("--app", "tests.support.security_app:fast_reverify")
    token = sessions.issue("user-7")
    session = sessions.decode(token, get_settings().secrets)
    client = await connect_as(server, token)
    bystander = await connect_as(server, sessions.issue("user-7"))
    assert await still_open(client)

    await asyncio.to_thread(deployment.store_without_ring, session=session)  # stored only: nobody is told
    t0 = asyncio.get_running_loop().time()
    code, elapsed = await closed_within(client, t0)
    assert code == CLOSE_REVOKED
    assert elapsed < 0.2 + REVOCATION_DEADLINE, elapsed  # one reverify_interval, plus slack
    assert await still_open(bystander)
    await bystander.close()


async def test_a_missed_subject_revocation_is_caught_by_the_recheck(deployment: Deployment) -> None:
    """A subject revocation written straight to the store without a ring is caught by the periodic re-check too."""
    server = await deployment.serve("--app", "tests.support.security_app:fast_reverify")
    client = await connect_as(server, sessions.issue("user-7"))
    await asyncio.to_thread(deployment.store_without_ring, subject="user-7")
    code, elapsed = await closed_within(client, asyncio.get_running_loop().time())
    assert code == CLOSE_REVOKED and elapsed < 0.2 + REVOCATION_DEADLINE


async def test_a_session_that_expires_while_connected_is_closed_with_4403(procs: Processes, livepush_env: Any) -> None:
    """A session whose token expires while connected is closed with 4403 by the re-check (serve --app, child process)."""
    env = livepush_env()
    server = await procs.alivepush("serve", "--app", "tests.support.security_app:fast_reverify", env=env)
    # Issued once the server is up, with room for a handshake on a loaded machine: the token
    # must still be valid when it arrives.
    set_settings(Settings.from_env(env))
    try:
        token = sessions.issue("user-7", ttl=2)
        expires_at = sessions.decode(token, get_settings().secrets).expires_at
    finally:
        set_settings(None)
    client = await WSClient.open(f"ws://127.0.0.1:{server.port}/?token={token}")
    assert client.hello["session"] == {"subject": "user-7"}
    code = await client.closed_with(timeout=5)
    closed_at = time.time()
    assert code == CLOSE_REVOKED
    # Not before the expiry, and within one re-check interval (plus slack) after it.
    assert expires_at - 0.05 <= closed_at < expires_at + 0.2 + REVOCATION_DEADLINE, (closed_at - expires_at)


async def test_expiry_recheck_in_process(secret: str) -> None:
    """In-process (local fan-out): an App's reverify_interval drives the re-check that closes an expired session with 4403."""
    settings = Settings(fanout="local", secret=secret, port=0, authenticate="required")
    served = await start_served(settings, app=App(reverify_interval=0.2))
    try:
        token = sessions.issue("user-7", ttl=1)
        client = await WSClient.open(served.url, additional_headers={"Cookie": f"livepush_session={token}"})
        long_lived = await WSClient.open(
            served.url, additional_headers={"Cookie": f"livepush_session={sessions.issue('user-8', ttl=600)}"}
        )
        assert client.hello["session"] == {"subject": "user-7"}
        assert await client.closed_with(timeout=5) == CLOSE_REVOKED
        assert await still_open(long_lived)
        await long_lived.close()
    finally:
        await served.stop()
        api.set_default_fanout(None)
        set_settings(None)


async def test_a_session_that_has_expired_subscribes_to_nothing_more(secret: str) -> None:
    """A connection whose session has expired gets no new topic from its rules (or authorize) while it waits for the periodic re-check: its next subscribe closes it with 4403."""
    set_settings(Settings(fanout="local", secret=secret, port=0))
    app = App(rules=[Allow("user:{subject}"), Allow("user:{subject}:*")], reverify_interval=3600)
    served = await start_served(get_settings(), app=app)
    try:
        token = sessions.issue("user-7", ttl=1)
        expires_at = sessions.decode(token, get_settings().secrets).expires_at
        client = await WSClient.open(served.url, additional_headers={"Cookie": f"livepush_session={token}"})
        assert (await client.subscribe("user:user-7"))["op"] == "subscribed"
        await asyncio.sleep(max(0.0, expires_at - time.time()) + 0.05)  # the token's own clock: no event to await
        await client.send({"op": "subscribe", "topic": "user:user-7:inbox", "since": None, "ref": "late"})
        frame = await client.close_frame(timeout=REVOCATION_DEADLINE)
        assert frame is not None and frame.code == CLOSE_REVOKED, frame
    finally:
        await served.stop()
        api.set_default_fanout(None)
        set_settings(None)


async def test_a_session_that_expires_while_authorize_decides_is_granted_nothing(secret: str) -> None:
    """A session that expires while authorize() decides gets no topic from its answer: the subscribe closes the connection with 4403, never answers `subscribed`."""
    set_settings(Settings(fanout="local", secret=secret, port=0))

    async def authorize(session: Session | None, topic: str) -> bool:
        assert session is not None
        await asyncio.sleep(max(0.0, session.expires_at - time.time()) + 0.05)  # the token's own clock
        return True

    served = await start_served(get_settings(), app=App(authorize=authorize, authorize_timeout=10,
                                                        reverify_interval=3600))
    try:
        token = sessions.issue("user-7", ttl=2)
        client = await WSClient.open(served.url, additional_headers={"Cookie": f"livepush_session={token}"})
        await client.send({"op": "subscribe", "topic": "team:1", "since": None, "ref": "late"})
        try:
            answer = await client.recv(timeout=10)
        except ConnectionClosed as exc:
            assert exc.rcvd is not None and exc.rcvd.code == CLOSE_REVOKED, exc
        else:
            raise AssertionError(f"a session expired while authorize() decided was answered {answer}")
    finally:
        await served.stop()
        api.set_default_fanout(None)
        set_settings(None)


@contextlib.asynccontextmanager
async def served_beside_a_locker(secret: str, pg_url: str, app: App | None = None,
                                 ) -> AsyncIterator[tuple[Served, psycopg.AsyncConnection[Any]]]:
    """A server on Postgres in this process, and a connection of the test's own to lock its tables
    with, as a migration does (rolled back, so released, at the end)."""
    served = await start_served(make_settings("postgres", secret, pg_url, None), app=app)
    locker = await psycopg.AsyncConnection.connect(pg_url)
    try:
        yield served, locker
    finally:
        await locker.rollback()
        await locker.close()
        await served.stop()
        api.set_default_fanout(None)
        set_settings(None)


LOCK_REVOCATIONS = "LOCK TABLE livepush_revoked_sessions IN ACCESS EXCLUSIVE MODE"


async def test_a_session_expires_on_time_while_the_store_is_locked(secret: str, pg_url: str) -> None:
    """A store read that blocks (a migration holding a revocation table's lock) fails after a bound
    rather than holding the re-checks: a session that expires meanwhile is still closed with 4403."""
    async with served_beside_a_locker(secret, pg_url, App(reverify_interval=0.2)) as (served, locker):
        token = sessions.issue("user-7", ttl=3)
        expires_at = sessions.decode(token, get_settings().secrets).expires_at
        client = await WSClient.open(served.url, additional_headers={"Cookie": f"livepush_session={token}"})
        assert client.hello["session"] == {"subject": "user-7"}
        await locker.execute(LOCK_REVOCATIONS)  # held past the bound below: the re-checks wait on it
        code = await client.closed_with(timeout=max(0.0, expires_at - time.time()) + 9)
        assert code == CLOSE_REVOKED


async def test_a_handshake_whose_store_read_blocks_is_answered_503(secret: str, pg_url: str) -> None:
    """A handshake whose session check blocks (a migration holding a revocation table's lock) is
    answered HTTP 503, a temporary refusal the client retries, within a bound, rather than held
    until the server drops the opening connection."""
    async with served_beside_a_locker(secret, pg_url) as (served, locker):
        await locker.execute(LOCK_REVOCATIONS)
        token = sessions.issue("user-7")
        with pytest.raises(InvalidStatus) as refused:
            await asyncio.wait_for(connect(served.url, open_timeout=20,
                                           additional_headers={"Cookie": f"livepush_session={token}"}), 25)
        assert refused.value.response.status_code == 503


# -- a ring is only a doorbell -----------------------------------------------------------------


@pytest.fixture(params=["postgres", "redis"])
async def watched(request: pytest.FixtureRequest, secret: str) -> AsyncIterator[tuple[Served, list[int]]]:
    """A server in this process on Postgres or Redis, with its re-checks of open sessions
    counted (calls of its store's revoked_among). Its periodic re-check is an hour away, so a
    re-check a test sees came from a ring."""
    pg = request.getfixturevalue("pg_url") if request.param == "postgres" else None
    rd = request.getfixturevalue("redis_url") if request.param == "redis" else None
    served = await start_served(make_settings(request.param, secret, pg, rd), app=App(reverify_interval=3600))
    checks = [0]
    store = served.server.store
    real = store.revoked_among

    async def counted(batch: Any) -> set[str]:
        checks[0] += 1
        return await real(batch)

    store.revoked_among = counted  # type: ignore[method-assign]
    try:
        yield served, checks
    finally:
        await served.stop()
        api.set_default_fanout(None)
        set_settings(None)


def forge_ring(served: Served, payload: str) -> None:
    """Ring the store's doorbell as anyone who can reach Postgres or Redis can, with no revocation behind it."""
    settings = served.settings
    if settings.fanout == "postgres":
        with psycopg.connect(settings.require_database(), autocommit=True) as conn:
            conn.execute("SELECT pg_notify('livepush_revocations', %s)", (payload,))
    else:
        store = served.server.store
        assert isinstance(store, RedisRevocations) and settings.redis_url
        with redis.Redis.from_url(settings.redis_url) as client:
            client.publish(store.channel, payload)


async def test_a_forged_doorbell_alone_closes_nothing(watched: tuple[Served, list[int]]) -> None:
    """A ring without a revocation behind it (even one naming the session) makes the server re-check its sessions against the store, which closes nothing; a real revoke() still closes in < 1 s."""
    served, checks = watched
    token = sessions.issue("user-7")
    session = sessions.decode(token, served.settings.secrets)
    client = await WSClient.open(served.url, additional_headers={"Cookie": f"livepush_session={token}"})
    assert client.hello["session"] == {"subject": "user-7"}
    for payload in ("", session.id, f'{{"session":"{session.id}"}}', '{"subject":"user-7","before":9e99}'):
        before = checks[0]
        await asyncio.to_thread(forge_ring, served, payload)
        await async_wait_for(lambda before=before: checks[0] > before, 5,
                             message="the server to re-check its sessions on the ring")
        assert await still_open(client), f"a forged ring {payload!r} closed the session"
    await asyncio.to_thread(sessions.revoke, token)  # the server's own store, as the wiring installs it
    code, elapsed = await closed_within(client, asyncio.get_running_loop().time())
    assert code == CLOSE_REVOKED and elapsed < REVOCATION_DEADLINE


class _AnswersLate(MemoryRevocations):
    """A store whose answer reaches the handshake only after its read was made, as a Postgres or
    Redis read does: a revocation can be stored, and ring, in between."""

    def __init__(self) -> None:
        super().__init__()
        self.read = asyncio.Event()
        self.answer = asyncio.Event()
        self.answer.set()
        self.rechecked = asyncio.Event()

    async def revoked_among(self, sessions: Any) -> set[str]:
        self.rechecked.set()
        return await super().revoked_among(sessions)

    async def is_revoked(self, session: Session) -> bool:
        revoked = await super().is_revoked(session)
        self.read.set()
        await self.answer.wait()
        return revoked


@contextlib.asynccontextmanager
async def serving_with(store: RevocationStore, secret: str) -> AsyncIterator[str]:
    """A server in this process (local fan-out) that checks sessions against `store`, its periodic
    re-check an hour away, so that what closes a session in a test is a ring; yields its URL."""
    set_settings(Settings(fanout="local", secret=secret, port=0))
    server = PushServer(get_settings(), LocalFanOut(), app=App(reverify_interval=3600), store=store)
    await server.start()
    try:
        yield f"ws://127.0.0.1:{server.port}/"
    finally:
        await server.stop()
        set_settings(None)


async def test_a_revocation_that_rings_during_the_handshake_still_closes_it(secret: str) -> None:
    """A session revoked while its handshake waits for the store's answer (which predates the revocation) is closed with 4403 within a second of the ring, not at the next periodic re-check."""
    store = _AnswersLate()
    async with serving_with(store, secret) as url:
        other = await WSClient.open(url, additional_headers={"Cookie": f"livepush_session={sessions.issue('user-8')}"})
        store.read.clear()
        store.answer.clear()  # from now on the answer waits for the test
        token = sessions.issue("user-7")
        opening = asyncio.ensure_future(WSClient.open(url, additional_headers={"Cookie": f"livepush_session={token}"}))
        await asyncio.wait_for(store.read.wait(), 5)
        session = sessions.decode(token, get_settings().secrets)
        store.add_session(session.id, session.expires_at)  # stored and rung
        await asyncio.wait_for(store.rechecked.wait(), 5)  # the ring's re-check, while the handshake waits
        store.answer.set()
        client = await opening
        assert client.hello["session"] == {"subject": "user-7"}
        assert await client.closed_with(timeout=REVOCATION_DEADLINE) == CLOSE_REVOKED
        assert await still_open(other)
        await other.close()


class _ReadFailsOnce(MemoryRevocations):
    """A store whose next read fails once when armed, as a Postgres or Redis read does on a
    connection lost, a pool that timed out or a Redis busy past its socket timeout."""

    def __init__(self) -> None:
        super().__init__()
        self.armed = False
        self.failed = asyncio.Event()

    async def revoked_among(self, sessions: Any) -> set[str]:
        if self.armed:
            self.armed = False
            self.failed.set()
            raise DependencyError("cannot reach the revocation store (connection lost)")
        return await super().revoked_among(sessions)


async def test_a_recheck_that_fails_is_tried_again_and_still_closes_within_a_second_or_two(secret: str) -> None:
    """A revocation whose re-check fails (the store could not be read just then) is not left to the next periodic re-check: the server reads again shortly and closes the session with 4403."""
    store = _ReadFailsOnce()
    async with serving_with(store, secret) as url:
        token = sessions.issue("user-7")
        client = await WSClient.open(url, additional_headers={"Cookie": f"livepush_session={token}"})
        assert client.hello["session"] == {"subject": "user-7"}
        session = sessions.decode(token, get_settings().secrets)
        store.armed = True
        store.add_session(session.id, session.expires_at)  # stored and rung; the ring's re-check fails
        await asyncio.wait_for(store.failed.wait(), 5)
        assert await client.closed_with(timeout=2 * REVOCATION_DEADLINE) == CLOSE_REVOKED


# -- the store's own listener: the Redis fan-out with the jobs in another database --------------


@contextlib.asynccontextmanager
async def served_with_jobs_elsewhere(secret: str, settings_url: str, jobs_url: str, redis_url: str,
                                     ) -> AsyncIterator[Served]:
    """A server in this process on the Redis fan-out whose sessions are in `settings_url` and whose
    jobs are in `jobs_url` (jobs.configure() before the wiring): the revocation store is the only
    part that listens on `settings_url`. Its periodic re-check is an hour away, so a session a
    test sees closed was closed by a ring."""
    database.configure(jobs_url)
    served = await start_served(dataclasses.replace(make_settings("redis", secret, None, redis_url),
                                                    database_url=settings_url), app=App(reverify_interval=3600))
    try:
        yield served
    finally:
        database.configure(None)
        await served.stop()
        api.set_default_fanout(None)
        set_settings(None)


def listening_backends(url: str) -> list[tuple[int, str]]:
    """(pid, state) of the livepush listeners connected to `url`'s database."""
    with psycopg.connect(url, autocommit=True) as conn:
        return [(pid, state) for pid, state in conn.execute(
            "SELECT pid, state FROM pg_stat_activity WHERE datname = current_database() "
            "AND application_name = 'livepush-listener' AND query ILIKE 'LISTEN %%'")]


async def test_the_revocation_stores_own_listener_killed_server_side_is_opened_again_and_hears_the_next_revocation(
        secret: str, make_pg_url: Callable[[], str], redis_url: str, pg_admin_url: str) -> None:
    """On the Redis fan-out with the jobs in another database, the store's listener is the only
    one on the sessions' database. Its backend killed (pg_terminate_backend), it connects and
    LISTENs again by itself, and a revocation made after that closes the session within a second."""
    settings_url, jobs_url = make_pg_url(), make_pg_url()
    async with served_with_jobs_elsewhere(secret, settings_url, jobs_url, redis_url) as served:
        [(killed, _)] = listening_backends(settings_url)
        token = sessions.issue("user-7")
        client = await WSClient.open(served.url, additional_headers={"Cookie": f"livepush_session={token}"})
        assert client.hello["session"] == {"subject": "user-7"}
        assert await asyncio.to_thread(services.pg_terminate, pg_admin_url, services.dbname_of(settings_url),
                                       "livepush-listener") == 1
        await async_wait_for(lambda: asyncio.to_thread(
            lambda: [pid for pid, _ in listening_backends(settings_url) if pid != killed]), 10,
            message="the store's listener to LISTEN again on a new backend")
        await async_wait_for(lambda: served.server.store.listening, 10, message="the store to say it listens")
        await asyncio.to_thread(sessions.revoke, token)
        code, elapsed = await closed_within(client, asyncio.get_running_loop().time())
        assert code == CLOSE_REVOKED and elapsed < REVOCATION_DEADLINE
