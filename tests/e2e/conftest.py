"""Real-browser end-to-end tests: headless Chromium driven by Playwright against `livepush serve`.

- `browser` (session)      one Chromium (Debian's /usr/bin/chromium; never a downloaded one).
- `page`                   a fresh browser context and page per test; on failure a screenshot
                           goes to artifacts/e2e/<test>.png and the page's console is printed.
- `page_server` (session)  a static HTTP server for tests/e2e/pages/ on its own port: the pages
                           live on a different origin than the push server, as in production.
- `push_server`            `livepush serve` on Postgres, allowing the page server's origin;
                           `restart()` stops it with SIGTERM and starts it again on the same
                           port (with `args`, e.g. an `--app`, if set); `publish()` and
                           `sign()` play the web app.
- `client_page`            `page` with pages/client.html loaded against `push_server`
                           (its harness is window.e2e: pages/harness.js).

Every test here runs on the session's event loop (Playwright's objects belong to the loop that
started them): test modules set `pytestmark = pytest.mark.asyncio(loop_scope="session")`.
Without Playwright or Chromium the whole folder is skipped with a message; bin/test installs
both (`bin/setup`), so in CI they run.
"""

from __future__ import annotations

import functools
import http.server
import os
import re
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from livepush import topics
from livepush.config import Settings
from tests.support.procs import ChildProcess, Processes

try:
    from playwright.async_api import Browser, BrowserContext, Page, async_playwright

    PLAYWRIGHT_ERROR: str | None = None
except ImportError as exc:  # pragma: no cover - only on a machine without the test extra
    PLAYWRIGHT_ERROR = f"the playwright package is not installed ({exc}): run bin/setup or `.venv/bin/pip install -e '.[test]'`"

E2E_DIR = Path(__file__).resolve().parent
PAGES_DIR = E2E_DIR / "pages"
ROOT = E2E_DIR.parents[1]
ARTIFACTS = ROOT / "artifacts" / "e2e"

CHROMIUM = os.environ.get("LIVEPUSH_TEST_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",  # root in a container: the sandbox cannot start
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
# A step that waits longer than this has failed; each test stays well under ~20 s.
PAGE_TIMEOUT_MS = 10_000


def _unavailable() -> str | None:
    if PLAYWRIGHT_ERROR:
        return PLAYWRIGHT_ERROR
    if not (os.path.isfile(CHROMIUM) and os.access(CHROMIUM, os.X_OK)):
        return (
            f"no Chromium at {CHROMIUM}: `apt-get install -y chromium` (bin/setup does it), or set "
            "LIVEPUSH_TEST_CHROMIUM; never `playwright install`"
        )
    return None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    reason = _unavailable()
    for item in items:
        if E2E_DIR not in Path(str(item.path)).parents:
            continue
        item.add_marker(pytest.mark.browser)
        if reason:
            item.add_marker(pytest.mark.skip(reason=f"browser tests skipped: {reason}"))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    # The `page` fixture's teardown reads this to decide on a screenshot.
    outcome = yield
    report = outcome.get_result()
    setattr(item, f"rep_{report.when}", report)


# ---- the browser --------------------------------------------------------------------------------


@pytest_asyncio.fixture(scope="session", loop_scope="session")
async def browser() -> AsyncIterator[Browser]:
    """One headless Chromium for the whole session (a launch costs ~0.5 s)."""
    async with async_playwright() as p:
        chromium = await p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, timeout=30_000)
        try:
            yield chromium
        finally:
            await chromium.close()


@pytest_asyncio.fixture(loop_scope="session")
async def page(browser: Browser, request: pytest.FixtureRequest) -> AsyncIterator[Page]:
    """A page in a context of its own (no cookies or storage shared between tests)."""
    context: BrowserContext = await browser.new_context(viewport={"width": 1000, "height": 700})
    context.set_default_timeout(PAGE_TIMEOUT_MS)
    pg = await context.new_page()
    console: list[str] = []
    pg.on("console", lambda msg: console.append(f"[{msg.type}] {msg.text}"))
    pg.on("pageerror", lambda exc: console.append(f"[pageerror] {exc}"))
    request.node._e2e_console = console
    try:
        yield pg
    finally:
        await _screenshot_if_failed(pg, request)
        await context.close()


async def _screenshot_if_failed(pg: Page, request: pytest.FixtureRequest) -> None:
    """After a failed test: artifacts/e2e/<test>.png and the browser console, once per test.

    The first fixture to tear down takes it (client_page, before the push server it depends on
    is stopped), so the picture shows the page as the test left it."""
    node = request.node
    rep = getattr(node, "rep_call", None)
    if rep is None or not rep.failed or getattr(node, "_e2e_shot", False):
        return
    node._e2e_shot = True
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    path = ARTIFACTS / f"{re.sub(r'[^A-Za-z0-9_.-]+', '_', node.name)}.png"
    try:
        await pg.screenshot(path=str(path), full_page=True, timeout=5_000)
        print(f"\nscreenshot of the failed page: {path}")
    except Exception as exc:  # the page may be what broke
        print(f"\nno screenshot ({type(exc).__name__}: {exc})")
    console = getattr(node, "_e2e_console", [])
    if console:
        print("browser console:\n  " + "\n  ".join(console[-50:]))


# ---- the pages' own origin ----------------------------------------------------------------------


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        pass

    def end_headers(self) -> None:
        self.send_header("Cache-Control", "no-store")
        super().end_headers()


@dataclass
class PageServer:
    port: int

    @property
    def origin(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def url(self, page: str, push_http: str) -> str:
        return f"{self.origin}/{page}?ws={push_http}"


@pytest.fixture(scope="session")
def page_server() -> Iterator[PageServer]:
    """tests/e2e/pages/ over HTTP on 127.0.0.1:<free port>, in a thread, for the session."""
    handler = functools.partial(_QuietHandler, directory=str(PAGES_DIR))
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    httpd.daemon_threads = True
    thread = threading.Thread(target=httpd.serve_forever, name="e2e-page-server", daemon=True)
    thread.start()
    try:
        yield PageServer(httpd.server_address[1])
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join(5)


# ---- the push server ----------------------------------------------------------------------------


@dataclass
class PushServer:
    """`livepush serve` in a child process, plus this test process playing the web app."""

    procs: Processes
    env: dict[str, str]
    # `serve`'s arguments, e.g. ("--app", "tests.support.security_app:app") for topic rules;
    # a test that sets them restarts the server.
    args: tuple[str, ...] = ()
    child: ChildProcess | None = None
    restarts: list[dict[str, float]] = field(default_factory=list)
    _fanout: Any = None

    @property
    def port(self) -> int:
        return int(self.env["LIVEPUSH_PORT"])

    @property
    def http_base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def settings(self) -> Settings:
        return Settings.from_env(self.env)

    async def start(self) -> ChildProcess:
        self.child = await self.procs.alivepush("serve", *self.args, env=self.env)
        return self.child

    async def stop(self) -> int:
        """SIGTERM (connections close with 1001); the exit status, which must be 0."""
        assert self.child is not None
        self.child.terminate()
        code = await self.child.await_exit(10)
        assert code == 0, f"livepush serve exited with {code} on SIGTERM\n{self.child.output()}"
        return code

    async def restart(self, between: Callable[[], Any] | None = None) -> None:
        """Stop with SIGTERM and start a new process on the same port, waiting until healthy."""
        t0 = time.monotonic()
        await self.stop()
        t1 = time.monotonic()
        if between is not None:
            result = between()
            if hasattr(result, "__await__"):
                await result
        await self.start()
        t2 = time.monotonic()
        self.restarts.append({"stop_s": t1 - t0, "down_s": t2 - t1})

    def sign(self, topic: str) -> str:
        return topics.sign(topic, self.settings.secrets)

    async def publish(self, topic: str, data: Any) -> str:
        """Publish through Postgres, as a web process would (no server needed)."""
        if self._fanout is None:
            from livepush.fanout.postgres import PostgresFanOut

            self._fanout = PostgresFanOut(self.env["LIVEPUSH_DATABASE_URL"])
        return await self._fanout.apublish(topic, data)

    async def aclose(self) -> None:
        if self._fanout is not None:
            await self._fanout.aclose()
            self._fanout = None


@pytest_asyncio.fixture(loop_scope="session")
async def push_server(
    pg_url: str, livepush_env: Callable[..., dict[str, str]], procs: Processes, page_server: PageServer
) -> AsyncIterator[PushServer]:
    """A running `livepush serve` (Postgres fan-out) that accepts the page server's origin."""
    server = PushServer(procs, livepush_env(database_url=pg_url, allowed_origins=page_server.origin))
    await server.start()
    try:
        yield server
    finally:
        await server.aclose()


@pytest_asyncio.fixture(loop_scope="session")
async def client_page(
    page: Page, page_server: PageServer, push_server: PushServer, request: pytest.FixtureRequest
) -> AsyncIterator[Page]:
    """`page` with pages/client.html loaded against `push_server`, its harness (window.e2e) ready."""
    await page.goto(page_server.url("client.html", push_server.http_base))
    await page.wait_for_function("window.e2eReady === true")
    yield page
    await _screenshot_if_failed(page, request)
