"""The Django app `livepush.contrib.django`: its template tags (`{% load livepush %}`), the
sign-out receiver that revokes a user's livepush session, and its system checks."""

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
