"""Running the steps of a group operation in one transaction: the caller's (`conn=`), or ours,
retried when Postgres broke a deadlock or a serialization conflict (nothing of it committed)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import psycopg

from ...postgres.connect import translated
from .. import database
from . import steps

T = TypeVar("T")
RETRIES = 5

_CONFLICTS = (psycopg.errors.DeadlockDetected, psycopg.errors.SerializationFailure)


def in_tx(make: Callable[[], steps.Steps[T]], conn: Any) -> T:
    url = database.database_url()
    if conn is not None:
        if database.conn_kind(conn) != "sync":
            raise TypeError("conn= takes a sync psycopg Connection here; use the a-prefixed function with an AsyncConnection")
        with translated(url):
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


async def ain_tx(make: Callable[[], steps.Steps[T]], conn: Any) -> T:
    url = database.database_url()
    if conn is not None:
        if database.conn_kind(conn) != "async":
            raise TypeError("conn= takes a psycopg AsyncConnection here; use the sync function with a Connection")
        with translated(url):
            return await steps.arun(conn, make())
    with translated(url):
        for attempt in range(RETRIES):
            try:
                async with (await database.pools().aget()).connection() as own:
                    return await steps.arun(own, make())
            except _CONFLICTS:
                if attempt == RETRIES - 1:
                    raise
    raise AssertionError("unreachable")
