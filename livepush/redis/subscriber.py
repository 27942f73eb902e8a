"""One SUBSCRIBE connection to one Redis, shared by the parts of a process that wait for
messages there (the Redis fan-out, Redis revocations).

Each part names its channel and a handler (`add`); `start()` returns once every channel added
so far is subscribed, confirmed by Redis. Frames are handed to their channel's handlers in
the order Redis delivers them; a handler parses its own format and drops what does not parse,
and one that raises is logged while the next frame is delivered as usual.

A quiet connection is PINGed every `heartbeat` seconds and called lost after three silent
beats (a dead peer without a reset looks quiet too). On loss it reconnects with capped,
jittered backoff, subscribes again, and then runs each channel's resync handler, in a task of its
own while frames go on being handed out (a part slow to catch up holds up no other). `listening`
is False while it is away (drives /healthz). A loss is said in a line when it starts and one when
it ends, but a subscription that Redis closed and took back at the first attempt (Redis stayed
up: a CLIENT KILL, the pub/sub output limit) in one line naming those causes, at most once a
minute: a limit below the size of a burst closes it at every burst.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any

import redis
import redis.asyncio as aredis
from redis.exceptions import AuthenticationError, NoPermissionError, RedisError, ResponseError
from redis.exceptions import ConnectionError as RedisConnectionError

from ..channels import Channels
from ..errors import ListenError
from ..repeats import Repeats
from ..tasks import Backoff, stop
from ..types import ResyncHandler as Resync, shown
from .client import client_kwargs, failed, no_retries, one_line, own_url, redact, text

log = logging.getLogger("livepush.redis.subscriber")

Handler = Callable[[bytes], None]

# How long one wait for a frame lasts before the loop looks at its own work (a re-listen asked
# for, the heartbeat): short, since an idle wait costs nothing but a timer.
_CYCLE = 0.25
# Seconds between warnings of a listener that keeps failing to come back.
RETRY_LOG_SECONDS = 60.0
# Seconds `livepush status` waits for Redis' answer to its CLIENT LIST, as livepush's other calls
# do: before redis-py 8 a client has no read timeout, and a Redis that answers nothing (paused,
# cut off) hung the command instead of making it report the failure.
STATUS_TIMEOUT = 5.0
# What redis-py says when Redis ends the connection (its socket read the end), as Redis does to a
# client it kills, past its output limit, or on its way down.
_CLOSED_BY_REDIS = "Connection closed by server."


class Subscriber:
    # Reconnects capped at 1 s: one subscriber per process, so the cap costs Redis at most one
    # attempt a second per process, and the server hears again within about a second of
    # Redis' return (with 5 s, a 3 s outage took up to 10 s to heal).
    def __init__(self, url: str, *, name: str = "livepush-listener", heartbeat: float = 5.0,
                 backoff: tuple[float, float] = (0.1, 1.0), connect_timeout: float = 5.0) -> None:
        self.url = url
        self.name = name
        self.heartbeat = heartbeat
        self.backoff = backoff
        self.connect_timeout = connect_timeout
        self._channels: Channels[bytes] = Channels(log)
        self._pool: aredis.ConnectionPool | None = None
        self._conn: Any = None
        self._task: asyncio.Task[None] | None = None
        self._listening = False
        # Why the connection must be dropped and opened again, set by relisten() (see there).
        self._relisten: str | None = None
        # start() one call at a time: two at once (two owners, or one listen() called twice
        # concurrently) each found no task and opened a connection and a reader of their own,
        # the two readers failing on one socket and the first connection left subscribed.
        self._starting: tuple[asyncio.AbstractEventLoop, asyncio.Lock] | None = None
        # The subscriptions Redis closed while it stayed up, said at most once a minute.
        self._closes = Repeats(log)

    def add(self, channel: str, handler: Handler, *, on_resync: Resync | None = None) -> None:
        self._channels.add(channel, handler, on_resync)

    @property
    def listening(self) -> bool:
        return self._listening

    async def start(self, timeout: float = 10.0) -> None:
        loop = asyncio.get_running_loop()
        if self._starting is None or self._starting[0] is not loop:
            self._starting = (loop, asyncio.Lock())  # a lock belongs to the loop that waits on it
        async with self._starting[1]:
            await self._start(timeout)

    async def _start(self, timeout: float) -> None:
        if self._task is None:
            try:
                self._conn = await self._subscribe_all()
            except (RedisError, OSError, asyncio.TimeoutError) as exc:
                await self._drop_connection()
                raise failed(self.url, exc, "subscribing to its pub/sub channels", ListenError, reads=True) from None
            self._listening = True
            self._task = asyncio.create_task(self._run(), name=self.name)
            return
        late = self._channels.not_live()
        if not late:
            return
        if self._conn is not None:
            try:
                await self._conn.send_command("SUBSCRIBE", *[c.name for c in late])
            except (RedisError, OSError):
                pass  # the loop sees the loss and subscribes everything again
        try:
            await self._channels.wait_live(late, timeout)
        except TimeoutError:
            raise ListenError(f"the Redis listener at {redact(self.url)} did not confirm its new channels in time") from None

    def relisten(self, reason: str) -> None:
        """Drop the connection and subscribe again, then run every channel's resync, as after a
        loss; `reason` is logged. For a subscription that looks fine and hears nothing (a proxy
        that dropped it silently, a Redis cut off behind an address that still answers), which
        only a message sent round can tell. Does nothing while the listener is away or stopped."""
        if self._task is not None and self._listening:
            self._relisten = reason

    async def aclose(self) -> None:
        task, self._task = self._task, None
        await stop(task)
        await self._channels.stop_resync()
        self._listening = False
        await self._drop_connection()
        if self._pool is not None:
            await self._pool.disconnect()
            self._pool = None

    # -- the connection ---------------------------------------------------------------
    async def _subscribe_all(self) -> Any:
        """A connection SUBSCRIBEd to every channel, returned once Redis confirmed them all."""
        if self._pool is None:
            self._pool = aredis.ConnectionPool.from_url(
                own_url(self.url), max_connections=1, socket_connect_timeout=self.connect_timeout,
                client_name=self.name,
                # RESP2: pub/sub frames as plain replies (RESP3 delivers them as pushes).
                protocol=2,
                # No silent reconnects inside redis-py: a lost subscription must be seen here.
                retry=no_retries(for_asyncio=True),
            )
        conn = self._pool.make_connection()
        self._conn = conn
        await asyncio.wait_for(conn.connect(), self.connect_timeout + 1)
        names = self._channels.names()
        # The heartbeat's PING first, in the same round trip: a user whose ACL denies it was
        # subscribed, then lost at every beat and subscribed again, for ever. Refused here, it
        # fails listen() (or the attempt to subscribe again) saying so. Before SUBSCRIBE, its
        # answer comes before any message.
        await conn.send_command("PING")
        await conn.send_command("SUBSCRIBE", *names)
        if await conn.read_response(timeout=self.connect_timeout) is None:
            raise TimeoutError(f"no answer to PING within {self.connect_timeout} s")
        confirmed: set[str] = set()
        while len(confirmed) < len(names):
            reply = await conn.read_response(timeout=self.connect_timeout)
            if reply is None:
                raise TimeoutError(f"no SUBSCRIBE confirmation within {self.connect_timeout} s")
            if not (isinstance(reply, list) and reply and text(reply[0], "replace") == "subscribe"):
                raise RedisError(f"unexpected reply to SUBSCRIBE: {shown(reply, width=80)}")
            confirmed.add(text(reply[1], "replace"))
        for channel in self._channels:
            channel.live.set()
        return conn

    async def _drop_connection(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            try:
                await conn.disconnect(nowait=True)
            except Exception:  # already broken: nothing left to release
                pass

    async def _run(self) -> None:
        while True:
            closed = False
            try:
                await self._read_until_lost()
                reason = "connection closed"
            except asyncio.CancelledError:
                raise
            except (RedisError, OSError, TimeoutError) as exc:
                reason = one_line(exc)
                closed = isinstance(exc, RedisConnectionError) and str(exc) == _CLOSED_BY_REDIS
            except Exception:
                log.exception("the Redis listener %s failed unexpectedly; reconnecting", self.name)
                reason = "an unexpected error"
            self._listening = False
            self._relisten = None  # this loss is the re-listen asked for, if one was
            self._channels.lost()
            lost_at = time.monotonic()

            def say_lost(reason: str = reason) -> None:
                log.warning("lost the Redis listener at %s (%s); reconnecting, then reading what was missed",
                            redact(self.url), reason)

            # A close by Redis is said once the first attempt tells whether Redis is still there:
            # it is when that attempt subscribes (one line), away when it fails (an outage).
            if not closed:
                say_lost()
            await self._drop_connection()
            away = await self._reconnect(on_first_failure=say_lost if closed else None)
            self._listening = True
            if closed and not away:
                self._closes.warning(
                    "Redis closed this server's subscription (it was killed, or passed client-output-buffer-limit "
                    "pubsub: see docs/operations.md#redis-closing-a-subscription); subscribed again at %s, "
                    "reading what was missed",
                    redact(self.url))
            else:
                log.warning("the Redis listener is back after %.1f s; reading what was missed", time.monotonic() - lost_at)
            self._channels.resync_beside(f"{self.name}-resync")

    async def _reconnect(self, on_first_failure: Callable[[], None] | None = None) -> bool:
        """Subscribe again, retrying with backoff; whether any attempt failed (`on_first_failure`
        is called at the first)."""
        retry = Backoff(*self.backoff)
        failed_once = False
        while True:
            await retry.wait()
            try:
                self._conn = await self._subscribe_all()
                return failed_once
            except (RedisError, OSError, asyncio.TimeoutError) as exc:
                log.debug("Redis listener reconnect failed: %s", one_line(exc))
                if not failed_once and on_first_failure is not None:
                    on_first_failure()
                failed_once = True
                # A Redis that answers with a refusal (a password or an ACL changed, out of
                # memory) stays away until someone acts: say why at once; one that is away (a
                # restart) only once the outage is long.
                refused = isinstance(exc, (ResponseError, AuthenticationError))
                if retry.time_to_say(RETRY_LOG_SECONDS, at_once=refused):
                    log.warning("the Redis listener still cannot subscribe again, trying again about every %g s (said "
                                "at most once a minute): %s", self.backoff[1],
                                failed(self.url, exc, "subscribing again", reads=True))
                await self._drop_connection()

    async def _read_until_lost(self) -> None:
        conn = self._conn
        last_heard = last_beat = time.monotonic()
        while True:
            if self._relisten is not None:
                raise ConnectionAbortedError(self._relisten)
            reply = await conn.read_response(timeout=min(self.heartbeat, _CYCLE))
            now = time.monotonic()
            if reply is None:
                if now - last_heard > 3 * self.heartbeat:
                    raise TimeoutError(f"no reply from Redis for {now - last_heard:.0f} s")
                if now - max(last_heard, last_beat) >= self.heartbeat:
                    await conn.send_command("PING")
                    last_beat = now
                continue
            last_heard = now
            if not (isinstance(reply, list) and len(reply) >= 3):
                continue
            kind = text(reply[0], "replace")
            if kind == "message":
                self._channels.dispatch(text(reply[1], "replace"), reply[2] if isinstance(reply[2], bytes) else str(reply[2]).encode())
            elif kind == "subscribe":
                entry = self._channels.get(text(reply[1], "replace"))
                if entry is not None:
                    entry.live.set()

def subscribed_clients(url: str, name: str) -> list[dict[str, object]] | None:
    """The servers subscribed on this Redis now (its pub/sub clients named `name`, a deployment's
    client.listener_name()), for `livepush status`; None when the URL's user may not run CLIENT
    LIST, as the app's user of docs/security.md may not (it would show every tenant's clients)."""
    client = redis.Redis.from_url(own_url(url), socket_timeout=STATUS_TIMEOUT, **client_kwargs("livepush-status"))
    try:
        found = client.client_list(_type="pubsub")
    except NoPermissionError:
        return None
    except (RedisError, OSError) as exc:
        raise failed(url, exc, "listing the servers subscribed", reads=True) from exc
    finally:
        client.close()
    return [{"id": int(c["id"]), "address": str(c.get("addr", "")).rsplit(":", 1)[0],
             "since_seconds": int(c.get("age", 0))} for c in found if c.get("name") == name]
