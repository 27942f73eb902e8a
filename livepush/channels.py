"""What the listeners of every service share (postgres/listener.py, redis/subscriber.py, and
the fan-outs' receivers): which handlers a channel has, handing each notification to them (a
handler that raises is logged at most once a minute and costs the other handlers and the next
notification nothing), the resync handlers a reconnect runs (in a task beside the listener's
loop), and the slot through which an owner uses a shared listener or its own."""

from __future__ import annotations

import asyncio
import inspect
import logging
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Generic, Protocol, TypeVar

from .tasks import stop
from .types import ResyncHandler as Resync

P = TypeVar("P")  # what a notification carries: str (Postgres) or bytes (Redis)

_RELOG_SECONDS = 60.0


class Handlers(Generic[P]):
    """What hears one kind of notification: its handlers, and what runs after a reconnect.
    A handler that raises is logged at most once a minute and costs the other handlers and
    the next notification nothing."""

    def __init__(self, name: str, log: logging.Logger) -> None:
        self.name = name
        self._log = log
        self.handlers: list[Callable[[P], None]] = []
        self.resyncs: list[Resync] = []
        self._logged: dict[type[BaseException], float] = {}

    def deliver(self, payload: P) -> None:
        for handler in self.handlers:
            try:
                handler(payload)
            except Exception as exc:  # a handler's bug must not cost the others, nor stop the loop
                now = time.monotonic()
                if now - self._logged.get(type(exc), -_RELOG_SECONDS) >= _RELOG_SECONDS:
                    self._logged[type(exc)] = now
                    self._log.error("a handler of %s failed on a notification (logged at most once a minute)",
                                    self.name, exc_info=exc)

    async def resync(self) -> None:
        """After a reconnect: let every handler read what it may have missed."""
        for resync in self.resyncs:
            try:
                result: Any = resync()
                if inspect.isawaitable(result):
                    await result
            except asyncio.CancelledError:
                raise
            except Exception:
                self._log.exception("reading what %s missed after a reconnect failed", self.name)


@dataclass
class Channel(Generic[P]):
    name: str
    heard: Handlers[P]
    live: asyncio.Event = field(default_factory=asyncio.Event)  # subscribed on the current connection


class Channels(Generic[P]):
    def __init__(self, log: logging.Logger) -> None:
        self._log = log
        self._channels: dict[str, Channel[P]] = {}
        self._resync: asyncio.Task[None] | None = None

    def add(self, name: str, handler: Callable[[P], None], on_resync: Resync | None = None) -> None:
        channel = self._channels.get(name)
        if channel is None:
            channel = self._channels[name] = Channel(name, Handlers(f"channel {name}", self._log))
        # Once each: an owner whose first start failed (its service away at boot) adds its
        # handler again when it retries, and two copies would deliver every notification twice.
        if handler not in channel.heard.handlers:
            channel.heard.handlers.append(handler)
        if on_resync is not None and on_resync not in channel.heard.resyncs:
            channel.heard.resyncs.append(on_resync)

    def __iter__(self) -> Iterator[Channel[P]]:
        return iter(list(self._channels.values()))

    def get(self, name: str) -> Channel[P] | None:
        return self._channels.get(name)

    def names(self) -> list[str]:
        return list(self._channels)

    def not_live(self) -> list[Channel[P]]:
        return [c for c in self if not c.live.is_set()]

    @staticmethod
    async def wait_live(channels: list[Channel[P]], timeout: float) -> None:
        """Return once each of `channels` is live; TimeoutError past `timeout` seconds. Each is
        awaited in turn under one deadline: asyncio.gather()'s future, when a stop cancels the
        wait, ends with an error nobody retrieves, which asyncio logs with a traceback."""
        async with asyncio.timeout(timeout):
            for channel in channels:
                await channel.live.wait()

    def lost(self) -> None:
        for channel in self:
            channel.live.clear()

    def dispatch(self, name: str, payload: P) -> None:
        channel = self._channels.get(name)
        if channel is not None:
            channel.heard.deliver(payload)

    async def resync(self) -> None:
        """After a reconnect: let every channel read what it may have missed."""
        for channel in self:
            await channel.heard.resync()

    def resync_beside(self, name: str) -> None:
        """`resync()` in a task named `name` beside the listener's loop, which goes on handing
        out notifications: a handler that reads slowly (a lock, a database short of connections,
        a slow history read) held up every other part's notifications while it waited. It starts
        after the resync of an earlier reconnect, if that one still runs, and repeats it."""
        self._resync = asyncio.create_task(self._resync_after(self._resync), name=name)

    async def _resync_after(self, previous: asyncio.Task[None] | None) -> None:
        if previous is not None:
            await asyncio.wait([previous])
        await self.resync()

    async def stop_resync(self) -> None:
        """End a resync still running (the listener is closing)."""
        task, self._resync = self._resync, None
        await stop(task)


class Closable(Protocol):
    @property
    def listening(self) -> bool: ...

    async def aclose(self) -> None: ...


L = TypeVar("L", bound=Closable)


class ListenerSlot(Generic[L]):
    """The listener one owner hears through: the process's shared one, given by the wiring
    (which closes it), or, when none was given, one of the owner's own, made by `make` on
    first use and closed with the owner."""

    def __init__(self, given: L | None, make: Callable[[], L]) -> None:
        self._given = given
        self._make = make
        self._own: L | None = None
        self._taken = False

    def get(self) -> L:
        """The listener to add channels to."""
        self._taken = True
        if self._given is not None:
            return self._given
        if self._own is None:
            self._own = self._make()
        return self._own

    @property
    def listening(self) -> bool:
        """False only while a listener this owner uses is away (nothing to hear is no fault)."""
        return not self._taken or self.get().listening

    async def aclose(self) -> None:
        own, self._own = self._own, None
        if own is not None:
            await own.aclose()
