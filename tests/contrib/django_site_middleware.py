"""A site's own authentication middleware, built on Django's: imported by path from MIDDLEWARE
once Django is set up (for the checks' tests)."""

from django.contrib.auth.middleware import AuthenticationMiddleware


class SiteAuthenticationMiddleware(AuthenticationMiddleware):
    """Sets request.user as Django's does."""
