"""Django is optional (docs/frameworks.md): livepush, its CLI and the contrib package import in a
process where Django cannot be imported; only the Django integration's own names need it."""

from __future__ import annotations

import secrets
import subprocess
import sys

BLOCK_DJANGO = """
import sys
class NoDjango:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("django", "django_tasks"):
            raise ImportError(f"{name} is not installed here")
sys.meta_path.insert(0, NoDjango())
"""


def run(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", BLOCK_DJANGO + code], capture_output=True, text=True, timeout=60, check=False)


def test_livepush_imports_without_django() -> None:
    """livepush, its jobs, its CLI, the cookie helper and livepush.contrib.django itself import without Django."""
    done = run("import livepush, livepush.jobs, livepush.cli.commands, livepush.contrib._cookies, "
               "livepush.contrib.django; print('ok')")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"


def test_the_integrations_names_say_django_is_missing() -> None:
    """Using a name of the Django integration without Django raises ImportError naming it."""
    done = run("import livepush.contrib.django as d\ntry:\n    d.publish\nexcept ImportError as e:\n    print(e)")
    assert done.returncode == 0, done.stderr
    assert "django" in done.stdout


BLOCK_TASKS = """
import sys
class NoTasks:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] == "django_tasks" or name.startswith("django.tasks"):
            raise ImportError(f"{name} is not installed here")
sys.meta_path.insert(0, NoTasks())
"""

SITE_WITHOUT_TASKS = """
import django
from django.conf import settings
from django.core.management import call_command
settings.configure(
    INSTALLED_APPS=["django.contrib.auth", "django.contrib.contenttypes", "django.contrib.sessions",
                    "livepush.contrib.django"],
    MIDDLEWARE=["django.contrib.sessions.middleware.SessionMiddleware",
                "django.contrib.auth.middleware.AuthenticationMiddleware",
                "livepush.contrib.django.LivePushSessionMiddleware"],
    DATABASES={}, USE_TZ=True)
django.setup()
call_command("check")
print("checked")
"""


def test_a_site_without_the_tasks_framework_passes_its_checks() -> None:
    """A site that uses publish on commit, the session middleware and the template tags without
    the Tasks framework installed (no django-tasks on Django 5.2): `manage.py check` runs
    livepush's checks and finds nothing, with no ImportError."""
    env = {"LIVEPUSH_SECRET": secrets.token_urlsafe(36), "PATH": "/usr/bin:/bin",
           "LIVEPUSH_DATABASE_URL": "postgresql://app@127.0.0.1:5432/app"}  # checks connect to nothing
    done = subprocess.run([sys.executable, "-c", BLOCK_TASKS + SITE_WITHOUT_TASKS], capture_output=True, text=True,
                          timeout=60, check=False, env=env)
    assert done.returncode == 0, done.stderr
    assert "checked" in done.stdout and "livepush." not in done.stderr, done.stderr


PAGE_WITHOUT_TASKS = """
import django
from django.conf import settings
settings.configure(
    INSTALLED_APPS=["django.contrib.auth", "django.contrib.contenttypes", "livepush.contrib.django"],
    TEMPLATES=[{"BACKEND": "django.template.backends.django.DjangoTemplates", "APP_DIRS": True}],
    DATABASES={}, USE_TZ=True)
django.setup()
from django.template import engines
from livepush.contrib.django import subscription
page = engines["django"].from_string(
    '{% load livepush %}<ul {% livepush_subscription notices %}></ul> {% livepush_signed_topic "chat:7" %}')
print(page.render({"notices": subscription("notices:lobby")}))
"""


def test_a_site_without_the_tasks_framework_renders_the_template_tags() -> None:
    """The template tags and subscription() need no Tasks framework: a site without it (Django 5.2
    without django-tasks) loads `{% load livepush %}` and renders a subscription and a signed
    topic, rather than failing every page that loads the tags with InvalidTemplateLibrary."""
    env = {"LIVEPUSH_SECRET": secrets.token_urlsafe(36), "PATH": "/usr/bin:/bin", "LIVEPUSH_FANOUT": "local"}
    done = subprocess.run([sys.executable, "-c", BLOCK_TASKS + PAGE_WITHOUT_TASKS], capture_output=True, text=True,
                          timeout=60, check=False, env=env)
    assert done.returncode == 0, done.stderr
    assert 'data-livepush-topic="notices:lobby~' in done.stdout and " chat:7~" in done.stdout, done.stdout
