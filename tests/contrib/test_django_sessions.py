"""LivePushSessionMiddleware (docs/frameworks.md, Django): a signed-in user gets a livepush session
in the `livepush_session` cookie (`__Host-` on a secure request), so the browser connects as that
user with no token code; signing out revokes it, and the sockets it opened close with 4403."""

from __future__ import annotations

import asyncio
import io
import uuid
from contextlib import contextmanager
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from http.cookies import SimpleCookie
from typing import Any

import psycopg
import pytest
from django.contrib.auth import get_user_model
from django.core.exceptions import ImproperlyConfigured
from django.test import Client, override_settings

from livepush import sessions
from livepush.config import get_settings
from tests.support.procs import Processes
from tests.support.waiting import async_wait_for, wait_for
from tests.support.wsclient import WSClient

pytestmark = pytest.mark.usefixtures("django_site")

CLOSE_REVOKED = 4403


def signed_in() -> tuple[Client, Any]:
    user = get_user_model().objects.create_user(f"u{uuid.uuid4().hex[:10]}", password="x")
    client = Client()
    client.force_login(user)
    return client, user


@contextmanager
def _counted_session_writes() -> Iterator[list[str]]:
    """The ids of the sessions the default store revokes meanwhile, one entry per write."""
    store = sessions.default_store()
    revoked: list[str] = []
    add_session = store.add_session

    def counted(session_id: str, expires_at: float) -> None:
        revoked.append(session_id)
        add_session(session_id, expires_at)

    store.add_session = counted  # type: ignore[method-assign]
    try:
        yield revoked
    finally:
        del store.add_session


def test_a_signed_in_user_gets_a_session_cookie_for_their_subject() -> None:
    """A signed-in user's response sets livepush_session: HttpOnly, SameSite=Lax, a token of subject user.pk."""
    client, user = signed_in()
    cookie = client.get("/").cookies["livepush_session"]
    assert cookie["httponly"] and cookie["samesite"] == "Lax" and not cookie["secure"]
    assert cookie["path"] == "/" and int(cookie["max-age"]) == 86400
    session = sessions.decode(cookie.value, get_settings().secrets)
    assert session.subject == str(user.pk)
    # The next request carries it: nothing is issued again.
    assert "livepush_session" not in client.get("/").cookies


def test_a_secure_request_gets_the_host_prefixed_cookie() -> None:
    """Over HTTPS the cookie is __Host-livepush_session, Secure, with no Domain."""
    client, _ = signed_in()
    cookies = client.get("/", secure=True).cookies
    cookie = cookies["__Host-livepush_session"]
    assert cookie["secure"] and cookie["path"] == "/" and not cookie["domain"]
    assert cookies["livepush_session"].value == ""  # the other name is deleted: two would count as none


def test_anonymous_requests_get_no_session_and_lose_a_stale_one() -> None:
    """An anonymous request gets no cookie; one it still carries is deleted."""
    client = Client()
    assert "livepush_session" not in client.get("/").cookies
    client.cookies["livepush_session"] = sessions.issue("someone", ttl=60)
    assert client.get("/").cookies["livepush_session"].value == ""


@override_settings(LIVEPUSH_SESSION_COOKIE_DOMAIN="testserver")
def test_with_a_cookie_domain_the_host_prefixed_cookie_is_deleted_without_one() -> None:
    """With LIVEPUSH_SESSION_COOKIE_DOMAIN set, the `__Host-` cookie an earlier host-only setup left is deleted by a Set-Cookie without Domain (a browser ignores a `__Host-` one with a Domain), for a signed-in and an anonymous request alike: two different session cookies would count as none."""
    client, _ = signed_in()
    client.cookies["__Host-livepush_session"] = sessions.issue("earlier", ttl=3600)
    cookies = client.get("/", secure=True).cookies
    assert cookies["livepush_session"]["domain"] == "testserver" and cookies["livepush_session"].value
    stale = cookies["__Host-livepush_session"]
    assert stale.value == "" and stale["secure"] and not stale["domain"], stale.output()
    client.logout()
    client.cookies["__Host-livepush_session"] = sessions.issue("earlier", ttl=3600)
    stale = client.get("/", secure=True).cookies["__Host-livepush_session"]
    assert stale.value == "" and stale["secure"] and not stale["domain"], stale.output()


@override_settings(LIVEPUSH_SESSION_COOKIE_DOMAIN="testserver")
def test_a_cookie_domain_set_later_moves_a_current_host_only_session_to_it() -> None:
    """A signed-in user's `__Host-` cookie from before LIVEPUSH_SESSION_COOKIE_DOMAIN was set, its
    session still current, never reaches the push server on the domain's other host: the next
    response sets the user's session in `livepush_session` with that Domain and deletes the
    `__Host-` one, rather than leaving every socket anonymous until the old token ages."""
    client, user = signed_in()
    client.cookies["__Host-livepush_session"] = sessions.issue(str(user.pk), ttl=86400)
    cookies = client.get("/", secure=True).cookies
    moved = cookies["livepush_session"]
    assert moved["domain"] == "testserver" and moved["secure"], moved.output()
    assert sessions.decode(moved.value, get_settings().secrets).subject == str(user.pk)
    assert cookies["__Host-livepush_session"].value == ""
    assert "livepush_session" not in client.get("/", secure=True).cookies  # moved once, then current


@override_settings(LIVEPUSH_SESSION_COOKIE_DOMAIN="testserver")
def test_a_cookie_domain_set_later_moves_a_current_plain_host_only_session_to_it() -> None:
    """A signed-in user's host-only `livepush_session` (set over plain HTTP before
    LIVEPUSH_SESSION_COOKIE_DOMAIN was set), its session still current, never reaches the push
    server on the domain's other host, and the browser does not say which Domain a cookie has:
    the Django session records the one the cookie was set with, so the next response deletes the
    host-only copy and sets the session with the new Domain, then nothing more."""
    client, user = signed_in()
    with override_settings(LIVEPUSH_SESSION_COOKIE_DOMAIN=None):
        before = client.get("/").cookies["livepush_session"]
    assert not before["domain"]
    written = _written(client.get("/"), "livepush_session")
    assert [(morsel["domain"], morsel.value == "") for morsel in written] == [("", True), ("testserver", False)]
    moved = written[1]
    assert moved.value != before.value
    assert sessions.decode(moved.value, get_settings().secrets).subject == str(user.pk)
    now = _with_sign_in(client, f"livepush_session={moved.value}")
    assert "livepush_session" not in client.get("/", HTTP_COOKIE=now).cookies


@override_settings(LIVEPUSH_SESSION_COOKIE_DOMAIN="testserver")
def test_an_old_copy_an_earlier_release_left_to_the_next_response_is_deleted_by_it() -> None:
    """An earlier release moved a host-only `livepush_session` to the cookie domain and left the
    host-only copy for the next response to delete, recording it in the Django session. The
    browser still sends both copies: the next response deletes the host-only one, whichever of
    the two Django keeps (the last), taking the one given to this sign-in last as the cookie's,
    then nothing more."""
    client, _ = signed_in()
    with override_settings(LIVEPUSH_SESSION_COOKIE_DOMAIN=None):
        before = client.get("/").cookies["livepush_session"]
    moved = _written(client.get("/"), "livepush_session")[-1]
    for order in ((before.value, moved.value), (moved.value, before.value)):
        session = client.session
        session["_livepush_stale_cookie_domain"] = ""  # as the earlier release recorded it
        session.save()
        both = "; ".join(f"livepush_session={value}" for value in order)
        written = _written(client.get("/", HTTP_COOKIE=_with_sign_in(client, both)), "livepush_session")
        assert [(morsel["domain"], morsel.value) for morsel in written] == [("", "")], written
    now = _with_sign_in(client, f"livepush_session={moved.value}")
    assert "livepush_session" not in client.get("/", HTTP_COOKIE=now).cookies


def _written(response: Any, name: str) -> list[Any]:
    """The cookies of `name` that `response` sets or deletes, in the order its Set-Cookie headers
    go out: response.cookies keys a second one of a name under another key."""
    return [morsel for morsel in response.cookies.values() if morsel.key == name]


def _with_sign_in(client: Client, cookies: str) -> str:
    """A Cookie header of `cookies` and the client's Django session cookie: what a browser holding
    two copies of a cookie name sends, which the test client's jar (one value a name) cannot."""
    return f"sessionid={client.cookies['sessionid'].value}; {cookies}"


def test_a_cookie_domain_removed_later_deletes_the_cookie_left_on_it() -> None:
    """A cookie set with LIVEPUSH_SESSION_COOKIE_DOMAIN stays on the browser when the setting is
    removed, beside the host-only one a renewal sets: two different session cookies count as none,
    and every request renewed again. The copy on the old Domain is deleted by the response that
    sets the new cookie: over HTTPS beside the new `__Host-` cookie, over plain HTTP before the
    new host-only `livepush_session`."""
    for secure in (True, False):
        client, _ = signed_in()
        with override_settings(LIVEPUSH_SESSION_COOKIE_DOMAIN="testserver"):
            before = client.get("/", secure=secure).cookies["livepush_session"]
        assert before["domain"] == "testserver"
        response = client.get("/", secure=secure)
        cookies = response.cookies
        if secure:
            assert cookies["__Host-livepush_session"].value and not cookies["__Host-livepush_session"]["domain"]
            stale = cookies["livepush_session"]
        else:
            stale, fresh = _written(response, "livepush_session")
            assert fresh.value and fresh.value != before.value and not fresh["domain"], fresh.output()
        assert stale.value == "" and stale["domain"] == "testserver", stale.output()


@override_settings(LIVEPUSH_SESSION_COOKIE_DOMAIN="example.com")
def test_a_cookie_domain_the_host_is_not_under_gives_a_host_only_cookie_and_a_warning(
        caplog: pytest.LogCaptureFixture) -> None:
    """A browser drops a cookie whose Domain the page's host is not under (a setting copied to a
    development machine, a site on another name): the user had no session, and each request
    issued one more, kept in the Django session for a day. The cookie is set host-only there, so
    it reaches a push server on that host, and once current it is kept; a warning names the setting."""
    from livepush.contrib import _cookies

    _cookies._warned_of_host.clear()  # said once a process
    client, _ = signed_in()
    with caplog.at_level("WARNING", logger="livepush.contrib.django"):
        cookie = client.get("/").cookies["livepush_session"]
        assert not cookie["domain"] and cookie.value, cookie.output()
        assert "livepush_session" not in client.get("/").cookies
    assert "LIVEPUSH_SESSION_COOKIE_DOMAIN" in caplog.text and "testserver" in caplog.text
    client.logout()
    client.cookies["livepush_session"] = cookie.value
    stale = client.get("/").cookies["livepush_session"]
    assert stale.value == "" and not stale["domain"], stale.output()


def test_another_users_cookie_is_replaced() -> None:
    """A cookie issued to another subject is replaced by one of the signed-in user."""
    client, user = signed_in()
    client.cookies["livepush_session"] = sessions.issue("someone-else", ttl=3600)
    token = client.get("/").cookies["livepush_session"].value
    assert sessions.decode(token, get_settings().secrets).subject == str(user.pk)


def test_signing_out_revokes_the_session_and_its_socket_closes_4403(
    django_db_url: str, livepush_env: Callable[..., dict[str, str]], procs: Processes
) -> None:
    """Django's logout revokes the cookie's session: the socket it opened closes with 4403, and the cookie goes."""
    server = procs.livepush("serve", env=livepush_env(database_url=django_db_url, secret=get_settings().secret,
                                                      authenticate="required"))
    client, user = signed_in()
    token = client.get("/").cookies["livepush_session"].value

    async def scenario() -> tuple[int | None, Any]:
        ws = await WSClient.open(f"ws://127.0.0.1:{server.port}/",
                                 additional_headers={"Cookie": f"livepush_session={token}"})
        assert ws.hello["session"] == {"subject": str(user.pk)}
        response = await asyncio.to_thread(client.post, "/logout/")
        return await ws.closed_with(timeout=5), response

    code, response = asyncio.run(scenario())
    assert code == CLOSE_REVOKED
    assert response.cookies["livepush_session"].value == ""


def test_signing_in_as_another_user_revokes_the_previous_users_session() -> None:
    """On a shared browser, a user who signs in over another's session (Django flushes that one and
    sends no user_logged_out) has the other user's livepush session revoked: the sockets its pages
    opened close, instead of showing that user's topics to the new one until the token expires.
    The same user signing in again keeps the session."""
    from django.contrib.auth import login
    from django.contrib.sessions.backends.db import SessionStore
    from django.test import RequestFactory

    client, first = signed_in()
    token = client.get("/").cookies["livepush_session"].value
    second = get_user_model().objects.create_user(f"u{uuid.uuid4().hex[:10]}", password="x")

    def sign_in(user: Any) -> bool:
        request = RequestFactory().post("/login/", HTTP_COOKIE=f"livepush_session={token}")
        request.session, request.user = SessionStore(), first
        login(request, user, backend="django.contrib.auth.backends.ModelBackend")
        return asyncio.run(sessions.default_store().is_revoked(sessions.decode(token, get_settings().secrets)))

    assert not sign_in(first)
    assert sign_in(second)


@pytest.mark.parametrize("name, value", [
    ("LIVEPUSH_SESSION_TTL", "1 day"),
    ("LIVEPUSH_SESSION_TTL", None),
    ("LIVEPUSH_SESSION_TTL", 0),
    ("LIVEPUSH_SESSION_TTL", 400 * 86400),
    ("LIVEPUSH_SESSION_TTL", timedelta(0)),
    ("LIVEPUSH_SESSION_TTL", 10**5000),
    ("LIVEPUSH_SESSION_SUBJECT", "myapp.auth.subject_of"),
    ("LIVEPUSH_SESSION_SUBJECT", "tests.contrib.django_subjects.NOT_A_FUNCTION"),
    ("LIVEPUSH_SESSION_SUBJECT", lambda user: None),
    ("LIVEPUSH_SESSION_SUBJECT", lambda user: ""),
], ids=["ttl-text", "ttl-none", "ttl-zero", "ttl-over-366-days", "ttl-zero-timedelta", "ttl-no-float-holds", "subject-a-path-that-does-not-import",
        "subject-a-path-to-no-function", "subject-none", "subject-empty"])
def test_a_bad_session_setting_is_an_error_naming_it(name: str, value: Any) -> None:
    """A session setting Django cannot use is ImproperlyConfigured naming the setting, never a bare
    ValueError or TypeError; and a subject function that returns None is refused, not turned
    into the subject "None" that every such user would share."""
    client, _ = signed_in()
    client.raise_request_exception = True
    with override_settings(**{name: value}), pytest.raises(ImproperlyConfigured, match=name):
        client.get("/")


def test_a_numeric_ttl_setting_given_as_text_is_read() -> None:
    """LIVEPUSH_SESSION_TTL read from the environment as text ("3600") is a number of seconds."""
    client, _ = signed_in()
    with override_settings(LIVEPUSH_SESSION_TTL="3600"):
        assert int(client.get("/").cookies["livepush_session"]["max-age"]) == 3600


def test_a_ttl_setting_given_as_a_timedelta_is_read() -> None:
    """LIVEPUSH_SESSION_TTL = timedelta(hours=1) is 3600 seconds, as every seconds argument of
    livepush takes a timedelta; it was refused as no number of seconds."""
    client, _ = signed_in()
    with override_settings(LIVEPUSH_SESSION_TTL=timedelta(hours=1)):
        cookie = client.get("/").cookies["livepush_session"]
    assert int(cookie["max-age"]) == 3600
    session = sessions.decode(cookie.value, get_settings().secrets)
    assert 3600 <= session.expires_at - session.issued_at <= 3600.002


def test_a_shortened_session_ttl_replaces_a_cookie_that_would_outlive_it() -> None:
    """LIVEPUSH_SESSION_TTL is how long a session lives: lowered (a site that wants its sessions to
    end sooner), a signed-in user's cookie issued under the longer lifetime is replaced at the next
    response by one of the new lifetime, not kept until it has aged to half of the old one."""
    client, user = signed_in()
    client.get("/")
    with override_settings(LIVEPUSH_SESSION_TTL=3600):
        cookie = client.get("/").cookies["livepush_session"]
        assert int(cookie["max-age"]) == 3600
        session = sessions.decode(cookie.value, get_settings().secrets)
        assert session.subject == str(user.pk) and session.expires_at <= session.issued_at + 3600 + 1
        assert "livepush_session" not in client.get("/").cookies  # then current: not issued again


def test_signing_out_revokes_every_session_cookie_the_request_carries() -> None:
    """A page opened over HTTPS holds a socket with its __Host- cookie; a page of the same site opened
    over plain HTTP got a livepush_session beside it. Two different cookies count as none, but the
    socket the first one opened is still open: signing out revokes both, so it closes too."""
    client, user = signed_in()
    secure = client.get("/", secure=True).cookies["__Host-livepush_session"].value
    plain = sessions.issue(str(user.pk))
    client.cookies["livepush_session"] = plain
    client.post("/logout/", secure=True)
    secrets = get_settings().secrets
    for token in (secure, plain):
        assert asyncio.run(sessions.default_store().is_revoked(sessions.decode(token, secrets)))


def test_signing_out_revokes_the_session_a_renewal_replaced() -> None:
    """A page left open holds a socket with its token. Once the token is due for renewal (here at
    once, the TTL being raised: as when half its lifetime has passed), the next response sets a new
    one, and the old socket stays open on the old session, which must not close then. Signing out
    revokes every session issued to that sign-in, the replaced one too, so that socket closes as
    well instead of showing the user's topics until the old token expires."""
    client, _ = signed_in()
    first = client.get("/").cookies["livepush_session"].value
    with override_settings(LIVEPUSH_SESSION_TTL=3 * 86400):
        renewed = client.get("/").cookies["livepush_session"].value
    assert renewed and renewed != first
    store, secrets = sessions.default_store(), get_settings().secrets
    assert not asyncio.run(store.is_revoked(sessions.decode(first, secrets)))  # open pages go on
    with _counted_session_writes() as revoked:
        client.post("/logout/")
    for token in (first, renewed):
        assert asyncio.run(store.is_revoked(sessions.decode(token, secrets))), token == first
    assert sorted(revoked) == sorted({sessions.decode(t, secrets).id for t in (first, renewed)}), "one write each"


def test_a_user_signed_in_without_a_django_session_gets_no_session_written() -> None:
    """A request whose user an API's token authentication set, with no Django sign-in behind it,
    gets its livepush cookie, but its Django session is left as it was: keeping the livepush
    sessions there, for a sign-out that never comes through it, would write a new Django session
    (a row and a cookie) for every such request."""
    from django.contrib.sessions.backends.db import SessionStore
    from django.http import HttpResponse
    from django.test import RequestFactory

    from livepush.contrib.django import LivePushSessionMiddleware

    user = get_user_model().objects.create_user(f"u{uuid.uuid4().hex[:10]}", password="x")
    request = RequestFactory().get("/")
    request.session, request.user = SessionStore(), user
    response = LivePushSessionMiddleware(lambda request: HttpResponse())(request)
    assert response.cookies["livepush_session"].value
    assert not request.session.modified


def test_a_signed_in_user_without_a_pk_is_an_error_naming_the_subject_setting() -> None:
    """A user an authentication backend builds without saving it (pk None) would get the subject
    "None", shared by every such user with each other's topics: ImproperlyConfigured naming
    LIVEPUSH_SESSION_SUBJECT instead, and no session issued."""
    from django.http import HttpResponse
    from django.test import RequestFactory

    from livepush.contrib.django import LivePushSessionMiddleware

    class UnsavedUser:  # what a backend that keeps no user rows hands to request.user
        pk = None
        is_authenticated = True

    request = RequestFactory().get("/")
    request.user = UnsavedUser()
    middleware = LivePushSessionMiddleware(lambda request: HttpResponse())
    with pytest.raises(ImproperlyConfigured, match="LIVEPUSH_SESSION_SUBJECT"):
        middleware(request)


def test_signing_out_without_a_shared_store_is_one_warning_naming_the_setting(
        caplog: pytest.LogCaptureFixture) -> None:
    """A site with neither a database nor Redis for livepush has nowhere to revoke: the sign-out
    still succeeds and deletes the cookie, and the log says once which setting is missing, with
    no traceback (it is the site's setup, not a failure of this request)."""
    from livepush.sessions.revocations import MemoryRevocations

    client, _ = signed_in()
    client.get("/")
    sessions.set_default_store(MemoryRevocations())
    try:
        with caplog.at_level("WARNING", logger="livepush.contrib.django"):
            response = client.post("/logout/")
    finally:
        sessions.set_default_store(None)
    assert response.cookies["livepush_session"].value == ""
    said = [r for r in caplog.records if r.name == "livepush.contrib.django"]
    assert len(said) == 1 and said[0].exc_info is None, [r.getMessage() for r in said]
    assert "LIVEPUSH_DATABASE_URL" in said[0].getMessage() and "not revoked" in said[0].getMessage()


def test_a_sign_out_whose_store_stays_locked_past_its_writes_timeout_revokes_once_the_lock_goes(
        django_db_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The revocation's write gives up on a locked table after its lock timeout (shortened to
    0.3 s here): the revoking thread tries again until the store takes it, and the session is
    revoked once the lock goes. It gave up at the first timeout, and the session stayed valid."""
    from livepush.contrib.django import sessions as django_sessions
    from livepush.sessions import revocations

    monkeypatch.setattr(revocations, "READ_TIMEOUT", 0.3)
    monkeypatch.setattr(django_sessions, "READ_TIMEOUT", 0.3)
    monkeypatch.setattr(django_sessions, "REVOKE_RETRY_PAUSE", 0.05)
    tries: list[object] = []
    revoke = sessions.revoke

    def counted(token: Any, **kwargs: Any) -> Any:
        tries.append(token)
        return revoke(token, **kwargs)

    monkeypatch.setattr(sessions, "revoke", counted)
    client, _ = signed_in()
    token = client.get("/").cookies["livepush_session"].value
    session = sessions.decode(token, get_settings().secrets)
    with psycopg.connect(django_db_url) as locker:
        locker.execute("LOCK TABLE livepush_revoked_sessions IN ACCESS EXCLUSIVE MODE")
        try:
            assert client.post("/logout/").status_code == 302
            # A try that stored the revocation would have been the last: three mean none did.
            wait_for(lambda: len(tries) >= 3, timeout=20, message="the revocation tried again while the table is locked")
        finally:
            locker.rollback()
    wait_for(lambda: asyncio.run(sessions.default_store().is_revoked(session)), timeout=10,
             message="the session revoked once the lock went")


def test_signing_out_while_the_store_blocks_answers_within_a_bound_and_revokes_once_it_answers(
        django_db_url: str) -> None:
    """A sign-out while the revocation table is locked (a migration, a frozen connection) answers
    after the bound the push server has on a store read, instead of holding the request until the
    lock is gone; the revocation is made once the store answers."""
    from livepush.sessions.revocations import READ_TIMEOUT

    client, _ = signed_in()
    token = client.get("/").cookies["livepush_session"].value
    session = sessions.decode(token, get_settings().secrets)
    with psycopg.connect(django_db_url) as locker, ThreadPoolExecutor(1) as browser:
        locker.execute("LOCK TABLE livepush_revoked_sessions IN ACCESS EXCLUSIVE MODE")
        signing_out = browser.submit(client.post, "/logout/")
        try:
            response = signing_out.result(timeout=READ_TIMEOUT + 5)
        finally:
            locker.rollback()  # the lock goes, whatever the answer: a request still held ends too
    assert response.status_code == 302 and response.cookies["livepush_session"].value == ""
    wait_for(lambda: asyncio.run(sessions.default_store().is_revoked(session)), timeout=10,
             message="the session revoked once the store answered")


BACKEND = "django.contrib.auth.backends.ModelBackend"


@pytest.mark.parametrize("path", ["sync", "async"])
def test_login_and_alogin_revoke_another_users_session_once(path: str) -> None:
    """login() and alogin() reach different receivers, which take the same decisions: another
    user's session in the cookie is revoked, with one write (not one per receiver), and a second
    sign-in in the same request is a sign-in of its own."""
    from asgiref.sync import async_to_sync
    from django.contrib.auth import alogin, login

    first, second = (get_user_model().objects.create_user(f"u{uuid.uuid4().hex[:10]}", password="x")
                     for _ in range(2))
    secrets = get_settings().secrets
    firsts, seconds = sessions.issue(str(first.pk), ttl=3600), sessions.issue(str(second.pk), ttl=3600)
    request = _middleware_request(first, cookie=f"livepush_session={firsts}; __Host-livepush_session={seconds}")
    with _counted_session_writes() as revoked:
        for user in (second, first):
            if path == "sync":
                login(request, user, backend=BACKEND)
            else:
                async_to_sync(alogin)(request, user, backend=BACKEND)
    ids = [sessions.decode(t, secrets).id for t in (firsts, seconds)]
    assert revoked == ids, "the first user's at the first sign-in, the second's at the second: one write each"


@pytest.mark.parametrize("path", ["sync", "async"])
def test_logout_and_alogout_revoke_the_same_sessions_once_each(path: str) -> None:
    """Django's logout() (WSGI, or a sync view) and alogout() (an async view) reach different
    receivers, which take the same decisions: the cookie's session and the ones issued to the
    sign-in are revoked, with one write each (not one per receiver), and the cookie goes."""
    from asgiref.sync import async_to_sync
    from django.contrib.auth import alogout, logout

    user = get_user_model().objects.create_user(f"u{uuid.uuid4().hex[:10]}", password="x")
    secrets = get_settings().secrets
    replaced, current = sessions.issue(str(user.pk), ttl=3600), sessions.issue(str(user.pk), ttl=3600)
    request = _middleware_request(user, cookie=f"livepush_session={current}")
    earlier = sessions.decode(replaced, secrets)
    request.session["_livepush_sessions"] = [[earlier.id, earlier.subject, earlier.expires_at]]
    request.session.save()
    with _counted_session_writes() as revoked:
        if path == "sync":
            logout(request)
        else:
            async_to_sync(alogout)(request)
    assert sorted(revoked) == sorted(sessions.decode(t, secrets).id for t in (replaced, current)), "one write each"
    assert getattr(request, "_livepush_session_revoked", False)


@pytest.mark.parametrize("call", ["alogout", "alogin"])
async def test_alogout_and_alogin_leave_djangos_shared_sync_thread_free_while_the_store_is_locked(
        call: str, django_db_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Under ASGI every sync_to_async() call of the site runs in one shared thread. alogout() and
    alogin() ran livepush's receivers there, which wait up to READ_TIMEOUT for a locked revocation
    store: the whole site's sync code waited behind them. Their receivers now wait in the event loop."""
    import threading

    from asgiref.sync import sync_to_async
    from django.contrib.auth import alogin, alogout

    from livepush.sessions.revocations import READ_TIMEOUT

    user = await get_user_model().objects.acreate_user(f"u{uuid.uuid4().hex[:10]}", password="x")
    other = await get_user_model().objects.acreate_user(f"u{uuid.uuid4().hex[:10]}", password="x")
    token = sessions.issue(str(user.pk), ttl=3600)
    request = await sync_to_async(_middleware_request)(user, cookie=f"livepush_session={token}")
    # Signing in as another user over the cookie's session revokes it, as signing out does.
    signing = alogout(request) if call == "alogout" else alogin(request, other, backend=BACKEND)
    revoking = threading.Event()
    revoke = sessions.revoke

    def noted(token: Any, **kwargs: Any) -> Any:
        revoking.set()
        return revoke(token, **kwargs)

    monkeypatch.setattr(sessions, "revoke", noted)
    locker = await psycopg.AsyncConnection.connect(django_db_url)
    try:
        await locker.execute("LOCK TABLE livepush_revoked_sessions IN ACCESS EXCLUSIVE MODE")
        signing_task = asyncio.create_task(signing)
        assert await asyncio.to_thread(revoking.wait, 10), "the revocation began"
        # Another request's sync code gets the shared thread now, not once the store answered.
        await asyncio.wait_for(sync_to_async(lambda: None)(), timeout=READ_TIMEOUT / 2)
        await asyncio.wait_for(signing_task, timeout=READ_TIMEOUT + 5)
    finally:
        await locker.rollback()
        await locker.close()
    session = sessions.decode(token, get_settings().secrets)
    await async_wait_for(lambda: sessions.default_store().is_revoked(session), timeout=10,
                         message="the session revoked once the lock went")


def _middleware_request(user: Any, *, cookie: str | None = None) -> Any:
    """A request as Django's session and authentication middleware leave it for ours: a Django
    sign-in of `user` (None: anonymous) in a saved Django session, `request.user` and `request.auser`
    set lazily as AuthenticationMiddleware sets them."""
    from django.contrib.auth import SESSION_KEY
    from django.contrib.auth.middleware import AuthenticationMiddleware
    from django.contrib.sessions.backends.db import SessionStore
    from django.http import HttpResponse
    from django.test import RequestFactory

    django_session = SessionStore()
    if user is not None:
        django_session[SESSION_KEY] = str(user.pk)
        django_session["_auth_user_backend"] = "django.contrib.auth.backends.ModelBackend"
        django_session["_auth_user_hash"] = user.get_session_auth_hash()
    django_session.save()
    request = RequestFactory().get("/", **({"HTTP_COOKIE": cookie} if cookie else {}))
    request.session = SessionStore(django_session.session_key)  # unloaded, as a request finds it
    AuthenticationMiddleware(lambda request: HttpResponse()).process_request(request)
    return request


def _through_middleware(path: str, request: Any, view: Callable[[Any], Any] | None = None,
                        headers: dict[str, str] | None = None) -> Any:
    """`request` through LivePushSessionMiddleware on its sync path (a WSGI server) or its async one
    (an ASGI server, which hands it an async get_response), and the response. `view`: what the
    inner get_response does first (sync or async, as the path); `headers`: those of its response."""
    from asgiref.sync import async_to_sync, iscoroutinefunction
    from django.http import HttpResponse

    from livepush.contrib.django import LivePushSessionMiddleware

    if path == "sync":
        def sync_view(request: Any) -> HttpResponse:
            if view is not None:
                view(request)
            return HttpResponse(headers=headers)

        middleware = LivePushSessionMiddleware(sync_view)
        assert not iscoroutinefunction(middleware)
        return middleware(request)

    async def async_view(request: Any) -> HttpResponse:
        if view is not None:
            await view(request)
        return HttpResponse(headers=headers)

    middleware = LivePushSessionMiddleware(async_view)
    # Async itself, so Django calls it without a thread hop under ASGI.
    assert iscoroutinefunction(middleware)
    return async_to_sync(middleware)(request)


@pytest.mark.parametrize("path", ["sync", "async"])
def test_the_middleware_runs_on_either_path_with_the_same_cookies(path: str) -> None:
    """LivePushSessionMiddleware is sync and async capable, as Django documents: under ASGI Django calls it
    without a thread hop per request, and it sets and deletes the same cookies on either path, a
    sign-in's session kept in its Django session for sign-out."""
    user = get_user_model().objects.create_user(f"u{uuid.uuid4().hex[:10]}", password="x")
    secrets = get_settings().secrets
    request = _middleware_request(user)
    cookie = _through_middleware(path, request).cookies["livepush_session"]
    assert cookie["httponly"] and int(cookie["max-age"]) == 86400
    issued = sessions.decode(cookie.value, secrets)
    assert issued.subject == str(user.pk)
    assert [entry[0] for entry in request.session["_livepush_sessions"]] == [issued.id]
    current = _middleware_request(user, cookie=f"livepush_session={cookie.value}")
    assert "livepush_session" not in _through_middleware(path, current).cookies  # current: not issued again
    other = _middleware_request(user, cookie=f"livepush_session={sessions.issue('someone-else', ttl=3600)}")
    assert sessions.decode(_through_middleware(path, other).cookies["livepush_session"].value,
                           secrets).subject == str(user.pk)
    anonymous = _middleware_request(None, cookie=f"livepush_session={cookie.value}")
    assert _through_middleware(path, anonymous).cookies["livepush_session"].value == ""


async def test_under_asgi_a_signed_in_user_gets_the_cookie_and_signing_out_revokes_it() -> None:
    """Through Django's ASGI handler (AsyncClient), the async middleware gives a signed-in user the
    session cookie, keeps it while current, and sign-out revokes it and deletes the cookie."""
    from django.test import AsyncClient

    user = await get_user_model().objects.acreate_user(f"u{uuid.uuid4().hex[:10]}", password="x")
    client = AsyncClient()
    await client.aforce_login(user)
    token = (await client.get("/")).cookies["livepush_session"].value
    assert sessions.decode(token, get_settings().secrets).subject == str(user.pk)
    assert "livepush_session" not in (await client.get("/")).cookies
    response = await client.post("/logout/")
    assert response.cookies["livepush_session"].value == ""
    assert await sessions.default_store().is_revoked(sessions.decode(token, get_settings().secrets))


@pytest.mark.parametrize("path", ["sync", "async"])
def test_a_subject_function_that_reads_the_database_works_on_either_path(path: str) -> None:
    """A LIVEPUSH_SESSION_SUBJECT that reads the database (a profile's id) gives the same subject on
    the async path as on the sync one, never Django's SynchronousOnlyOperation from the event loop."""
    user = get_user_model().objects.create_user(f"u{uuid.uuid4().hex[:10]}", password="x")

    def subject(user: Any) -> str:
        return "name-" + get_user_model().objects.get(pk=user.pk).username

    with override_settings(LIVEPUSH_SESSION_SUBJECT=subject):
        cookie = _through_middleware(path, _middleware_request(user)).cookies["livepush_session"]
    assert sessions.decode(cookie.value, get_settings().secrets).subject == f"name-{user.username}"


@pytest.mark.parametrize("path", ["sync", "async"])
def test_a_subject_function_named_by_its_dotted_path_is_imported_and_called(path: str) -> None:
    """LIVEPUSH_SESSION_SUBJECT as a dotted path, Django's way for a function whose module imports
    models (settings.py importing it stops Django's start), is imported at first use and called
    as the function itself would be, on either path."""
    user = get_user_model().objects.create_user(f"u{uuid.uuid4().hex[:10]}", password="x")
    with override_settings(LIVEPUSH_SESSION_SUBJECT="tests.contrib.django_subjects.subject"):
        cookie = _through_middleware(path, _middleware_request(user)).cookies["livepush_session"]
    assert sessions.decode(cookie.value, get_settings().secrets).subject == f"site-{user.username}"


@pytest.mark.parametrize("path", ["sync", "async"])
def test_a_sign_in_view_that_read_the_anonymous_user_first_gets_the_cookie_at_once(path: str) -> None:
    """A sign-in view that looked at the user first (anonymous then: `request.user`, or
    `await request.auser()` in an async view) and then signed in (`login()`, `alogin()`) gets the
    new user's session on its own response, on either path: Django sets request.user to the user
    signed in, while the user it loaded before stays cached as anonymous."""
    from django.contrib.auth import alogin, login

    user = get_user_model().objects.create_user(f"u{uuid.uuid4().hex[:10]}", password="x")
    backend = "django.contrib.auth.backends.ModelBackend"

    def sync_sign_in(request: Any) -> None:
        assert not request.user.is_authenticated
        login(request, user, backend=backend)

    async def async_sign_in(request: Any) -> None:
        assert not (await request.auser()).is_authenticated
        await alogin(request, user, backend=backend)

    request = _middleware_request(None)
    response = _through_middleware(path, request, sync_sign_in if path == "sync" else async_sign_in)
    assert sessions.decode(response.cookies["livepush_session"].value, get_settings().secrets).subject == str(user.pk)


@override_settings(SESSION_COOKIE_SECURE=True)
def test_behind_a_tls_proxy_the_cookie_is_secure_as_djangos_session_cookie_is() -> None:
    """Behind a proxy that ends TLS, without SECURE_PROXY_SSL_HEADER, Django sees plain HTTP. A site
    whose own session cookie is Secure (SESSION_COOKIE_SECURE, Django's deployment checklist) is
    served over HTTPS: its livepush token goes in the Secure `__Host-` cookie too, never in one a
    browser would send over a plain http:// request to the host for anyone on the path to read."""
    client, user = signed_in()
    cookies = client.get("/").cookies
    cookie = cookies["__Host-livepush_session"]
    assert cookie["secure"] and not cookie["domain"]
    assert sessions.decode(cookie.value, get_settings().secrets).subject == str(user.pk)
    assert cookies["livepush_session"].value == ""  # the other name is deleted


def _directives(response: Any, name: str) -> list[str]:
    return [part.strip().lower() for part in response.get(name, "").split(",") if part.strip()]


@pytest.mark.parametrize("path", ["sync", "async"])
def test_a_response_that_sets_or_deletes_the_cookie_is_kept_from_shared_caches(path: str) -> None:
    """The cookie carries a token: a shared cache in front of the site that stored a page with its
    Set-Cookie would hand one user's session to the next one to ask. A response on which the
    middleware sets or deletes the cookie says `private`, merged with what the view said (its
    `public` goes, its `max-age` and `no-store` stay), and `Vary: Cookie`; one it sets nothing on
    keeps the view's headers as they were."""
    user = get_user_model().objects.create_user(f"u{uuid.uuid4().hex[:10]}", password="x")
    stale = f"livepush_session={sessions.issue('someone', ttl=60)}"
    for headers, kept in (({}, set()), ({"Cache-Control": "public, max-age=600", "Vary": "Accept-Encoding"},
                                         {"max-age=600"}), ({"Cache-Control": "no-store"}, {"no-store"})):
        for request in (_middleware_request(user), _middleware_request(None, cookie=stale)):
            response = _through_middleware(path, request, headers=headers)
            assert "livepush_session" in response.cookies
            directives = _directives(response, "Cache-Control")
            assert "private" in directives and "public" not in directives, directives
            assert kept <= set(directives), directives
            vary = _directives(response, "Vary")
            assert "cookie" in vary and ("accept-encoding" in vary) == ("Vary" in headers), vary
    public = {"Cache-Control": "public, max-age=600"}
    untouched = _through_middleware(path, _middleware_request(None), headers=public)
    assert not untouched.cookies and untouched["Cache-Control"] == "public, max-age=600"
    assert not untouched.has_header("Vary")


def _served(handler: str, cookie: str) -> tuple[int, list[tuple[str, str]]]:
    """GET /livepush.js with `cookie`, through Django's own WSGI or ASGI handler (not the test
    client, which hands back the response object): the status and the headers a server sends."""
    from django.core.handlers.asgi import ASGIHandler
    from django.core.handlers.wsgi import WSGIHandler

    if handler == "wsgi":
        sent: list[Any] = []
        environ = {"REQUEST_METHOD": "GET", "PATH_INFO": "/livepush.js", "SERVER_NAME": "testserver",
                   "SERVER_PORT": "80", "HTTP_HOST": "testserver", "HTTP_COOKIE": cookie, "wsgi.url_scheme": "http",
                   "wsgi.input": io.BytesIO(b""), "wsgi.errors": io.StringIO()}
        body = WSGIHandler()(environ, lambda status, headers: sent.extend([status, headers]))
        body.close()
        return int(sent[0].split()[0]), list(sent[1])

    async def serve() -> dict[str, Any]:
        started: dict[str, Any] = {}
        delivered, never = asyncio.Event(), asyncio.Event()
        requested = False

        async def receive() -> dict[str, Any]:
            nonlocal requested
            if not requested:
                requested = True
                return {"type": "http.request", "body": b"", "more_body": False}
            await never.wait()  # no disconnect: the handler stops listening once it has answered
            return {"type": "http.disconnect"}

        async def send(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                started.update(message)
            elif not message.get("more_body"):
                delivered.set()

        scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "GET",
                 "scheme": "http", "path": "/livepush.js", "raw_path": b"/livepush.js", "query_string": b"",
                 "root_path": "", "client": ("127.0.0.1", 50000), "server": ("testserver", 80),
                 "headers": [(b"host", b"testserver"), (b"cookie", cookie.encode())]}
        await asyncio.wait_for(ASGIHandler()(scope, receive, send), timeout=30)
        assert delivered.is_set()
        return started

    started = asyncio.run(serve())
    return started["status"], [(name.decode(), value.decode()) for name, value in started["headers"]]


@pytest.mark.parametrize("handler", ["wsgi", "asgi"])
@override_settings(LIVEPUSH_SESSION_COOKIE_DOMAIN="testserver")
def test_an_anonymous_request_loses_the_host_only_copy_beside_the_domains(handler: str) -> None:
    """A browser that kept a host-only `livepush_session` from before the site set
    LIVEPUSH_SESSION_COOKIE_DOMAIN sends it beside the domain's (the browser says neither's
    Domain): an anonymous response deletes both, in two Set-Cookie headers of that name, under
    Django's WSGI and ASGI handlers alike, and keeps the answer from shared caches."""
    host_only, on_domain = sessions.issue("earlier", ttl=3600), sessions.issue("someone", ttl=3600)
    status, headers = _served(handler, f"livepush_session={host_only}; livepush_session={on_domain}")
    assert status == 200
    deleted = []
    for name, value in headers:
        if name.lower() == "set-cookie" and value.strip().startswith("livepush_session="):
            morsel = SimpleCookie(value.strip())["livepush_session"]
            assert morsel.value == "" and str(morsel["max-age"]) == "0", value
            deleted.append(morsel["domain"])
    assert sorted(deleted) == ["", "testserver"], headers
    cache_control = [value for name, value in headers if name.lower() == "cache-control"]
    assert len(cache_control) == 1 and "private" in cache_control[0] and "public" not in cache_control[0]


@pytest.mark.parametrize("handler", ["wsgi", "asgi"])
def test_a_moved_cookies_old_copy_is_deleted_by_the_response_that_moves_it(handler: str) -> None:
    """A signed-in user's host-only `livepush_session` from before LIVEPUSH_SESSION_COOKIE_DOMAIN
    was set is moved to the domain by one response, which deletes the host-only copy first, then
    sets the domain's, under Django's WSGI and ASGI handlers alike: the browser never keeps both
    (two different session cookies count as none), and one that takes a host-only cookie and its
    host's Domain cookie of the same name for one cookie keeps the new one. The next request,
    with the new copy alone, is answered with no session cookie."""
    client, user = signed_in()
    before = client.get("/").cookies["livepush_session"]
    assert before.value and not before["domain"]
    with override_settings(LIVEPUSH_SESSION_COOKIE_DOMAIN="testserver"):
        status, headers = _served(handler, _with_sign_in(client, f"livepush_session={before.value}"))
        assert status == 200
        written = [SimpleCookie(value.strip())["livepush_session"] for name, value in headers
                   if name.lower() == "set-cookie" and value.strip().startswith("livepush_session=")]
        assert [(morsel["domain"], morsel.value == "") for morsel in written] == [("", True), ("testserver", False)], \
            headers
        assert str(written[0]["max-age"]) == "0", headers
        assert sessions.decode(written[1].value, get_settings().secrets).subject == str(user.pk)
        status, headers = _served(handler, _with_sign_in(client, f"livepush_session={written[1].value}"))
    assert status == 200
    assert not [value for name, value in headers if name.lower() == "set-cookie" and "livepush_session" in value], \
        headers
