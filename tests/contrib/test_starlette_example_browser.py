"""The FastAPI example in real headless Chromium (docs/frameworks.md#starlette-and-fastapi): uvicorn
serves examples/fastapi_app, `livepush serve --with-jobs examples.fastapi_app.tasks` runs the
WebSocket server and the job runtime beside it, as the docs say to run them. The user signs in (the
app sets the session cookie, which the socket's handshake carries), starts a report, and the page
shows its progress live up to 5/5 and succeeded, then the notice the job left on the user's topic.
Signing out closes the socket with 4403. uvicorn stops cleanly on SIGTERM (the lifespan closes its
pools). A screenshot goes to artifacts/ for a person to look at."""

from __future__ import annotations

import signal
import sys
from collections.abc import Callable

import pytest

from tests.e2e.conftest import ARTIFACTS, CHROMIUM, CHROMIUM_ARGS, PAGE_TIMEOUT_MS, _unavailable
from tests.support.procs import Processes, free_port

pytestmark = pytest.mark.browser
UNAVAILABLE = _unavailable()
STEPS = 5
# 5 steps of 0.4 s each, plus a claim: past this the report is stuck, not slow.
REPORT_TIMEOUT_MS = 20_000


@pytest.mark.skipif(UNAVAILABLE is not None, reason=f"browser tests skipped: {UNAVAILABLE}")
async def test_the_page_starts_a_report_and_shows_it_to_100_percent(
    pg_url: str, livepush_env: Callable[..., dict[str, str]], procs: Processes
) -> None:
    """Sign in, start a report of 5 steps: the bar reaches 5/5, the job succeeded, the notice arrives."""
    from playwright.async_api import async_playwright

    push_port = free_port()
    app_port = free_port()
    app = procs.start([sys.executable, "-m", "uvicorn", "examples.fastapi_app.app:app", "--host", "127.0.0.1",
                       "--port", str(app_port)], env=livepush_env(database_url=pg_url, port=push_port),
                      port=app_port, name="uvicorn examples.fastapi_app")
    await procs.alivepush("serve", "--with-jobs", "examples.fastapi_app.tasks",
                          env=livepush_env(database_url=pg_url, port=push_port,
                                           allowed_origins=f"http://127.0.0.1:{app_port}"))
    await app.await_healthy(path="/")

    async with async_playwright() as p:
        browser = await p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, timeout=30_000)
        try:
            context = await browser.new_context(viewport={"width": 900, "height": 620})
            context.set_default_timeout(PAGE_TIMEOUT_MS)
            page = await context.new_page()
            console: list[str] = []
            page.on("console", lambda msg: console.append(f"[{msg.type}] {msg.text}"))
            page.on("pageerror", lambda exc: console.append(f"[pageerror] {exc}"))
            try:
                await page.goto(f"http://127.0.0.1:{app_port}/")
                await page.fill("#name", "ana")
                await page.click("#login button")
                await page.wait_for_function("() => window.example && window.example.lp && "
                                             "window.example.lp.status === 'open'")
                assert await page.evaluate("() => window.example.lp.session") == {"subject": "ana"}

                await page.fill("#steps", str(STEPS))
                await page.click("#start")
                await page.wait_for_function("() => window.example.finished !== null", timeout=REPORT_TIMEOUT_MS)
                view = await page.evaluate("""() => {
                    const el = document.querySelector('#progress');
                    const bar = el.querySelector('progress');
                    return {state: el.dataset.state, value: bar.value, max: bar.max,
                            text: el.querySelector('.livepush-progress-text').textContent,
                            finished: window.example.finished};
                }""")
                assert view["finished"] == "succeeded" and view["state"] == "succeeded", view
                assert view["value"] == view["max"] == STEPS, view
                assert view["text"].startswith(f"{STEPS}/{STEPS} · succeeded"), view
                await page.wait_for_function("() => window.example.notices.length === 1")
                assert (await page.inner_text("#notices")).strip().endswith("is ready")
                ARTIFACTS.mkdir(parents=True, exist_ok=True)
                shot = ARTIFACTS / "starlette_example.png"
                await page.screenshot(path=str(shot), full_page=True)
                print(f"\nscreenshot of the example page: {shot}")

                # Signing out revokes the session: the server closes the socket with 4403 and the
                # client stops; the page reloads to the sign-in form.
                closed = page.wait_for_function("() => window.example.lp.status === 'unauthorized'")
                await page.evaluate("() => fetch('/logout', {method: 'POST'})")
                await closed
            except BaseException:
                print("browser console:\n  " + "\n  ".join(console[-50:]))
                raise
        finally:
            await browser.close()

    # uvicorn ends by raising the signal it caught again, once its shutdown completed.
    app.terminate()
    assert await app.await_exit(10) in (0, -signal.SIGTERM), app.output()
    assert "Application shutdown complete." in app.stderr(), app.output()
    assert "Traceback" not in app.stderr(), app.output()
