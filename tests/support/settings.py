"""Process settings for tests that enqueue and run jobs in this process."""

from __future__ import annotations

import contextlib
import secrets
from collections.abc import Iterator

from livepush import api, config
from livepush.jobs import database


@contextlib.contextmanager
def jobs_settings(url: str) -> Iterator[str]:
    """`url` as the jobs' database and the (publish-only) Postgres fan-out's, LIVEPUSH_ENV=test,
    a fresh secret; everything put back afterwards."""
    config.set_settings(config.Settings(database_url=url, fanout="postgres", env="test",
                                        secret=secrets.token_urlsafe(36)))
    api.set_default_fanout(None)
    database.configure(url)
    try:
        yield url
    finally:
        database.configure(None)
        api.set_default_fanout(None)
        config.set_settings(None)
