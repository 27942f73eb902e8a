"""livepush for Django (docs/frameworks.md, Django): a Tasks backend on livepush's job runtime,
publish on commit, a livepush session for `request.user`, and template tags.

    TASKS = {"default": {"BACKEND": "livepush.contrib.django.LivePushBackend"}}
    INSTALLED_APPS = [..., "livepush.contrib.django"]          # {% load livepush %}, sign-out revokes
    MIDDLEWARE = [..., "django.contrib.auth.middleware.AuthenticationMiddleware",
                  "livepush.contrib.django.LivePushSessionMiddleware"]

    from livepush.contrib.django import progress, publish, request, task_group

Importing this package imports nothing of Django until a name is used, so `livepush` itself never
needs Django installed.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

_NAMES = {
    "LivePushBackend": ".backend",
    "TaskSpec": ".backend",
    "progress": ".execution",
    "current_job": ".execution",
    "RUN_TASK": ".execution",
    "task_group": ".groups",
    "request": ".groups",
    "publish": ".publishing",
    "publish_many": ".publishing",
    "LivePushSessionMiddleware": ".sessions",
    "Subscription": ".pages",
    "subscription": ".pages",
    "job_topic": ".pages",
    "TaskNotSupported": ".errors",
    "TransactionNotSupported": ".errors",
}

# Spelled out, not list(_NAMES): a type checker reads a literal __all__ only.
__all__ = ["LivePushBackend", "TaskSpec", "progress", "current_job", "RUN_TASK", "task_group", "request", "publish",
           "publish_many", "LivePushSessionMiddleware", "Subscription", "subscription", "job_topic",
           "TaskNotSupported", "TransactionNotSupported"]

if TYPE_CHECKING:
    # The names for type checkers, which cannot follow __getattr__ (they would read every name,
    # a misspelt one included, as its Any).
    from .backend import LivePushBackend, TaskSpec
    from .errors import TaskNotSupported, TransactionNotSupported
    from .execution import RUN_TASK, current_job, progress
    from .groups import request, task_group
    from .pages import Subscription, job_topic, subscription
    from .publishing import publish, publish_many
    from .sessions import LivePushSessionMiddleware
else:
    def __getattr__(name: str) -> Any:
        module = _NAMES.get(name)
        if module is None:
            # `LivepushBackend` for `LivePushBackend`: Django's error for a path in TASKS or MIDDLEWARE
            # says only that the attribute is missing, and its traceback shows this one.
            meant = [known for known in _NAMES if known.lower() == name.lower()]
            hint = f": did you mean {meant[0]!r}?" if meant else ""
            raise AttributeError(f"module {__name__!r} has no attribute {name!r}{hint}")
        return getattr(importlib.import_module(module, __name__), name)
