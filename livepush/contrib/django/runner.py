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
from .execution import RUN_TASK, run_task

__all__ = ["RUN_TASK", "run_task"]
