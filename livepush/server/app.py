"""The WebSocket server: accepts connections, turns frames into hub calls, stops cleanly.

Moves frames in and out and nothing more: the protocol is in `livepush.protocol`, the ordering
in `hub`, the handshake's security decisions in `livepush.sessions.handshake`, the rules in
`livepush.sessions.rules`. Every part it reads from (fan-out, state sources, revocation store)
is handed to it by the wiring (the CLI, the demo).

The connection core moves the bytes (docs/architecture.md#the-connection-core): websockets'
sans-I/O protocol under one asyncio.Protocol per connection (`connection.py`) and one listener
with one sweep for every timer (`core.py`); it asks this server for the gate (`admit()`) and
hands it each frame (`on_frame()`).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

from websockets.exceptions import ConnectionClosed
from websockets.http11 import Request, Response

from .. import metrics, protocol, topics
from ..config import Settings
from ..errors import ConfigError, DependencyError, InvalidTopic, first_line
from ..fanout import FanOut
from ..sessions.handshake import REASONS as SESSION_REASONS
from ..sessions.handshake import authenticate, duplicated_header, ignored_token, origin_allowed, refused_origin_advice
from ..sessions.revocations import MEMORY, READ_TIMEOUT, RevocationStore
from ..sessions.rules import App
from ..tasks import stop as stop_task
from ..tasks import supervise
from ..types import StateSource
from . import drain, http
from .connection import CLOSE_INTERNAL_ERROR, Connection, broadcast
from .core import ConnectionCore
from .hub import Hub, Interrupted
from .limits import FirstOfEach, Quiet
from .readiness import Readiness, SchemaCheck

log = logging.getLogger("livepush.server")

HEARTBEAT_SECONDS = 25.0
PRUNE_EVERY_SECONDS = 30.0
# prune() calls per cycle at most: on Postgres 100 batches of 5,000 rows, about 17,000 rows a
# second, well past the ~4,000 messages a second a database takes.
PRUNE_MAX_CALLS = 100
# After a re-check of the open sessions, the next one waits this long: rings that come meanwhile
# are served by one re-check after it. Anyone who can connect to the database can ring, so a flood
# of forged rings costs a bounded number of re-checks (each one query over every open session),
# not one after another for as long as it lasts; a real revocation still closes within a second.
RECHECK_PAUSE = 0.1
# A re-check that could not read the store is tried again after this long, while it cannot: a
# revocation whose ring came just then must not wait for the next reverify_interval.
RECHECK_RETRY = 0.5
# Refused origins named in a WARNING, each once an hour: a page on an origin the operator forgot
# to allow shows "reconnecting" for ever, and this line is where the cause shows. Past these, a
# client sending a new Origin each time would fill the log: the rest of the hour's are debug lines.
WARNED_ORIGINS = 10
WARNED_ORIGINS_PERIOD = 3600.0
# A read of the revocation store fails after this long. A read that blocks (a migration holding a
# revocation table's lock, a frozen connection) held every later re-check, so that sessions that
# expired meanwhile stayed open, and each handshake with a session until the opening timed out and
# its connection was dropped. A re-check (one statement for every open session) is then tried
# again; a handshake is answered 503, which the client retries.
STORE_READ_TIMEOUT = READ_TIMEOUT

PageRoute = Callable[[Request], Awaitable[Response | None] | Response | None]


@dataclass(frozen=True, slots=True)
class Admitted:
    """The gate's verdict for an upgrade it lets through: the session (None: anonymous)."""

    session: Any


def _store_failure(exc: Exception) -> str:
    """Why a read of the revocation store failed, for a log line."""
    if isinstance(exc, TimeoutError):
        return f"the revocation store did not answer within {STORE_READ_TIMEOUT:g} s"
    return first_line(exc)


class PushServer:
    """One server process's push side. `start()` listens; `stop()` closes everything."""

    def __init__(
        self,
        settings: Settings,
        fanout: FanOut,
        *,
        app: App | None = None,
        store: RevocationStore | None = None,
        states: Sequence[StateSource] = (),
        ring_store: bool = False,
        pages: PageRoute | None = None,
        heartbeat: float = HEARTBEAT_SECONDS,
        health: Sequence[Callable[[], bool]] = (),
        schema: SchemaCheck | None = None,
        refreshers: Sequence[metrics.Refresher] = (),
        worker: int | None = None,
    ) -> None:
        self.settings = settings
        self.fanout = fanout
        self.app = app if app is not None else App()  # default: signed topics only
        if settings.authenticate == "off":
            self._warn_session_rules()
        elif settings.authenticate == "required":
            metrics.count_refusals(f"session_{reason}" for reason in SESSION_REASONS)
        self.store = store if store is not None else MEMORY
        self.states = list(states)
        # ignore: the hub hands broadcast() only the subscribers it was given, this server's
        # Connections, which its Subscriber protocol cannot say without making the hub generic.
        self.hub = Hub(fanout, broadcast, states=self.states)  # type: ignore[arg-type]
        self.pages = pages
        self.heartbeat = heartbeat
        self._health = list(health)
        self._refreshers = list(refreshers)  # what refreshes the database gauges of /metrics
        self._draining = False
        self._drain_end = 0.0  # the loop's time at which the drain closes its last connection
        # One of `serve --workers N`'s processes: it shares its port with the others (SO_REUSEPORT,
        # the kernel spreads connections) and names itself in /readyz.
        self.worker = worker
        # `ring_store`: the store's listener is no other part's (the wiring knows), so readiness
        # rings the store's own channel to see that it hears.
        self._ring_store = ring_store
        self.readiness = Readiness(fanout, away=self.away, draining=lambda: self.draining, full=self._at_cap,
                                   schema=schema, states=self.states, revocations=self.store if ring_store else None,
                                   worker=worker)
        self._readiness_task: asyncio.Task[None] | None = None
        self.clients: set[Connection] = set()  # the open connections
        self._core: ConnectionCore | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._reverify_now = asyncio.Event()
        self._rings = 0  # revocation rings heard: a handshake whose store read one overlapped checks again
        self._recheck_failures = 0  # re-checks in a row that could not read the store
        self._prune_failures = 0  # prune cycles in a row that could not reach the store
        self._quiet = Quiet(log)  # what clients can cause: rate-limited
        self._refused_origins = FirstOfEach(
            log, WARNED_ORIGINS, f"refused connections from {WARNED_ORIGINS} different origins this hour, each named "
            "in a WARNING once: connections refused from further origins are logged at debug level only until the "
            "hour is over (livepush_refusals_total{reason=\"origin\"} counts them all)", WARNED_ORIGINS_PERIOD)

    def _warn_session_rules(self) -> None:
        """Say once, as the server is made, that the app's rules that need a session allow nothing
        here: every connection is anonymous, and each of their subscribes was a `forbidden`, which
        the client takes as final, with nothing anywhere saying why."""
        patterns = self.app._session_rules()
        if patterns:
            log.warning("%s makes every connection anonymous, so %s%s need a session and allow nothing: make it "
                        "optional (the default) to read sessions, or give the rules meant for everyone anonymous=True",
                        self.settings.named("authenticate", "off"),
                        ", ".join(f"Allow({p!r})" for p in patterns[:3]), " ..." if len(patterns) > 3 else "")

    # -- lifecycle --------------------------------------------------------------------
    async def start(self) -> None:
        await self.fanout.listen()
        self.fanout.register(self.hub.on_message)
        self.fanout.register(self.readiness.on_message)
        self.fanout.on_resync(self.hub.resync)
        for source in self.states:
            source.watch(self.hub.on_state_change, functools.partial(self.hub.on_state_resync, source),
                         self.hub.on_state_created, self.readiness.ring_heard(source))
            await source.listen()
        if self._ring_store:
            await self.store.watch(self._revocation_rang, on_canary=self.readiness.ring_heard(self.store))
        else:
            await self.store.watch(self._revocation_rang)
        self._core = ConnectionCore(self)
        await self._core.listen(self.settings.host, self.settings.port, reuse_port=self.worker is not None)
        self._tasks.append(supervise("livepush-prune", self._prune_loop))
        self._tasks.append(supervise("livepush-reverify", self._reverify_loop))
        self._readiness_task = supervise("livepush-readiness", self.readiness.run)

    @property
    def port(self) -> int:
        assert self._core is not None
        return self._core.port

    @property
    def listening(self) -> bool:
        """The fan-out, the revocation store and every state source hear changes, and every
        extra check (a runtime beside the server) passes: what /healthz answers."""
        return self.away() is None

    def away(self) -> str | None:
        """Which parts of the server do not hear their changes (the `detail` of /readyz's
        `listening` check), None while every part does. Every one is named: on the Redis fan-out
        a Postgres outage deafens the revocation store and the state topics at once, and naming
        the first alone would hide that `job:` topics are silent too."""
        parts: list[str] = []
        if not self.fanout.listening:
            parts.append(f"the {self.fanout.name} fan-out's listener is away")
        if not self.store.listening:
            parts.append("the revocation store's listener is away")
        if not all(s.listening for s in self.states):
            parts.append("the listener of job, group and workflow topics is away")
        if not all(check() for check in self._health):
            parts.append("the job runtime beside the server is unhealthy: see its log")
        return "; ".join(parts) or None

    @property
    def draining(self) -> bool:
        """True from the moment close_connections() begins: new WebSocket upgrades get 503."""
        return self._draining

    async def close_connections(self, drain_seconds: float = 0.0) -> None:
        """Stop accepting and close every connection with 1001: at once, or in batches over
        `drain_seconds` with a `retry=MS` reason (livepush/server/drain.py). Each close waits at
        most close_timeout for the client's answer. The fan-out stays usable for publishers."""
        self._draining = True
        self._drain_end = asyncio.get_running_loop().time() + drain_seconds
        # No canary from now on, but its end is awaited only after the closes: a canary cancelled
        # while its database answers nothing takes seconds to give up (the driver asks the server
        # to cancel, then waits for it), and every client waited for that before its 1001.
        readiness = self._readiness_task
        if readiness is not None:
            readiness.cancel()
        if drain_seconds > 0:
            await drain.close_paced(lambda: self.clients, drain_seconds)
        for task in self._tasks:
            task.cancel()
        if self._core is not None:
            await self._core.close()
        await stop_task(readiness)  # its canary publishes through the fan-out, closed after us

    async def stop(self) -> None:
        """close_connections(), then release the hub; the parts it was given are their owner's."""
        await self.close_connections()
        await self.hub.aclose()
        self.app.close()

    # -- HTTP -------------------------------------------------------------------------
    async def admit(self, request: Request) -> Response | Admitted:
        """The gate: the answer to a plain HTTP request or a refused upgrade, else the upgrade's
        session. The upgrade itself (Sec-WebSocket-Key, subprotocol) is the core's."""
        duplicate = duplicated_header(request.headers)
        if duplicate is not None:
            self._quiet.debug("refused a request with two %s headers", duplicate)
            metrics.REFUSALS.labels("duplicate_header").inc()
            return http.response(400, f"one {duplicate} header at most\n".encode())
        path = http.route(request.path)
        if not http.is_websocket(request):
            return await self._plain_http(request, path)  # a HEAD's body is dropped by the core
        if "Host" not in request.headers:
            # RFC 9112 asks a 400 of an HTTP/1.1 request without Host. Only upgrades are held to
            # it (every browser sends one): a hand-written health probe that leaves it out is answered.
            self._quiet.debug("refused an upgrade without a Host header")
            metrics.REFUSALS.labels("missing_host").inc()
            return http.response(400, b"an HTTP/1.1 request needs a Host header\n")
        if self._draining:
            return drain.refusal(self._drain_end - asyncio.get_running_loop().time())
        if self._full():
            return self._full_response()
        if not origin_allowed(request.headers, self.settings.allowed_origins):
            # One Origin header: two got 400 above, and none is allowed.
            origin = request.headers.get("Origin", "")[:200]
            if self._refused_origins.new(origin.strip().rstrip("/").lower()):
                log.warning("refused a connection from origin %r: %s", origin,
                            refused_origin_advice(origin, self.settings.allowed_origins))
            else:
                self._quiet.debug("refused a connection from a disallowed origin (set LIVEPUSH_ALLOWED_ORIGINS to allow it)")
            metrics.REFUSALS.labels("origin").inc()
            return http.response(403, b"origin not allowed: set LIVEPUSH_ALLOWED_ORIGINS\n")
        rings = self._rings
        try:
            async with asyncio.timeout(STORE_READ_TIMEOUT):
                session, reason = await authenticate(request.headers, request.path, self.settings, self.store)
        except (DependencyError, TimeoutError) as exc:
            # Each client retries its handshake through the outage: quiet, or they would fill the log.
            self._quiet.warning("cannot check sessions right now: %s", _store_failure(exc))
            metrics.REFUSALS.labels("session_store_unavailable").inc()
            return http.response(503, b"session store unavailable, retry shortly\n")
        if session is not None and self._rings != rings:
            # A revocation rang while the store was read, and its re-check did not see this
            # connection, not attached yet (it is, right after we return): check again.
            self._reverify_now.set()
        if reason and reason != "missing":
            self._quiet.debug("a connection without a valid session: %s", reason)
        elif reason and log.isEnabledFor(logging.DEBUG):
            ignored = ignored_token(request.headers, request.path, self.settings)
            if ignored is not None:
                self._quiet.debug("a connection's token did not count, so it has no session: it sent %s", ignored)
        # Counted again after the store's answer: handshakes that waited on it together all
        # passed the check above, and only those that still fit may be attached.
        if self._full():
            return self._full_response()
        if reason and self.settings.authenticate == "required":
            metrics.REFUSALS.labels(f"session_{reason}").inc()  # closed with 4401 once upgraded
        return Admitted(session)

    async def _plain_http(self, request: Request, path: str) -> Response:
        """The answer to a request that is no upgrade: a route of ours, else the pages', else 404."""
        if path in ("/healthz", "/readyz", "/metrics", "/livepush.js") and request.method not in http.READ_METHODS:
            return http.not_allowed()
        if path == "/healthz":
            return http.healthz(self.listening, self.fanout.name)
        if path == "/readyz":
            ready, body = self.readiness.report()
            return http.response(200 if ready else 503, body, "application/json")
        if path == "/metrics":
            return http.response(200, await metrics.render(self._refreshers), metrics.CONTENT_TYPE)
        if path == "/livepush.js":
            return http.serve_js(request)
        if self.pages is not None:
            result = self.pages(request)
            if asyncio.iscoroutine(result):
                result = await result
            if result is not None:
                return result  # type: ignore[return-value]
        return http.response(404, b"not found\n")

    def _full(self) -> bool:
        """At LIVEPUSH_MAX_CONNECTIONS open connections. The core attaches an upgrade in the step
        that ends its handshake, with no await after admit(): a check after admit's last await
        holds."""
        cap = self.settings.max_connections
        return cap is not None and len(self.clients) >= cap

    def _at_cap(self) -> str | None:
        """What /readyz's `capacity` check says while _full(): the upgrades it refuses meanwhile are
        better sent to another server. None below the cap."""
        if not self._full():
            return None
        return (f"at LIVEPUSH_MAX_CONNECTIONS ({self.settings.max_connections} connections open): new ones are "
                "refused until some close")

    def _full_response(self) -> Response:
        self._quiet.debug("refused a connection: %d connections is LIVEPUSH_MAX_CONNECTIONS",
                          self.settings.max_connections)
        metrics.REFUSALS.labels("full").inc()
        return http.response(503, b"this server is full: retry shortly\n", Retry_After="5")

    # -- connections ------------------------------------------------------------------
    def refuses(self, session: object) -> bool:
        """Whether an upgraded connection must be closed with 4401 before it is served."""
        return session is None and self.settings.authenticate == "required"

    def attach(self, client: Connection) -> None:
        """A connection opened: count it and say hello."""
        self.clients.add(client)
        metrics.CONNECTIONS.inc()
        client.send(protocol.hello(client.subject, self.heartbeat))

    def detach(self, client: Connection) -> None:
        """A connection closed: forget it and its subscriptions."""
        if client not in self.clients:
            return
        self.clients.discard(client)
        metrics.CONNECTIONS.dec()
        metrics.SUBSCRIPTIONS.dec(len(client.topics))
        for topic in client.topics:
            self.hub.unsubscribe(client, topic)
        client.topics.clear()

    def on_frame(self, client: Connection, cmd: protocol.Command) -> Awaitable[None] | None:
        """Act on one client frame, parsed by the connection as it came; a subscribe returns what
        to await (the hub reads), any other frame is done on return. The next frame of that client
        waits for it either way."""
        if isinstance(cmd, protocol.BadFrame):
            client.send(protocol.error(cmd.reason, cmd.detail))
            if client.bad_frames.add(time.monotonic()):
                client.close(protocol.CLOSE_POLICY, "too many bad frames")
        elif isinstance(cmd, protocol.Subscribe):
            return self._subscribe(client, cmd)
        elif isinstance(cmd, protocol.Unsubscribe):
            self._unsubscribe(client, topics.plain_part(cmd.topic))
        elif isinstance(cmd, protocol.Ping):
            client.send(protocol.pong(cmd.ref))
        return None

    def served_at_once(self, client: Connection, cmd: protocol.Command) -> bool:
        """Serve `cmd` now if it is an unsubscribe of the topic whose replay (or snapshot) the
        client's subscribe is sending, the next frame after that subscribe: waiting its turn,
        it came only once the client had read the whole replay it no longer wants. Anything else
        waits, and is answered in the order sent."""
        if not isinstance(cmd, protocol.Unsubscribe):
            return False
        plain = topics.plain_part(cmd.topic)
        if not self.hub.joining(client, plain):
            return False
        self._unsubscribe(client, plain)
        return True

    def overflowed(self, client: Connection, topic: str) -> bool:
        """The client's share of message topic `topic` is full: whether the hub sends it the rest
        from history (Hub.overflowed) rather than `reset`."""
        return self.hub.overflowed(client, topic)

    def _unsubscribe(self, client: Connection, plain: str) -> None:
        if plain in client.topics:
            client.topics.discard(plain)
            metrics.SUBSCRIPTIONS.dec()
            self.hub.unsubscribe(client, plain)

    async def _subscribe(self, client: Connection, cmd: protocol.Subscribe) -> None:
        if self._expired(client):
            return
        if not client.subscribes.take(time.monotonic()):
            self._refuse(client, cmd.ref, "limit")
            return
        try:
            if topics.is_signed(cmd.topic):
                plain = topics.verify(cmd.topic, self.settings.secrets)  # its own permission
            else:
                plain = topics.validate_topic(cmd.topic)
            if topics.state_topic_id(plain) is not None and self.hub.source_of(plain) is None:
                # No state source (a server without a database): nothing could ever show this
                # job, group or workflow, and publish() refuses its topic. A `subscribed` would
                # hear nothing for ever; a refusal the client does not retry says so.
                raise InvalidTopic(f"{plain}: this server has no database to read it from")
            if plain not in client.topics and len(client.topics) >= self.app.max_subscriptions:
                # Before authorize(): a client at its limit would otherwise have the app's
                # check (often a database read) run for every refused subscribe it sends.
                self._refuse(client, cmd.ref, "limit")
                return
            if not topics.is_signed(cmd.topic):
                reason = await self.app.check(client.session, plain)
                if client.closing:
                    # Lost while authorize() answered: asyncio.wait_for may hand back an answer
                    # that came with its cancellation, and the connection, detached already,
                    # would stay subscribed in the hub for ever.
                    return
                if self._expired(client):
                    return  # it ran out while authorize() decided (which may take seconds)
                if reason is not None:
                    self._refuse(client, cmd.ref, reason)
                    return
        except InvalidTopic as exc:
            self._refuse(client, cmd.ref, exc.reason)
            return
        again = plain in client.topics
        if not again:
            client.topics.add(plain)
            metrics.SUBSCRIPTIONS.inc()
        try:
            await self.hub.subscribe(client, plain, cmd.since, cmd.ref)
        except ConnectionClosed:
            raise
        except Exception as exc:
            self._quiet.warning("subscribe to %s failed: %s", plain, first_line(exc))  # clients retry
            # Not in client.topics: the client unsubscribed while it was served (served_at_once).
            wanted = plain in client.topics
            if wanted:
                client.topics.discard(plain)
                metrics.SUBSCRIPTIONS.dec()
            self.hub.unsubscribe(client, plain)
            if wanted and (again or isinstance(exc, Interrupted)):
                # The connection's earlier subscription to the topic is gone with this one, and a
                # retry would start from now; or the client holds `subscribed` already and would
                # not hear a refusal: it reconnects and resumes from its offsets. (One that
                # unsubscribed wants nothing more of the topic: its other topics go on.)
                client.close(CLOSE_INTERNAL_ERROR, "unavailable")
                return
            if not isinstance(exc, Interrupted):  # the subscribe's one answer, if it had none
                self._refuse(client, cmd.ref, "unavailable")

    @staticmethod
    def _expired(client: Connection) -> bool:
        """Close `client` with 4403 if its session has expired, and say so. The periodic re-check
        would close it within reverify_interval; until then its rules and authorize() must not
        grant a credential that has run out anything more."""
        session = client.session
        if session is None or not session.expired():
            return False
        client.close(protocol.CLOSE_REVOKED, "session expired")
        return True

    @staticmethod
    def _refuse(client: Connection, ref: protocol.Ref, reason: str) -> None:
        metrics.REFUSALS.labels(f"subscribe_{reason}").inc()
        client.send(protocol.refused(ref, reason))

    # -- sessions ---------------------------------------------------------------------
    def _revocation_rang(self) -> None:
        self._rings += 1
        self._reverify_now.set()

    async def _reverify_loop(self) -> None:
        """Re-check open sessions every reverify_interval, and at once when the store rings
        (a revocation somewhere): the store, not the ring, says who is revoked."""
        while True:
            wait = RECHECK_RETRY if self._recheck_failures else self.app.reverify_interval
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._reverify_now.wait(), wait)
            self._reverify_now.clear()
            await self.reverify()
            await asyncio.sleep(RECHECK_PAUSE)

    async def reverify(self) -> None:
        """Close connections whose session expired or was revoked (a missed revocation too). When
        the store cannot be read, the re-check loop reads again after RECHECK_RETRY."""
        now = time.time()
        with_sessions = [c for c in self.clients if c.session is not None and not c.closing]
        if not with_sessions:
            self._recheck_failures = 0
            return
        for client in with_sessions:
            if client.session.expires_at <= now:
                client.close(protocol.CLOSE_REVOKED, "session expired")
        try:
            async with asyncio.timeout(STORE_READ_TIMEOUT):
                revoked = await self.store.revoked_among([c.session for c in with_sessions])
        except Exception as exc:
            self._recheck_failures += 1
            (log.warning if self._recheck_failures == 1 else log.debug)(
                "could not re-check sessions (%s); trying again every %g s", _store_failure(exc), RECHECK_RETRY)
            return
        self._recheck_failures = 0
        for client in with_sessions:
            if client.session.id in revoked:
                client.close(protocol.CLOSE_REVOKED, "session revoked")

    # -- maintenance ------------------------------------------------------------------
    async def _prune_loop(self) -> None:
        while True:
            await asyncio.sleep(PRUNE_EVERY_SECONDS)
            try:
                # Each prune() is a bounded batch, so no statement runs long; a cycle goes on
                # while batches drop something. One batch a cycle (5,000 rows in 30 s on Postgres)
                # is far below what a server may publish, and the history would grow for ever.
                for _ in range(PRUNE_MAX_CALLS):
                    if not await self.fanout.prune():
                        break
                self._prune_failures = 0
            except ConfigError as exc:
                # A role without DELETE on the history (a grant revoked by hand). Said each cycle
                # and tried again, so pruning resumes once the grant is back; as a crash of the
                # task it was a traceback, and after ten cycles no pruning at all.
                log.warning("history pruning failed (will retry): %s", exc)
            except DependencyError as exc:
                # The store is away: said once an outage, as the server's other reads say it, not a
                # line every cycle for as long as it lasts; the listener's lines say when it ends.
                self._prune_failures += 1
                (log.warning if self._prune_failures == 1 else log.debug)(
                    "history pruning failed (will retry every %g s): %s", PRUNE_EVERY_SECONDS, exc)
