"""The Django app `livepush.contrib.django`: its template tags (`{% load livepush %}`) and the
sign-out receiver that revokes a user's livepush session."""

from __future__ import annotations

from django.apps import AppConfig


class LivePushConfig(AppConfig):
    name = "livepush.contrib.django"
    label = "livepush"
    verbose_name = "livepush"

    def ready(self) -> None:
        from . import sessions  # noqa: F401  (connects revoke_on_logout to user_logged_out)
