"""Fixtures for the Django integration tests: Django set up once per session with the example site
(examples/django_app) on a database migrated for both livepush and Django.

- `django_db_url` (session)  that database's URL; Django's DATABASES["default"] points at it.
- `django_site`              the database as livepush's jobs and publish database for this process
                             (LIVEPUSH_ENV=test, a fresh secret); no jobs left when the test ends.
"""

from __future__ import annotations

import os
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

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
    from livepush import jobs

    with jobs_settings(django_db_url):
        jobs.clear()
        try:
            yield django_db_url
        finally:
            jobs.clear()
