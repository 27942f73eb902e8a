"""Heartbeats, rescue of dead runtimes' jobs, promotion of due scheduled jobs, and retention.

Every runtime runs these; they are safe to run from many runtimes at once (see the statements'
comments in queries.py). Each function is one or two short transactions. The ones that end jobs
return the groups whose counts they changed, for the runtime's progress publisher.
"""

from __future__ import annotations

import collections
import functools
import logging
import os
from collections.abc import Mapping
from datetime import datetime
from typing import Any

import psycopg
from psycopg.rows import dict_row
from psycopg_pool import AsyncConnectionPool

from ... import metrics
from ...postgres.batches import ShrinkingBatch
from ...tasks import reraise_if_cancelled
from .. import queries
from ..api.registry import Registry
from ..groups import outcomes
from ..groups import queries as gq
from ..groups.cancel import acancel_group_through
from ..workflows import queries as wq
from .executor import retry_delay

log = logging.getLogger("livepush.jobs")

RESCUE_ERROR = "its runtime stopped beating (killed or stalled) while the job ran"
DEFAULT_RETENTION = 7 * 24 * 3600.0  # seconds a finished job or group is kept
PRUNE_BATCH = 1000  # rows per delete statement
PRUNE_FLOOR = 50  # the smallest batch a statement_timeout shrinks it to (postgres/batches.py)
PRUNE_MAX_BATCHES = 20  # per maintenance run: a backlog is worked off over several runs
UNRUNG_LIMIT = 10_000  # groups re-rung after runtimes were found dead (one flush of the publisher)
SWEEP_IDS_SHOWN = 5  # group ids a sweep's INFO line names; every id goes to DEBUG
# Seconds after its mark that a task group's cancel still not through its members is taken for
# cut off (its caller gone) and completed by the housekeeping: a cancel of the largest group runs
# its chunks in a few seconds, and one still under way is its caller's to finish.
CANCEL_GRACE = 30.0
# What /metrics counts of a rescued job, by the state RESCUE_ORPHANS left it in.
_RESCUE_COUNTERS = {"failed": metrics.JOBS_FAILED, "available": metrics.JOBS_RETRIED,
                    "scheduled": metrics.JOBS_RETRIED}


@functools.cache
def local_node() -> str | None:
    """This machine's boot and this process's pid namespace (Linux), or None: where a pid means
    this process and no other. Two runtimes with the same node see each other's processes."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            boot = f.read().strip()
        namespace = os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        return None
    return f"{boot}:{namespace}"


def _process_exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # someone else's process: it exists, unless it is a zombie (below)
    # A killed process its parent has not reaped yet still answers signal 0: it is dead all the same.
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True


async def register(pool: AsyncConnectionPool, info: Mapping[str, Any]) -> int:
    async with pool.connection() as conn:
        row = await (await conn.execute(queries.REGISTER_RUNTIME, {**info, "node": local_node()})).fetchone()
    assert row is not None
    return int(row[0])


async def prune_gone_on_node(pool: AsyncConnectionPool, runtime_id: int) -> list[int]:
    """At start: delete the rows of runtimes on this node whose process no longer exists (killed,
    crashed), so that their jobs are released now (rescue()) rather than after three missed beats.
    A pid that exists again (reused) counts as alive: the heartbeat finds that runtime later."""
    node = local_node()
    if node is None:
        return []
    gone: list[int] = []
    async with pool.connection() as conn:
        rows = await (await conn.execute(queries.RUNTIMES_ON_NODE, {"node": node, "id": runtime_id})).fetchall()
        for other_id, pid in rows:
            if not _process_exists(pid):
                cur = await conn.execute(queries.PRUNE_RUNTIME, {"id": other_id, "node": node, "pid": pid})
                if cur.rowcount:
                    gone.append(other_id)
    if gone:
        log.warning("runtimes %s on this machine are gone (their processes no longer exist): releasing their jobs",
                    gone)
    return gone


async def beat(pool: AsyncConnectionPool, info: Mapping[str, Any]) -> tuple[datetime, bool]:
    """Beat; returns its time on the database's clock, and False when this runtime had been
    pruned as dead (it is back now)."""
    async with pool.connection() as conn:
        cur = await conn.execute(queries.BEAT, {"id": info["id"], "state": info["state"], "in_hand": info["in_hand"]})
        row = await cur.fetchone()
        if row is not None:
            return row[0], True
        cur = await conn.execute(queries.REREGISTER_RUNTIME, {**info, "node": local_node()})
        row = await cur.fetchone()
    assert row is not None
    log.warning("runtime %s was presumed dead (no heartbeat for three beats) and its jobs were released; "
                "it registered again, and outcomes of jobs it still holds will be ignored", info["id"])
    return row[0], False


async def set_queues(pool: AsyncConnectionPool, runtime_id: int, queues: list[str]) -> None:
    """The queues this runtime's row says it serves, changed (a drain of every queue)."""
    async with pool.connection() as conn:
        await conn.execute(queries.SET_RUNTIME_QUEUES, {"id": runtime_id, "queues": queues})


async def deregister(pool: AsyncConnectionPool, runtime_id: int) -> tuple[int, set[int]]:
    """Give back anything still running under this runtime (attempt not spent), then remove its
    row. Returns the number of jobs given back and the groups counted in."""
    async with pool.connection() as conn:
        given_back, touched = await _release_all(conn, runtime_id, [])
        await conn.execute(queries.DEREGISTER_RUNTIME, {"id": runtime_id})
    return given_back, touched


async def release_unknown(pool: AsyncConnectionPool, runtime_id: int, keep: list[int]) -> tuple[int, set[int]]:
    """Give back what runs under this runtime in the database but for the jobs in `keep` (attempt
    not spent): the runtime's producer calls it between claims, after one failed (queries.py:
    RELEASE_ALL_OF_RUNTIME says why that is safe). The number given back and the groups counted in."""
    async with pool.connection() as conn:
        return await _release_all(conn, runtime_id, keep)


async def _release_all(conn: psycopg.AsyncConnection, runtime_id: int, keep: list[int]) -> tuple[int, set[int]]:
    async with conn.cursor(row_factory=dict_row) as cur:
        await cur.execute(queries.RELEASE_ALL_OF_RUNTIME, {"runtime_id": runtime_id, "keep": keep})
        rows = await cur.fetchall()
    return len(rows), await outcomes.count(conn, outcomes.terminal(rows))


async def rescue(pool: AsyncConnectionPool, runtime_id: int, since: datetime | None = None, *,
                 beat_at: datetime | None = None,
                 registry: Registry | None = None) -> tuple[list[dict[str, Any]], set[int]]:
    """Prune runtimes silent for three beats, then release running jobs without a live runtime,
    attempt counted. `runtime_id`: the rescuing runtime, which prunes nobody while its own last
    beat is more than two beats old, or newer than `beat_at`, the beat that started this rescue
    (queries.PRUNE_DEAD_RUNTIMES says why), and never releases its own jobs (RESCUE_ORPHANS).
    `since`: when the caller's own contact with the database came back after it lost it, as that
    beat knew it (None: never lost); silence before it is not counted. A job released for the
    second time in a row is due again only after its retry's backoff (its function's backoff=
    when `registry` defines it, else the default one). Returns the released rows and the groups
    counted in."""
    async with pool.connection() as conn:
        cur = await conn.execute(queries.PRUNE_DEAD_RUNTIMES,
                                 {"since": since, "beat_at": beat_at, "runtime_id": runtime_id})
        dead = [r[0] for r in await cur.fetchall()]
    unrung: set[int] = set()
    if dead:
        log.warning("runtimes %s stopped beating: releasing their jobs", dead)
        unrung = await unrung_groups(pool)
    async with pool.connection() as conn:
        found = await (await conn.execute(queries.ORPHANS, {"runtime_id": runtime_id,
                                                            "error": RESCUE_ERROR})).fetchall()
    if not found:
        return [], unrung
    ids, attempts = [job_id for job_id, _, _, _ in found], [attempt for _, _, attempt, _ in found]
    # A runtime that died once (a deploy's kill -9, a machine lost) had its jobs die with it: they
    # are due again at once. A job whose last attempt also ended in a rescue may be what kills its
    # runtimes (out of memory): it waits its backoff, as after a failure, rather than take the next
    # runtime down at once, each time, with every job in hand there.
    delays = [retry_delay(registry.find(name) if registry is not None else None, job_id, attempt)
              if rescued_before else 0.0 for job_id, name, attempt, rescued_before in found]
    async with pool.connection() as conn:
        async with conn.cursor(row_factory=dict_row) as rescuing:
            await rescuing.execute(queries.RESCUE_ORPHANS, {"error": RESCUE_ERROR, "runtime_id": runtime_id, "ids": ids,
                                                             "attempts": attempts, "delays": delays})
            rows = await rescuing.fetchall()
            if not rows:
                return [], unrung
            touched = await outcomes.count(conn, outcomes.terminal(rows))
    log.warning("released %d jobs of dead runtimes: %s", len(rows), [r["id"] for r in rows][:20])
    metrics.JOBS_RESCUED.inc(len(rows))
    # The attempt a rescue counts ends as the completer's would: failed for good on the last one
    # (a job that kills its runtime every time), else retried; the failures alert reads these.
    for (state, queue), n in collections.Counter((r["state"], r["queue"]) for r in rows).items():
        counter = _RESCUE_COUNTERS.get(state)
        if counter is not None:
            counter.labels(queue).inc(n)
    return rows, touched | unrung


async def unrung_groups(pool: AsyncConnectionPool, limit: int = UNRUNG_LIMIT) -> set[int]:
    """After runtimes were found dead: the unfinished groups with counts their topic has not shown.
    A dead runtime's progress publisher may have held them (they live in its memory from its
    outcomes' commit to its flush); the caller's publisher rings them instead. Best effort: a
    failure is logged and rings nothing (their rows stay right for a new subscriber), rather than
    hold up the rescue or the start it is part of."""
    try:
        async with pool.connection() as conn:
            return {r[0] for r in await (await conn.execute(gq.UNRUNG_GROUPS, {"limit": limit})).fetchall()}
    except psycopg.Error as exc:
        reraise_if_cancelled()
        log.warning("could not look for group progress that dead runtimes left unrung: %s", exc)
        return set()


async def promote(pool: AsyncConnectionPool, limit: int = 5000) -> int:
    """Make due scheduled jobs available (rings the doorbell). Returns how many."""
    async with pool.connection() as conn:
        row = await (await conn.execute(queries.PROMOTE_SCHEDULED, {"limit": limit})).fetchone()
    return int(row[0]) if row else 0


async def seconds_to_next_scheduled(pool: AsyncConnectionPool) -> float | None:
    async with pool.connection() as conn:
        row = await (await conn.execute(queries.NEXT_SCHEDULED)).fetchone()
    return None if row is None or row[0] is None else float(row[0])


async def cancel_requests(pool: AsyncConnectionPool, runtime_id: int, ids: list[int] | None = None) -> list[int]:
    """This runtime's running jobs whose cancel was requested (among `ids`, when given): what the
    row says, whatever a notification claimed."""
    async with pool.connection() as conn:
        rows = await (await conn.execute(queries.CANCEL_REQUESTS_FOR, {"runtime_id": runtime_id, "ids": ids})).fetchall()
    return [r[0] for r in rows]


async def cancel_orphaned_children(pool: AsyncConnectionPool, limit: int = 100) -> list[int]:
    """Cancel the groups of children whose parent job finished before them (docs/durable.md):
    nobody will read them, and their members would otherwise run to their end. Returns them."""
    ids = await _cancel_groups(pool, gq.ORPHANED_CHILD_GROUPS, {"limit": limit})
    if ids:
        # A count and the first few at INFO: a big sweep's every id made one enormous line.
        shown = ", ".join(map(str, ids[:SWEEP_IDS_SHOWN]))
        more = f" and {len(ids) - SWEEP_IDS_SHOWN} more" if len(ids) > SWEEP_IDS_SHOWN else ""
        log.info("cancelled %d group%s of children whose parent job had finished: %s%s", len(ids),
                 "" if len(ids) == 1 else "s", shown, more)
        if more:
            log.debug("cancelled the groups of children whose parent job had finished: %s", ", ".join(map(str, ids)))
    return ids


async def complete_cut_off_cancels(pool: AsyncConnectionPool, grace: float = CANCEL_GRACE,
                                   limit: int = 100) -> list[int]:
    """Complete the cancels of groups marked cancelled more than `grace` seconds ago whose members
    were not all reached (docs/groups.md): the caller of cancel_group died or lost its connection
    part-way, and those members would otherwise run as if no cancel had come. Returns them."""
    ids = await _cancel_groups(pool, gq.CUT_OFF_CANCELS, {"grace": grace, "limit": limit})
    if ids:
        log.warning("completed the cancels of task groups that their callers left part-way: %s", ids)
    return ids


async def _cancel_groups(pool: AsyncConnectionPool, sql: str, params: dict[str, Any]) -> list[int]:
    """cancel_group() each group `sql` reads (it re-checks each under its lock)."""
    async with pool.connection() as conn:
        ids = [r[0] for r in await (await conn.execute(sql, params)).fetchall()]
    for gid in ids:
        # Through our pool: these ids are our database's, which may not be the process's default.
        await acancel_group_through(pool, gid)  # False for a cancel that failed part-way, which this completes
    return ids


def prune_batches() -> ShrinkingBatch:
    """What a runtime keeps for prune()'s batches: the size its statement_timeout lets through."""
    return ShrinkingBatch("finished jobs, groups or workflow runs", floor=PRUNE_FLOOR, log=log)


async def prune(pool: AsyncConnectionPool, retention: float, *, batch: int = PRUNE_BATCH,
                max_batches: int = PRUNE_MAX_BATCHES, shrinking: ShrinkingBatch | None = None) -> int:
    """Retention: delete lone jobs finished more than `retention` seconds ago, finished groups as
    old with their members and callbacks, and finished workflow runs, in bounded batches (one
    short transaction each; at most `max_batches` of each kind a call). A
    member is kept while its group is unfinished. Returns the rows deleted. A batch that the
    statement_timeout cancels is halved and run again, and stays so in `shrinking`, the caller's
    from one call to the next (prune_batches())."""
    shrinking = shrinking or prune_batches()

    async def delete(sql: str, limit: int) -> int:
        async with pool.connection() as conn:
            return (await conn.execute(sql, {"retention": retention, "limit": limit})).rowcount

    deleted = 0
    # As many batches of each (groups' and runs' rows once their jobs are gone): one batch a prune
    # (at most once a minute) falls behind for good once they finish faster than that.
    for sql in (gq.PRUNE_JOBS, gq.PRUNE_GROUP_JOBS, gq.PRUNE_GROUPS, wq.PRUNE_RUNS):
        for _ in range(max_batches):
            n, size = await shrinking.run(batch, functools.partial(delete, sql))
            deleted += n
            if n < size:
                break
    if deleted:
        log.info("retention: deleted %d finished jobs and groups older than %g s", deleted, retention)
    return deleted
