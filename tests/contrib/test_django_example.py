"""The example Django site's views through Django's test client (docs/frameworks.md, Example):
starting an import answers its result id and signed job topic, its result reads back, and a
result id that is no import of this site is a 404, never a server error."""

from __future__ import annotations

import importlib

import pytest
from django.test import Client

from livepush import jobs

pytestmark = pytest.mark.usefixtures("django_site")


def client() -> Client:
    return Client(raise_request_exception=False)  # an exception is answered as a browser sees it: 500


def test_a_started_import_reads_back_and_succeeds() -> None:
    """POST /start/ enqueues the import; GET /result/<id>/ reads it, READY then SUCCESSFUL."""
    started = client().post("/start/")
    assert started.status_code == 200
    result_id = started.json()["result_id"]
    assert client().get(f"/result/{result_id}/").json() == {"status": "READY", "return_value": None}
    assert jobs.drain() == {"succeeded": 1}
    assert client().get(f"/result/{result_id}/").json() == {"status": "SUCCESSFUL", "return_value": {"rows": 5}}


@pytest.mark.parametrize("result_id", ["abc", "0", "999999999", "-1"])
def test_a_result_id_that_is_no_import_is_not_found(result_id: str) -> None:
    """A mistyped or stale result id gets 404: the client's mistake, not a server error."""
    assert client().get(f"/result/{result_id}/").status_code == 404


def test_another_tasks_result_id_is_not_found() -> None:
    """The id of another task's result is no import: 404."""
    other = importlib.import_module("tests.contrib.sample_django_tasks").record.enqueue("not an import")
    assert client().get(f"/result/{other.id}/").status_code == 404


def test_the_site_without_a_database_url_says_which_to_set() -> None:
    """The example's settings need LIVEPUSH_DATABASE_URL (or DATABASE_URL): without either,
    `manage.py check` stops with ImproperlyConfigured naming it, not a KeyError."""
    import os
    import subprocess
    import sys

    from tests.contrib.conftest import EXAMPLE

    env = {k: v for k, v in os.environ.items() if not k.startswith("LIVEPUSH_") and k != "DATABASE_URL"}
    env["DJANGO_SETTINGS_MODULE"] = "demo_site.settings"
    out = subprocess.run([sys.executable, "manage.py", "check"], cwd=EXAMPLE, env=env, capture_output=True,
                         text=True, timeout=60)
    last = out.stderr.strip().splitlines()[-1]
    assert out.returncode != 0 and "ImproperlyConfigured" in last and "LIVEPUSH_DATABASE_URL" in last, out.stderr
