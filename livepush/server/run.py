"""`livepush serve`'s lifecycle: start the server it is given, run what runs beside it, and stop
cleanly on SIGTERM or SIGINT, at once or paced over LIVEPUSH_DRAIN_SECONDS (the CLI builds the
parts: livepush/cli/wiring.py)."""

from __future__ import annotations

import asyncio
import errno
import logging
import signal
import socket
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from typing import Any
from urllib.parse import urlsplit

from .. import metrics
from ..errors import ConfigError
from .app import PushServer

log = logging.getLogger("livepush.server")

# Work run beside the server (the job runtime with --with-jobs), stopped with it: it gets the
# stop event, the hurry event (a second signal: cut the stop short) and an event it sets once it
# runs, and returns once it has stopped; if it ends first, the server stops too.
Sidecar = Callable[[asyncio.Event, asyncio.Event, asyncio.Event], Coroutine[Any, Any, None]]


def raise_fd_limit() -> None:
    """Each connection is a file descriptor: lift the soft limit to the hard one."""
    try:
        import resource

        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        if soft < hard:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    except (ImportError, ValueError, OSError):
        pass


def install_stop_signals(stop: asyncio.Event, hurry: asyncio.Event) -> None:
    """The first SIGTERM or SIGINT sets `stop`; a second one sets `hurry` (end a drain now)."""
    loop = asyncio.get_running_loop()

    def on_signal() -> None:
        if stop.is_set():
            hurry.set()
        stop.set()

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, on_signal)


async def close_connections(server: PushServer, drain_seconds: float, hurry: asyncio.Event) -> None:
    """The server's connections closed, paced over `drain_seconds`; all at once after `hurry`."""
    if drain_seconds > 0:
        log.info("stopping: closing %d connections with 1001 over %g s (signal again to close all now)",
                 len(server.clients), drain_seconds)
    else:
        log.info("stopping: closing connections with 1001")
    paced = asyncio.create_task(server.close_connections(drain_seconds), name="livepush-drain")
    hurried = asyncio.create_task(hurry.wait(), name="livepush-hurry-wait")
    await asyncio.wait([paced, hurried], return_when=asyncio.FIRST_COMPLETED)
    hurried.cancel()
    if paced.done():
        paced.result()
        return
    log.info("stopping: second signal, closing the remaining %d connections now", len(server.clients))
    paced.cancel()
    await asyncio.wait([paced])
    await server.close_connections()


def host_port(host: str, port: int) -> str:
    """`host:port` as a URL writes it: an IPv6 address in brackets (RFC 3986), else `::1:8765`
    is no URL a browser or a client takes, and its port cannot be told from the address."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def listen_error(host: str, port: int, exc: OSError, *, port_setting: str, host_setting: str,
                 what: str = "listen") -> ConfigError:
    """The one line for a listening socket that cannot be made, naming what to change: the host
    (`host_setting`) when it names no address of this machine (it does not resolve, is another
    machine's, or is an IPv6 address in a URL's brackets), else the port (`port_setting`: the setting that chose it)."""
    where = host_port(host, port)
    if host.startswith("[") and host.endswith("]"):
        # An IPv6 address as a URL writes it: the resolver takes the brackets for part of a name.
        where = f"{host}:{port}"
        fix = f"write {host_setting} without the brackets: {host[1:-1]}"
    elif "://" in host and _url_host(host):
        # A URL (the page's, a client's): its colon made it look like an IPv6 address above.
        where = f"{host}:{port}"
        fix = (f"write {host_setting} as the host alone, without its scheme: {_url_host(host)}"
               + _url_port(host, port_setting))
    elif isinstance(exc, socket.gaierror) or exc.errno == errno.EADDRNOTAVAIL:
        fix = (f"set {host_setting} to an address of this machine, e.g. 127.0.0.1, "
               "or 0.0.0.0 for every interface")
    elif exc.errno == errno.EACCES:
        fix = f"set {port_setting} to a port above 1023, or give the process the right to bind lower ones"
    else:
        fix = f"set {port_setting} to a free port"
    return ConfigError(f"cannot {what} on {where} ({exc.strerror or exc}): {fix}")


def _url_host(url: str) -> str | None:
    """The host a URL names, None when it names none or cannot be read."""
    try:
        return urlsplit(url).hostname or None
    except ValueError:
        return None


def _url_port(url: str, port_setting: str) -> str:
    """Where the port a URL names goes (its setting), or nothing when it names none."""
    try:
        port = urlsplit(url).port
    except ValueError:
        return ""
    return f", and its port in {port_setting}: {port}" if port else ""


async def _all_started(started: Sequence[asyncio.Event], enders: Sequence[asyncio.Future[Any]]) -> bool:
    """Whether every event in `started` is set before any of `enders` is done."""
    async def all_set() -> None:
        for event in started:
            await event.wait()

    waiting = asyncio.create_task(all_set())
    try:
        await asyncio.wait([waiting, *enders], return_when=asyncio.FIRST_COMPLETED)
    finally:
        waiting.cancel()
    return all(event.is_set() for event in started) and not any(end.done() for end in enders)


async def serve(
    server: PushServer,
    *,
    sidecars: Sequence[Sidecar] = (),
    closers: Sequence[Callable[[], Awaitable[None]]] = (),
    ready: Callable[[PushServer], None] | None = None,
) -> int:
    """Run until SIGTERM or SIGINT (or a sidecar ending); return the exit status. A sidecar that
    failed re-raises its error once everything is closed."""
    raise_fd_limit()
    stop, hurry = asyncio.Event(), asyncio.Event()
    install_stop_signals(stop, hurry)
    settings = server.settings
    side_tasks: list[asyncio.Task[None]] = []
    try:
        try:
            await server.start()
        except OSError as exc:
            raise listen_error(settings.host, settings.port, exc, host_setting=settings.named("host"),
                               port_setting=settings.named("port")) from None
        log.info("livepush serving on ws://%s (fan-out: %s)", host_port(settings.host, server.port),
                 server.fanout.name)
        metrics.SERVING.set(1)
        started = [asyncio.Event() for _ in sidecars]
        side_tasks = [asyncio.create_task(car(stop, hurry, started[i]), name=f"livepush-sidecar-{i}")
                      for i, car in enumerate(sidecars)]
        stop_wait = asyncio.create_task(stop.wait(), name="livepush-stop-wait")
        # Said ready only once what runs beside it runs too: a job runtime that cannot start would
        # otherwise make a worker of `serve --workers N` count as one that served, restarted
        # again and again, where a worker failing at boot stops the supervisor with its status.
        if await _all_started(started, [stop_wait, *side_tasks]) and ready is not None:
            ready(server)
        await asyncio.wait([stop_wait, *side_tasks], return_when=asyncio.FIRST_COMPLETED)
        stop.set()
        metrics.SERVING.set(0)  # draining: it takes no new connection
        # Connections first (the job runtime beside us drains at the same time, on the stop
        # event), so the whole stop takes at most the longer of the two; the fan-out stays open
        # until both are done, since the runtime's jobs keep publishing while they finish.
        await close_connections(server, settings.drain_seconds, hurry)
        if side_tasks:
            await asyncio.gather(*side_tasks, return_exceptions=True)
        await server.stop()
    finally:
        for close in closers:
            try:
                await close()
            except Exception as exc:  # closing what is already broken: nothing more to do
                log.debug("closing failed: %s", exc)
    for task in side_tasks:
        if task.done() and not task.cancelled() and task.exception() is not None:
            raise task.exception()  # type: ignore[misc]
    return 0
