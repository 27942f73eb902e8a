"""`jobs.get_job()`: one job as it is now, results included."""

from __future__ import annotations

import dataclasses
from typing import Any

from psycopg.rows import dict_row

from ...types import shown
from ...blocking import warn_if_on_event_loop
from .. import database, queries
from ..events.views import job_view
from .handles import checked_cursor, checked_id
from .options import check_name, check_queue, check_tag
from ...errors import ArgumentTypeError, ArgumentValueError
from ...postgres.text import BIGINT_MAX

MAX_LISTED = 1000  # jobs per list_tagged() or list_failed() call


@dataclasses.dataclass(frozen=True)
class JobInfo:
    """A job as its row says now. `result`: what the function returned, once succeeded (None
    before, and for a function that returned None). `waiting`: what a `waiting` job waits for
    ({"for": "children"|"signal"|"sleep", "name": ...}), else None. `args`: the arguments it was
    enqueued with (a periodic job's: its tick). `priority`: its priority (lower runs first)."""

    id: int
    name: str
    queue: str
    state: str
    attempt: int
    max_attempts: int
    result: Any
    error: str | None
    progress: dict[str, Any]
    run_at: str | None  # ISO 8601; None while it waits for an event
    waiting: dict[str, Any] | None
    tags: tuple[str, ...] = ()  # enqueue(tags=...), in the order given
    args: list[Any] | None = None
    priority: int = 0

    # A row's shape is livepush's own (its tables change with its migrations): not API.
    @classmethod
    def _from_row(cls, row: dict[str, Any]) -> JobInfo:
        view = job_view(row)
        return cls(id=view["id"], name=view["name"], queue=view["queue"], state=view["state"],
                   attempt=view["attempt"], max_attempts=view["max_attempts"], result=view.get("result"),
                   error=view["error"], progress=view["progress"], run_at=view["run_at"],
                   waiting=view.get("waiting"), tags=tuple(row.get("tags") or ()), args=row.get("args"),
                   priority=row.get("priority") or 0)


def get_job(job_id: int) -> JobInfo | None:
    """The job with that id, or None (never enqueued, or deleted after its retention time)."""
    warn_if_on_event_loop("jobs.get_job()", "jobs.aget_job()")
    job_id = checked_id(job_id, "job_id")
    with database.connection() as conn, conn.cursor(row_factory=dict_row) as cur:
        cur.execute(queries.JOB_INFOS, {"ids": [job_id]})
        row = cur.fetchone()
    return None if row is None else JobInfo._from_row(row)


async def aget_job(job_id: int) -> JobInfo | None:
    """get_job() for async code."""
    job_id = checked_id(job_id, "job_id")
    async with database.aconnection() as conn, conn.cursor(row_factory=dict_row) as cur:
        await cur.execute(queries.JOB_INFOS, {"ids": [job_id]})
        row = await cur.fetchone()
    return None if row is None else JobInfo._from_row(row)


def _checked_limit(limit: int) -> int:
    if isinstance(limit, bool) or not isinstance(limit, int):
        raise ArgumentTypeError(f"limit= must be an int from 1 to {MAX_LISTED}, got {shown(limit, typed=True, width=60)}")
    if not 1 <= limit <= MAX_LISTED:
        raise ArgumentValueError(f"limit= must be an int from 1 to {MAX_LISTED}, got {shown(limit)}")
    return limit


def tagged_params(tag: str, limit: int, unfinished: bool, before: int | None = None) -> dict[str, Any]:
    """TAGGED_IDS (and TAGGED_JOBS) parameters, checked. `before`: the page cursor, an id (the
    last one a page listed); None lists from the newest job."""
    _checked_limit(limit)
    cursor = BIGINT_MAX if before is None else checked_cursor(before, "before")
    if not isinstance(unfinished, bool):
        # bool("no") is True: a string or a number here would list the opposite of what was meant.
        raise ArgumentTypeError(f"unfinished= must be True or False, got {type(unfinished).__name__} "
                                f"{shown(unfinished, width=60)}")
    return {"tag": check_tag(tag), "limit": limit, "unfinished": unfinished, "before": cursor}


def list_tagged(tag: str, *, limit: int = 100, unfinished: bool = False, before: int | None = None) -> list[JobInfo]:
    """The jobs with `tag` (enqueue(tags=...)), newest first, at most `limit`; only those not
    finished yet with `unfinished=True`; with `before=` an id (the last a call listed), only
    the jobs older than it: the next page. Finished jobs are listed until retention deletes them."""
    warn_if_on_event_loop("jobs.list_tagged()", "jobs.alist_tagged()")
    params = tagged_params(tag, limit, unfinished, before)
    with database.connection() as conn, conn.cursor(row_factory=dict_row) as cur:
        rows = cur.execute(queries.TAGGED_JOBS, params).fetchall()
    return [JobInfo._from_row(r) for r in rows]


async def alist_tagged(tag: str, *, limit: int = 100, unfinished: bool = False,
                       before: int | None = None) -> list[JobInfo]:
    """list_tagged() for async code."""
    params = tagged_params(tag, limit, unfinished, before)
    async with database.aconnection() as conn, conn.cursor(row_factory=dict_row) as cur:
        await cur.execute(queries.TAGGED_JOBS, params)
        rows = await cur.fetchall()
    return [JobInfo._from_row(r) for r in rows]


def failed_params(queue: str | None, name: str | None, limit: int, before: int | None = None) -> dict[str, Any]:
    """FAILED_JOBS parameters, checked: a queue or a name that no job could have matches nothing,
    which would read as "no failed job" when it was a typo of the wrong type. `before`: the page
    cursor, as list_tagged()'s."""
    if queue is not None:
        check_queue(queue, "list_failed(queue=)")
    if name is not None:
        check_name(name, "list_failed(name=)")
    cursor = BIGINT_MAX if before is None else checked_cursor(before, "before")
    return {"queue": queue, "name": name, "limit": _checked_limit(limit), "before": cursor}


def list_failed(queue: str | None = None, *, name: str | None = None, limit: int = 100,
                before: int | None = None) -> list[JobInfo]:
    """The failed jobs (of `queue`, of the function `name`, when given), newest first, at most
    `limit`: what `retry_failed()` and `discard_failed()` take, with each one's error; with
    `before=` an id (the last a call listed), only the jobs older than it: the next page."""
    warn_if_on_event_loop("jobs.list_failed()", "jobs.alist_failed()")
    params = failed_params(queue, name, limit, before)
    with database.connection() as conn, conn.cursor(row_factory=dict_row) as cur:
        rows = cur.execute(queries.FAILED_JOBS, params).fetchall()
    return [JobInfo._from_row(r) for r in rows]


async def alist_failed(queue: str | None = None, *, name: str | None = None, limit: int = 100,
                       before: int | None = None) -> list[JobInfo]:
    """list_failed() for async code."""
    params = failed_params(queue, name, limit, before)
    async with database.aconnection() as conn, conn.cursor(row_factory=dict_row) as cur:
        await cur.execute(queries.FAILED_JOBS, params)
        rows = await cur.fetchall()
    return [JobInfo._from_row(r) for r in rows]
