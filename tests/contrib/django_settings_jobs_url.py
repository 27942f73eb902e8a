"""The demo site's settings, with the jobs' database named in the backend's OPTIONS (from
DJANGO_JOBS_DATABASE_URL) rather than by LIVEPUSH_DATABASE_URL alone."""

import os

from demo_site.settings import *  # noqa: F403
from demo_site.settings import TASKS

TASKS = {"default": {**TASKS["default"], "OPTIONS": {"DATABASE_URL": os.environ["DJANGO_JOBS_DATABASE_URL"]}}}
