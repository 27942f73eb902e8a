"""A site's subject function for LIVEPUSH_SESSION_SUBJECT, named by its dotted path: its module
imports a model at the top, as a site's own often does, so importing it from settings.py would
stop Django's start with AppRegistryNotReady."""

from typing import Any

from django.contrib.auth.models import User

NOT_A_FUNCTION = "site"


def subject(user: Any) -> str:
    """The user's subject, read through the model the module imported."""
    return "site-" + User.objects.get(pk=user.pk).username
