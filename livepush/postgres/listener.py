"""One LISTEN connection to one database, shared by every part of a process that waits for
notifications there: the Postgres fan-out, state topics, revocations, the job runtime.

Each part names its channel and a handler (`add`); `start()` returns once every channel added
so far is LISTENed. Notifications are handed to their channel's handlers on the event loop,
in the order Postgres delivers them. A handler owns its channel's format: it parses the
payload and drops what does not parse. A handler that raises is logged and the next
notification is delivered as usual: nothing a notification holds can stop the listener.

When the connection is lost (a restart, a failover, a killed backend, a silent network) the
listener reconnects with capped, jittered backoff, LISTENs every channel again, and only then
runs each channel's resync handler: listen first, then catch up from the tables, so nothing
committed meanwhile is missed. The handlers run in a task of their own while notifications
go on being handed out, so a part slow to catch up holds up no other. An unexpected error in the loop itself is logged with its
traceback and handled the same way. `listening` is False while it is away (drives /healthz).
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
import socket
import time
from collections.abc import Callable
from typing import Any

import psycopg
from psycopg.rows import dict_row

from ..channels import Channels
from ..errors import DependencyError, ListenError, ListenLoginRefused, LoginRefused, first_line
from ..tasks import Backoff, stop
from ..types import ResyncHandler as Resync
from .connect import aconnect, connect, translate, translated
from .urls import redact

log = logging.getLogger("livepush.postgres.listener")

Handler = Callable[[str], None]

# Channels are spliced into LISTEN: only livepush's own names, which need no quoting.
_CHANNEL = re.compile(r"livepush[a-z_]{0,40}")
# How long one wait for notifications lasts before the loop looks at its own work (channels
# added since, the ping): short, since an idle wait costs nothing but a timer.
_CYCLE = 0.25
# Seconds a listener keeps failing to come back before it says why, and then between two sayings:
# a restart is over well within it, while a password or pg_hba.conf changed under a running
# server keeps it away until someone acts, and only a debug line said so.
RETRY_LOG_SECONDS = 60.0


class Listener:
    # Reconnects capped at 1 s, as the Redis subscriber's: one listener per process, so the cap
    # costs the database at most one attempt a second per process, and healing follows the
    # database's return within about a second.
    def __init__(self, url: str, *, name: str = "livepush-listener", ping: float = 5.0,
                 backoff: tuple[float, float] = (0.1, 1.0)) -> None:
        self.url = url
        self.name = name
        self.ping = ping
        self.backoff = backoff
        self._channels: Channels[str] = Channels(log)
        self._task: asyncio.Task[None] | None = None
        self._listening = False
        self._closing = False
        # Why the connection must be dropped and opened again, set by relisten(): the loop
        # looks at it every cycle, so it takes effect even on a connection that hears nothing.
        self._relisten: str | None = None
        # Parts that start the shared listener at the same time wait for the first one's connection:
        # each would otherwise open its own, and every notification came once per connection.
        self._starting = asyncio.Lock()

    # -- registering --------------------------------------------------------------------
    def add(self, channel: str, handler: Handler, *, on_resync: Resync | None = None) -> None:
        """Hand every notification on `channel` to `handler`; after a reconnect, run `on_resync`.
        Takes effect at the next `start()` (which waits for it when the listener already runs)."""
        if not _CHANNEL.fullmatch(channel):
            raise ValueError(f"{channel!r} is not a livepush channel name")
        self._channels.add(channel, handler, on_resync)

    @property
    def listening(self) -> bool:
        return self._listening

    # -- starting and stopping ---------------------------------------------------------
    async def start(self, timeout: float = 10.0) -> None:
        """Return once every channel added so far is LISTENed; raise ListenError if Postgres
        cannot be reached (at the first start) or the channels are not in effect within
        `timeout` seconds (a reconnect in progress)."""
        async with self._starting:
            if self._task is None:
                # Started again after aclose() (an app's lifespan run twice): its loop would end
                # at once, leaving a connection that says it listens and hears nothing.
                self._closing = False
                try:
                    conn = await self._connect()
                except (DependencyError, psycopg.Error, OSError) as exc:
                    said = self._said(exc)
                    # A refused login stays a setting to correct (`serve` exits 2), not an outage.
                    refused = isinstance(said, LoginRefused)
                    raise (ListenLoginRefused if refused else ListenError)(first_line(said)) from None
                self._listening = True
                self._task = asyncio.create_task(self._run(conn), name=self.name)
                return
        waiting = self._channels.not_live()
        if waiting:
            try:
                await self._channels.wait_live(waiting, timeout)
            except TimeoutError:
                raise ListenError(f"the Postgres listener at {redact(self.url)} is reconnecting: "
                                  "its new channels were not in effect in time") from None

    def relisten(self, reason: str) -> None:
        """Drop the connection and open it again, then run every channel's resync, as after a
        loss; `reason` is logged. For a connection that looks fine and hears nothing (a proxy
        that dropped it silently, a wedged backend), which only a message sent round can tell.
        Does nothing while the listener is away or stopped: it reconnects and resyncs already."""
        if self._task is not None and self._listening and not self._closing:
            self._relisten = reason

    async def aclose(self) -> None:
        self._closing = True
        self._listening = False
        task, self._task = self._task, None
        await stop(task)
        await self._channels.stop_resync()

    # -- the loop ------------------------------------------------------------------------
    async def _connect(self) -> psycopg.AsyncConnection:
        conn = await aconnect(self.url, application_name=self.name)
        try:
            if conn.info.parameter_status("server_encoding") == "SQL_ASCII":
                # Postgres checks no encoding there: any role may NOTIFY bytes past ASCII, which
                # psycopg, decoding as ASCII, fails on in the middle of a batch (losing the rest of
                # it and the connection). Latin-1 decodes every byte; the handlers drop what is
                # not theirs, and livepush's own payloads are ASCII.
                await conn.execute("SET client_encoding TO 'LATIN1'")
            if conn.info.server_version >= 140000:
                # Waiting idle is this connection's work: an idle_session_timeout of the role or
                # database shorter than the ping (meant to reap forgotten sessions) ended it again
                # and again, each time a loss, two WARNINGs and a catch-up. Postgres 14 has the setting.
                await conn.execute("SET idle_session_timeout = 0")
            for channel in self._channels:
                await conn.execute(f"LISTEN {channel.name}")
                channel.live.set()
        except BaseException:
            await conn.close()
            raise
        return conn

    async def _run(self, conn: psycopg.AsyncConnection) -> None:
        while not self._closing:
            try:
                await self._serve(conn)
                reason = "the connection ended"
            except asyncio.CancelledError:
                await conn.close()
                raise
            except (psycopg.Error, OSError, TimeoutError) as exc:
                reason = first_line(exc)
            except Exception:  # a bug of ours: say so once, with the traceback, and carry on
                log.exception("the Postgres listener %s failed unexpectedly; reconnecting", self.name)
                reason = "an unexpected error"
            self._listening = False
            self._relisten = None  # this loss is the re-listen asked for, if one was
            self._channels.lost()
            await conn.close()
            if self._closing:
                return
            lost_at = time.monotonic()
            log.warning("lost the Postgres listener at %s (%s); reconnecting, then reading what was missed",
                        redact(self.url), reason)
            conn = await self._reconnect()
            self._listening = True
            log.warning("the Postgres listener is back after %.1f s; reading what was missed",
                        time.monotonic() - lost_at)
            self._channels.resync_beside(f"{self.name}-resync")

    async def _serve(self, conn: psycopg.AsyncConnection) -> None:
        last_ping = time.monotonic()
        while not self._closing:
            if self._relisten is not None:
                raise ConnectionAbortedError(self._relisten)
            async for note in conn.notifies(timeout=_CYCLE):
                self._dispatch(note.channel, note.payload)
            for channel in self._channels.not_live():
                await conn.execute(f"LISTEN {channel.name}")
                channel.live.set()
            if time.monotonic() - last_ping >= self.ping:
                # A network that drops silently shows up here, not in the wait above.
                await self._ping(conn)
                last_ping = time.monotonic()

    async def _ping(self, conn: psycopg.AsyncConnection) -> None:
        """`SELECT 1`, answered within `ping` seconds. A re-listen asked meanwhile ends the wait
        within a cycle: on a connection that hears nothing, the answer is what never comes, and
        waiting it out kept clients deaf for the bound and as long again (psycopg's cancel)."""
        ping = asyncio.ensure_future(conn.execute("SELECT 1"))
        deadline = time.monotonic() + self.ping
        try:
            while not ping.done():
                if self._relisten is not None:
                    raise ConnectionAbortedError(self._relisten)
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"no answer to the listener's ping within {self.ping:g} s")
                await asyncio.wait([ping], timeout=min(left, _CYCLE))
        finally:
            await _abandon(conn, ping)
        ping.result()

    async def _reconnect(self) -> psycopg.AsyncConnection:
        retry = Backoff(*self.backoff)
        while True:
            await retry.wait()
            try:
                return await self._connect()
            except (DependencyError, psycopg.Error, OSError) as exc:
                log.debug("Postgres listener reconnect failed: %s", exc)
                if retry.time_to_say(RETRY_LOG_SECONDS):
                    log.warning("the Postgres listener at %s still cannot reconnect, trying again about every %g s "
                                "(said at most once a minute): %s", redact(self.url), self.backoff[1],
                                first_line(self._said(exc)))

    def _said(self, exc: BaseException) -> BaseException:
        """`exc` as said to an operator: a LISTEN the server refused (a standby in recovery) in
        translate()'s words, which name the database and what to do, as a failed connect's are."""
        return translate(self.url, exc) if isinstance(exc, psycopg.Error) else exc

    def _dispatch(self, channel: str, payload: str) -> None:
        self._channels.dispatch(channel, payload)


async def _abandon(conn: psycopg.AsyncConnection, statement: asyncio.Future[Any]) -> None:
    """End `statement` on a connection about to be dropped by shutting the connection's socket
    down under it: the statement then fails at once as on a lost connection. Cancelling it made
    psycopg ask the server to cancel it and wait up to 5 s for an answer a connection that hears
    nothing never brings, and cancelling that wait made psycopg log a WARNING of its own beside
    the listener's, about a connection livepush was discarding on purpose."""
    if not statement.done():
        _shut_down(conn)
        await asyncio.wait([statement], timeout=_CYCLE)
    # Only if the statement outlived its socket (it should not): cancel it, then again, which
    # makes psycopg close the connection at once instead of waiting for the server's answer.
    while not statement.done():
        statement.cancel()
        await asyncio.wait([statement], timeout=0.1)
    if not statement.cancelled():
        statement.exception()  # retrieved: the loop then logs no "exception was never retrieved"


def _shut_down(conn: psycopg.AsyncConnection) -> None:
    """Shut the socket of `conn` down for both directions, through a duplicate of its descriptor:
    libpq's own descriptor stays open (and registered with the event loop) until the connection
    is closed, so no other file can take its number meanwhile."""
    try:
        with socket.socket(fileno=os.dup(conn.pgconn.socket)) as sock:
            sock.shutdown(socket.SHUT_RDWR)
    except (psycopg.Error, OSError):
        pass  # already closed or broken: the statement fails, or is cancelled, all the same


# A plain read of the statistics view: the LISTEN connections of livepush servers on this
# database (the name every server's shared listener connects with). Another role's sessions
# show their name but no address or start time to a role without pg_read_all_stats.
LISTENING_BACKENDS = """
SELECT pid, host(client_addr) AS address, backend_start AS since
FROM pg_stat_activity
WHERE datname = current_database() AND application_name = %(name)s
ORDER BY backend_start, pid
"""


def listening_backends(url: str, name: str = "livepush-listener") -> list[dict[str, object]]:
    """The servers listening on this database now, for `livepush status`."""
    with translated(url), connect(url) as conn:
        return list(conn.cursor(row_factory=dict_row).execute(LISTENING_BACKENDS, {"name": name}))
