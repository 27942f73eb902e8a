"""The app's lifespan: livepush's pools open when the app starts and close when it stops."""

from __future__ import annotations

import inspect
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any, TypeVar

from starlette.applications import Starlette

from ...errors import ArgumentTypeError
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
    _check_lifespan(inner)

    @asynccontextmanager
    async def combined(app: App) -> AsyncIterator[Any]:
        async with lifespan(app), inner(app) as state:
            yield state

    return combined


def _check_lifespan(inner: object) -> None:
    """ArgumentTypeError, where the app is written, for what no start could enter: it failed at the
    server's start with a TypeError from inside the lifespan, naming neither the cause nor the fix."""
    if isinstance(inner, Starlette):
        # `lifespan=with_livepush`, not called: Starlette calls it with the app at the start, and
        # entering what it returned failed inside Starlette's router, naming neither.
        raise ArgumentTypeError(f"with_livepush() was given the app ({type(inner).__name__}): it wraps a lifespan of "
                                "yours, so write lifespan=with_livepush(your_lifespan), or lifespan=lifespan "
                                "(from livepush.contrib.starlette) when you have none")
    name = getattr(inner, "__qualname__", type(inner).__qualname__)
    if inspect.isasyncgenfunction(inner) or inspect.isgeneratorfunction(inner):
        raise ArgumentTypeError(f"with_livepush({name}): a lifespan is a function of the app that returns an async "
                                "context manager: decorate it with @contextlib.asynccontextmanager")
    # A context manager made by calling the lifespan is callable too (as a decorator).
    if not callable(inner) or isinstance(inner, AbstractAsyncContextManager):
        raise ArgumentTypeError(f"with_livepush() takes your lifespan function, got {type(inner).__name__}: pass "
                                "the function itself (with_livepush(mine)), not what calling it returns")
