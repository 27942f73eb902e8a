"""Fixtures for the framework integrations: this test process plays the web app, on settings of
its own, against the test's database.

- `app_env`       the app's environment (the test's database, Postgres fan-out), installed as this
                  process's settings; every default the app's parts made is forgotten afterwards.
- `serving(app)`  an httpx client on `app` through its ASGI interface, the app's lifespan running
                  around it (as uvicorn runs it).
- `connections`   how many connections to a database are open, other than the one asking.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any
from urllib.parse import urlsplit

import httpx
import psycopg
import pytest

from livepush import api, config, sessions
from livepush.jobs import database

pytest.importorskip("fastapi", reason="the test extra brings FastAPI: .venv/bin/pip install -e '.[test]'")


def forget_defaults() -> None:
    """Drop the process's publishing fan-out, revocation store, jobs' pools and settings."""
    api.set_default_fanout(None)
    sessions.set_default_store(None)
    database.configure(None)
    config.set_settings(None)


@pytest.fixture
def app_env(pg_url: str, livepush_env: Callable[..., dict[str, str]]) -> Iterator[dict[str, str]]:
    """The environment of the app's process (and of a `livepush serve` beside it), installed here."""
    env = livepush_env(database_url=pg_url)
    forget_defaults()
    config.set_settings(config.Settings.from_env(env))
    try:
        yield env
    finally:
        forget_defaults()


@contextlib.asynccontextmanager
async def serving(app: Any, base_url: str = "http://127.0.0.1:8000") -> AsyncIterator[httpx.AsyncClient]:
    """`app` started (its lifespan entered), with a client that calls it in this process."""
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url=base_url) as client:
            yield client


def connections(admin_url: str, url: str) -> int:
    """Client connections open to `url`'s database, other than this question's own."""
    name = urlsplit(url).path.lstrip("/")
    with psycopg.connect(admin_url, autocommit=True) as conn:
        row = conn.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = %s AND pid <> pg_backend_pid()"
                           " AND backend_type = 'client backend'", (name,)).fetchone()
    assert row is not None
    return int(row[0])


def cookie_header(token: str, name: str = "livepush_session") -> dict[str, str]:
    return {"Cookie": f"{name}={token}"}
