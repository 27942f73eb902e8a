"""The session cookie helpers (docs/frameworks.md#starlette-and-fastapi, docs/security.md): signing
in sets `livepush_session` over HTTP and `__Host-livepush_session` (Secure) over HTTPS, host-only,
Path=/, HttpOnly, SameSite=Lax, expiring with its token; signing out revokes the session, so its
open WebSocket connections close with 4403, and deletes the cookie."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from datetime import timedelta
from http.cookies import SimpleCookie

import httpx
import psycopg
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from examples.fastapi_app.app import SESSION_TTL
from examples.fastapi_app.app import app as example
from livepush import config, sessions
from livepush.contrib.starlette import aset_session_cookie, lifespan, logout, set_session_cookie
from livepush.errors import ArgumentTypeError, ArgumentValueError
from livepush.sessions.revocations import READ_TIMEOUT
from tests.contrib.conftest import cookie_header, forget_defaults, serving
from tests.support.procs import Processes
from tests.support.wsclient import WSClient

CLOSE_REVOKED = 4403


def set_cookies(answer: httpx.Response) -> dict[str, dict[str, str]]:
    """Each Set-Cookie of `answer` by name: its value and its attributes, names lower-cased."""
    out: dict[str, dict[str, str]] = {}
    for header in answer.headers.get_list("set-cookie"):
        name_value, *attributes = [part.strip() for part in header.split(";")]
        name, _, value = name_value.partition("=")
        fields = {"value": value.strip('"')}
        for attribute in attributes:
            key, _, val = attribute.partition("=")
            fields[key.lower()] = val or "true"
        out[name] = fields
    return out


@pytest.fixture
async def http_client(app_env: dict[str, str]) -> AsyncIterator[httpx.AsyncClient]:
    async with serving(example, "http://127.0.0.1:8000") as c:
        yield c


@pytest.fixture
async def https_client(app_env: dict[str, str]) -> AsyncIterator[httpx.AsyncClient]:
    async with serving(example, "https://app.example.com") as c:
        yield c


async def test_over_http_the_cookie_is_livepush_session(http_client: httpx.AsyncClient) -> None:
    """HttpOnly, SameSite=Lax, Path=/, no Domain, no Secure (a browser drops a Secure cookie over
    plain HTTP, and a __Host- one with it), and Max-Age the token's TTL; its token is the subject's."""
    answer = await http_client.post("/login", json={"name": "ana"})
    assert answer.status_code == 200, answer.text
    cookies = set_cookies(answer)
    assert list(cookies) == ["livepush_session"]
    cookie = cookies["livepush_session"]
    assert cookie["httponly"] == "true" and cookie["samesite"].lower() == "lax" and cookie["path"] == "/"
    assert "domain" not in cookie and "secure" not in cookie
    assert int(cookie["max-age"]) == SESSION_TTL
    session = sessions.decode(cookie["value"], config.get_settings().secrets)
    assert session.subject == "ana" and abs(session.expires_at - session.issued_at - SESSION_TTL) < 1


async def test_over_https_the_cookie_is_host_prefixed_and_secure(https_client: httpx.AsyncClient) -> None:
    """__Host-livepush_session: Secure, Path=/, no Domain (what a browser requires of the prefix,
    so no sibling subdomain can plant one); a plain livepush_session left from HTTP is deleted, as
    two different session cookies would count as none."""
    answer = await https_client.post("/login", json={"name": "ana"})
    cookies = set_cookies(answer)
    host = cookies["__Host-livepush_session"]
    assert host["secure"] == "true" and host["path"] == "/" and "domain" not in host
    assert host["httponly"] == "true" and host["samesite"].lower() == "lax"
    assert sessions.decode(host["value"], config.get_settings().secrets).subject == "ana"
    assert cookies["livepush_session"]["max-age"] == "0"


def test_the_secure_flag_can_be_given(app_env: dict[str, str]) -> None:
    """`secure=True` for an app behind a TLS proxy whose scheme the app does not see."""
    request = Request({"type": "http", "scheme": "http", "method": "GET", "path": "/", "headers": [],
                       "server": ("127.0.0.1", 8000), "query_string": b""})
    response = Response()
    token = set_session_cookie(response, request, "ana", ttl=60, secure=True)
    cookie = SimpleCookie(response.headers.getlist("set-cookie")[-1])["__Host-livepush_session"]
    assert cookie.value == token and cookie["secure"] and cookie["max-age"] == "60"


def test_a_timedelta_ttl_sets_a_cookie_for_its_seconds(app_env: dict[str, str]) -> None:
    """set_session_cookie(ttl=) takes a timedelta, as sessions.issue() does: the token and the
    cookie both last its seconds."""
    request = Request({"type": "http", "scheme": "https", "method": "GET", "path": "/", "headers": [],
                       "server": ("127.0.0.1", 8000), "query_string": b""})
    response = Response()
    token = set_session_cookie(response, request, "ana", ttl=timedelta(minutes=1))
    cookie = SimpleCookie(response.headers.getlist("set-cookie")[-1])["__Host-livepush_session"]
    assert cookie.value == token and cookie["max-age"] == "60"
    session = sessions.decode(token, config.get_settings().secrets)
    assert 55 <= session.expires_at - time.time() <= 61


async def test_a_bad_subject_or_ttl_is_named_as_the_helpers_argument(app_env: dict[str, str]) -> None:
    """set_session_cookie(response, request, 7) or ttl=0: the error names the helper the app
    called, not sessions.issue(), which it never wrote; nothing is set."""
    request, response = _bare_request("https"), Response()
    with pytest.raises(ArgumentValueError, match=r"^set_session_cookie\(\) takes the session subject as a str"):
        set_session_cookie(response, request, 7)  # type: ignore[arg-type]
    with pytest.raises(ArgumentValueError, match=r"^set_session_cookie\(ttl=\) must be a positive"):
        set_session_cookie(response, request, "ana", ttl=0)
    with pytest.raises(ArgumentValueError, match=r"^aset_session_cookie\(\) takes the session subject as a str"):
        await aset_session_cookie(response, request, 7)  # type: ignore[arg-type]
    with pytest.raises(ArgumentValueError, match=r"^aset_session_cookie\(ttl=\) is at most"):
        await aset_session_cookie(response, request, "ana", ttl=10**9)
    assert "set-cookie" not in response.headers


def _bare_request(scheme: str, cookie: str | None = None) -> Request:
    headers = [(b"cookie", cookie.encode())] if cookie else []
    return Request({"type": "http", "scheme": scheme, "method": "GET", "path": "/", "headers": headers,
                    "server": ("app.example.com", 443), "query_string": b""})


def _each_set_cookie(response: Response) -> list[tuple[str, str, str, bool, str]]:
    """(name, value, Domain, Secure, Max-Age) of each Set-Cookie, in order: one name may come twice."""
    found = []
    for header in response.headers.getlist("set-cookie"):
        for name, morsel in SimpleCookie(header).items():
            found.append((name, morsel.value, morsel["domain"], bool(morsel["secure"]), morsel["max-age"]))
    return found


@pytest.mark.parametrize("scheme", ["https", "http"])
async def test_a_cookie_domain_sets_the_session_for_the_push_servers_host_too(app_env: dict[str, str],
                                                                             scheme: str) -> None:
    """`domain="example.com"`, as Django's LIVEPUSH_SESSION_COOKIE_DOMAIN: the push server on
    push.example.com gets the cookie, `livepush_session` with that Domain (a `__Host-` one cannot
    have one), Secure over HTTPS. The host-only copies an earlier sign-in left (`__Host-` and
    `livepush_session`) are deleted: beside it, two different session cookies count as none."""
    for sign_in in (set_session_cookie, aset_session_cookie):
        response = Response()
        result = sign_in(response, _bare_request(scheme), "ana", ttl=60, domain="example.com")
        token = await result if asyncio.iscoroutine(result) else result
        cookies = _each_set_cookie(response)
        assert cookies[-1] == ("livepush_session", token, "example.com", scheme == "https", "60"), cookies
        deleted = {(name, domain) for name, value, domain, _, max_age in cookies[:-1] if max_age == "0"}
        expected = {("__Host-livepush_session", ""), ("livepush_session", "")} if scheme == "https" else {
            ("livepush_session", "")}
        assert deleted == expected and len(cookies) == len(expected) + 1, cookies


def test_a_cookie_domain_the_host_is_not_under_gives_a_host_only_cookie_and_a_warning(
        app_env: dict[str, str], caplog: pytest.LogCaptureFixture) -> None:
    """A browser drops a cookie whose Domain the request's host is not under (a domain copied to a
    development machine, a site reached by another name), and the user had no session: the cookie
    is set host-only there, as Django's middleware does, and a warning names `domain=`."""
    from livepush.contrib import _cookies

    _cookies._warned_of_host.clear()  # said once a process
    response = Response()
    with caplog.at_level("WARNING", logger="livepush.contrib"):
        token = set_session_cookie(response, _bare_request("https"), "ana", ttl=60, domain="example.org")
    assert _each_set_cookie(response)[-1] == ("__Host-livepush_session", token, "", True, "60")
    assert "domain=" in caplog.text and "app.example.com" in caplog.text


async def test_logout_with_a_cookie_domain_deletes_the_cookie_there_and_host_only(app_env: dict[str, str]) -> None:
    """`logout(domain=)` deletes the cookie the sign-in set on that Domain, and the host-only ones."""
    token = sessions.issue("ana")
    response = Response()
    await logout(response, _bare_request("https", f"livepush_session={token}"), domain="example.com")
    deleted = {(name, domain) for name, _, domain, _, max_age in _each_set_cookie(response) if max_age == "0"}
    assert deleted == {("__Host-livepush_session", ""), ("livepush_session", ""), ("livepush_session", "example.com")}
    assert await sessions.default_store().is_revoked(sessions.decode(token, config.get_settings().secrets))


@pytest.mark.parametrize("domain", ["https://example.com", "example.com:443", "example.com/app", "", 7])
def test_a_cookie_domain_that_is_no_host_name_is_an_error_naming_it(app_env: dict[str, str], domain: object) -> None:
    """A browser drops a cookie whose Domain is a URL, has a port or a path: every socket would come
    in anonymous with nothing saying why. Refused at the call, before a session is issued."""
    with pytest.raises(ArgumentValueError, match="domain"):
        set_session_cookie(Response(), _bare_request("https"), "ana", domain=domain)  # type: ignore[arg-type]


async def test_logout_revokes_and_deletes_the_cookie(http_client: httpx.AsyncClient) -> None:
    """After /logout the session is revoked (the app refuses it with 403) and the cookie deleted."""
    token = set_cookies(await http_client.post("/login", json={"name": "ana"}))["livepush_session"]["value"]
    answer = await http_client.post("/logout", headers=cookie_header(token))
    assert answer.json() == {"signed_out": True}
    assert set_cookies(answer)["livepush_session"]["max-age"] == "0"
    assert await sessions.default_store().is_revoked(sessions.decode(token, config.get_settings().secrets))
    assert (await http_client.post("/reports", json={}, headers=cookie_header(token))).status_code == 403


async def test_logout_revokes_every_session_cookie_it_carries(https_client: httpx.AsyncClient) -> None:
    """Two different session cookies count as none for a request, but logout revokes both (the real
    one is among them) and deletes the cookie under both names."""
    secrets = config.get_settings().secrets
    first, second = sessions.issue("ana"), sessions.issue("ana")
    answer = await https_client.post("/logout", headers={
        "Cookie": f"livepush_session={first}; __Host-livepush_session={second}"})
    assert answer.json() == {"signed_out": True}
    for token in (first, second):
        assert await sessions.default_store().is_revoked(sessions.decode(token, secrets))
    cookies = set_cookies(answer)
    assert cookies["__Host-livepush_session"]["max-age"] == "0" and cookies["__Host-livepush_session"]["secure"]
    assert cookies["livepush_session"]["max-age"] == "0"


async def test_logout_everywhere_revokes_every_session_of_the_subject(app_env: dict[str, str]) -> None:
    """`logout(everywhere=True)`: the subject's other sessions (other browsers) are revoked too, not
    another subject's."""

    async def sign_out_everywhere(request: Request) -> Response:
        response = JSONResponse({})
        await logout(response, request, everywhere=True)
        return response

    secrets = config.get_settings().secrets
    other_browser, other_user, here = sessions.issue("ana"), sessions.issue("bob"), sessions.issue("ana")
    app = Starlette(routes=[Route("/logout", sign_out_everywhere, methods=["POST"])], lifespan=lifespan)
    async with serving(app) as client:
        assert (await client.post("/logout", headers=cookie_header(here))).status_code == 200
        store = sessions.default_store()
        assert await store.is_revoked(sessions.decode(other_browser, secrets))
        assert not await store.is_revoked(sessions.decode(other_user, secrets))


async def test_logout_without_a_session_only_deletes(http_client: httpx.AsyncClient) -> None:
    """No cookie, or one that is not ours: nothing to revoke, the answer is still a plain 200."""
    for headers in ({}, cookie_header("garbage")):
        answer = await http_client.post("/logout", headers=headers)
        assert answer.status_code == 200 and answer.json() == {"signed_out": False}
        assert set_cookies(answer)["livepush_session"]["max-age"] == "0"


async def test_logout_without_a_shared_store_still_signs_out(livepush_env: Callable[..., dict[str, str]],
                                                              caplog: pytest.LogCaptureFixture) -> None:
    """An app with neither a database nor Redis (a start it only warns about) has no store to
    revoke in: signing out still answers 200 and deletes the cookie, and the log says which
    setting would have made the revocation, never a 500 that leaves the user signed in."""
    forget_defaults()
    config.set_settings(config.Settings.from_env(livepush_env(fanout="local")))
    try:
        async with serving(example) as client:
            token = set_cookies(await client.post("/login", json={"name": "ana"}))["livepush_session"]["value"]
            with caplog.at_level("WARNING", logger="livepush.contrib"):
                answer = await client.post("/logout", headers=cookie_header(token))
    finally:
        forget_defaults()
    assert answer.status_code == 200 and answer.json() == {"signed_out": False}
    assert set_cookies(answer)["livepush_session"]["max-age"] == "0"
    said = [r.getMessage() for r in caplog.records if r.name == "livepush.contrib"]
    assert any("LIVEPUSH_DATABASE_URL" in line and "not revoked" in line for line in said), said


async def test_logout_closes_the_sessions_open_socket_with_4403(
    http_client: httpx.AsyncClient, app_env: dict[str, str], procs: Processes
) -> None:
    """A socket opened with the session cookie is closed by the server with 4403 once the app's
    logout revoked the session (the JS client then stops: status `unauthorized`)."""
    server = await procs.alivepush("serve", env=app_env)
    token = set_cookies(await http_client.post("/login", json={"name": "ana"}))["livepush_session"]["value"]
    ws = await WSClient.open(f"ws://127.0.0.1:{server.port}/", additional_headers=cookie_header(token))
    try:
        assert ws.hello["session"] == {"subject": "ana"}
        assert (await http_client.post("/logout", headers=cookie_header(token))).json() == {"signed_out": True}
        assert await ws.closed_with(timeout=5) == CLOSE_REVOKED
    finally:
        await ws.close()


async def test_logout_whose_store_write_blocks_answers_503_within_a_bound(http_client: httpx.AsyncClient,
                                                                          pg_url: str) -> None:
    """A revocation that blocks (a migration holding the revocation table's lock, a frozen
    connection) answers 503 after the bound the session check has on a store read, and deletes no
    cookie, so the user can try again, instead of holding the sign-out until the lock is gone."""
    token = set_cookies(await http_client.post("/login", json={"name": "ana"}))["livepush_session"]["value"]
    locker = await psycopg.AsyncConnection.connect(pg_url)
    try:
        await locker.execute("LOCK TABLE livepush_revoked_sessions IN ACCESS EXCLUSIVE MODE")
        answer = await asyncio.wait_for(http_client.post("/logout", headers=cookie_header(token)), READ_TIMEOUT + 10)
        assert answer.status_code == 503 and "try again" in answer.json()["detail"]
        assert "livepush_session" not in set_cookies(answer)
    finally:
        await locker.rollback()
        await locker.close()
    answer = await http_client.post("/logout", headers=cookie_header(token))
    assert answer.json() == {"signed_out": True}


async def test_the_request_and_response_given_the_other_way_round_is_an_error_saying_the_order(
        app_env: dict[str, str]) -> None:
    """set_session_cookie(request, response, ...) and logout(request, response), the order of
    Django's helpers, raise ArgumentTypeError saying the response comes first, not an
    AttributeError from inside livepush; nothing is revoked."""
    token = sessions.issue("ana")
    request = Request({"type": "http", "method": "POST", "path": "/", "scheme": "http", "query_string": b"",
                       "server": ("app.example.com", 80), "headers": [(b"cookie", f"livepush_session={token}".encode())]})
    response = Response()
    for secure in (None, True):
        with pytest.raises(ArgumentTypeError, match=r"set_session_cookie\(response, request"):
            set_session_cookie(request, response, "ana", secure=secure)  # type: ignore[arg-type]
        with pytest.raises(ArgumentTypeError, match=r"aset_session_cookie\(response, request"):
            await aset_session_cookie(request, response, "bob", secure=secure)  # type: ignore[arg-type]
        with pytest.raises(ArgumentTypeError, match=r"logout\(response, request"):
            await logout(request, response, secure=secure)  # type: ignore[arg-type]
    assert not await sessions.default_store().is_revoked(sessions.decode(token, config.get_settings().secrets))
    assert "set-cookie" not in response.headers


async def test_signing_in_over_another_users_cookie_revokes_that_users_session(app_env: dict[str, str]) -> None:
    """On a shared browser, a user who signs in over another's cookie with `aset_session_cookie` has
    the other user's session revoked (as Django's sign-in over another user does): the sockets its
    pages opened close, instead of showing that user's topics to the new one until the token
    expires. The same user signing in again keeps the session; the new cookie is set either way."""

    async def sign_in(request: Request) -> Response:
        response = JSONResponse({})
        await aset_session_cookie(response, request, request.query_params["as"])
        return response

    secrets, store = config.get_settings().secrets, sessions.default_store()
    ana, bob = sessions.issue("ana"), sessions.issue("bob")
    app = Starlette(routes=[Route("/login", sign_in, methods=["POST"])], lifespan=lifespan)
    async with serving(app) as client:
        again = await client.post("/login?as=ana", headers=cookie_header(ana))
        assert not await store.is_revoked(sessions.decode(ana, secrets))
        assert sessions.decode(set_cookies(again)["livepush_session"]["value"], secrets).subject == "ana"
        over = await client.post("/login?as=ana", headers={"Cookie": f"livepush_session={bob}"})
        assert over.status_code == 200
        assert await store.is_revoked(sessions.decode(bob, secrets))
        assert sessions.decode(set_cookies(over)["livepush_session"]["value"], secrets).subject == "ana"


async def test_signing_in_over_another_users_cookie_while_the_store_blocks_still_signs_in(
        app_env: dict[str, str], pg_url: str, caplog: pytest.LogCaptureFixture) -> None:
    """A revocation that blocks at sign-in (a migration holding the revocation table's lock) gives
    up after the bound a store read has, logs a warning, and the user is signed in all the same,
    as with Django's sign-in: the push store never keeps a user out of the app."""
    request = Request({"type": "http", "method": "POST", "path": "/", "scheme": "http", "query_string": b"",
                       "server": ("app.example.com", 80),
                       "headers": [(b"cookie", f"livepush_session={sessions.issue('bob')}".encode())]})
    response = Response()
    locker = await psycopg.AsyncConnection.connect(pg_url)
    try:
        await locker.execute("LOCK TABLE livepush_revoked_sessions IN ACCESS EXCLUSIVE MODE")
        with caplog.at_level("WARNING", logger="livepush.contrib"):
            token = await asyncio.wait_for(aset_session_cookie(response, request, "ana"), READ_TIMEOUT + 10)
    finally:
        await locker.rollback()
        await locker.close()
    assert SimpleCookie(response.headers.getlist("set-cookie")[-1])["livepush_session"].value == token
    said = [r.getMessage() for r in caplog.records if r.name == "livepush.contrib"]
    assert any("not revoked" in line for line in said), said


def _cache_directives(response: Response) -> list[str]:
    """The Cache-Control directives of `response`, every header of that name, lower-cased."""
    return [part.strip().lower() for value in response.headers.getlist("cache-control") for part in value.split(",")]


def _vary(response: Response) -> list[str]:
    return [part.strip().lower() for value in response.headers.getlist("vary") for part in value.split(",")]


@pytest.mark.parametrize("call", ["set_session_cookie", "aset_session_cookie", "logout"])
async def test_a_response_that_sets_or_deletes_the_cookie_is_kept_from_shared_caches(
        app_env: dict[str, str], call: str) -> None:
    """The cookie carries a token: a shared cache in front of the app that stored the response with
    its Set-Cookie would hand one user's session to the next one to ask. Every helper that sets or
    deletes it makes the response `private` (merged with what the route set: its `public` goes,
    its `max-age` and `no-store` stay) and adds `Vary: Cookie` beside the route's own Vary."""
    for headers, kept in (({}, set()),
                          ({"Cache-Control": "public, max-age=600", "Vary": "Accept-Encoding"},
                           {"max-age=600"}),
                          ({"Cache-Control": "no-store"}, {"no-store"})):
        response = Response(headers=headers)
        request = _bare_request("https", f"livepush_session={sessions.issue('bob')}")
        if call == "set_session_cookie":
            set_session_cookie(response, request, "ana", ttl=60)
        elif call == "aset_session_cookie":
            await aset_session_cookie(response, request, "ana", ttl=60)
        else:
            await logout(response, request)
        assert response.headers.getlist("set-cookie"), call
        directives = _cache_directives(response)
        assert "private" in directives and "public" not in directives, (call, directives)
        assert kept <= set(directives), (call, directives)
        assert len(response.headers.getlist("cache-control")) == 1, response.headers
        vary = _vary(response)
        assert "cookie" in vary and ("accept-encoding" in vary) == ("Vary" in headers), (call, vary)


async def test_the_example_apps_sign_in_and_sign_out_are_private(http_client: httpx.AsyncClient) -> None:
    """Through the example app, as a browser meets it: the answers that carry the session cookie
    say `Cache-Control: private` and `Vary: Cookie`."""
    answer = await http_client.post("/login", json={"name": "ana"})
    token = set_cookies(answer)["livepush_session"]["value"]
    for answer in (answer, await http_client.post("/logout", headers=cookie_header(token))):
        assert "private" in answer.headers["cache-control"] and "Cookie" in answer.headers["vary"], answer.headers


async def test_a_host_prefixed_cookie_the_request_carries_is_deleted_whatever_scheme_the_app_sees(
        app_env: dict[str, str]) -> None:
    """Behind a proxy that ends TLS, without uvicorn's --proxy-headers, the app sees http:// while
    the browser is on HTTPS and holds the `__Host-` cookie an earlier sign-in set with
    `secure=True`. A browser sends that cookie only over HTTPS, so a request carrying it came over
    HTTPS: logout deletes it (Secure, as the prefix requires), and a sign-in deletes it beside its
    new `livepush_session`, as Django's middleware does; else two different session cookies, which
    count as none, left every socket anonymous."""
    old = sessions.issue("ana")
    response = Response()
    await logout(response, _bare_request("http", f"__Host-livepush_session={old}"))
    deleted = {(name, secure) for name, _, _, secure, max_age in _each_set_cookie(response) if max_age == "0"}
    assert ("__Host-livepush_session", True) in deleted, deleted
    response = Response()
    token = await aset_session_cookie(response, _bare_request("http", f"__Host-livepush_session={old}"), "ana")
    cookies = _each_set_cookie(response)
    assert cookies[-1][:2] == ("livepush_session", token), cookies
    assert ("__Host-livepush_session", "", "", True, "0") in cookies, cookies
