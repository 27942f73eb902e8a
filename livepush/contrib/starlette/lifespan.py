"""The app's lifespan: livepush's pools open when the app starts and close when it stops."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any, TypeVar

from .. import _process

App = TypeVar("App")
Lifespan = Callable[[App], AbstractAsyncContextManager[Any]]


@asynccontextmanager
async def lifespan(app: object) -> AsyncIterator[None]:
    """`Starlette(lifespan=lifespan)` / `FastAPI(lifespan=lifespan)`: opens the pools and clients
    publish(), latest_offset(), enqueues and revoke() use on the app's loop (a bad URL, an
    unmigrated schema or a missing secret stops the start), and closes them at shutdown."""
    await _process.aopen()
    try:
        yield
    finally:
        await _process.aclose()


def with_livepush(inner: Lifespan[App]) -> Lifespan[App]:
    """Your lifespan inside livepush's: livepush opens first and closes last, so your start-up
    and shut-down code may publish and enqueue; the state yours yields becomes the app's."""

    @asynccontextmanager
    async def combined(app: App) -> AsyncIterator[Any]:
        async with lifespan(app), inner(app) as state:
            yield state

    return combined
