"""The handshake's pure decisions: token extraction, Origin checks, authenticate()."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterable, Iterator

import pytest
from websockets.datastructures import Headers

from livepush import sessions
from livepush.config import Settings, set_settings
from livepush.errors import DependencyError
from livepush.sessions import MemoryRevocations, RevocationStore, Session
from livepush.sessions.handshake import authenticate, extract_tokens, origin_allowed

SECRET = "s" * 32 + "-current"
OLD = "o" * 32 + "-previous"
OTHER = "x" * 32 + "-someone-else"


@pytest.fixture(autouse=True)
def settings() -> Iterator[None]:
    set_settings(Settings(secret=SECRET, secret_fallbacks=(OLD,)))
    yield
    set_settings(None)


# -- extract_tokens ---------------------------------------------------------------------


def extract_token(headers: object, path: str) -> str | None:
    """The token a handshake's sources offer first."""
    found = extract_tokens(headers, path)  # type: ignore[arg-type]
    return found[0] if found else None


def test_token_from_cookie() -> None:
    """The livepush_session cookie is found among other cookies."""
    headers = {"Cookie": "theme=dark; livepush_session=abc.def; other=1"}
    assert extract_token(headers, "/") == "abc.def"


def test_token_from_query() -> None:
    """The token query parameter is used when there is no cookie."""
    assert extract_token({}, "/ws?since=1&token=abc.def") == "abc.def"
    assert extract_token({}, "/ws?token=abc%2Edef") == "abc.def"


def test_a_token_passed_explicitly_comes_before_the_cookie() -> None:
    """The sources in the order they count: the subprotocol's token, the query's, then the cookie's
    (ambient: the browser sends whatever cookie the domain holds, one a sibling subdomain planted too)."""
    headers = {"cookie": "livepush_session=from-cookie", "Sec-WebSocket-Protocol": "livepush, livepush.token.from-protocol"}
    assert extract_tokens(headers, "/?token=from-query") == ["from-protocol", "from-query", "from-cookie"]
    assert extract_token({"cookie": "livepush_session=from-cookie"}, "/?token=from-query") == "from-query"


def test_no_token() -> None:
    """No cookie, no parameter, or empty values: None."""
    assert extract_token({}, "/") is None
    assert extract_token({"Cookie": "livepush_session=; a=b"}, "/?token=") is None
    assert extract_token({"Cookie": "livepush_sessionx=abc"}, "/?tokens=abc") is None
    assert extract_token({}, "") is None


def test_empty_cookie_falls_back_to_query() -> None:
    """An empty cookie value does not hide a query token."""
    assert extract_token({"Cookie": "livepush_session="}, "/?token=q") == "q"


def test_quoted_cookie_and_repeated_headers() -> None:
    """A quoted cookie value is unquoted; a second Cookie header is searched too."""
    assert extract_token({"Cookie": 'livepush_session="abc"'}, "/") == "abc"
    headers = Headers([("Cookie", "a=1"), ("Cookie", "livepush_session=abc")])
    assert extract_token(headers, "/") == "abc"
    assert extract_token([("cookie", "livepush_session=xyz")], "/") == "xyz"


@pytest.mark.parametrize(
    "cookie",
    [
        "garbage",
        ";;;;====;;",
        "livepush_session",
        '"unbalanced; livepush_session=ok',
        "a=\x00\x01\x02; livepush_session=ok",
        "日本語=値; livepush_session=ok",
    ],
)
def test_garbage_cookies_survive(cookie: str) -> None:
    """Garbage around the cookie never raises; a well-formed pair is still found."""
    token = extract_token({"Cookie": cookie}, "/")
    assert token in (None, "ok")


def test_huge_cookie_is_handled_quickly() -> None:
    """A 100 KB Cookie header is scanned in linear time. Timed in this thread's CPU time, which
    a loaded machine that preempts the test does not add to."""
    cookie = "; ".join(f"c{i}={'v' * 90}" for i in range(1100)) + "; livepush_session=ok"
    assert len(cookie) > 100_000
    started = time.thread_time()
    assert extract_token({"Cookie": cookie}, "/") == "ok"
    assert time.thread_time() - started < 0.1


@pytest.mark.parametrize("path", ["/?token=%ZZ", "/?token=%C3%28", "/[?token=a", "/?&&&=&token", "?" * 1000])
def test_garbage_query_strings_survive(path: str) -> None:
    """Malformed percent-escapes and odd request targets never raise."""
    extract_token({}, path)


# -- origin_allowed ---------------------------------------------------------------------


def test_no_origin_is_allowed() -> None:
    """A client that sends no Origin (not a browser) is not checked."""
    assert origin_allowed({"Host": "example.com"}, None)
    assert origin_allowed({}, ("https://app.example.com",))


@pytest.mark.parametrize(
    ("origin", "host", "allowed"),
    [
        ("https://example.com", "example.com", True),  # 443 both
        ("https://example.com", "example.com:443", True),
        ("http://example.com", "example.com", True),  # 80 both
        ("http://example.com:80", "example.com", True),
        ("HTTPS://EXAMPLE.com/", "Example.COM", True),  # case and trailing slash
        ("http://localhost:8765", "localhost:8765", True),
        ("http://[::1]:8765", "[::1]:8765", True),
        ("http://localhost:3000", "localhost:8765", False),  # another port is another origin
        ("https://example.com", "example.com:80", False),
        ("http://example.com:8080", "example.com", False),
        ("https://evil.example", "example.com", False),
        ("https://example.com.evil.example", "example.com", False),
        ("null", "example.com", False),
        ("file://", "example.com", False),
        ("https://example.com", "", False),
        ("https://example.com:99999", "example.com", False),
    ],
)
def test_same_origin_by_default(origin: str, host: str, allowed: bool) -> None:
    """Without LIVEPUSH_ALLOWED_ORIGINS only the Host's own origin (host and port) may connect."""
    headers = {"Origin": origin, "Host": host} if host else {"Origin": origin}
    assert origin_allowed(headers, None) is allowed


@pytest.mark.parametrize(
    ("origin", "allowed"),
    [
        ("https://app.example.com", True),
        ("https://APP.example.com/", True),
        ("https://app.example.com:443", True),
        ("http://app.example.com", False),  # scheme differs
        ("https://app.example.com:8443", False),  # port differs
        ("https://evil.example", False),
        ("https://app.example.com.evil.example", False),
        ("http://localhost:3000", True),
        ("https://a.tenants.example", True),  # *.tenants.example
        ("https://a.b.tenants.example", True),
        ("https://tenants.example", False),  # the apex is not a subdomain
        ("https://eviltenants.example", False),
        ("null", False),
    ],
)
def test_configured_origins(origin: str, allowed: bool) -> None:
    """With LIVEPUSH_ALLOWED_ORIGINS the Origin must equal one of them (normalized)."""
    configured = ("https://app.example.com/", "HTTP://LOCALHOST:3000", "https://*.tenants.example")
    assert origin_allowed({"Origin": origin, "Host": "ws.example.com"}, configured) is allowed


def test_configured_origins_ignore_host() -> None:
    """A configured list replaces the same-origin rule: the page's own origin must be listed too."""
    headers = {"Origin": "https://ws.example.com", "Host": "ws.example.com"}
    assert not origin_allowed(headers, ("https://app.example.com",))


def test_star_allows_any_origin() -> None:
    """`*` allows every Origin, even `null`."""
    for origin in ("https://evil.example", "null", "garbage"):
        assert origin_allowed({"Origin": origin}, ("*",))


def test_several_origin_headers_are_refused() -> None:
    """Two Origin headers are ambiguous: refused."""
    headers = Headers([("Origin", "https://app.example.com"), ("Origin", "https://evil.example")])
    assert not origin_allowed(headers, ("https://app.example.com",))


def test_non_ascii_and_garbage_origins_are_refused() -> None:
    """Unparseable Origins are refused without raising."""
    for origin in ("https://exämple.com\x00", "https://", "://x", "https://u:p@example.com", "é" * 10_000):
        assert not origin_allowed({"Origin": origin, "Host": "example.com"}, None)
        assert not origin_allowed({"Origin": origin}, ("https://example.com",))


# -- authenticate -----------------------------------------------------------------------


def token_of(kind: str) -> str | None:
    """A token of each kind the handshake matrix covers."""
    now = time.time()
    if kind == "none":
        return None
    if kind in ("valid", "revoked"):
        return sessions.issue("user-7" if kind == "valid" else "revoked-user")
    if kind == "expired":
        return sessions.issue("user-7", ttl=5, now=now - 10)
    if kind == "tampered":
        t = sessions.issue("user-7")
        return t[:-2] + ("AA" if t[-2:] != "AA" else "BB")
    signing = OTHER if kind == "other_secret" else OLD
    set_settings(Settings(secret=signing))
    try:
        return sessions.issue("user-7")
    finally:
        set_settings(Settings(secret=SECRET, secret_fallbacks=(OLD,)))


EXPECTED = {
    "none": (False, "missing"),
    "valid": (True, None),
    "expired": (False, "expired"),
    "revoked": (False, "revoked"),
    "tampered": (False, "bad_signature"),
    "other_secret": (False, "bad_signature"),
    "fallback_secret": (True, None),
}


@pytest.mark.parametrize("mode", ["required", "optional", "off"])
@pytest.mark.parametrize("kind", list(EXPECTED))
@pytest.mark.parametrize("where", ["cookie", "query"])
async def test_authenticate_matrix(mode: str, kind: str, where: str, caplog: pytest.LogCaptureFixture) -> None:
    """Every mode x token x source gives the session or (None, reason), and never logs the token."""
    caplog.set_level(logging.DEBUG)
    settings = Settings(secret=SECRET, secret_fallbacks=(OLD,), authenticate=mode)
    store = MemoryRevocations()
    store.add_subject("revoked-user", time.time() + 1)
    token = token_of(kind)
    headers = {"Cookie": f"livepush_session={token}"} if token and where == "cookie" else {}
    path = f"/?token={token}" if token and where == "query" else "/"
    session, reason = await authenticate(headers, path, settings, store)
    if mode == "off":
        assert (session, reason) == (None, None)
    else:
        has_session, expected_reason = EXPECTED[kind]
        assert (session is not None) == has_session
        assert reason == expected_reason
        if session is not None:
            assert session.subject == "user-7"
    for record in caplog.records:
        assert not token or token not in record.getMessage()


@pytest.mark.parametrize("cookie", ["expired", "tampered", "other_secret", "revoked", "valid"])
@pytest.mark.parametrize("fresh_in", ["subprotocol", "query"])
async def test_a_cookie_does_not_hide_the_valid_token_the_page_passes(cookie: str, fresh_in: str) -> None:
    """What the page passes (subprotocol, query) counts before the session cookie, which the browser
    sends whatever set it: one left by an earlier sign-in that no longer decodes (expired, signed
    with a secret since retired) or was revoked since, which closed the page's client with 4401
    for good under `required`; or a valid one of another session, which a sibling subdomain can
    plant for the parent domain where the site's cookie has a Domain (cookie tossing), and which
    took the victim's sockets over though the page passed its own token."""
    settings = Settings(secret=SECRET, secret_fallbacks=(OLD,), authenticate="required")
    store = MemoryRevocations()
    store.add_subject("revoked-user", time.time() + 1)
    fresh = sessions.issue("user-9")
    headers = {"Cookie": f"livepush_session={token_of(cookie)}"}
    path = "/"
    if fresh_in == "subprotocol":
        headers["Sec-WebSocket-Protocol"] = f"livepush, livepush.token.{fresh}"
    else:
        path = f"/?token={fresh}"
    session, reason = await authenticate(headers, path, settings, store)
    assert session is not None and session.subject == "user-9" and reason is None


async def test_with_no_token_that_decodes_the_reason_is_the_first_ones() -> None:
    """None decodes: the reason logged is the first source's, in the order they count (the
    subprotocol's before the cookie's)."""
    settings = Settings(secret=SECRET, authenticate="required")
    headers = {"Cookie": f"livepush_session={token_of('expired')}",
               "Sec-WebSocket-Protocol": "livepush, livepush.token.not-a-token"}
    assert await authenticate(headers, "/", settings, None) == (None, "bad_signature")
    assert await authenticate({"Cookie": headers["Cookie"]}, "/", settings, None) == (None, "expired")


async def test_authenticate_without_store_skips_revocation() -> None:
    """store=None checks signature and expiry only."""
    token = sessions.issue("user-7")
    settings = Settings(secret=SECRET)
    session, reason = await authenticate({"Cookie": f"livepush_session={token}"}, "/", settings, None)
    assert session is not None and reason is None


async def test_authenticate_garbage_cookie_is_malformed() -> None:
    """A 100 KB or non-ASCII cookie value is a 'malformed' session, not an exception."""
    settings = Settings(secret=SECRET)
    for value in ("A" * 100_000, "jeton-é", "\x00\x01"):
        session, reason = await authenticate({"Cookie": f"livepush_session={value}"}, "/", settings, None)
        assert (session, reason) == (None, "malformed")


async def test_store_outage_is_not_a_missing_session() -> None:
    """When the revocation store is down authenticate raises DependencyError (the server retries
    the client later) instead of reporting no session (4401 would stop it for good)."""

    class Down(RevocationStore):
        async def revoked_among(self, sessions_: object) -> set[str]:
            raise DependencyError("store down")

        def add_session(self, session_id: str, expires_at: float) -> None: ...
        async def aadd_session(self, session_id: str, expires_at: float) -> None: ...
        def add_subject(self, subject: str, before: float) -> None: ...
        async def aadd_subject(self, subject: str, before: float) -> None: ...
        async def watch(self, on_revoked: object) -> None: ...

    token = sessions.issue("user-7")
    with pytest.raises(DependencyError):
        await authenticate({"Cookie": f"livepush_session={token}"}, "/", Settings(secret=SECRET), Down())


async def test_a_session_that_expires_while_the_store_is_read_is_no_session() -> None:
    """A token that expires while the handshake reads the revocation store is an expired one
    (anonymous under `optional`, 4401 under `required`), not a session whose first subscribe
    would close the connection with 4403, which the client never retries."""

    class Slow(MemoryRevocations):
        async def revoked_among(self, sessions_: Iterable[Session]) -> set[str]:
            batch = list(sessions_)
            last = max(s.expires_at for s in batch)
            await asyncio.sleep(max(0.0, last - time.time()) + 0.01)  # the token's own clock: no event to await
            return await super().revoked_among(batch)

    token = sessions.issue("user-7", ttl=0.2)
    session, reason = await authenticate({"Cookie": f"livepush_session={token}"}, "/", Settings(secret=SECRET), Slow())
    assert (session, reason) == (None, "expired")


def test_session_type_is_frozen() -> None:
    """Session is an immutable value."""
    s = Session("id", "user-7", 1.0)
    with pytest.raises(AttributeError):
        s.subject = "other"  # type: ignore[misc]
