"""Savepoints around livepush's statements on a caller's connection (`conn=`): a statement that
fails (a refusal of Postgres', a group's closed or full) takes back what livepush wrote and only
that, and the caller's transaction goes on as it was before the call, as after an error raised
in Python. Without one, Postgres fails the caller's whole transaction, and a caller that caught
the error lost its own writes unless it rolled back."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Iterator
from typing import Any

import psycopg

from .connect import cursor_on


class Savepoint:
    """The statements of one savepoint, named for the calls it guards (savepoints of one name nest:
    Postgres rolls back to, and releases, the latest of that name)."""

    def __init__(self, name: str) -> None:
        # name: savepoint; rollback_to_savepoint; release_savepoint
        self.begin = f"SAVEPOINT {name}"
        self.undo = f"ROLLBACK TO SAVEPOINT {name}"
        self.release = f"RELEASE SAVEPOINT {name}"


def in_callers_transaction(conn: Any) -> bool:
    """Whether a statement run on `conn` now runs in a transaction of the caller's, which it fails
    if Postgres refuses it: not on a connection in autocommit outside a transaction block, where
    each statement is its own transaction (and Postgres refuses a SAVEPOINT)."""
    return not (conn.autocommit and conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE)


def _execute(conn: psycopg.Connection, statement: str) -> None:
    """Run a savepoint statement through cursor_on(), as livepush's statements on the caller's
    connection run: with LIVEPUSH_PREPARED_STATEMENTS=off one run on every call would otherwise be
    prepared under the connection's own prepare_threshold, which a pooler in transaction mode
    cannot keep."""
    with cursor_on(conn) as cur:
        cur.execute(statement)


async def _aexecute(conn: psycopg.AsyncConnection, statement: str) -> None:
    async with cursor_on(conn) as cur:
        await cur.execute(statement)


@contextlib.contextmanager
def kept(conn: psycopg.Connection, point: Savepoint) -> Iterator[None]:
    """Around statements on the caller's connection, in its transaction (in_callers_transaction()):
    if the block raises, what its statements wrote is taken back, and the transaction is usable.
    If the connection itself failed, the block's error is the one to see, not the rollback's."""
    _execute(conn, point.begin)
    try:
        yield
    except BaseException:
        with contextlib.suppress(psycopg.Error):
            _execute(conn, point.undo)
            _execute(conn, point.release)
        raise
    _execute(conn, point.release)


@contextlib.asynccontextmanager
async def akept(conn: psycopg.AsyncConnection, point: Savepoint) -> AsyncIterator[None]:
    """kept() for an AsyncConnection."""
    await _aexecute(conn, point.begin)
    try:
        yield
    except BaseException:
        with contextlib.suppress(psycopg.Error):
            await _aexecute(conn, point.undo)
            await _aexecute(conn, point.release)
        raise
    await _aexecute(conn, point.release)
