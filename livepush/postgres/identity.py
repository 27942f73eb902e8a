"""Which database a URL reaches: LIVEPUSH_LISTEN_DATABASE_URL must reach the one
LIVEPUSH_DATABASE_URL does. A LISTEN on another database hears none of what is rung on the first:
a server listening there delivers nothing live, and a runtime hears no enqueue or cancel, while
both look connected.

A database is its server's start time and its name, as the fan-out and the jobs tell a caller's
conn= apart (fanout/postgres.py, jobs/database.py): two clusters were not started in the same
microsecond, two databases of one cluster differ in name, and a pooler's alias is read as the name
the server gives it. Both are readable by any role.
"""

from __future__ import annotations

from ..config import Settings
from ..errors import ConfigError
from .connect import connect, translated
from .urls import redact

# name: identity -- a plain read of the database a connection is on; it claims, writes and
# counts nothing. The start time as the text of its epoch, compared as read.
IDENTITY = "SELECT extract(epoch FROM pg_postmaster_start_time())::text, current_database()"


def identity(url: str) -> tuple[str, str]:
    """(the server's start time, the database's name) of the database `url` reaches."""
    with translated(url), connect(url) as conn:
        row = conn.execute(IDENTITY).fetchone()
    assert row is not None
    return row[0], row[1]


def other_database(conn_arg: str, theirs: tuple[str, str], ours: tuple[str, str], url: str) -> str:
    """The start of the refusal of a caller's connection (`conn_arg`, such as "publish(conn=)") on
    database `theirs` where `ours`, reached by `url`, was meant: what each says next is its own."""
    (started, name), (ours_started, our_name) = theirs, ours
    where = repr(name) if started == ours_started else f"{name!r} of another Postgres server"
    return f"{conn_arg} got a connection to database {where}, not to {our_name!r} ({redact(url)})"


def check_listen_database(settings: Settings) -> None:
    """Raise ConfigError when LIVEPUSH_LISTEN_DATABASE_URL reaches another database than the
    settings' database URL (nothing to check when it is unset, or the same URL)."""
    listen, main = settings.listen_database_url, settings.database_url
    if not listen or not main or listen == main:
        return
    (listen_started, listen_name), (main_started, main_name) = identity(listen), identity(main)
    if (listen_started, listen_name) == (main_started, main_name):
        return
    where = (f"database {listen_name!r}" if listen_started == main_started
             else f"database {listen_name!r} of another Postgres server")
    raise ConfigError(
        f"LIVEPUSH_LISTEN_DATABASE_URL ({redact(listen)}) reaches {where}, not {main_name!r}, the one "
        f"{settings.database_url_setting} reaches: a LISTEN there hears nothing livepush rings; point it "
        "at the same database, directly or through a session-mode pool")
