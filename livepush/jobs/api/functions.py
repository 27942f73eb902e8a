"""Job functions: the `@jobs.job` decorator and what it returns, `JobFunction`.
"""

from __future__ import annotations

import inspect
import random
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any, Concatenate, Generic, overload

from . import enqueue as _enqueue
from .awaited import awaited, iscoroutinefunction
from .args import arity, check_args, refuse_arity, refuse_keywords, required_keywords
from .handles import JobHandle
from .limits import Limits, check_claim_entry, limits_of
from .options import check_name, check_queue
from .registry import REGISTRY, JobRequest
from .schema import compile_schema
from ...blocking import due, say
from ...errors import ArgumentTypeError, ArgumentValueError, ConfigError
from ...types import Seconds, as_seconds, shown
from ...usercode import cannot_take

MAX_BACKOFF = 3600.0

# A job function's parameters after ctx (P) and what it returns (R), so that a type checker reads
# `some_job.enqueue(...)` and `some_job.request(...)` against the function. The defaults (PEP 696,
# spelled through typing_extensions, which type checkers bundle) keep a bare `JobFunction` in a
# user's annotation valid under `mypy --strict`; Python 3.11's own ParamSpec takes no default.
if TYPE_CHECKING:
    from typing_extensions import ParamSpec, TypeVar

    P = ParamSpec("P", default=...)
    R = TypeVar("R", covariant=True, default=Any)
else:
    from typing import ParamSpec, TypeVar

    P = ParamSpec("P")
    R = TypeVar("R", covariant=True)
# The decorators' own: mypy does not match a nested decorator against a return type spelled with
# the class's variables (covariant, with defaults).
FP = ParamSpec("FP")
FR = TypeVar("FR")

# The keywords JobFunction.enqueue/aenqueue and request take, named when another is given.
ENQUEUE_OPTIONS = ("wait", "at", "conn", "key", "debounce", "tags")
REQUEST_OPTIONS = ("queue",)


def default_backoff(attempt: int) -> float:
    """Seconds before retry number `attempt` (1 after the first failure): about 2^attempt,
    jittered by ±25 % so a burst of failures does not come back as a burst, capped at an hour."""
    # Called from a user's own backoff= too: a str met `min()` with a bare TypeError.
    if isinstance(attempt, bool) or not isinstance(attempt, int):
        raise ArgumentTypeError(f"default_backoff() takes the attempt number, an int from 1 up, "
                                f"got {shown(attempt, typed=True, width=40)}")
    if attempt < 1:
        raise ArgumentValueError(f"default_backoff() takes the attempt number, 1 after the first failure, got {shown(attempt)}")
    # The exponent is capped (2^12 s is past the cap already): 2.0 ** 1024 overflows, and raised
    # in the executor's failure path it left the job `running` for good.
    base = min(2.0 ** min(attempt, 12), MAX_BACKOFF)
    return min(base * random.uniform(0.75, 1.25), MAX_BACKOFF)


INT4_MAX = 2**31 - 1  # the largest value of Postgres' integer (priority and max_attempts are stored as one)


def _check_int4(option: str, value: Any, least: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ArgumentTypeError(f"@jobs.job({option}=) takes an int, got {shown(value, typed=True, width=60)}")
    if not least <= value <= INT4_MAX:
        raise ArgumentValueError(f"@jobs.job({option}=) must be from {least} to {INT4_MAX}, got {shown(value)}")


def _check_backoff(backoff: Callable[..., Any]) -> None:
    """A TypeError unless `backoff(attempt)` can give seconds: it is called only when an attempt
    fails, so an `async def` one (its coroutine is no number) or one that cannot take the attempt
    number would log its error on every retry and fall back to the default delay. So would one
    that gives a generator (a `yield` in it), or an object whose __call__ is `async def`."""
    if is_async_callable(backoff) or is_generator_callable(backoff):
        raise ArgumentTypeError(f"@jobs.job(backoff=) is called with the attempt number and must return seconds "
                                f"at once: {shown(backoff, width=60)} is `async def` or yields; make it a plain function "
                                f"that returns them")
    why = cannot_take(backoff, 1)
    if why is not None:
        raise ArgumentTypeError(f"@jobs.job(backoff=) is called with one argument, the attempt number (1 after "
                                f"the first failure), but {shown(backoff, width=60)} cannot take it ({why}); "
                                f"e.g. lambda n: 10 * n")


def _check_never_retry(never_retry: Any) -> tuple[type[BaseException], ...]:
    # Read only when an attempt fails, by isinstance(): anything but exception classes made that
    # raise, and the failure was never written.
    if isinstance(never_retry, (str, bytes, type)) or not isinstance(never_retry, Iterable):
        raise ArgumentTypeError(f"@jobs.job(never_retry=) takes a tuple of exception classes, got {shown(never_retry, width=60)}")
    classes = tuple(never_retry)
    for c in classes:
        if not (isinstance(c, type) and issubclass(c, BaseException)):
            raise ArgumentTypeError(f"@jobs.job(never_retry=) takes exception classes, got {shown(c, width=60)} among them")
    return classes


# Celery's calls on a task, and livepush's own for each (docs/jobs.md "Enqueueing").
_CELERY_CALLS = {
    "delay": "enqueue(*args)",
    "apply_async": "enqueue(*args, wait=, at=) (countdown= is wait=, eta= is at=)",
    "s": "request(*args) (a task group's callback, a durable job's child)",
    "si": "request(*args) (a task group's callback, a durable job's child)",
    "signature": "request(*args) (a task group's callback, a durable job's child)",
}


def is_async_callable(func: Any) -> bool:
    """Whether calling `func` gives a coroutine to await: an async function, or an object whose
    __call__ is `async def` (taken for a sync function, it ran in a thread and returned its
    coroutine unrun)."""
    return iscoroutinefunction(func) or (
        not inspect.isroutine(func) and not isinstance(func, type)
        and iscoroutinefunction(getattr(func, "__call__", None)))


def is_generator_callable(func: Any) -> bool:
    """Whether calling `func` gives a generator (sync or async), an object's __call__ included:
    no job or step returns its result that way."""
    called = func if inspect.isroutine(func) or isinstance(func, type) else getattr(func, "__call__", func)
    return inspect.isgeneratorfunction(called) or inspect.isasyncgenfunction(called)


def _first_parameter(func: Callable[..., Any]) -> str | None:
    """The name of the first parameter of what the runtime calls (a bound method's or a callable
    object's without its `self`), or None when Python cannot read its signature."""
    try:
        params = inspect.signature(func, follow_wrapped=False).parameters
    except (TypeError, ValueError):
        return None
    return next(iter(params), None)


def class_refused(func: Any, subject: str, result: str) -> str | None:
    """Why a class cannot be a job or a step (`subject` names which, `result` what it returns), or
    None for anything else: calling a class builds an instance, no result, so every run of it
    failed on a result that is not JSON, found in a runtime's log rather than at import."""
    if not isinstance(func, type):
        return None
    return (f"{subject} the class {func.__module__}.{func.__qualname__}: calling it builds an instance, not "
            f"{result} (JSON); decorate a function instead, e.g. one that builds a {func.__name__} and runs "
            "it, returning its result")


def _default_name(func: Callable[..., Any]) -> str:
    """A job's name when the decorator is given none: its function's module and qualname."""
    qualname = getattr(func, "__qualname__", None)
    if not isinstance(qualname, str):
        # A functools.partial or a callable object: its type's names would be every such job's.
        raise ConfigError(f"@jobs.job(name=) is needed for {shown(func, width=80)}: it has no __qualname__ to name the job by "
                          "(a functools.partial or a callable object); give the job a name, e.g. "
                          "@jobs.job(name=\"myapp.send_welcome\")")
    if "<locals>" in qualname:
        # Defined inside a function: a runtime that imports the module defines no job of that
        # name, and gives each of its jobs back for ever, with no failure to say so.
        raise ConfigError(f"@jobs.job(name=) is needed for {qualname}: it is defined inside a function, so a "
                          "runtime that imports its module never defines it by that name; move it to the top "
                          "level of its module, or give it a name, e.g. @jobs.job(name=\"myapp.send_welcome\"), "
                          "and have the job module's import define it")
    return f"{func.__module__}.{qualname}"


class JobFunction(Generic[P, R]):
    """What `@jobs.job` returns: still callable as the plain function, plus enqueue.

    Its public names are what docs/reference.md describes (the function, the decorator's
    options, request/enqueue/aenqueue); the underscored ones are the runtime's bookkeeping.
    `JobFunction[P, R]`: P the function's parameters after ctx, R what it returns."""

    # The workflow whose step this job runs (workflows/definition.py), else None: its jobs take
    # the steps' claim (workflows/queries.py: CLAIM_STEPS).
    _step_of: str | None = None
    # For a job whose result wraps what its function's own code returned (a workflow step's), what
    # the runtime raises for a result the JSON check refused, naming that code's value; None
    # keeps the check's own error. Called only once the check refused: the hot path encodes once.
    _refused_result: Callable[[Any], Exception | None] | None = None

    def __init__(
        self,
        func: Callable[Concatenate[Any, P], R],
        *,
        name: str | None = None,
        queue: str = "default",
        priority: int = 0,
        max_attempts: int = 5,
        timeout: Seconds | None = 60,
        never_retry: Iterable[type[BaseException]] = (),
        backoff: Callable[[int], Seconds] = default_backoff,
        concurrency: tuple[str, int] | None = None,
        rate: str | None = None,
        schema: Mapping[str, Any] | bool | None = None,
    ) -> None:
        refused = class_refused(func, "@jobs.job on", "a job's result")
        if refused is not None:
            raise ConfigError(refused)
        # Both are integer columns: a float, a bool or a str (or a number past int4) failed every
        # enqueue in Postgres, reported as a database that cannot be reached.
        _check_int4("priority", priority, -INT4_MAX - 1)
        _check_int4("max_attempts", max_attempts, 1)
        timeout = as_seconds(timeout)
        # Not a bool (True would be a 1 s timeout) nor a str (whose comparison raised a bare TypeError).
        if timeout is not None and (isinstance(timeout, bool) or not isinstance(timeout, (int, float))
                                    or not timeout > 0):  # NaN too
            raise ArgumentValueError(f"timeout must be a positive number of seconds, a timedelta, or None, got {shown(timeout)}")
        self.func = func
        # `is None`, not falsy: a name="" (a setting left empty) is a mistake to name, not a job
        # silently named after its function.
        self.name = check_name(_default_name(func) if name is None else name, "@jobs.job(name=)")
        self.queue = queue
        self.priority = priority
        self.max_attempts = max_attempts
        self.timeout = timeout
        self.never_retry = _check_never_retry(never_retry)
        if not callable(backoff):
            # Called only when an attempt fails: every retry would log its error and fall back
            # to the default, the mistake found in a runtime's log rather than at import.
            raise ArgumentTypeError(f"@jobs.job(backoff=) takes a function of the attempt number (1 after the first "
                                    f"failure) returning seconds, e.g. lambda n: 10 * n; got {shown(backoff, width=60)}")
        _check_backoff(backoff)
        self.backoff = backoff
        # Claim limits (docs/jobs.md "Limits and paused queues"): runtimes store them at start.
        self._limits: Limits = limits_of(func, concurrency, rate, self.name)
        if self._limits.any:
            check_claim_entry(self.name, queue, "@jobs.job")
        self.schema = schema
        # Checks the arguments (a JSON array) against `schema` at enqueue; None without one.
        self._validate_args = None if schema is None else compile_schema(schema, self.name)
        # How many arguments it takes after ctx, checked at enqueue: a call it cannot take would
        # fail every attempt in a runtime, found in its log rather than at the call.
        self._arity = arity(func)
        # Which no enqueue can pass: every attempt of every job would fail with a TypeError in a
        # runtime, found in its log after the retries rather than at import.
        keywords = required_keywords(func)
        if keywords:
            raise ConfigError(f"@jobs.job: {self.name} has keyword-only parameters without a default "
                              f"({', '.join(keywords)}), but a job's arguments are passed by position after ctx: "
                              "make them positional, or give them a default")
        if self._arity[1] < 0:
            # Called func(ctx, *args), it fails every attempt; said here rather than at its enqueue.
            raise ConfigError(f"@jobs.job: {self.name} takes no parameter, but a job function is called with ctx "
                              "first, then the job's arguments: add ctx as its first parameter")
        if _first_parameter(func) == "self":
            # A method decorated in its class body: the runtime has no instance, so `self` would get
            # ctx, and ctx the job's first argument.
            raise ConfigError(f"@jobs.job: {self.name} takes `self` first: a job function is called with ctx first "
                              "and no instance; define it at the top level of a module (or as a @staticmethod "
                              "taking ctx first)")
        if is_generator_callable(func):
            # Its call gives a generator, no result: every attempt of every job failed on a result
            # that is not JSON, where the mistake (a `yield`) is plain at import.
            raise ConfigError(f"@jobs.job: {self.name} is a generator function: a job returns its result (JSON); "
                              "use return, not yield (ctx.progress() reports on the way)")
        self._is_async = is_async_callable(func)
        self.__name__ = getattr(func, "__name__", self.name)
        self.__qualname__ = getattr(func, "__qualname__", self.name)
        self.__doc__ = func.__doc__
        self.__module__ = func.__module__

    def __repr__(self) -> str:
        return f"<job {self.name} queue={self.queue!r}>"

    if not TYPE_CHECKING:
        # Hidden from type checkers, which would read every misspelt attribute of a job as this
        # method's Any: it only ever raises.
        def __getattr__(self, name: str) -> Any:
            # Only for names the object lacks: a team moving from Celery calls its task's methods.
            instead = _CELERY_CALLS.get(name)
            if instead is None:
                raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
            raise AttributeError(f"{self.name} is a livepush job, which has no .{name}(): use {self.name}.{instead}")

    if TYPE_CHECKING:
        # The function's own signature (ctx first: its name is the function's, not known here).
        def __call__(self, ctx: Any, /, *args: P.args, **kwargs: P.kwargs) -> R: ...
    else:
        def __call__(self, *args: Any, **kwargs: Any) -> Any:
            return self.func(*args, **kwargs)

    # The job's arguments and the call's options cannot share one signature: a ParamSpec takes no
    # keyword beside its own. So the first overload of each call checks the arguments against the
    # function, and the others, each needing one option by name, take any arguments: a call with
    # an option has its arguments checked at the call (at run time), not by the type checker.
    @overload
    def request(self, *args: P.args, **kwargs: P.kwargs) -> JobRequest: ...
    @overload
    def request(self, *args: Any, queue: str | None) -> JobRequest: ...

    # mypy reads a keyword of P.kwargs as one that could meet `queue`: the implementation is never
    # what a caller is checked against, so its refusal here says nothing to them.
    def request(self, *args: Any, queue: str | None = None, **unknown: Any) -> JobRequest:  # type: ignore[misc]
        """This job with these arguments, to enqueue later (a group callback, a durable job's
        child). `queue=` puts it on that queue instead of the function's own (a child's default
        is its parent's queue)."""
        if unknown:
            refuse_keywords(self.func, self.name, "request", unknown, REQUEST_OPTIONS)
        if queue is not None:
            check_queue(queue, "request(queue=)")
            if self._limits.any:
                check_claim_entry(self.name, queue, "request(queue=)")
        check_args(args)
        if self._validate_args is not None:
            self._validate_args(list(args))
        if not self._arity[0] <= len(args) <= self._arity[1]:
            refuse_arity(self.name, self._arity, len(args))
        return JobRequest(self.name, args, queue)

    @overload
    def enqueue(self, *args: P.args, **kwargs: P.kwargs) -> JobHandle: ...
    @overload
    def enqueue(self, *args: Any, wait: Seconds | None, at: datetime | None = None, conn: Any = None,
                key: str | None = None, debounce: Seconds | None = None,
                tags: Sequence[str] | None = None) -> JobHandle: ...
    @overload
    def enqueue(self, *args: Any, wait: Seconds | None = None, at: datetime | None, conn: Any = None,
                key: str | None = None, debounce: Seconds | None = None,
                tags: Sequence[str] | None = None) -> JobHandle: ...
    @overload
    def enqueue(self, *args: Any, wait: Seconds | None = None, at: datetime | None = None, conn: Any,
                key: str | None = None, debounce: Seconds | None = None,
                tags: Sequence[str] | None = None) -> JobHandle: ...
    @overload
    def enqueue(self, *args: Any, wait: Seconds | None = None, at: datetime | None = None, conn: Any = None,
                key: str | None, debounce: Seconds | None = None,
                tags: Sequence[str] | None = None) -> JobHandle: ...
    @overload
    def enqueue(self, *args: Any, wait: Seconds | None = None, at: datetime | None = None, conn: Any = None,
                key: str | None = None, debounce: Seconds | None,
                tags: Sequence[str] | None = None) -> JobHandle: ...
    @overload
    def enqueue(self, *args: Any, wait: Seconds | None = None, at: datetime | None = None, conn: Any = None,
                key: str | None = None, debounce: Seconds | None = None,
                tags: Sequence[str] | None) -> JobHandle: ...

    # ignore: as request()'s.
    def enqueue(self, *args: Any, wait: Seconds | None = None, at: datetime | None = None,  # type: ignore[misc]
                conn: Any = None, key: str | None = None, debounce: Seconds | None = None,
                tags: Sequence[str] | None = None, **unknown: Any) -> JobHandle:
        """Enqueue one run. `wait=` delays by seconds, `at=` runs at an aware datetime;
        `conn=` (a psycopg Connection) enqueues inside the caller's transaction; `key=`,
        `debounce=`, `tags=`: docs/jobs.md "Enqueue options". The job's arguments go by position
        (`unknown`, a keyword of neither kind, is refused naming it)."""
        if due("enqueue()"):  # one warning for every job's enqueue(), naming the first
            say("enqueue()", f"{self.name}.aenqueue()", 2, f"{self.name}.enqueue()")  # 2: the caller
        if unknown:
            refuse_keywords(self.func, self.name, "enqueue", unknown, ENQUEUE_OPTIONS)
        return _enqueue.enqueue(self, args, wait=wait, at=at, conn=conn, key=key, debounce=debounce, tags=tags)

    @overload
    async def aenqueue(self, *args: P.args, **kwargs: P.kwargs) -> JobHandle: ...
    @overload
    async def aenqueue(self, *args: Any, wait: Seconds | None, at: datetime | None = None, conn: Any = None,
                       key: str | None = None, debounce: Seconds | None = None,
                       tags: Sequence[str] | None = None) -> JobHandle: ...
    @overload
    async def aenqueue(self, *args: Any, wait: Seconds | None = None, at: datetime | None, conn: Any = None,
                       key: str | None = None, debounce: Seconds | None = None,
                       tags: Sequence[str] | None = None) -> JobHandle: ...
    @overload
    async def aenqueue(self, *args: Any, wait: Seconds | None = None, at: datetime | None = None, conn: Any,
                       key: str | None = None, debounce: Seconds | None = None,
                       tags: Sequence[str] | None = None) -> JobHandle: ...
    @overload
    async def aenqueue(self, *args: Any, wait: Seconds | None = None, at: datetime | None = None, conn: Any = None,
                       key: str | None, debounce: Seconds | None = None,
                       tags: Sequence[str] | None = None) -> JobHandle: ...
    @overload
    async def aenqueue(self, *args: Any, wait: Seconds | None = None, at: datetime | None = None, conn: Any = None,
                       key: str | None = None, debounce: Seconds | None,
                       tags: Sequence[str] | None = None) -> JobHandle: ...
    @overload
    async def aenqueue(self, *args: Any, wait: Seconds | None = None, at: datetime | None = None, conn: Any = None,
                       key: str | None = None, debounce: Seconds | None = None,
                       tags: Sequence[str] | None) -> JobHandle: ...

    # ignore: as request()'s.
    @awaited(lambda fn: f"{fn.name}.aenqueue()")  # type: ignore[misc]
    async def aenqueue(
        self, *args: Any, wait: Seconds | None = None, at: datetime | None = None, conn: Any = None,
        key: str | None = None, debounce: Seconds | None = None, tags: Sequence[str] | None = None,
        **unknown: Any,
    ) -> JobHandle:
        """enqueue() for async code; `conn=` takes a psycopg AsyncConnection."""
        if unknown:
            refuse_keywords(self.func, self.name, "aenqueue", unknown, ENQUEUE_OPTIONS)
        return await _enqueue.aenqueue(self, args, wait=wait, at=at, conn=conn, key=key, debounce=debounce,
                                       tags=tags)


# The options of @jobs.job (and of @jobs.periodic, which takes them too).
OPTIONS = frozenset({"name", "queue", "priority", "max_attempts", "timeout", "never_retry", "backoff", "schema",
                     "concurrency", "rate"})


@overload
def job(func: Callable[Concatenate[Any, FP], FR], /) -> JobFunction[FP, FR]: ...
@overload
def job(
    *,
    name: str | None = ...,
    queue: str = ...,
    priority: int = ...,
    max_attempts: int = ...,
    timeout: Seconds | None = ...,
    never_retry: Iterable[type[BaseException]] = ...,
    backoff: Callable[[int], Seconds] = ...,
    concurrency: tuple[str, int] | None = ...,
    rate: str | None = ...,
    schema: Mapping[str, Any] | bool | None = ...,
) -> Callable[[Callable[Concatenate[Any, FP], FR]], JobFunction[FP, FR]]: ...


def job(func: Callable[..., Any] | None = None, /, **options: Any) -> Any:
    """Declare a job function: `@jobs.job` or `@jobs.job(queue=..., priority=..., ...)`.
    `concurrency=("tenant", 2)` runs at most 2 at once per value of that argument, `rate="100/s"`
    (or "N/m") starts at most that many a second, across every runtime.

    The function takes `ctx` first, then its arguments (plain JSON). Async functions run on
    the runtime's event loop; sync ones in its thread pool.
    """
    if func is not None:
        if not callable(func):
            # `@jobs.job("imports")` (a queue given positionally) failed with an AttributeError
            # about `__module__` from deep inside.
            raise ArgumentTypeError(f"@jobs.job takes its options as keywords, e.g. @jobs.job(queue={shown(func, width=60)}), and "
                                    f"decorates a function; got {shown(func, typed=True, width=60)}")
        _refuse_stacked(func)
        return REGISTRY.add(JobFunction(func))
    unknown = set(options) - OPTIONS
    if unknown:
        raise ArgumentTypeError(f"@jobs.job() got unknown options {sorted(unknown)}")
    queue = options.get("queue", "default")
    check_queue(queue, "@jobs.job(queue=)")

    def decorate(f: Callable[..., Any]) -> JobFunction[..., Any]:
        _refuse_stacked(f)
        declared: JobFunction[..., Any] = REGISTRY.add(JobFunction(f, **options))
        return declared

    return decorate


def _refuse_stacked(f: Callable[..., Any]) -> None:
    """`@jobs.job` (bare or with options) over @jobs.job or @jobs.periodic: registering it again
    would fail as a name clash between "two definitions", which sends the user looking for a
    second one, or register a second job of another name beside the first."""
    if isinstance(f, JobFunction):
        raise ConfigError(f"@jobs.job on {f.name}, which is already a job (@jobs.job or @jobs.periodic): use one "
                          "decorator; @jobs.periodic takes @jobs.job's options. To register its function under a "
                          "second name too (an old name kept after a rename), decorate the function itself: "
                          "jobs.job(name=\"old.name\")(fn.func)")

