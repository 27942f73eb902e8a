"""The demo site's settings as a project's tests have them under Django's test runner, whose test
database holds no livepush tables: enqueues are committed at once in the jobs' database."""

from demo_site.settings import *  # noqa: F403
from demo_site.settings import TASKS

TASKS = {"default": {**TASKS["default"], "OPTIONS": {"ENQUEUE_ON_COMMIT": False}}}
