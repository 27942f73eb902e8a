"""The one place livepush's parts are put together (the CLI's commands and the demo use it).

From the settings it builds, once per process: one Postgres listener per database and one Redis
subscriber (shared by every part that waits for notifications there), the fan-out, the
revocation store, the state sources, and, with jobs, the runtime; then hands each part what it
needs. Nothing else in the package builds or finds its collaborators.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field

from .. import api, migrate, sessions
from ..config import Settings
from ..fanout import FanOut, from_env
from ..jobs import database
from ..jobs.api.status import arefresh_metrics
from ..jobs.events.source import JobStates
from ..jobs.runtime.runtime import FLAGS, Runtime, load_modules
from ..postgres.identity import check_listen_database
from ..postgres.listener import Listener
from ..redis.client import deployment_prefix, listener_name
from ..redis.subscriber import Subscriber
from ..server.app import PageRoute, PushServer
from ..server.run import Sidecar
from ..sessions.revocations import store_from_settings
from ..sessions.rules import App


@dataclass
class Parts:
    """What a `serve` process runs, and what it closes when it stops (in this order)."""

    server: PushServer
    runtime: Runtime | None = None
    closers: list[Callable[[], Awaitable[None]]] = field(default_factory=list)
    listener: Listener | None = None  # the one LISTEN connection every Postgres part shares

    @property
    def sidecars(self) -> list[Sidecar]:
        return [runtime_sidecar(self.runtime)] if self.runtime is not None else []

    async def close(self) -> None:
        for close in self.closers:
            with contextlib.suppress(Exception):
                await close()


def _listeners(settings: Settings) -> tuple[Listener | None, Subscriber | None]:
    # LISTEN needs a session of its own: LIVEPUSH_LISTEN_DATABASE_URL may send it past a pooler.
    listener = Listener(settings.listen_url) if settings.listen_url else None
    subscriber = None
    if settings.redis_url:
        subscriber = Subscriber(settings.redis_url,
                                name=listener_name(deployment_prefix(settings.redis_url, settings.redis_prefix)))
    return listener, subscriber


def server_parts(settings: Settings, *, app: App | None = None, with_jobs: Sequence[str] = (),
                 pages: PageRoute | None = None, worker: int | None = None) -> Parts:
    """A server (and, with `with_jobs`, a job runtime beside it) for `settings`; `worker` is its
    index when it is one of `serve --workers N`'s processes."""
    settings.require_secret()
    if settings.database_url:
        migrate.check_schema(settings.database_url)
        check_listen_database(settings)
    if with_jobs:
        # First: the modules may choose the jobs' database at import (jobs.configure()), and so
        # where the runtime hears its rings and the state topics are read.
        load_modules(with_jobs)
    listener, subscriber = _listeners(settings)
    # On the local fan-out, what the modules published at import went into this process's default
    # one: serving a new one would lose it (a resume from its offsets would get a reset).
    fanout = (api.local_default() if settings.fanout == "local" else None) \
        or from_env(settings, listener=listener, subscriber=subscriber)
    store = store_from_settings(settings, listener=listener, subscriber=subscriber)
    states = _job_states(settings, listener)
    ring_store = _store_heard_alone(settings, fanout)
    # publish() and revoke() in this process go through the server's own parts (the local fan-out
    # and the memory store exist only there).
    api.set_default_fanout(fanout)
    sessions.set_default_store(store)
    runtime = None
    if with_jobs:
        # The runtime shares the server's listener only when its jobs ring there, else listens on its own.
        shared = listener if database.on_settings_database() else None
        runtime = Runtime(list(with_jobs), install_signals=False, listener=shared, publisher=fanout)
        # Jobs live in Postgres (LIVEPUSH_DATABASE_URL, or the modules' jobs.configure()): without
        # one, refused now, before the server takes its port and says it serves, not once it is up.
        database.database_url()
    health = [lambda: runtime.healthy] if runtime is not None else []
    url = settings.database_url
    # The queue and runtime gauges come from the jobs' database, which the modules may have chosen
    # (jobs.configure()) with no LIVEPUSH_DATABASE_URL: left out there, `absent()` of the runtime
    # gauge said no runtime ran beside a runtime that did.
    jobs_have_database = bool(url) or database.configured_url() is not None
    server = PushServer(settings, fanout, app=app, store=store, states=states, ring_store=ring_store,
                        pages=pages, health=health,
                        schema=(lambda: migrate.aschema_behind(url)) if url else None,
                        refreshers=[arefresh_metrics] if jobs_have_database else [], worker=worker)
    closers: list[Callable[[], Awaitable[None]]] = [fanout.aclose, store.aclose, *(s.aclose for s in states)]
    closers += [c.aclose for c in (listener, subscriber) if c is not None]
    closers.append(_forget_defaults)
    return Parts(server, runtime, closers, listener)


def _job_states(settings: Settings, listener: Listener | None) -> list[JobStates]:
    """The state topics (`job:`, `group:`, `workflow:`), read where the jobs are: the settings'
    database, or the one jobs.configure() chose in the --app or --with-jobs modules. Read from the
    settings' database, a page showed nothing of those jobs, or another job with the same id."""
    if _jobs_on_settings_database(settings):
        return [JobStates(settings.database_url, listener=listener)] if settings.database_url else []
    url = database.database_url()
    migrate.check_schema(url)
    # A listener of its own: the shared one (LIVEPUSH_LISTEN_DATABASE_URL) reaches the settings'
    # database only, where these jobs' rings are never heard.
    return [JobStates(url)]


def _store_heard_alone(settings: Settings, fanout: FanOut) -> bool:
    """Whether no other ring than its own goes through the revocation store's listener: then
    nothing else showed that it hears, and revocations made elsewhere went unheard until the
    periodic re-check, so readiness rings the store's own channel."""
    if settings.database_url:
        # The store listens on the settings' database, where the Postgres fan-out's canary and the
        # state ring of jobs kept there go too.
        return fanout.name != "postgres" and not _jobs_on_settings_database(settings)
    # In Redis (no database), on the subscriber the Redis fan-out's canary goes through too.
    return bool(settings.redis_url) and fanout.name != "redis"


def _jobs_on_settings_database(settings: Settings) -> bool:
    """Whether the jobs are in the settings' database: jobs.configure() chose none, or that one."""
    return database.configured_url() in (None, settings.database_url)


async def _forget_defaults() -> None:
    api.set_default_fanout(None)
    sessions.set_default_store(None)


def jobs_runtime(settings: Settings, modules: Sequence[str], **options: object) -> tuple[Runtime, FanOut]:
    """A job runtime for `livepush jobs`, with a publish-only fan-out for its own state topics."""
    fanout = from_env(settings)
    load_modules(modules)  # first: they may choose the jobs' database, and so where its rings are heard
    if database.listen_url():
        check_listen_database(settings)
    # Its errors name the flags the operator typed (--concurrency 0), not Runtime's keywords.
    return Runtime(list(modules), publisher=fanout, listen_url=database.listen_url(), option_names=FLAGS,
                   **options), fanout  # type: ignore[arg-type]


def runtime_sidecar(runtime: Runtime) -> Sidecar:
    """For `serve --with-jobs`: the runtime as a task beside the server; it drains when the server's
    stop event is set, gives its jobs back at once on the second signal (`hurry`), as `livepush
    jobs` does, and its failure (for good) ends the server with it."""

    async def run(stop: asyncio.Event, hurry: asyncio.Event, started: asyncio.Event) -> None:
        task = asyncio.create_task(runtime.run(), name="livepush-jobs-runtime")
        stopper = asyncio.create_task(stop.wait())

        async def tell_started() -> None:
            with contextlib.suppress(Exception):  # run()'s failure, which `task` raises below
                await runtime.wait_started(timeout=None)
                started.set()

        opened = asyncio.create_task(tell_started())
        try:
            done, _ = await asyncio.wait([task, stopper], return_when=asyncio.FIRST_COMPLETED)
        finally:
            opened.cancel()
        if task in done:
            stopper.cancel()
            task.result()
            return
        runtime.stop()
        hurried = asyncio.create_task(hurry.wait())
        try:
            await asyncio.wait([task, hurried], return_when=asyncio.FIRST_COMPLETED)
        finally:
            hurried.cancel()
        if not task.done():
            runtime.stop(now=True)
        await task

    return run
