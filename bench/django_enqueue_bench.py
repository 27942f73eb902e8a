"""Django backend benchmark (not a test): what enqueueing through Django's Tasks framework
(livepush.contrib.django.LivePushBackend) costs over livepush's own enqueue() of the same job.

    bin/bench --only django                  # the harness' `django` suite: 9 rounds (1 with --quick)

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
import sys
import time
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import report  # noqa: E402
from _services import livepush_db  # noqa: E402
from jobs_bench import lp_truncate  # noqa: E402

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
    if settings.configured:
        # A repeated run (bin/bench --repeat) recreates the same database under the same name:
        # Django, set up once per process, already points at it.
        if settings.DATABASES["default"]["NAME"] != parts.path.lstrip("/"):
            raise RuntimeError(f"Django is already set up on another database than {parts.path}")
        return _task()
    settings.configure(
        USE_TZ=True, INSTALLED_APPS=[],
        DATABASES={"default": {"ENGINE": "django.db.backends.postgresql", "NAME": parts.path.lstrip("/"),
                               "USER": parts.username or "", "HOST": parts.hostname or "",
                               "PORT": str(parts.port or "")}},
        TASKS={"default": {"BACKEND": "livepush.contrib.django.LivePushBackend"}})
    django.setup()
    return _task()


def _task() -> Any:
    from django_enqueue_bench import (
        work as importable,  # the runtime imports tasks by path, never from __main__
    )

    from livepush.contrib.django.tasks_api import Task

    return Task(func=importable)


def figures(ctx: report.Context) -> list[report.Figure]:
    """The Django enqueue's rate against the direct one, alone and inside atomic()."""
    rounds = report.Rounds()
    with livepush_db(ctx.pg_admin_url, "bench_django") as url:
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
        report.note(f"Tasks framework: {MODULE} (Django {django_version()})")
        n = 200 if ctx.quick else N
        for r in range(1 if ctx.quick else 9):
            lp_truncate(url)
            spent = dict.fromkeys(variants, 0.0)
            for _ in range(n // BLOCK):
                for name, fn in variants.items():
                    t = time.perf_counter()
                    fn(BLOCK)
                    spent[name] += time.perf_counter() - t
            for name in variants:
                rounds.add(name, {"rate": n / spent[name]})
            report.note(f"  round {r + 1}: " + ", ".join(
                f"{name} {rounds.samples[name, 'rate'][-1]:,.0f}/s" for name in variants))
        connection.close()
    return [report.Figure(label, rounds.median(mine, "rate") or 0.0, "jobs/s", base, rounds.median(base, "rate"),
                          goal=1 / 1.2)
            for label, mine, base in [("enqueue through the Django backend", "django", "direct"),
                                      ("enqueue through the Django backend in atomic()", "django, in atomic()",
                                       "direct, in atomic()")]]


def django_version() -> str:
    import django

    return django.get_version()
