"""Enqueue options suite: what an idempotency key costs an enqueue (docs/jobs.md#enqueue-options).

Measured in one run, rounds interleaved so drift hits every variant alike (medians reported):
- one at a time: 1,000 sync enqueues (300 with --quick), each its own transaction, without a key, with a fresh key
  each (the insert path: lock, look up, insert), and with a key an unfinished job holds (the
  hit: lock, look up, nothing written);
- bulk: enqueue_many calls of 1,000 (job, args, options) items, without keys and with a fresh
  key per job, 20 of each a round (3 with --quick), the two alternating call by call (which one
  goes first alternates too), after one untimed call of each. Every 10 to 30 calls one takes
  twice as long (Python's collector, Postgres writing WAL out), and the first call into an
  emptied table three times as long; with each variant's calls in a block of their own, those
  fell on one variant or the other, and one round's ratio ranged 0.63-0.92. A variant's rate in
  a round is its jobs over the time of its own calls.
The goal is a keyed enqueue costing at most 1.3x a plain one: a rate at least 1/1.3 of it.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import report  # noqa: E402
from _services import livepush_db  # noqa: E402
from jobs_bench import lp_truncate, noop_job  # noqa: E402

from livepush.jobs import database, enqueue_many  # noqa: E402

BULK_SIZE = 1000
_seq = [0]


def fresh() -> str:
    _seq[0] += 1
    return f"bench:{_seq[0]}"


def one_plain(n: int) -> float:
    t = time.perf_counter()
    for _ in range(n):
        noop_job.enqueue()
    return n / (time.perf_counter() - t)


def one_keyed(n: int) -> float:
    keys = [fresh() for _ in range(n)]
    t = time.perf_counter()
    for k in keys:
        noop_job.enqueue(key=k)
    return n / (time.perf_counter() - t)


def one_held(n: int) -> float:
    noop_job.enqueue(key="bench:held")
    t = time.perf_counter()
    for _ in range(n):
        noop_job.enqueue(key="bench:held")
    return n / (time.perf_counter() - t)


def bulk_items(keyed: bool) -> list[tuple[Any, ...]]:
    return [(noop_job, [], {"key": fresh()} if keyed else {}) for _ in range(BULK_SIZE)]


def bulk_pair(calls: int) -> dict[str, float]:
    """Rates of enqueue_many without keys and with fresh keys, their calls alternating."""
    spent = {False: 0.0, True: 0.0}
    for keyed in (False, True):
        enqueue_many(bulk_items(keyed))  # the first call into an emptied table, untimed
    for call in range(calls):
        for keyed in ((False, True) if call % 2 == 0 else (True, False)):
            t = time.perf_counter()
            enqueue_many(bulk_items(keyed))
            spent[keyed] += time.perf_counter() - t
    return {"bulk, no key": calls * BULK_SIZE / spent[False], "bulk, fresh keys": calls * BULK_SIZE / spent[True]}


# Each variant is given n, the enqueues one at a time.
VARIANTS: dict[str, Callable[[int], float]] = {
    "one, no key": one_plain, "one, fresh key": one_keyed, "one, key held": one_held,
}
# (figure, variant, its baseline variant, goal)
FIGURES = [
    ("enqueue one with a fresh key", "one, fresh key", "one, no key", 1 / 1.3),
    ("enqueue one whose key a job holds", "one, key held", "one, no key", None),
    ("enqueue_many of 1,000 with fresh keys", "bulk, fresh keys", "bulk, no key", 1 / 1.3),
]


def figures(ctx: report.Context) -> list[report.Figure]:
    """Each keyed variant's rate against the same enqueue without a key."""
    rounds = report.Rounds()
    with livepush_db(ctx.pg_admin_url, "bench_enqueue_keys") as url:
        with database.pools().sync().connection():
            pass  # the pool is open before any clock starts
        n = 300 if ctx.quick else 1000
        for r in range(1 if ctx.quick else 5):
            for name, fn in VARIANTS.items():
                lp_truncate(url)
                rounds.add(name, {"rate": fn(n)})
            lp_truncate(url)
            for name, rate in bulk_pair(3 if ctx.quick else 20).items():
                rounds.add(name, {"rate": rate})
            report.note(f"  round {r + 1}: " + ", ".join(
                f"{n} {rounds.samples[n, 'rate'][-1]:,.0f}/s" for n in (*VARIANTS, "bulk, no key", "bulk, fresh keys")))
    return [report.Figure(label, rounds.median(keyed, "rate") or 0.0, "jobs/s", plain,
                          rounds.median(plain, "rate"), goal=goal)
            for label, keyed, plain, goal in FIGURES]
