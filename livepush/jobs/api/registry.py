"""Job names to job functions: the one process-wide `REGISTRY`, and `JobRequest`, a job named
with the exact arguments to run it with.

A job's name is `module.qualname` of its function unless `name=` says otherwise; the name is
what the database stores, so renaming a job function is a deploy concern (old rows keep the old
name: keep an alias registered until they are gone).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Protocol, runtime_checkable

from ..errors import UnknownJobError


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

    def add(self, fn: Any) -> Any:
        # Re-importing a module (e.g. under a reloader) defines the same name again: the newest
        # definition wins. Two different functions with one explicit name do too, which is a
        # mistake we cannot tell apart from a reload; the docs warn about it.
        self._functions[fn.name] = fn
        return fn

    def get(self, name: str) -> Any:
        try:
            return self._functions[name]
        except KeyError:
            raise UnknownJobError(f"no job function named {name!r} in this process: import the module that defines it") from None

    def find(self, name: str) -> Any:
        return self._functions.get(name)

    def names(self) -> list[str]:
        return sorted(self._functions)

    def queues(self) -> list[str]:
        return sorted({fn.queue for fn in self._functions.values()})

    def __contains__(self, name: object) -> bool:
        return name in self._functions

    def __len__(self) -> int:
        return len(self._functions)


REGISTRY = Registry()
