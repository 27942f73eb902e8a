"""A site's own middleware, built on Django's and livepush's: imported by path from MIDDLEWARE
once Django is set up (for the checks' tests)."""

from django.contrib.auth.middleware import AuthenticationMiddleware

from livepush.contrib.django import LivePushSessionMiddleware


class SiteAuthenticationMiddleware(AuthenticationMiddleware):
    """Sets request.user as Django's does."""


class SiteSessionMiddleware(LivePushSessionMiddleware):
    """Gives sessions as livepush's does."""
