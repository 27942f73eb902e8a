"""The one livepush job that runs every Django task, `livepush.contrib.django.run_task`: its
arguments are the task's module path, args and kwargs; it imports the task and calls it.

It is registered wherever this module is imported (the backend imports it, so `jobs.drain()` in a
Django test runs tasks too); the runtime imports it through `livepush.contrib.django.runner`, which
sets Django up first (docs/frameworks.md, Django).
"""

from __future__ import annotations

import contextvars
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from django.db import close_old_connections
from django.utils.module_loading import import_string

from ... import jobs
from ...jobs.api.args import check_json
from ...jobs.errors import InvalidResultError, JobCancelled
from .errors import failure_of
from .tasks_api import (
    Task,
    TaskContext,
    TaskResult,
    TaskResultStatus,
    normalize_json,
    set_attr,
    task_finished,
    task_started,
)

RUN_TASK = "livepush.contrib.django.run_task"


def livepush_priority(priority: int) -> int:
    """Django's priority (-100..100, higher first) as livepush's (lower first)."""
    return -int(priority)


def django_priority(priority: int) -> int:
    """livepush's priority of a task's job as Django's."""
    return -int(priority)

# The ctx of the livepush job running the current Django task, for progress() and current_job().
_current: contextvars.ContextVar[Any] = contextvars.ContextVar("livepush_django_job", default=None)


def current_job() -> Any:
    """The livepush `ctx` (a SyncJobContext) of the job running the calling task, or None outside
    one: `ctx.job_id`, `ctx.attempt`, `ctx.group` (its task group), `ctx.cancelled`."""
    return _current.get()


def progress(done: float, total: float | None = None, message: str | None = None) -> bool:
    """Report the calling task's progress on its `job:<id>` topic (docs/jobs.md, Progress): cheap,
    coalesced to about ten writes a second. Returns False, and does nothing, outside a livepush job
    (a task called directly, or run by another backend)."""
    ctx = _current.get()
    if ctx is None:
        return False
    ctx.progress(done, total, message)
    return True


def load_task(path: str) -> Task:
    """The @task at `path`; ImportError (or TypeError) when the path names none."""
    found = import_string(path)
    if not isinstance(found, Task):
        raise TypeError(f"{path} is not a Django @task (found {type(found).__name__})")
    return found


def running_result(task: Task, ctx: Any, args: list[Any], kwargs: dict[str, Any]) -> TaskResult:
    """The TaskResult a running task sees in its TaskContext and the framework's signals."""
    return TaskResult(task=task, id=str(ctx.job_id), status=TaskResultStatus.RUNNING, enqueued_at=None,
                      started_at=None, finished_at=None, last_attempted_at=None, args=args, kwargs=kwargs,
                      backend=task.backend, errors=[], worker_ids=["livepush"] * ctx.attempt)


@contextmanager
def _in_job(ctx: Any) -> Iterator[None]:
    token = _current.set(ctx)
    # As Django does around a request: a connection broken or past CONN_MAX_AGE is not reused.
    close_old_connections()
    try:
        yield
    finally:
        close_old_connections()
        _current.reset(token)


def _finished(task: Task, result: TaskResult, status: TaskResultStatus) -> None:
    """Mark the running task's result `status` and send the framework's task_finished."""
    set_attr(result, "status", status)
    task_finished.send(type(task.get_backend()), task_result=result)


@jobs.job(name=RUN_TASK, timeout=None, max_attempts=1)
def run_task(ctx: Any, path: str, args: list[Any], kwargs: dict[str, Any]) -> Any:
    """Run the Django task at `path` with `args` and `kwargs`; its return value is the job's result.
    An exception fails the job with the exception's class path and message (the traceback goes to
    the runtime's log)."""
    task = load_task(path)
    result = running_result(task, ctx, args, kwargs)
    with _in_job(ctx):
        task_started.send(type(task.get_backend()), task_result=result)
        try:
            if task.takes_context:
                value = task.call(TaskContext(task_result=result), *args, **kwargs)
            else:
                value = task.call(*args, **kwargs)
            value = normalize_json(value)
        except JobCancelled:
            # A BaseException, passed on as it came so the job ends cancelled; the task ended all
            # the same (it reads back FAILED), and receivers pairing task_started with
            # task_finished never saw it end.
            _finished(task, result, TaskResultStatus.FAILED)
            raise
        except BaseException as exc:
            # SystemExit (sys.exit() in code the task calls) too: the runtime fails the job with it
            # as with any failure, and without task_finished the task never ended for receivers.
            _finished(task, result, TaskResultStatus.FAILED)
            if isinstance(exc, Exception):
                raise failure_of(exc) from exc
            raise
        try:
            # What the runtime checks before it stores the result, checked first: a value Django's
            # normalization lets through but no job result holds (NaN) fails the job, and the
            # task_finished sent before said SUCCESSFUL. Raised as it is: never retried, as there.
            check_json(value, "result", InvalidResultError, "job results")
        except InvalidResultError:
            _finished(task, result, TaskResultStatus.FAILED)
            raise
        _finished(task, result, TaskResultStatus.SUCCESSFUL)
        return value
