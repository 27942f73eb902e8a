"""livepush pointed at a hot standby, as a failover caught midway or a read replica's address
leaves it: what needs writes or LISTEN is refused naming the database and what to point at
(docs/operations.md, "Failover and read-only databases")."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from livepush import api
from livepush.errors import DependencyError, ListenError
from livepush.postgres.listener import Listener
from livepush.postgres.urls import redact
from tests.support import services
from tests.support.settings import jobs_settings


@pytest.fixture
def standby_url(pg_url: str, pg_admin_url: str) -> Iterator[str]:
    """The URL of this test's migrated database on a hot standby of the test PostgreSQL."""
    with services.pg_standby(pg_admin_url) as admin:
        yield services.db_url(admin, services.dbname_of(pg_url))


def _says_read_only(message: str, url: str) -> None:
    assert "read-only" in message and "primary" in message, message
    assert redact(url) in message, message
    assert "target_session_attrs=read-write" in message, message


async def test_a_listener_started_on_a_standby_fails_saying_the_database_is_read_only(standby_url: str) -> None:
    """A standby refuses LISTEN while in recovery: the first start fails with ListenError naming
    the database, saying it is read-only and to point the URL at the primary, not with the
    driver's bare "cannot execute LISTEN during recovery"."""
    listener = Listener(standby_url)
    listener.add("livepush", lambda payload: None)
    try:
        with pytest.raises(ListenError) as caught:
            await listener.start()
    finally:
        await listener.aclose()
    _says_read_only(str(caught.value), standby_url)


def test_a_publish_on_a_standby_fails_saying_the_database_is_read_only(standby_url: str) -> None:
    """publish() on a standby fails with DependencyError naming the database, saying it is
    read-only and to point the URL at the primary."""
    with jobs_settings(standby_url):
        with pytest.raises(DependencyError) as caught:
            api.publish("news:standby", {"n": 1})
    _says_read_only(str(caught.value), standby_url)
