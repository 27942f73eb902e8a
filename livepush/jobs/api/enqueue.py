"""Enqueue: one job or many, in our own transaction or the caller's (`conn=`).

Every path is one statement (queries.ENQUEUE_MANY, or ENQUEUE_MANY_PUBLISHING* which also
publish the "enqueued" events; ENQUEUE_ONE* for a lone job), which also rings the
doorbell; it is delivered at commit, so idle runtimes wake only for committed jobs.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from datetime import datetime, timedelta, timezone
from typing import Any

import psycopg
from psycopg.rows import dict_row, tuple_row

from .. import database, queries
from ..events import views as events
from .args import check_args, dumps
from .handles import JobHandle
from .registry import JobFunction, JobRequest, REGISTRY


def _run_at(wait: float | None, at: datetime | None) -> datetime | None:
    if wait is not None and at is not None:
        raise TypeError("give wait= (seconds) or at= (an aware datetime), not both")
    if at is not None:
        if not isinstance(at, datetime) or at.tzinfo is None or at.utcoffset() is None:
            raise TypeError(f"at= must be an aware datetime (e.g. datetime.now(timezone.utc)), got {at!r}")
        return at
    if wait is not None:
        if isinstance(wait, bool) or not isinstance(wait, (int, float)):
            raise TypeError(f"wait= takes a number of seconds, got {type(wait).__name__} {wait!r:.60}")
        if not wait >= 0 or wait == math.inf:  # `not >=` also catches NaN
            raise ValueError(f"wait= must be zero or more seconds, a finite number, got {wait!r}")
        if wait == 0:
            return None
        try:
            return datetime.now(timezone.utc) + timedelta(seconds=wait)
        except OverflowError:
            raise ValueError(f"wait= of {wait!r} seconds ends after the year 9999: pass a shorter delay") from None
    return None


class Batch:
    """The jobs of one enqueue statement, built from (function, args, run_at, group_id) items.

    The statement takes the whole batch as one JSON document (a row per job), written by
    one call of the C encoder: per-job JSON texts and seven typed arrays, which psycopg
    dumps an element at a time in Python, cost ~3 us a job, more than the inserts they
    feed. Postgres reads the document back at ~0.6 us a job (queries._ENQUEUE_CTES)."""

    def __init__(self) -> None:
        # [name, queue, priority, run_at (ISO 8601) | None, max_attempts, group_id | None, args]
        self.rows: list[list[Any]] = []

    def add(self, fn: JobFunction, args: Sequence[Any], run_at: datetime | None = None,
            group_id: int | None = None) -> None:
        self.rows.append([fn.name, fn.queue, fn.priority, run_at.isoformat() if run_at else None,
                          fn.max_attempts, group_id, check_args(args)])

    def params(self, start: int = 0, stop: int | None = None) -> dict[str, Any]:
        """Parameters of ENQUEUE_MANY for the jobs rows[start:stop]."""
        return {"jobs": dumps(self.rows[start:stop])}

    def chunks(self, size: int) -> list[dict[str, Any]]:
        """ENQUEUE_MANY parameters for consecutive slices of at most `size` jobs."""
        return [self.params(i, i + size) for i in range(0, len(self.rows), size)]

    def one_params(self) -> dict[str, Any]:
        """Scalar parameters for ENQUEUE_ONE (a batch of exactly one job)."""
        name, queue, priority, run_at, max_attempts, group_id, args = self.rows[0]
        return {"name": name, "queue": queue, "priority": priority, "run_at": run_at,
                "max_attempts": max_attempts, "args": dumps(args), "group_id": group_id}

    def __len__(self) -> int:
        return len(self.rows)


def _item(item: Any) -> tuple[JobFunction, Sequence[Any], datetime | None]:
    """enqueue_many items: a JobRequest, or (job_function, args) / (job_function, args, options)."""
    if isinstance(item, JobRequest):
        return REGISTRY.get(item.name), item.args, None
    if isinstance(item, tuple) and len(item) in (2, 3) and isinstance(item[0], JobFunction):
        options = item[2] if len(item) == 3 else {}
        return item[0], item[1], _run_at(options.get("wait"), options.get("at"))
    raise TypeError(
        "enqueue_many() takes JobRequest values (some_job.request(*args)) or (job_function, args) tuples, "
        f"got {item!r}"
    )


def _handles(rows: list[Any], publishes: bool) -> list[JobHandle]:
    if publishes:
        return [JobHandle(row[0], row[1]) for row in rows]  # _row_factory: tuples, id and name first
    return [JobHandle(row["id"], row["name"]) for row in rows]


def _events(rows: list[dict[str, Any]]) -> list[events.Event]:
    return [events.job_event("enqueued", row) for row in rows]


def _statement(batch: Batch, *, fresh: bool = False) -> tuple[str, dict[str, Any], bool]:
    """The enqueue statement and its parameters, and whether it publishes the "enqueued"
    events itself (Postgres fan-out in the jobs' database: same statement, same transaction,
    one round trip). A lone job takes the scalar twin of the batch statement (cheaper).
    `fresh`: the statement runs in autocommit, so a batch may take the statement that
    assumes its jobs' topics are new, and fails if one is not (run_batch, arun_batch)."""
    publishes = events.in_transaction()
    if len(batch) == 1:
        return (queries.ENQUEUE_ONE_PUBLISHING if publishes else queries.ENQUEUE_ONE), batch.one_params(), publishes
    if not publishes:
        return queries.ENQUEUE_MANY, batch.params(), publishes
    return (queries.ENQUEUE_MANY_PUBLISHING_FRESH if fresh else queries.ENQUEUE_MANY_PUBLISHING), batch.params(), publishes


# The fresh statement's topic rows meet a job topic already used on this key. (It writes no
# history row: every message of a topic is published after its topic row, sql/0001.)
_TAKEN_TOPIC_KEY = "livepush_topics_pkey"


def _topic_taken(exc: psycopg.errors.UniqueViolation, sql: str) -> bool:
    """ENQUEUE_MANY_PUBLISHING_FRESH met a job topic that already holds messages: rerun the
    batch with ENQUEUE_MANY_PUBLISHING, which numbers its events after what the topics hold."""
    return sql is queries.ENQUEUE_MANY_PUBLISHING_FRESH and exc.diag.constraint_name == _TAKEN_TOPIC_KEY


def _row_factory(publishes: bool) -> Any:
    """Rows as dicts when events are built from them here; else tuples (id, name first),
    cheaper to read back for a batch of thousands."""
    return tuple_row if publishes else dict_row


def run_batch(batch: Batch, conn: Any = None) -> list[JobHandle]:
    """Insert a batch with a sync connection (the caller's, or ours and committed here)."""
    if not len(batch):
        return []
    if conn is None:
        sql, params, publishes = _statement(batch, fresh=True)
        with database.sync_pool().connection() as own:
            # One statement is atomic on its own: in autocommit it is one round trip, where
            # BEGIN, the statement and COMMIT were three (the most of an idle enqueue's time).
            # A statement that failed left nothing, so the fallback simply runs next.
            own.autocommit = True
            try:
                with own.cursor(row_factory=_row_factory(publishes)) as cur:
                    try:
                        cur.execute(sql, params)
                    except psycopg.errors.UniqueViolation as exc:
                        if not _topic_taken(exc, sql):
                            raise
                        cur.execute(queries.ENQUEUE_MANY_PUBLISHING, params)
                    rows = cur.fetchall()
            finally:
                if not own.closed:
                    own.autocommit = False
        if not publishes:
            events.publish_after(_events(rows))
        return _handles(rows, publishes)
    sql, params, publishes = _statement(batch)
    if database.conn_kind(conn) != "sync":
        raise TypeError("enqueue(conn=) takes a sync psycopg Connection; use aenqueue() with an AsyncConnection")
    with conn.cursor(row_factory=_row_factory(publishes)) as cur:
        cur.execute(sql, params)
        rows = cur.fetchall()
    # With a non-Postgres fan-out we cannot wait for the caller's commit: the events go out
    # now. Only the caller knows these ids yet, so nobody else can be watching them.
    if not publishes:
        events.publish_after(_events(rows))
    return _handles(rows, publishes)


async def arun_batch(batch: Batch, conn: Any = None) -> list[JobHandle]:
    if not len(batch):
        return []
    if conn is None:
        sql, params, publishes = _statement(batch, fresh=True)
        pool = await database.async_pool()
        async with pool.connection() as own:
            await own.set_autocommit(True)  # one round trip, as in run_batch
            try:
                async with own.cursor(row_factory=_row_factory(publishes)) as cur:
                    try:
                        await cur.execute(sql, params)
                    except psycopg.errors.UniqueViolation as exc:
                        if not _topic_taken(exc, sql):
                            raise
                        await cur.execute(queries.ENQUEUE_MANY_PUBLISHING, params)
                    rows = await cur.fetchall()
            finally:
                if not own.closed:
                    await own.set_autocommit(False)
        if not publishes:
            await events.apublish_after(_events(rows))
        return _handles(rows, publishes)
    sql, params, publishes = _statement(batch)
    if database.conn_kind(conn) != "async":
        raise TypeError("aenqueue(conn=) takes a psycopg AsyncConnection; use enqueue() with a sync Connection")
    async with conn.cursor(row_factory=_row_factory(publishes)) as cur:
        await cur.execute(sql, params)
        rows = await cur.fetchall()
    if not publishes:
        await events.apublish_after(_events(rows))
    return _handles(rows, publishes)


def enqueue(fn: JobFunction, args: Sequence[Any], *, wait: float | None = None, at: datetime | None = None,
            conn: Any = None) -> JobHandle:
    batch = Batch()
    batch.add(fn, args, _run_at(wait, at))
    return run_batch(batch, conn)[0]


async def aenqueue(fn: JobFunction, args: Sequence[Any], *, wait: float | None = None, at: datetime | None = None,
                   conn: Any = None) -> JobHandle:
    batch = Batch()
    batch.add(fn, args, _run_at(wait, at))
    return (await arun_batch(batch, conn))[0]


def enqueue_many(items: Iterable[Any], *, conn: Any = None) -> list[JobHandle]:
    """Enqueue many jobs in one statement: items are `job.request(*args)` values or
    `(job, args)` / `(job, args, {"wait": s} | {"at": dt})` tuples. Handles in item order."""
    batch = Batch()
    for item in items:
        batch.add(*_item(item))
    return run_batch(batch, conn)


async def aenqueue_many(items: Iterable[Any], *, conn: Any = None) -> list[JobHandle]:
    batch = Batch()
    for item in items:
        batch.add(*_item(item))
    return await arun_batch(batch, conn)
