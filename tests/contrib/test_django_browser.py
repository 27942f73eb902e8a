"""The example Django site in real Chromium (docs/frameworks.md, Django): the page starts a
Django task, `livepush jobs livepush.contrib.django.runner` runs it, and its progress reaches the
page live, up to 100 %, through `livepush serve`; the notice published on commit arrives too."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from livepush.config import get_settings
from tests.contrib.conftest import EXAMPLE, ROOT
from tests.support.procs import Processes, free_port
from tests.support.waiting import wait_for

try:
    from playwright.sync_api import sync_playwright

    PLAYWRIGHT_ERROR: str | None = None
except ImportError as exc:  # pragma: no cover - only on a machine without the test extra
    PLAYWRIGHT_ERROR = f"the playwright package is not installed ({exc})"

CHROMIUM = os.environ.get("LIVEPUSH_TEST_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(PLAYWRIGHT_ERROR is not None or not os.access(CHROMIUM, os.X_OK),
                       reason=f"browser test skipped: {PLAYWRIGHT_ERROR or f'no Chromium at {CHROMIUM}'}"),
    pytest.mark.usefixtures("django_site"),
]


def http_ok(port: int) -> bool:
    import urllib.request

    with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=1) as response:
        return response.status == 200


def test_the_page_starts_a_task_and_shows_its_progress_live_up_to_100_percent(
    django_db_url: str, livepush_env: Callable[..., dict[str, str]], procs: Processes, tmp_path: Path
) -> None:
    """Clicking Start enqueues the task; the bar fills as it reports each step and ends succeeded at 100 %."""
    site_port, push_port = free_port(), free_port()
    env = livepush_env(database_url=django_db_url, secret=get_settings().secret, port=push_port,
                       allowed_origins=f"http://127.0.0.1:{site_port}",
                       extra={"DJANGO_SETTINGS_MODULE": "demo_site.settings",
                              "PYTHONPATH": os.pathsep.join([str(EXAMPLE), str(ROOT)]),
                              "LIVEPUSH_PUBLIC_URL": f"ws://127.0.0.1:{push_port}/"})
    procs.livepush("serve", env=env)
    runtime = procs.livepush("jobs", "livepush.contrib.django.runner", "--queues", "default,second", env=env)
    site = procs.start([sys.executable, "manage.py", "runserver", "--noreload", f"127.0.0.1:{site_port}"],
                       env=env, cwd=EXAMPLE, name="django runserver")
    wait_for(lambda: http_ok(site_port), timeout=20, interval=0.1, ignore=(OSError,),
             message=f"the Django site to answer; its output: {site.output()}")

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, timeout=30_000)
        try:
            page = browser.new_page(viewport={"width": 900, "height": 600})
            page.set_default_timeout(15_000)
            page.goto(f"http://127.0.0.1:{site_port}/")
            page.click("#start")
            # Live: a step between the first and the last is shown while the task runs.
            page.wait_for_function("() => /^([1-9][0-9]?)%$/.test(document.querySelector('#percent').textContent)")
            page.wait_for_selector("#job[data-state='succeeded']")
            bar = page.locator("#job progress")
            assert bar.get_attribute("value") == bar.get_attribute("max") == "5"
            assert page.text_content("#percent") == "100%"
            assert "row 5 of 5" in page.text_content("#job .livepush-progress-text")
            page.wait_for_selector("#notices li")
            assert page.text_content("#notices li").startswith("import ")
            page.screenshot(path=str(tmp_path / "django_progress.png"), full_page=True)
        finally:
            browser.close()
    assert runtime.running, runtime.output()
