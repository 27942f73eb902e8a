"""The runtime's side of claim limits: storing its functions' limits, knowing which names take
the limited claim, and running that claim (queries.LOCK_LIMITS + CLAIM_LIMITED)."""

from __future__ import annotations

import logging
from typing import Any

import psycopg
from psycopg.rows import dict_row
from psycopg_pool import AsyncConnectionPool

from .. import queries
from ..api.registry import Registry

log = logging.getLogger("livepush.jobs")

# Candidates read per limited claim, beyond the slots asked for: keys that have fewer free slots
# than waiting jobs leave some of them unused.
SCAN_FACTOR = 4
SCAN_EXTRA = 16
# The shortest wait for the next token: at high rates a runtime claims a batch every 10 ms rather
# than a job at a time (the bucket's burst, a tenth of a second's tokens, keeps what accrues).
MIN_TOKEN_WAIT = 0.01


async def store(pool: AsyncConnectionPool, registry: Registry) -> None:
    """Write the limits of the registry's functions (and drop rows of those now without any)."""
    limited, plain = [], []
    for name in registry.names():
        fn = registry.find(name)
        limits = getattr(fn, "limits", None)
        (limited if limits is not None and limits.any else plain).append((name, limits))
    async with pool.connection() as conn:
        if limited:
            await conn.execute(queries.SET_LIMITS, {
                "names": [n for n, _ in limited], "max_running": [lim.max_running for _, lim in limited],
                "rates": [lim.rate for _, lim in limited], "bursts": [lim.burst for _, lim in limited]})
        if plain:
            await conn.execute(queries.DROP_LIMITS, {"names": [n for n, _ in plain]})


async def names(pool: AsyncConnectionPool) -> set[str]:
    """Every name that has limits, whichever runtime stored them."""
    async with pool.connection() as conn:
        return {r[0] for r in await (await conn.execute(queries.LIMITED_NAMES)).fetchall()}


async def claim(conn: psycopg.AsyncConnection, name: str, queue: str, limit: int,
                runtime_id: int | None) -> tuple[list[dict[str, Any]], float | None]:
    """Claim up to `limit` jobs of `name` on `queue` within its limits, on the producer's
    autocommit connection: the claimed rows, and the seconds until the bucket's next token when
    it held jobs back (else None)."""
    params = {"name": name, "queue": queue, "limit": limit, "scan": limit * SCAN_FACTOR + SCAN_EXTRA,
              "runtime_id": runtime_id}
    # Pipelined: BEGIN, the lock, the claim and COMMIT go out together, one round trip (the
    # server still runs them in order, so the claim's snapshot comes after the lock).
    async with conn.cursor(row_factory=dict_row) as cur:
        async with conn.pipeline(), conn.transaction():
            await conn.execute(queries.LOCK_LIMITS, params)
            await cur.execute(queries.CLAIM_LIMITED, params)
        rows = await cur.fetchall()
    wait = rows[0]["wait_token"] if rows else None
    jobs = [r for r in rows if r["id"] is not None]
    for r in jobs:
        del r["wait_token"]
    return jobs, None if wait is None else max(float(wait), MIN_TOKEN_WAIT)
