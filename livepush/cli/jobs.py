"""`livepush jobs MODULE[,MODULE...] [--queues QUEUE[,QUEUE...]] [--concurrency N] [--shutdown-timeout S] [--heartbeat S]
[--poll-interval S] [--retention S] [--metrics-port P]`."""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading

from ..types import shown
from .. import api, loops, metrics
from ..config import Settings, read_number
from ..errors import ConfigError
from ..jobs import database
from ..jobs.api.status import arefresh_metrics
from ..jobs.runtime.runtime import DEFAULT_SHUTDOWN_TIMEOUT
from ..usercode import importable_from_cwd
from . import flags

log = logging.getLogger("livepush.jobs")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("modules", metavar="MODULE[,MODULE...]",
                        help="modules that define the job functions, comma-separated")
    parser.add_argument("--queues", default=None, metavar="QUEUE[,QUEUE...]", action=flags.Joined,
                        help="queues to run, in the order they are served (default: every queue the modules use; "
                             "the flag may be repeated)")
    parser.add_argument("--concurrency", type=flags.whole_number, metavar="N", default=10,
                        help="jobs run at once, from 1 to 100000 (default 10)")
    parser.add_argument("--shutdown-timeout", type=flags.seconds, metavar="S", default=DEFAULT_SHUTDOWN_TIMEOUT,
                        help="seconds the jobs in hand get to finish on SIGTERM before they are given back "
                             f"(default {DEFAULT_SHUTDOWN_TIMEOUT:g}; 0 or more)")
    parser.add_argument("--heartbeat", type=flags.seconds, metavar="S", default=10.0,
                        help="seconds between heartbeats; three missed beats and the runtime is dead "
                             "(default 10; from 0.01 to 86400)")
    parser.add_argument("--poll-interval", type=flags.seconds, metavar="S", default=1.0,
                        help="seconds between polls when no notification arrives (default 1; from 0.01 to 86400)")
    parser.add_argument("--retention", type=flags.seconds, metavar="S", default=7 * 24 * 3600.0,
                        help="seconds finished jobs and task groups are kept before they are deleted "
                             "(default 604800, 7 days; at most 3162240000, 100 years; 0 keeps them forever)")
    parser.add_argument("--metrics-port", type=_port, default=None, metavar="P",
                        help="serve Prometheus metrics on GET /metrics at this port (on LIVEPUSH_HOST)")


def _port(text: str) -> int:
    try:
        port = int(read_number(text, int))
    except ValueError:
        port = -1
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"takes a TCP port from 0 to 65535, got {shown(text, width=40)}")
    return port


def modules_of(text: str) -> list[str]:
    return [m.strip() for m in text.split(",") if m.strip()]


def load(args: argparse.Namespace) -> None:
    """Import the job modules before any event loop runs, as `python -c "import mod"` would: a
    project's set-up may run asyncio.run() at import, or code that refuses to run inside a loop."""
    from ..jobs.runtime.runtime import load_modules
    from . import wiring  # noqa: F401 - first: a project's own redis.py must not stand in for the library

    importable_from_cwd()
    load_modules(modules_of(args.modules))


async def run(args: argparse.Namespace, settings: Settings) -> int:
    from . import wiring

    modules = modules_of(args.modules)
    if not modules:
        # An empty "$MODULES": without a job function, the runtime would claim the default
        # queue's jobs only to give each one back.
        raise ConfigError(f"MODULE[,MODULE...] {args.modules!r} names no module: name the modules that "
                          "define your job functions, e.g. `livepush jobs myapp.jobs`")
    queues = modules_of(args.queues) if args.queues is not None else None
    if queues == []:
        # An empty "$QUEUES": left to the default, the runtime would serve every queue of its
        # modules, those meant for other runtimes too.
        raise ConfigError(f"--queues {args.queues!r} names no queue: list the queues to run, e.g. --queues "
                          "default,imports, or leave the flag out to run every queue the modules use")
    runtime, fanout = wiring.jobs_runtime(
        settings, modules, queues=queues, concurrency=args.concurrency,
        shutdown_timeout=args.shutdown_timeout, heartbeat=args.heartbeat, poll_interval=args.poll_interval,
        retention=args.retention or None)
    if queues is not None:
        _warn_of_unused_queues(runtime.queues, runtime.registry.queues(), modules)
    exposer = None
    if args.metrics_port is not None:
        from ..server.run import host_port, listen_error

        try:
            exposer = await metrics.serve(settings.host, args.metrics_port, [arefresh_metrics],
                                          healthy=lambda: runtime.healthy)
        except OSError as exc:
            # A host that names no address of this machine is LIVEPUSH_HOST's fault, not the port's.
            raise listen_error(settings.host, args.metrics_port, exc, what="serve metrics",
                               port_setting="--metrics-port", host_setting=settings.named("host")) from None
        # With --metrics-port 0 the kernel picks the port: without this line no one could scrape it.
        port = exposer.sockets[0].getsockname()[1] if exposer.sockets else args.metrics_port
        log.info("metrics on http://%s/metrics", host_port(settings.host, port))
    try:
        await runtime.run()
    finally:
        # The runtime has stopped and removed its handlers; what is left is closing. A signal now
        # asks for a stop that is done: it must not kill the process (runner.py ignores it after).
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, signal.SIG_IGN)
        if exposer is not None:
            exposer.close()
        # Pools job code opened on this loop must close before it ends.
        await database.release_loop()
        await api.release_loop()
        await fanout.aclose()
    return 0


def _warn_of_unused_queues(served: list[str], used: list[str], modules: list[str]) -> None:
    """A queue of --queues that no job function of the modules has: a typo (`--queues defualt`)
    leaves the runtime serving nothing, saying only "running". It is served all the same, since a
    job enqueued there by name (request(queue=...)) runs there."""
    unused = [q for q in served if q not in used]
    if unused:
        log.warning("--queues %s: no job function of %s has %s as its queue, so only jobs enqueued there by name "
                    "(request(queue=...)) run there; check the spelling (their queues: %s)", ",".join(unused),
                    ", ".join(modules), "it" if len(unused) == 1 else "them", ", ".join(used) or "none")


def leave_if_threads_run(status: int) -> None:
    """A sync job past its timeout, or given back on shutdown, may still run in its thread, and so
    may an async job's asyncio.to_thread() call (loops.run() left it running). Its lease is gone,
    so nothing it does counts: leave now, rather than run the interpreter's shutdown (atexit hooks,
    module teardown, which joins the latter's thread) beside user code that is still running."""
    if loops.threads_left_running() or any(t.name.startswith("livepush-job") and t.is_alive()
                                           for t in threading.enumerate()):
        sys.stdout.flush()
        sys.stderr.flush()
        logging.shutdown()
        os._exit(status)
