"""Errors of the Django integration.

    LivepushError
    ├── TaskNotSupported (also Django's InvalidTask)   what Django's task contract allows but
    │   └── TransactionNotSupported                     livepush cannot do; the message says why
    │                                                   and what to do instead
    └── TaskFailed                                      ends a job whose Django task raised (internal)

TaskNotSupported subclasses the Tasks framework's InvalidTask, so code written against any Django
task backend catches it where it catches a refused task.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

from ...errors import LivepushError
from ...jobs.api.args import check_json
from ...jobs.errors import InvalidArgumentsError
from .tasks_api import InvalidTask, Task


class TaskNotSupported(LivepushError, InvalidTask):
    """A task, or a way of enqueueing it, that this backend refuses."""


class TransactionNotSupported(TaskNotSupported):
    """An enqueue inside `transaction.atomic()` that cannot join the transaction: the Django
    database is not PostgreSQL through psycopg 3, or does not hold livepush's tables."""


class TaskFailed(Exception):
    """Ends the run of a Django task that raised. Each exception class gets a subclass named by its
    path (`myapp.errors.Declined`, or `ValueError` for a built-in), so the job's stored error reads
    `myapp.errors.Declined: card declined` and TaskError.exception_class_path can be read back."""


_failures: dict[str, type[TaskFailed]] = {}


def class_path(kind: type[BaseException]) -> str:
    """An exception class's import path; built-ins by their bare name, as livepush's errors show them."""
    if kind.__module__ == "builtins":
        return kind.__qualname__
    return f"{kind.__module__}.{kind.__qualname__}"


def failure_of(exc: BaseException) -> TaskFailed:
    """The TaskFailed to raise (from `exc`) for a task that raised `exc`."""
    path = class_path(type(exc))
    kind = _failures.get(path)
    if kind is None:
        kind = _failures[path] = type(path, (TaskFailed,), {"__module__": __name__})
    # str(exc), not its args: an exception with a __str__ of its own (Django's ValidationError, an
    # app's) shows its message, and a KeyError its quoted key, as under a traceback.
    try:
        message = str(exc)
    except Exception:
        message = "(its message could not be read: str() raised)"
    return kind(message) if message else kind()


def arguments_error(args: Any, kwargs: Any) -> InvalidArgumentsError | None:
    """The InvalidArgumentsError naming the first of a task's arguments that is not plain JSON, or
    None. The framework's normalize_json() refuses one (a date, a Decimal) with a TypeError that
    names only its type, which left the user to guess which argument of which call it was."""
    try:
        check_json(list(args), "args", InvalidArgumentsError, "task arguments")
        check_json(dict(kwargs), "kwargs", InvalidArgumentsError, "task arguments")
    except InvalidArgumentsError as exc:
        return exc
    return None


# Each task function's signature, read once: reading one costs more than the rest of an enqueue's
# Python. None: one Python cannot read (some builtins), left to the runtime to find out.
_signatures: dict[Callable[..., Any], inspect.Signature | None] = {}


def _signature(func: Callable[..., Any]) -> inspect.Signature | None:
    if func not in _signatures:
        try:
            # What the task calls, not what a decorator wraps, as for livepush's own jobs (arity()).
            _signatures[func] = inspect.signature(func, follow_wrapped=False)
        except (TypeError, ValueError):
            _signatures[func] = None
    return _signatures[func]


def refuse_uncallable(task: Task, args: Any, kwargs: Any) -> None:
    """InvalidArgumentsError naming `task` unless its function can be called with `args` and
    `kwargs` (after its context, for a takes_context task). The job written otherwise failed at
    every run with Python's TypeError, where livepush's own jobs are refused at the enqueue."""
    signature = _signature(task.func)
    if signature is None:
        return
    try:
        signature.bind(*((None,) if task.takes_context else ()), *args, **kwargs)
    except TypeError as exc:
        after = " after its context" if task.takes_context else ""
        raise InvalidArgumentsError(f"task {task.module_path} cannot be called with these arguments ({exc}): "
                                    f"enqueue it with the arguments its function takes{after}") from None
