"""Fixtures for the security tests: database roles as an attacker or an app would have them.

- `role_url(name, *grants)`: a LOGIN role made for this test (no privileges unless `grants`),
  and the URL of the test's database as that role. Roles are dropped at teardown.
- `nobody_url`: a role that can only connect (PUBLIC keeps CONNECT on a new database, and
  Postgres has no privileges on LISTEN and NOTIFY): what "a database login" means here.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator

import psycopg
import pytest

from tests.support.services import db_url, dbname_of


@pytest.fixture
def role_url(pg_admin_url: str, pg_url: str) -> Iterator[Callable[..., str]]:
    made: list[str] = []
    dbname = dbname_of(pg_url)

    def make(prefix: str = "r") -> str:
        name = f"{prefix}_{uuid.uuid4().hex[:10]}"
        with psycopg.connect(pg_admin_url, autocommit=True) as conn:
            conn.execute(psycopg.sql.SQL("CREATE ROLE {} LOGIN").format(psycopg.sql.Identifier(name)))
        made.append(name)
        return psycopg.conninfo.make_conninfo(pg_url, user=name)

    yield make
    for name in made:
        who = psycopg.sql.Identifier(name)
        # Its grants live in the test's database: drop them there, then the role.
        with psycopg.connect(db_url(pg_admin_url, dbname), autocommit=True) as conn:
            conn.execute(psycopg.sql.SQL("DROP OWNED BY {}").format(who))
        with psycopg.connect(pg_admin_url, autocommit=True) as conn:
            conn.execute(psycopg.sql.SQL("DROP ROLE {}").format(who))


@pytest.fixture
def nobody_url(role_url: Callable[..., str]) -> str:
    return role_url("nobody")


def role_of(url: str) -> str:
    return psycopg.conninfo.conninfo_to_dict(url)["user"]  # type: ignore[return-value]
