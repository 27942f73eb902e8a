"""Enqueue options benchmark (not a test): what an idempotency key costs an enqueue.

    .venv/bin/python bench/enqueue_keys_bench.py              # throwaway durable PostgreSQL, 5 rounds
    .venv/bin/python bench/enqueue_keys_bench.py --pg-url postgresql://postgres@127.0.0.1:5432/postgres

Measured in one run, rounds interleaved so drift hits every variant alike (medians shown):
- one at a time: 1,000 sync enqueues, each its own transaction, without a key, with a fresh key
  each (the insert path: lock, look up, insert), and with a key an unfinished job holds (the
  hit: lock, look up, nothing written);
- bulk: 10 enqueue_many calls of 1,000 (job, args, options) items, without keys and with a
  fresh key per job.
The goal (docs/jobs.md "Enqueue options") is a keyed enqueue at most 1.3x a plain one.
"""

from __future__ import annotations

import os
import statistics
import sys
import time
from collections.abc import Callable

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _services import Services, ratio_bench_args, ratio_bench_postgres  # noqa: E402
from jobs_bench import lp_setup, lp_truncate, noop_job  # noqa: E402

from livepush.jobs import database, enqueue_many  # noqa: E402

ONE = 1000
BULK_CALLS, BULK_SIZE = 10, 1000
_seq = [0]


def fresh() -> str:
    _seq[0] += 1
    return f"bench:{_seq[0]}"


def one_plain(url: str) -> float:
    t = time.perf_counter()
    for _ in range(ONE):
        noop_job.enqueue()
    return ONE / (time.perf_counter() - t)


def one_keyed(url: str) -> float:
    keys = [fresh() for _ in range(ONE)]
    t = time.perf_counter()
    for k in keys:
        noop_job.enqueue(key=k)
    return ONE / (time.perf_counter() - t)


def one_held(url: str) -> float:
    noop_job.enqueue(key="bench:held")
    t = time.perf_counter()
    for _ in range(ONE):
        noop_job.enqueue(key="bench:held")
    return ONE / (time.perf_counter() - t)


def bulk_plain(url: str) -> float:
    t = time.perf_counter()
    for _ in range(BULK_CALLS):
        enqueue_many([(noop_job, [], {}) for _ in range(BULK_SIZE)])
    return BULK_CALLS * BULK_SIZE / (time.perf_counter() - t)


def bulk_keyed(url: str) -> float:
    t = time.perf_counter()
    for _ in range(BULK_CALLS):
        enqueue_many([(noop_job, [], {"key": fresh()}) for _ in range(BULK_SIZE)])
    return BULK_CALLS * BULK_SIZE / (time.perf_counter() - t)


VARIANTS: dict[str, Callable[[str], float]] = {
    "one, no key": one_plain, "one, fresh key": one_keyed, "one, key held": one_held,
    "bulk, no key": bulk_plain, "bulk, fresh keys": bulk_keyed,
}
RATIOS = [("one, fresh key", "one, no key"), ("one, key held", "one, no key"), ("bulk, fresh keys", "bulk, no key")]


def main() -> None:
    args = ratio_bench_args(__doc__, rounds=5)
    services = Services()
    try:
        admin = ratio_bench_postgres(services, args)
        url = lp_setup(admin)
        with database.pools().sync().connection():
            pass  # the pool is open before any clock starts
        rates: dict[str, list[float]] = {name: [] for name in VARIANTS}
        for r in range(args.rounds):
            for name, fn in VARIANTS.items():
                lp_truncate(url)
                rates[name].append(fn(url))
            print(f"  round {r + 1}: " + ", ".join(f"{n} {v[-1]:,.0f}/s" for n, v in rates.items()), flush=True)
        med = {name: statistics.median(v) for name, v in rates.items()}
        for name, rate in med.items():
            print(f"{name:18} {rate:10,.0f} jobs/s  {1e6 / rate:8.1f} µs/job")
        for keyed, plain in RATIOS:
            print(f"cost ratio {keyed} / {plain}: {med[plain] / med[keyed]:.2f}x")
    finally:
        services.stop()


if __name__ == "__main__":
    main()
