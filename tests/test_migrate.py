"""`livepush migrate` refuses a schema it did not make, file for file: before 1.0 migrations are
rewritten in place, so a database made by an earlier build is refused, not half-migrated."""

from __future__ import annotations

import psycopg
import pytest

from livepush import migrate
from livepush.errors import SchemaError


def test_a_migrated_database_is_accepted_again(pg_url: str) -> None:
    """Migrating twice applies nothing the second time, and the schema check passes."""
    assert migrate.migrate(pg_url) == []
    migrate.check_schema(pg_url)


def test_a_migration_recorded_from_another_file_is_refused(pg_url: str) -> None:
    """A database whose migration 0003 came from another version of that file is refused, by
    migrate and by the check every command runs, with what to do."""
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute("UPDATE livepush_schema SET checksum = 'from an earlier build' WHERE version = 3")
    for call in (migrate.migrate, migrate.check_schema):
        with pytest.raises(SchemaError, match="0003_jobs differs .* not migrated in place; use a new database"):
            call(pg_url)


def test_migrations_recorded_without_checksums_are_refused(pg_url: str) -> None:
    """A schema recorded by a livepush that kept no checksums is refused, not migrated further."""
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute("ALTER TABLE livepush_schema DROP COLUMN checksum")
    with pytest.raises(SchemaError, match="recorded without checksums.*not migrated in place"):
        migrate.migrate(pg_url)
