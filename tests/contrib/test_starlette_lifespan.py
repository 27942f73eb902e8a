"""The Starlette/FastAPI lifespan (docs/frameworks.md#starlette-and-fastapi): the app's start opens
the pools and clients publish(), latest_offset(), enqueues and revoke() use, refusing bad settings
with livepush's own errors; its stop closes every one of them, those sync endpoints opened in
threads too, so nothing stays connected; a user's own lifespan runs inside it; and livepush
imports without Starlette."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import psycopg
import pytest
import redis
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

import livepush
from livepush import blocking, config, jobs
from livepush.contrib.starlette import current_session, lifespan, with_livepush
from livepush.errors import ArgumentTypeError, ConfigError, DependencyError, SchemaError
from livepush.jobs import database
from livepush.jobs.api.registry import Registry
from livepush.sessions import issue
from examples.fastapi_app import tasks
from tests.contrib.conftest import connections, cookie_header, forget_defaults, serving
from tests.support.procs import REPO_ROOT
from tests.support.waiting import async_wait_for


def publish_sync(request: Request) -> JSONResponse:
    # A sync endpoint runs in a thread: publish() uses the fan-out's sync pool.
    return JSONResponse({"offset": livepush.publish("news:sync", {"n": 1})})


async def publish_on_the_loop(request: Request) -> JSONResponse:
    # The mistake: the sync publish() in an async endpoint, which waits on the app's loop.
    return JSONResponse({"offset": livepush.publish("news:loop", {"n": 3})})


async def publish_async(request: Request) -> JSONResponse:
    return JSONResponse({"offset": await livepush.apublish("news:async", {"n": 2}),
                         "latest": await livepush.alatest_offset("news:async")})


async def enqueue(request: Request) -> JSONResponse:
    handle = await tasks.build_report.aenqueue("ana", 1)
    return JSONResponse({"job": handle.id})


async def me(request: Request) -> JSONResponse:
    session = await current_session(request)  # plain Starlette: awaited, no Depends
    return JSONResponse({"subject": session.subject})


def make_app(lifespan_: Callable[[Any], Any] = lifespan) -> Starlette:
    routes = [Route("/sync", publish_sync, methods=["POST"]), Route("/async", publish_async, methods=["POST"]),
              Route("/enqueue", enqueue, methods=["POST"]), Route("/me", me),
              Route("/loop", publish_on_the_loop, methods=["POST"])]
    return Starlette(routes=routes, lifespan=lifespan_)


async def use_everything(client: Any) -> None:
    """Publish from a thread and from the loop, enqueue, and check a session against the store."""
    assert (await client.post("/sync")).status_code == 200
    assert (await client.post("/async")).status_code == 200
    assert (await client.post("/enqueue")).status_code == 200
    answer = await client.get("/me", headers=cookie_header(issue("ana")))
    assert answer.status_code == 200 and answer.json() == {"subject": "ana"}


async def test_start_opens_the_pools_and_stop_leaves_no_connection(app_env: dict[str, str], pg_admin_url: str) -> None:
    """Connections are open once the app has started, before any request, and none is left after
    it stopped, whether the app used them from its loop or from threads."""
    url = app_env["LIVEPUSH_DATABASE_URL"]
    app = make_app()
    assert connections(pg_admin_url, url) == 0
    async with serving(app) as client:
        assert connections(pg_admin_url, url) >= 3  # the fan-out's, the store's and the jobs' pools
        await use_everything(client)
        assert connections(pg_admin_url, url) >= 4  # and the sync pool publish() used in a thread
    await async_wait_for(lambda: connections(pg_admin_url, url) == 0, timeout=5,
                         message="every connection of the app closed after its shutdown")


async def test_a_second_start_after_a_stop_works(app_env: dict[str, str], pg_admin_url: str) -> None:
    """What a stop closed opens again at the next start (a reloaded app, a test's next app)."""
    for _ in range(2):
        async with serving(make_app()) as client:
            await use_everything(client)
    await async_wait_for(lambda: connections(pg_admin_url, app_env["LIVEPUSH_DATABASE_URL"]) == 0, timeout=5,
                         message="every connection closed")


def loop_warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "livepush" and "event loop" in r.getMessage()]


async def test_a_sync_publish_in_an_async_endpoint_warns_once_naming_apublish(
        app_env: dict[str, str], caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    """livepush.publish() in an async endpoint works, but the app's loop waits for its round trip
    and serves no other request meanwhile: one WARNING per process names the call, where it was
    made, and `await livepush.apublish()`. From a sync endpoint (Starlette runs it in a thread) or
    through asyncio.to_thread() it is right, and says nothing."""
    monkeypatch.setattr(blocking, "_said", set())  # this process may have warned already
    with caplog.at_level("WARNING", logger="livepush"):
        async with serving(make_app()) as client:
            assert (await client.post("/sync")).status_code == 200
            await asyncio.to_thread(livepush.publish, "news:thread", {"n": 4})
            assert loop_warnings(caplog) == []
            for _ in range(2):
                assert (await client.post("/loop")).status_code == 200
    said = loop_warnings(caplog)
    assert len(said) == 1, said
    assert "livepush.publish()" in said[0] and "await livepush.apublish()" in said[0], said
    assert "test_starlette_lifespan.py" in said[0], said


async def test_a_sync_publish_on_the_local_fan_out_in_an_async_endpoint_says_nothing(
        livepush_env: Callable[..., dict[str, str]], caplog: pytest.LogCaptureFixture,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """On the local fan-out a publish goes into the app's own process, with no round trip for the
    loop to wait for: livepush.publish() in an async endpoint is right there, and says nothing."""
    monkeypatch.setattr(blocking, "_said", set())
    forget_defaults()
    config.set_settings(config.Settings.from_env(livepush_env(fanout="local")))
    try:
        with caplog.at_level("WARNING", logger="livepush"):
            async with serving(make_app()) as client:
                assert (await client.post("/loop")).status_code == 200
        assert loop_warnings(caplog) == []
    finally:
        forget_defaults()


def redis_clients(url: str) -> list[str]:
    client = redis.Redis.from_url(url)
    try:
        return [c["name"] for c in client.client_list() if c.get("name", "").startswith("livepush")]
    finally:
        client.close()


async def test_redis_fan_out_clients_close_with_the_app(pg_url: str, redis_url: str, pg_admin_url: str,
                                                         livepush_env: Callable[..., dict[str, str]]) -> None:
    """With the Redis fan-out the publishing clients, async and sync, close at the stop too."""
    env = livepush_env(database_url=pg_url, redis_url=redis_url, fanout="redis")
    forget_defaults()
    config.set_settings(config.Settings.from_env(env))
    try:
        async with serving(make_app()) as client:
            assert redis_clients(redis_url), "the app's start opened its Redis client"
            await use_everything(client)
            assert len(redis_clients(redis_url)) >= 2  # the loop's client and the one publish() used in a thread
        await async_wait_for(lambda: redis_clients(redis_url) == [], timeout=5, message="no livepush Redis client left")
        await async_wait_for(lambda: connections(pg_admin_url, pg_url) == 0, timeout=5, message="no connection left")
    finally:
        forget_defaults()


async def start_with(settings: config.Settings) -> None:
    config.set_settings(settings)
    try:
        async with lifespan(None):
            raise AssertionError("the app started")
    finally:
        forget_defaults()


async def test_bad_settings_stop_the_start_with_one_clear_error(app_env: dict[str, str], pg_admin_url: str,
                                                                 make_pg_url: Callable[[], str]) -> None:
    """No secret, an unreachable database or a schema that was never migrated: the start fails with
    ConfigError, DependencyError or SchemaError saying what to do, and leaves nothing open."""
    settings = config.Settings.from_env(app_env)
    with pytest.raises(ConfigError, match="LIVEPUSH_SECRET"):
        await start_with(config.Settings.from_env({k: v for k, v in app_env.items() if k != "LIVEPUSH_SECRET"}))
    with pytest.raises(DependencyError):
        await start_with(settings.replace(database_url="postgresql://livepush@127.0.0.1:1/nothing"))
    bare = make_pg_url()
    with psycopg.connect(bare, autocommit=True) as conn:
        conn.execute("DROP TABLE livepush_schema")
    with pytest.raises(SchemaError, match="livepush migrate"):
        await start_with(settings.replace(database_url=bare))
    # A closed connection's backend leaves pg_stat_activity as it exits, a moment after the close.
    await async_wait_for(lambda: connections(pg_admin_url, bare) == 0, timeout=5,
                         message="no connection left open by the refused start")


async def test_a_jobs_database_that_was_never_migrated_stops_the_start(app_env: dict[str, str], pg_admin_url: str,
                                                                       make_pg_url: Callable[[], str]) -> None:
    """Jobs kept in another database (jobs.configure(url)) that was never migrated: the start
    fails with SchemaError saying `livepush migrate`, as for LIVEPUSH_DATABASE_URL's, rather
    than the app's first enqueue, and leaves nothing open there."""
    bare = make_pg_url()
    with psycopg.connect(bare, autocommit=True) as conn:
        conn.execute("DROP TABLE livepush_schema")
    database.configure(bare)
    with pytest.raises(SchemaError, match="livepush migrate"):
        await start_with(config.Settings.from_env(app_env))
    # A closed connection's backend leaves pg_stat_activity as it exits, a moment after the close.
    await async_wait_for(lambda: connections(pg_admin_url, bare) == 0, timeout=5,
                         message="no connection left open on the jobs' database by the refused start")


async def test_a_user_lifespan_runs_inside_and_keeps_its_state(app_env: dict[str, str], pg_admin_url: str) -> None:
    """with_livepush(yours): yours starts after livepush opened (it may publish) and stops before
    livepush closes; the state it yields is what the app's lifespan yields (Starlette hands it to
    every request as request.state)."""
    seen: list[str] = []

    @asynccontextmanager
    async def mine(app: Any) -> AsyncIterator[dict[str, str]]:
        seen.append(await livepush.apublish("news:boot", {"up": True}))
        yield {"greeting": "hello"}
        seen.append(await livepush.apublish("news:boot", {"up": False}))

    app = Starlette(lifespan=with_livepush(mine))
    async with app.router.lifespan_context(app) as state:
        assert state == {"greeting": "hello"}
        assert len(seen) == 1
    assert len(seen) == 2 and seen[0] != seen[1]
    await async_wait_for(lambda: connections(pg_admin_url, app_env["LIVEPUSH_DATABASE_URL"]) == 0, timeout=5,
                         message="every connection closed")


def test_a_lifespan_with_livepush_cannot_run_is_refused_where_the_app_is_written() -> None:
    """with_livepush() given what no app's start could enter (a lifespan written without
    @asynccontextmanager, or the lifespan's result instead of the function) raises
    ArgumentTypeError naming what to write, where the app is defined, not a TypeError from
    inside the server's start."""
    async def undecorated(app: Any) -> AsyncIterator[None]:
        yield

    def sync_undecorated(app: Any) -> Any:
        yield

    @asynccontextmanager
    async def mine(app: Any) -> AsyncIterator[None]:
        yield

    decorate = "@contextlib.asynccontextmanager"
    for wrong, said in ((undecorated, decorate), (sync_undecorated, decorate), (mine(None), "the function itself")):
        with pytest.raises(ArgumentTypeError, match=said):
            with_livepush(wrong)


async def test_with_livepush_given_as_the_lifespan_itself_stops_the_start_saying_what_to_write() -> None:
    """`lifespan=with_livepush`, the wrapper not called with a lifespan of yours: Starlette calls it
    with the app at the start, which failed with "'function' object does not support the
    asynchronous context manager protocol" from inside Starlette's router. ArgumentTypeError
    says to write with_livepush(yours), or lifespan alone."""
    app = Starlette(lifespan=with_livepush)
    with pytest.raises(ArgumentTypeError, match=r"with_livepush\(your_lifespan\).*lifespan=lifespan"):
        async with app.router.lifespan_context(app):
            pass


async def warned_at_start(env: dict[str, str], caplog: pytest.LogCaptureFixture) -> list[str]:
    """The warnings an app's start and stop log on `env`'s settings (the start must succeed)."""
    forget_defaults()
    config.set_settings(config.Settings.from_env(env))
    try:
        with caplog.at_level("WARNING", logger="livepush.contrib"):
            async with lifespan(None):
                pass
    finally:
        forget_defaults()
    return [r.getMessage() for r in caplog.records if r.name == "livepush.contrib"]


@pytest.mark.parametrize("database", [False, True], ids=["nothing-shared", "fanout-local-beside-a-database"])
async def test_a_local_fan_out_is_a_warning_naming_the_setting(database: bool, pg_url: str,
                                                                livepush_env: Callable[..., dict[str, str]],
                                                                caplog: pytest.LogCaptureFixture) -> None:
    """The local fan-out delivers only inside the app's own process, where no `livepush serve`
    runs: the start warns, naming LIVEPUSH_FANOUT, that the app's messages reach no server (the
    app still starts: a test of the app may want exactly that)."""
    said = await warned_at_start(livepush_env(database_url=pg_url if database else None, fanout="local"), caplog)
    assert any("LIVEPUSH_FANOUT" in line and "reaches no" in line for line in said), said


def only_the_examples_jobs(monkeypatch: pytest.MonkeyPatch) -> None:
    """The process's registry as the example app's process has it: other tests' jobs, defined in
    this process too, would come first among the names its start says."""
    registry = Registry()
    registry.add(tasks.build_report, origin=tasks.build_report.origin)
    monkeypatch.setattr(jobs, "REGISTRY", registry)


async def test_an_app_that_defines_jobs_on_redis_alone_is_refused_at_start(
        redis_url: str, livepush_env: Callable[..., dict[str, str]], monkeypatch: pytest.MonkeyPatch) -> None:
    """Jobs live in Postgres. An app on the Redis fan-out with no database, whose modules define
    jobs (the example's build_report, imported by this file), failed each enqueue with ConfigError
    at the call, request after request; its start fails instead, with one line naming
    LIVEPUSH_DATABASE_URL and a job it defines, and leaves no Redis client open."""
    only_the_examples_jobs(monkeypatch)
    forget_defaults()
    env = livepush_env(redis_url=redis_url, fanout="redis")
    with pytest.raises(ConfigError, match="LIVEPUSH_DATABASE_URL") as refused:
        await start_with(config.Settings.from_env(env))
    said = str(refused.value)
    assert "build_report" in said and "enqueue" in said and "\n" not in said, said
    await async_wait_for(lambda: redis_clients(redis_url) == [], timeout=5, message="no livepush Redis client left")


@pytest.mark.parametrize("case", ["no-jobs-defined", "jobs-configured-elsewhere"])
async def test_an_app_on_redis_alone_starts_when_its_enqueues_have_a_database_or_none_are_defined(
        case: str, redis_url: str, pg_url: str, livepush_env: Callable[..., dict[str, str]],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The refusal above is for enqueues that cannot work: a Redis-only app that defines no job
    starts as before, and so does one whose jobs' database jobs.configure() named before its start
    (its enqueues go there)."""
    forget_defaults()
    config.set_settings(config.Settings.from_env(livepush_env(redis_url=redis_url, fanout="redis")))
    if case == "no-jobs-defined":
        monkeypatch.setattr(jobs, "REGISTRY", Registry())
    else:
        database.configure(pg_url)
    try:
        async with serving(make_app()) as client:
            assert (await client.post("/async")).status_code == 200
            if case == "jobs-configured-elsewhere":
                assert (await client.post("/enqueue")).status_code == 200
    finally:
        forget_defaults()


async def test_an_app_alone_that_defines_jobs_is_warned_at_start(livepush_env: Callable[..., dict[str, str]],
                                                                  caplog: pytest.LogCaptureFixture,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """With the local fan-out and no database the app runs alone on purpose (its own tests), so it
    still starts; one warning says that its jobs (build_report) cannot be enqueued without
    LIVEPUSH_DATABASE_URL, instead of the first enqueue saying it."""
    only_the_examples_jobs(monkeypatch)
    said = await warned_at_start(livepush_env(fanout="local"), caplog)
    assert any("LIVEPUSH_DATABASE_URL" in line and "build_report" in line and "enqueue" in line
               for line in said), said


def test_livepush_imports_without_starlette() -> None:
    """Neither Starlette nor FastAPI is a dependency: livepush, its jobs and contrib import without
    them, and only livepush.contrib.starlette asks for the extra."""
    script = (
        "import sys\n"
        "sys.modules['starlette'] = None; sys.modules['fastapi'] = None\n"
        "import livepush, livepush.jobs, livepush.contrib, livepush.contrib._cookies, livepush.contrib._process\n"
        "try:\n"
        "    import livepush.contrib.starlette\n"
        "except ImportError as exc:\n"
        "    print(exc)\n"
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=30, cwd=REPO_ROOT)
    assert out.returncode == 0, out.stderr
    assert "pip install 'livepush[starlette]'" in out.stdout
