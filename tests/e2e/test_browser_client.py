"""The JS client in real headless Chromium against `livepush serve` on Postgres.

The page (tests/e2e/pages/client.html) lives on its own origin and imports /livepush.js from the
push server's, as an app's pages would. This test process plays the web app: it signs topics,
publishes through Postgres, issues and revokes sessions, and restarts the server.
"""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import Iterator
from typing import Any

import pytest
from playwright.async_api import Page, WebSocket

from livepush import api, sessions
from livepush.config import set_settings
from tests.e2e.conftest import ARTIFACTS, PushServer

pytestmark = pytest.mark.asyncio(loop_scope="session")

# The client's wait after close 1001 (client_js/README.md, "Server going away").
GOING_AWAY_MS = (500, 3000)


async def watch(page: Page, topic: str, token: str | None = None) -> None:
    """The page's main client subscribes to `topic`; returns once it is open and subscribed."""
    await page.evaluate("([t, token]) => e2e.watch(t, {token})", [topic, token])
    await page.wait_for_function("e2e.lp.status === 'open' && e2e.subscribed >= 1")


async def messages_reach(page: Page, count: int, timeout_ms: float = 10_000) -> list[int]:
    await page.wait_for_function("n => e2e.messages.length >= n", arg=count, timeout=timeout_ms)
    return await page.evaluate("e2e.messages")


async def test_page_receives_messages_live_and_shows_open(client_page: Page, push_server: PushServer) -> None:
    """A page subscribed to a signed topic shows `open` and gets each message published through Postgres, live, in order."""
    topic = "room:e2e-live"
    await watch(client_page, push_server.sign(topic))
    assert await client_page.text_content("#status") == "open"

    # One at a time: each message arrives while the page waits for it, not as a later replay.
    for n in range(1, 6):
        await push_server.publish(topic, {"n": n})
        assert await messages_reach(client_page, n) == list(range(1, n + 1))

    assert await client_page.locator("#messages li").all_text_contents() == ["1", "2", "3", "4", "5"]
    assert await client_page.evaluate("e2e.statusNames()") == ["open"]
    assert await client_page.evaluate("e2e.errors") == []


async def test_server_restart_mid_stream_loses_and_repeats_nothing(client_page: Page, push_server: PushServer) -> None:
    """A server restarted (SIGTERM) mid-stream: the page goes `reconnecting` then `open` by itself and ends with every message exactly once, in order."""
    topic = "room:e2e-restart"
    total = 60
    await watch(client_page, push_server.sign(topic))

    published = 0
    during_downtime: list[int] = []
    server_down = False

    async def publisher() -> None:
        # A steady stream through Postgres, indifferent to the push server's restart.
        nonlocal published
        for n in range(1, total + 1):
            await push_server.publish(topic, {"n": n})
            published = n
            if server_down:
                during_downtime.append(n)
            await asyncio.sleep(0.03)

    def mark_down() -> None:
        nonlocal server_down
        server_down = True

    stream = asyncio.create_task(publisher(), name="e2e-publisher")
    try:
        await messages_reach(client_page, 10)
        await push_server.restart(between=mark_down)
        server_down = False
        await asyncio.wait_for(stream, 15)
    finally:
        stream.cancel()

    # Per topic order: once the last one is in, everything before it has been delivered.
    got = await messages_reach(client_page, total)
    assert got == list(range(1, total + 1)), f"missing {sorted(set(range(1, total + 1)) - set(got))}, got {got}"
    assert during_downtime, "no message was published while the server was down: the test proved nothing"

    names = await client_page.evaluate("e2e.statusNames()")
    first_reconnecting = names.index("reconnecting")
    assert "open" in names[first_reconnecting:], names
    assert names[-1] == "open" and await client_page.text_content("#status") == "open"
    going_away = [s for s in await client_page.evaluate("e2e.statuses") if s["code"] == 1001]
    assert going_away, "the server's SIGTERM did not close the page's connection with 1001"
    offsets = await client_page.evaluate("e2e.offsets")
    assert len(set(offsets)) == total
    assert await client_page.evaluate("e2e.subscribed") >= 2, "the page did not resubscribe after the restart"


class _web_app_settings:
    """While active, this process's settings and fan-out are the push server's (sessions need its
    secret and its revocation store), as in tests/server/test_revocation.py."""

    def __init__(self, push: PushServer) -> None:
        self.push = push

    def __enter__(self) -> None:
        set_settings(self.push.settings)
        api.set_default_fanout(None)
        sessions.set_default_store(None)

    def __exit__(self, *exc: object) -> None:
        api.set_default_fanout(None)  # closes the publishing fan-out revoke() created
        sessions.set_default_store(None)
        set_settings(None)


@pytest.fixture
def web_app(push_server: PushServer) -> Iterator[None]:
    with _web_app_settings(push_server):
        yield


async def test_a_page_subscribed_from_now_that_got_nothing_yet_misses_nothing_across_a_restart(
        client_page: Page, push_server: PushServer) -> None:
    """A page subscribed without `since` and no message yet when the server restarts: it resumes
    from the offset `subscribed` named, and gets what was published while it was away."""
    topic = "room:e2e-quiet-restart"
    await watch(client_page, push_server.sign(topic))

    async def publish_while_down() -> None:
        for n in (1, 2, 3):
            await push_server.publish(topic, {"n": n})

    await push_server.restart(between=publish_while_down)
    await client_page.wait_for_function("e2e.subscribed >= 2 && e2e.lp.status === 'open'")
    await push_server.publish(topic, {"n": 4})
    assert await messages_reach(client_page, 4) == [1, 2, 3, 4]


async def test_a_second_subscription_to_a_topic_costs_the_first_one_nothing(
        client_page: Page, push_server: PushServer) -> None:
    """A widget mounted and unmounted 60 times subscribes to the topic the page already follows
    (no `since`), while messages stream: the page's first subscription still gets every one,
    once, in order."""
    topic = "room:e2e-second-sub"
    signed = push_server.sign(topic)
    await watch(client_page, signed)
    total = 150

    async def publisher() -> None:
        for n in range(1, total + 1):
            await push_server.publish(topic, {"n": n})
            await asyncio.sleep(0.005)

    stream = asyncio.create_task(publisher(), name="e2e-publisher")
    await client_page.evaluate(
        """async (topic) => {
            for (let i = 0; i < 60; i++) {
              const b = e2e.lp.subscribe(topic, () => {});
              await new Promise((resolve) => setTimeout(resolve, 15));
              b.unsubscribe();
            }
        }""",
        signed,
    )
    await asyncio.wait_for(stream, 30)
    await client_page.wait_for_function("n => e2e.messages.includes(n)", arg=total, timeout=10_000)
    assert await client_page.evaluate("e2e.messages") == list(range(1, total + 1))


async def test_revoked_session_shows_unauthorized_and_stops_retrying(
    client_page: Page, push_server: PushServer, web_app: None
) -> None:
    """A page whose session (sent in Sec-WebSocket-Protocol, not the URL) is revoked shows `unauthorized` (close 4403) and opens no new WebSocket afterwards."""
    sockets: list[WebSocket] = []
    client_page.on("websocket", lambda ws: sockets.append(ws))
    token = sessions.issue("user-1")
    await watch(client_page, push_server.sign("user:1"), token=token)
    assert await client_page.text_content("#subject") == "as user-1"
    assert len(sockets) == 1
    assert "token" not in sockets[0].url, sockets[0].url  # proxies log URLs: the token is not in it

    await asyncio.to_thread(sessions.revoke, token)
    await client_page.wait_for_function("e2e.lp.status === 'unauthorized'", timeout=5_000)
    assert await client_page.text_content("#status") == "unauthorized"
    last = (await client_page.evaluate("e2e.statuses"))[-1]
    assert last["status"] == "unauthorized" and last["code"] == 4403, last

    # The absence of a retry can only be watched for a while: the first retry of a client that
    # did retry would come after 0.25-0.75 s (its first backoff), well inside this window.
    await asyncio.sleep(3)
    assert len(sockets) == 1, [ws.url for ws in sockets]
    assert await client_page.evaluate("e2e.statusNames()") == ["open", "unauthorized"]


async def test_a_stale_token_taken_as_anonymous_is_renewed_from_the_token_function_and_nothing_is_missed(
    client_page: Page, push_server: PushServer, web_app: None
) -> None:
    """Under LIVEPUSH_AUTHENTICATE=optional a page connects with a token revoked while it was away:
    the server takes it as anonymous and refuses the user's topic `forbidden`. The page's token
    function holds a renewed token by then: the client reconnects with it, subscribes again from
    its `since`, and gets what was published meanwhile, with nothing told to onError."""
    push_server.args = ("--app", "tests.support.security_app:app")  # rule user:{subject}
    await push_server.restart()
    sockets: list[WebSocket] = []
    client_page.on("websocket", lambda ws: sockets.append(ws))
    stale = sessions.issue("user-1")
    await asyncio.to_thread(sessions.revoke, stale)
    fresh = sessions.issue("user-1")
    topic = "user:user-1"
    since = await push_server.publish(topic, {"n": 0})
    await push_server.publish(topic, {"n": 1})
    await client_page.evaluate(
        """([topic, since, stale, fresh]) => {
            // The first connect offers the stale token; by the refusal the page has renewed it.
            let asked = 0;
            const lp = new e2e.mod.LivePush(e2e.wsUrl, {
                token: () => (++asked === 1 ? stale : fresh),
                onError: (err) => e2e.errors.push(`${err.reason}: ${err.detail}`),
            });
            Object.assign(e2e, { renewed: lp, got: [], refusals: [], renewals: [] });
            lp.on('status', (status, info) => { if (info.reason === 'token renewed') e2e.renewals.push(status); });
            lp.subscribe(topic, (data) => e2e.got.push(data.n), {
                since, onRefused: (reason) => e2e.refusals.push(reason),
            });
        }""",
        [topic, since, stale, fresh],
    )
    await client_page.wait_for_function("e2e.got.includes(1)")
    await push_server.publish(topic, {"n": 2})
    await client_page.wait_for_function("e2e.got.includes(2)")
    assert await client_page.evaluate("e2e.got") == [1, 2]
    assert await client_page.evaluate("e2e.renewed.session") == {"subject": "user-1"}
    assert await client_page.evaluate("e2e.renewals") == ["reconnecting"]
    assert await client_page.evaluate("e2e.refusals") == []
    assert await client_page.evaluate("e2e.errors") == []
    assert len(sockets) == 2, [ws.url for ws in sockets]
    await client_page.evaluate("e2e.renewed.close()")


@pytest.mark.parametrize("ending", ["revoked", "expired"])
async def test_a_session_that_ends_while_connected_is_renewed_from_the_token_function_and_nothing_is_missed(
    client_page: Page, push_server: PushServer, web_app: None, ending: str
) -> None:
    """A page's session is revoked, or expires, while it is connected: the server closes with 4403.
    The page's token function holds a fresh session by then: the client reconnects with it at once
    and resumes from its offset, so every message published before, during and after the renewal
    arrives once, in order, with nothing told to onError."""
    push_server.args = ("--app", "tests.support.security_app:fast_reverify")  # rule user:{subject}
    await push_server.restart()
    sockets: list[WebSocket] = []
    client_page.on("websocket", lambda ws: sockets.append(ws))
    # Long enough that a loaded machine's page opens on it before it ends: one that opened after
    # would be taken as anonymous and renewed through a refusal instead, never closed with 4403.
    first = sessions.issue("user-1", ttl=8 if ending == "expired" else 86400)
    fresh = sessions.issue("user-1")
    topic = "user:user-1"
    await client_page.evaluate(
        """([topic, first, fresh]) => {
            // The page renews its token before the session ends (its own timer, a fetch).
            let asked = 0;
            return e2e.watch(topic, {token: () => (++asked === 1 ? first : fresh)});
        }""",
        [topic, first, fresh],
    )
    await client_page.wait_for_function("e2e.lp.status === 'open' && e2e.subscribed >= 1")
    await push_server.publish(topic, {"n": 1})
    await messages_reach(client_page, 1)

    # Published all along, so that some are published while the page reconnects.
    stop = asyncio.Event()
    published = [1]

    async def keep_publishing() -> None:
        while not stop.is_set():
            published.append(published[-1] + 1)
            await push_server.publish(topic, {"n": published[-1]})
            await asyncio.sleep(0.02)

    publisher = asyncio.create_task(keep_publishing())
    try:
        if ending == "revoked":
            await asyncio.to_thread(sessions.revoke, first)
        await client_page.wait_for_function("e2e.subscribed >= 2 && e2e.lp.status === 'open'")
        # Some published on the renewed connection too, live.
        await client_page.wait_for_function("n => e2e.messages.includes(n)", arg=published[-1] + 5)
    finally:
        stop.set()
        await asyncio.wait_for(publisher, 10)
    assert await messages_reach(client_page, published[-1]) == published

    renewal = (await client_page.evaluate("e2e.statuses"))[1]
    assert (renewal["status"], renewal["code"], renewal["reason"], renewal["delayMs"]) == (
        "reconnecting", 4403, "token renewed", 0), renewal
    assert await client_page.evaluate("e2e.statusNames()") == ["open", "reconnecting", "open"]
    assert await client_page.text_content("#subject") == "as user-1"
    assert await client_page.evaluate("e2e.errors") == []
    assert len(sockets) == 2, [ws.url for ws in sockets]
    await client_page.evaluate("e2e.lp.close()")


async def test_waking_up_pings_the_server_and_keeps_a_live_connection(client_page: Page, push_server: PushServer) -> None:
    """The page becoming visible again, or the network coming back, makes the client ping at once;
    the server answers within the client's grace, so a live connection is kept: no new socket, no
    status change."""
    sockets: list[WebSocket] = []
    client_page.on("websocket", lambda ws: sockets.append(ws))
    await watch(client_page, push_server.sign("room:e2e-wake"))
    assert len(sockets) == 1
    async with sockets[0].expect_event("framereceived", predicate=lambda payload: '"pong"' in str(payload), timeout=5_000):
        await client_page.evaluate(
            "document.dispatchEvent(new Event('visibilitychange')); window.dispatchEvent(new Event('online'))")
    # The client gives the answer HEARTBEAT_GRACE_MS (2 s): watch past it for a drop.
    await asyncio.sleep(3)
    assert len(sockets) == 1, [ws.url for ws in sockets]
    assert await client_page.evaluate("e2e.statusNames()") == ["open"]
    assert await client_page.evaluate("e2e.errors") == []


def _percentile(sorted_values: list[float], q: float) -> float:
    index = min(len(sorted_values) - 1, max(0, round(q * (len(sorted_values) - 1))))
    return sorted_values[index]


def _densest_window(sorted_values: list[float], width: float) -> int:
    """The most values inside any window [t, t + width)."""
    best, start = 0, 0
    for end, value in enumerate(sorted_values):
        while value - sorted_values[start] >= width:
            start += 1
        best = max(best, end - start + 1)
    return best


async def test_a_hundred_clients_come_back_spread_out_after_a_restart(client_page: Page, push_server: PushServer) -> None:
    """100 clients cut off by one server restart all reconnect, spread over at least a second, never most of them in one 250 ms burst."""
    clients = 100
    topic = push_server.sign("room:e2e-crowd")
    await client_page.evaluate("([n, t]) => e2e.startCrowd(n, t)", [clients, topic])
    await client_page.wait_for_function("n => e2e.crowdReady(1) === n", arg=clients, timeout=10_000)

    restart_at = await client_page.evaluate("performance.now()")
    await push_server.restart()
    await client_page.wait_for_function("n => e2e.crowdReady(2) === n", arg=clients, timeout=15_000)

    history: list[dict[str, Any]] = await client_page.evaluate("e2e.crowdHistory()")
    delays, reopened, attempts = [], [], []
    for rec in history:
        after = [s for s in rec["statuses"] if s["t"] >= restart_at]
        going_away = [s for s in after if s["code"] == 1001]
        assert going_away, f"client {rec['i']} was not closed with 1001: {after}"
        delays.append(going_away[0]["delayMs"])
        opens = [s["t"] for s in after if s["status"] == "open"]
        assert opens, f"client {rec['i']} never reopened: {after}"
        reopened.append((opens[0] - restart_at) / 1000)
        attempts.append(sum(1 for s in after if s["delayMs"] is not None))

    reopened.sort()
    spread = reopened[-1] - reopened[0]
    densest = _densest_window(reopened, 0.25)
    report = {
        "clients": clients,
        "server": push_server.restarts[-1],
        "reopen_s_after_sigterm": {
            "min": reopened[0],
            "p10": _percentile(reopened, 0.10),
            "p50": _percentile(reopened, 0.50),
            "p90": _percentile(reopened, 0.90),
            "max": reopened[-1],
        },
        "spread_s": spread,
        "most_in_250ms": densest,
        "first_delay_ms": {"min": min(delays), "max": max(delays)},
        "clients_needing_more_than_one_attempt": sum(1 for a in attempts if a > 1),
    }
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    (ARTIFACTS / "reconnect-spread.json").write_text(json.dumps(report, indent=2) + "\n")
    print(f"\nreconnect spread: {json.dumps(report)}")

    # The first wait after 1001 is the client's jitter, within its documented range.
    assert all(GOING_AWAY_MS[0] <= d < GOING_AWAY_MS[1] for d in delays), report
    assert spread >= 1.0, report
    assert densest <= 0.6 * clients, report


async def test_a_drained_page_comes_back_at_the_delay_the_server_gave_and_misses_nothing(
    client_page: Page, push_server: PushServer
) -> None:
    """A server stopped with LIVEPUSH_DRAIN_SECONDS=2 closes the page's socket with 1001 and
    retry=MS; the page opens its next socket MS later (not its own 0.5-3 s jitter), reconnects to
    the new server and ends with every message exactly once, in order."""
    drain_seconds = 2
    push_server.env["LIVEPUSH_DRAIN_SECONDS"] = str(drain_seconds)
    await push_server.restart()  # the page has not connected yet: the new process drains
    topic = "room:e2e-drain"
    total = 100
    await watch(client_page, push_server.sign(topic))

    published = 0
    stopped = asyncio.Event()
    during_downtime: list[int] = []

    async def publisher() -> None:
        nonlocal published
        for n in range(1, total + 1):
            await push_server.publish(topic, {"n": n})
            published = n
            if stopped.is_set():
                during_downtime.append(n)
            await asyncio.sleep(0.03)

    stream = asyncio.create_task(publisher(), name="e2e-drain-publisher")
    try:
        await messages_reach(client_page, 10)
        await push_server.restart(between=stopped.set)
        stopped.clear()
        await asyncio.wait_for(stream, 20)
    finally:
        stream.cancel()

    got = await messages_reach(client_page, total)
    assert got == list(range(1, total + 1)), f"missing {sorted(set(range(1, total + 1)) - set(got))}, got {got}"
    assert during_downtime, "no message was published while the server was down: the test proved nothing"
    assert push_server.restarts[-1]["stop_s"] < drain_seconds + 3, push_server.restarts[-1]

    statuses = await client_page.evaluate("e2e.statuses")
    drained = [s for s in statuses if s["status"] == "reconnecting" and s["code"] == 1001]
    assert drained, f"the page was not closed with 1001: {statuses}"
    close = drained[0]
    reason = close["reason"] or ""
    assert reason.startswith("retry=") and reason[6:].isdigit(), close
    asked = int(reason[6:])
    assert 500 <= asked <= 1000 * drain_seconds and close["delayMs"] == asked, close
    socket_times = await client_page.evaluate("e2e.socketTimes")
    next_socket = min(t for t in socket_times if t > close["t"])
    # Timers never fire early; a busy test machine may fire one a little late.
    assert asked - 20 <= next_socket - close["t"] <= asked + 400, (next_socket - close["t"], close)
    assert await client_page.text_content("#status") == "open"
    assert len(set(await client_page.evaluate("e2e.offsets"))) == total


async def test_a_subscription_from_now_beside_one_with_since_gets_only_what_follows_it(
        client_page: Page, push_server: PushServer) -> None:
    """Two subscriptions of one page on a topic, made before the connection opens: the first,
    with `since`, gets the messages it missed; the second, without, gets only what is published
    after it subscribed, never the first one's catch-up."""
    topic = "room:e2e-since-and-now"
    signed = push_server.sign(topic)
    since = await push_server.publish(topic, {"n": 1})
    for n in (2, 3):
        await push_server.publish(topic, {"n": n})
    await client_page.evaluate(
        """([topic, since]) => {
            const lp = new e2e.mod.LivePush(e2e.wsUrl, { onError: (err) => e2e.errors.push(String(err.reason)) });
            Object.assign(e2e, { pair: lp, list: [], badge: [], answered: 0 });
            const answered = () => { e2e.answered += 1; };
            lp.subscribe(topic, (data) => e2e.list.push(data.n), { since, onSubscribed: answered });
            lp.subscribe(topic, (data) => e2e.badge.push(data.n), { onSubscribed: answered });
        }""",
        [signed, since],
    )
    await client_page.wait_for_function("e2e.answered >= 2 && e2e.list.length >= 2")
    await push_server.publish(topic, {"n": 4})
    await client_page.wait_for_function("e2e.list.length >= 3")
    assert await client_page.evaluate("e2e.list") == [2, 3, 4]
    assert await client_page.evaluate("e2e.badge") == [4]
    await client_page.evaluate("e2e.pair.close()")


async def test_a_page_reset_on_subscribe_misses_nothing_published_while_the_server_restarts(
        client_page: Page, push_server: PushServer) -> None:
    """A page whose `since` the server cannot resume from gets `reset` (and refetches); when
    the server restarts before the next message, what is published meanwhile still reaches it:
    the live messages after a reset follow it without a gap, across a reconnect too."""
    topic = "room:e2e-reset-restart"
    signed = push_server.sign(topic)
    await push_server.publish(topic, {"n": 1})
    await client_page.evaluate(
        """(topic) => {
            const lp = new e2e.mod.LivePush(e2e.wsUrl, { onError: (err) => e2e.errors.push(String(err.reason)) });
            Object.assign(e2e, { after: lp, got: [], resets: 0, answered: 0 });
            lp.subscribe(topic, (data) => e2e.got.push(data.n), {
                since: '1-1', // an earlier epoch of the topic: history cannot resume from it
                onReset: () => { e2e.resets += 1; },
                onSubscribed: () => { e2e.answered += 1; },
            });
        }""",
        signed,
    )
    await client_page.wait_for_function("e2e.resets >= 1")

    async def publish_while_down() -> None:
        for n in (2, 3):
            await push_server.publish(topic, {"n": n})

    await push_server.restart(between=publish_while_down)
    await client_page.wait_for_function("e2e.answered >= 2 && e2e.after.status === 'open'")
    await push_server.publish(topic, {"n": 4})
    await client_page.wait_for_function("e2e.got.includes(4)")
    assert await client_page.evaluate("e2e.got") == [2, 3, 4]
    assert await client_page.evaluate("e2e.resets") == 1
    await client_page.evaluate("e2e.after.close()")


async def test_a_second_subscription_from_an_earlier_epoch_resets_alone_and_the_first_gets_every_message_once(
        client_page: Page, push_server: PushServer) -> None:
    """A page follows a topic; a second view of it then subscribes with an offset cached from an
    earlier epoch of the topic. Only that second view's onReset runs (it refetches): the first,
    which lost nothing, is not told to refetch what it shows, and gets every message once, those
    published around the second subscribe included."""
    topic = "room:e2e-second-reset"
    signed = push_server.sign(topic)
    await client_page.evaluate(
        """(topic) => {
            const lp = new e2e.mod.LivePush(e2e.wsUrl, { onError: (err) => e2e.errors.push(String(err.reason)) });
            Object.assign(e2e, { views: lp, list: [], badge: [], resets: [], answered: 0 });
            lp.subscribe(topic, (data) => e2e.list.push(data.n), {
                onReset: () => { e2e.resets.push('list'); },
                onSubscribed: () => { e2e.answered += 1; },
            });
        }""",
        signed,
    )
    await client_page.wait_for_function("e2e.answered >= 1")
    for n in (1, 2):
        await push_server.publish(topic, {"n": n})
    await client_page.wait_for_function("e2e.list.length >= 2")
    await client_page.evaluate(
        """(topic) => {
            e2e.views.subscribe(topic, (data) => e2e.badge.push(data.n), {
                since: '1-1', // an earlier epoch of the topic: history cannot resume from it
                onReset: () => { e2e.resets.push('badge'); },
                onSubscribed: () => { e2e.answered += 1; },
            });
        }""",
        signed,
    )
    await push_server.publish(topic, {"n": 3})  # around the second subscribe, as a busy topic has
    await client_page.wait_for_function("e2e.answered >= 2 && e2e.resets.length >= 1")
    await push_server.publish(topic, {"n": 4})
    await client_page.wait_for_function("e2e.list.includes(4) && e2e.badge.includes(4)")
    assert await client_page.evaluate("e2e.resets") == ["badge"]
    assert await client_page.evaluate("e2e.list") == [1, 2, 3, 4]
    assert await client_page.evaluate("e2e.errors") == []
    await client_page.evaluate("e2e.views.close()")


async def test_a_page_with_more_subscriptions_than_the_subscribe_burst_gets_them_all(
        client_page: Page, push_server: PushServer) -> None:
    """A dashboard with two listeners on each of 60 topics (120 subscriptions, within the 100
    topics a connection may hold): the server takes 100 subscribes a second, in bursts of 100,
    and the client keeps to that pace instead of having the rest refused `limit` for good."""
    names = [f"dash:e2e-{i}" for i in range(60)]
    signed = [push_server.sign(name) for name in names]
    await client_page.evaluate(
        """(topics) => {
            const lp = new e2e.mod.LivePush(e2e.wsUrl, { onError: (err) => e2e.errors.push(String(err.reason)) });
            Object.assign(e2e, { dash: lp, delivered: 0, accepted: 0, refusals: [] });
            for (const topic of topics) {
                for (let i = 0; i < 2; i++) {
                    lp.subscribe(topic, () => { e2e.delivered += 1; }, {
                        onSubscribed: () => { e2e.accepted += 1; },
                        onRefused: (reason) => { e2e.refusals.push(reason); },
                    });
                }
            }
        }""",
        signed,
    )
    await client_page.wait_for_function("e2e.accepted + e2e.refusals.length >= 120", timeout=10_000)
    assert await client_page.evaluate("e2e.refusals") == []
    for name in names:
        await push_server.publish(name, {"n": 1})
    await client_page.wait_for_function("e2e.delivered >= 120", timeout=10_000)
    await client_page.evaluate("e2e.dash.close()")


async def test_a_relative_url_connects_without_window_or_document(
        client_page: Page, push_server: PushServer) -> None:
    """A URL relative to the page (here `//host:port/`) connects in a module worker, which has no
    window or document, and in a page that turned off the wake-up listeners with `window: null`
    and `document: null`: it is resolved against the global `location`."""
    relative = f"//127.0.0.1:{push_server.port}/"
    await client_page.evaluate(
        """([url, ws]) => {
            Object.assign(e2e, { workerEvents: [], bare: null, bareErrors: [] });
            const query = new URLSearchParams({ ws, url });
            const worker = new Worker(`worker.js?${query}`, { type: 'module' });
            worker.onmessage = (ev) => e2e.workerEvents.push(ev.data);
            e2e.worker = worker;
            e2e.bare = new e2e.mod.LivePush(url, {
                window: null, document: null, onError: (err) => e2e.bareErrors.push(String(err.reason)),
            });
        }""",
        [relative, push_server.http_base],
    )
    await client_page.wait_for_function("e2e.bare.status === 'open'")
    await client_page.wait_for_function("e2e.workerEvents.some((e) => e.status === 'open')")
    assert await client_page.evaluate("e2e.bareErrors") == []
    assert await client_page.evaluate("e2e.workerEvents.filter((e) => e.error)") == []
    await client_page.evaluate("e2e.bare.close(); e2e.worker.terminate()")


async def test_the_network_coming_back_cuts_a_workers_long_wait_short(
        client_page: Page, push_server: PushServer) -> None:
    """A client in a module worker (no window) hears `online` on the worker's global scope: the
    network coming back brings a long reconnect wait down to under a second, as in a page."""
    with socket.socket() as probe:  # a port nothing listens on: every attempt fails
        probe.bind(("127.0.0.1", 0))
        dead_port = probe.getsockname()[1]
    await client_page.evaluate(
        """([url, ws]) => {
            e2e.workerEvents = [];
            const worker = new Worker(`worker.js?${new URLSearchParams({ ws, url })}`, { type: 'module' });
            worker.onmessage = (ev) => e2e.workerEvents.push(ev.data);
            e2e.worker = worker;
        }""",
        [f"ws://127.0.0.1:{dead_port}/", push_server.http_base],
    )
    # Failed attempts grow the backoff: wait for a wait longer than any wake-up delay.
    await client_page.wait_for_function("e2e.workerEvents.some((e) => e.delayMs > 1500)", timeout=10_000)
    seen = await client_page.evaluate("e2e.workerEvents.length")
    await client_page.evaluate("e2e.worker.postMessage('online')")
    # Left alone, every later wait is longer still; the wake-up announces one under a second.
    await client_page.wait_for_function(
        "n => e2e.workerEvents.slice(n).some((e) => e.status === 'reconnecting' && e.delayMs <= 1000)",
        arg=seen, timeout=5_000)
    await client_page.evaluate("e2e.worker.terminate()")


async def test_bind_progress_on_a_pages_own_progress_bar_says_to_pass_its_container(
        client_page: Page, push_server: PushServer) -> None:
    """A browser shows no children of a `<progress>`: bound to one, the bar and text would render
    where nothing is seen, and the page's own bar would spin for good. bindProgress throws a
    TypeError saying to pass a container instead, and renders a visible bar into a `<div>`."""
    result = await client_page.evaluate(
        """() => {
            const lp = new e2e.mod.LivePush(e2e.wsUrl, { onError: () => {} });
            const own = document.createElement('progress');
            const box = document.createElement('div');
            document.body.append(own, box);
            let error = null;
            try {
                e2e.mod.bindProgress(lp, 'job:1', own);
            } catch (err) {
                error = `${err.name}: ${err.message}`;
            }
            const binding = e2e.mod.bindProgress(lp, 'job:1', box);
            const width = box.querySelector('progress').getBoundingClientRect().width;
            binding.unsubscribe();
            lp.close();
            return { error, children: own.children.length, width };
        }"""
    )
    assert result["error"].startswith("TypeError: bindProgress() renders its own <progress> bar and text line"), result
    assert "not a <progress>" in result["error"]
    assert result["children"] == 0
    assert result["width"] > 0
