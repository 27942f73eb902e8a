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
from ...errors import ConfigError
from ...jobs.api.registry import REGISTRY
from .backend import livepush_backends, options_database_urls
from .tasks_api import task_backends
from .execution import RUN_TASK, run_task


def backend_queues() -> list[str]:
    """The QUEUES of every LivePushBackend in TASKS (Django's default queue when it names none)."""
    found: set[str] = set()
    for params in livepush_backends().values():
        found.update(params.get("QUEUES") or ["default"])
    return sorted(found)


def use_backends_database() -> None:
    """Take the jobs' database from the backends' OPTIONS['DATABASE_URL'], as the web processes do
    (the backend configures its process): a runtime on LIVEPUSH_DATABASE_URL's database would
    claim nothing of what they enqueue, and say nothing. One process has one jobs' database."""
    urls = options_database_urls()
    if len(urls) > 1:
        raise ConfigError(f"TASKS names {len(urls)} different OPTIONS['DATABASE_URL'] for its LivePushBackends; "
                          "a job runtime serves one database: run one per database, each with its own settings")
    for alias in livepush_backends():
        task_backends[alias]  # noqa: B018 - made as in the web process: its checks, and its configure()


use_backends_database()
# One job runs the tasks of every queue: a runtime started without --queues (and `livepush serve
# --with-jobs`, which has none) serves every queue the backends name, not only the job's own.
REGISTRY.add_queues(backend_queues())

__all__ = ["RUN_TASK", "backend_queues", "livepush_backends", "run_task", "use_backends_database"]
