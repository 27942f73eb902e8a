"""Settings of the example site: one Postgres (LIVEPUSH_DATABASE_URL) holds Django's tables and
livepush's, so a task enqueued inside `transaction.atomic()` commits with it.

    LIVEPUSH_DATABASE_URL   postgresql://user@host:port/db (required)
    LIVEPUSH_SECRET         livepush's key (32+ characters), shared with `livepush serve`
    LIVEPUSH_PUBLIC_URL     where browsers reach `livepush serve` (default ws://127.0.0.1:8765/)
"""

import os
from urllib.parse import unquote, urlsplit

from django.core.exceptions import ImproperlyConfigured

DEBUG = os.environ.get("DJANGO_DEBUG", "") == "1"
SECRET_KEY = os.environ.get("DJANGO_SECRET_KEY", "example-only-not-secret-" + "x" * 40)
ALLOWED_HOSTS = ["127.0.0.1", "localhost"]
USE_TZ = True
ROOT_URLCONF = "demo_site.urls"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

INSTALLED_APPS = [
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "livepush.contrib.django",  # {% load livepush %}, and sign-out revokes the livepush session
    "progress_demo",
]

MIDDLEWARE = [
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "livepush.contrib.django.LivePushSessionMiddleware",  # after AuthenticationMiddleware
]

TEMPLATES = [{"BACKEND": "django.template.backends.django.DjangoTemplates", "APP_DIRS": True, "OPTIONS": {}}]


def _database(url: str) -> dict:
    parts = urlsplit(url)
    options = dict(p.split("=", 1) for p in parts.query.split("&") if "=" in p)
    return {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": unquote(parts.path.lstrip("/")),
        "USER": unquote(parts.username or ""),
        "PASSWORD": unquote(parts.password or ""),
        "HOST": options.pop("host", parts.hostname or ""),
        "PORT": str(parts.port or ""),
        "OPTIONS": options,
    }


_URL = os.environ.get("LIVEPUSH_DATABASE_URL") or os.environ.get("DATABASE_URL")
if not _URL:
    raise ImproperlyConfigured("set LIVEPUSH_DATABASE_URL to the Postgres database livepush migrated (Django's "
                               "tables go there too), e.g. postgresql://user@localhost/app")
DATABASES = {"default": _database(_URL)}

TASKS = {
    "default": {
        "BACKEND": "livepush.contrib.django.LivePushBackend",
        "QUEUES": ["default", "second"],
        # OPTIONS: DATABASE_URL (default LIVEPUSH_DATABASE_URL), DATABASE ("default": the Django
        # database whose transactions an enqueue joins), ENQUEUE_ON_COMMIT (True), MAX_ATTEMPTS (1).
    }
}

LIVEPUSH_PUBLIC_URL = os.environ.get("LIVEPUSH_PUBLIC_URL", "ws://127.0.0.1:8765/")
