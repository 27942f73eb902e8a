"""A livepush job of a Django task as the Tasks framework's TaskResult (status, return value, errors).

    livepush state                  TaskResultStatus
    available, scheduled            READY (scheduled: not due yet, or waiting for its next attempt)
    running                         RUNNING
    succeeded                       SUCCESSFUL
    failed, cancelled               FAILED (a cancel's error is livepush.jobs.JobCancelled)

livepush keeps a job's last error, not one per attempt, nor when it was enqueued, started or
finished: `errors` has at most that one TaskError, whose `traceback` is the error's line (the full
traceback is in the runtime's log); the timestamps are None; `worker_ids` has one entry per attempt
started, "livepush" (livepush does not record which runtime ran an attempt).
"""

from __future__ import annotations

import builtins
import copy
from typing import Any

from ...jobs import JobInfo
from ...postgres.text import BIGINT_MAX
from ...jobs import errors as job_errors
from .errors import TaskFailed
from .execution import RUN_TASK, django_priority, load_task
from .tasks_api import (
    Task,
    TaskError,
    TaskResult,
    TaskResultDoesNotExist,
    TaskResultStatus,
    set_attr,
)

STATUS = {
    "available": TaskResultStatus.READY,
    "scheduled": TaskResultStatus.READY,
    "running": TaskResultStatus.RUNNING,
    "waiting": TaskResultStatus.RUNNING,
    "succeeded": TaskResultStatus.SUCCESSFUL,
    "failed": TaskResultStatus.FAILED,
    "cancelled": TaskResultStatus.FAILED,
}
CANCELLED_CLASS = "livepush.jobs.errors.JobCancelled"


def error_of(text: str | None, state: str) -> TaskError:
    """The TaskError of a job's stored error, `"<class path>: <message>"` (errors.failure_of); for
    a cancelled job, JobCancelled."""
    if state == "cancelled":
        # The cancel ended the job, whatever its row's error says: a job cancelled before it ran
        # has none, one cancelled between attempts keeps the error of the attempt before.
        line = "cancelled" if not text or text == "cancelled" else f"cancelled (the attempt before: {text})"
        return TaskError(exception_class_path=CANCELLED_CLASS, traceback=line)
    text = text or ""
    head = text.partition(":")[0].strip()
    if head.isidentifier() and hasattr(builtins, head):
        head = f"builtins.{head}"  # a built-in, stored by its bare name
    elif head.isidentifier() and hasattr(job_errors, head):
        head = f"{job_errors.__name__}.{head}"  # livepush's own (a result that is not JSON)
    elif not all(part.isidentifier() for part in head.split(".")) or "." not in head:
        head = f"{TaskFailed.__module__}.{TaskFailed.__qualname__}"  # not a class path: the runtime's words
    return TaskError(exception_class_path=head, traceback=text)


def result_of(info: JobInfo | None, result_id: Any, backend: str) -> TaskResult:
    """The TaskResult of the job `info`; TaskResultDoesNotExist unless it is a Django task's job."""
    if info is None or info.name != RUN_TASK or not info.args or len(info.args) != 3:
        raise TaskResultDoesNotExist(f"no task result {result_id!r}")
    path, args, kwargs = info.args
    try:
        task = load_task(path)
    except (ImportError, TypeError) as exc:
        raise TaskResultDoesNotExist(f"task result {result_id!r} is of {path}, which this process cannot import: {exc}") from exc
    task = as_enqueued(task, backend, info.queue, django_priority(info.priority))
    finished = info.state in ("succeeded", "failed", "cancelled")
    result = TaskResult(
        task=task, id=str(info.id), status=STATUS[info.state], enqueued_at=None, started_at=None,
        finished_at=None, last_attempted_at=None, args=args, kwargs=kwargs, backend=backend,
        errors=[error_of(info.error, info.state)]
        if info.state == "cancelled" or (info.error and (finished or info.attempt)) else [],
        worker_ids=["livepush"] * info.attempt)
    if info.state == "succeeded":
        set_attr(result, "_return_value", info.result)
    return result


def as_enqueued(task: Task, backend: str, queue: str, priority: int) -> Task:
    """`task` as it was enqueued (`.using(backend=..., queue_name=..., priority=...)`), read back
    through `backend`. Not through using(), which checks the task against its backend as an
    enqueue does: a task enqueued through a second backend, on a queue only that one lists, could
    never be read back (nor one on a queue since dropped from QUEUES)."""
    changes = {"backend": backend, "queue_name": queue, "priority": priority}
    if all(getattr(task, name) == value for name, value in changes.items()):
        return task
    task = copy.copy(task)
    for name, value in changes.items():
        set_attr(task, name, value)
    return task


def job_id_of(result_id: Any) -> int:
    """The job id inside a result id (its decimal text); TaskResultDoesNotExist for anything else."""
    text = str(result_id)
    # Past BIGINT_MAX no job has the id, and its job:<id> topic is refused as InvalidTopic.
    if not text.isascii() or not text.isdigit() or text.startswith("0") or len(text) > 19 or int(text) > BIGINT_MAX:
        raise TaskResultDoesNotExist(f"no task result {result_id!r}")
    return int(text)
