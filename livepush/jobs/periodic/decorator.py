"""`@jobs.periodic(cron, timezone=...)`: a job enqueued once per cron tick, and the process-wide
table of periodic jobs, `SCHEDULES`, that runtimes schedule from."""

from __future__ import annotations

import dataclasses
import inspect
import logging
from collections.abc import Callable, Iterable
from datetime import UTC, datetime
from typing import Any, Concatenate

from ..api.functions import FP, FR, OPTIONS, JobFunction, job
from ..api.registry import REGISTRY, Registry
from ...errors import ArgumentTypeError
from ...usercode import cannot_take
from ..errors import InvalidArgumentsError, InvalidScheduleError
from .cron import Cron, parse

log = logging.getLogger("livepush.jobs")


@dataclasses.dataclass(frozen=True)
class Schedule:
    """A periodic job: its function (registered like any job) and its cron schedule."""

    function: JobFunction[..., Any]
    cron: Cron

    @property
    def name(self) -> str:
        return self.function.name


class Schedules:
    """Periodic job names to schedules. One process-wide instance, `SCHEDULES`."""

    def __init__(self) -> None:
        self._schedules: dict[str, Schedule] = {}
        # The runtimes of this process that read their schedules (read()) and have not ended: each
        # with its registry, its queues (None: every queue of its registry's jobs, those defined
        # later included) and the names it schedules.
        self._readers: dict[object, tuple[Registry, frozenset[str] | None, frozenset[str]]] = {}

    def add(self, schedule: Schedule) -> None:
        # As with the job registry, a re-imported module's newest definition wins.
        held = self._schedules.get(schedule.name)
        self._schedules[schedule.name] = schedule
        if held is not None and _when(held) != _when(schedule):
            self._warn_rescheduled(held, schedule)
        self._warn_if_unread(schedule)

    def _warn_rescheduled(self, held: Schedule, schedule: Schedule) -> None:
        # A re-import with the same schedule is silent; another one replaces the first, which a
        # running runtime (it read its schedules as it started) keeps using: the user is told once.
        running = any(held.name in names for _, _, names in self._readers.values())
        (new, new_zone), (old, old_zone) = _when(schedule), _when(held)
        log.warning("periodic job %s declared again with the schedule %r in %s, where it had %r in %s: the new one "
                    "replaces the first%s; if both are meant, give one of them another name (name=), else "
                    "declare the job once", schedule.name, new, new_zone, old, old_zone,
                    ", but a job runtime of this process that is running keeps the first until its next start"
                    if running else "")

    def read(self, reader: object, registry: Registry, queues: Iterable[str],
             every_queue: bool = False) -> list[Schedule]:
        """served_by() for a runtime that schedules them from now until done_reading(reader): a
        runtime reads its periodic jobs once, so a job declared meanwhile is said not to be among
        them (add()). `every_queue`: the runtime also serves the queues of jobs defined later (it
        was made without `queues`), so a job declared meanwhile on a new queue is said so too."""
        served = self.served_by(registry, queues)
        self._readers[reader] = (registry, None if every_queue else frozenset(queues),
                                 frozenset(s.name for s in served))
        return served

    def done_reading(self, reader: object) -> None:
        self._readers.pop(reader, None)

    def _warn_if_unread(self, schedule: Schedule) -> None:
        # Scheduling it in the running runtimes instead would need more than their scheduler's
        # list: the runtime's row names the jobs it schedules (jobs.forget_periodic() reads it).
        # So it is said, once.
        late = [queues for registry, queues, names in self._readers.values()
                if schedule.name not in names and registry.find(schedule.name) is schedule.function
                and (queues is None or schedule.function.queue in queues)]
        if late:
            log.warning("periodic job %s (%s, %s) was declared while a job runtime of this process serving its "
                        "queue %s was running: a runtime reads its periodic jobs when it starts, so it is scheduled "
                        "from the next runtime start; import its module before the runtime starts (a module given "
                        "to `livepush jobs`)", schedule.name, schedule.cron.expression, schedule.cron.timezone,
                        schedule.function.queue)

    def served_by(self, registry: Registry, queues: Iterable[str]) -> list[Schedule]:
        """The schedules a runtime with this registry and these queues takes part in: those whose
        function is still the one registered under its name, on a queue it serves."""
        served = set(queues)
        return [s for s in self._schedules.values()
                if registry.find(s.name) is s.function and s.function.queue in served]

    def elsewhere(self, registry: Registry, queues: Iterable[str]) -> list[Schedule]:
        """The schedules of this registry's functions whose queue is not among these: a runtime
        serving only these leaves them to runtimes that serve their queue."""
        served = set(queues)
        return [s for s in self._schedules.values()
                if registry.find(s.name) is s.function and s.function.queue not in served]

    def __len__(self) -> int:
        return len(self._schedules)


SCHEDULES = Schedules()


def _when(schedule: Schedule) -> tuple[str, str]:
    """A schedule's expression (its fields however spaced) and zone: what makes a declaration of
    the same job another schedule."""
    return " ".join(schedule.cron.expression.split()), schedule.cron.timezone


def _check_signature(cron: str, func: Callable[..., Any]) -> None:
    why = cannot_take(func, None, "tick")
    if why is None:
        return
    fix = ""
    try:
        inspect.signature(func).bind_partial(None, "tick")  # read: cannot_take() read it
    except TypeError:
        pass  # no place for the tick (`def f(ctx)`): no other parameter a default would help
    else:
        # A place for the tick and more left unfilled: Python's reason names which ("missing a
        # required argument: 'region'"), where (ctx, tick) alone, which it does take, misled.
        fix = f" ({why}); give any other parameter a default"
    raise InvalidScheduleError(f"periodic {cron!r}: {getattr(func, '__qualname__', func)!r} must take "
                               f"(ctx, tick): the tick is passed as its one argument{fix}")


def _check_schema(fn: JobFunction[..., Any], cron: Cron) -> None:
    # A schema= that refuses the tick it is given mostly refuses every one, and each would only be
    # logged as not enqueued (periodic/scheduler.py): refused now, at import, where it is seen.
    if fn._validate_args is None:
        return
    tick = cron.latest_due(datetime.now(UTC)).isoformat()
    try:
        fn._validate_args([tick])
    except InvalidArgumentsError as exc:
        raise InvalidScheduleError(f"periodic {cron.expression!r}: {fn.name} is enqueued with its tick as its one "
                                   f"argument, which its schema refuses: {exc}") from None


def _check_concurrency(fn: JobFunction[..., Any], cron: Cron) -> None:
    # The tick is the job's first argument and differs each time: a concurrency key taken from it
    # never holds a run back, and a user who meant "one at a time" would get overlapping runs.
    limits = fn._limits
    if limits.key_index == 0:
        raise InvalidScheduleError(
            f"periodic {cron.expression!r}: {fn.name}'s concurrency=({limits.key_param!r}, {limits.max_running}) "
            f"is keyed on the tick, which no two runs share, so it limits nothing: to run one at a time, add a "
            f"parameter with a default (def f(ctx, tick, only=\"{fn.name}\")) and give concurrency=('only', 1)")


def periodic(cron: str, *, timezone: str = "UTC",
             **options: Any) -> Callable[[Callable[Concatenate[Any, FP], FR]], JobFunction[FP, FR]]:
    """Declare a periodic job: `@jobs.periodic("*/5 * * * *", timezone="UTC", queue=...)` on
    `def f(ctx, tick)`. It is enqueued once per tick across every runtime, with the tick (ISO 8601,
    in `timezone`) as its argument; `options` are those of `@jobs.job`."""
    parsed = parse(cron, timezone)
    unknown = set(options) - OPTIONS
    if unknown:
        # Named here, not by @jobs.job (which the user did not call); enqueue options such as
        # tags= and key= are the likely ones, and a periodic job is enqueued by no call of theirs.
        raise ArgumentTypeError(f"periodic {cron!r}: unknown options {sorted(unknown)}: @jobs.periodic takes "
                                f"timezone= and @jobs.job's options ({', '.join(sorted(OPTIONS))}); enqueue "
                                "options such as tags= and key= do not apply to a periodic job")
    job(**options)  # checks the job options now, at import, as @jobs.job does

    def decorate(func: Callable[Concatenate[Any, FP], FR]) -> JobFunction[FP, FR]:
        if isinstance(func, JobFunction):
            # Stacked on @jobs.job: registering the same function again would fail as a name
            # clash between "two definitions", which sends the user looking for a second one.
            raise InvalidScheduleError(f"periodic {cron!r}: {func.name} is already a job (@jobs.job): @jobs.periodic "
                                       "registers the job itself, so use it alone, with @jobs.job's options "
                                       f"(@jobs.periodic({cron!r}, queue=...))")
        _check_signature(cron, func)
        # Registered only once every check passed: a refused declaration left its job registered,
        # run by drain() and holding its name against the corrected one.
        fn: JobFunction[FP, FR] = JobFunction(func, **options)
        _check_schema(fn, parsed)
        _check_concurrency(fn, parsed)
        REGISTRY.add(fn)
        SCHEDULES.add(Schedule(fn, parsed))
        return fn

    return decorate
