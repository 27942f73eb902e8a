"""livepush's Django system checks (docs/frameworks.md, Django): a setting livepush cannot use is
reported by `manage.py check` (and so when runserver and migrate start) naming the setting, and a
web server whose session middleware has no usable settings does not start; none of them is left
to fail requests later."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest
from django.core import checks
from django.core.exceptions import ImproperlyConfigured
from django.core.handlers.wsgi import WSGIHandler
from django.test import override_settings

from livepush import config
from livepush.errors import ConfigError
from tests.contrib.conftest import EXAMPLE

pytestmark = pytest.mark.usefixtures("django_site")

BACKEND = "livepush.contrib.django.LivePushBackend"


@contextlib.contextmanager
def without_secret() -> Iterator[None]:
    """The test's settings, less LIVEPUSH_SECRET."""
    before = config.get_settings()
    config.set_settings(dataclasses.replace(before, secret=None))
    try:
        yield
    finally:
        config.set_settings(before)


def livepush_messages() -> list[checks.CheckMessage]:
    """What Django's checks say about livepush, as `manage.py check` runs them."""
    return [m for m in checks.run_checks() if str(m.id).startswith("livepush.")]


def test_a_working_configuration_has_nothing_to_report() -> None:
    """The example site with a secret, a database and valid options: no livepush message."""
    assert livepush_messages() == []


def test_a_livepush_environment_setting_written_in_django_settings_is_a_warning_naming_it(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """LIVEPUSH_DATABASE_URL or LIVEPUSH_SECRET written in settings.py, where livepush never reads
    them (it reads the environment): a warning naming each and the environment, instead of a
    publish that silently stays local or a secret reported missing though it was set."""
    monkeypatch.delenv("LIVEPUSH_FANOUT", raising=False)
    with override_settings(LIVEPUSH_FANOUT="redis", LIVEPUSH_SESSION_TTL=3600):
        found = livepush_messages()
    assert [m.id for m in found] == ["livepush.W003"]
    assert found[0].level == checks.WARNING
    assert "LIVEPUSH_FANOUT" in found[0].msg and "environment" in found[0].msg
    # The same value in both (settings.py reading os.environ) is no mistake.
    monkeypatch.setenv("LIVEPUSH_FANOUT", "redis")
    with override_settings(LIVEPUSH_FANOUT="redis"):
        assert livepush_messages() == []


SECRET_A, SECRET_B = "a" * 16 + "0123456789abcdef", "b" * 16 + "0123456789abcdef"


@pytest.mark.parametrize(("name", "environ", "value"), [
    ("LIVEPUSH_SECRET_FALLBACKS", f"{SECRET_A},{SECRET_B}", [SECRET_A, SECRET_B]),
    ("LIVEPUSH_SECRET_FALLBACKS", f"{SECRET_A}, {SECRET_B}", (SECRET_A, SECRET_B)),
    ("LIVEPUSH_HISTORY_TTL", "300", 300.0),
    ("LIVEPUSH_HISTORY_TTL", "300.0", 300),
    ("LIVEPUSH_SIGNED_TOPIC_TTL", "3600", 3600),
    ("LIVEPUSH_PORT", "8800", 8800),
    ("LIVEPUSH_FANOUT", "local", "LOCAL"),
    ("LIVEPUSH_REDIS_PREFIX", None, None),  # settings.py's os.environ.get() of a variable not set
], ids=["fallbacks-list", "fallbacks-tuple", "ttl-float", "ttl-int", "signed-ttl-int", "port-int", "fanout-case",
        "none-unset"])
def test_a_setting_equal_to_the_environments_value_as_livepush_reads_it_is_no_warning(
        monkeypatch: pytest.MonkeyPatch, name: str, environ: str | None, value: Any) -> None:
    """settings.py that reads the environment into Python values (a list of fallbacks, a float
    TTL) holds what livepush reads from it: compared as livepush's configuration reads the text,
    not as str() of the value, it is no "another value" warning."""
    if environ is None:
        monkeypatch.delenv(name, raising=False)
    else:
        monkeypatch.setenv(name, environ)
    with override_settings(**{name: value}):
        assert livepush_messages() == []


@pytest.mark.parametrize(("name", "environ", "value"), [
    ("LIVEPUSH_SECRET_FALLBACKS", f"{SECRET_A},{SECRET_B}", [SECRET_A]),
    ("LIVEPUSH_HISTORY_TTL", "300", 301),
    ("LIVEPUSH_HISTORY_TTL", "300", "five minutes"),
    ("LIVEPUSH_PORT", "8800", 8800.5),
], ids=["fallbacks-fewer", "ttl-another", "ttl-text", "port-fraction"])
def test_a_setting_livepush_reads_otherwise_than_the_environment_is_still_a_warning(
        monkeypatch: pytest.MonkeyPatch, name: str, environ: str, value: Any) -> None:
    """What livepush reads differently from the environment's value stays a warning naming it."""
    monkeypatch.setenv(name, environ)
    with override_settings(**{name: value}):
        found = livepush_messages()
    assert [m.id for m in found] == ["livepush.W003"] and "another value" in found[0].msg


@pytest.mark.parametrize("name, meant", [
    ("LIVEPUSH_SESSION_TIMEOUT", "LIVEPUSH_SESSION_TTL"),
    ("LIVEPUSH_SESION_TTL", "LIVEPUSH_SESSION_TTL"),
    ("LIVEPUSH_SESSION_COOKIE_DOMAINS", "LIVEPUSH_SESSION_COOKIE_DOMAIN"),
    ("LIVEPUSH_SESSION_DOMAIN", "LIVEPUSH_SESSION_COOKIE_DOMAIN"),
    ("LIVEPUSH_SESSION_USER", "LIVEPUSH_SESSION_SUBJECT"),
    ("LIVEPUSH_SESSION_QQ", None),
    ("LIVEPUSH_SECRETS", "LIVEPUSH_SECRET"),
    ("LIVEPUSH_SIGNED_TOPICS_TTL", "LIVEPUSH_SIGNED_TOPIC_TTL"),
])
def test_a_misspelt_livepush_setting_is_a_warning_naming_the_setting_meant(name: str, meant: str | None) -> None:
    """A setting named as none of livepush's is read by nothing: a misspelt session setting left
    the default in force (a day-long TTL, a host-only cookie the push server's host never gets)
    without a word. A name under LIVEPUSH_SESSION_, where livepush's session settings are, or
    one a letter or two from one of livepush's settings is a warning naming the setting it is
    close to; the app's own LIVEPUSH_ names (the example's LIVEPUSH_PUBLIC_URL) are left alone."""
    with override_settings(**{name: "x"}):
        found = livepush_messages()
    assert [m.id for m in found] == ["livepush.W006"], found
    assert found[0].level == checks.WARNING and name in found[0].msg
    assert (meant or "LIVEPUSH_SESSION_TTL") in found[0].msg + str(found[0].hint)
    for own in ("LIVEPUSH_PUBLIC_URL", "LIVEPUSH_WS_URL", "LIVEPUSH_URL"):
        with override_settings(**{own: "ws://127.0.0.1:8765/"}):
            assert livepush_messages() == [], own


def test_a_cookie_domain_that_is_a_host_name_is_fine() -> None:
    """A host name, with or without the leading dot browsers ignore, is a usable cookie domain."""
    for domain in ("example.com", ".example.com", "push-1.example.co.uk", "localhost"):
        with override_settings(LIVEPUSH_SESSION_COOKIE_DOMAIN=domain):
            assert livepush_messages() == [], domain


def test_a_missing_secret_is_an_error_naming_it() -> None:
    """No LIVEPUSH_SECRET in the web process (signed topics and session cookies need it): an
    error that names it and says how to make one."""
    with without_secret():
        found = livepush_messages()
    assert [m.id for m in found] == ["livepush.E001"]
    assert found[0].level == checks.ERROR and "LIVEPUSH_SECRET" in found[0].msg


@pytest.mark.parametrize(("name", "value"), [("LIVEPUSH_SECRET", "too-short"), ("LIVEPUSH_FANOUT", "kafka")])
def test_a_setting_livepush_cannot_read_is_one_error_naming_it_not_a_missing_jobs_database(
        monkeypatch: pytest.MonkeyPatch, name: str, value: str) -> None:
    """A short LIVEPUSH_SECRET or an unknown LIVEPUSH_FANOUT in an environment that has its
    LIVEPUSH_DATABASE_URL: one error naming that setting. A second one said the site had no jobs'
    database and told the user to set LIVEPUSH_DATABASE_URL, which was set."""
    from livepush.jobs import database

    before, configured = config.get_settings(), database.configured_url()
    monkeypatch.setenv("LIVEPUSH_DATABASE_URL", before.database_url or "")
    monkeypatch.setenv("LIVEPUSH_SECRET", before.secret or "")
    monkeypatch.setenv(name, value)
    config.set_settings(None)  # read from this environment, as a fresh process does
    database.configure(None)  # the jobs' database is LIVEPUSH_DATABASE_URL's, as without OPTIONS['DATABASE_URL']
    try:
        found = livepush_messages()
    finally:
        database.configure(configured)
        config.set_settings(before)
    assert [m.id for m in found] == ["livepush.E001"], found
    assert name in found[0].msg
    assert "LIVEPUSH_DATABASE_URL" not in found[0].msg + (found[0].hint or "")


def test_a_livepush_backend_without_a_jobs_database_is_an_error_naming_the_setting(redis_url: str) -> None:
    """A site on the Redis fan-out, with a LivePushBackend in TASKS and no LIVEPUSH_DATABASE_URL
    (nor OPTIONS['DATABASE_URL']): its jobs have nowhere to go, and every enqueue raised
    ConfigError, a 500 per request, while `manage.py check` said nothing. An error names the
    setting and the alias; a site that names the database in OPTIONS has nothing to report."""
    from livepush.jobs import database

    before, configured = config.get_settings(), database.configured_url()
    config.set_settings(dataclasses.replace(before, database_url=None, redis_url=redis_url, fanout="redis"))
    database.configure(None)
    try:
        found = livepush_messages()
        assert [m.id for m in found] == ["livepush.E001"], found
        assert "LIVEPUSH_DATABASE_URL" in found[0].msg and "TASKS['default']" in found[0].msg
        database.configure(configured)  # as OPTIONS['DATABASE_URL'] does at Django's start
        assert livepush_messages() == []
    finally:
        database.configure(configured)
        config.set_settings(before)


def test_a_local_fan_out_is_a_warning_naming_it() -> None:
    """LIVEPUSH_FANOUT local: what the site publishes stays in its own process, where no
    `livepush serve` runs; a warning names the setting (the site still runs)."""
    before = config.get_settings()
    config.set_settings(dataclasses.replace(before, fanout="local"))
    try:
        found = livepush_messages()
    finally:
        config.set_settings(before)
    assert [m.id for m in found] == ["livepush.W001"]
    assert found[0].level == checks.WARNING and "LIVEPUSH_FANOUT" in found[0].msg


@pytest.mark.parametrize(("options", "named"), [
    ({"DATABASE": "nope"}, "['DATABASE']"),
    ({"MAX_ATTEMPTS": 0}, "['MAX_ATTEMPTS']"),
    ({"ENQUEUE_ON_COMIT": True}, "unknown keys"),
])
def test_a_backend_option_it_cannot_use_is_an_error_naming_it(options: dict[str, Any], named: str) -> None:
    """A LivePushBackend in TASKS that cannot be made is reported as an error naming the option,
    where Django would otherwise make it (and raise) at the first enqueue."""
    from livepush.contrib.django.checks import check_livepush

    with override_settings(TASKS={"default": {"BACKEND": BACKEND, "OPTIONS": options}}):
        # livepush's own check: Django's URL check would import the site's task modules, whose
        # @task makes the backend, and raise there (unless an earlier test imported them).
        found = check_livepush()
    assert [m.id for m in found] == ["livepush.E002"]
    assert "TASKS['default']['OPTIONS']" in found[0].msg and named in found[0].msg


@pytest.mark.parametrize(("params", "named"), [
    ({"QUEUES": "emails"}, "TASKS['default']['QUEUES']"),
    ({"QUEUES": None}, "TASKS['default']['QUEUES']"),
    ({"OPTIONS": None}, "TASKS['default']['OPTIONS']"),
    ({"OPTIONS": ["DATABASE_URL"]}, "TASKS['default']['OPTIONS']"),
], ids=["queues-a-string", "queues-none", "options-none", "options-a-list"])
def test_queues_or_options_of_the_wrong_shape_are_an_error_naming_them(params: dict[str, Any], named: str) -> None:
    """QUEUES that is not a list of names (a string would be read as one queue per letter, which
    no task is on and no runtime serves) or OPTIONS that is not a dict: an error naming the
    setting, not a traceback from `manage.py check`."""
    from livepush.contrib.django.checks import check_livepush

    with override_settings(TASKS={"default": {"BACKEND": BACKEND, **params}}):
        found = check_livepush()
    assert [m.id for m in found] == ["livepush.E002"]
    assert named in found[0].msg


@pytest.mark.parametrize(("params", "named"), [
    ({"QUEUE": ["emails"]}, "'QUEUE'"),
    ({"OPTION": {"MAX_ATTEMPTS": 3}}, "'OPTION'"),
    ({"MAX_ATTEMPTS": 3}, "['OPTIONS']['MAX_ATTEMPTS']"),
], ids=["queue", "option", "an-option-beside-options"])
def test_an_unknown_key_of_a_backends_entry_is_an_error_naming_it(params: dict[str, Any], named: str) -> None:
    """A key of a LivePushBackend's entry in TASKS that is none of BACKEND, QUEUES and OPTIONS (a
    misspelling, an option written beside OPTIONS) is read by nothing: a misspelt QUEUES left the
    default queue alone, a misspelt OPTIONS one attempt per task. An error names the key, and for
    one of the backend's options, where it goes."""
    from livepush.contrib.django.checks import check_livepush

    with override_settings(TASKS={"default": {"BACKEND": BACKEND, **params}}):
        found = check_livepush()
    assert [m.id for m in found] == ["livepush.E002"]
    assert "TASKS['default']" in found[0].msg and named in found[0].msg, found[0].msg


@pytest.mark.parametrize(("setting", "path", "meant"), [
    ("TASKS", "livepush.contrib.django.LivepushBackend", "LivePushBackend"),
    ("MIDDLEWARE", "livepush.contrib.django.LivepushSessionMiddleware", "LivePushSessionMiddleware"),
])
def test_a_name_of_the_integration_written_in_another_case_says_the_name_meant(setting: str, path: str,
                                                                             meant: str) -> None:
    """`LivepushBackend` for `LivePushBackend` (the package is `livepush`, the classes `LivePush...`):
    Django's error says only that the module has no such attribute; the AttributeError it comes
    from names the one meant, in the traceback the user reads."""
    from django.utils.module_loading import import_string

    with pytest.raises(ImportError) as caught:
        import_string(path)
    assert isinstance(caught.value.__cause__, AttributeError)
    assert f"did you mean {meant!r}" in str(caught.value.__cause__), (setting, caught.value.__cause__)


@pytest.mark.parametrize("tasks", [{"default": BACKEND}, [{"BACKEND": BACKEND}]],
                         ids=["an-entry-that-is-the-backend-path", "a-list"])
def test_tasks_of_the_wrong_shape_is_an_error_naming_it(tasks: Any) -> None:
    """TASKS that is not a dict of dicts (the backend's path as an alias's value, a list of
    backends): Django's start (the app's ready()) and the runner raise ImproperlyConfigured
    naming TASKS, and the check reports it, instead of an AttributeError from livepush's code."""
    from livepush.contrib.django.backend import use_options_database
    from livepush.contrib.django.checks import check_livepush

    with override_settings(TASKS=tasks):
        with pytest.raises(ImproperlyConfigured, match=r"TASKS"):
            use_options_database()
        found = check_livepush()
    assert [m.id for m in found] == ["livepush.E002"]
    assert "TASKS" in found[0].msg and "BACKEND" in found[0].msg


def test_backends_naming_two_jobs_databases_are_an_error_naming_the_option(django_site: str, pg_url: str) -> None:
    """Two LivePushBackends whose OPTIONS name different DATABASE_URLs: a process has one jobs'
    database, so each backend made would switch it to its own and every enqueue would go to the
    database of the one made last. Each is reported naming DATABASE_URL, and none switches it."""
    from livepush.contrib.django.checks import check_livepush
    from livepush.jobs import database

    tasks = {"default": {"BACKEND": BACKEND, "OPTIONS": {"DATABASE_URL": django_site}},
             "reports": {"BACKEND": BACKEND, "OPTIONS": {"DATABASE_URL": pg_url}}}
    with override_settings(TASKS=tasks):
        # livepush's own check: Django's URL check would import the site's task modules, whose
        # @task makes the backend, and raise there.
        found = check_livepush()
    assert [m.id for m in found] == ["livepush.E002", "livepush.E002"]
    assert all("['OPTIONS']['DATABASE_URL']" in m.msg and "same" in m.msg for m in found), found
    assert database.configured_url() == django_site


@pytest.fixture
def sqlite_alias() -> Iterator[str]:
    """A second Django database, SQLite in memory, under the alias "lite"."""
    from django.db import connections

    configured = connections.configure_settings({**connections.settings,
                                                 "lite": {"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"}})
    connections.settings["lite"] = configured["lite"]
    try:
        yield "lite"
    finally:
        connections["lite"].close()
        del connections["lite"]
        del connections.settings["lite"]


def test_a_backend_whose_database_cannot_hold_its_jobs_is_a_warning(sqlite_alias: str) -> None:
    """OPTIONS['DATABASE'] naming a database that is not PostgreSQL: every enqueue inside its
    atomic() would raise TransactionNotSupported, so a warning says so and names the way out
    (ENQUEUE_ON_COMMIT = False), which silences it."""
    backend = {"BACKEND": BACKEND, "OPTIONS": {"DATABASE": sqlite_alias}}
    with override_settings(TASKS={"default": backend}):
        found = livepush_messages()
    assert [m.id for m in found] == ["livepush.W002"] and found[0].level == checks.WARNING
    assert "'lite'" in found[0].msg and "ENQUEUE_ON_COMMIT" in str(found[0].hint)
    backend["OPTIONS"]["ENQUEUE_ON_COMMIT"] = False
    with override_settings(TASKS={"default": backend}):
        assert livepush_messages() == []


def test_the_session_middleware_without_authentication_middleware_is_a_warning_naming_it() -> None:
    """LivePushSessionMiddleware with no AuthenticationMiddleware in MIDDLEWARE sees no
    request.user, so it never gives anyone a session and every socket comes in anonymous: a
    warning names the missing middleware. A subclass of it counts as it."""
    from django.conf import settings

    without = [m for m in settings.MIDDLEWARE if not m.endswith(".AuthenticationMiddleware")]
    with override_settings(MIDDLEWARE=without):
        found = livepush_messages()
    assert [m.id for m in found] == ["livepush.W004"]
    assert found[0].level == checks.WARNING and "AuthenticationMiddleware" in found[0].msg
    subclass = [*without, "tests.contrib.django_site_middleware.SiteAuthenticationMiddleware"]
    with override_settings(MIDDLEWARE=subclass):
        assert livepush_messages() == []


def test_the_session_middleware_before_djangos_session_middleware_is_a_warning_naming_it() -> None:
    """LivePushSessionMiddleware listed before Django's SessionMiddleware handles the response after
    that one saved the Django session: what it keeps there (the sessions sign-out revokes, the
    Domain the cookie was set with) was lost without a word, so a sign-out left the renewed
    sessions' sockets open. A warning names both; listed after it, nothing."""
    from django.conf import settings

    ours = next(m for m in settings.MIDDLEWARE if m.endswith("LivePushSessionMiddleware"))
    first = [ours, *(m for m in settings.MIDDLEWARE if m != ours)]
    with override_settings(MIDDLEWARE=first):
        found = livepush_messages()
    assert [m.id for m in found] == ["livepush.W005"]
    assert "SessionMiddleware" in found[0].msg and found[0].level == checks.WARNING
    assert livepush_messages() == []


def test_a_project_subclass_of_the_session_middleware_is_checked_as_the_middleware_is() -> None:
    """A project's own subclass of LivePushSessionMiddleware in MIDDLEWARE (one that adds to it)
    reads the same settings and needs request.user too: a setting it cannot use is an error and a
    missing AuthenticationMiddleware a warning, as for the middleware itself. The checks looked
    for the middleware's own path only, and said nothing."""
    from django.conf import settings

    own = [m if not m.endswith("LivePushSessionMiddleware") else "tests.contrib.django_site_middleware.SiteSessionMiddleware"
           for m in settings.MIDDLEWARE]
    assert own != list(settings.MIDDLEWARE)
    with override_settings(MIDDLEWARE=own, LIVEPUSH_SESSION_TTL="1 day"):
        assert [m.id for m in livepush_messages()] == ["livepush.E003"]
    without = [m for m in own if not m.endswith(".AuthenticationMiddleware")]
    with override_settings(MIDDLEWARE=without):
        assert [m.id for m in livepush_messages()] == ["livepush.W004"]


@pytest.mark.parametrize(("name", "value"), [
    ("LIVEPUSH_SESSION_TTL", "1 day"),
    ("LIVEPUSH_SESSION_TTL", 0),
    ("LIVEPUSH_SESSION_SUBJECT", "myapp.auth.subject_of"),  # a dotted path that does not import
    ("LIVEPUSH_SESSION_SUBJECT", "tests.contrib.django_subjects.NOT_A_FUNCTION"),
    ("LIVEPUSH_SESSION_SUBJECT", "subject_of"),  # no module
    # Called with the user alone: one of another shape failed every signed-in request with a TypeError.
    ("LIVEPUSH_SESSION_SUBJECT", lambda request, user: "7"),
    ("LIVEPUSH_SESSION_SUBJECT", lambda: "7"),
    # A browser drops a cookie whose Domain is not a host name: the session would never reach the server.
    ("LIVEPUSH_SESSION_COOKIE_DOMAIN", "https://example.com"),
    ("LIVEPUSH_SESSION_COOKIE_DOMAIN", "example.com:8000"),
    ("LIVEPUSH_SESSION_COOKIE_DOMAIN", "example.com/"),
    ("LIVEPUSH_SESSION_COOKIE_DOMAIN", ""),
    ("LIVEPUSH_SESSION_COOKIE_DOMAIN", ["example.com"]),
])
def test_a_session_setting_it_cannot_use_is_an_error_naming_it(name: str, value: Any) -> None:
    """With LivePushSessionMiddleware installed, a session TTL, subject or cookie domain it cannot use is
    reported naming the setting, and a web server does not start with it: Django makes the
    middleware when the server starts (WSGIHandler()), which raises ImproperlyConfigured."""
    with override_settings(**{name: value}):
        found = livepush_messages()
        with pytest.raises(ImproperlyConfigured, match=name):
            WSGIHandler()
    assert [m.id for m in found] == ["livepush.E003"] and name in found[0].msg


def test_a_subject_module_that_fails_at_import_is_an_error_naming_the_setting_path_and_exception() -> None:
    """A LIVEPUSH_SESSION_SUBJECT whose module raises something else than ImportError while it is
    imported (a NameError in the site's own code) is reported as livepush.E003 naming the setting,
    the path and the exception, not a traceback that stops `manage.py check` before any report."""
    path = "tests.contrib.django_broken_subjects.subject"
    with override_settings(LIVEPUSH_SESSION_SUBJECT=path):
        found = livepush_messages()
    assert [m.id for m in found] == ["livepush.E003"], found
    assert "LIVEPUSH_SESSION_SUBJECT" in found[0].msg and path in found[0].msg, found[0].msg
    assert "NameError: name 'SITE_PREFIX' is not defined" in found[0].msg, found[0].msg


def test_a_web_server_with_the_session_middleware_does_not_start_without_the_secret() -> None:
    """Every signed-in request needs the secret: the server's start (WSGIHandler(), as gunicorn,
    uwsgi and runserver make it) fails with ConfigError naming LIVEPUSH_SECRET, not each request."""
    with without_secret(), pytest.raises(ConfigError, match="LIVEPUSH_SECRET"):
        WSGIHandler()


def test_manage_py_check_reports_a_missing_secret(django_site: str) -> None:
    """The example site's `manage.py check` without LIVEPUSH_SECRET exits 1 naming it."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("LIVEPUSH_")}
    env.update(LIVEPUSH_DATABASE_URL=django_site, DJANGO_SETTINGS_MODULE="demo_site.settings")
    out = subprocess.run([sys.executable, "manage.py", "check"], cwd=EXAMPLE, env=env, capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 1, out.stdout + out.stderr
    assert "livepush.E001" in out.stderr and "LIVEPUSH_SECRET" in out.stderr, out.stderr


def test_a_subject_function_named_by_its_dotted_path_lets_django_start(django_site: str) -> None:
    """LIVEPUSH_SESSION_SUBJECT naming its function by dotted path, in a module that imports a
    model: `manage.py check` (Django's start) passes, where settings.py importing the function
    stopped it with AppRegistryNotReady."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("LIVEPUSH_")}
    env.update(LIVEPUSH_DATABASE_URL=django_site, LIVEPUSH_SECRET=config.get_settings().require_secret(),
               DJANGO_SETTINGS_MODULE="tests.contrib.django_settings_subject_path",
               PYTHONPATH=os.pathsep.join([str(EXAMPLE), str(EXAMPLE.parents[1])]))
    out = subprocess.run([sys.executable, "manage.py", "check"], cwd=EXAMPLE, env=env, capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0 and "livepush." not in out.stdout + out.stderr, out.stdout + out.stderr
