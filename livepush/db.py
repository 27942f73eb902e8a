"""Postgres connections: the one place psycopg connection errors become ours."""

from __future__ import annotations

import psycopg

from .errors import DependencyError


def _redact(url: str) -> str:
    """The URL without its password, safe for an error line."""
    try:
        info = psycopg.conninfo.conninfo_to_dict(url)
    except psycopg.ProgrammingError:
        return "(unparseable URL)"
    host = info.get("host") or "localhost"
    port = info.get("port") or "5432"
    return f"{info.get('dbname') or info.get('user') or ''}@{host}:{port}"


def unreachable(url: str, exc: BaseException) -> DependencyError:
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return DependencyError(
        f"cannot reach Postgres at {_redact(url)} ({first}): check LIVEPUSH_DATABASE_URL and that the server is running"
    )


def connect(url: str, *, autocommit: bool = True, **kwargs: object) -> psycopg.Connection:
    try:
        return psycopg.connect(url, autocommit=autocommit, connect_timeout=5, **kwargs)  # type: ignore[arg-type]
    except (psycopg.OperationalError, psycopg.ProgrammingError) as exc:
        raise unreachable(url, exc) from exc


async def aconnect(url: str, *, autocommit: bool = True, **kwargs: object) -> psycopg.AsyncConnection:
    try:
        return await psycopg.AsyncConnection.connect(url, autocommit=autocommit, connect_timeout=5, **kwargs)  # type: ignore[arg-type]
    except (psycopg.OperationalError, psycopg.ProgrammingError) as exc:
        raise unreachable(url, exc) from exc
