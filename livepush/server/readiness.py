"""What `/readyz` answers: whether a load balancer should send this server new connections.

Five checks, each named in the JSON body (docs/reference.md#9-operations):
- listening: what /healthz says (the fan-out and every state source hear their changes), and
  when not, which part does not;
- canary: a message this server publishes to itself through the fan-out every CANARY_EVERY
  seconds came back within CANARY_BOUND, and so did a ring of each state source's channel
  (`RingPath.ring_canary`), which may be heard elsewhere (on the Redis fan-out, `job:` topics
  are rung on Postgres), and of the revocation store's when the wiring says no other ring goes
  through its listener (the Redis or the local fan-out with the jobs in another database, the
  local fan-out with the revocations in Redis). A listener can
  look connected and hear nothing (a wedged subscription, a proxy that dropped it); only a
  message that went all the way round proves it hears. After each canary published, its topic
  is read from the history from its offset: a role refused that read (a grant revoked) hears
  its canary but serves no history, and on Postgres no live message either;
- schema: the database's schema is not older than this code needs (checked every SCHEMA_EVERY
  seconds, when the server has a database; a check given no answer within SCHEMA_TIMEOUT keeps
  the last verdict, so that the canaries go on);
- draining: the server is not stopping;
- capacity: the server is below LIVEPUSH_MAX_CONNECTIONS. At the cap it refuses every upgrade,
  and a load balancer told it was ready kept sending it pages it turned away.

When the fan-out's canary, published, has not come back for RELISTEN_PERIODS canary periods past
CANARY_BOUND while the fan-out says it listens, the server has it drop and re-open its listening
connection (`FanOut.relisten`): nothing else would notice, and clients already connected would
miss every message until a restart. The re-listen resyncs them (replay, else `reset`). A state
source (or the revocation store) whose ring is that late while the fan-out's canary is not is made
to listen anew the same way (`RingPath.relisten`), and its watched topics are read again (its
open sessions checked again).

The canary's bookkeeping (`Canary`) is pure and clocked from outside; `Readiness.run()` is the
loop that publishes and the only part that awaits.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field

from .. import metrics
from ..errors import ConfigError, first_line
from ..fanout import FanOut
from ..repeats import Repeats
from ..tasks import reraise_if_cancelled
from ..topics import RESERVED_PREFIX
from ..types import Message, Offset, RingPath, StateSource

log = logging.getLogger("livepush.server")

CANARY_TOPIC = RESERVED_PREFIX + "canary"
CANARY_EVERY = 2.0
CANARY_BOUND = 5.0
SCHEMA_EVERY = 30.0
# Canary periods past the bound before the fan-out is made to listen anew, and between two such
# re-listens: long enough for a slow round trip to have been called late first, short enough
# that a deaf subscription is mended within seconds of /readyz turning 503.
RELISTEN_PERIODS = 3
MAX_RELISTEN_DOUBLINGS = 4
# A schema check that takes longer is given up, keeping the last verdict: the loop that makes it
# sends the canaries too, and a database that answers nothing (frozen, cut off without a reset)
# is what they must go on telling.
SCHEMA_TIMEOUT = 5.0

SchemaCheck = Callable[[], Awaitable[str | None]]  # None when current, else what is wrong


@dataclass
class Canary:
    """Canaries sent and not yet heard back, oldest first. One heard back answers every canary
    sent before it too: the fan-out delivers one channel in order, so an earlier one that never
    came was lost, and what matters is that the path works now."""

    bound: float = CANARY_BOUND
    # What the check says while none came back in time, and before the first one did.
    missing: str = "no canary came back through the fan-out"
    first: str = "waiting for the first canary to come back"
    # Whether its trips are the fan-out's (livepush_canary_round_trip_seconds); a ring's are not.
    gauged: bool = True
    # Why its path is made to listen anew when it is late, in the listener's WARNING.
    deaf: str = "no readiness canary came back through it"
    # [sent_at, offset, out_at]; offset None while its publish is under way, after it failed, or
    # when its path was not listening as it went out; out_at when its publish returned.
    unanswered: list[list[object]] = field(default_factory=list)
    heard: dict[Offset, float] = field(default_factory=dict)  # heard before its publish returned
    round_trip: float | None = None
    answered_once: bool = False
    # When its path was last made to listen anew, and how many times in a row that brought none back.
    relistened_at: float | None = None
    relistens: int = 0
    # Why its last publish was refused (a ConfigError: a privilege the role lacks, a rule the Redis
    # user's ACL lacks), None once one went out: no outage that heals by itself, so /readyz says it
    # rather than only "late".
    refused: str | None = None
    # Why the read of its topic's history after its last publish was refused, None once one was
    # made or a publish failed otherwise (no read then): a role that may publish but not read hears
    # its canary, yet serves no history (and, on Postgres, no live message: a doorbell is read from the log).
    unread: str | None = None

    def sent(self, at: float) -> list[object]:
        self.gauge_wait(at)
        entry: list[object] = [at, None, at]
        self.unanswered.append(entry)
        if len(self.unanswered) > 64:  # keep the oldest: it says how long the path has been broken
            del self.unanswered[1]
        return entry

    def published(self, entry: list[object], offset: Offset, at: float | None = None, *,
                  listening: bool = True) -> None:
        """Its publish returned `offset` at `at` (when it was sent, if not given). One that went out
        while its path did not listen (lost, reconnecting) cannot come back, and says nothing of
        the listener that comes back after it: it counts as one whose publish failed."""
        heard_at = self.heard.pop(offset, None)
        if heard_at is not None:
            entry[1] = offset
            self._answer(entry, heard_at)
        elif listening:
            entry[1] = offset
            entry[2] = entry[0] if at is None else at

    def on_heard(self, offset: Offset, now: float) -> None:
        for entry in self.unanswered:
            if entry[1] == offset:
                self._answer(entry, now)
                return
        self.heard[offset] = now  # its publish has not returned yet (or it is another server's)
        if len(self.heard) > 256:
            self.heard.pop(next(iter(self.heard)))

    def _answer(self, entry: list[object], at: float) -> None:
        index = self.unanswered.index(entry)
        self.round_trip = max(at - float(entry[0]), 0.0)  # type: ignore[arg-type]
        self.answered_once = True
        del self.unanswered[: index + 1]
        if self.gauged:
            metrics.CANARY_SECONDS.set(self.round_trip)

    def gauge_wait(self, now: float) -> None:
        """While the oldest canary has waited longer than the last trip took, the gauge shows that
        wait: its trip is at least that long. Through an outage the gauge rises, instead of
        showing the last good trip until the path works again."""
        if self.gauged and self.unanswered:
            waited = now - float(self.unanswered[0][0])  # type: ignore[arg-type]
            if waited > (self.round_trip or 0.0):
                metrics.CANARY_SECONDS.set(waited)

    def deaf_for(self, now: float) -> float | None:
        """How long the oldest canary published and not heard back has waited since its publish
        returned, None when none has. A canary whose publish failed does not count: the fan-out is
        down, and its listener sees that itself; hearing anew would not make it come back. Nor does
        the time its publish waited: one that waited out an outage went out as it ended."""
        for entry in self.unanswered:
            if entry[1] is not None:
                return now - float(entry[2])  # type: ignore[arg-type]
        return None

    def check(self, now: float) -> tuple[bool, dict[str, object]]:
        self.gauge_wait(now)
        oldest = float(self.unanswered[0][0]) if self.unanswered else None  # type: ignore[arg-type]
        late = oldest is not None and now - oldest >= self.bound
        ok = self.answered_once and not late
        body: dict[str, object] = {"ok": ok, "bound_seconds": self.bound}
        if self.round_trip is not None:
            body["round_trip_ms"] = round(self.round_trip * 1000, 2)
        if late:
            body["detail"] = f"{self.missing} for {now - oldest:.1f} s"  # type: ignore[operator]
        elif not self.answered_once:
            body["detail"] = self.first
        if self.refused is not None and "detail" in body:
            body["detail"] = f"{body['detail']}: its publish was refused: {self.refused}"
        if self.unread is not None:
            ok = body["ok"] = False
            said = f"reading the canary's topic from the history was refused: {self.unread}"
            body["detail"] = f"{body['detail']}; {said}" if "detail" in body else said
        return ok, body


class Readiness:
    """The checks behind /readyz for one server; `run()` keeps the canary and schema ones fresh."""

    def __init__(
        self,
        fanout: FanOut,
        *,
        away: Callable[[], str | None],
        draining: Callable[[], bool],
        full: Callable[[], str | None] = lambda: None,
        schema: SchemaCheck | None = None,
        states: Sequence[StateSource] = (),
        revocations: RingPath | None = None,
        worker: int | None = None,
        every: float = CANARY_EVERY,
        bound: float = CANARY_BOUND,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.fanout = fanout
        self._away = away  # which part does not hear its changes, None while all do
        self._draining = draining
        self._full = full  # why no new connection fits now (the connection cap), None while one does
        self._schema = schema
        self.worker = worker  # this process's index under `serve --workers N`, named in the body
        self.every = every
        self.schema_every = SCHEMA_EVERY
        self.schema_timeout = SCHEMA_TIMEOUT
        self.clock = clock
        self.canary = Canary(bound)
        # Each state source's rings may come another way than the fan-out's messages (on the
        # Redis fan-out, through a Postgres listener): each has a canary of its own, and so has
        # the revocation store when it is given, its listener being no other part's.
        self.ring_canaries: dict[RingPath, Canary] = {}
        for source in states:
            topics = ", ".join(source.prefixes)
            self.ring_canaries[source] = Canary(
                bound, missing=f"no state ring came back from the database ({topics} topics hear no change)",
                first="waiting for the first state ring to come back", gauged=False,
                deaf=f"no state ring came back through it (readiness's ring of the {topics} topics)")
        if revocations is not None:
            self.ring_canaries[revocations] = Canary(
                bound, missing="no revocation ring came back from the revocation store (revocations made elsewhere "
                               "close sessions only at the periodic re-check)",
                first="waiting for the first revocation ring to come back", gauged=False,
                deaf="no revocation ring came back through it (readiness's ring of the revocation store)")
        self.server_id = uuid.uuid4().hex[:12]
        self._refusals = Repeats(log)
        # When the canary's publish or read was first refused (a grant revoked), None while neither
        # is: its end is said once, with how long it lasted, as a listener says it is back.
        self._refused_since: float | None = None
        self._schema_problem: str | None = None
        self._schema_checked_at: float | None = None

    def on_message(self, message: Message) -> None:
        """The fan-out's receiver: canaries come back here (a doorbell names the offset)."""
        if message.topic == CANARY_TOPIC:
            self.canary.on_heard(message.offset, self.clock())

    def ring_heard(self, part: RingPath) -> Callable[[str], None]:
        """What `part` calls with each canary token it hears (StateSource.watch, RevocationStore.watch)."""
        canary = self.ring_canaries[part]
        return lambda token: canary.on_heard(token, self.clock())

    async def run(self) -> None:
        """Publish a canary every `every` seconds, and check the schema every SCHEMA_EVERY."""
        gauge = asyncio.ensure_future(self._gauge_late_canary())
        try:
            await self._ring()
        finally:
            gauge.cancel()

    async def _gauge_late_canary(self) -> None:
        """Every `every` seconds, let the round-trip gauge show how long the canary not back yet
        has waited. The loop that sends canaries can wait a minute on one publish (a pool waiting
        for a connection to a database that is away): a scrape meanwhile showed the last good
        trip, unless a probe of /readyz happened to move it. The same tick decides whether the
        fan-out must listen anew: a publish that waits cannot hold that up either."""
        while True:
            await asyncio.sleep(self.every)
            self.canary.gauge_wait(self.clock())
            self._relisten_if_deaf(self.clock())

    def _relisten_if_deaf(self, now: float) -> None:
        """Make the fan-out listen anew when its canary has been late RELISTEN_PERIODS periods
        past the bound while it says it listens (one that knows it is away reconnects already),
        and likewise each ring's path (a state source, the revocation store) whose ring is that
        late while the fan-out's canary is not: on the Redis fan-out the state topics are heard on
        Postgres, which the fan-out's re-listen does not touch; on the Postgres fan-out they share
        its listener, which its re-listen opens anew once for both."""
        if self._listen_anew(self.fanout, self.canary, now):
            return
        for part, canary in self.ring_canaries.items():
            self._listen_anew(part, canary, now)

    def _listen_anew(self, part: FanOut | RingPath, canary: Canary, now: float) -> bool:
        """Ask `part` to listen anew when `canary`, its path, has been late long enough; whether
        it has. Each re-listen that brought no canary back doubles the wait before the next, up to
        MAX_RELISTEN_DOUBLINGS times: a listener that can never hear (a LISTEN through PgBouncer
        in transaction mode) is retried now and then, not every few seconds."""
        patience = canary.bound + RELISTEN_PERIODS * self.every
        waited = canary.deaf_for(now)
        if waited is None or waited < patience:
            canary.relistens = 0  # nothing late that long: it hears, and the next silence starts afresh
            return False
        if not part.listening:
            return True
        if canary.relistened_at is not None:
            if now - canary.relistened_at < patience * 2 ** min(canary.relistens, MAX_RELISTEN_DOUBLINGS):
                return True
        canary.relistened_at = now
        canary.relistens += 1
        part.relisten(f"{canary.deaf} for {waited:.1f} s while it looked connected")
        return True

    async def _ring(self) -> None:
        n = 0
        next_schema = self.clock()
        while True:
            n += 1
            # The rings go first: where they share the fan-out's listener (Postgres), they are
            # heard before the canary that follows them, so one round answers both.
            for part, canary in self.ring_canaries.items():
                token = f"{self.server_id}-{n}"
                ring = canary.sent(self.clock())
                try:
                    await part.ring_canary(token)
                except Exception as exc:  # the database is down: the ring stays unanswered
                    reraise_if_cancelled()
                    log.debug("canary ring failed: %s", first_line(exc))
                else:
                    # Only a ring sent says the listener is deaf when it does not come back (one
                    # heard before this returned is matched here); one that failed says nothing of it.
                    canary.published(ring, token, self.clock(), listening=part.listening)
            entry = self.canary.sent(self.clock())
            try:
                offset = await self.fanout.apublish(CANARY_TOPIC, {"server": self.server_id, "n": n})
            except ConfigError as exc:  # a grant or an ACL rule lacking (AclRefused): no outage, so said, once a minute
                reraise_if_cancelled()
                self.canary.refused = first_line(exc)
                self._refusal_began()
                self._refusals.warning("the readiness canary could not be published, so this server stays "
                                       "unready: %s", self.canary.refused)
            except Exception as exc:  # the fan-out is down: the canary stays unanswered
                reraise_if_cancelled()
                # A refusal said before is no longer known: the grant may be back, and the
                # detail would send the operator to it rather than to the outage. Nor is the
                # read's: none follows a publish that failed.
                self.canary.refused = None
                self.canary.unread = None
                log.debug("canary publish failed: %s", first_line(exc))
            else:
                self.canary.refused = None
                self.canary.published(entry, offset, self.clock(), listening=self.fanout.listening)
                if await self._read_back(offset) and self._refused_since is not None:
                    log.warning("the readiness canary is published and read again after %.1f s of refusals: this "
                                "server is ready again once it comes back", self.clock() - self._refused_since)
                    self._refused_since = None
            if self._schema is not None and self.clock() >= next_schema:
                next_schema = self.clock() + self.schema_every
                await self._check_schema()
            # A driver can swallow a cancellation that lands mid-call and return normally (seen
            # with redis-py and with psycopg's pool): look before sleeping, or a stop would wait
            # on this loop for ever.
            reraise_if_cancelled()
            await asyncio.sleep(self.every)

    def _refusal_began(self) -> None:
        """Mark when the canary was first refused, unless it is refused already."""
        if self._refused_since is None:
            self._refused_since = self.clock()

    async def _read_back(self, offset: Offset) -> bool:
        """Read the canary's topic from the canary's `offset` (at most one message: another
        server's canary), as a subscribe with history reads: a role refused that read (a grant
        revoked) serves no history, which no round trip of the canary shows. Only a refusal counts;
        a read that fails otherwise leaves the outage to the canary. Whether the read was made."""
        try:
            await self.fanout.history(CANARY_TOPIC, offset, limit=1, timeout=self.canary.bound)
        except ConfigError as exc:  # a privilege the role lacks: said as the publish's refusal is
            reraise_if_cancelled()
            self.canary.unread = first_line(exc)
            self._refusal_began()
            self._refusals.warning("the readiness canary's topic could not be read from the history, so this server "
                                   "stays unready: %s", self.canary.unread)
            return False
        except Exception as exc:
            reraise_if_cancelled()
            self.canary.unread = None  # not known now: the grant may be back
            log.debug("canary history read failed: %s", first_line(exc))
            return False
        self.canary.unread = None
        return True

    async def _check_schema(self) -> None:
        assert self._schema is not None
        try:
            async with asyncio.timeout(self.schema_timeout):
                problem = await self._schema()
            self._schema_problem = problem
            self._schema_checked_at = self.clock()
        except TimeoutError:  # the database is silent: keep the last verdict; the canary tells
            reraise_if_cancelled()
            log.debug("schema check had no answer within %g s", self.schema_timeout)
        except Exception as exc:  # the database is away: keep the last verdict; the canary tells
            reraise_if_cancelled()
            log.debug("schema check failed: %s", first_line(exc))

    def report(self) -> tuple[bool, bytes]:
        """(ready, the JSON body naming each check)."""
        now = self.clock()
        away = self._away()
        canary_ok, canary = self.canary.check(now)
        # Every ring not back in time is named, each with how long: one loop sends them all, so
        # a ring that waits on a database gone silent holds back the canaries after it, and the
        # newest missing one alone read as an outage of seconds when it had lasted a minute.
        missing = [] if canary_ok else [canary["detail"]]
        for ring_canary in self.ring_canaries.values():
            ring_ok, ring = ring_canary.check(now)
            if not ring_ok:
                missing.append(ring["detail"])
        if missing:
            canary_ok, canary["ok"], canary["detail"] = False, False, "; ".join(map(str, missing))
        schema: dict[str, object] = {"ok": self._schema_problem is None}
        if self._schema is None:
            schema["detail"] = "no database"
        elif self._schema_problem is not None:
            schema["detail"] = self._schema_problem
        draining = self._draining()
        full = self._full()
        checks: dict[str, dict[str, object]] = {
            "listening": {"ok": away is None} | ({"detail": away} if away is not None else {}),
            "canary": canary,
            "schema": schema,
            "draining": {"ok": not draining} | ({"detail": "stopping: connect elsewhere"} if draining else {}),
            "capacity": {"ok": full is None} | ({"detail": full} if full is not None else {}),
        }
        ready = all(bool(c["ok"]) for c in checks.values())
        body: dict[str, object] = {"status": "ready" if ready else "unavailable", "fanout": self.fanout.name,
                                   "checks": checks}
        if self.worker is not None:
            body["worker"] = {"index": self.worker, "pid": os.getpid()}
        return ready, (json.dumps(body, separators=(",", ":")) + "\n").encode()
