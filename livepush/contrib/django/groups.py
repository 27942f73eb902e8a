"""Django tasks as members of a livepush task group (docs/groups.md): every task enqueued inside the
block joins the group, which is sealed when the block ends; its callbacks run exactly once after
every member finished.

    with task_group(on_success=request(send_report, import_id)) as group:
        for row in rows:
            import_row.enqueue(import_id, row)      # a TaskResult each, as always
    group.signed_topic                              # progress of the whole group, on group:<id>
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime
from typing import Any

from django.db import transaction

from ...types import shown
from ... import blocking, jobs
from ...errors import ArgumentTypeError
from .errors import TaskNotSupported, arguments_error, refuse_uncallable
from .execution import run_task
from .tasks_api import Task, normalize_json, task_backends

CALL = "livepush.contrib.django.task_group()"  # named as the caller wrote it, in the event-loop warning
_open: contextvars.ContextVar[OpenGroup | None] = contextvars.ContextVar("livepush_django_group", default=None)


@dataclasses.dataclass(frozen=True)
class OpenGroup:
    """The group tasks enqueued now join."""

    handle: jobs.GroupHandle

    def add(self, spec: Any, job_args: list[Any], when: datetime | None, conn: Any) -> jobs.JobHandle:
        return jobs.add_to_group(self.handle.id, spec, *job_args, at=when, conn=conn)


def current_group() -> OpenGroup | None:
    """The group of the innermost `task_group()` block around the caller, or None."""
    return _open.get()


def request(task: Task, *args: Any, **kwargs: Any) -> jobs.JobRequest:
    """`task` with these arguments as a job request: a group's callback (on_success=...)."""
    if not isinstance(task, Task):
        # A livepush @jobs.job, the task's plain function or its path failed with an AttributeError
        # (module_path) that said nothing of what request() takes.
        hint = ("; a livepush @jobs.job is its own request: some_job.request(*args)"
                if isinstance(task, jobs.JobFunction) else "")
        raise ArgumentTypeError(f"request() takes a Django @task and its arguments, such as request(send_report, 7), "
                                f"got {shown(task, typed=True, width=60)}{hint}")
    try:
        job_args = normalize_json(list(args)), normalize_json(kwargs)
    except (TypeError, ValueError) as exc:
        raise arguments_error(args, kwargs) or exc from None
    refuse_uncallable(task, *job_args)  # a callback that could never run, found where it is written
    try:
        # livepush's own check (NaN, an int key, a NUL) names the job's arguments: args[1][0] is
        # the task's args[0], so the task's own are named instead, as an enqueue does.
        return run_task.request(task.module_path, *job_args, queue=task.queue_name)
    except (TypeError, ValueError) as exc:
        raise arguments_error(args, kwargs) or exc from None


@contextmanager
def task_group(on_finish: jobs.JobRequest | None = None, on_success: jobs.JobRequest | None = None,
               on_failure: jobs.JobRequest | None = None, *, backend: str = "default") -> Iterator[jobs.GroupHandle]:
    """Open a task group that the tasks enqueued in the block join; seal it when the block ends.
    A block that raises undoes it: outside a transaction the group is cancelled; inside
    `transaction.atomic()`, where the group is created in that transaction like the tasks, a
    savepoint around the block takes the group and its tasks back, wherever the error is caught."""
    for name, callback in (("on_finish", on_finish), ("on_success", on_success), ("on_failure", on_failure)):
        if isinstance(callback, Task):  # livepush's own refusal would tell a Django user to write some_job.request()
            raise ArgumentTypeError(f"task_group({name}=) takes a request of the task with its arguments, "
                                    f"{name}=request({callback.func.__name__}, ...), got the task {callback.name} itself")
    tasks = task_backends[backend]
    if not callable(getattr(tasks, "transaction_conn", None)):  # the backend module imports this one
        raise TaskNotSupported(
            f"task_group() makes a livepush task group, which needs TASKS[{backend!r}] to be "
            f"livepush.contrib.django.LivePushBackend; it is {type(tasks).__module__}.{type(tasks).__qualname__}: "
            "pass backend= the alias of a LivePushBackend")
    if blocking.due(CALL):
        # The group's own calls are livepush's, which warn of nothing, and this has no async twin.
        # 0: say, 1: this body, 2: contextlib's __enter__, 3: the `with` in the caller's code.
        blocking.say(CALL, "sync_to_async(f)()` with the block in a sync function `f", 3)
    conn = tasks.transaction_conn()
    with transaction.atomic(using=tasks.database) if conn is not None else contextlib.nullcontext():
        handle = jobs.create_group(on_finish=on_finish, on_success=on_success, on_failure=on_failure, conn=conn)
        token = _open.set(OpenGroup(handle))
        try:
            yield handle
        except BaseException:
            _open.reset(token)
            if conn is None:
                jobs.cancel_group(handle.id)
            raise
        _open.reset(token)
        jobs.seal_group(handle.id, conn=conn)
