"""Reading task groups: `get_group()`, `group_members()`, `group_history()`, and their async
twins. Each checks its arguments, reads with a named statement, then shapes the rows."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from psycopg.rows import dict_row

from ...types import shown
from ...blocking import warn_if_on_event_loop
from ...postgres.text import BIGINT_MAX
from .. import database
from ..api.handles import checked_cursor, checked_id, page_of
from ..events.views import group_view, iso, progress_view
from . import queries as gq
from ...errors import ArgumentTypeError, ArgumentValueError


def _read(sql: str, params: dict[str, Any] | None) -> list[dict[str, Any]]:
    """The rows of `sql` (none when `params` is None: no row can match)."""
    if params is None:
        return []
    with database.connection() as conn:
        with conn.cursor(row_factory=dict_row) as cur:
            cur.execute(sql, params)
            return cur.fetchall()


async def _aread(sql: str, params: dict[str, Any] | None) -> list[dict[str, Any]]:
    if params is None:
        return []
    async with database.aconnection() as conn:
        async with conn.cursor(row_factory=dict_row) as cur:
            await cur.execute(sql, params)
            return await cur.fetchall()


def get_group(group_id: int) -> dict[str, Any] | None:
    """The group as its state topic shows it ({id, state, total, pending, succeeded, failed,
    cancelled}) plus created_at, sealed_at, cancelled_at, finished_at (UTC); None if unknown."""
    warn_if_on_event_loop("jobs.get_group()", "jobs.aget_group()")
    return _group(_read(gq.GROUP_VIEWS, {"ids": [checked_id(group_id, "group_id")]}))


async def aget_group(group_id: int) -> dict[str, Any] | None:
    """get_group() for async code."""
    return _group(await _aread(gq.GROUP_VIEWS, {"ids": [checked_id(group_id, "group_id")]}))


def _group(rows: list[dict[str, Any]]) -> dict[str, Any] | None:
    if not rows:
        return None
    out = group_view(rows[0])
    for k in ("created_at", "sealed_at", "cancelled_at", "finished_at"):
        out[k] = iso(rows[0][k])
    return out


# Rows per page at most: a group has at most this many members. A bigger limit would only fail
# in Postgres (LIMIT is a bigint), as an error that does not name it.
MAX_PAGE = 100_000

Page = tuple[list[dict[str, Any]], int | None]  # (rows, the cursor of the next page or None)


def _check_limit(limit: Any) -> None:
    if isinstance(limit, bool) or not isinstance(limit, int):
        raise ArgumentTypeError(f"limit must be an int from 1 to {MAX_PAGE}, got {shown(limit, typed=True, width=60)}")
    if limit < 1:
        raise ArgumentValueError(f"limit must be an int of at least 1, got {shown(limit, width=60)}")
    if limit > MAX_PAGE:
        raise ArgumentValueError(f"limit must be an int from 1 to {MAX_PAGE}, got {shown(limit, width=60)}")


def group_members(group_id: int, after: int | None = None, limit: int = 100) -> Page:
    """One page of members in id order: (rows, next_cursor). Pass next_cursor as `after` for the
    next page; it is None on the last page (even a full one)."""
    warn_if_on_event_loop("jobs.group_members()", "jobs.agroup_members()")
    return _page(_read(*_members(group_id, after, limit)), limit, "id", _member_row)


async def agroup_members(group_id: int, after: int | None = None, limit: int = 100) -> Page:
    """group_members() for async code."""
    return _page(await _aread(*_members(group_id, after, limit)), limit, "id", _member_row)


def group_history(group_id: int, before: int | None = None, limit: int = 50) -> Page:
    """The group's events, newest first: (rows of {seq, event, data, at}, next_cursor)."""
    warn_if_on_event_loop("jobs.group_history()", "jobs.agroup_history()")
    return _page(_read(*_history(group_id, before, limit)), limit, "seq", _event_row)


async def agroup_history(group_id: int, before: int | None = None, limit: int = 50) -> Page:
    """group_history() for async code."""
    return _page(await _aread(*_history(group_id, before, limit)), limit, "seq", _event_row)


def _members(group_id: Any, after: Any, limit: Any) -> tuple[str, dict[str, Any] | None]:
    """The statement of a page of members and its parameters; None when no row can be on it."""
    group_id = checked_id(group_id, "group_id")
    _check_limit(limit)
    after = checked_cursor(after, "after") if after is not None else 0
    if after >= BIGINT_MAX:
        return gq.MEMBERS_PAGE, None  # no id comes after it
    return gq.MEMBERS_PAGE, {"id": group_id, "after": after, "limit": limit}


def _history(group_id: Any, before: Any, limit: Any) -> tuple[str, dict[str, Any] | None]:
    group_id = checked_id(group_id, "group_id")
    _check_limit(limit)
    cursor = checked_cursor(before, "before") if before is not None else BIGINT_MAX
    if cursor <= 1:
        return gq.EVENTS_PAGE, None  # seqs start at 1: none comes before it
    return gq.EVENTS_PAGE, {"id": group_id, "before": cursor, "limit": limit}


def _member_row(r: dict[str, Any]) -> None:
    r["run_at"] = iso(r["run_at"])
    r["finished_at"] = iso(r["finished_at"])
    r["progress"] = progress_view(r["progress"], r["attempt"])


def _event_row(r: dict[str, Any]) -> None:
    r["at"] = iso(r["at"])


def _page(rows: list[dict[str, Any]], limit: int, key: str, shape: Callable[[dict[str, Any]], None]) -> Page:
    rows, cursor = page_of(rows, limit, key)
    for r in rows:
        shape(r)
    return rows, cursor