"""Django backend benchmark (not a test): what enqueueing through Django's Tasks framework
(livepush.contrib.django.LivePushBackend) costs over livepush's own enqueue() of the same job.

    .venv/bin/python bench/django_enqueue_bench.py              # throwaway durable PostgreSQL, 9 rounds
    .venv/bin/python bench/django_enqueue_bench.py --pg-url postgresql://postgres@127.0.0.1:5432/postgres

Measured in one run, 1,000 sync enqueues per variant and round, each its own transaction, in
blocks of 50 that alternate between the variants, so that this machine's drift (several times
over, from one second to the next, with fsync on) hits every variant alike; medians of the rounds:
- direct: `run_task.enqueue(path, args, kwargs)`, the livepush job a Django task becomes;
- django: `some_task.enqueue(n)` through the backend (validate the task, build the TaskResult,
  the same insert, send task_enqueued);
and the same two inside `django.db.transaction.atomic()`, where both write through Django's own
connection (`run_task.enqueue(..., conn=connection.connection)` for the direct one). That
connection prepares no statement (Django's default, for poolers), unlike livepush's pool, which
costs both variants alike.
The goal (docs/frameworks.md, Django) is the Django enqueue at most 1.2x the direct one.
"""

from __future__ import annotations

import os
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _services import Services, ratio_bench_args, ratio_bench_postgres  # noqa: E402
from jobs_bench import lp_setup, lp_truncate  # noqa: E402

from livepush.jobs import database  # noqa: E402

N = 1000
BLOCK = 50


def work(n: int) -> int:
    """The task's function (never run here: only enqueued)."""
    return n


def configure_django(url: str) -> Any:
    """Django set up on the benchmark's database with LivePushBackend; returns `work` as a task."""
    import django
    from django.conf import settings

    parts = urlsplit(url)
    settings.configure(
        USE_TZ=True, INSTALLED_APPS=[],
        DATABASES={"default": {"ENGINE": "django.db.backends.postgresql", "NAME": parts.path.lstrip("/"),
                               "USER": parts.username or "", "HOST": parts.hostname or "",
                               "PORT": str(parts.port or "")}},
        TASKS={"default": {"BACKEND": "livepush.contrib.django.LivePushBackend"}})
    django.setup()
    from django_enqueue_bench import (
        work as importable,  # the runtime imports tasks by path, never from __main__
    )

    from livepush.contrib.django.tasks_api import Task

    return Task(func=importable)


def main() -> None:
    args = ratio_bench_args(__doc__, rounds=9)
    services = Services()
    try:
        admin = ratio_bench_postgres(services, args)
        url = lp_setup(admin)
        bench_task = configure_django(url)
        from django.db import connection, transaction

        from livepush.contrib.django.execution import run_task
        from livepush.contrib.django.tasks_api import MODULE

        path = bench_task.module_path

        def direct(count: int) -> None:
            for n in range(count):
                run_task.enqueue(path, [n], {})

        def django_enqueue(count: int) -> None:
            for n in range(count):
                bench_task.enqueue(n)

        def direct_tx(count: int) -> None:
            for n in range(count):
                with transaction.atomic():
                    run_task.enqueue(path, [n], {}, conn=connection.connection)

        def django_tx(count: int) -> None:
            for n in range(count):
                with transaction.atomic():
                    bench_task.enqueue(n)

        variants: dict[str, Callable[[int], None]] = {"direct": direct, "django": django_enqueue,
                                                   "direct, in atomic()": direct_tx,
                                                   "django, in atomic()": django_tx}
        with database.pools().sync().connection():
            pass  # the pools are open before any clock starts
        connection.ensure_connection()
        print(f"Tasks framework: {MODULE} (Django {django_version()})", flush=True)
        rates: dict[str, list[float]] = {name: [] for name in variants}
        for r in range(args.rounds):
            lp_truncate(url)
            spent = dict.fromkeys(variants, 0.0)
            for _ in range(N // BLOCK):
                for name, fn in variants.items():
                    t = time.perf_counter()
                    fn(BLOCK)
                    spent[name] += time.perf_counter() - t
            for name in variants:
                rates[name].append(N / spent[name])
            print(f"  round {r + 1}: " + ", ".join(f"{n} {v[-1]:,.0f}/s" for n, v in rates.items()), flush=True)
        med = {name: statistics.median(v) for name, v in rates.items()}
        for name, rate in med.items():
            print(f"{name:26} {rate:10,.0f} jobs/s  {1e6 / rate:8.1f} µs/job")
        print(f"cost ratio django / direct: {med['direct'] / med['django']:.2f}x (goal <= 1.2x)")
        print(f"cost ratio in atomic(), django / direct: {med['direct, in atomic()'] / med['django, in atomic()']:.2f}x")
    finally:
        services.stop()


def django_version() -> str:
    import django

    return django.get_version()


if __name__ == "__main__":
    main()
