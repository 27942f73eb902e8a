"""Session tokens (pure) and revocation stores, their doorbells included (against real Postgres and Redis)."""

from __future__ import annotations

import asyncio
import logging
import math
import os
import threading
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from datetime import timedelta

import psycopg
import pytest
import redis
from hypothesis import given
from hypothesis import strategies as st

import livepush
from livepush import blocking, sessions
from livepush.config import Settings, set_settings
from livepush.errors import ArgumentTypeError, ArgumentValueError, ConfigError, DependencyError, InvalidSession
from livepush.sessions import (
    MemoryRevocations,
    PostgresRevocations,
    RedisRevocations,
    Session,
    decode,
    tokens,
)
from tests.support.procs import forked_exit_status
from tests.test_fanout_conformance import PrivateRedis, private_redis  # noqa: F401  (a fixture)

SECRET = "s" * 32 + "-current"
OLD = "o" * 32 + "-previous"
OTHER = "x" * 32 + "-someone-else"


@pytest.fixture(autouse=True)
def settings() -> Iterator[Settings]:
    s = Settings(secret=SECRET)
    set_settings(s)
    sessions.set_default_store(None)
    sessions.MEMORY.clear()
    yield s
    set_settings(None)
    sessions.set_default_store(None)
    sessions.MEMORY.clear()


@pytest.fixture
def no_token_in_logs(caplog: pytest.LogCaptureFixture) -> Iterator[list[str]]:
    """Collects tokens a test handles; fails the test if any reached a log record."""
    caplog.set_level(logging.DEBUG)
    tokens: list[str] = []
    yield tokens
    # caplog.records is per phase: in teardown it would be empty, so ask for the call's.
    for record in caplog.get_records("setup") + caplog.get_records("call"):
        text = logging.Formatter().format(record)  # message and traceback
        for token in tokens:
            assert token not in text, "a session token reached the logs"


# -- tokens (pure) ----------------------------------------------------------------------


def test_issue_then_decode_round_trips() -> None:
    """A freshly issued token decodes to its subject, a random id and the right times."""
    before = time.time()
    token = sessions.issue("user-7", ttl=60)
    session = decode(token, (SECRET,))
    assert session.subject == "user-7"
    assert len(session.id) >= 20
    assert before - 0.001 <= session.issued_at <= time.time()
    assert session.expires_at == pytest.approx(session.issued_at + 60, abs=0.002)
    assert decode(sessions.issue("user-7"), SECRET).id != session.id


def test_token_is_url_safe_and_compact() -> None:
    """A token needs no escaping in a cookie or a query string and stays short."""
    token = sessions.issue("user-7")
    assert all(c.isalnum() or c in "-_." for c in token)
    assert len(token) < 160


def test_expired_token_is_refused_with_reason_expired(no_token_in_logs: list[str]) -> None:
    """A token past its expiry raises InvalidSession('expired') without echoing the token."""
    token = sessions.issue("user-7", ttl=10, now=1_000_000)
    no_token_in_logs.append(token)
    with pytest.raises(InvalidSession) as info:
        decode(token, (SECRET,), now=1_000_010)
    assert info.value.reason == "expired"
    assert token not in str(info.value)
    assert decode(token, (SECRET,), now=1_000_009.9).subject == "user-7"


@pytest.mark.parametrize("ttl", [0.0004, 0.5, 1, 86400])
def test_a_token_lives_its_whole_ttl(ttl: float) -> None:
    """Issued late in a millisecond, a token is still valid just before its ttl is over, and
    expired just after: its expiry is never cut down (a ttl under a millisecond would be born
    expired)."""
    issued_at = 1_000_000.9995
    token = sessions.issue("user-7", ttl=ttl, now=issued_at)
    assert decode(token, (SECRET,), now=issued_at + ttl - 0.00005).subject == "user-7"
    with pytest.raises(InvalidSession, match="expired"):
        decode(token, (SECRET,), now=issued_at + ttl + 0.002)


@pytest.mark.parametrize("where", ["payload", "signature"])
def test_tampered_token_is_refused(where: str) -> None:
    """Changing one character of the payload or the signature gives bad_signature."""
    token = sessions.issue("user-7")
    payload, _, sig = token.rpartition(".")
    if where == "payload":
        i = len(payload) // 2
        payload = payload[:i] + ("A" if payload[i] != "A" else "B") + payload[i + 1 :]
    else:
        sig = ("A" if sig[0] != "A" else "B") + sig[1:]
    with pytest.raises(InvalidSession) as info:
        decode(f"{payload}.{sig}", (SECRET,))
    assert info.value.reason == "bad_signature"


def test_token_of_another_secret_is_refused() -> None:
    """A token signed with a secret we do not know gives bad_signature."""
    set_settings(Settings(secret=OTHER))
    token = sessions.issue("user-7")
    with pytest.raises(InvalidSession) as info:
        decode(token, (SECRET,))
    assert info.value.reason == "bad_signature"


def test_fallback_secret_verifies_but_never_signs() -> None:
    """After rotation, tokens of the old secret still verify; new tokens use the new one."""
    set_settings(Settings(secret=OLD))
    old_token = sessions.issue("user-7")
    rotated = Settings(secret=SECRET, secret_fallbacks=(OLD,))
    set_settings(rotated)
    assert decode(old_token, rotated.secrets).subject == "user-7"
    new_token = sessions.issue("user-8")
    assert decode(new_token, (SECRET,)).subject == "user-8"  # signed with the new secret only
    with pytest.raises(InvalidSession):
        decode(new_token, (OLD,))
    with pytest.raises(InvalidSession) as info:
        decode(old_token, (SECRET,))  # once the fallback is dropped, old tokens die
    assert info.value.reason == "bad_signature"


@pytest.mark.parametrize(
    "garbage",
    ["", ".", "..", "a", "a.b", "a.b.c", "eyJ.", "." * 50, "null", "[1,2]", "a" * 4096, "=" * 10, "a b", "a\nb"],
)
def test_garbage_is_refused_cleanly(garbage: str) -> None:
    """Garbage gives InvalidSession (malformed or bad_signature), never another exception."""
    with pytest.raises(InvalidSession) as info:
        decode(garbage, (SECRET,))
    assert info.value.reason in ("malformed", "bad_signature")


@pytest.mark.parametrize("value", [None, 123, b"bytes", ["a"], {"a": 1}])
def test_non_strings_are_malformed(value: object) -> None:
    """Anything but a str is malformed."""
    with pytest.raises(InvalidSession) as info:
        decode(value, (SECRET,))
    assert info.value.reason == "malformed"


def test_huge_token_is_refused_without_parsing() -> None:
    """A 100 KB value is refused as malformed at once (no base64 or HMAC work); timed in this
    thread's CPU time, which a loaded machine that preempts the test does not add to."""
    token = sessions.issue("user-7")
    huge = token + "A" * 100_000
    started = time.thread_time()
    with pytest.raises(InvalidSession) as info:
        decode(huge, (SECRET,))
    assert info.value.reason == "malformed"
    assert time.thread_time() - started < 0.05
    assert "AAAA" not in str(info.value)


def test_non_ascii_token_is_malformed() -> None:
    """Non-ASCII characters are refused as malformed."""
    token = sessions.issue("user-7")
    with pytest.raises(InvalidSession) as info:
        decode(token[:-1] + "é", (SECRET,))
    assert info.value.reason == "malformed"


def test_unicode_subject_round_trips() -> None:
    """A subject may be any text up to 200 characters; the token stays ASCII."""
    token = sessions.issue("пользователь-7@example.com")
    assert token.isascii()
    assert decode(token, SECRET).subject == "пользователь-7@example.com"


def test_signed_but_unexpected_payload_is_malformed() -> None:
    """A payload with our signature but another shape (e.g. another salt's format) is malformed."""
    forged = tokens._serializer((SECRET,)).dumps({"sub": "user-7"})
    with pytest.raises(InvalidSession) as info:
        decode(forged, (SECRET,))
    assert info.value.reason == "malformed"


def test_signed_topic_is_not_a_session_token() -> None:
    """A signed topic (another salt) never verifies as a session token."""
    signed = livepush.sign_topic("user:7")
    with pytest.raises(InvalidSession):
        decode(signed, (SECRET,))


def test_no_secrets_means_bad_signature() -> None:
    """Without any secret configured, every token is refused with bad_signature."""
    token = sessions.issue("user-7")
    with pytest.raises(InvalidSession) as info:
        decode(token, ())
    assert info.value.reason == "bad_signature"


def test_an_empty_secret_verifies_nothing_and_a_secret_of_another_type_is_a_type_error() -> None:
    """decode() given an empty secret (os.environ.get("LIVEPUSH_SECRET", "") where the variable is
    missing) refuses every token as it does without secrets: an empty key is public, and a token
    anyone signed with it was accepted as any subject. An empty one beside a real secret is
    skipped; a secret that is not a str (bytes) raises ArgumentTypeError instead of a bare TypeError."""
    forged = tokens._encode("admin", 3600, [""])
    for secrets in ("", [""], ("", "")):
        with pytest.raises(InvalidSession) as info:
            decode(forged, secrets)
        assert info.value.reason == "bad_signature"
    with pytest.raises(InvalidSession):
        decode(forged, (SECRET, ""))
    assert decode(sessions.issue("user-7"), ("", SECRET)).subject == "user-7"
    for secrets in (SECRET.encode(), [SECRET.encode()]):
        with pytest.raises(ArgumentTypeError, match="bytes") as wrong:
            decode(forged, secrets)  # type: ignore[arg-type]
        assert SECRET not in str(wrong.value)


@pytest.mark.parametrize("secrets", [12345, Settings(secret=SECRET), object()])
def test_decode_given_secrets_that_are_neither_text_nor_a_list_of_text_says_what_it_takes(secrets: object) -> None:
    """decode(token, get_settings()) (the settings where their `.secrets` go), or a number, raises
    ArgumentTypeError naming the type and what decode() takes, not a bare "object is not
    iterable" from inside livepush; no secret shows in the message."""
    token = sessions.issue("user-7")
    with pytest.raises(ArgumentTypeError, match=rf"decode\(\) takes the secrets.*got {type(secrets).__name__}") as wrong:
        decode(token, secrets)  # type: ignore[arg-type]
    assert SECRET not in str(wrong.value)


@given(st.text(max_size=300))
def test_any_text_decodes_or_raises_invalid_session(text: str) -> None:
    """decode() of arbitrary text raises only InvalidSession."""
    try:
        decode(text, (SECRET,))
    except InvalidSession as exc:
        assert exc.reason in ("malformed", "bad_signature", "expired")


@pytest.mark.parametrize("subject", ["", "x" * 201, None, 7, "user\x007", "caf\udce9"])
def test_bad_subjects_are_refused(subject: object) -> None:
    """issue() wants a non-empty str of at most 200 characters, without NUL (a revocation
    stores it in Postgres)."""
    with pytest.raises(ArgumentValueError, match=r"issue\(\).*session subject"):
        sessions.issue(subject)  # type: ignore[arg-type]


@pytest.mark.parametrize("subject", [None, 7, ""])
def test_revoke_subject_names_itself_and_refuses_a_bad_subject_before_looking_for_a_store(subject: object) -> None:
    """A bad subject is the caller's mistake whatever the store: revoke_subject() names itself and
    the subject, even in a process with no shared store (which would otherwise be all it said)."""
    set_settings(Settings())
    with pytest.raises(ArgumentValueError, match=r"revoke_subject\(\).*session subject"):
        sessions.revoke_subject(subject)  # type: ignore[arg-type]


@pytest.mark.parametrize("ttl", [0, -1, float("nan"), float("inf"), 367 * 86400, "60", True])
def test_bad_ttls_are_refused(ttl: object) -> None:
    """issue() wants a positive, finite ttl of at most 366 days."""
    with pytest.raises(ArgumentValueError, match=r"issue\(ttl=\)"):
        sessions.issue("user-7", ttl=ttl)  # type: ignore[arg-type]


@pytest.mark.parametrize("ttl", ["60", True, None])
def test_a_ttl_that_is_no_number_says_what_it_takes(ttl: object) -> None:
    """A ttl that is neither a number of seconds nor a timedelta (text, a bool, None) is refused
    naming issue(ttl=) and what it takes."""
    with pytest.raises(ArgumentValueError, match=r"issue\(ttl=\) takes a number of seconds or a timedelta"):
        sessions.issue("user-7", ttl=ttl)  # type: ignore[arg-type]


def test_a_timedelta_ttl_issues_a_session_for_its_seconds() -> None:
    """issue(ttl=) takes a timedelta too, as every seconds argument of livepush does: the session
    lasts its seconds. It was refused, pointing at .total_seconds(), though the jobs API took one."""
    token = sessions.issue("user-7", ttl=timedelta(hours=1), now=1000.0)
    session = sessions.decode(token, [SECRET], now=4599.9)
    assert session.subject == "user-7" and session.expires_at == 4600.0


@pytest.mark.parametrize(("ttl", "says"), [(timedelta(0), "positive"), (timedelta(hours=-1), "positive"),
                                           (timedelta(days=367), "at most")])
def test_a_timedelta_ttl_is_checked_as_its_seconds(ttl: timedelta, says: str) -> None:
    """A zero, negative or over-366-days timedelta is refused as the same number of seconds is."""
    with pytest.raises(ArgumentValueError, match=rf"issue\(ttl=\).*{says}"):
        sessions.issue("user-7", ttl=ttl)


def test_issue_without_secret_is_a_config_error() -> None:
    """issue() without LIVEPUSH_SECRET raises ConfigError naming the setting."""
    set_settings(Settings())
    with pytest.raises(ConfigError, match="LIVEPUSH_SECRET"):
        sessions.issue("user-7")


# -- revocation stores (real Postgres and Redis) -----------------------------------------
# pg_url and redis_url come from tests/conftest.py (real servers started by bin/test). A store
# keeps revocations and rings a doorbell on each one (Postgres NOTIFY on livepush_revocations,
# Redis PUBLISH on P:revoked); a server watching the store (watch()) re-checks its sessions
# against the store on each ring.

STORE_KINDS = ["memory", "postgres", "redis"]
SHARED_KINDS = ["postgres", "redis"]
RING_WAIT = 5.0  # seconds: the bound on every wait for a ring


def make_store(kind: str, request: pytest.FixtureRequest) -> sessions.RevocationStore:
    if kind == "memory":
        return MemoryRevocations()
    if kind == "postgres":
        return PostgresRevocations(request.getfixturevalue("pg_url"))
    return RedisRevocations(request.getfixturevalue("redis_url"))


async def close_store(store: sessions.RevocationStore) -> None:
    await store.aclose()
    store.close()


@pytest.fixture(params=STORE_KINDS)
async def store(request: pytest.FixtureRequest) -> AsyncIterator[sessions.RevocationStore]:
    """Every kind of store, written through its own methods."""
    s = make_store(request.param, request)
    yield s
    await close_store(s)


@pytest.fixture(params=SHARED_KINDS)
async def shared_store(request: pytest.FixtureRequest) -> AsyncIterator[sessions.RevocationStore]:
    """The stores revoke() accepts: those other processes see."""
    s = make_store(request.param, request)
    yield s
    await close_store(s)


class Rings:
    """What a server watching the store hears: each ring, and what the store held when it came."""

    def __init__(self, store: sessions.RevocationStore) -> None:
        self.store = store
        self.count = 0
        self._rung = asyncio.Event()

    def __call__(self) -> None:
        self.count += 1
        self._rung.set()

    async def next(self) -> None:
        """Until the next ring (at most RING_WAIT seconds)."""
        try:
            await asyncio.wait_for(self._rung.wait(), RING_WAIT)
        except TimeoutError:
            raise AssertionError(f"the store did not ring within {RING_WAIT} s") from None
        self._rung.clear()


@pytest.fixture
async def rings(request: pytest.FixtureRequest) -> AsyncIterator[Callable[[sessions.RevocationStore], Awaitable[Rings]]]:
    """rings(store) -> the rings a server watching `store` hears: another store on the same
    database or Redis (as in a server process), or the memory store itself (one process)."""
    watchers: list[sessions.RevocationStore] = []

    async def watch(store: sessions.RevocationStore) -> Rings:
        if isinstance(store, MemoryRevocations):
            peer: sessions.RevocationStore = store
        elif isinstance(store, PostgresRevocations):
            peer = PostgresRevocations(store.url)
            watchers.append(peer)
        else:
            assert isinstance(store, RedisRevocations)
            peer = RedisRevocations(store.url, prefix=store.prefix)
            watchers.append(peer)
        heard = Rings(peer)
        await peer.watch(heard)
        return heard

    yield watch
    for peer in watchers:
        await close_store(peer)


async def test_every_store_rings_its_watchers_once_the_revocation_is_readable(
    store: sessions.RevocationStore, rings: Callable[[sessions.RevocationStore], Awaitable[Rings]]
) -> None:
    """Each write rings every watcher, and a watcher that re-checks on the ring already finds the revocation."""
    heard = await rings(store)
    s = decode(sessions.issue("user-7"), SECRET)
    t = decode(sessions.issue("user-8", now=time.time() - 5), SECRET)
    await store.aadd_session(s.id, s.expires_at)
    await heard.next()
    assert await heard.store.revoked_among([s, t]) == {s.id}, "the ring comes after the write is visible"
    await asyncio.to_thread(store.add_subject, "user-8", time.time())
    await heard.next()
    assert await heard.store.revoked_among([s, t]) == {s.id, t.id}


@pytest.mark.parametrize("kind", SHARED_KINDS)
async def test_a_shared_stores_canary_ring_is_heard_by_its_watchers_as_a_canary_and_re_checks_nothing(
        kind: str, request: pytest.FixtureRequest) -> None:
    """A server's readiness rings the store's channel with "canary TOKEN" (`ring_canary`), in
    Postgres and in Redis alike: a watcher that asked for canaries hears the token; neither it nor
    a watcher that did not ask counts the ring as a revocation, so no server re-checks its
    sessions for it. A revocation after it still rings both."""
    ringer, asked, other = (make_store(kind, request) for _ in range(3))
    tokens: asyncio.Queue[str] = asyncio.Queue()
    revoked, unasked = Rings(asked), Rings(other)
    try:
        await asyncio.gather(asked.watch(revoked, on_canary=tokens.put_nowait), other.watch(unasked))
        await ringer.ring_canary("a1b2-7")
        assert await asyncio.wait_for(tokens.get(), RING_WAIT) == "a1b2-7"
        s = decode(sessions.issue("user-7"), SECRET)
        await ringer.aadd_session(s.id, s.expires_at)
        await revoked.next()
        await unasked.next()
        assert (revoked.count, unasked.count) == (1, 1), "the canary ring counted as a revocation"
    finally:
        for store in (ringer, asked, other):
            await close_store(store)


async def test_revoke_token_revokes_that_session_only(
    shared_store: sessions.RevocationStore,
    rings: Callable[[sessions.RevocationStore], Awaitable[Rings]],
    no_token_in_logs: list[str],
) -> None:
    """revoke(token) marks that session revoked, not others of the same subject, and rings every server."""
    heard = await rings(shared_store)
    token, other = sessions.issue("user-7"), sessions.issue("user-7")
    no_token_in_logs += [token, other]
    s, o = decode(token, SECRET), decode(other, SECRET)
    assert not await shared_store.is_revoked(s)
    assert sessions.revoke(token, store=shared_store) == s
    await heard.next()
    assert await heard.store.revoked_among([s, o]) == {s.id}
    assert await shared_store.is_revoked(s)
    assert not await shared_store.is_revoked(o)


@pytest.mark.parametrize("call", ["revoke", "arevoke"])
async def test_a_revocation_outlives_its_token_on_this_hosts_clock_by_the_clock_allowance(
    shared_store: sessions.RevocationStore, call: str
) -> None:
    """Each server checks a token's expiry on its own clock: one whose clock lags this host's, or
    the store's, still takes a token this host sees as expired. Revoked, such a token stays
    revoked, pruned or not, for sessions.CLOCK_ALLOWANCE past its expiry here."""
    lag = 30.0
    s = tokens.loads(sessions.issue("user-7", ttl=60, now=time.time() - 60 - lag), SECRET)
    if call == "revoke":
        await asyncio.to_thread(sessions.revoke, s, store=shared_store)
    else:
        await sessions.arevoke(s, store=shared_store)
    await shared_store.prune()
    assert await shared_store.revoked_among([s]) == {s.id}
    assert sessions.CLOCK_ALLOWANCE > lag


@pytest.mark.parametrize("call", ["revoke_subject", "arevoke_subject"])
async def test_a_subject_revocation_outlives_the_sessions_it_covers_by_the_clock_allowance(
    shared_store: sessions.RevocationStore, call: str
) -> None:
    """The longest session a subject revocation covers, issued at its cut-off, expires MAX_TTL
    after it; a server whose clock lags this host's, or the store's, still takes that token for as
    long as it lags. The revocation is kept, pruned or not, for sessions.CLOCK_ALLOWANCE past it,
    as a session revocation is past its token."""
    lag = 30.0
    cutoff = time.time() - sessions.MAX_TTL - lag
    s = tokens.loads(sessions.issue("user-7", ttl=sessions.MAX_TTL, now=cutoff), SECRET)
    assert not s.expired(now=time.time() - 2 * lag)  # what a server two lags behind sees
    if call == "revoke_subject":
        await asyncio.to_thread(sessions.revoke_subject, "user-7", store=shared_store, now=cutoff)
    else:
        await sessions.arevoke_subject("user-7", store=shared_store, now=cutoff)
    await shared_store.prune()
    assert await shared_store.revoked_among([s]) == {s.id}
    assert sessions.CLOCK_ALLOWANCE > 2 * lag
    if isinstance(shared_store, RedisRevocations):
        # Redis counts the key's lifetime down from when it was written, not from the cut-off:
        # one written at its cut-off must outlive the longest session it covers by the allowance.
        await sessions.arevoke_subject("user-8", store=shared_store)
        with redis.Redis.from_url(shared_store.url) as client:
            left = client.pttl(shared_store.subject_prefix + "user-8") / 1000
        assert left > sessions.MAX_TTL + sessions.CLOCK_ALLOWANCE - 10


@pytest.mark.parametrize("call", ["revoke", "arevoke", "revoke_subject", "arevoke_subject"])
async def test_a_revocation_waiting_on_a_lock_of_its_table_fails_within_the_bound_revoking_nothing(
    pg_url: str, call: str
) -> None:
    """A migration (or any session) holding a revocation table's lock held revoke() until it let
    go: a sign-out hung for as long. Past READ_TIMEOUT the write gives up with DependencyError
    saying nothing was revoked, as for a store that cannot be reached, and can be tried again."""
    from livepush.sessions.revocations import READ_TIMEOUT

    store = PostgresRevocations(pg_url)
    s = decode(sessions.issue("user-lock"), SECRET)
    table = "livepush_revoked_subjects" if call.endswith("subject") else "livepush_revoked_sessions"
    try:
        with psycopg.connect(pg_url) as holder:
            holder.execute(f"LOCK TABLE {table} IN ACCESS EXCLUSIVE MODE")  # type: ignore[arg-type]
            started = time.monotonic()
            with pytest.raises(DependencyError, match="nothing was revoked"):
                if call == "revoke":
                    await asyncio.to_thread(sessions.revoke, s, store=store)
                elif call == "arevoke":
                    await sessions.arevoke(s, store=store)
                elif call == "revoke_subject":
                    await asyncio.to_thread(sessions.revoke_subject, "user-lock", store=store)
                else:
                    await sessions.arevoke_subject("user-lock", store=store)
            assert time.monotonic() - started < READ_TIMEOUT + 3
        assert await store.revoked_among([s]) == set()
        await sessions.arevoke(s, store=store)  # the lock gone, the same revocation goes through
        assert await store.revoked_among([s]) == {s.id}
    finally:
        await close_store(store)


async def test_arevoke_subject_cuts_off_at_revocation_time(
    shared_store: sessions.RevocationStore, rings: Callable[[sessions.RevocationStore], Awaitable[Rings]]
) -> None:
    """revoke_subject revokes sessions issued up to now, not later ones nor other subjects, and rings every server."""
    heard = await rings(shared_store)
    t = time.time()
    old = decode(sessions.issue("user-7", now=t - 5), SECRET)
    same_ms = decode(sessions.issue("user-7", now=t), SECRET)
    later = decode(sessions.issue("user-7", now=t + 0.002), SECRET)
    stranger = decode(sessions.issue("user-8", now=t - 5), SECRET)
    before = await sessions.arevoke_subject("user-7", store=shared_store, now=t)
    assert before == pytest.approx(t, abs=0.001)
    await heard.next()
    assert await heard.store.revoked_among([old, same_ms, later, stranger]) == {old.id, same_ms.id}


@pytest.mark.parametrize("call", ["revoke_subject", "arevoke_subject"])
async def test_a_session_issued_the_millisecond_after_a_subject_revocation_is_unaffected(
    shared_store: sessions.RevocationStore, call: str
) -> None:
    """Only a session issued in the revocation's own millisecond counts as revoked: one issued in
    the next millisecond (a user signing in again at once) is not, wherever in its millisecond
    the revocation fell."""
    t = math.floor(time.time()) + 0.0006  # late in its millisecond
    same_ms = decode(sessions.issue("user-7", now=t + 0.0002), SECRET)
    next_ms = decode(sessions.issue("user-7", now=t + 0.0007), SECRET)
    if call == "revoke_subject":
        sessions.revoke_subject("user-7", store=shared_store, now=t)
    else:
        await sessions.arevoke_subject("user-7", store=shared_store, now=t)
    assert await shared_store.revoked_among([same_ms, next_ms]) == {same_ms.id}


@pytest.mark.parametrize("call", ["revoke_subject", "arevoke_subject"])
async def test_a_session_issued_once_revoke_subject_has_returned_is_unaffected(
    shared_store: sessions.RevocationStore, call: str
) -> None:
    """Sessions issued afterwards are unaffected: a token issued once revoke_subject() has
    returned (sign out everywhere, then sign this device in again, in one request) is never
    revoked, however soon after the revocation's own millisecond it comes."""
    for i in range(50):  # a store answers well within a millisecond: some rounds share one
        subject = f"user-again-{i}"
        if call == "revoke_subject":
            sessions.revoke_subject(subject, store=shared_store)
        else:
            await sessions.arevoke_subject(subject, store=shared_store)
        again = decode(sessions.issue(subject), SECRET)
        assert not await shared_store.is_revoked(again), f"round {i}: the new session counts as revoked"


async def test_sync_and_async_writes_agree(shared_store: sessions.RevocationStore) -> None:
    """revoke/arevoke and revoke_subject/arevoke_subject store the same thing, idempotently."""
    a, b = decode(sessions.issue("a"), SECRET), decode(sessions.issue("b"), SECRET)
    await sessions.arevoke(a, store=shared_store)
    sessions.revoke(a, store=shared_store)  # twice is fine
    sessions.revoke_subject("b", store=shared_store)
    await sessions.arevoke_subject("b", store=shared_store)
    assert await shared_store.revoked_among([a, b]) == {a.id, b.id}


@pytest.mark.parametrize("kind", SHARED_KINDS)
def test_arevoke_works_from_one_event_loop_after_another(kind: str, request: pytest.FixtureRequest) -> None:
    """Web code that is sync at heart runs each async call on a loop of its own (asyncio.run,
    async_to_sync): the process's one store revokes on every one of them, not only the first."""
    store = make_store(kind, request)
    a, b = decode(sessions.issue("a"), SECRET), decode(sessions.issue("b"), SECRET)
    asyncio.run(sessions.arevoke(a, store=store))
    asyncio.run(sessions.arevoke(b, store=store))  # the first loop is closed by now

    async def revoked_then_close() -> set[str]:
        try:
            return await store.revoked_among([a, b])
        finally:
            await close_store(store)

    assert asyncio.run(revoked_then_close()) == {a.id, b.id}


async def test_later_subject_revocation_wins(store: sessions.RevocationStore) -> None:
    """Two subject revocations arriving out of order keep the later cut-off."""
    t = time.time()
    s = decode(sessions.issue("user-7", now=t - 1), SECRET)
    store.add_subject("user-7", t)
    await store.aadd_subject("user-7", t - 10)  # an older revocation arriving late
    assert await store.is_revoked(s)


async def test_revoked_among_handles_big_batches(store: sessions.RevocationStore) -> None:
    """The periodic re-check asks about thousands of sessions in one call."""
    batch = [decode(sessions.issue(f"user-{i % 50}"), SECRET) for i in range(2500)]
    store.add_session(batch[7].id, batch[7].expires_at)
    store.add_subject("user-3", time.time())
    expected = {batch[7].id} | {s.id for s in batch if s.subject == "user-3"}
    assert await store.revoked_among(batch) == expected
    assert await store.revoked_among([]) == set()


async def test_revoking_a_bad_token_raises_and_stores_nothing(
    shared_store: sessions.RevocationStore, monkeypatch: pytest.MonkeyPatch, no_token_in_logs: list[str]
) -> None:
    """revoke() of a forged token raises InvalidSession before the store is written (nothing kept, nothing rung)."""
    set_settings(Settings(secret=OTHER))
    forged = sessions.issue("user-7")
    no_token_in_logs.append(forged)
    set_settings(Settings(secret=SECRET))
    writes: list[str] = []
    for name in ("add_session", "aadd_session", "add_subject", "aadd_subject"):
        monkeypatch.setattr(shared_store, name, lambda *args, _name=name, **kw: writes.append(_name))
    with pytest.raises(InvalidSession):
        sessions.revoke(forged, store=shared_store)
    with pytest.raises(InvalidSession):
        await sessions.arevoke(forged, store=shared_store)
    assert writes == [], "a write is what rings: none may happen"
    assert not await shared_store.is_revoked(tokens.loads(forged, OTHER))


async def test_revoking_without_a_secret_is_a_config_error_not_a_bad_token(
    shared_store: sessions.RevocationStore, monkeypatch: pytest.MonkeyPatch, no_token_in_logs: list[str]
) -> None:
    """revoke() in a process without LIVEPUSH_SECRET raises ConfigError naming the setting, not
    InvalidSession, which sign-out code skips as a stale cookie; and it stores nothing."""
    token = sessions.issue("user-7")
    no_token_in_logs.append(token)
    set_settings(Settings())
    writes: list[str] = []
    for name in ("add_session", "aadd_session"):
        monkeypatch.setattr(shared_store, name, lambda *args, _name=name, **kw: writes.append(_name))
    with pytest.raises(ConfigError, match="LIVEPUSH_SECRET"):
        sessions.revoke(token, store=shared_store)
    with pytest.raises(ConfigError, match="LIVEPUSH_SECRET"):
        await sessions.arevoke(token, store=shared_store)
    assert writes == []


async def test_revoking_a_token_given_as_bytes_or_another_type_is_a_type_error_not_a_bad_token(
    shared_store: sessions.RevocationStore, monkeypatch: pytest.MonkeyPatch, no_token_in_logs: list[str]
) -> None:
    """revoke() of a token as bytes (read back from Redis, a raw header) or of a value that is no
    token at all (a user id meant for revoke_subject()) raises ArgumentTypeError naming the type,
    not InvalidSession, which sign-out code skips as a stale cookie while the session stays open;
    and it stores nothing. None (no cookie) is still nothing to revoke: InvalidSession."""
    token = sessions.issue("user-7")
    no_token_in_logs.append(token)
    writes: list[str] = []
    for name in ("add_session", "aadd_session"):
        monkeypatch.setattr(shared_store, name, lambda *args, _name=name, **kw: writes.append(_name))
    for wrong, hint in ((token.encode(), "decode"), (bytearray(token.encode()), "decode"), (7, "revoke_subject")):
        with pytest.raises(ArgumentTypeError, match=hint) as info:
            sessions.revoke(wrong, store=shared_store)  # type: ignore[arg-type]
        assert token not in str(info.value)
        with pytest.raises(ArgumentTypeError, match=hint):
            await sessions.arevoke(wrong, store=shared_store)  # type: ignore[arg-type]
    with pytest.raises(InvalidSession):
        sessions.revoke(None, store=shared_store)  # type: ignore[arg-type]
    assert writes == []


async def test_expired_token_can_still_be_revoked(
    shared_store: sessions.RevocationStore, rings: Callable[[sessions.RevocationStore], Awaitable[Rings]]
) -> None:
    """Revoking an expired token rings every server without error, so its still-open connections close now."""
    heard = await rings(shared_store)
    token = sessions.issue("user-7", ttl=1, now=time.time() - 10)
    s = sessions.revoke(token, store=shared_store)
    assert s.expired()
    await heard.next()


@pytest.mark.parametrize("call", ["revoke", "arevoke", "revoke_subject", "arevoke_subject"])
async def test_revoking_with_the_memory_store_is_a_config_error_naming_the_fix(call: str) -> None:
    """Without a database or Redis, revoke*() raise ConfigError saying revocation needs a shared store (the setting to set), and keep nothing."""
    assert sessions.default_store() is sessions.MEMORY  # the settings name neither
    token = sessions.issue("user-7")
    argument = token if call in ("revoke", "arevoke") else "user-7"
    for store in (None, MemoryRevocations()):
        with pytest.raises(ConfigError) as info:
            result = getattr(sessions, call)(argument, store=store)
            if asyncio.iscoroutine(result):
                await result
        text = str(info.value)
        assert "shared store" in text and "LIVEPUSH_DATABASE_URL" in text and "LIVEPUSH_REDIS_URL" in text, text
        assert token not in text
    assert not await sessions.MEMORY.is_revoked(decode(token, SECRET))


@pytest.mark.parametrize("call", ["revoke", "arevoke", "revoke_subject", "arevoke_subject"])
async def test_a_store_argument_that_is_no_revocation_store_is_a_type_error_naming_it(call: str, redis_url: str) -> None:
    """revoke*(..., store=URL) (the URL where the store made from it goes) raises ArgumentTypeError
    naming the call, `store=` and what it takes, not an AttributeError from inside livepush."""
    token = sessions.issue("user-7")
    argument = token if call in ("revoke", "arevoke") else "user-7"
    for store in (redis_url, "postgres"):
        with pytest.raises(ArgumentTypeError, match=rf"{call}\(store=\) takes a RevocationStore.*got str") as info:
            result = getattr(sessions, call)(argument, store=store)
            if asyncio.iscoroutine(result):
                await result
        assert token not in str(info.value)
    with pytest.raises(ArgumentTypeError, match=r"set_default_store\(\) takes a RevocationStore.*got str"):
        sessions.set_default_store(redis_url)  # type: ignore[arg-type]
    assert sessions.default_store() is sessions.MEMORY


async def test_postgres_rows_are_pruned_after_expiry(pg_url: str) -> None:
    """Revoked sessions past their expiry are deleted by prune() (and by later writes)."""
    store = PostgresRevocations(pg_url)
    try:
        await store.aadd_session("dead", time.time() - 1)
        await store.aadd_session("alive", time.time() + 3600)
        store.add_subject("old-subject", time.time() - sessions.MAX_TTL - sessions.CLOCK_ALLOWANCE - 1)
        await store.prune()
        with psycopg.connect(pg_url) as conn:
            rows = conn.execute("SELECT session_id FROM livepush_revoked_sessions").fetchall()
            subjects = conn.execute("SELECT subject FROM livepush_revoked_subjects").fetchall()
        assert rows == [("alive",)]
        assert subjects == []
    finally:
        await store.aclose()


async def test_redis_keys_expire_with_the_session(redis_url: str) -> None:
    """A revoked session's Redis key (under the deployment's prefix) lives as long as the session; an expired one is not stored."""
    store = RedisRevocations(redis_url)
    try:
        assert store.session_prefix == "{livepush:0}:revoked:session:"
        assert store.subject_prefix == "{livepush:0}:revoked:subject:"
        await store.aadd_session("s1", time.time() + 100)
        store.add_session("s2", time.time() - 1)
        store.add_subject("user-7", time.time())
        with redis.Redis.from_url(redis_url) as client:
            assert 98_000 <= client.pttl(store.session_prefix + "s1") <= 100_000
            assert not client.exists(store.session_prefix + "s2")
            assert client.pttl(store.subject_prefix + "user-7") > (sessions.MAX_TTL - 10) * 1000
    finally:
        await store.aclose()


async def test_a_redis_subject_key_holding_no_cut_off_revokes_that_subject_and_holds_up_no_other_check(
        redis_url: str, caplog: pytest.LogCaptureFixture) -> None:
    """Something else wrote text that is no cut-off under a subject's revocation key. Read as a
    number it raised ValueError out of every check that met the subject: the server's re-check of
    all its sessions failed for good, so no revocation took effect there any more. The key is a
    revocation whose extent is unknown: every session of the subject counts as revoked (nothing
    is let in that a revocation may cover), the other sessions are checked as usual, and a
    revoke_subject() writes a cut-off over it."""
    store = RedisRevocations(redis_url)
    subject, other = f"user-{uuid.uuid4().hex[:8]}", f"user-{uuid.uuid4().hex[:8]}"
    now = time.time()
    covered, untouched, revoked = (Session(f"s-{uuid.uuid4().hex[:8]}", who, now + 60, now)
                                   for who in (subject, other, other))
    try:
        await store.aadd_session(revoked.id, revoked.expires_at)
        with redis.Redis.from_url(redis_url) as client:
            client.set(store.subject_prefix + subject, "not-a-cut-off", px=60_000)
            with caplog.at_level(logging.WARNING, logger="livepush.sessions"):
                assert await store.revoked_among([covered, untouched, revoked]) == {covered.id, revoked.id}
            assert any(subject in r.getMessage() and "not a cut-off" in r.getMessage() for r in caplog.records)
            await store.aadd_subject(subject, now - 10)
            assert client.get(store.subject_prefix + subject) == str(sessions.revocations.ms(now - 10)).encode()
    finally:
        with redis.Redis.from_url(redis_url) as client:
            client.delete(store.subject_prefix + subject, store.session_prefix + revoked.id)
        await store.aclose()


# Ways something else writing under the prefix leaves a key of another type than the store's text.
_OTHER_TYPES: dict[str, Callable[[redis.Redis, str], object]] = {
    "hash": lambda client, key: client.hset(key, "cut", "1"),
    "list": lambda client, key: client.rpush(key, "1"),
    "set": lambda client, key: client.sadd(key, "1"),
    "stream": lambda client, key: client.xadd(key, {"cut": "1"}),
}


@pytest.mark.parametrize("kind", sorted(_OTHER_TYPES))
async def test_a_redis_revocation_key_of_another_type_revokes_what_it_names_with_a_warning_naming_it(
        redis_url: str, kind: str, caplog: pytest.LogCaptureFixture) -> None:
    """Something else overwrote a subject's (or a session's) revocation key with a hash, a list, a
    set or a stream. MGET answers nil for a key that holds no text, so the revocation read as
    absent and every session of the subject was let in again, where a key of text that is no
    cut-off already revoked them all. Another type fails closed the same way, with the same
    warning naming the key; the other sessions are checked as usual, in one read as before."""
    store = RedisRevocations(redis_url)
    subject, other = f"user-{uuid.uuid4().hex[:8]}", f"user-{uuid.uuid4().hex[:8]}"
    now = time.time()
    covered, untouched, overwritten = (Session(f"s-{uuid.uuid4().hex[:8]}", who, now + 60, now)
                                       for who in (subject, other, other))
    keys = [store.subject_prefix + subject, store.session_prefix + overwritten.id]
    try:
        with redis.Redis.from_url(redis_url) as client:
            for key in keys:
                _OTHER_TYPES[kind](client, key)
            with caplog.at_level(logging.WARNING, logger="livepush.sessions"):
                assert await store.revoked_among([covered, untouched, overwritten]) == {covered.id, overwritten.id}
                assert await store.is_revoked(covered) and not await store.is_revoked(untouched)
            said = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
            for key in keys:
                assert any(repr(key) in line and "another type" in line for line in said), said
    finally:
        with redis.Redis.from_url(redis_url) as client:
            client.delete(*keys)
        await store.aclose()


def test_redis_revocations_on_two_live_event_loops_keep_one_connection_each(private_redis: PrivateRedis) -> None:
    """Revoking and checking from two event loops that both stay alive (a web app's and a worker
    thread's) keep a Redis connection per loop: taking turns opens no new one each time. (One
    thread runs both loops, so the turns are certain.)"""
    store = RedisRevocations(private_redis.url)
    loops = [asyncio.new_event_loop() for _ in range(2)]
    admin = redis.Redis.from_url(private_redis.url)
    try:
        before = int(admin.info("stats")["total_connections_received"])
        for i in range(20):
            loop = loops[i % 2]
            loop.run_until_complete(store.aadd_session(f"turn-{i}", time.time() + 60))
            session = Session(f"turn-{i}", "user-7", time.time() + 60, time.time())
            assert loop.run_until_complete(store.is_revoked(session))
        opened = int(admin.info("stats")["total_connections_received"]) - before
        assert opened == 2, f"40 calls taking turns on two loops opened {opened} connections"
    finally:
        for loop in loops:
            loop.run_until_complete(store.aclose())
            loop.close()
        admin.close()


def test_a_forked_child_dropping_its_redis_store_leaves_the_parents_connection_working(
        private_redis: PrivateRedis) -> None:
    """A child forked while the parent's event loop held a Redis client of the store (a server's
    master that forks its workers) drops the store and collects it. The client it inherited is
    never closed there: closing it in the child would take the parent's socket out of the epoll
    the two processes share, and the parent's next call would never hear its answer."""
    import gc

    store = RedisRevocations(private_redis.url)
    loop = asyncio.new_event_loop()
    try:
        loop.run_until_complete(store.aadd_session("before-fork", time.time() + 60))
        pid = os.fork()
        if pid == 0:  # the child: its exit status is its verdict, and it never returns into pytest
            status = 1
            try:
                store._clients.forget()  # as aclose() leaves it
                gc.collect()
                status = 0
            finally:
                os._exit(status)
        assert forked_exit_status(pid, 10) == 0
        session = Session("before-fork", "user-7", time.time() + 60, time.time())
        assert loop.run_until_complete(asyncio.wait_for(store.is_revoked(session), 5))
    finally:
        loop.run_until_complete(store.aclose())
        loop.close()


async def test_unreachable_stores_raise_dependency_error() -> None:
    """A store whose server is down raises DependencyError naming the setting, not a driver error."""
    pg = PostgresRevocations("postgresql://postgres@127.0.0.1:55469/nothing")
    rd = RedisRevocations("redis://:hunter2@127.0.0.1:56469/0")
    s = Session("x", "user-7", time.time() + 60, time.time())
    with pytest.raises(DependencyError, match="LIVEPUSH_DATABASE_URL"):
        await pg.is_revoked(s)
    with pytest.raises(DependencyError, match="LIVEPUSH_DATABASE_URL"):
        pg.add_session("x", time.time() + 60)
    with pytest.raises(DependencyError, match="LIVEPUSH_REDIS_URL") as info:
        await rd.is_revoked(s)
    assert "hunter2" not in str(info.value)
    with pytest.raises(DependencyError, match="LIVEPUSH_REDIS_URL"):
        rd.add_subject("user-7", time.time())
    await pg.aclose()
    await rd.aclose()


def test_threads_revoking_first_at_once_share_one_store(monkeypatch: pytest.MonkeyPatch) -> None:
    """revoke() may be called from any thread: threads that make the first call together get
    one store between them, never one each (an overwritten one would keep its connections open)."""
    threads = 8
    made: list[sessions.RevocationStore] = []
    all_in = threading.Event()

    def make_store(settings: Settings) -> sessions.RevocationStore:
        made.append(MemoryRevocations())
        if len(made) == threads:
            all_in.set()
        all_in.wait(1.0)  # holds the door open for every thread that can come in at once
        return made[-1]

    monkeypatch.setattr(sessions, "store_from_settings", make_store)
    start = threading.Barrier(threads)
    got: list[sessions.RevocationStore] = []

    def first_call() -> None:
        start.wait(5)
        got.append(sessions.default_store())

    workers = [threading.Thread(target=first_call) for _ in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join(10)
    assert len(got) == threads
    assert len(made) == 1 and {id(s) for s in got} == {id(made[0])}


def test_a_child_forked_while_the_store_was_being_made_can_still_revoke() -> None:
    """A process forked while one of its threads made the default store (held its lock) gets a
    store of its own at its first call: it does not wait for a thread it does not have."""
    child_made_one = 3
    with sessions._default_lock:
        pid = os.fork()
        if pid == 0:  # the child: one thread, and the lock as the parent held it
            try:
                os._exit(child_made_one if sessions.default_store() is not None else 1)
            finally:
                os._exit(1)
    assert forked_exit_status(pid, 10) == child_made_one  # a child that waits for the parent's lock is killed


def test_store_from_settings_prefers_postgres_then_redis_then_memory() -> None:
    """The store follows the configured URLs: database, else Redis, else this process's memory."""
    pg = sessions.store_from_settings(Settings(database_url="postgresql:///x", redis_url="redis://r"))
    rd = sessions.store_from_settings(Settings(redis_url="redis://r"))
    assert isinstance(pg, PostgresRevocations)
    assert isinstance(rd, RedisRevocations)
    assert sessions.store_from_settings(Settings()) is sessions.MEMORY
    assert sessions.default_store() is sessions.MEMORY


async def test_a_postgres_revocation_that_raises_revoked_nothing(pg_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each write to the Postgres store also prunes dead rows. A revocation whose connection dies
    before it commits raises DependencyError, and nothing was revoked (as the docs say), async as
    sync: the caller may simply try again."""
    from livepush.sessions import revocations

    store = PostgresRevocations(pg_url)
    s = Session("dies-before-commit", "user-7", time.time() + 60, time.time())
    try:
        monkeypatch.setattr(revocations, "_PG_PRUNE", "SELECT pg_terminate_backend(pg_backend_pid())")
        with pytest.raises(DependencyError):
            store.add_session(s.id, s.expires_at)
        monkeypatch.undo()
        assert not await store.is_revoked(s), "sync"
        monkeypatch.setattr(revocations, "_PG_PRUNE", "SELECT pg_terminate_backend(pg_backend_pid())")
        with pytest.raises(DependencyError):
            await store.aadd_session(s.id, s.expires_at)
        monkeypatch.undo()
        assert not await store.is_revoked(s), "async"
        monkeypatch.setattr(revocations, "_PG_PRUNE", "SELECT pg_terminate_backend(pg_backend_pid())")
        with pytest.raises(DependencyError):
            await store.aadd_subject(s.subject, time.time())
        monkeypatch.undo()
        assert not await store.is_revoked(s), "async subject"
    finally:
        await close_store(store)


async def test_a_sync_revoke_on_a_running_loop_warns_once_a_call_naming_its_async_twin(
    shared_store: sessions.RevocationStore, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """revoke() and revoke_subject() in an async view (a sign-out) hold the loop for the store's
    round trip: each warns once, naming `await sessions.arevoke()` or `arevoke_subject()`; through
    asyncio.to_thread() neither says anything."""
    monkeypatch.setattr(blocking, "_said", set())  # this process may have warned already
    caplog.set_level(logging.WARNING, logger="livepush")
    await asyncio.to_thread(sessions.revoke, sessions.issue("user-8"), store=shared_store)
    await asyncio.to_thread(sessions.revoke_subject, "user-8", store=shared_store)
    for _ in range(2):
        sessions.revoke(sessions.issue("user-9"), store=shared_store)
        sessions.revoke_subject("user-9", store=shared_store)
    said = [r.getMessage() for r in caplog.records if "event loop" in r.getMessage()]
    assert len(said) == 2, said
    assert "livepush.sessions.revoke()" in said[0] and "await livepush.sessions.arevoke()" in said[0], said
    assert "await livepush.sessions.arevoke_subject()" in said[1], said
    assert "test_sessions.py" in said[0], said
