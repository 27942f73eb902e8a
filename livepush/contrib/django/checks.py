"""livepush's Django system checks: `manage.py check`, and so the start of runserver and migrate,
report a setting livepush cannot use, naming it, instead of leaving it to fail requests.

    livepush.E001   livepush's own settings (LIVEPUSH_SECRET, LIVEPUSH_FANOUT, URLs, ...), and no
                    jobs' database for the LivePushBackends in TASKS
    livepush.E002   a LivePushBackend in TASKS that cannot be made (its QUEUES or OPTIONS)
    livepush.E003   LIVEPUSH_SESSION_TTL, _SUBJECT or _COOKIE_DOMAIN, when the session middleware is installed
    livepush.W001   the local fan-out, whose messages reach no `livepush serve`
    livepush.W002   a LivePushBackend whose DATABASE cannot hold an enqueue in its transactions
    livepush.W003   a setting livepush reads from the environment, written in Django's settings
    livepush.W004   the session middleware without AuthenticationMiddleware, so with no request.user
    livepush.W005   the session middleware before SessionMiddleware, which has saved the Django session by then
    livepush.W006   a LIVEPUSH_ setting that is none of livepush's but close to one (a misspelling)

Nothing here connects to a database or Redis: checks run in every management command that asks
for them, also where those are not reachable.
"""

from __future__ import annotations

import difflib
import os
from collections.abc import Sequence
from typing import Any

from django.apps import AppConfig
from django.conf import settings
from django.core import checks
from django.core.exceptions import ImproperlyConfigured
from django.utils.module_loading import import_string

from ...config import ENVIRONMENT, Settings, get_settings
from ...errors import ConfigError
from ...jobs import database as jobs_database


def _livepush_settings() -> list[checks.CheckMessage]:
    try:
        settings_ = get_settings()
        settings_.require_secret()  # signed topics and session tokens, in every web process
    except ConfigError as exc:
        return [checks.Error(str(exc), id="livepush.E001")]
    if settings_.fanout == "local":  # a warning: a site's own tests may run it alone on purpose
        return [checks.Warning(
            "LIVEPUSH_FANOUT is local, so what this site publishes reaches no `livepush serve` (the local fan-out "
            "delivers inside this process only)", id="livepush.W001",
            hint="give the site the servers' fan-out: LIVEPUSH_FANOUT and LIVEPUSH_DATABASE_URL or "
                 "LIVEPUSH_REDIS_URL as they have them")]
    return []


def _environment_in_settings() -> list[checks.CheckMessage]:
    """livepush's own settings (LIVEPUSH_SECRET, LIVEPUSH_DATABASE_URL, ...) come from the
    environment, while its session settings are Django's: one of the former written in
    settings.py was ignored, and the site published locally or reported a secret missing though
    it was set. A value equal to the environment's (settings.py reading os.environ) is fine."""
    found: list[checks.CheckMessage] = []
    for name in sorted(ENVIRONMENT - {"DATABASE_URL"}):  # DATABASE_URL is a common Django setting of its own
        if not hasattr(settings, name):
            continue
        value, environ = getattr(settings, name), os.environ.get(name)
        if _reads_the_same(name, value):
            continue
        found.append(checks.Warning(
            f"{name} is set in Django's settings, where livepush does not read it: livepush reads {name} from the "
            f"environment, where it is {'not set' if environ is None else 'another value'}", id="livepush.W003",
            hint=f"set {name} in the environment of the web processes (as for `livepush serve` and the job "
                 "runtime), and remove it from the settings module"))
    return found


def _reads_the_same(name: str, value: object) -> bool:
    """Whether livepush's configuration reads the Django setting `value`, written in the
    environment as settings.py would have read it from there (a list joined by commas, a number
    as its text, None as unset), as it reads the environment's `name`: str() of the value made a
    list of fallbacks, or a TTL of 300.0 beside "300", "another value"."""
    environ = os.environ.get(name)
    if value is None or value == "":
        text = None
    elif isinstance(value, (list, tuple)):
        text = ",".join(str(item) for item in value)
    else:
        text = str(value)
    if text == environ or (text is not None and environ is not None and text.strip() == environ.strip()):
        return True
    written = {key: each for key, each in os.environ.items() if key != name}
    if text is not None:
        written[name] = text
    try:
        # Only the variables' own readings: the checks across them are E001's, on the environment.
        return Settings.from_env(written, validate=False) == Settings.from_env(os.environ, validate=False)
    except ConfigError:  # a value livepush cannot read: the environment's, if it is that, is E001's
        return False


# How close a name must be to one of livepush's settings to be taken for a misspelling of it: a
# letter or two (LIVEPUSH_SECRETS, LIVEPUSH_SIGNED_TOPICS_TTL), not an app's own LIVEPUSH_WS_URL.
CLOSE = 0.88


def _misspelt() -> list[checks.CheckMessage]:
    """A Django setting named as none of livepush's, under LIVEPUSH_SESSION_ (where its session
    settings are) or close to one of them: nothing reads it, and a misspelt session setting left
    the default in force (a day-long TTL, a host-only cookie) without a word. Other LIVEPUSH_
    names are the app's own (the example's LIVEPUSH_PUBLIC_URL) and are left alone."""
    from .sessions import SETTINGS as SESSION_SETTINGS

    known = sorted(ENVIRONMENT | set(SESSION_SETTINGS))
    prefix = os.path.commonprefix(SESSION_SETTINGS)  # LIVEPUSH_SESSION_, where they all are
    found: list[checks.CheckMessage] = []
    for name in dir(settings):
        if not name.startswith("LIVEPUSH_") or name in known:
            continue
        if name.startswith(prefix):
            meant = difflib.get_close_matches(name, SESSION_SETTINGS, n=1, cutoff=0.6)
        else:
            meant = difflib.get_close_matches(name, known, n=1, cutoff=CLOSE)
            if not meant:
                continue
        where = ("in Django's settings" if meant and meant[0] in SESSION_SETTINGS
                 else "in the environment of the web processes (livepush reads it from there only)")
        found.append(checks.Warning(
            f"{name} is not a livepush setting, so nothing reads it"
            + (f": did you mean {meant[0]}?" if meant else
               f"; livepush's session settings are {', '.join(SESSION_SETTINGS)}"), id="livepush.W006",
            hint=f"set {meant[0]} {where}, and remove {name}" if meant else
                 f"rename it to the session setting it is meant to be, or remove {name}"))
    return found


def _backends() -> list[checks.CheckMessage]:
    try:
        from .backend import livepush_backends
        from .tasks_api import task_backends
    except ImportError:
        return []  # no Tasks framework here (Django 5.2 without django-tasks): no backend to make

    try:
        aliases = list(livepush_backends())
    except ImproperlyConfigured as exc:
        return [checks.Error(str(exc), id="livepush.E002")]
    found = _jobs_database(aliases)
    for alias in aliases:
        try:
            backend = task_backends[alias]  # made as Django makes it at the first enqueue
        except (ImproperlyConfigured, ConfigError) as exc:
            found.append(checks.Error(str(exc), id="livepush.E002"))
            continue
        if backend.enqueue_on_commit and not backend.can_join():
            # A warning: a site that never enqueues inside atomic() is fine as it is.
            found.append(checks.Warning(
                f"TASKS[{alias!r}]: Django database {backend.database!r} is not PostgreSQL through psycopg 3, so "
                "every enqueue inside its transaction.atomic() raises TransactionNotSupported",
                id="livepush.W002",
                hint="set OPTIONS['DATABASE'] to the PostgreSQL database that holds livepush's tables, or "
                     "OPTIONS['ENQUEUE_ON_COMMIT'] = False to enqueue at once, outside the transaction"))
    return found


def _jobs_database(aliases: Sequence[str]) -> list[checks.CheckMessage]:
    """The LivePushBackends' tasks are jobs in livepush's database: a site with none (the Redis
    fan-out, no LIVEPUSH_DATABASE_URL nor OPTIONS['DATABASE_URL']) failed every enqueue with a
    ConfigError, a 500 per request, while its checks said nothing."""
    if not aliases:
        return []
    try:
        jobs_database.database_url()  # configured from OPTIONS['DATABASE_URL'] at Django's start
    except ConfigError as exc:
        if not _settings_read():
            # The settings' own E001 names what is wrong (a short secret, an unknown fan-out): this
            # one repeated it as a missing database, and sent the user to a URL that was set.
            return []
        named = ", ".join(f"TASKS[{alias!r}]" for alias in aliases)
        return [checks.Error(f"{named} is a LivePushBackend, whose tasks are jobs in livepush's Postgres, and this "
                             f"process has none, so every enqueue would fail: {exc}", id="livepush.E001",
                             hint="set LIVEPUSH_DATABASE_URL in the web processes' environment (the database "
                                  "`livepush migrate` ran on), or OPTIONS['DATABASE_URL'] in the backend's entry")]
    return []


def _settings_read() -> bool:
    """Whether livepush's settings read from the environment without a ConfigError."""
    try:
        get_settings()
    except ConfigError:
        return False
    return True


def _has(middleware: Sequence[str], kind: type) -> bool:
    """Whether `middleware` has `kind` or a subclass of it (a project's own, which adds to it)."""
    return _position(middleware, kind) is not None


def _position(middleware: Sequence[str], kind: type) -> int | None:
    """Where in `middleware` the first `kind` or subclass of it is, else None; a path that does
    not import is left to Django's own errors."""
    for at, path in enumerate(middleware):
        try:
            found = import_string(path)
        except ImportError:
            continue
        if isinstance(found, type) and issubclass(found, kind):
            return at
    return None


def _sessions() -> list[checks.CheckMessage]:
    from .sessions import LivePushSessionMiddleware, _domain, _subject_setting, _ttl

    middleware = getattr(settings, "MIDDLEWARE", None) or ()
    # A project's subclass of the session middleware reads the same settings and needs a user too.
    if not _has(middleware, LivePushSessionMiddleware):
        return []
    # Only now: its module imports the auth models, which a site without django.contrib.auth lacks.
    from django.contrib.auth.middleware import AuthenticationMiddleware
    from django.contrib.sessions.middleware import SessionMiddleware

    found: list[checks.CheckMessage] = []
    if not _has(middleware, AuthenticationMiddleware):
        # A warning: an app may set request.user its own way (Django REST framework's views do).
        found.append(checks.Warning(
            "LivePushSessionMiddleware is in MIDDLEWARE without django.contrib.auth.middleware."
            "AuthenticationMiddleware, so no request has a request.user: no one gets a livepush session, and every "
            "socket connects anonymous", id="livepush.W004",
            hint="add 'django.contrib.auth.middleware.AuthenticationMiddleware' to MIDDLEWARE before it"))
    django_sessions = _position(middleware, SessionMiddleware)
    ours = _position(middleware, LivePushSessionMiddleware)
    if django_sessions is not None and ours is not None and ours < django_sessions:
        # Middleware handles the response in reverse order: one listed first sees it last.
        found.append(checks.Warning(
            "LivePushSessionMiddleware is in MIDDLEWARE before django.contrib.sessions.middleware."
            "SessionMiddleware, which has saved the Django session by the time it runs: what it keeps there is lost, "
            "so a sign-out leaves open the sockets of the sessions a renewal replaced",
            id="livepush.W005", hint="list it after SessionMiddleware and AuthenticationMiddleware"))
    for check in (_ttl, _subject_setting, _domain):
        try:
            check()
        except ImproperlyConfigured as exc:
            found.append(checks.Error(str(exc), id="livepush.E003"))
    return found


def check_livepush(app_configs: Sequence[AppConfig] | None = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """Every livepush check (registered by the app's ready())."""
    return _livepush_settings() + _environment_in_settings() + _misspelt() + _backends() + _sessions()
