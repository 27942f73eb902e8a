"""Schema migrations: numbered files in `sql/`, applied in order, once.

`migrate()` holds a transaction-level advisory lock for the whole run, so two `livepush
migrate` at once serialize: the second waits, then finds nothing left to do. Each file runs
in the same transaction as the row that records it, so a failed file leaves no trace.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from importlib import resources

import psycopg

from .postgres import connect as db
from .errors import SchemaError

# An arbitrary constant: any process migrating livepush's schema takes this lock.
MIGRATION_LOCK_KEY = 0x6C697665_70757368 & 0x7FFFFFFFFFFFFFFF  # "livepush"

_NAME = re.compile(r"^(\d{4})_([a-z0-9_]+)\.sql$")


@dataclass(frozen=True)
class Migration:
    version: int
    name: str
    sql: str


def bundled() -> list[Migration]:
    """The migrations shipped with this package, in version order."""
    found = []
    for entry in resources.files("livepush").joinpath("sql").iterdir():
        m = _NAME.match(entry.name)
        if m:
            found.append(Migration(int(m.group(1)), m.group(2), entry.read_text(encoding="utf-8")))
    found.sort(key=lambda m: m.version)
    versions = [m.version for m in found]
    if len(set(versions)) != len(versions):
        raise SchemaError(f"two migrations share a number in sql/: {versions}")
    return found


def required_version() -> int:
    migrations = bundled()
    return migrations[-1].version if migrations else 0


# name: schema_table -- idempotent; runs under the advisory lock below.
_CREATE_SCHEMA_TABLE = """
CREATE TABLE IF NOT EXISTS livepush_schema (
    version    integer PRIMARY KEY,
    name       text NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now()
)
"""


def migrate(url: str) -> list[Migration]:
    """Apply every bundled migration not yet applied. Returns those applied now."""
    applied_now: list[Migration] = []
    with db.connect(url, autocommit=False) as conn:
        # Transaction-scoped lock: released at commit or rollback, never leaked by a crash.
        conn.execute("SELECT pg_advisory_xact_lock(%s)", (MIGRATION_LOCK_KEY,))
        conn.execute(_CREATE_SCHEMA_TABLE)
        done = {row[0] for row in conn.execute("SELECT version FROM livepush_schema")}
        for migration in bundled():
            if migration.version in done:
                continue
            conn.execute(migration.sql)  # type: ignore[arg-type]  # trusted files shipped with the package
            conn.execute(
                "INSERT INTO livepush_schema (version, name) VALUES (%s, %s)",
                (migration.version, migration.name),
            )
            applied_now.append(migration)
        conn.commit()
    return applied_now


def current_version(conn: psycopg.Connection) -> int:
    try:
        row = conn.execute("SELECT coalesce(max(version), 0) FROM livepush_schema").fetchone()
    except psycopg.errors.UndefinedTable:
        conn.rollback() if not conn.autocommit else None
        return 0
    return int(row[0]) if row else 0


def check_schema(url: str) -> None:
    """Refuse to run on a schema older than this code needs (SPEC §3)."""
    with db.connect(url) as conn:
        have = current_version(conn)
    need = required_version()
    if have < need:
        raise SchemaError(
            f"the database schema is at version {have} but this livepush needs {need}: run `livepush migrate`"
        )
