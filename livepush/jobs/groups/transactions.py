"""Running the steps of a group operation in one transaction: the caller's (`conn=`), or ours,
retried when Postgres broke a deadlock or a serialization conflict (nothing of it committed)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import psycopg
from psycopg_pool import AsyncConnectionPool

from ...postgres.connect import translated, translated_on
from ...postgres.savepoints import Savepoint, akept, kept
from .. import database
from . import steps
from ...errors import ArgumentTypeError

T = TypeVar("T")
RETRIES = 5

_CONFLICTS = (psycopg.errors.DeadlockDetected, psycopg.errors.SerializationFailure)

# Around steps run in the caller's transaction (conn=).
_STEPS = Savepoint("livepush_group_steps")


_WRONG_KIND = {
    "sync": "conn= takes a sync psycopg Connection here; use the a-prefixed function with an AsyncConnection",
    "async": "conn= takes a psycopg AsyncConnection here; use the sync function with a Connection",
}


def check_conn(conn: Any, kind: str) -> None:
    """TypeError unless `conn` is a psycopg connection of `kind` ("sync" or "async")."""
    if database.conn_kind(conn) != kind:
        raise ArgumentTypeError(_WRONG_KIND[kind])


def in_tx(make: Callable[[], steps.Steps[T]], conn: Any) -> T:
    url = database.database_url()
    if conn is not None:
        check_conn(conn, "sync")
        with translated_on(url, conn):
            database.check_on_database(conn)
            if conn.autocommit:  # each statement would commit alone: the steps are one transaction
                with conn.transaction():
                    return steps.run(conn, make())
            # A savepoint: a refusal raised after some statements (a closed group, the member
            # limit) takes back what they wrote, so a caller that catches it and commits its
            # own work commits nothing of ours. (The caller's transaction is begun first, so
            # this never commits it.)
            with kept(conn, _STEPS):
                return steps.run(conn, make())
    with translated(url):
        for attempt in range(RETRIES):
            try:
                with database.pools().sync().connection() as own:
                    return steps.run(own, make())
            except _CONFLICTS:
                if attempt == RETRIES - 1:
                    raise
    raise AssertionError("unreachable")


async def ain_tx(make: Callable[[], steps.Steps[T]], conn: Any, pool: AsyncConnectionPool | None = None) -> T:
    """in_tx for async code. `pool`: where our own transactions' connections come from instead of
    the process's jobs pool (a runtime's own work: its database may not be the process's default);
    not in autocommit, as that pool is not, so that the steps are one transaction."""
    url = database.pool_url(pool) if pool is not None else database.database_url()
    if conn is not None:
        check_conn(conn, "async")
        with translated_on(url, conn):
            await database.acheck_on_database(conn, pool=pool)
            if conn.autocommit:
                async with conn.transaction():
                    return await steps.arun(conn, make())
            async with akept(conn, _STEPS):
                return await steps.arun(conn, make())
    with translated(url):
        for attempt in range(RETRIES):
            try:
                async with (pool or await database.pools().aget()).connection() as own:
                    return await steps.arun(own, make())
            except _CONFLICTS:
                if attempt == RETRIES - 1:
                    raise
    raise AssertionError("unreachable")
