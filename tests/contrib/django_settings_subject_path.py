"""The demo site's settings, with LIVEPUSH_SESSION_SUBJECT naming its function by dotted path,
whose module imports a model: settings.py could not import that function itself."""

from demo_site.settings import *  # noqa: F403

LIVEPUSH_SESSION_SUBJECT = "tests.contrib.django_subjects.subject"
