"""Django tasks the Django integration tests enqueue (module-level, as the Tasks framework needs)."""

from __future__ import annotations

import asyncio
import sys
import time

from livepush import jobs
from livepush.contrib.django import current_job, progress

try:
    from django.tasks import task
except ImportError:  # Django 5.2 on Python 3.11: the backport
    from django_tasks import task

# What ran, in order, in this process (jobs.drain() runs tasks here).
RAN: list[str] = []


class Declined(Exception):
    """A task's own exception, to find by its class path in the result's error."""


class OutOfStock(Exception):
    """An exception whose message is its own __str__, not its args."""

    def __init__(self, sku: str, left: int) -> None:
        super().__init__(sku, left)
        self.sku, self.left = sku, left

    def __str__(self) -> str:
        return f"{self.sku} is out of stock ({self.left} left)"


@task
def add(a: int, b: int = 0) -> int:
    RAN.append(f"add:{a}+{b}")
    return a + b


@task(queue_name="second")
def on_second(tag: str) -> str:
    RAN.append(f"second:{tag}")
    return tag


@task
def decline(reason: str) -> None:
    raise Declined(reason)


@task
def reserve(sku: str) -> None:
    raise OutOfStock(sku, 0)


@task
def look_up(key: str) -> None:
    {}[key]


@task
def returns_nan() -> float:
    """Returns what Django's normalization lets through and no job result can hold."""
    return float("nan")


@task
def exits(code: int) -> None:
    """Ends as code that calls sys.exit() does (a script's main(), a library giving up)."""
    sys.exit(code)


@task(takes_context=True)
def with_context(context, label: str) -> dict:
    return {"label": label, "id": context.task_result.id, "attempt": context.attempt}


@task
def in_steps(steps: int) -> dict:
    for done in range(1, steps + 1):
        progress(done, steps, f"step {done}")
    ctx = current_job()
    return {"job_id": ctx.job_id, "group": ctx.group.id if ctx.group else None}


@task
async def async_double(x: int) -> int:
    await asyncio.sleep(0)
    progress(1, 1, "async")
    return 2 * x


@task
def record(tag: str) -> None:
    RAN.append(tag)


@task
def cancel_itself() -> None:
    """Cancels its own job, then reports progress until the cancel reaches it (JobCancelled)."""
    jobs.cancel(current_job().job_id)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        progress(0, 1)
        time.sleep(0.01)
    RAN.append("the cancel never reached the task")
