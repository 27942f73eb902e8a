"""Job names to job functions: the one process-wide `REGISTRY`, and `JobRequest`, a job named
with the exact arguments to run it with.

A job's name is `module.qualname` of its function unless `name=` says otherwise; the name is
what the database stores, so renaming a job function is a deploy concern (old rows keep the old
name: keep an alias registered until they are gone).
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import logging
from collections.abc import Iterable
from typing import Any, Protocol, runtime_checkable

from ...errors import ConfigError
from ...types import shown
from ..errors import UnknownJobError

log = logging.getLogger("livepush.jobs")


@runtime_checkable
class JobSpec(Protocol):
    """What enqueueing needs to know of a job function (functions.JobFunction has it)."""

    name: str
    queue: str
    priority: int
    max_attempts: int


@dataclasses.dataclass(frozen=True, slots=True)
class JobRequest:
    """A job function and the exact arguments to run it with, not yet enqueued
    (`some_job.request(*args)`; task groups use these as callbacks, durable jobs as children).
    `queue`: the queue asked for (`request(*args, queue=...)`), else None: the function's own, or
    for a child its parent's."""

    name: str
    args: tuple[Any, ...]
    queue: str | None = None

    @property
    def function(self) -> Any:
        return REGISTRY.get(self.name)


class Registry:
    """Job names to functions. One process-wide instance, `REGISTRY`."""

    def __init__(self) -> None:
        self._functions: dict[str, Any] = {}
        self._queues: set[str] = set()
        # Registrations so far (and add_queues() that added one): a running runtime compares it
        # with the count it last saw, which tells it cheaply, before each claim, that a function
        # was defined since (its limits, its queue).
        self.changes = 0

    def add(self, fn: Any, origin: str | None = None, defined_at: str | None = None) -> Any:
        """Register `fn` under its name. `origin` says what defined it (by default its function's
        qualname and file): re-importing a module (e.g. under a reloader) defines the same name
        from the same origin again, and the newest definition wins; a name taken by another
        origin is a ConfigError, since whichever was imported last would silently run the other's
        jobs. `defined_at` is where (file:line, by default its function's): the same origin
        defined again elsewhere in its file, or with other options, is warned about (below)."""
        origin = origin or _origin_of(fn)
        clash = self.clash(fn.name, origin)
        if clash is not None:
            raise ConfigError(clash)
        fn.origin = origin
        fn.defined_at = defined_at or place_of(getattr(fn, "func", fn))
        held = self._functions.get(fn.name)
        if held is not None and held is not fn:
            _warn_if_redefined(held, fn)
        self._functions[fn.name] = fn
        self.changes += 1
        return fn

    def clash(self, name: str, origin: str) -> str | None:
        """Why `origin` cannot register `name` (another origin holds it), or None when it can."""
        held = self._functions.get(name)
        if held is None:
            return None
        held_origin = getattr(held, "origin", None) or _origin_of(held)
        if held_origin == origin:
            return None
        return (f"job name {name!r} of {origin} is taken by {held_origin}: two definitions would run each "
                "other's jobs; give one of them another name (name=)")

    def get(self, name: str) -> Any:
        try:
            return self._functions[name]
        except KeyError:
            raise UnknownJobError(f"no job function named {name!r} in this process: import the module that defines it") from None

    def find(self, name: str) -> Any:
        return self._functions.get(name)

    def names(self) -> list[str]:
        return sorted(self._functions)

    def add_queues(self, queues: Iterable[str]) -> None:
        """Queues the registered jobs also run on, beside their functions' own: a job whose every
        enqueue names its queue (livepush.contrib.django's one job runs the tasks of every queue of
        the Django backend), so that a runtime started without --queues serves them too."""
        from .options import check_queue

        added = {check_queue(q, "queue") for q in queues} - self._queues
        if added:
            self._queues.update(added)
            self.changes += 1  # a running runtime made without --queues serves them from its next claim

    def queues(self) -> list[str]:
        """What a runtime started without --queues serves: its functions' queues and add_queues()'."""
        return sorted({fn.queue for fn in self._functions.values()} | self._queues)

    def __contains__(self, name: object) -> bool:
        return name in self._functions

    def __len__(self) -> int:
        return len(self._functions)


def where_defined(func: Any) -> str:
    """A function's qualname and source file: the same file imported again under another module
    name (a script run as __main__, a test file beside its package name) is the same definition."""
    code = getattr(inspect.unwrap(func), "__code__", None)
    place = code.co_filename if code is not None else getattr(func, "__module__", None)
    return f"{getattr(func, '__qualname__', None)} in {place}"


def place_of(func: Any) -> str:
    """Where a callable's code starts, as file:line (a partial's function, a callable object's
    __call__), else its module and qualname: what a warning names a definition by."""
    target = inspect.unwrap(func)
    while isinstance(target, functools.partial):
        target = inspect.unwrap(target.func)
    code = getattr(target, "__code__", None) or getattr(getattr(type(target), "__call__", None), "__code__", None)
    if code is None:
        return f"{getattr(target, '__module__', None)}.{getattr(target, '__qualname__', type(target).__qualname__)}"
    return f"{code.co_filename}:{code.co_firstlineno}"


def _warn_if_redefined(held: Any, fn: Any) -> None:
    """One warning when `fn` takes the name of `held` (the same origin: its qualname in its file)
    but would not do the same: a function defined at another line (a factory's second function, a
    name= given twice in one file), or other options. A re-import defines it again at the same
    place with the same options, and is silent. The replaced object still enqueues with its own
    options (its queue) while runtimes run the newest definition: the user is told both places."""
    before, after = held.defined_at, fn.defined_at
    changed = [] if before == after else [f"another function (at {after}, was at {before})"]
    old, new = _options_of(held), _options_of(fn)
    changed += [f"{key} {shown(new[key])} (was {shown(old[key])})" for key in new if new[key] != old.get(key)]
    if changed:
        log.warning("job %r defined again at %s with %s: it replaces the definition at %s, whose jobs now run "
                    "the new one while the object it returned still enqueues with its own options; if both are "
                    "meant to exist, give one of them another name (name=), else define the job once",
                    fn.name, after, ", ".join(changed), before)


def _options_of(fn: Any) -> dict[str, Any]:
    """What a registration decides beyond its function, comparable across a re-import (callables
    and exception classes by where they are defined, not by identity)."""
    limits = getattr(fn, "_limits", None)
    return {
        "queue": getattr(fn, "queue", None), "priority": getattr(fn, "priority", None),
        "max_attempts": getattr(fn, "max_attempts", None), "timeout": getattr(fn, "timeout", None),
        "never_retry": tuple(f"{c.__module__}.{c.__qualname__}" for c in getattr(fn, "never_retry", ())),
        "backoff": place_of(fn.backoff) if callable(getattr(fn, "backoff", None)) else None,
        "concurrency": None if limits is None or limits.max_running is None else (limits.key_param, limits.max_running),
        "rate": None if limits is None else limits.rate,
        "schema": getattr(fn, "schema", None),
    }


def _origin_of(fn: Any) -> str:
    return f"function {where_defined(getattr(fn, 'func', fn))}"


REGISTRY = Registry()
