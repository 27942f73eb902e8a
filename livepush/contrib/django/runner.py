"""What the job runtime imports to run Django tasks: sets Django up (DJANGO_SETTINGS_MODULE), then
registers the job that runs them.

    DJANGO_SETTINGS_MODULE=mysite.settings livepush jobs livepush.contrib.django.runner --queues default,emails
"""

from __future__ import annotations

import django
from django.apps import apps

if not apps.ready:
    django.setup()

# Only now: the job's module imports Django's models and signals, which need the apps loaded.
from django.conf import settings
from django.utils.module_loading import import_string

from ...jobs.api.registry import REGISTRY
from .backend import LivePushBackend
from .execution import RUN_TASK, run_task


def backend_queues() -> list[str]:
    """The QUEUES of every LivePushBackend in TASKS (Django's default queue when it names none)."""
    found: set[str] = set()
    for params in (getattr(settings, "TASKS", None) or {}).values():
        backend = params.get("BACKEND")
        try:
            kind = import_string(backend) if isinstance(backend, str) else backend
        except ImportError:
            continue  # another backend, not installed where the runtime runs: none of its tasks come here
        if isinstance(kind, type) and issubclass(kind, LivePushBackend):
            found.update(params.get("QUEUES") or ["default"])
    return sorted(found)


# One job runs the tasks of every queue: a runtime started without --queues (and `livepush serve
# --with-jobs`, which has none) serves every queue the backends name, not only the job's own.
REGISTRY.add_queues(backend_queues())

__all__ = ["RUN_TASK", "backend_queues", "run_task"]
