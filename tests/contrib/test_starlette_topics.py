"""The signed-topic helpers (docs/frameworks.md#starlette-and-fastapi): page_topic() gives a page
the topic signed (its own permission, expiring after LIVEPUSH_SIGNED_TOPIC_TTL) and the latest
offset, from which a subscriber gets exactly what was published after the page was rendered; a
state topic has no offset (the page gets its current state). SignedTopic("chat:{room}") signs
only what its template names: a path parameter never reaches into another namespace."""

from __future__ import annotations

import re
import time
from collections.abc import AsyncIterator
from datetime import timedelta

import httpx
import pytest
from fastapi import Depends, FastAPI
from starlette.requests import Request

import livepush
from livepush import config, topics
from livepush.contrib.starlette import PageTopic, SignedTopic, lifespan, page_topic
from livepush.errors import ArgumentTypeError, ArgumentValueError, InvalidTopic
from livepush.jobs import JobHandle
from tests.contrib.conftest import serving
from tests.support.procs import Processes
from tests.support.wsclient import WSClient


async def test_a_page_topic_is_signed_and_expires(app_env: dict[str, str]) -> None:
    """The signature names the plain topic and lapses after the configured TTL (or the one given)."""
    async with lifespan(None):
        page = await page_topic("chat:lobby")
        short = await page_topic("chat:lobby", ttl=5)
    secrets = config.get_settings().secrets
    assert page.topic == "chat:lobby" and topics.verify(page.signed, secrets) == "chat:lobby"
    ttl = config.get_settings().signed_topic_ttl
    with pytest.raises(InvalidTopic):
        topics.verify(page.signed, secrets, now=time.time() + ttl + 5)
    with pytest.raises(InvalidTopic):
        topics.verify(short.signed, secrets, now=time.time() + 10)
    assert page.as_dict() == {"topic": page.signed, "since": page.since}


async def test_a_page_topic_takes_a_timedelta_ttl(app_env: dict[str, str]) -> None:
    """page_topic(ttl=) and SignedTopic(ttl=) take a timedelta, as every seconds argument of livepush
    does, and sign for its seconds; they refused one, pointing at .total_seconds()."""
    ten_minutes = timedelta(minutes=10)
    async with lifespan(None):
        pages = [await page_topic("chat:lobby", ttl=ten_minutes)]
        scope = {"type": "http", "method": "GET", "path": "/rooms/lobby", "headers": [], "query_string": b"",
                 "path_params": {"room": "lobby"}}
        pages.append(await SignedTopic("chat:{room}", ttl=ten_minutes)(Request(scope)))
    for page in pages:
        expires = int(page.signed.split(topics.SEP)[1])
        assert time.time() + 600 - 5 <= expires <= time.time() + 600 + 1


async def test_a_subscriber_from_the_page_offset_misses_nothing_after_it(app_env: dict[str, str],
                                                                         procs: Processes) -> None:
    """Published before the page: not replayed; published after it: delivered, in order."""
    server = await procs.alivepush("serve", env=app_env)
    async with lifespan(None):
        await livepush.apublish("chat:lobby", {"n": 1})
        page = await page_topic("chat:lobby")
        assert page.since == await livepush.alatest_offset("chat:lobby")
        await livepush.apublish("chat:lobby", {"n": 2})
        await livepush.apublish("chat:lobby", {"n": 3})
    ws = await WSClient.open(f"ws://127.0.0.1:{server.port}/")
    try:
        assert (await ws.subscribe(page.signed, since=page.since))["op"] == "subscribed"
        assert [m["data"] for m in await ws.messages(2)] == [{"n": 2}, {"n": 3}]
    finally:
        await ws.close()


async def test_a_state_topic_has_no_offset(app_env: dict[str, str]) -> None:
    """job:<id> shows its job's current state: the page subscribes without `since`."""
    async with lifespan(None):
        page = await page_topic("job:42")
    assert page.since is None and topics.verify(page.signed, config.get_settings().secrets) == "job:42"


def rooms_app() -> FastAPI:
    app = FastAPI(lifespan=lifespan)

    @app.get("/rooms/{room}")
    async def room(page: PageTopic = Depends(SignedTopic("chat:{room}"))) -> dict[str, str | None]:
        return page.as_dict()

    async def team_topic(request: Request) -> str:
        return f"team:{request.query_params['team']}:news"

    @app.get("/team")
    async def team(page: PageTopic = Depends(SignedTopic(team_topic, ttl=60))) -> dict[str, str | None]:
        return page.as_dict()

    return app


@pytest.fixture
async def client(app_env: dict[str, str]) -> AsyncIterator[httpx.AsyncClient]:
    async with serving(rooms_app()) as c:
        yield c


async def test_the_dependency_signs_the_templates_topic(client: httpx.AsyncClient) -> None:
    """`Depends(SignedTopic("chat:{room}"))` fills the template from the path; a callable names
    the topic itself."""
    answer = await client.get("/rooms/lobby")
    assert answer.status_code == 200
    assert topics.verify(answer.json()["topic"], config.get_settings().secrets) == "chat:lobby"
    assert answer.json()["since"] == await livepush.alatest_offset("chat:lobby")
    answer = await client.get("/team", params={"team": "7"})
    assert topics.verify(answer.json()["topic"], config.get_settings().secrets) == "team:7:news"


async def test_a_path_parameter_never_reaches_another_namespace(client: httpx.AsyncClient) -> None:
    """A room with a topic separator (`:`, `.`) or a character no topic has gets 404, never a
    signature for chat:admin:x."""
    for room in ("admin:x", "a.b", "a~b", "a%20b"):
        answer = await client.get(f"/rooms/{room}")
        assert answer.status_code == 404, (room, answer.text)
        assert answer.json() == {"detail": "no such topic"}


async def test_page_topic_written_as_a_dependency_signs_nothing_a_request_names(app_env: dict[str, str]) -> None:
    """`Depends(page_topic)`, written by mistake for `Depends(SignedTopic(...))`, would take the
    topic from the query string and sign any topic a visitor asks for: every request fails instead."""
    app = FastAPI(lifespan=lifespan)

    @app.get("/page")
    async def page(page: PageTopic = Depends(page_topic)) -> dict[str, str | None]:
        return page.as_dict()

    async with serving(app) as client:
        with pytest.raises(TypeError, match="positional-only"):
            await client.get("/page", params={"topic": "admin:secrets"})


@pytest.mark.parametrize("template", ["chat:{room", "chat:{}", "chat:{0}", "chat:{room.upper}", "chat:{room[0]}",
                                      "chat:{room!r}", "chat:{room:>9}", "chat {room}"])
def test_a_template_no_request_could_fill_is_refused_where_the_route_is_written(template: str) -> None:
    """A malformed template, a slot that is not a plain path parameter name, or text no topic has:
    ValueError naming the template at SignedTopic(...), when the app is defined, not a 404 that
    every request to the route would get."""
    with pytest.raises(ValueError, match=re.escape(repr(template))):
        SignedTopic(template)


async def test_a_slot_the_route_has_no_parameter_for_is_an_error_naming_it(app_env: dict[str, str]) -> None:
    """SignedTopic("chat:{room_id}") on /rooms/{room}: the request fails with ArgumentValueError
    naming the slot and the route's parameters, not a 404 that reads as a room that does not exist."""
    app = FastAPI(lifespan=lifespan)

    @app.get("/rooms/{room}")
    async def room(page: PageTopic = Depends(SignedTopic("chat:{room_id}"))) -> dict[str, str | None]:
        return page.as_dict()

    async with serving(app) as client:
        with pytest.raises(ArgumentValueError, match=r"room_id.*\broom\b"):
            await client.get("/rooms/lobby")


async def test_a_topic_function_that_returns_no_str_is_an_error_naming_it(app_env: dict[str, str]) -> None:
    """SignedTopic(fn) whose fn returns an int (a path parameter converted by the route) or None
    (a forgotten return): the request fails with ArgumentTypeError naming the function, a mistake
    in the app, not a 404 that reads as a topic that does not exist."""
    app = FastAPI(lifespan=lifespan)

    def room_number(request: Request) -> str:
        return request.path_params["n"]  # type: ignore[no-any-return]  # an int under {n:int}

    async def forgot(request: Request) -> str:
        f"chat:{request.path_params['n']}"  # noqa: B018
        return None  # type: ignore[return-value]

    @app.get("/numbered/{n:int}")
    async def numbered(page: PageTopic = Depends(SignedTopic(room_number))) -> dict[str, str | None]:
        return page.as_dict()

    @app.get("/forgot/{n}")
    async def forgotten(page: PageTopic = Depends(SignedTopic(forgot))) -> dict[str, str | None]:
        return page.as_dict()

    async with serving(app) as client:
        with pytest.raises(ArgumentTypeError, match=r"room_number.* returned an int"):
            await client.get("/numbered/7")
        with pytest.raises(ArgumentTypeError, match=r"forgot.* returned None"):
            await client.get("/forgot/7")


def test_a_topic_function_that_cannot_take_the_request_is_refused_where_the_route_is_written() -> None:
    """SignedTopic(fn) calls fn(request) at each request of the route: one that cannot take it
    (no parameter, or two) raises ArgumentTypeError naming it where the app is defined, not a
    500 for every visitor."""
    def no_request() -> str:
        return "chat:lobby"

    def two(request: Request, room: str) -> str:
        return f"chat:{room}"

    for fn in (no_request, two):
        with pytest.raises(ArgumentTypeError, match=rf"SignedTopic\(.*{fn.__name__}\) is called with the request alone"):
            SignedTopic(fn)
    SignedTopic(lambda request: "chat:lobby")
    SignedTopic(lambda request, extra=None: "chat:lobby")


async def test_a_path_parameter_the_template_does_not_name_is_not_checked(app_env: dict[str, str]) -> None:
    """Only the slots the template fills must be free of separators: another path parameter of
    the route (a file name with a dot) does not make the request a 404."""
    app = FastAPI(lifespan=lifespan)

    @app.get("/rooms/{room}/files/{name}")
    async def room_file(page: PageTopic = Depends(SignedTopic("chat:{room}"))) -> dict[str, str | None]:
        return page.as_dict()

    async with serving(app) as client:
        answer = await client.get("/rooms/lobby/files/report.pdf")
        assert answer.status_code == 200, answer.text
        assert topics.verify(answer.json()["topic"], config.get_settings().secrets) == "chat:lobby"
        assert (await client.get("/rooms/a.b/files/report.pdf")).status_code == 404


@pytest.mark.parametrize("template", ["room:{org}-{repo}", "room:{org}{repo}", "room:{org}_x-{repo}:log"])
def test_two_slots_without_a_separator_between_them_are_refused_where_the_route_is_written(template: str) -> None:
    """Under room:{org}-{repo}, org `a-b` with repo `c` and org `a` with repo `b-c` both fill
    room:a-b-c: whoever may see the first pair would get the second's topic signed. Two slots
    need a separator (`:`, `/`, `.`) between them, which no slot's value holds: ValueError naming
    the template at SignedTopic(...)."""
    with pytest.raises(ValueError, match=re.escape(repr(template)) + r".*separator"):
        SignedTopic(template)


@pytest.mark.parametrize("template", ["room:{org}:{repo}", "room:{org}/{repo}-log", "room:{org}-x.{repo}",
                                      "room:{org}-{org}", "room:{org}-inbox"])
def test_slots_a_separator_keeps_apart_are_accepted(template: str) -> None:
    """A separator between two slots pins where the first ends (its value never holds one); a slot
    beside fixed text, or the same slot twice, fills one topic for each value."""
    assert SignedTopic(template).topic == template


@pytest.mark.parametrize("ttl", ["3600", 0, -5, float("inf"), float("nan"), True, timedelta(0), timedelta(hours=-1)],
                         ids=["text", "zero", "negative", "infinite", "nan", "bool", "zero_timedelta",
                              "negative_timedelta"])
def test_a_ttl_no_topic_could_be_signed_for_is_refused_where_the_route_is_written(ttl: object) -> None:
    """SignedTopic(..., ttl=) that no signing takes (text, zero or less, as a number or a timedelta):
    an error naming ttl at SignedTopic(...), when the app is defined, not a 500 at every request."""
    for topic in ("chat:{room}", lambda request: "chat:lobby"):
        with pytest.raises((ArgumentTypeError, ArgumentValueError), match="ttl"):
            SignedTopic(topic, ttl=ttl)  # type: ignore[arg-type]


async def test_a_bad_page_ttl_says_that_none_is_the_default_lifetime_not_no_expiry(app_env: dict[str, str]) -> None:
    """Where ttl=None means LIVEPUSH_SIGNED_TOPIC_TTL (page_topic, SignedTopic, a handle's sign()), a
    refused ttl says so: told "None: no expiry", a user would pass None for a topic that never
    expires and get one that lapses after a day."""
    calls = [lambda: SignedTopic("chat:{room}", ttl=0), lambda: JobHandle(1).sign(ttl=0)]
    async with lifespan(None):
        for call in calls:
            with pytest.raises(ArgumentValueError, match="None: LIVEPUSH_SIGNED_TOPIC_TTL") as caught:
                call()
            assert "no expiry" not in str(caught.value)
        with pytest.raises(ArgumentValueError, match="None: LIVEPUSH_SIGNED_TOPIC_TTL") as caught:
            await page_topic("chat:lobby", ttl=0)
        assert "no expiry" not in str(caught.value)
