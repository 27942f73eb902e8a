"""The Django app `livepush.contrib.django`: its template tags (`{% load livepush %}`), the
sign-out receiver that revokes a user's livepush session, its system checks, and the jobs'
database its LivePushBackends' OPTIONS name, set when Django starts."""

from __future__ import annotations

from django.apps import AppConfig


class LivePushConfig(AppConfig):
    name = "livepush.contrib.django"
    label = "livepush"
    verbose_name = "livepush"

    def ready(self) -> None:
        from django.core import checks

        from . import sessions  # noqa: F401  (connects revoke_on_logout to user_logged_out)
        from .checks import check_livepush

        checks.register(check_livepush, "livepush")
        try:
            from .backend import use_options_database
        except ImportError:
            return  # no Tasks framework here (Django 5.2 without django-tasks): no backend
        use_options_database()  # the jobs' database from the start, as the runner has it
