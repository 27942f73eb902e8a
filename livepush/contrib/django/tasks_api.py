"""Django's Tasks framework, wherever this Django has it: `django.tasks` (Django 6.0 and later, on
Python 3.12 and later), else its backport `django_tasks` (the package django-tasks, same API) for
Django 5.2 on Python 3.11. Everything else in this package imports the framework from here."""

from __future__ import annotations

from typing import Any

try:
    from django.tasks import TaskContext, TaskResult, TaskResultStatus, task_backends
    from django.tasks.backends.base import BaseTaskBackend
    from django.tasks.base import DEFAULT_TASK_PRIORITY, Task, TaskError
    from django.tasks.exceptions import InvalidTask, TaskResultDoesNotExist
    from django.tasks.signals import task_enqueued, task_finished, task_started
    from django.utils.json import normalize_json

    MODULE = "django.tasks"
except ImportError:  # Django before 6.0: the backport
    from django_tasks import TaskContext, TaskResult, TaskResultStatus, task_backends
    from django_tasks.backends.base import BaseTaskBackend
    from django_tasks.base import DEFAULT_TASK_PRIORITY, Task, TaskError
    from django_tasks.exceptions import InvalidTaskError as InvalidTask
    from django_tasks.exceptions import TaskResultDoesNotExist
    from django_tasks.signals import task_enqueued, task_finished, task_started
    from django_tasks.utils import normalize_json

    MODULE = "django_tasks"


def set_attr(frozen: Any, name: str, value: Any) -> None:
    """Set a field of one of the framework's frozen dataclasses (TaskResult), as its own backends do."""
    object.__setattr__(frozen, name, value)


__all__ = [
    "DEFAULT_TASK_PRIORITY",
    "MODULE",
    "BaseTaskBackend",
    "InvalidTask",
    "Task",
    "TaskContext",
    "TaskError",
    "TaskResult",
    "TaskResultDoesNotExist",
    "TaskResultStatus",
    "normalize_json",
    "set_attr",
    "task_backends",
    "task_enqueued",
    "task_finished",
    "task_started",
]
