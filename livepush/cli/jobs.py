"""`livepush jobs MODULE[,MODULE...] [--queues a,b] [--concurrency N] [--shutdown-timeout S] [--heartbeat S]`.

The lead's `livepush/cli.py` wires this in: `add_arguments(parser)` on the `jobs` sub-parser,
then `run(args)` returns the exit status (0 clean stop, 1 dependency down, 2 bad usage or
configuration; SPEC §3).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
import threading
from typing import Any

from ..errors import ConfigError, DependencyError, SchemaError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("modules", metavar="MODULE[,MODULE...]",
                        help="modules that define the job functions, comma-separated")
    parser.add_argument("--queues", default=None,
                        help="queues to run, in the order they are served (default: every queue the modules use)")
    parser.add_argument("--concurrency", type=int, default=10, help="jobs run at once (default 10)")
    parser.add_argument("--shutdown-timeout", type=float, default=30.0,
                        help="seconds the jobs in hand get to finish on SIGTERM before they are given back (default 30)")
    parser.add_argument("--heartbeat", type=float, default=10.0,
                        help="seconds between heartbeats; three missed beats and the runtime is dead (default 10)")
    parser.add_argument("--poll-interval", type=float, default=1.0,
                        help="seconds between polls when no notification arrives (default 1)")
    parser.add_argument("--retention", type=float, default=7 * 24 * 3600.0,
                        help="seconds finished jobs and task groups are kept before they are deleted "
                             "(default 604800, 7 days; 0 keeps them forever)")


def run(args: argparse.Namespace) -> int:
    from ..jobs.runtime.runtime import Runtime

    if not logging.getLogger().handlers:
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    modules = [m.strip() for m in args.modules.split(",") if m.strip()]
    queues = [q.strip() for q in args.queues.split(",") if q.strip()] if args.queues else None
    try:
        # Make modules in the current directory importable, as `python -m` would.
        if os.getcwd() not in sys.path and "" not in sys.path:
            sys.path.insert(0, os.getcwd())
        runtime = Runtime(modules, queues=queues, concurrency=args.concurrency,
                          shutdown_timeout=args.shutdown_timeout, heartbeat=args.heartbeat,
                          poll_interval=args.poll_interval,
                          retention=getattr(args, "retention", None) or None)
        _run_loop(_run_then_release(runtime))
        status = 0
    except (ConfigError, SchemaError) as exc:
        print(f"livepush jobs: {exc}", file=sys.stderr)
        status = 2
    except DependencyError as exc:
        print(f"livepush jobs: {exc}", file=sys.stderr)
        status = 1
    except KeyboardInterrupt:
        status = 0
    if any(t.name.startswith("livepush-job") and t.is_alive() for t in threading.enumerate()):
        # A sync job past its timeout, or given back on shutdown, still runs in its thread;
        # Python would wait for it at exit. Its lease is gone, so nothing it does counts: leave now.
        sys.stdout.flush()
        sys.stderr.flush()
        logging.shutdown()
        os._exit(status)
    return status


async def _run_then_release(runtime: Any) -> None:
    from .. import api
    from ..jobs import database

    try:
        await runtime.run()
    finally:
        # Pools job code opened on this loop must close before it ends (see testing.adrain).
        await database.close_async_pool()
        await api.release_loop()


def _run_loop(coro: object) -> None:
    try:
        import uvloop

        uvloop.run(coro)  # type: ignore[arg-type]
    except ImportError:
        asyncio.run(coro)  # type: ignore[arg-type]


def main(argv: list[str] | None = None) -> int:
    """Standalone entry point (`python -m livepush.jobs.cli ...`) until the main CLI wires it in."""
    parser = argparse.ArgumentParser(prog="livepush jobs", description="Run the livepush job runtime.")
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())


def sidecar(modules: str, settings: object = None):  # type: ignore[no-untyped-def]
    """For `livepush serve --with-jobs MODULE`: a coroutine function the server runs beside
    itself; it stops (draining) when the server's stop event is set."""
    from ..jobs.runtime.runtime import Runtime

    names = [m.strip() for m in modules.split(",") if m.strip()]
    runtime = Runtime(names, install_signals=False)

    async def run(stop: asyncio.Event) -> None:
        task = asyncio.create_task(runtime.run(), name="livepush-jobs-runtime")
        stopper = asyncio.create_task(stop.wait())
        done, _ = await asyncio.wait([task, stopper], return_when=asyncio.FIRST_COMPLETED)
        if task not in done:
            runtime.stop()
            await task
        else:
            stopper.cancel()
            task.result()

    return run
