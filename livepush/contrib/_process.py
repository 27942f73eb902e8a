"""What a web app's process holds for publish(), latest_offset(), enqueues and revoke(), opened
when the app starts and closed when it stops, framework-neutral (docs/frameworks.md).

These are the process's defaults, which each part otherwise makes on first use: the publishing
fan-out (`livepush.api`), the revocation store (`livepush.sessions`) and the jobs' pools
(`livepush.jobs.database`). Opening them at start makes a bad URL, an unreachable database or
Redis, a missing secret or an unmigrated schema stop the app's start with one clear error
instead of failing its first request; closing them on the app's loop, before that loop ends,
leaves no connection behind.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from .. import api, jobs, migrate, sessions
from ..config import get_settings
from ..errors import ConfigError
from ..jobs import database

log = logging.getLogger("livepush.contrib")


def _jobs_database() -> bool:
    """Whether this process has a database for jobs (a Redis-only app has none)."""
    try:
        database.database_url()
    except ConfigError:
        return False
    return True


def _jobs_without_database() -> str | None:
    """What to tell an app whose modules define jobs but that has no database to enqueue them in
    (jobs live in Postgres, whatever the fan-out), else None. Each enqueue failed at its call,
    request after request, with nothing said at the start."""
    names = jobs.REGISTRY.names()
    if not names or _jobs_database():
        return None
    shown = ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
    return (f"this app defines jobs ({shown}) but has no database to enqueue them in: jobs live in Postgres "
            "whatever the fan-out, so every enqueue would fail; set LIVEPUSH_DATABASE_URL to the database "
            "`livepush jobs` uses, or name it with jobs.configure(url) before the app starts")


async def aopen() -> None:
    """Check the settings and the schema, then open the running loop's pools and clients."""
    settings = get_settings()
    settings.require_secret()  # every session cookie and signed topic needs it
    unqueueable = _jobs_without_database()
    # The local fan-out is an app run alone on purpose (its own tests): warned below, not refused.
    if unqueueable is not None and settings.fanout != "local":
        raise ConfigError(unqueueable)
    # The jobs may be kept in another database (jobs.configure()): its schema is checked too.
    urls = dict.fromkeys([settings.database_url, database.database_url() if _jobs_database() else None])
    for url in filter(None, urls):
        await migrate.acheck_schema(url, "this app's livepush")
    if settings.fanout == "local":
        api.local_fanout_explained()  # below, in the app's words
    try:
        await api.default_fanout().aopen()
        store = sessions.default_store()
        await store.aopen()
        if _jobs_database():
            await database.aopen()
    except BaseException:
        await aclose()
        raise
    # Warned, not refused: an app's own tests may run it alone on purpose.
    if settings.fanout == "local":
        log.warning("livepush: LIVEPUSH_FANOUT is local, so what this app publishes reaches no `livepush serve` (the "
                    "local fan-out delivers inside this process only): give the app the servers' fan-out, "
                    "LIVEPUSH_FANOUT and LIVEPUSH_DATABASE_URL or LIVEPUSH_REDIS_URL as they have them")
    if unqueueable is not None:
        log.warning("livepush: %s", unqueueable)
    if not store.shared:
        log.warning("livepush: this app has neither a database nor Redis, so neither signing out nor "
                    "another user signing in can revoke a session: set LIVEPUSH_DATABASE_URL (or LIVEPUSH_REDIS_URL) to the one the servers use")


async def _close_store() -> None:
    await sessions.default_store().aclose()
    sessions.set_default_store(None)


async def _close_jobs() -> None:
    await database.release_loop()
    await asyncio.to_thread(database.close_pools)  # a sync pool's close joins its worker threads


async def _close_fanout() -> None:
    await api.release_loop()
    await asyncio.to_thread(api.set_default_fanout, None)  # closes its sync side


async def aclose() -> None:
    """Close what the app's process opened, on the running loop and in threads (sync endpoints
    publish on a pool of their own); the next use opens anew. A failure is logged, not raised:
    the others still close."""
    closers: list[tuple[str, Callable[[], Awaitable[None]]]] = [
        ("the revocation store", _close_store), ("the jobs' pools", _close_jobs), ("the fan-out", _close_fanout)]
    for what, close in closers:
        try:
            await close()
        except Exception:
            log.exception("livepush: closing %s failed", what)
