"""The session dependency (docs/frameworks.md#starlette-and-fastapi): a request's livepush session
comes from its session cookie; without a usable one the app answers 401 (no cookie, two different
ones, a malformed, forged or expired token) or 403 (revoked), and 503 when the store cannot be
reached; never a traceback. optional_session gives None instead, for pages anyone may see. The
example app uses both through FastAPI's Depends, and plain Starlette awaits them."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable

import httpx
import psycopg
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from examples.fastapi_app.app import app as example
from livepush import config, sessions
from livepush.contrib.starlette import current_session
from livepush.sessions import PostgresRevocations
from livepush.sessions.revocations import READ_TIMEOUT
from tests.contrib.conftest import cookie_header, serving

REPORT = {"steps": 1}


@pytest.fixture
async def client(app_env: dict[str, str]) -> AsyncIterator[httpx.AsyncClient]:
    async with serving(example) as c:
        yield c


def issued_with_another_secret() -> str:
    mine = config.get_settings()
    config.set_settings(mine.replace(secret="another-secret-" + "x" * 40))
    try:
        return sessions.issue("ana")
    finally:
        config.set_settings(mine)


async def refused(client: httpx.AsyncClient, headers: dict[str, str]) -> tuple[int, str]:
    answer = await client.post("/reports", json=REPORT, headers=headers)
    assert answer.headers["content-type"] == "application/json", answer.text
    return answer.status_code, answer.json()["detail"]


async def test_a_valid_session_cookie_gives_the_session(client: httpx.AsyncClient) -> None:
    """The route runs as the cookie's subject (here: it enqueues a job for it)."""
    answer = await client.post("/reports", json=REPORT, headers=cookie_header(sessions.issue("ana")))
    assert answer.status_code == 200, answer.text
    assert answer.json()["job"] > 0 and answer.json()["topic"].startswith(f"job:{answer.json()['job']}~")


async def test_a_request_without_a_usable_session_gets_401(client: httpx.AsyncClient) -> None:
    """No cookie, a token that is not one, one signed with another secret, an expired one, and two
    different session cookies (a planted one beside the real one): each a 401 saying to sign in."""
    expired = sessions.issue("ana", ttl=1, now=time.time() - 60)
    cases = {
        "missing": {},
        "malformed": cookie_header("not-a-token"),
        "bad_signature": cookie_header(issued_with_another_secret()),
        "expired": cookie_header(expired),
        "two cookies": {"Cookie": f"livepush_session={sessions.issue('ana')}; "
                                  f"__Host-livepush_session={sessions.issue('eve')}"},
    }
    for case, headers in cases.items():
        status, detail = await refused(client, headers)
        assert status == 401, (case, detail)
        assert "sign in" in detail, (case, detail)
    assert "expired" in (await refused(client, cookie_header(expired)))[1]


async def test_a_revoked_session_gets_403(client: httpx.AsyncClient) -> None:
    """A session revoked (signed out, elsewhere too) is refused with 403."""
    token = sessions.issue("ana")
    await sessions.arevoke(token)
    status, detail = await refused(client, cookie_header(token))
    assert status == 403 and "revoked" in detail


async def test_an_unreachable_store_answers_503(client: httpx.AsyncClient) -> None:
    """When revocations cannot be read the answer is 503 (try again), not a pass, not a traceback."""
    sessions.set_default_store(PostgresRevocations("postgresql://livepush@127.0.0.1:1/nothing"))
    status, detail = await refused(client, cookie_header(sessions.issue("ana")))
    assert status == 503 and "try again" in detail


async def test_a_store_read_that_blocks_answers_503_within_a_bound(client: httpx.AsyncClient, pg_url: str) -> None:
    """A revocation check that blocks (a migration holding a revocation table's lock, a frozen
    connection) answers 503 after the server's own bound on a store read, as the push server's
    handshake does, instead of holding every signed-in request until the lock is gone."""
    token = sessions.issue("ana")
    locker = await psycopg.AsyncConnection.connect(pg_url)
    try:
        await locker.execute("LOCK TABLE livepush_revoked_sessions IN ACCESS EXCLUSIVE MODE")
        status, detail = await asyncio.wait_for(refused(client, cookie_header(token)), READ_TIMEOUT + 10)
        assert status == 503 and "try again" in detail
    finally:
        await locker.rollback()
        await locker.close()


async def test_optional_session_renders_the_page_for_anyone(client: httpx.AsyncClient) -> None:
    """The page depends on optional_session: signed out, revoked or garbage, it renders the sign-in
    form; with a session, the user's page."""
    revoked = sessions.issue("bob")
    await sessions.arevoke(revoked)
    for headers in ({}, cookie_header("garbage"), cookie_header(revoked)):
        answer = await client.get("/", headers=headers)
        assert answer.status_code == 200 and 'data-subject=""' in answer.text
    answer = await client.get("/", headers=cookie_header(sessions.issue("ana")))
    assert answer.status_code == 200 and 'data-subject="ana"' in answer.text


async def test_optional_session_renders_the_page_for_anyone_while_the_store_is_down(
        client: httpx.AsyncClient) -> None:
    """A page anyone may see renders as for a visitor who is not signed in while revocations
    cannot be read, instead of answering 503 to everyone; a page that needs the session still
    answers 503."""
    sessions.set_default_store(PostgresRevocations("postgresql://livepush@127.0.0.1:1/nothing"))
    answer = await client.get("/", headers=cookie_header(sessions.issue("ana")))
    assert answer.status_code == 200 and 'data-subject=""' in answer.text
    assert (await refused(client, cookie_header(sessions.issue("ana"))))[0] == 503


async def whoami(request: Request) -> JSONResponse:
    session = await current_session(request)
    return JSONResponse({"subject": session.subject})


async def test_plain_starlette_awaits_the_dependency(app_env: dict[str, str]) -> None:
    """Without FastAPI: `await current_session(request)`; Starlette answers the refusal as text."""
    app = Starlette(routes=[Route("/me", whoami)])
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://127.0.0.1") as c:
        answer = await c.get("/me")
        assert answer.status_code == 401 and "sign in" in answer.text
        answer = await c.get("/me", headers=cookie_header(sessions.issue("ana")))
        assert answer.json() == {"subject": "ana"}


def test_without_the_lifespan_each_event_loop_checks_sessions_against_redis(
        redis_url: str, livepush_env: Callable[..., dict[str, str]]) -> None:
    """An app used without its lifespan by FastAPI's TestClient outside `with` runs each request
    on an event loop of its own. With Redis as the revocation store, every request still checks
    its session (a client made on a finished loop is not reused), and a revoked one gets 403."""
    from fastapi.testclient import TestClient

    from tests.contrib.conftest import forget_defaults

    forget_defaults()
    config.set_settings(config.Settings.from_env(livepush_env(redis_url=redis_url, fanout="redis")))
    try:
        app = Starlette(routes=[Route("/me", whoami)])
        token = sessions.issue("ana")
        client = TestClient(app, headers=cookie_header(token))
        assert [client.get("/me").status_code for _ in range(3)] == [200, 200, 200]
        sessions.revoke(token)
        assert client.get("/me").status_code == 403
    finally:
        forget_defaults()
