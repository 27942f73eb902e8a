"""Test helpers: `drain()` runs every due job in this process; `clear()` empties the job tables.

`drain()` is a one-job-at-a-time runtime that stops when nothing is due: it registers and beats
like any runtime (so nobody rescues what it holds), claims, runs and completes through the same
code paths (it hears cancels as a runtime does), and returns counts by outcome: {"succeeded":
n, "failed": n, "retrying": n, "cancelled": n, "released": n} (zeros left out). Jobs scheduled
in the future are not due; a retry whose backoff has not passed is not run again. Jobs a start
rate (`rate=`) holds back are due: drain() waits for their tokens, so it takes as long as the
rate says.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Sequence
from typing import Any

import psycopg

from ...types import shown
from ... import api, loops
from ...blocking import warn_if_on_event_loop
from ...config import get_settings
from ...errors import ArgumentTypeError, ArgumentValueError, ConfigError, DependencyError
from ...tasks import reraise_if_cancelled
from .. import database, queries
from ..groups import queries as group_queries
from ..periodic import queries as periodic_queries
from ..workflows import queries as workflow_queries
from ..runtime import maintenance
from ..runtime.runtime import Runtime
from .options import check_queue
from .registry import REGISTRY, Registry

log = logging.getLogger("livepush.jobs")

# Seconds between drain()'s beats. A drain takes as long as its jobs (or a start rate) say, and a
# runtime silent for three of its beats is taken for dead by the others, its jobs run again.
DRAIN_HEARTBEAT = 60.0


def _drained_queues(queues: Sequence[str] | None) -> list[str] | None:
    """drain()'s `queues`, checked: a list of queue names, or None for every queue with due jobs."""
    # A str is a sequence too: drain("imports") would drain the queues "i", "m", "p", ... and
    # report that nothing was due.
    if isinstance(queues, (str, bytes)) or (queues is not None and not isinstance(queues, Sequence)):
        raise ArgumentTypeError(f"drain(queues=) takes a list of queue names, got {type(queues).__name__} "
                                f"{shown(queues, width=60)}"
                                + (f" (wrap a single queue in a list: [{shown(queues, width=60)}])" if isinstance(queues, str)
                                   else ""))
    if queues is not None and not queues:
        # As `livepush jobs --queues` naming none: an empty list built by the caller is more
        # likely a mistake than a wish for every queue, and running them all is not undone.
        raise ArgumentValueError("drain(queues=[]) names no queue: list the queues to drain, or pass None "
                                 "(the default) to drain every queue")
    return [check_queue(q, "drain(queues=)") for q in queues] if queues is not None else None


def _registry(registry: Registry) -> Registry:
    """drain()'s `registry`, checked: the runtime would otherwise take it for module names."""
    if not isinstance(registry, Registry):
        raise ArgumentTypeError(f"drain(registry=) takes a livepush.jobs Registry (jobs.REGISTRY by default), got "
                                f"{shown(registry, typed=True, width=60)}")
    return registry


def _max_jobs(max_jobs: int | None) -> int | None:
    """drain()'s `max_jobs`, checked: None (no bound) or a whole number from 0 up."""
    # Compared with the count of jobs run, a str raised a bare TypeError from inside the loop
    # (after the runtime opened), and a negative or float bound was taken as given.
    if max_jobs is None:
        return None
    if isinstance(max_jobs, bool) or not isinstance(max_jobs, int):
        raise ArgumentTypeError(f"drain(max_jobs=) takes a whole number from 0 up, or None for no bound; got "
                                f"{shown(max_jobs, typed=True, width=60)}")
    if max_jobs < 0:
        # A count out of range is a ValueError, as every other limit's is (reference §4).
        raise ArgumentValueError(f"drain(max_jobs=) takes a whole number from 0 up, or None for no bound; got "
                                 f"{shown(max_jobs)}")
    return max_jobs


async def adrain(queues: Sequence[str] | None = None, *, registry: Registry = REGISTRY,
                 max_jobs: int | None = None) -> dict[str, int]:
    """drain() for async code."""
    queues = _drained_queues(queues)
    max_jobs = _max_jobs(max_jobs)
    registry = _registry(registry)
    # Listening, as a runtime does: jobs.cancel() of the job it runs reaches it by notification
    # (and at its next beat, should the notification not come). Where
    # LIVEPUSH_LISTEN_DATABASE_URL names the way around a pooler that cannot keep a LISTEN, it
    # listens there, unless jobs.configure() chose another database.
    listen_url = database.listen_url()
    rt = Runtime(registry, queues=queues or ["default"], concurrency=1,
                 install_signals=False, heartbeat=DRAIN_HEARTBEAT, flush_delay=0.0, listen_url=listen_url)
    ran = 0
    try:
        await rt._open()  # in the try: a start that fails part-way is closed too
        assert rt._pool is not None and rt._completer is not None
        rt._tasks.append(asyncio.create_task(_beat(rt), name="livepush-jobs-drain-heartbeat"))  # _close() ends it
        while max_jobs is None or ran < max_jobs:
            await maintenance.promote(rt._pool)
            if not queues:
                async with rt._pool.connection() as conn:
                    due = sorted(r[0] for r in await (await conn.execute(queries.QUEUES_WITH_DUE_JOBS)).fetchall())
                if not due:
                    break
                if due != rt.queues:  # its row names what it drains (`livepush status`), not `default`
                    assert rt.id is not None
                    await maintenance.set_queues(rt._pool, rt.id, due)
                    rt.queues = due
            # A runtime skips a function with limits whose last claim found nothing until its
            # doorbell rings or a poll interval passes; drain() hears no doorbell, and the job it
            # just ran may have enqueued one: every claim here looks again.
            rt._limited_empty.clear()
            if await rt._claim(1) == 0:
                if rt._claim_due is None:
                    break
                # A start rate's bucket held due jobs back (they start when its next token is), or a
                # step's run was busy: claim again then.
                await asyncio.sleep(max(rt._claim_due - asyncio.get_running_loop().time(), 0.0))
                continue
            ran += 1
            await rt.in_hand_ended()
            await rt._completer.wait_idle(timeout=30)
    finally:
        await rt._close()
    return {k: v for k, v in rt.counts.items() if v}


async def _beat(rt: Runtime) -> None:
    """drain()'s heartbeat: its runtime row's beat, and the look for a cancel of its job whose
    notification it missed, as a runtime's beat does. Not the rescue of other runtimes' jobs: a
    test's drain() changes only what it runs."""
    assert rt._pool is not None and rt.id is not None
    while True:
        await asyncio.sleep(rt.heartbeat)
        try:
            await maintenance.beat(rt._pool, rt.info)
            rt._cancel_confirmed(await maintenance.cancel_requests(rt._pool, rt.id))
        except (psycopg.Error, DependencyError) as exc:
            reraise_if_cancelled()
            log.warning("drain(): heartbeat failed (%s); trying again next beat", exc)


async def _drain_on_its_own_loop(queues: Sequence[str] | None, registry: Registry,
                                 max_jobs: int | None) -> dict[str, int]:
    """adrain() on the loop drain() made for it, then what its jobs opened on that loop (the
    pools of aenqueue() and apublish()) closed, as that loop ends right after. Not in adrain():
    the caller's loop goes on, and its other tasks may be using those pools."""
    try:
        return await adrain(queues, registry=registry, max_jobs=max_jobs)
    finally:
        await database.release_loop()
        await api.release_loop()


def drain(queues: Sequence[str] | None = None, *, registry: Registry = REGISTRY,
          max_jobs: int | None = None) -> dict[str, int]:
    """Run every due job in this process, one at a time, until none is due; counts by outcome.
    Works from sync code and from inside a running event loop (it then uses a thread, and holds
    that loop until every job ran: said once, as every sync call with an async twin says it)."""
    warn_if_on_event_loop("jobs.drain()", "jobs.adrain()")
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        in_loop = False
    else:
        in_loop = True
    _drained_queues(queues)  # refused here, in the caller's thread, not from the drain's
    _max_jobs(max_jobs)
    _registry(registry)
    if not in_loop:
        # Outside the except block: run there, every error the jobs raise would be chained to
        # that RuntimeError, and each failed job's logged traceback would start with it.
        return loops.run(_drain_on_its_own_loop(queues, registry, max_jobs))
    result: dict[str, Any] = {}

    def target() -> None:
        try:
            result["value"] = loops.run(_drain_on_its_own_loop(queues, registry, max_jobs))
        except BaseException as exc:  # handed to the caller's thread below
            result["error"] = exc

    thread = threading.Thread(target=target, name="livepush-jobs-drain")
    thread.start()
    thread.join()
    if "error" in result:
        raise result["error"]
    return result["value"]  # type: ignore[no-any-return]


def _clear_statements(call: str) -> list[str]:
    if not get_settings().is_test:
        raise ConfigError(f"jobs.{call}() deletes every job: it only runs with LIVEPUSH_ENV=test")
    return (workflow_queries.CLEAR + "; " + queries.CLEAR + "; " + group_queries.CLEAR + "; "
            + periodic_queries.CLEAR).split("; ")


def clear() -> None:
    """Delete every job, group, workflow run and runtime row, paused queue and periodic job's
    newest tick. Refuses unless LIVEPUSH_ENV=test."""
    warn_if_on_event_loop("jobs.clear()", "jobs.aclear()")
    statements = _clear_statements("clear")
    with database.connection() as conn:
        for statement in statements:
            conn.execute(statement)


async def aclear() -> None:
    """clear(), for async tests: the sync one would hold their loop while it waits."""
    statements = _clear_statements("aclear")
    async with database.aconnection() as conn:
        for statement in statements:
            await conn.execute(statement)
