"""`livepush demo` in real headless Chromium: the page starts an import (a task group of
jobs run by the demo's own job runtime) and shows it live to 100 %, with and without a restart of
the demo process in the middle; a durable import, one job the page shows parked for its
children, then for an approval its Approve button sends, then succeeded with its result; and a
workflow run drawn as a graph of its steps, approved, paused and resumed from the page.

The demo runs as a child process on the test's Postgres (so no embedded Postgres starts) and
serves its page, /livepush.js and the WebSocket on one port: the page is same-origin, as a user
who runs `livepush demo` sees it. At the end of each import the page is saved as a screenshot
(artifacts/, not committed), pass or fail, so a person can look at what the test saw.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
import pytest
import pytest_asyncio
from playwright.async_api import Page

from tests.e2e.conftest import ROOT
from tests.support.procs import ChildProcess, Processes
from tests.support.waiting import async_wait_for

pytestmark = pytest.mark.asyncio(loop_scope="session")

ROWS = 100
# The demo's on_finish callback, by its registered name (module + function).
FINISH_CALLBACK = "livepush.demo.jobs.import_finished"
DURABLE_JOB = "livepush.demo.jobs.import_file"  # the durable import's own job
# An import of 100 at concurrency 10 takes ~5-10 s; a restart adds a drain (< ~1.5 s, the
# longest demo job) and a start. Past this the import is stuck, not slow.
IMPORT_TIMEOUT_MS = 30_000
# Drain: the runtime finishes the jobs in hand (each at most ~1.2 s), then the process exits.
DRAIN_TIMEOUT_S = 15.0
SCREENSHOTS = ROOT / "artifacts"


@dataclass
class Demo:
    """`livepush demo` in a child process; `restart()` keeps the port, the database and the secret."""

    procs: Processes
    env: dict[str, str]
    child: ChildProcess | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.env['LIVEPUSH_PORT']}/"

    @property
    def database_url(self) -> str:
        return self.env["LIVEPUSH_DATABASE_URL"]

    async def start(self) -> None:
        self.child = await self.procs.alivepush("demo", env=self.env, wait_healthy=True)

    async def stop(self) -> int:
        """SIGTERM: the demo drains (finishes the jobs in hand) and must exit 0."""
        assert self.child is not None
        self.child.terminate()
        code = await self.child.await_exit(DRAIN_TIMEOUT_S)
        assert code == 0, f"livepush demo exited with {code} on SIGTERM\n{self.child.output()}"
        return code


@pytest_asyncio.fixture(loop_scope="session")
async def demo(pg_url: str, livepush_env: Callable[..., dict[str, str]], procs: Processes) -> AsyncIterator[Demo]:
    """A running `livepush demo` on this test's database (already migrated; demo migrates again, harmlessly)."""
    server = Demo(procs, livepush_env(database_url=pg_url))
    await server.start()
    yield server
    # procs' teardown kills whatever is still running.


async def open_demo(page: Page, demo: Demo) -> None:
    await page.goto(demo.url)
    await page.wait_for_function("() => window.livepushDemo && window.livepushDemo.lp.status === 'open'")
    assert await page.get_attribute("#status", "data-status") == "open"


async def start_import(page: Page, rows: int) -> int:
    """Types `rows` into the page and clicks start; returns the group's id once the page follows it."""
    await page.fill("#n", str(rows))
    await page.click("#start")
    await page.wait_for_function("() => window.livepushDemo.group !== null")
    return int(await page.evaluate("() => window.livepushDemo.group"))


async def group_bar(page: Page) -> dict[str, Any]:
    return await page.evaluate(
        """() => {
          const el = document.querySelector('#group');
          const bar = el.querySelector('progress.livepush-progress-bar');
          const text = el.querySelector('.livepush-progress-text');
          return {
            state: el.dataset.state ?? null,
            text: text ? text.textContent : null,
            value: bar && bar.hasAttribute('value') ? bar.value : null,
            max: bar ? bar.max : null,
          };
        }"""
    )


async def screenshot(page: Page, name: str) -> Path:
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    path = SCREENSHOTS / name
    await page.screenshot(path=str(path), full_page=True, timeout=5_000)
    print(f"\nscreenshot of the demo page: {path}")
    return path


async def assert_page_shows_finished(page: Page, rows: int) -> None:
    view = await group_bar(page)
    assert view["state"] == "finished", view
    assert await page.locator("#group[data-state=finished]").count() == 1
    assert view["text"].startswith(f"{rows}/{rows} · finished"), view
    assert view["max"] == rows and view["value"] == rows, view


def _query(url: str, sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    with psycopg.connect(url, autocommit=True) as conn:
        return conn.execute(sql, params).fetchall()  # type: ignore[arg-type]


async def query(url: str, sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    return await asyncio.to_thread(_query, url, sql, params)


async def assert_database_counts(url: str, group_id: int, rows: int) -> None:
    """Every member succeeded and was counted once; the group finished; one on_finish callback job."""
    members = dict(await query(url, "SELECT state, count(*) FROM livepush_jobs WHERE group_id = %s GROUP BY state",
                               (group_id,)))
    assert members == {"succeeded": rows}, members

    # The group's counters, summed over its shards, against what the members' rows say: a member
    # counted twice (e.g. once before and once after the restart) would show up here.
    (state, total, finished_at, pending, succeeded, failed, cancelled), = await query(
        url,
        """SELECT g.state, g.total, g.finished_at, sum(s.pending), sum(s.succeeded), sum(s.failed), sum(s.cancelled)
           FROM livepush_groups g JOIN livepush_group_shards s ON s.group_id = g.id
           WHERE g.id = %s GROUP BY g.id""",
        (group_id,),
    )
    counts = {"state": state, "total": total, "pending": pending, "succeeded": succeeded, "failed": failed,
              "cancelled": cancelled}
    assert counts == {"state": "finished", "total": rows, "pending": 0, "succeeded": rows, "failed": 0,
                      "cancelled": 0}, counts
    assert finished_at is not None

    callbacks = await query(url, "SELECT callback_of, state FROM livepush_jobs WHERE name = %s", (FINISH_CALLBACK,))
    assert len(callbacks) == 1 and callbacks[0][0] == group_id, callbacks
    kinds = await query(url, "SELECT kind FROM livepush_group_callbacks WHERE group_id = %s", (group_id,))
    assert kinds == [("finish",)], kinds

    # The callback runs after the group's final event; it is done within a moment.
    async def callback_succeeded() -> bool:
        rows = await query(url, "SELECT state FROM livepush_jobs WHERE name = %s", (FINISH_CALLBACK,))
        return rows[0][0] == "succeeded"

    await async_wait_for(callback_succeeded, 10, 0.05, message="the on_finish callback job to succeed")


async def test_demo_import_of_100_reaches_100_percent(page: Page, demo: Demo) -> None:
    """The demo page's import of 100 rows shows its group's bar at 100/100 and finished, and the database agrees: 100 succeeded members, one on_finish callback."""
    t0 = time.monotonic()
    await open_demo(page, demo)
    group_id = await start_import(page, ROWS)
    try:
        await page.wait_for_function("() => window.livepushDemo.finished === true", timeout=IMPORT_TIMEOUT_MS)
        took = time.monotonic() - t0
        await assert_page_shows_finished(page, ROWS)
    finally:
        await screenshot(page, "demo-import.png")
    print(f"import of {ROWS}: finished on the page {took:.1f} s after opening it")

    await assert_database_counts(demo.database_url, group_id, ROWS)
    assert await page.get_attribute("#status", "data-status") == "open"


async def test_the_demo_job_bars_keep_one_binding_each_however_many_jobs_they_followed(page: Page, demo: Demo) -> None:
    """Each of the five job bars follows one job after another: the page holds one binding per bar, not one per job it ever followed."""
    await open_demo(page, demo)
    await start_import(page, ROWS)
    await page.wait_for_function("() => window.livepushDemo.finished === true", timeout=IMPORT_TIMEOUT_MS)
    bars = await page.evaluate(
        "() => window.livepushDemo.jobBindings.map((b) => b && b.topic.split('~')[0])")
    assert len(bars) == 5, f"{len(bars)} bindings kept for 5 bars"
    assert all(bar is not None and bar.startswith("job:") for bar in bars), bars


async def test_demo_import_survives_a_restart_of_the_demo_process(page: Page, demo: Demo) -> None:
    """The demo process restarted (SIGTERM, drain, exit 0, start again) mid-import: the page goes `reconnecting` then `open` by itself and still ends at 100/100 finished, every member counted once, one callback."""
    t0 = time.monotonic()
    await open_demo(page, demo)
    # What the page shows as its connection status, in order (the element the user looks at).
    await page.evaluate(
        """() => {
          const el = document.querySelector('#status');
          window.shownStatuses = [el.dataset.status];
          new MutationObserver(() => window.shownStatuses.push(el.dataset.status))
            .observe(el, { attributes: true, attributeFilter: ['data-status'] });
        }"""
    )
    group_id = await start_import(page, ROWS)
    # Every value the group's bar shows: a member counted twice, or a replay after the
    # reconnect going back in time, would show as a count that falls or passes the total.
    await page.evaluate(
        """() => {
          const group = document.querySelector('#group');
          window.shownDone = [];
          new MutationObserver(() => {
            const bar = group.querySelector('progress.livepush-progress-bar');
            if (bar && bar.hasAttribute('value')) window.shownDone.push(Number(bar.getAttribute('value')));
          }).observe(group, { attributes: true, subtree: true, attributeFilter: ['value'] });
        }"""
    )

    # Some progress, but far from the end: the restart lands in the middle of the import.
    await page.wait_for_function(
        """() => {
          const bar = document.querySelector('#group progress.livepush-progress-bar');
          return bar && bar.hasAttribute('value') && bar.value >= 10;
        }""",
        timeout=IMPORT_TIMEOUT_MS,
    )
    before = await group_bar(page)
    assert before["state"] != "finished" and before["value"] < ROWS, f"the import ended before the restart: {before}"

    t_stop = time.monotonic()
    await demo.stop()
    t_down = time.monotonic()
    at_stop = await group_bar(page)
    await demo.start()
    t_up = time.monotonic()

    try:
        await page.wait_for_function("() => window.livepushDemo.finished === true", timeout=IMPORT_TIMEOUT_MS)
        took = time.monotonic() - t0
        await assert_page_shows_finished(page, ROWS)
    finally:
        await screenshot(page, "demo-import-restart.png")
    print(
        f"restart mid-import: {before['value']}/{ROWS} shown when stopping, {at_stop['value']}/{ROWS} after the drain;"
        f" drain + exit {t_down - t_stop:.1f} s, start {t_up - t_down:.1f} s; finished on the page {took:.1f} s"
        " after opening it"
    )

    shown: list[str] = await page.evaluate("() => window.shownStatuses")
    print(f"statuses shown: {shown}")
    assert "reconnecting" in shown, shown
    assert "open" in shown[shown.index("reconnecting"):], shown
    assert shown[-1] == "open" and await page.get_attribute("#status", "data-status") == "open", shown

    done: list[int] = await page.evaluate("() => window.shownDone")
    assert done and done[-1] == ROWS, done
    assert all(a <= b for a, b in zip(done, done[1:])) and max(done) <= ROWS, f"the bar went back or past {ROWS}: {done}"

    await assert_database_counts(demo.database_url, group_id, ROWS)
    # The drain finished the jobs in hand instead of abandoning them: no member needed a retry.
    (retried,), = await query(demo.database_url, "SELECT count(*) FROM livepush_jobs WHERE group_id = %s AND attempt > 1",
                              (group_id,))
    assert retried == 0, f"{retried} members ran twice"


def _request(url: str, method: str, headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], bytes]:
    import urllib.error
    import urllib.request

    req = urllib.request.Request(url, method=method, headers=headers or {}, data=b"" if method == "POST" else None)
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, dict(resp.headers), resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers), exc.read()


async def test_the_demo_starts_work_only_on_a_same_origin_post(demo: Demo) -> None:
    """A GET of /demo/start gets 405 and a cross-site POST 403, and neither enqueues anything; the page's own POST starts an import."""
    start = f"{demo.url}demo/start?n=2"
    origin = demo.url.rstrip("/")
    got = [
        await asyncio.to_thread(_request, start, "GET"),
        await asyncio.to_thread(_request, start, "POST", {"Origin": "https://evil.example"}),
        await asyncio.to_thread(_request, start, "POST", {"Origin": origin, "Sec-Fetch-Site": "cross-site"}),
    ]
    assert [status for status, _, _ in got] == [405, 403, 403], got
    assert await query(demo.database_url, "SELECT count(*) FROM livepush_jobs") == [(0,)]
    status, _, body = await asyncio.to_thread(_request, start, "POST", {"Origin": origin, "Sec-Fetch-Site": "same-origin"})
    assert status == 200 and b'"group_id"' in body, (status, body)


async def test_the_demo_page_has_a_strict_content_security_policy(demo: Demo) -> None:
    """The page and its script come with a CSP that allows only its own files and its own WebSocket server."""
    status, headers, _ = await asyncio.to_thread(_request, demo.url, "GET")
    policy = headers.get("Content-Security-Policy", "")
    assert status == 200
    assert "default-src 'none'" in policy and "script-src 'self'" in policy and "frame-ancestors 'none'" in policy
    assert "unsafe-inline" not in policy and "unsafe-eval" not in policy
    host = demo.url.split("//", 1)[1].rstrip("/")
    assert f"ws://{host}" in policy, policy
    status, headers, body = await asyncio.to_thread(_request, f"{demo.url}demo/page.js", "GET")
    assert status == 200 and headers.get("Content-Type", "").startswith("text/javascript") and b"LivePush" in body


async def test_the_demo_warns_when_it_listens_beyond_this_machine(
    pg_url: str, livepush_env: Callable[..., dict[str, str]], procs: Processes
) -> None:
    """`livepush demo` bound to 0.0.0.0 says on stderr that anyone who can reach it can start imports,
    and prints a URL a browser opens (this machine's own address, not 0.0.0.0)."""
    child = await procs.alivepush("demo", env=livepush_env(database_url=pg_url, host="0.0.0.0"), wait_healthy=True)
    assert "not only on this machine" in child.stderr(), child.output()
    await async_wait_for(lambda: "livepush demo: open" in child.output(), 30, message="the demo's URL")
    [line] = [line for line in child.output().splitlines() if "livepush demo: open" in line]
    assert "open http://127.0.0.1:" in line, line



@pytest.mark.parametrize("setting", [{"allowed_origins": "http://localhost:8000"}, {"authenticate": "required"}],
                         ids=["allowed-origins", "authenticate-required"])
async def test_the_demo_page_connects_whatever_the_environment_says_about_origins_and_sessions(
    page: Page, pg_url: str, livepush_env: Callable[..., dict[str, str]], procs: Processes, setting: dict[str, str]
) -> None:
    """LIVEPUSH_ALLOWED_ORIGINS or LIVEPUSH_AUTHENTICATE=required exported for the user's own app
    does not keep the demo's page (anonymous, on the demo's own origin) from connecting: the demo
    says on stderr that it ignores the setting, and the page's import runs to the end."""
    demo = Demo(procs, livepush_env(database_url=pg_url, **setting))
    await demo.start()
    await open_demo(page, demo)
    await start_import(page, 3)
    await page.wait_for_function("() => window.livepushDemo.finished === true", timeout=IMPORT_TIMEOUT_MS)
    await assert_page_shows_finished(page, 3)
    assert demo.child is not None
    assert f"ignores LIVEPUSH_{next(iter(setting)).upper()}" in demo.child.stderr(), demo.child.output()


async def press_each_start_while_the_demo_is_down(page: Page, demo: Demo) -> None:
    """Stops the demo, presses each Start button and sees its line say that the demo did not
    answer, then starts the demo again and waits for the page to reconnect."""
    await demo.stop()
    for button, note in [("#start", "#started"), ("#durable-start", "#durable-started"),
                         ("#workflow-start", "#workflow-started")]:
        await page.click(button)
        await page.wait_for_function("(note) => document.querySelector(note).textContent.includes('did not answer')",
                                     arg=note)
    await demo.start()
    await page.wait_for_function("() => window.livepushDemo.lp.status === 'open'", timeout=IMPORT_TIMEOUT_MS)


async def test_a_start_pressed_while_the_demo_is_down_says_so_and_works_once_it_is_back(page: Page, demo: Demo) -> None:
    """Each Start button pressed while the demo process is stopped says on the page that the
    demo did not answer, instead of doing nothing; pressed again once the demo is back, the
    import starts and finishes."""
    await open_demo(page, demo)
    await press_each_start_while_the_demo_is_down(page, demo)
    await start_import(page, 3)
    await page.wait_for_function("() => window.livepushDemo.finished === true", timeout=IMPORT_TIMEOUT_MS)
    await assert_page_shows_finished(page, 3)


async def test_an_error_a_button_showed_while_the_demo_was_down_gives_way_once_the_page_reconnects(
        page: Page, demo: Demo) -> None:
    """Each section's label ("import N: ...") that a Start pressed while the demo was stopped
    replaced with "did not answer" comes back once the demo is back and the page has reconnected,
    with no other click: the error no longer holds, and the label says what the section follows."""
    await open_demo(page, demo)
    labels: dict[str, str | None] = {}
    for field, button, note, shown in [("#n", "#start", "#started", "import "),
                                       ("#durable-n", "#durable-start", "#durable-started", "job "),
                                       ("#workflow-n", "#workflow-start", "#workflow-started", "run ")]:
        await page.fill(field, "1")
        await page.click(button)
        await page.wait_for_function("([note, shown]) => document.querySelector(note).textContent.startsWith(shown)",
                                     arg=[note, shown])
        labels[note] = await page.text_content(note)
    await press_each_start_while_the_demo_is_down(page, demo)
    await page.wait_for_function(
        "(labels) => Object.entries(labels).every(([note, label]) => document.querySelector(note).textContent === label)",
        arg=labels)


async def test_an_import_cancelled_on_the_demo_page_stops_and_shows_cancelled(page: Page, demo: Demo) -> None:
    """Cancel import pressed while the import runs: its queued jobs never run, the group's bar
    ends cancelled, and the button goes back to disabled. The endpoint cancels only an import the
    page started (a durable import's children, another's group: 404) and refuses a finished one (409)."""
    await open_demo(page, demo)
    assert await page.is_disabled("#cancel")  # nothing to cancel yet
    group_id = await start_import(page, 300)
    await page.wait_for_function("() => document.querySelector('#group progress.livepush-progress-bar')?.value > 0",
                                 timeout=IMPORT_TIMEOUT_MS)
    await page.click("#cancel")
    await page.wait_for_function("() => window.livepushDemo.finished === true", timeout=IMPORT_TIMEOUT_MS)
    await screenshot(page, "demo-import-cancelled.png")
    view = await group_bar(page)
    assert view["state"] == "cancelled", view
    assert await page.is_disabled("#cancel")
    members = dict(await query(demo.database_url, "SELECT state, count(*) FROM livepush_jobs WHERE group_id = %s "
                               "GROUP BY state", (group_id,)))
    assert set(members) <= {"succeeded", "cancelled"} and members.get("cancelled", 0) > 0, members

    def cancel(group: str, method: str = "POST", site: str = "same-origin") -> int:
        headers = {"Origin": demo.url.rstrip("/"), "Sec-Fetch-Site": site}
        return _request(f"{demo.url}demo/cancel?group={group}", method, headers)[0]

    status, _, body = await asyncio.to_thread(_request, f"{demo.url}demo/durable/start?n=1", "POST", FROM_PAGE)
    durable_job = json.loads(body)["job_id"]

    async def children_group() -> int | None:
        rows = await query(demo.database_url, "SELECT group_id FROM livepush_jobs WHERE name = %s AND group_id "
                           "IS NOT NULL AND group_id <> %s", (CHILD_JOB, group_id))
        return rows[0][0] if rows else None

    children = await async_wait_for(children_group, 10, message=f"durable import {durable_job}'s children")
    refused = await asyncio.gather(*[asyncio.to_thread(cancel, *args) for args in [
        (str(group_id),), (str(group_id), "GET"), (str(group_id), "POST", "cross-site"), ("abc",),
        (str(children),), (str(group_id + 1000),)]])
    assert refused == [409, 405, 403, 400, 404, 404], refused


# Each section's Start: its rows field, its button, the line that says what it follows, and how
# that line begins once it follows what the button started.
START_BUTTONS = [("#n", "#start", "#started", "import "),
                 ("#durable-n", "#durable-start", "#durable-started", "job "),
                 ("#workflow-n", "#workflow-start", "#workflow-started", "run ")]


def start_requests(page: Page, demo: Demo) -> list[str]:
    """The Start requests the page sends from now on, as paths ("demo/start"), filled as they go."""
    starts: list[str] = []
    page.on("request", lambda request: starts.append(request.url.split("?")[0].removeprefix(demo.url))
            if request.method == "POST" and request.url.split("?")[0].endswith("/start") else None)
    return starts


async def followed_and_usable(page: Page, note: str, shown: str, button: str) -> None:
    """Wait until the section follows what its button started and the button is usable again."""
    await page.wait_for_function(
        "([note, shown, button]) => document.querySelector(note).textContent.startsWith(shown)"
        " && !document.querySelector(button).disabled", arg=[note, shown, button])


async def test_a_double_clicks_second_click_after_the_answer_starts_nothing(page: Page, demo: Demo) -> None:
    """A demo on the same machine can answer a Start before a double-click's second click comes,
    when the button is usable again: that click (its `detail` is 2) starts nothing either."""
    starts = start_requests(page, demo)
    await open_demo(page, demo)
    for field, button, note, shown in START_BUTTONS:
        await page.fill(field, "1")
        await page.click(button)
        await followed_and_usable(page, note, shown, button)
        # The second click of the double-click, come after the answer, as Chromium sends it: a
        # click that starts something disables its button before it returns, so this one did not.
        disabled = await page.eval_on_selector(
            button, "b => { b.dispatchEvent(new MouseEvent('click', {bubbles: true, detail: 2})); return b.disabled; }")
        assert not disabled, f"the second click of a double-click on {button} sent a request"
    assert starts == ["demo/start", "demo/durable/start", "demo/workflow/start"], starts


async def test_a_double_click_on_a_start_button_starts_one_import(page: Page, demo: Demo) -> None:
    """Each Start button double-clicked sends one request and starts one import, the one the
    page follows: a second would run unseen (a durable import or a workflow run then waiting an
    hour for an Approve the page never shows)."""
    starts = start_requests(page, demo)
    await open_demo(page, demo)
    for field, button, note, shown in START_BUTTONS:
        await page.fill(field, "1")
        await page.dblclick(button)
        # Followed, and the button usable again: its clicks have done all they do.
        await followed_and_usable(page, note, shown, button)
    assert starts == ["demo/start", "demo/durable/start", "demo/workflow/start"], starts
    imports = await query(demo.database_url, "SELECT count(*) FROM livepush_groups WHERE on_finish->>'name' = %s",
                          (FINISH_CALLBACK,))
    durables = await query(demo.database_url, "SELECT count(*) FROM livepush_jobs WHERE name = %s", (DURABLE_JOB,))
    runs = await query(demo.database_url, "SELECT count(*) FROM livepush_workflows")
    assert (imports, durables, runs) == ([(1,)], [(1,)], [(1,)]), (imports, durables, runs)

# ---- the durable import -------------------------------------------------------------------------

DURABLE_ROWS = 8
CHILD_JOB = "livepush.demo.jobs.import_row"  # each row of a durable import is one of these
# Download (~1 s), eight children at once (~1-2 s), the report (~0.3 s): past this it is stuck.
DURABLE_TIMEOUT_MS = 20_000


async def start_durable_import(page: Page, rows: int) -> int:
    """Types `rows` into the durable import's field and clicks its start; returns the job's id."""
    await page.fill("#durable-n", str(rows))
    await page.click("#durable-start")
    await page.wait_for_function("() => window.livepushDemo.durable !== null")
    return int(await page.evaluate("() => window.livepushDemo.durable.job"))


async def durable_view(page: Page) -> dict[str, Any]:
    """What the durable import's part of the page shows: the job's state, each step's status, the note."""
    return await page.evaluate(
        """() => ({
          state: document.querySelector('#durable').dataset.state,
          steps: [...document.querySelectorAll('#durable-steps li')].map((li) => li.dataset.status),
          note: document.querySelector('#durable-note').textContent,
          approve: !document.querySelector('#durable-approve-row').hidden,
          cancel: !document.querySelector('#durable-cancel')?.disabled,
          children: document.querySelector('#durable-children').dataset.state ?? null,
          waited: window.livepushDemo.durable.waited,
        })"""
    )


FROM_PAGE = {"Sec-Fetch-Site": "same-origin"}


async def approve(demo: Demo, job: str, method: str = "POST", site: str = "same-origin") -> int:
    """The status the approve endpoint answers for `job` (as the page would send it, unless told otherwise)."""
    headers = {"Origin": demo.url.rstrip("/"), "Sec-Fetch-Site": site}
    return (await asyncio.to_thread(_request, f"{demo.url}demo/durable/approve?job={job}", method, headers))[0]


async def test_demo_durable_import_parks_for_its_children_and_its_approval(page: Page, demo: Demo) -> None:
    """The page's durable import shows the job waiting for its children (with their group's bar), then for the approval; Approve wakes it and the page shows it succeeded with its result."""
    await open_demo(page, demo)
    job_id = await start_durable_import(page, DURABLE_ROWS)

    await page.wait_for_function(
        "() => window.livepushDemo.durable.waiting?.for === 'signal'", timeout=DURABLE_TIMEOUT_MS)
    await page.wait_for_selector("#durable-children[data-state=finished]")
    await page.wait_for_selector("#durable-approve", state="visible")
    waiting = await durable_view(page)
    await screenshot(page, "demo-durable-waiting-for-approval.png")
    assert waiting["waited"] == ["children", "approval"], waiting
    assert waiting["state"] == "waiting" and waiting["steps"] == ["done", "done", "current", "todo"], waiting
    assert "approval" in waiting["note"] and waiting["children"] == "finished", waiting
    children = dict(await query(demo.database_url, "SELECT state, count(*) FROM livepush_jobs WHERE name = %s GROUP BY state",
                                (CHILD_JOB,)))
    assert children == {"succeeded": DURABLE_ROWS}, children

    await page.click("#durable-approve")
    try:
        await page.wait_for_function("() => window.livepushDemo.durable.state === 'succeeded'", timeout=DURABLE_TIMEOUT_MS)
    finally:
        await screenshot(page, "demo-durable-succeeded.png")
    print(f"events the page heard: {await page.evaluate('() => window.livepushDemo.durable.events')}")
    done = await durable_view(page)
    result = await page.evaluate("() => window.livepushDemo.durable.result")
    assert result == {"file": f"import-{job_id}.csv", "rows": DURABLE_ROWS, "approved": True,
                      "approved_by": "the demo page", "report": f"report-{job_id}.txt"}, result
    assert done["steps"] == ["done"] * 4 and not done["approve"], done
    assert done["note"].startswith(f"Succeeded: {DURABLE_ROWS} rows imported"), done
    assert f"report-{job_id}.txt" in await page.text_content("#durable-result")

    # Once it has finished there is nothing left to approve: a second approval is refused.
    assert await approve(demo, str(job_id)) == 409


async def test_a_durable_import_parked_for_approval_is_approved_after_a_restart_of_the_demo(page: Page, demo: Demo) -> None:
    """The demo process restarted while a durable import waits for approval: the page reconnects by itself, still offers Approve, and the approval wakes the job to success with its children created once."""
    await open_demo(page, demo)
    await page.evaluate(
        """() => {
          const el = document.querySelector('#status');
          window.shownStatuses = [el.dataset.status];
          new MutationObserver(() => window.shownStatuses.push(el.dataset.status))
            .observe(el, { attributes: true, attributeFilter: ['data-status'] });
        }"""
    )
    job_id = await start_durable_import(page, 2)
    await page.wait_for_function(
        "() => window.livepushDemo.durable.waiting?.name === 'approval'", timeout=DURABLE_TIMEOUT_MS)

    await demo.stop()
    await demo.start()
    await page.wait_for_function(
        "() => window.shownStatuses.includes('reconnecting') && window.shownStatuses.at(-1) === 'open'")
    await page.wait_for_selector("#durable-approve", state="visible")
    await page.click("#durable-approve")
    await page.wait_for_function("() => window.livepushDemo.durable.state === 'succeeded'", timeout=DURABLE_TIMEOUT_MS)

    result = await page.evaluate("() => window.livepushDemo.durable.result")
    assert result["approved"] is True and result["report"] == f"report-{job_id}.txt", result
    children = await query(demo.database_url, "SELECT count(*) FROM livepush_jobs WHERE name = %s",
                           (CHILD_JOB,))
    assert children == [(2,)], children


async def test_an_approve_the_demo_is_answering_when_it_stops_is_answered_not_dropped(page: Page, demo: Demo) -> None:
    """Approve pressed just before the demo stops (its database was slow to answer it): the page
    gets the demo's answer, approval sent, and the import goes on once the demo is back. Dropped
    unanswered, the page said the demo did not answer and to press again, of an approval that had
    been sent, and the browser's console showed a failed request."""
    failed: list[str] = []
    page.on("requestfailed", lambda request: failed.append(f"{request.url}: {request.failure}"))
    await open_demo(page, demo)
    job_id = await start_durable_import(page, 1)
    await page.wait_for_function(
        "() => window.livepushDemo.durable.waiting?.name === 'approval'", timeout=DURABLE_TIMEOUT_MS)
    assert demo.child is not None
    # The job's row held by another transaction: the approval the page sends waits for it.
    holder = await psycopg.AsyncConnection.connect(demo.database_url)
    try:
        await holder.execute("SELECT 1 FROM livepush_jobs WHERE id = %s FOR UPDATE", (job_id,))
        await page.click("#durable-approve")

        async def approval_waits() -> bool:
            waiting = await query(demo.database_url, "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = "
                                  "'Lock' AND query LIKE '%%FOR KEY SHARE%%'")
            return waiting == [(1,)]

        await async_wait_for(approval_waits, 10, message="the approval to wait for the job's row")
        demo.child.terminate()
        await async_wait_for(lambda: "stopping: closing connections" in demo.child.stderr(), 10,
                             message="the demo to start stopping")
        await holder.rollback()
    finally:
        await holder.close()
    assert await demo.child.await_exit(DRAIN_TIMEOUT_S) == 0, demo.child.output()
    await page.wait_for_function("() => document.querySelector('#durable-approve-note').textContent !== ''")
    assert await page.text_content("#durable-approve-note") == "approval sent", failed
    assert failed == []
    await demo.start()
    await page.wait_for_function("() => window.livepushDemo.durable.state === 'succeeded'", timeout=DURABLE_TIMEOUT_MS)


async def test_a_durable_import_cancelled_on_the_demo_page_ends_cancelled_with_its_children(
        page: Page, demo: Demo) -> None:
    """Cancel pressed while the durable import waits for its approval: the job and its children's
    unfinished rows end cancelled, the page says so and offers neither Approve nor Cancel, and a
    second cancel is refused (409), as one of a job that is no durable import is (404)."""
    await open_demo(page, demo)
    assert await page.is_disabled("#durable-cancel")  # nothing to cancel yet
    job_id = await start_durable_import(page, 2)
    await page.wait_for_function(
        "() => window.livepushDemo.durable.waiting?.name === 'approval'", timeout=DURABLE_TIMEOUT_MS)
    assert (await durable_view(page))["cancel"]
    await page.click("#durable-cancel")
    await page.wait_for_function("() => window.livepushDemo.durable.state === 'cancelled'", timeout=DURABLE_TIMEOUT_MS)
    view = await durable_view(page)
    assert view["state"] == "cancelled" and view["note"] == "The job cancelled.", view
    assert not view["approve"] and not view["cancel"], view
    assert "cancelled" in view["steps"], view

    def cancel(job: str) -> int:
        return _request(f"{demo.url}demo/durable/cancel?job={job}", "POST", FROM_PAGE)[0]

    (child,), = await query(demo.database_url, "SELECT min(id) FROM livepush_jobs WHERE name = %s", (CHILD_JOB,))
    refused = await asyncio.gather(*[asyncio.to_thread(cancel, job) for job in [str(job_id), str(child), "x"]])
    assert refused == [409, 404, 400], refused


async def test_the_demo_approves_only_a_durable_import_it_started_that_waits_for_approval(demo: Demo) -> None:
    """The approve endpoint answers a GET 405, a cross-site POST 403, a malformed id 400, the id of no durable import 404 and an import not yet waiting 409, and signals nothing; the other durable endpoints refuse a GET and another site too."""
    status, _, body = await asyncio.to_thread(_request, f"{demo.url}demo/durable/start?n=1", "POST", FROM_PAGE)
    assert status == 200, (status, body)
    job_id = json.loads(body)["job_id"]
    # First, while it downloads (about a second), before it ever parks.
    early = {
        "approve": await approve(demo, str(job_id)),
        "children": (await asyncio.to_thread(
            _request, f"{demo.url}demo/durable/children?job={job_id}", "POST", FROM_PAGE))[0],
    }
    parked = await query(demo.database_url, "SELECT count(*) FROM livepush_jobs WHERE name = %s",
                         (CHILD_JOB,))
    assert parked == [(0,)], f"the import parked before the refusals were checked: {parked}"
    assert early == {"approve": 409, "children": 409}, early

    status, _, body = await asyncio.to_thread(_request, f"{demo.url}demo/start?n=1", "POST", FROM_PAGE)
    assert status == 200, (status, body)
    (other_job,), = await query(demo.database_url, "SELECT id FROM livepush_jobs WHERE name = %s",
                                (CHILD_JOB,))
    refused = {
        "GET": await approve(demo, str(job_id), method="GET"),
        "cross-site": await approve(demo, str(job_id), site="cross-site"),
        **{f"id {bad!r}": await approve(demo, bad)
           for bad in ["", "abc", "0", "-1", "01", "1.0", "1e3", str(2**63), "9" * 40, f"{job_id}&job={job_id}"]},
        "no such job": await approve(demo, str(job_id + 1000)),
        "another job": await approve(demo, str(other_job)),
    }
    assert refused == {"GET": 405, "cross-site": 403, **{k: 400 for k in refused if k.startswith("id ")},
                       "no such job": 404, "another job": 404}, refused
    for path in ["durable/start?n=1", f"durable/children?job={job_id}"]:
        got = [(await asyncio.to_thread(_request, f"{demo.url}demo/{path}", method, {"Sec-Fetch-Site": site}))[0]
               for method, site in [("GET", "same-origin"), ("POST", "cross-site")]]
        assert got == [405, 403], (path, got)
    assert await query(demo.database_url, "SELECT count(*) FROM livepush_job_signals") == [(0,)]


# ---- the workflow -------------------------------------------------------------------------------

WORKFLOW_ROWS = 6
NODES = ["fetch", "rows", "approval", "report"]
# Fetch (~2 s), six rows at once (~1-2 s), the report (~0.3 s): past this the run is stuck.
WORKFLOW_TIMEOUT_MS = 20_000


async def start_workflow(page: Page, rows: int) -> int:
    """Types `rows` into the workflow's field and clicks its start; returns the run's id."""
    await page.fill("#workflow-n", str(rows))
    await page.click("#workflow-start")
    await page.wait_for_function("() => window.livepushDemo.workflow !== null")
    return int(await page.evaluate("() => window.livepushDemo.workflow.run"))


async def workflow_view(page: Page) -> dict[str, Any]:
    """What the workflow's part of the page shows: the run's badge, each box's state and detail, the buttons, the audit."""
    return await page.evaluate(
        """() => ({
          state: document.querySelector('#workflow').dataset.state,
          badge: document.querySelector('#workflow-run-state').textContent,
          nodes: Object.fromEntries([...document.querySelectorAll('#workflow-graph .node')].map(
            (el) => [el.dataset.step, el.dataset.state])),
          details: Object.fromEntries([...document.querySelectorAll('#workflow-graph .node')].map(
            (el) => [el.dataset.step, el.querySelector('.node-detail').textContent])),
          approve: !document.querySelector('#workflow-approve').hidden,
          pause: !document.querySelector('#workflow-pause').disabled,
          resume: !document.querySelector('#workflow-resume').disabled,
          cancel: !document.querySelector('#workflow-cancel')?.disabled,
          batch: document.querySelector('#workflow-batch').dataset.state ?? null,
          audit: [...document.querySelectorAll('#workflow-audit li')].map((li) => li.textContent),
          note: document.querySelector('#workflow-note').textContent,
        })"""
    )


async def nodes_are(page: Page, want: dict[str, str], timeout_ms: int = WORKFLOW_TIMEOUT_MS) -> None:
    """Waits until the graph's boxes show these states."""
    await page.wait_for_function(
        """(want) => Object.entries(want).every(([step, state]) =>
             document.querySelector(`#workflow-graph .node[data-step="${step}"]`).dataset.state === state)""",
        arg=want, timeout=timeout_ms)


async def workflow_action(demo: Demo, action: str, run: str, method: str = "POST",
                          site: str = "same-origin") -> tuple[int, bytes]:
    """What the workflow endpoint `action` answers for `run` (as the page would send it, unless told otherwise)."""
    headers = {"Origin": demo.url.rstrip("/"), "Sec-Fetch-Site": site}
    status, _, body = await asyncio.to_thread(_request, f"{demo.url}demo/workflow/{action}?run={run}", method, headers)
    return status, body


async def test_demo_workflow_waits_for_approval_and_succeeds(page: Page, demo: Demo) -> None:
    """The page draws the workflow's run live: fetch and rows (with its batch's bar) succeed and report waits for the approval; Approve finishes the run, every box succeeded, its summary and audit trail shown."""
    await open_demo(page, demo)
    run_id = await start_workflow(page, WORKFLOW_ROWS)

    await nodes_are(page, {"fetch": "succeeded", "rows": "succeeded", "approval": "waiting", "report": "waiting"})
    await page.wait_for_selector("#workflow-batch[data-state=finished]")
    await page.wait_for_selector("#workflow-approve", state="visible")
    waiting = await workflow_view(page)
    await screenshot(page, "demo-workflow-waiting-for-approval.png")
    assert waiting["state"] == "waiting" and waiting["badge"] == f"run {run_id} · waiting", waiting
    assert waiting["details"]["rows"] == f"{WORKFLOW_ROWS}/{WORKFLOW_ROWS} rows", waiting
    assert waiting["pause"] and not waiting["resume"], waiting
    rows = dict(await query(demo.database_url, "SELECT state, count(*) FROM livepush_jobs WHERE name = %s "
                            "AND group_id IS NOT NULL GROUP BY state", (CHILD_JOB,)))
    assert rows == {"succeeded": WORKFLOW_ROWS}, rows

    await page.click("#workflow-approve")
    try:
        await nodes_are(page, dict.fromkeys(NODES, "succeeded"))
        await page.wait_for_function("() => window.livepushDemo.workflow.summary !== null")
    finally:
        await screenshot(page, "demo-workflow-succeeded.png")
    done = await workflow_view(page)
    heard = await page.evaluate("() => [...document.querySelectorAll('#workflow-events li')].map((li) => li.textContent)")
    print("what the page heard on the run's topic:\n  " + "\n  ".join(heard))
    assert done["state"] == "succeeded" and not done["approve"] and not done["pause"] and not done["resume"], done
    summary = await page.evaluate("() => window.livepushDemo.workflow.summary")
    assert summary == {"file": f"workflow-{run_id}.csv", "rows": WORKFLOW_ROWS, "imported": WORKFLOW_ROWS,
                       "approved_by": "demo page", "report": f"workflow-report-{run_id}.txt"}, summary
    audit = await page.evaluate("() => window.livepushDemo.workflow.audit")
    assert [(a["verb"], a["step"], a["actor"], a["reason"]) for a in audit] == [
        ("signal", "report", "demo page", "approval")], audit
    assert any("signal “approval” → report by demo page" in line for line in done["audit"]), done

    # Once it has finished there is nothing left to approve, pause or resume.
    assert [(await workflow_action(demo, verb, str(run_id)))[0] for verb in ["approve", "pause", "resume"]] == [409] * 3


async def test_demo_workflow_pause_holds_the_next_step_until_resume(page: Page, demo: Demo) -> None:
    """Pause pressed while fetch runs: fetch finishes, rows does not start and the page shows the run paused; Resume starts rows. Paused again while report waits, Approve goes away until Resume; the audit trail lists each press."""
    await open_demo(page, demo)
    run_id = await start_workflow(page, 2)
    await nodes_are(page, {"fetch": "running"})

    async def fetch_started() -> bool:  # its job claimed: a step still queued at the pause waits for resume
        return await query(demo.database_url, "SELECT state FROM livepush_jobs WHERE workflow_id = %s AND name = %s",
                           (run_id, "demo_import.fetch")) == [("running",)]

    await async_wait_for(fetch_started, 10, 0.05, message="the fetch step's job to start")
    await page.click("#workflow-pause")
    await page.wait_for_selector("#workflow[data-state=paused]")
    await nodes_are(page, {"fetch": "succeeded"})
    await asyncio.sleep(1.0)  # time enough for rows to start, were the run not paused
    paused = await workflow_view(page)
    await screenshot(page, "demo-workflow-paused.png")
    assert paused["nodes"] == {"fetch": "succeeded", "rows": "pending", "approval": "pending", "report": "pending"}, paused
    assert paused["badge"] == f"run {run_id} · paused" and paused["resume"] and not paused["pause"], paused
    assert "nothing new starts" in paused["note"], paused
    assert await query(demo.database_url, "SELECT count(*) FROM livepush_jobs WHERE name = %s", (CHILD_JOB,)) == [(0,)]

    await page.click("#workflow-resume")
    await nodes_are(page, {"rows": "succeeded", "approval": "waiting", "report": "waiting"})
    await page.wait_for_selector("#workflow-approve", state="visible")

    await page.click("#workflow-pause")
    await page.wait_for_selector("#workflow[data-state=paused]")
    await page.wait_for_selector("#workflow-approve", state="hidden")
    assert (await workflow_action(demo, "approve", str(run_id)))[0] == 409  # paused: resume first
    await page.click("#workflow-resume")
    await page.wait_for_selector("#workflow[data-state=waiting]")
    await page.click("#workflow-approve")
    await nodes_are(page, dict.fromkeys(NODES, "succeeded"))

    await page.wait_for_function("() => window.livepushDemo.workflow.audit.length === 5")
    audit = await page.evaluate("() => window.livepushDemo.workflow.audit")
    assert [(a["verb"], a["actor"]) for a in audit] == [
        ("pause", "demo page"), ("resume", "demo page"), ("pause", "demo page"), ("resume", "demo page"),
        ("signal", "demo page")], audit
    assert audit[0]["reason"] == "pressed Pause on the demo page", audit
    shown = (await workflow_view(page))["audit"]
    assert len(shown) == 5 and "pause by demo page: pressed Pause on the demo page" in shown[0], shown


async def test_a_workflow_run_cancelled_on_the_demo_page_ends_cancelled_and_says_who_cancelled_it(
        page: Page, demo: Demo) -> None:
    """Cancel pressed while the run waits for its approval: the report step and its gate end
    cancelled, no button is left to press, the audit trail says the page cancelled it, and a
    second cancel is refused (409)."""
    await open_demo(page, demo)
    assert not (await workflow_view(page))["cancel"]  # no run yet
    run_id = await start_workflow(page, 2)
    await nodes_are(page, {"rows": "succeeded", "approval": "waiting", "report": "waiting"})
    assert (await workflow_view(page))["cancel"]
    await page.click("#workflow-cancel")
    await page.wait_for_selector("#workflow[data-state=cancelled]")
    await page.wait_for_function("() => window.livepushDemo.workflow.audit.length === 1")
    cancelled = await workflow_view(page)
    await screenshot(page, "demo-workflow-cancelled.png")
    assert cancelled["nodes"] == {"fetch": "succeeded", "rows": "succeeded", "approval": "cancelled",
                                  "report": "cancelled"}, cancelled
    assert cancelled["badge"] == f"run {run_id} · cancelled", cancelled
    assert not (cancelled["approve"] or cancelled["pause"] or cancelled["resume"] or cancelled["cancel"]), cancelled
    assert "cancel by demo page: pressed Cancel on the demo page" in cancelled["audit"][0], cancelled
    assert await query(demo.database_url, "SELECT state FROM livepush_workflows WHERE id = %s", (run_id,)) == [
        ("cancelled",)]
    status, body = await workflow_action(demo, "cancel", str(run_id))
    assert status == 409 and b"has finished (cancelled)" in body, (status, body)


async def test_the_demo_page_fits_a_narrow_window_its_workflow_drawn_top_to_bottom(page: Page, demo: Demo) -> None:
    """In a window as narrow as a phone's (or a browser beside a terminal), the page needs no
    sideways scrolling: the workflow's boxes, side by side, pushed the run's panel past the
    window's edge, Pause and Resume with it. There they stand one above the other."""
    await page.set_viewport_size({"width": 375, "height": 700})
    await open_demo(page, demo)
    await start_workflow(page, 1)
    await nodes_are(page, {"approval": "waiting", "report": "waiting"}, timeout_ms=WORKFLOW_TIMEOUT_MS)
    await screenshot(page, "demo-narrow-window.png")
    layout = await page.evaluate(
        """() => ({
          page: document.documentElement.scrollWidth,
          window: document.documentElement.clientWidth,
          tops: [...document.querySelectorAll('#workflow-graph .node')].map((el) => el.getBoundingClientRect().top),
        })""")
    assert layout["page"] <= layout["window"], layout
    assert layout["tops"] == sorted(layout["tops"]) and len(set(layout["tops"])) == len(NODES), layout


async def test_the_demo_steers_only_its_own_workflow_runs_in_the_state_each_verb_needs(demo: Demo) -> None:
    """The workflow endpoints answer a GET 405, a cross-site POST 403, a malformed id 400, an unknown run or another workflow's run 404, and a verb the run's state does not allow 409, and signal nothing."""
    start = f"{demo.url}demo/workflow/start?n=1"
    got = [(await asyncio.to_thread(_request, start, method, {"Sec-Fetch-Site": site}))[0]
           for method, site in [("GET", "same-origin"), ("POST", "cross-site")]]
    assert got == [405, 403], got
    assert await query(demo.database_url, "SELECT count(*) FROM livepush_workflows") == [(0,)]

    status, _, body = await asyncio.to_thread(_request, start, "POST", FROM_PAGE)
    assert status == 200, (status, body)
    started = json.loads(body)
    run_id = started["run_id"]
    assert started["run_topic"].startswith(f"workflow:{run_id}~"), started
    # While it fetches (about two seconds): nothing to approve, no batch yet, nothing to resume.
    early = {verb: (await workflow_action(demo, verb, str(run_id)))[0] for verb in ["approve", "batch", "resume"]}
    fetching = await query(demo.database_url, "SELECT state FROM livepush_workflow_steps WHERE workflow_id = %s "
                           "AND name = 'fetch'", (run_id,))
    assert fetching == [("running",)], f"the run went past fetch before the refusals were checked: {fetching}"
    assert early == {"approve": 409, "batch": 409, "resume": 409}, early

    # A run of another workflow, in the same table: the demo's buttons must not reach it.
    (other,), = await query(demo.database_url, "INSERT INTO livepush_workflows (name, queue, graph, input) "
                            "VALUES ('someone_elses', 'elsewhere', '{\"steps\": {}, \"order\": []}', '{}') RETURNING id")
    actions = ["approve", "batch", "pause", "resume", "cancel", "audit"]
    for action in actions:
        refused = {
            "GET": (await workflow_action(demo, action, str(run_id), method="GET"))[0],
            "cross-site": (await workflow_action(demo, action, str(run_id), site="cross-site"))[0],
            **{f"id {bad!r}": (await workflow_action(demo, action, bad))[0]
               for bad in ["", "abc", "0", "-1", "01", "1.0", "1e3", str(2**63), "9" * 40, f"{run_id}&run={run_id}"]},
            "no such run": (await workflow_action(demo, action, str(run_id + 1000)))[0],
            "another workflow's run": (await workflow_action(demo, action, str(other)))[0],
        }
        assert refused == {"GET": 405, "cross-site": 403, **{k: 400 for k in refused if k.startswith("id ")},
                           "no such run": 404, "another workflow's run": 404}, (action, refused)

    status, body = await workflow_action(demo, "pause", str(run_id))
    assert status == 200, (status, body)
    status, body = await workflow_action(demo, "pause", str(run_id))
    assert status == 409 and b"is not running (it is paused)" in body, (status, body)
    status, body = await workflow_action(demo, "audit", str(run_id))
    assert status == 200 and [a["verb"] for a in json.loads(body)["audit"]] == ["pause"], (status, body)
    assert await query(demo.database_url, "SELECT state FROM livepush_workflows WHERE id = %s", (other,)) == [("running",)]
    assert await query(demo.database_url, "SELECT count(*) FROM livepush_workflow_audit WHERE workflow_id = %s",
                       (other,)) == [(0,)]
    assert await query(demo.database_url, "SELECT (SELECT count(*) FROM livepush_job_signals) + "
                       "(SELECT count(*) FROM livepush_workflow_signals)") == [(0,)]


async def test_a_reloaded_demo_page_still_shows_its_imports_and_offers_their_approvals(page: Page, demo: Demo) -> None:
    """The page reloaded while its durable import and its workflow run wait for approval (a
    person's F5, or a browser that restored the tab) shows the three imports it started, as they
    stand, and its Approve buttons still finish both: the jobs are not left waiting for a button
    the page no longer shows."""
    await open_demo(page, demo)
    group_id = await start_import(page, 3)
    job_id = await start_durable_import(page, 2)
    run_id = await start_workflow(page, 2)
    await page.wait_for_function(
        "() => window.livepushDemo.durable.waiting?.name === 'approval'", timeout=DURABLE_TIMEOUT_MS)
    await nodes_are(page, {"approval": "waiting", "report": "waiting"})

    await page.reload()
    await page.wait_for_function("() => window.livepushDemo && window.livepushDemo.lp.status === 'open'")
    followed = await page.evaluate("""() => ({group: window.livepushDemo.group, job: window.livepushDemo.durable?.job,
                                              run: window.livepushDemo.workflow?.run})""")
    assert followed == {"group": group_id, "job": job_id, "run": run_id}, followed
    await page.wait_for_selector("#group[data-state=finished]", timeout=IMPORT_TIMEOUT_MS)
    assert await page.text_content("#started") == f"import {group_id}: 3 jobs"

    await page.wait_for_selector("#durable-approve", state="visible", timeout=DURABLE_TIMEOUT_MS)
    await page.click("#durable-approve")
    await page.wait_for_function("() => window.livepushDemo.durable.state === 'succeeded'", timeout=DURABLE_TIMEOUT_MS)
    result = await page.evaluate("() => window.livepushDemo.durable.result")
    assert result["approved"] is True and result["report"] == f"report-{job_id}.txt", result

    await page.wait_for_selector("#workflow-approve", state="visible", timeout=WORKFLOW_TIMEOUT_MS)
    await page.click("#workflow-approve")
    await nodes_are(page, dict.fromkeys(NODES, "succeeded"))
    assert await query(demo.database_url, "SELECT state FROM livepush_workflows WHERE id = %s",
                       (run_id,)) == [("succeeded",)]
