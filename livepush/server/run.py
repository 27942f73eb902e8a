"""`livepush serve`: boot checks, the server, and a clean stop on SIGTERM/SIGINT."""

from __future__ import annotations

import asyncio
import logging
import signal
from collections.abc import Awaitable, Callable

from .. import api, migrate
from ..config import Settings
from ..errors import ConfigError
from ..fanout import FanOut, from_settings
from .app import PageRoute, PushServer
from .hub import SnapshotProvider

log = logging.getLogger("livepush.server")

# Extra work run beside the server (the job runtime with --with-jobs), stopped with it.
Sidecar = Callable[[asyncio.Event], Awaitable[None]]


def raise_fd_limit() -> None:
    """Each connection is a file descriptor: lift the soft limit to the hard one."""
    try:
        import resource

        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        if soft < hard:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    except (ImportError, ValueError, OSError):
        pass


def install_stop_signals(stop: asyncio.Event) -> None:
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)


async def serve(
    settings: Settings,
    *,
    app: object | None = None,
    snapshot: SnapshotProvider | None = None,
    pages: PageRoute | None = None,
    sidecars: list[Sidecar] | None = None,
    fanout: FanOut | None = None,
    ready: Callable[[PushServer], None] | None = None,
) -> int:
    """Run until SIGTERM or SIGINT; return the exit status."""
    settings.require_secret()
    raise_fd_limit()
    if settings.fanout == "postgres" or settings.database_url:
        migrate.check_schema(settings.require_database())
    fanout = fanout or from_settings(settings)
    # publish() in this process shares the server's fan-out (the local one needs it).
    api.set_default_fanout(fanout)
    server = PushServer(settings, fanout, app=app, snapshot=snapshot, pages=pages)
    stop = asyncio.Event()
    install_stop_signals(stop)
    try:
        await server.start()
    except OSError as exc:
        await fanout.aclose()
        raise ConfigError(
            f"cannot listen on {settings.host}:{settings.port} ({exc.strerror or exc}): "
            "set LIVEPUSH_PORT (or --port) to a free port"
        ) from None
    log.info("livepush serving on ws://%s:%d (fan-out: %s)", settings.host, server.port, fanout.name)
    if ready is not None:
        ready(server)
    side_tasks = [asyncio.create_task(car(stop), name=f"livepush-sidecar-{i}") for i, car in enumerate(sidecars or [])]
    stop_wait = asyncio.create_task(stop.wait(), name="livepush-stop-wait")
    await asyncio.wait([stop_wait, *side_tasks], return_when=asyncio.FIRST_COMPLETED)
    stop.set()
    log.info("stopping: closing connections with 1001")
    # Connections first, so clients go elsewhere within the 2 s promised whatever a job
    # runtime beside us still has to drain; the fan-out stays open until it is done, since
    # its jobs keep publishing while they finish.
    await server.close_connections()
    if side_tasks:
        await asyncio.gather(*side_tasks, return_exceptions=True)
    await server.stop()
    api.set_default_fanout(None)
    for task in side_tasks:
        if task.done() and not task.cancelled() and task.exception() is not None:
            raise task.exception()  # type: ignore[misc]
    return 0
