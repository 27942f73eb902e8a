"""Defining a workflow: `jobs.workflow(name, queue=)`, `@flow.step(...)`, `@flow.fan_out(...)`.

The graph is checked as it is written: a step may only come after steps defined above it (so a
name that is unknown is caught at the decorator, and a cycle cannot be written), and a fan-out
step takes no signal wait. Each step is also a job function (`<workflow>.<step>`), registered
like any `@jobs.job`, so the runtimes that import the module run its steps.

What runs a step and starts a run is the `Engine` given to the Workflow (workflows/__init__.py
gives the real one): this module only describes graphs.
"""

from __future__ import annotations

import dataclasses
import functools
import re
from collections.abc import Callable, Iterable
from typing import Any, Protocol, TypeVar, overload

from ..api.awaited import awaited
from ..api.functions import JobFunction, class_refused, default_backoff, is_generator_callable
from ..api.handles import WorkflowHandle
from ..api.options import check_queue
from ..api.registry import REGISTRY, place_of, where_defined
from ..durable.run import MAX_SECONDS, check_name
from ..errors import WorkflowDefinitionError
from ...blocking import due, say
from ...errors import ConfigError
from ...types import as_seconds, shown
from ...usercode import cannot_take

# A step's function: the decorators return it as they were given it, so its own type stays.
StepFn = TypeVar("StepFn", bound=Callable[..., Any])

ON_TIMEOUT = ("fail", "cancel", "skip")
ON_BATCH_FAILURE = ("pause", "cancel", "skip")
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]{0,99}")


@dataclasses.dataclass(frozen=True)
class StepSpec:
    name: str
    kind: str  # "step" | "fan_out"
    after: tuple[str, ...]
    fn: Callable[..., Any]
    job: str  # the name of the job function that runs it
    wait_for: str | None = None
    wait_timeout: float | None = None
    on_timeout: str = "fail"
    on_batch_failure: str = "pause"
    max_attempts: int = 5
    priority: int = 0

    def as_json(self) -> dict[str, Any]:
        """What a run stores of this step (the graph it follows, whatever later deploys change)."""
        return {"kind": self.kind, "after": list(self.after), "job": self.job, "wait_for": self.wait_for,
                "wait_timeout": self.wait_timeout, "on_timeout": self.on_timeout,
                "on_batch_failure": self.on_batch_failure, "max_attempts": self.max_attempts,
                "priority": self.priority}


class Engine(Protocol):
    """What runs a workflow's steps and starts its runs."""

    async def run_step(self, flow: Workflow, step: str, ctx: Any, run_id: int) -> Any: ...

    def refused_output(self, flow: Workflow, step: str, result: Any) -> Exception | None: ...

    def start(self, flow: Workflow, input: Any, conn: Any, key: str | None = None) -> WorkflowHandle: ...

    async def astart(self, flow: Workflow, input: Any, conn: Any, key: str | None = None) -> WorkflowHandle: ...


WORKFLOWS: dict[str, Workflow] = {}


def _bare(flow: Workflow, after: Any) -> bool:
    """Whether a step decorator was used without parentheses (`@flow.step`): it was handed the
    function as `after=`, and returning a decorator then defined no step at all, so runs went on
    without it and the module's name for the function held that decorator. A step's own function
    given as `after=` is a mistaken dependency instead, which _add names."""
    return callable(after) and not isinstance(after, str) and all(s.fn is not after for s in flow.steps.values())


class Workflow:
    """A named graph of steps run as jobs (docs/workflows.md). Made by `jobs.workflow(name, queue=)`."""

    def __init__(self, name: str, queue: str, engine: Engine) -> None:
        if not isinstance(name, str) or not _NAME.fullmatch(name):
            raise WorkflowDefinitionError(f"jobs.workflow({name!r}): a workflow name is a letter or _ and then up to "
                                          "99 letters, digits, _ . or -")
        # The queue @jobs.job takes: one Postgres cannot store failed every start with the driver's
        # error, and one too long for --queues left the steps where no runtime could claim them.
        try:
            check_queue(queue, f"jobs.workflow({name!r}, queue=)")
        except ConfigError as exc:
            raise WorkflowDefinitionError(str(exc)) from None
        self.name = name
        self.queue = queue
        self._engine = engine  # runs its steps and starts its runs (runner.Runner): not API
        self.steps: dict[str, StepSpec] = {}
        WORKFLOWS[name] = self  # a re-import defines it again: the newest definition wins

    def __repr__(self) -> str:
        return f"<workflow {self.name} steps={list(self.steps)}>"

    def _graph(self) -> dict[str, Any]:
        """The graph as a run stores it: steps in definition order (a topological order)."""
        return {"steps": {name: spec.as_json() for name, spec in self.steps.items()}, "order": list(self.steps)}

    def _add(self, fn: Callable[..., Any], kind: str, after: Iterable[str] | str | None,
             options: dict[str, Any]) -> StepSpec:
        where = f"workflow {self.name!r}"
        # Refused here, else every attempt of the step failed when it ran: a value that is no
        # function with a TypeError, a @jobs.job function (called, it gives its body's coroutine
        # back to a thread, not its output) with an output that is not JSON.
        if isinstance(fn, JobFunction):
            step = options.get("name") or getattr(fn.func, "__name__", fn.name)
            raise WorkflowDefinitionError(f"{where}: step {step!r} is a @jobs.job function ({fn.name!r}); a step is "
                                          "a job of its own: decorate the plain function with the step only")
        if not callable(fn):
            raise WorkflowDefinitionError(f"{where}: a step is a function of ctx, got {shown(fn, typed=True, width=60)}")
        # name= given (even "" or a non-str) is the name checked: falling back to the function's
        # name would run the step under a name the user did not write.
        name = options.pop("name", None)
        if name is None:
            name = getattr(fn, "__name__", None)
        if not isinstance(name, str) or not _NAME.fullmatch(name):
            raise WorkflowDefinitionError(f"{where}: a step name is a letter or _ and then letters, digits, _ . or -;"
                                          f" got {name!r} (pass name=)")
        if name in self.steps:
            raise WorkflowDefinitionError(f"{where}: step {name!r} is defined twice")
        # The check @jobs.job makes: a class's call builds an instance, never a step's output.
        refused = class_refused(fn, f"{where}: step {name!r} is", "a step's output")
        if refused is not None:
            raise WorkflowDefinitionError(refused)
        # Its call gives a generator, no output: every run of the step failed on a result that
        # is not JSON, where the mistake (a `yield`) is plain at import.
        if is_generator_callable(fn):
            raise WorkflowDefinitionError(f"{where}: step {name!r} is a generator function: a step returns its "
                                          "output (JSON); use return, not yield (ctx.progress() reports on the way)")
        # The call the step's job makes, (ctx) or (ctx, batch), checked against the function:
        # else @flow.step on a fan-out's function (or the reverse) failed every attempt at run time.
        takes = "(ctx, batch)" if kind == "fan_out" else "(ctx)"
        if cannot_take(fn, *([None] * (2 if kind == "fan_out" else 1))) is not None:
            other = "@flow.step" if kind == "fan_out" else "@flow.fan_out"
            raise WorkflowDefinitionError(f"{where}: step {name!r} is called as {takes}, which its function does not "
                                          f"take: change its parameters, or use {other} if it is one")
        if isinstance(after, str):
            after = [after]
        try:
            deps = tuple(after or ())
        except TypeError:
            raise WorkflowDefinitionError(f"{where}: step {name!r} after= takes the names of steps, got {shown(after, width=60)}"
                                          ) from None
        for dep in deps:
            # A name is a str: anything else (a list nested in the list, the step's function) is
            # named as a mistake here, where an unhashable one failed the lookup with a TypeError.
            if not isinstance(dep, str):
                raise WorkflowDefinitionError(f"{where}: step {name!r} after= takes the names of steps (strs), "
                                              f"got {shown(dep, width=60)} in it")
            if dep not in self.steps:
                raise WorkflowDefinitionError(
                    f"{where}: step {name!r} comes after {dep!r}, which is not a step defined above it "
                    f"(steps so far: {list(self.steps) or 'none'}); define the steps in the order they run")
        if len(set(deps)) != len(deps):
            raise WorkflowDefinitionError(f"{where}: step {name!r} names a step twice in after={list(deps)}")
        wait_for = options.pop("wait_for", None)
        wait_timeout = as_seconds(options.pop("wait_timeout", None))
        # Options that only mean something with another, refused without it rather than ignored.
        if "on_timeout" in options and wait_timeout is None:
            raise WorkflowDefinitionError(f"{where}: step {name!r} on_timeout= says what a timed-out signal wait "
                                          "does: give it with wait_for= and wait_timeout=, or drop it")
        if "on_batch_failure" in options and kind != "fan_out":
            raise WorkflowDefinitionError(f"{where}: step {name!r} on_batch_failure= is for a fan-out step's "
                                          "batch: use @flow.fan_out(...), or drop it")
        on_timeout = options.pop("on_timeout", "fail")
        on_batch_failure = options.pop("on_batch_failure", "pause")
        if kind == "fan_out" and wait_for is not None:
            raise WorkflowDefinitionError(f"{where}: fan-out step {name!r} cannot wait for a signal (wait_for=): "
                                          "put the wait on a step before or after it")
        if wait_for is not None:
            # The name signal() and the step's wait take (durable.run.check_name), checked here:
            # else the step's job failed every attempt at its wait, or (a NUL) every start failed
            # on storing the graph.
            try:
                check_name(wait_for, "wait_for=")
            except ValueError as exc:
                raise WorkflowDefinitionError(f"{where}: step {name!r} wait_for= takes a signal name ({exc})") from None
        if wait_timeout is not None and (wait_for is None or isinstance(wait_timeout, bool)
                                         or not isinstance(wait_timeout, (int, float)) or not wait_timeout > 0
                                         or not wait_timeout <= MAX_SECONDS):
            raise WorkflowDefinitionError(f"{where}: step {name!r} wait_timeout= takes a positive number of seconds "
                                          f"or a timedelta, at most 100 years, with wait_for=; got {shown(wait_timeout, width=40)}")
        if on_timeout not in ON_TIMEOUT:
            raise WorkflowDefinitionError(f"{where}: step {name!r} on_timeout={on_timeout!r}: use one of {ON_TIMEOUT}")
        if on_batch_failure not in ON_BATCH_FAILURE:
            raise WorkflowDefinitionError(
                f"{where}: step {name!r} on_batch_failure={on_batch_failure!r}: use one of {ON_BATCH_FAILURE}")
        unknown = set(options) - {"max_attempts", "timeout", "priority", "never_retry", "backoff"}
        if unknown:
            raise WorkflowDefinitionError(f"{where}: step {name!r} got unknown options {sorted(unknown)}")
        job_name = f"{self.name}.{name}"
        # Names may hold dots, so workflow "a.b" step "c" and workflow "a" step "b.c" make one job
        # name: refused here, else the later definition would silently run the other's steps. The
        # same step defined again (a re-import) takes its name back.
        origin = f"step {name!r} of workflow {self.name!r} ({where_defined(fn)})"
        clash = REGISTRY.clash(job_name, origin)
        if clash is not None:
            raise WorkflowDefinitionError(f"{where}: {clash}")
        options.setdefault("timeout", None if kind == "fan_out" or wait_for is not None else 60)
        try:
            function = JobFunction(self._runner(name), name=job_name, queue=self.queue,
                                   backoff=options.pop("backoff", default_backoff), **options)
        except (ValueError, TypeError, ConfigError) as exc:
            # A bad job option (max_attempts=0, ...), as @jobs.job refuses it: a bad option of
            # the graph's, raised at import like the others, naming the step.
            raise WorkflowDefinitionError(f"{where}: step {name!r}: {exc}") from None
        # Marked a step before it is registered: a runtime that sees the registration (registry.changes)
        # reads its steps then, from another thread too, and must find this one marked.
        function._step_of = self.name
        function._refused_result = functools.partial(self._engine.refused_output, self, name)
        job = REGISTRY.add(function, origin, place_of(fn))  # named by the user's step, not its runner
        spec = StepSpec(name, kind, deps, fn, job_name, wait_for,
                        None if wait_timeout is None else float(wait_timeout), on_timeout, on_batch_failure,
                        job.max_attempts, job.priority)
        self.steps[name] = spec
        return spec

    def _runner(self, step: str) -> Callable[..., Any]:
        async def run(ctx: Any, run_id: int) -> Any:
            return await self._engine.run_step(self, step, ctx, run_id)

        run.__name__ = run.__qualname__ = f"{self.name}.{step}"
        return run

    @overload
    def step(self, after: StepFn, /) -> StepFn: ...
    @overload
    def step(self, after: Iterable[str] | str | None = None, **options: Any) -> Callable[[StepFn], StepFn]: ...

    def step(self, after: Any = None, **options: Any) -> Any:
        """A step: `fn(ctx)` (sync or async) returns its output (JSON). Options: `after=` (steps
        that must have succeeded or been skipped first), `wait_for=` a signal name (the step
        starts once it came; `ctx.signal` holds its data), `wait_timeout=` seconds and
        `on_timeout=` ("fail", "cancel" the run, or "skip" the step), and the job options
        `max_attempts=`, `timeout=`, `priority=`, `never_retry=`, `backoff=`, `name=`.
        `@flow.step` without parentheses is `@flow.step()`, as `@jobs.job` takes it."""
        if _bare(self, after):
            self._add(after, "step", None, dict(options))
            return after

        def decorate(fn: Callable[..., Any]) -> Callable[..., Any]:
            self._add(fn, "step", after, dict(options))
            return fn

        return decorate

    @overload
    def fan_out(self, after: StepFn, /) -> StepFn: ...
    @overload
    def fan_out(self, after: Iterable[str] | str | None = None, **options: Any) -> Callable[[StepFn], StepFn]: ...

    def fan_out(self, after: Any = None, **options: Any) -> Any:
        """A fan-out step: `fn(ctx, batch)` adds jobs with `batch.enqueue(job, *args)`; the step
        waits (parked, no slot held) until they all finished; its output is their counts.
        `on_batch_failure=`: "pause" (the default: an operator resumes, which runs the failed
        ones again, or skips and resumes), "cancel" the run, or "skip" (count the step as skipped, go on).
        `@flow.fan_out` without parentheses is `@flow.fan_out()`."""
        if _bare(self, after):
            self._add(after, "fan_out", None, dict(options))
            return after

        def decorate(fn: Callable[..., Any]) -> Callable[..., Any]:
            self._add(fn, "fan_out", after, dict(options))
            return fn

        return decorate

    def start(self, input: Any = None, *, conn: Any = None, key: str | None = None) -> WorkflowHandle:
        """Start a run with `input` (JSON; `ctx.input` in every step): its first steps are
        enqueued in this transaction (the caller's with `conn=`). Returns a WorkflowHandle.
        `key=`: while a run of this workflow started with the key is unfinished, a start with it
        writes nothing and returns that run's handle (a retry after a lost reply starts no second run)."""
        if due("workflow.start()"):  # one warning for every workflow's start(), naming the first
            say("workflow.start()", f"{self.name}.astart()", 2, f"{self.name}.start()")  # 2: the caller
        return self._engine.start(self, input, conn, key)

    @awaited(lambda flow: f"{flow.name}.astart()")
    async def astart(self, input: Any = None, *, conn: Any = None, key: str | None = None) -> WorkflowHandle:
        return await self._engine.astart(self, input, conn, key)
