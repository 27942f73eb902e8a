"""GET /readyz: ready only while a canary goes round the fan-out in time, the schema is current,
and the server is not draining; every check is named in the body (docs/reference.md#9-operations)."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import os
import signal
from collections.abc import AsyncIterator, Callable, Iterator

import psycopg
import pytest

from livepush import jobs, metrics, sessions
from livepush.config import Settings, set_settings
from livepush.errors import ConfigError, DependencyError
from livepush.fanout.local import LocalFanOut
from livepush.jobs import database
from livepush.server.app import PushServer
from livepush.server.readiness import CANARY_TOPIC, Canary, Readiness
from livepush.sessions.rules import App
from tests.server.conftest import Served, make_settings, start_served
from tests.server.test_server import http_get
from tests.support import services
from tests.support.redis_acl import documented_user
from tests.support.relay import Relay
from tests.support.waiting import async_wait_for
from tests.support.wsclient import WSClient


@jobs.job(name="t.readiness.quiet", queue="readiness-quiet")
def _quiet_job(ctx: object) -> None:
    """Never run: a job whose state the tests change by cancelling it."""


# -- the canary's bookkeeping, clocked by hand ------------------------------------------------

def test_not_ready_until_a_first_canary_comes_back() -> None:
    canary = Canary(bound=5.0)
    entry = canary.sent(0.0)
    assert canary.check(1.0)[0] is False
    canary.published(entry, "1-1")
    canary.on_heard("1-1", 0.02)
    ok, body = canary.check(1.0)
    assert ok and body["round_trip_ms"] == 20.0


def test_a_canary_heard_before_its_publish_returned_counts() -> None:
    canary = Canary(bound=5.0)
    entry = canary.sent(0.0)
    canary.on_heard("1-7", 0.01)  # the doorbell came first
    canary.published(entry, "1-7")
    assert canary.check(0.5)[0] is True


def test_a_canary_not_back_within_the_bound_makes_it_unready_and_a_later_one_heals_it() -> None:
    canary = Canary(bound=5.0)
    first = canary.sent(0.0)
    canary.published(first, "1-1")
    canary.on_heard("1-1", 0.01)
    lost = canary.sent(2.0)
    canary.published(lost, "1-2")
    assert canary.check(6.9)[0] is True  # 4.9 s late: not yet past the bound
    ok, body = canary.check(7.0)
    assert not ok and "no canary came back" in str(body["detail"])
    failed = canary.sent(8.0)  # a publish that raised: never published
    assert canary.check(8.0)[0] is False
    later = canary.sent(10.0)
    canary.published(later, "1-4")
    canary.on_heard("1-4", 10.1)  # answers the lost one and the failed one too
    assert canary.check(10.2)[0] is True
    assert failed not in canary.unanswered


def test_the_round_trip_gauge_rises_while_a_canary_is_late_instead_of_keeping_the_last_good_trip() -> None:
    def gauge() -> float | None:
        return metrics.REGISTRY.get_sample_value("livepush_canary_round_trip_seconds")

    canary = Canary(bound=5.0)
    first = canary.sent(0.0)
    canary.published(first, "1-1")
    canary.on_heard("1-1", 0.01)
    assert gauge() == pytest.approx(0.01)
    lost = canary.sent(2.0)
    canary.published(lost, "1-2")
    canary.sent(4.0)  # the loop's next round: the lost one has waited 2 s so far
    assert gauge() == pytest.approx(2.0)
    canary.check(9.0)  # a probe of /readyz
    assert gauge() == pytest.approx(7.0)
    later = canary.sent(10.0)
    canary.published(later, "1-4")
    canary.on_heard("1-4", 10.05)  # the path works again: the gauge shows this trip
    assert gauge() == pytest.approx(0.05)
    canary.check(11.0)
    assert gauge() == pytest.approx(0.05)


def test_a_state_rings_canary_leaves_the_fan_outs_gauge_alone() -> None:
    metrics.CANARY_SECONDS.set(0.5)
    ring = Canary(bound=5.0, gauged=False)
    ring.sent(0.0)
    ring.check(30.0)
    assert metrics.REGISTRY.get_sample_value("livepush_canary_round_trip_seconds") == 0.5


def test_another_servers_canaries_are_not_ours() -> None:
    canary = Canary(bound=5.0)
    entry = canary.sent(0.0)
    canary.published(entry, "1-2")
    canary.on_heard("1-1", 0.01)  # someone else's
    assert canary.check(5.0)[0] is False


def test_a_canary_that_came_back_but_whose_topic_could_not_be_read_is_not_ready_until_a_read_succeeds() -> None:
    """Hearing the canary is not enough: a server whose read of the history was refused serves no
    history, so the check fails naming that refusal, and passes again once a read is made."""
    canary = Canary(bound=5.0)
    entry = canary.sent(0.0)
    canary.published(entry, "1-1")
    canary.on_heard("1-1", 0.01)
    canary.unread = "permission denied for table livepush_messages: run livepush migrate --runtime-role ROLE"
    ok, body = canary.check(0.5)
    assert not ok and body["ok"] is False, body
    assert "history was refused: permission denied" in str(body["detail"]), body
    canary.unread = None
    assert canary.check(0.5) == (True, {"ok": True, "bound_seconds": 5.0, "round_trip_ms": 10.0})


@dataclasses.dataclass(frozen=True)
class _JobTopics:
    """A state source as far as /readyz reads one: the prefixes it serves."""

    prefixes: tuple[str, ...] = ("job:", "group:", "workflow:")


def test_every_canary_not_back_in_time_is_named_with_how_long_it_has_been_missing() -> None:
    """A Postgres outage on the Postgres fan-out silences the state ring first and the fan-out's
    canary after it (the loop that sends them waits on the first): the `canary` check names both,
    each with how long, not only the later one, which read as an outage of seconds when it had
    lasted most of a minute."""
    now = [0.0]
    source = _JobTopics()
    readiness = Readiness(LocalFanOut(), away=lambda: None, draining=lambda: False,
                          states=[source], clock=lambda: now[0])  # type: ignore[list-item]
    ring, canary = readiness.ring_canaries[source], readiness.canary  # type: ignore[index]
    for which, token in ((ring, "ring-1"), (canary, "1-1")):
        which.published(which.sent(0.0), token)
        which.on_heard(token, 0.01)
    ring.published(ring.sent(2.0), "ring-2")  # never heard: the database went away
    now[0] = 34.0
    canary.published(canary.sent(34.0), "1-2")  # sent once the ring gave up, never heard either
    now[0] = 44.0
    ready, body = readiness.report()
    detail = json.loads(body)["checks"]["canary"]["detail"]
    assert not ready
    assert "no canary came back through the fan-out for 10.0 s" in detail, detail
    assert "no state ring came back from the database" in detail and "for 42.0 s" in detail, detail


class _DeafFanOut(LocalFanOut):
    """A fan-out that says it listens, counting the re-listens it is asked for."""

    def __init__(self) -> None:
        super().__init__()
        self.relistens: list[float] = []
        self.now = 0.0

    @property
    def listening(self) -> bool:
        return True

    def relisten(self, reason: str) -> None:
        self.relistens.append(self.now)


def test_a_canary_late_for_three_periods_past_its_bound_makes_the_fan_out_listen_anew_ever_less_often() -> None:
    """Published canaries unheard past the bound plus three periods make the fan-out listen anew;
    one that brought nothing back is retried after twice as long, then four times, up to a cap,
    so a listener that can never hear is not reopened every few seconds; a canary heard starts
    afresh. A canary whose publish failed asks for nothing: the fan-out itself is down."""
    fanout = _DeafFanOut()
    readiness = Readiness(fanout, away=lambda: None, draining=lambda: False, every=2.0, bound=5.0,
                          clock=lambda: fanout.now)
    readiness.canary.sent(0.0)  # its publish failed
    for fanout.now in (11.0, 60.0):
        readiness._relisten_if_deaf(fanout.now)
    assert fanout.relistens == []
    readiness.canary.published(readiness.canary.sent(100.0), "1-1")
    for t in range(100, 400):
        fanout.now = float(t)
        readiness._relisten_if_deaf(fanout.now)
    assert fanout.relistens == [111.0, 133.0, 177.0, 265.0]
    readiness.canary.published(readiness.canary.sent(400.0), "1-2")
    readiness.canary.on_heard("1-2", 400.1)
    readiness.canary.published(readiness.canary.sent(500.0), "1-3")
    fanout.now = 511.0
    readiness._relisten_if_deaf(fanout.now)
    assert fanout.relistens[-1] == 511.0


class _DeafStates:
    """A state source that says it listens, counting the re-listens it is asked for."""

    prefixes = ("job:",)

    def __init__(self, fanout: _DeafFanOut) -> None:
        self.fanout = fanout
        self.relistens: list[float] = []
        self.rings: list[str] = []
        self.listening = True

    def relisten(self, reason: str) -> None:
        self.relistens.append(self.fanout.now)

    async def ring_canary(self, token: str) -> None:
        self.rings.append(token)
        raise DependencyError("the database refuses new connections")


def test_a_state_ring_late_while_the_fan_outs_canary_comes_back_makes_the_state_source_listen_anew() -> None:
    """On the Redis fan-out the state topics are heard on Postgres: a state ring late for three
    periods past its bound makes that source listen anew, on the same schedule as the fan-out's,
    while the fan-out's canary comes back. While the fan-out's canary is late too, the fan-out
    alone is asked: on the Postgres fan-out they share one listener, opened anew once."""
    fanout = _DeafFanOut()
    states = _DeafStates(fanout)
    readiness = Readiness(fanout, away=lambda: None, draining=lambda: False, states=[states],  # type: ignore[list-item]
                          every=2.0, bound=5.0, clock=lambda: fanout.now)
    ring = readiness.ring_canaries[states]  # type: ignore[index]
    ring.published(ring.sent(100.0), "ring-1")
    for t in range(100, 200):
        fanout.now = float(t)
        readiness.canary.published(readiness.canary.sent(fanout.now), f"1-{t}")
        readiness.canary.on_heard(f"1-{t}", fanout.now)
        readiness._relisten_if_deaf(fanout.now)
    assert states.relistens == [111.0, 133.0, 177.0] and fanout.relistens == []
    fanout.now = 200.0
    readiness.canary.published(readiness.canary.sent(fanout.now), "1-late")
    for t in range(200, 300):  # the state ring's next re-listen was due at 265
        fanout.now = float(t)
        readiness._relisten_if_deaf(fanout.now)
    assert fanout.relistens == [211.0, 233.0, 277.0] and states.relistens == [111.0, 133.0, 177.0]


@contextlib.asynccontextmanager
async def ringing(readiness: Readiness) -> AsyncIterator[None]:
    """The loop that sends `readiness`'s rings and canaries, running through the block."""
    task = asyncio.create_task(readiness._ring())
    try:
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


def _ring_watch(fanout: _DeafFanOut, states: _DeafStates) -> Readiness:
    """A readiness of `fanout` with `states`, its canaries every 10 ms, late after 50 ms."""
    return Readiness(fanout, away=lambda: None, draining=lambda: False, states=[states],  # type: ignore[list-item]
                     every=0.01, bound=0.05, clock=lambda: fanout.now)


async def test_a_state_ring_that_could_not_be_sent_asks_no_state_source_to_listen_anew() -> None:
    """A ring that failed (the database refuses new connections while the listener's connection
    is fine) says nothing of the listener: reopening it then would lose a connection that hears,
    for one the database may refuse. As with the fan-out's canary, only a ring sent counts."""
    fanout = _DeafFanOut()
    states = _DeafStates(fanout)
    readiness = _ring_watch(fanout, states)
    async with ringing(readiness):
        await async_wait_for(lambda: len(states.rings) >= 3, 5.0, message="three rings tried")
    readiness.canary.unanswered.clear()  # the fan-out's canaries came back: its listener hears
    fanout.now = 100.0
    readiness._relisten_if_deaf(fanout.now)
    assert states.relistens == []


def test_a_canary_whose_publish_waited_out_an_outage_is_late_from_when_it_went_out() -> None:
    """A publish that waited a minute for a connection to a database that was away goes out when
    the database is back: the canary is deaf from then, not from when the loop began it. Counted
    from its start, the fan-out was made to listen anew the moment the outage ended, a loss, a
    catch-up and two WARNINGs for a listener that had just reconnected and heard."""
    fanout = _DeafFanOut()
    readiness = Readiness(fanout, away=lambda: None, draining=lambda: False, every=2.0, bound=5.0,
                          clock=lambda: fanout.now)
    readiness.canary.published(readiness.canary.sent(0.0), "1-1", at=60.0)
    for t in range(60, 72):
        fanout.now = float(t)
        readiness._relisten_if_deaf(fanout.now)
    assert fanout.relistens == [71.0]


class _ListenerAwayStates(_DeafStates):
    """A state source whose listener is away while its ring goes out (lost a moment before, and
    back after): the ring's NOTIFY reaches no LISTEN, and the loop's next ring waits meanwhile."""

    def __init__(self, fanout: _DeafFanOut) -> None:
        super().__init__(fanout)
        self.listening = False
        self.next_ring: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    async def ring_canary(self, token: str) -> None:
        self.rings.append(token)
        if len(self.rings) > 1:
            await self.next_ring  # a pool that cannot connect: the next ring waits


async def test_a_ring_that_went_out_while_its_listener_was_away_asks_for_no_re_listen() -> None:
    """A ring sent while its own listener is away (lost, reconnecting) cannot be heard, and says
    nothing of the listener that comes back: counted, it had the listener that had just
    reconnected dropped again, which with Postgres out of connection slots stayed away a minute."""
    fanout = _DeafFanOut()
    states = _ListenerAwayStates(fanout)
    readiness = _ring_watch(fanout, states)
    async with ringing(readiness):
        await async_wait_for(lambda: len(states.rings) >= 2, 5.0, message="a ring sent, the next one waiting")
        states.listening = True  # the listener is back
        readiness.canary.unanswered.clear()  # the fan-out's canaries come back: its listener hears
        fanout.now = 100.0
        readiness._relisten_if_deaf(fanout.now)
        assert states.relistens == []


class _ScriptedFanOut(LocalFanOut):
    """A fan-out whose each canary publish waits for the next error put in `failures`, and raises it."""

    def __init__(self) -> None:
        super().__init__()
        self.failures: asyncio.Queue[Exception] = asyncio.Queue()
        self.publishes = 0

    async def apublish(self, topic: str, data: object, *, conn: object = None) -> str:  # type: ignore[override]
        failure = await self.failures.get()
        self.publishes += 1
        raise failure


async def test_a_refused_canary_publish_is_not_named_once_the_fan_out_fails_for_another_reason() -> None:
    """A refusal (a grant revoked) is named in the canary check; once publishes fail for another
    reason (the database went away), the check no longer blames the grant, which may be back:
    the operator is sent to the outage, not to a grant that is there."""
    fanout = _ScriptedFanOut()
    readiness = Readiness(fanout, away=lambda: None, draining=lambda: False, every=0.01, bound=5.0,
                          clock=lambda: 0.0)

    async def detail_after(failure: Exception) -> str:
        publishes = fanout.publishes + 1
        fanout.failures.put_nowait(failure)
        await async_wait_for(lambda: fanout.publishes == publishes, 5.0, message="the canary's publish to fail")
        return str(json.loads(readiness.report()[1])["checks"]["canary"]["detail"])

    ringing = asyncio.create_task(readiness._ring())
    try:
        refused = await detail_after(ConfigError("permission denied for table livepush_topics: run livepush migrate "
                                                 "--runtime-role ROLE"))
        assert "its publish was refused: permission denied" in refused, refused
        away = await detail_after(DependencyError("cannot reach Postgres"))
        assert "refused" not in away and "permission denied" not in away, away
    finally:
        ringing.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await ringing


class _UnreadableFanOut(_ScriptedFanOut):
    """A scripted fan-out whose canary publish returns an offset when given one rather than an
    error, and whose history read is refused, as for a role without SELECT on the log."""

    async def apublish(self, topic: str, data: object, *, conn: object = None) -> str:  # type: ignore[override]
        outcome = await self.failures.get()
        self.publishes += 1
        if isinstance(outcome, Exception):
            raise outcome
        return str(outcome)

    async def history(self, topic: str, since: str, *, limit: int = 100,  # type: ignore[override]
                      timeout: float | None = None) -> None:
        raise ConfigError("permission denied for table livepush_messages: run livepush migrate --runtime-role ROLE")


async def test_a_refused_history_read_is_not_named_once_the_fan_out_fails_for_another_reason() -> None:
    """As for a refused publish: a read of the canary's topic refused (SELECT revoked) is named in
    the canary check; once publishes fail for another reason (the database went away), no read is
    made, and the check no longer blames the grant, which may be back meanwhile."""
    fanout = _UnreadableFanOut()
    readiness = Readiness(fanout, away=lambda: None, draining=lambda: False, every=0.01, bound=5.0,
                          clock=lambda: 0.0)

    def canary_detail() -> str:
        return str(json.loads(readiness.report()[1])["checks"]["canary"].get("detail", ""))

    ringing = asyncio.create_task(readiness._ring())
    try:
        fanout.failures.put_nowait("1-1")  # type: ignore[arg-type]  # published: the read after it is refused
        await async_wait_for(lambda: readiness.canary.unread is not None, 5.0, message="the read to be refused")
        assert "history was refused: permission denied" in canary_detail(), canary_detail()
        fanout.failures.put_nowait(DependencyError("cannot reach Postgres"))
        await async_wait_for(lambda: fanout.publishes == 2, 5.0, message="the next publish to fail")
        away = canary_detail()
        assert "refused" not in away and "permission denied" not in away, away
    finally:
        ringing.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await ringing


class _GrantedAgainFanOut(_UnreadableFanOut):
    """A scripted fan-out whose history read is refused only while `read_refused`."""

    read_refused = False

    async def history(self, topic: str, since: str, *, limit: int = 100,  # type: ignore[override]
                      timeout: float | None = None) -> None:
        if self.read_refused:
            await super().history(topic, since, limit=limit, timeout=timeout)


async def test_a_canary_refused_and_then_allowed_again_says_so_once_with_how_long_it_was_refused(
        caplog: pytest.LogCaptureFixture) -> None:
    """A grant revoked and given back: the refusal is one WARNING (at most once a minute), and its
    end is one more, with how long it lasted, as the listeners say they are back. Without it the
    log's last word was the refusal, and an operator could not tell it was over."""
    caplog.set_level(logging.WARNING, "livepush.server")
    fanout = _GrantedAgainFanOut()
    now = [0.0]
    readiness = Readiness(fanout, away=lambda: None, draining=lambda: False, every=0.01, bound=5.0,
                          clock=lambda: now[0])
    refusal = ConfigError("permission denied for table livepush_messages: run livepush migrate --runtime-role ROLE")
    async with ringing(readiness):
        for outcome in (refusal, refusal, "1-1"):
            fanout.failures.put_nowait(outcome)  # type: ignore[arg-type]
        fanout.read_refused = True  # the read after the publish that goes through is refused too
        await async_wait_for(lambda: readiness.canary.unread is not None, 5.0, message="the read to be refused")
        now[0] = 42.0
        fanout.read_refused = False
        fanout.failures.put_nowait("1-2")  # type: ignore[arg-type]
        fanout.failures.put_nowait("1-3")  # type: ignore[arg-type]
        await async_wait_for(lambda: fanout.publishes == 5, 5.0, message="the canary published and read again")
    said = [r.getMessage() for r in caplog.records]
    assert len(said) == 3, said
    assert said[0].startswith("the readiness canary could not be published") and "history" in said[1], said
    assert said[2] == "the readiness canary is published and read again after 42.0 s of refusals: this server " \
                      "is ready again once it comes back", said


# -- a real server on each fan-out --------------------------------------------------------------

async def readyz(served: Served, port: int | None = None) -> tuple[int, dict[str, object]]:
    status, body = await http_get(port or served.server.port, "/readyz")
    return status, json.loads(body)


async def test_a_started_server_is_ready_and_names_each_check(served: Served) -> None:
    served.server.readiness.every = 0.1
    await async_wait_for(lambda: served.server.readiness.canary.answered_once, 10.0, message="a first canary")
    status, body = await readyz(served)
    assert status == 200, body
    assert body["status"] == "ready" and body["fanout"] == served.fanout.name
    checks = body["checks"]
    assert isinstance(checks, dict) and set(checks) == {"listening", "canary", "schema", "draining", "capacity"}
    assert all(c["ok"] for c in checks.values())
    assert checks["canary"]["round_trip_ms"] >= 0


async def test_a_runtime_beside_the_server_gone_unhealthy_is_named_in_the_listening_check(secret: str) -> None:
    """A server that does not hear every change it serves is not ready, and its /readyz body
    says which part is away in the `listening` check's `detail`, as every failing check does:
    here the job runtime beside it, whose health check fails."""
    settings = make_settings("local", secret, None, None)
    set_settings(settings)
    healthy = True
    server = PushServer(settings, LocalFanOut(), health=[lambda: healthy])
    await server.start()
    try:
        assert json.loads((await http_get(server.port, "/readyz"))[1])["checks"]["listening"] == {"ok": True}
        healthy = False
        status, body = await http_get(server.port, "/readyz")
        listening = json.loads(body)["checks"]["listening"]
        assert status == 503 and listening["ok"] is False, body
        assert "runtime" in listening["detail"], body
    finally:
        await server.stop()
        await server.fanout.aclose()
        set_settings(None)


async def test_a_draining_server_is_not_ready_while_healthz_still_answers(served: Served) -> None:
    await async_wait_for(lambda: served.server.readiness.canary.answered_once, 10.0, message="a first canary")
    port = served.server.port
    clients = [await WSClient.open(served.url) for _ in range(20)]  # closed in batches over 2 s
    closing = asyncio.create_task(served.server.close_connections(drain_seconds=2.0))
    try:
        await async_wait_for(lambda: served.server.draining, 5.0)
        status, body = await readyz(served, port)
        assert status == 503 and body["checks"]["draining"]["ok"] is False, body  # type: ignore[index]
        assert (await http_get(port, "/healthz"))[0] == 200
    finally:
        await closing
        for client in clients:
            await client.close()


async def test_a_server_at_its_connection_cap_is_not_ready_until_one_closes_while_healthz_stays_200(
        secret: str) -> None:
    """At LIVEPUSH_MAX_CONNECTIONS the server refuses every new upgrade (503): /readyz says so
    (503, its `capacity` check naming the cap), so that a load balancer sends the next page to
    another server instead of here; one connection closed, it is ready again. The process is
    alive and hears all along: /healthz stays 200."""
    settings = make_settings("local", secret, None, None, max_connections=2)
    set_settings(settings)
    server = PushServer(settings, LocalFanOut())
    server.readiness.every = 0.1
    await server.start()
    url = f"ws://127.0.0.1:{server.port}/"
    clients: list[WSClient] = []
    try:
        await async_wait_for(lambda: server.readiness.canary.answered_once, 10.0, message="a first canary")
        clients.append(await WSClient.open(url))
        status, body = await http_get(server.port, "/readyz")
        assert status == 200 and json.loads(body)["checks"]["capacity"] == {"ok": True}, body
        clients.append(await WSClient.open(url))
        await async_wait_for(lambda: len(server.clients) == 2, 5.0, message="both connections attached")
        status, body = await http_get(server.port, "/readyz")
        capacity = json.loads(body)["checks"]["capacity"]
        assert status == 503 and capacity["ok"] is False, body
        assert "LIVEPUSH_MAX_CONNECTIONS" in capacity["detail"] and "2" in capacity["detail"], body
        assert (await http_get(server.port, "/healthz"))[0] == 200
        await clients.pop().close()
        await async_wait_for(lambda: len(server.clients) == 1, 5.0, message="the connection closed")
        status, body = await http_get(server.port, "/readyz")
        assert status == 200, body
    finally:
        for client in clients:
            await client.close()
        await server.stop()
        await server.fanout.aclose()
        set_settings(None)


async def test_a_stop_closes_connections_at_once_while_the_canary_waits_on_a_database_that_answers_nothing(
        pg_url: str, secret: str, listener_backend: list[int]) -> None:
    """A stop closes every connection with 1001 at once, even while the canary's publish waits on
    a database backend that answers nothing (frozen with SIGSTOP, as a database cut off the
    network looks): the canary is given up on, not waited for, before the closes."""
    served = await start_served(make_settings("postgres", secret, pg_url, None))
    readiness = served.server.readiness
    closing: asyncio.Task[None] | None = None
    try:
        await async_wait_for(lambda: readiness.canary.answered_once, 10.0, message="a first canary")
        client = await WSClient.open(served.url)
        with psycopg.connect(pg_url) as holder:
            # A transaction that published on the canary's topic holds its row: the next canary
            # waits for it, in a backend that the test then freezes.
            served.fanout.publish(CANARY_TOPIC, {"held": True}, conn=holder)
            blocked: list[int] = []

            def canary_waiting() -> bool:
                with psycopg.connect(pg_url, autocommit=True) as conn:
                    row = conn.execute("SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
                                       "AND wait_event_type = 'Lock' AND query ILIKE '%%livepush_publish%%'").fetchone()
                blocked[:] = [row[0]] if row else []
                return bool(blocked)

            await async_wait_for(canary_waiting, 10.0, message="the next canary to wait on the held row")
            os.kill(blocked[0], signal.SIGSTOP)
            listener_backend.append(blocked[0])
            closing = asyncio.create_task(served.server.close_connections())
            assert await client.closed_with(timeout=2.0) == 1001
            os.kill(blocked[0], signal.SIGCONT)
            listener_backend.clear()
            holder.rollback()
        await asyncio.wait_for(closing, 15.0)
    finally:
        if closing is not None and not closing.done():
            closing.cancel()
        await served.stop()


async def test_the_round_trip_gauge_rises_while_the_canarys_publish_waits_on_the_database_unasked(
        pg_url: str, secret: str) -> None:
    """A canary's publish can wait as long as the database makes it (a pool waits 30 s for a
    connection to a database that is away, a held row as long as its holder): meanwhile
    livepush_canary_round_trip_seconds rises on a scrape, with no probe of /readyz to move it,
    instead of showing the last good trip for the first minute of an outage."""
    def gauge() -> float:
        return metrics.REGISTRY.get_sample_value("livepush_canary_round_trip_seconds") or 0.0

    served = await start_served(make_settings("postgres", secret, pg_url, None))
    readiness = served.server.readiness
    readiness.every = 0.1
    try:
        await async_wait_for(lambda: readiness.canary.answered_once, 10.0, message="a first canary")
        with psycopg.connect(pg_url) as holder:
            # A transaction that published on the canary's topic holds its row: the next canary's
            # publish waits for it.
            served.fanout.publish(CANARY_TOPIC, {"held": True}, conn=holder)
            await async_wait_for(lambda: gauge() >= 1.0, 5.0, message="the gauge to rise past 1 s")
            holder.rollback()
    finally:
        await served.stop()


@pytest.fixture
def listener_backend(pg_url: str) -> Iterator[list[int]]:
    """Pids of LISTEN backends the test stopped with SIGSTOP: continued at teardown whatever happened."""
    stopped: list[int] = []
    yield stopped
    for pid in stopped:
        os.kill(pid, signal.SIGCONT)


def freeze_listen_backend(pg_url: str, stopped: list[int]) -> int:
    """Stop the database's LISTEN backend with SIGSTOP (`listener_backend` continues it at
    teardown); its pid."""
    with psycopg.connect(pg_url, autocommit=True) as conn:
        row = conn.execute("SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
                           "AND query ILIKE 'LISTEN%%'").fetchone()
    assert row is not None, "no LISTEN backend found"
    os.kill(row[0], signal.SIGSTOP)
    stopped.append(row[0])
    return int(row[0])


async def test_a_wedged_listener_turns_readyz_503_while_healthz_stays_200_and_heals_by_itself(
        pg_url: str, secret: str, listener_backend: list[int]) -> None:
    """The listener's backend frozen (SIGSTOP): its connection looks fine, nothing arrives. Only
    the canary can tell; once the backend runs again the server is ready again without help."""
    served = await start_served(make_settings("postgres", secret, pg_url, None))
    readiness = served.server.readiness
    readiness.every, readiness.canary.bound = 0.1, 1.0
    try:
        await async_wait_for(lambda: readiness.canary.answered_once, 10.0, message="a first canary")
        pid = freeze_listen_backend(pg_url, listener_backend)
        await async_wait_for(lambda: not readiness.report()[0], 10.0, message="/readyz to turn 503")
        status, body = await readyz(served)
        assert status == 503 and body["checks"]["canary"]["ok"] is False, body  # type: ignore[index]
        assert body["checks"]["listening"]["ok"] is True  # type: ignore[index]
        assert (await http_get(served.server.port, "/healthz"))[0] == 200
        os.kill(pid, signal.SIGCONT)
        listener_backend.clear()
        await async_wait_for(lambda: readiness.report()[0], 10.0, message="/readyz to heal")
        assert (await readyz(served))[0] == 200
    finally:
        await served.stop()


async def test_a_wedged_state_listener_on_the_redis_fan_out_turns_readyz_503_and_heals_by_itself(
        pg_url: str, redis_url: str, secret: str, listener_backend: list[int]) -> None:
    """On the Redis fan-out the canary goes round Redis, while `job:`, `group:` and `workflow:`
    topics are rung on Postgres: a frozen LISTEN backend there leaves the fan-out's canary fine
    and every state topic deaf. The server rings its own state channel too, so /readyz says so."""
    settings = make_settings("redis", secret, None, redis_url)
    served = await start_served(dataclasses.replace(settings, database_url=pg_url))
    readiness = served.server.readiness
    readiness.every = 0.1
    for canary in (readiness.canary, *readiness.ring_canaries.values()):
        canary.bound = 1.0
    try:
        await async_wait_for(lambda: readiness.report()[0], 10.0, message="ready at first")
        pid = freeze_listen_backend(pg_url, listener_backend)
        await async_wait_for(lambda: not readiness.report()[0], 10.0, message="/readyz to turn 503")
        status, body = await readyz(served)
        canary = body["checks"]["canary"]  # type: ignore[index]
        assert status == 503 and canary["ok"] is False and "no state ring came back" in canary["detail"], body
        assert (await http_get(served.server.port, "/healthz"))[0] == 200
        os.kill(pid, signal.SIGCONT)
        listener_backend.clear()
        await async_wait_for(lambda: readiness.report()[0], 10.0, message="/readyz to heal")
    finally:
        await served.stop()


async def test_a_server_whose_redis_user_may_not_publish_its_canary_says_the_acl_refused_it(
        redis_url: str, secret: str, caplog: pytest.LogCaptureFixture) -> None:
    """A Redis user whose ACL leaves out +publish (one rule short of the line docs/security.md
    shows) listens, but cannot publish the readiness canary: /readyz stays 503, and both its body
    and one WARNING say that the ACL refused it and name the rule to add, as a Postgres role's
    refused grant is named, rather than only "no canary came back", which sends the operator to
    the network and the listener."""
    with documented_user(redis_url, "ready:acl", without="+publish") as user_url:
        served = await start_served(make_settings("redis", secret, None, user_url, redis_prefix="ready:acl"))
        try:
            async def refused_in_readyz() -> str | None:
                status, body = await readyz(served)
                assert status == 503, body
                detail = str(body["checks"]["canary"].get("detail", ""))  # type: ignore[index, union-attr]
                return detail if "refused" in detail else None

            detail = await async_wait_for(refused_in_readyz, 20, 0.2, message="/readyz to name the ACL's refusal")
            assert "the ACL of LIVEPUSH_REDIS_URL's user lacks +publish" in detail, detail
            assert "docs/security.md" in detail, detail
            said = [r.getMessage() for r in caplog.records
                    if r.levelname == "WARNING" and "lacks +publish" in r.getMessage()]
            assert len(said) == 1 and "canary" in said[0], said
        finally:
            await served.stop()


def schema_reads_waiting(pg_url: str) -> bool:
    """Whether a read of the schema's version waits for a lock."""
    with psycopg.connect(pg_url, autocommit=True) as conn:
        row = conn.execute("SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                           "AND query ILIKE '%%FROM livepush_schema%%'").fetchone()
    return bool(row and row[0])


async def test_a_schema_check_the_database_never_answers_does_not_stop_the_canary(
        pg_url: str, secret: str, listener_backend: list[int]) -> None:
    """The schema check waits on the database for ever (its table locked) and then the listener's
    backend freezes: the canary goes round all the same, and /readyz turns 503 as it would
    without the stuck check."""
    served = await start_served(make_settings("postgres", secret, pg_url, None))
    readiness = served.server.readiness
    readiness.every, readiness.schema_every, readiness.schema_timeout = 0.1, 0.1, 0.5
    readiness.canary.bound = 1.0
    try:
        await async_wait_for(lambda: readiness.report()[0], 10.0, message="ready at first")
        with psycopg.connect(pg_url) as locker:  # a transaction: the lock holds until it ends
            locker.execute("LOCK TABLE livepush_schema IN ACCESS EXCLUSIVE MODE")
            await async_wait_for(lambda: schema_reads_waiting(pg_url), 10.0, message="a schema check to wait")
            await async_wait_for(lambda: not readiness.canary.unanswered, 10.0, message="the last canary back")
            freeze_listen_backend(pg_url, listener_backend)
            await async_wait_for(lambda: not readiness.report()[0], 10.0, message="/readyz to turn 503")
            status, body = await readyz(served)
            assert status == 503 and body["checks"]["canary"]["ok"] is False, body  # type: ignore[index]
            locker.rollback()
    finally:
        await served.stop()


async def test_a_schema_older_than_the_code_makes_the_server_unready(pg_url: str, secret: str) -> None:
    served = await start_served(make_settings("postgres", secret, pg_url, None))
    readiness = served.server.readiness
    readiness.every, readiness.schema_every = 0.1, 0.1
    try:
        await async_wait_for(lambda: readiness.report()[0], 10.0, message="ready at first")
        with psycopg.connect(pg_url, autocommit=True) as conn:
            conn.execute("DELETE FROM livepush_schema WHERE version = (SELECT max(version) FROM livepush_schema)")
        await async_wait_for(lambda: not readiness.report()[0], 10.0, message="/readyz to turn 503")
        status, body = await readyz(served)
        schema = body["checks"]["schema"]  # type: ignore[index]
        assert status == 503 and schema["ok"] is False and "livepush migrate" in schema["detail"], body
    finally:
        await served.stop()


async def test_a_postgres_outage_on_the_redis_fan_out_names_every_part_that_hears_nothing(
        pg_url: str, pg_admin_url: str, redis_url: str, secret: str) -> None:
    """On the Redis fan-out a Postgres outage leaves the fan-out hearing and two parts deaf: the
    revocation store and the `job:`, `group:` and `workflow:` topics. /readyz names both, so an
    operator does not read one as the whole of it; once Postgres is back both heal by themselves."""
    settings = make_settings("redis", secret, None, redis_url)
    served = await start_served(dataclasses.replace(settings, database_url=pg_url))
    readiness = served.server.readiness
    readiness.every = 0.1
    try:
        await async_wait_for(lambda: readiness.report()[0], 10.0, message="ready at first")
        with services.pg_refusing_connections(pg_admin_url, services.dbname_of(pg_url)):
            services.pg_terminate(pg_admin_url, services.dbname_of(pg_url), "livepush-listener")
            await async_wait_for(lambda: not served.server.listening, 10.0, message="the listener to be away")
            status, body = await readyz(served)
            listening = body["checks"]["listening"]  # type: ignore[index]
            assert status == 503 and listening["ok"] is False, body
            assert "revocation store" in listening["detail"], body
            assert "job, group and workflow topics" in listening["detail"], body
            assert "redis fan-out" not in listening["detail"], body
        await async_wait_for(lambda: readiness.report()[0], 15.0, message="/readyz to heal")
    finally:
        await served.stop()


async def heals_with_one_warning(readiness: Readiness, caplog: pytest.LogCaptureFixture, said: str) -> None:
    """/readyz heals, and one WARNING, naming what came back late (`said`), told why a listener
    was opened anew."""
    await async_wait_for(lambda: readiness.report()[0], 10.0, message="/readyz to heal")
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING" and said in r.getMessage()]
    assert len(warnings) == 1, warnings


@pytest.mark.parametrize(("kind", "marker"), [("postgres", b"LISTEN"), ("redis", b"SUBSCRIBE")])
async def test_a_subscription_a_proxy_dropped_silently_is_opened_anew_and_its_clients_miss_nothing(
        kind: str, marker: bytes, secret: str, request: pytest.FixtureRequest,
        caplog: pytest.LogCaptureFixture) -> None:
    """A proxy between the server and its fan-out stops forwarding the listening connection and
    closes nothing: the listener looks connected and hears nothing. Once the canary has been late
    a few periods, the server listens anew, and a client connected all along gets what was
    published meanwhile, long before the listener's own ping would notice; a warning says why."""
    relay = Relay(request.getfixturevalue("pg_url" if kind == "postgres" else "redis_url"))
    url = relay.start()
    served = await start_served(make_settings(kind, secret, url, url))
    readiness = served.server.readiness
    readiness.every, readiness.canary.bound = 0.1, 1.0
    client = await WSClient.open(served.url)
    try:
        await async_wait_for(lambda: readiness.report()[0], 10.0, message="ready at first")
        await client.subscribe(served.sign("quiet"))
        await served.publish("quiet", {"i": 0})
        assert (await client.messages(1))[0]["data"] == {"i": 0}
        assert relay.silence(marker) == 1
        await served.publish("quiet", {"i": 1})  # published through the pool, which still works
        await async_wait_for(lambda: not readiness.report()[0], 10.0, message="/readyz to turn 503")
        assert served.fanout.listening  # it looks connected: /healthz cannot tell
        # Within the bound the listener's own ping (every 5 s, answered within 5 s) is too slow
        # to have noticed: only the canary can have mended it.
        [heard] = await client.messages(1, timeout=4.0)
        assert heard["op"] == "reset" or heard["data"] == {"i": 1}, heard
        await served.publish("quiet", {"i": 2})
        frames = await client.messages(1)
        assert frames[-1]["data"] == {"i": 2}
        await heals_with_one_warning(readiness, caplog, "no readiness canary came back")
    finally:
        await client.close()
        await served.stop()
        relay.close()


async def test_a_postgres_listener_a_proxy_dropped_silently_on_the_redis_fan_out_is_opened_anew(
        pg_url: str, redis_url: str, secret: str, caplog: pytest.LogCaptureFixture) -> None:
    """On the Redis fan-out, `job:` topics are heard on Postgres. A proxy that stops forwarding that
    LISTEN connection and closes nothing leaves it looking connected and hearing nothing: once the
    state ring has been late a few periods the server listens there anew, and a client watching a
    job all along gets the state it missed; a warning says why."""
    relay = Relay(pg_url)
    url = relay.start()
    settings = make_settings("redis", secret, None, redis_url)
    served = await start_served(dataclasses.replace(settings, database_url=url))
    database.configure(pg_url)
    readiness = served.server.readiness
    readiness.every = 0.1
    for canary in (readiness.canary, *readiness.ring_canaries.values()):
        canary.bound = 1.0
    client = await WSClient.open(served.url)
    try:
        await async_wait_for(lambda: readiness.report()[0], 10.0, message="ready at first")
        handle = await asyncio.to_thread(_quiet_job.enqueue)
        await client.subscribe(handle.signed_topic)
        assert (await client.messages(1))[0]["data"]["job"]["state"] == "available"
        assert relay.silence(b"LISTEN") == 1
        assert await asyncio.to_thread(jobs.cancel, handle.id)  # through another connection, which works
        await async_wait_for(lambda: not readiness.report()[0], 10.0, message="/readyz to turn 503")
        assert served.server.listening  # it looks connected: /healthz cannot tell
        # Within the bound the listener's own ping (every 5 s, answered within 5 s) is too slow
        # to have noticed: only the state ring can have mended it.
        [heard] = await client.messages(1, timeout=4.0)
        assert heard["data"]["job"]["state"] == "cancelled", heard
        await heals_with_one_warning(readiness, caplog, "no state ring came back")
    finally:
        database.configure(None)
        await client.close()
        await served.stop()
        relay.close()


async def revocation_ring_mends(settings: Settings, relay: Relay, marker: bytes,
                                caplog: pytest.LogCaptureFixture) -> None:
    """Serve `settings`, whose revocation store alone listens through `relay`, and silence that
    listening connection (the one that sent `marker`): /readyz says the revocation ring is
    missing, the server listens anew, a session revoked meanwhile is closed then, not at the
    periodic re-check (an hour here), and a warning says why."""
    served = await start_served(settings, app=App(reverify_interval=3600))
    readiness = served.server.readiness
    readiness.every = 0.1
    for canary in (readiness.canary, *readiness.ring_canaries.values()):
        canary.bound = 1.0
    token = sessions.issue("user-7")
    client = await WSClient.open(served.url, additional_headers={"Cookie": f"livepush_session={token}"})
    try:
        assert client.hello["session"] == {"subject": "user-7"}
        await async_wait_for(lambda: readiness.report()[0], 10.0, message="ready at first")
        assert relay.silence(marker) == 1
        await asyncio.to_thread(sessions.revoke, token)  # stored through another connection, which works
        await async_wait_for(lambda: not readiness.report()[0], 10.0, message="/readyz to turn 503")
        status, body = await readyz(served)
        canary = body["checks"]["canary"]  # type: ignore[index]
        assert status == 503 and "no revocation ring came back" in canary["detail"], body
        assert served.server.listening  # it looks connected: /healthz cannot tell
        # Within this bound the listener's own ping (every 5 s, answered within 5 s) is too slow
        # to have noticed: only the revocation ring can have mended it.
        assert await client.closed_with(timeout=4.0) == 4403
        await heals_with_one_warning(readiness, caplog, "no revocation ring came back")
    finally:
        await client.close()
        await served.stop()
        set_settings(None)


async def test_a_revocation_listener_a_proxy_dropped_silently_on_the_redis_fan_out_is_opened_anew(
        make_pg_url: Callable[[], str], redis_url: str, secret: str, caplog: pytest.LogCaptureFixture) -> None:
    """On the Redis fan-out with the jobs in another database (jobs.configure()), the revocation
    store is the only part that listens on the sessions' database, so neither the fan-out's canary
    nor the state ring goes through its listener. A proxy that stops forwarding that LISTEN
    connection and closes nothing leaves it looking connected and hearing nothing: the server rings
    the revocation channel too, and mends it (revocation_ring_mends)."""
    settings_url, jobs_url = make_pg_url(), make_pg_url()
    relay = Relay(settings_url)
    url = relay.start()
    database.configure(jobs_url)
    try:
        settings = dataclasses.replace(make_settings("redis", secret, None, redis_url), database_url=url)
        await revocation_ring_mends(settings, relay, b"LISTEN", caplog)
    finally:
        database.configure(None)
        relay.close()


async def test_a_revocation_subscription_a_proxy_dropped_silently_on_the_local_fan_out_is_opened_anew(
        redis_url: str, secret: str, caplog: pytest.LogCaptureFixture) -> None:
    """On the local fan-out with a Redis URL and no database, revocations are kept in Redis and
    heard on its pub/sub, through which neither the fan-out's canary nor any state ring goes. A
    proxy that stops forwarding that subscription and closes nothing leaves it looking connected
    and hearing nothing: the server rings the revocation channel, and mends it
    (revocation_ring_mends)."""
    relay = Relay(redis_url)
    url = relay.start()
    try:
        settings = dataclasses.replace(make_settings("local", secret, None, None), redis_url=url)
        await revocation_ring_mends(settings, relay, b"SUBSCRIBE", caplog)
    finally:
        relay.close()
