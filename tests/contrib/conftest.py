"""Fixtures for the framework integrations: this test process plays the web app, on settings of
its own, against the test's database.

Starlette and FastAPI:

- `app_env`       the app's environment (the test's database, Postgres fan-out), installed as this
                  process's settings; every default the app's parts made is forgotten afterwards.
- `serving(app)`  an httpx client on `app` through its ASGI interface, the app's lifespan running
                  around it (as uvicorn runs it).
- `connections`   how many connections to a database are open, other than the one asking.

Django, set up once per session with the example site (examples/django_app) on a database
migrated for both livepush and Django:
- `django_db_url` (session)  that database's URL; Django's DATABASES["default"] points at it.
- `django_site`              the database as livepush's jobs and publish database for this process
                             (LIVEPUSH_ENV=test, a fresh secret); no jobs left when the test ends.
"""

from __future__ import annotations

import contextlib
import gc
import os
import sys
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import psycopg
import pytest

from livepush import api, config, sessions
from livepush.jobs import database
from tests.support import services
from tests.support.settings import jobs_settings

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "django_app"

try:
    import django

    DJANGO_ERROR: str | None = None
except ImportError as exc:  # pragma: no cover - only on a machine without the test extra
    DJANGO_ERROR = f"Django is not installed ({exc}): run bin/setup or `.venv/bin/pip install -e '.[test]'`"


@pytest.fixture(scope="session")
def django_db_url(pg_admin_url: str, pg_template: str) -> Iterator[str]:
    """Django set up on a fresh database cloned from the livepush template, with Django's own
    tables migrated into it."""
    if DJANGO_ERROR:
        pytest.skip(DJANGO_ERROR)
    name = f"dj_{uuid.uuid4().hex[:16]}"
    url = services.create_database(pg_admin_url, name, template=pg_template)
    if str(EXAMPLE) not in sys.path:
        sys.path.insert(0, str(EXAMPLE))
    os.environ["DJANGO_SETTINGS_MODULE"] = "demo_site.settings"
    # The settings read the database from the environment once, here; it is not left set, so the
    # other tests' settings never see it.
    before = os.environ.get("LIVEPUSH_DATABASE_URL")
    os.environ["LIVEPUSH_DATABASE_URL"] = url
    try:
        django.setup()
        from django.conf import settings

        settings.DATABASES  # noqa: B018  (read now, while the variable is set)
    finally:
        if before is None:
            os.environ.pop("LIVEPUSH_DATABASE_URL", None)
        else:
            os.environ["LIVEPUSH_DATABASE_URL"] = before
    from django.core.management import call_command
    from django.test.utils import setup_test_environment

    setup_test_environment()  # as Django's test runner does: the test client's host is allowed
    call_command("migrate", verbosity=0)
    try:
        yield url
    finally:
        from django.db import connections

        connections.close_all()
        services.drop_database(pg_admin_url, name)


@pytest.fixture
def django_site(django_db_url: str) -> Iterator[str]:
    """livepush in this process on the Django database; every job deleted after the test."""
    from django.db import connections

    from livepush import jobs

    # Django keeps its connection across tests and drops a dead one only when a request ends: one
    # that a fault test's restart of the test PostgreSQL broke (in the same pytest process) failed
    # every ORM call a test made outside a request.
    connections.close_all()
    with jobs_settings(django_db_url):
        jobs.clear()
        try:
            yield django_db_url
        finally:
            jobs.clear()


def forget_defaults() -> None:
    """Drop the process's publishing fan-out, revocation store, jobs' pools and settings."""
    api.set_default_fanout(None)
    sessions.set_default_store(None)
    database.configure(None)
    config.set_settings(None)
    # A Redis client made on an event loop that has ended is closed only when it is collected (only
    # its own loop could close it): collected now, it is not counted among the next test's clients.
    gc.collect()


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
