"""The runtime's side of claim limits: storing its functions' limits, knowing which names take
the limited claim, and running that claim (queries.CLAIM_LIMITED)."""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

import psycopg
from psycopg.rows import dict_row
from psycopg_pool import AsyncConnectionPool

from .. import queries
from ..api.limits import Limits
from ..api.registry import Registry
from .backlog import Backlog

log = logging.getLogger("livepush.jobs")

# Candidates read per limited claim, beyond the slots asked for: keys that have fewer free slots
# than waiting jobs leave some of them unused.
SCAN_FACTOR = 4
SCAN_EXTRA = 16
# The shortest wait for the next token: at high rates a runtime claims a batch every 10 ms rather
# than a job at a time (the bucket's burst, a tenth of a second's tokens, keeps what accrues).
MIN_TOKEN_WAIT = 0.01


def definitions(registry: Registry) -> dict[str, Limits | None]:
    """Each registered function's limits as its definition states them (None: it has none)."""
    found = {}
    for name in registry.names():
        limits = getattr(registry.find(name), "_limits", None)
        found[name] = limits if limits is not None and limits.any else None
    return found


async def store(pool: AsyncConnectionPool, registry: Registry, names: Iterable[str] | None = None) -> None:
    """Write the limits of the registry's functions (and drop rows of those now without any): of
    all of them as a runtime starts, of `names` for functions defined while it runs."""
    wanted = None if names is None else set(names)
    limited: list[tuple[str, Limits]] = []
    plain: list[tuple[str, None]] = []
    for name, limits in definitions(registry).items():
        if wanted is None or name in wanted:
            if limits is None:
                plain.append((name, limits))
            else:
                limited.append((name, limits))
    backlog, left = None, []
    async with pool.connection() as conn:
        await conn.execute(queries.LOCK_LIMITS)
        if limited:
            had: dict[str, str | None] = dict(await (await conn.execute(
                queries.LIMITED_BEFORE, {"names": [n for n, _ in limited]})).fetchall())
            # Keyed anew: a concurrency key read from another parameter than the stored one, or
            # where there was none (a rate alone marks jobs limited with no key, which no slot
            # counts). The jobs marked before hold a key of the old parameter, or none. So do the
            # marked jobs of a name whose limits a deploy removed (those running then, or back
            # for a retry since, kept the mark and the key of the definition before it), which
            # gains a concurrency key again now.
            keyed = {n for n, lim in limited if lim.key_param is not None and lim.key_param != had.get(n)}
            backlog = Backlog({n: lim for n, lim in limited if n not in had or n in keyed}, keyed)
            left = await backlog.mark(conn)
            await conn.execute(queries.SET_LIMITS, {
                "names": [n for n, _ in limited], "max_running": [lim.max_running for _, lim in limited],
                "rates": [lim.rate for _, lim in limited], "bursts": [lim.burst for _, lim in limited],
                "key_params": [lim.key_param for _, lim in limited]})
        if plain:
            dropped = [r[0] for r in await (await conn.execute(
                queries.DROP_LIMITS, {"names": [n for n, _ in plain]})).fetchall()]
            if dropped:
                log.info("limits removed from %s: their waiting jobs take the plain claim again", ", ".join(dropped))
                await conn.execute(queries.UNFLAG_LIMITED, {"names": dropped})
    # Once committed: the jobs whose rows others held are marked in transactions of their own.
    if backlog is not None:
        await backlog.finish(pool, left)


async def names(pool: AsyncConnectionPool, registry: Registry) -> tuple[list[str], frozenset[str]]:
    """The names this runtime claims with the limited claim: its functions that have a stored
    row (whichever runtime stored it last) or limits in their own definition; and those of them
    whose row has no limits left (a newer definition dropped them): only jobs an older
    definition marked take their limited claim."""
    async with pool.connection() as conn:
        stored = {r[0]: r[1] for r in await (await conn.execute(queries.LIMITED_NAMES)).fetchall()}
    own = {n for n in registry.names() if getattr(registry.find(n), "_limits", None) and registry.find(n)._limits.any}
    mine = sorted(n for n in stored.keys() | own if n in registry)
    return mine, frozenset(n for n in mine if stored.get(n))


def in_turn(names: list[str], registry: Registry, turn: int) -> list[str]:
    """The order in which claim round number `turn` asks these limited names for jobs: by their
    functions' priority, lower first, as the plain claim orders jobs; and the names of one priority
    each round from the next one on. In one fixed order, the first name's backlog (within its
    limits) took every free slot of every round, and the names after it started nothing until
    it was empty, or never, while its jobs kept coming."""
    by_priority: dict[int, list[str]] = {}
    for name in names:
        by_priority.setdefault(getattr(registry.find(name), "priority", 0), []).append(name)
    order: list[str] = []
    for priority in sorted(by_priority):
        same = by_priority[priority]
        first = turn % len(same)
        order += same[first:] + same[:first]
    return order


async def claim(conn: psycopg.AsyncConnection, name: str, queue: str, limit: int,
                runtime_id: int | None) -> tuple[list[dict[str, Any]], float | None]:
    """Claim up to `limit` jobs of `name` on `queue` within its limits, on the producer's
    autocommit connection: the claimed rows, and the seconds until the bucket's next token when
    it held jobs back (else None)."""
    params = {"name": name, "queue": queue, "limit": limit, "scan": limit * SCAN_FACTOR + SCAN_EXTRA,
              "runtime_id": runtime_id}
    async with conn.cursor(row_factory=dict_row) as cur:
        await cur.execute(queries.CLAIM_LIMITED, params)
        rows = await cur.fetchall()
    wait = rows[0]["wait_token"] if rows else None
    jobs = [r for r in rows if r["id"] is not None]
    for r in jobs:
        del r["wait_token"]
    return jobs, None if wait is None else max(float(wait), MIN_TOKEN_WAIT)
