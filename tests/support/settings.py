"""Process settings for tests that enqueue and run jobs in this process."""

from __future__ import annotations

import contextlib
import secrets
from collections.abc import Iterator
from typing import Any

from livepush import api, config, sessions
from livepush.jobs import database


@contextlib.contextmanager
def jobs_settings(url: str, **options: Any) -> Iterator[str]:
    """`url` as the jobs' database and the (publish-only) Postgres fan-out's, LIVEPUSH_ENV=test,
    a fresh secret unless given, and any other `options` of Settings; everything put back afterwards."""
    options.setdefault("secret", secrets.token_urlsafe(36))
    config.set_settings(config.Settings(database_url=url, fanout="postgres", env="test", **options))
    # What the settings made on first use goes with them: a revocation store an earlier test made
    # from its own settings (its database since dropped) would take this test's sign-outs.
    api.set_default_fanout(None)
    sessions.set_default_store(None)
    database.configure(url)
    try:
        yield url
    finally:
        database.configure(None)
        api.set_default_fanout(None)
        sessions.set_default_store(None)
        config.set_settings(None)


@contextlib.contextmanager
def local_settings(secret: str) -> Iterator[None]:
    """The local fan-out, no database and `secret`: for tests of what a call refuses before it
    needs either; everything put back afterwards."""
    config.set_settings(config.Settings(secret=secret))
    api.set_default_fanout(None)
    try:
        yield
    finally:
        api.set_default_fanout(None)
        config.set_settings(None)
