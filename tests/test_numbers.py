"""Every number a user passes to livepush is refused, when it is no value the call takes, with
livepush's typed error in one short line naming the parameter: never Python's bare ValueError
about writing an int of over 4,300 digits, never hundreds of digits echoed back.

A new call or option that takes a number belongs in CALLS: a refusal that echoes its value with
`!r` (or writes it whole) then fails here for the values that Python cannot, or should not, write."""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable, Iterator
from decimal import Decimal
from fractions import Fraction
from typing import Any

import pytest

import livepush
from livepush import ArgumentTypeError, ArgumentValueError, ConfigError, InvalidTopic, jobs
from livepush.jobs.api.registry import Registry
from livepush.jobs.durable.run import _seconds as durable_seconds
from livepush.jobs.groups.context import SyncGroupContext
from livepush.jobs.runtime.context import LEFT_OUT, _sleep_left_out, progress_value
from livepush.jobs.runtime.runtime import Runtime
from livepush.jobs.workflows.runner import Flow
from livepush.types import shown
from tests.support.settings import local_settings

SECRET = "k3Yq9-rT7pW2xZ8vN4bL6mC1dF5gH0jS"
MAX_MESSAGE = 300  # characters: a refusal is a line to read, not a dump of the value

# The values every call is given, by id: past a float's range, past what Python writes as text
# (4,300 digits), not finite, a bool, numbers of other kinds, and digits in a str.
VALUES: dict[str, Any] = {
    "10**400": 10**400,
    "10**5000": 10**5000,
    "-10**5000": -(10**5000),
    "nan": math.nan,
    "inf": math.inf,
    "True": True,
    "Decimal": Decimal("1e5000"),
    "Fraction": Fraction(10**5000, 3),
    "digits": "9" * 5000,
}
EVERY = frozenset(VALUES)
# Where a value is one the call takes, by its docs: an id past a bigint names no row (the call
# answers as for an unknown one, here after reaching for the database), and a timeout of 10**400
# seconds is as good as none.
IDS = frozenset({"10**400", "10**5000", "-10**5000"})
ENDLESS = frozenset({"10**400", "10**5000", "inf"})


@pytest.fixture(autouse=True)
def local_only() -> Iterator[None]:
    """The local fan-out and no database: every refusal below comes before either is needed."""
    with local_settings(SECRET):
        yield


@jobs.job(name="numbers.noop", queue="numbers-test")
def noop(ctx: Any, tenant: Any = None) -> None:
    pass


def _job(**options: Any) -> Any:
    def numbers_job(ctx: Any, tenant: Any = None) -> None:
        pass

    return jobs.job(name="numbers.options", queue="numbers-test", **options)(numbers_job)


def _step(**options: Any) -> Any:
    return jobs.workflow("numbers_steps").step(name="s", **options)(lambda ctx: None)


Refusing = type[Exception] | tuple[type[Exception], ...]
TYPED: Refusing = (ArgumentValueError, ArgumentTypeError)

# (the call given the value, the word its refusal names, the errors it documents, the values it takes)
CALLS: dict[str, tuple[Callable[[Any], Any], str, Refusing, frozenset[str]]] = {
    "@jobs.job(timeout=)": (lambda v: _job(timeout=v), "timeout", TYPED, ENDLESS),
    "@jobs.job(max_attempts=)": (lambda v: _job(max_attempts=v), "max_attempts=", TYPED, frozenset()),
    "@jobs.job(priority=)": (lambda v: _job(priority=v), "priority=", TYPED, frozenset()),
    "@jobs.job(concurrency=)": (lambda v: _job(concurrency=("tenant", v)), "concurrency=", ConfigError, frozenset()),
    "@jobs.job(rate=)": (lambda v: _job(rate=v), "rate=", ConfigError, frozenset()),
    "enqueue(wait=)": (lambda v: noop.enqueue(wait=v), "wait=", TYPED, frozenset()),
    "enqueue(debounce=)": (lambda v: noop.enqueue(key="k", debounce=v), "debounce=", TYPED, frozenset()),
    "enqueue(at=)": (lambda v: noop.enqueue(at=v), "at=", TYPED, frozenset()),
    "enqueue(key=)": (lambda v: noop.enqueue(key=v), "key=", TYPED, frozenset()),
    "enqueue(tags=)": (lambda v: noop.enqueue(tags=[v]), "tags[0]", TYPED, frozenset()),
    "enqueue_many wait": (lambda v: jobs.enqueue_many([(noop, [], {"wait": v})]), "wait=", TYPED, frozenset()),
    "drain(max_jobs=)": (lambda v: jobs.drain(max_jobs=v), "max_jobs=", TYPED, frozenset({"10**400", "10**5000"})),
    "list_tagged(limit=)": (lambda v: jobs.list_tagged("a", limit=v), "limit", TYPED, frozenset()),
    "list_tagged(before=)": (lambda v: jobs.list_tagged("a", before=v), "before", TYPED, IDS),
    "list_failed(limit=)": (lambda v: jobs.list_failed(limit=v), "limit", TYPED, frozenset()),
    "status(limit=)": (lambda v: jobs.status(limit=v), "limit", TYPED, frozenset()),
    "group_members(limit=)": (lambda v: jobs.group_members(1, limit=v), "limit", TYPED, frozenset()),
    "group_history(limit=)": (lambda v: jobs.group_history(1, limit=v), "limit", TYPED, frozenset()),
    "create_group(shards=)": (lambda v: jobs.create_group(shards=v), "shards=", TYPED, frozenset()),
    "workflows.list(limit=)": (lambda v: jobs.workflows.list(limit=v), "limit=", TYPED, frozenset()),
    "cancel(job_id)": (lambda v: jobs.cancel(v), "job_id", TYPED, IDS),
    "signal(job_id)": (lambda v: jobs.signal(v, "go"), "job", (*TYPED, jobs.JobNotFound), frozenset()),
    "seal_group(group_id)": (lambda v: jobs.seal_group(v), "group", (*TYPED, jobs.GroupNotFound), frozenset()),
    "workflows.pause(run_id)": (lambda v: jobs.workflows.pause(v), "run", (*TYPED, jobs.WorkflowNotFound),
                                frozenset()),
    "JobHandle(id).sign()": (lambda v: jobs.JobHandle(v).sign(), "job:", InvalidTopic, frozenset()),
    "JobHandle.sign(ttl=)": (lambda v: jobs.JobHandle(1).sign(ttl=v), "ttl", TYPED, frozenset({"10**400", "10**5000"})),
    "default_backoff(attempt)": (lambda v: jobs.default_backoff(v), "attempt", TYPED,
                                 frozenset({"10**400", "10**5000"})),
    "Runtime(concurrency=)": (lambda v: Runtime(Registry(), install_signals=False, concurrency=v), "concurrency",
                              ConfigError, frozenset()),
    "Runtime(heartbeat=)": (lambda v: Runtime(Registry(), install_signals=False, heartbeat=v), "heartbeat",
                            ConfigError, frozenset()),
    "Runtime(retention=)": (lambda v: Runtime(Registry(), install_signals=False, retention=v), "retention",
                            ConfigError, frozenset()),
    "wait_started(timeout=)": (lambda v: asyncio.run(Runtime(Registry(), install_signals=False).wait_started(timeout=v)),
                               "timeout=", TYPED, frozenset()),
    "ctx.flow.reattempt(wait=)": (lambda v: Flow().reattempt(wait=v), "wait=", TYPED, frozenset()),
    "ctx.group.enqueue(timeout=)": (lambda v: SyncGroupContext(None, None).enqueue(noop, timeout=v),  # type: ignore[arg-type]
                                    "timeout=", TYPED, frozenset()),
    "ctx.progress(done)": (lambda v: progress_value(v, None, None), "done", jobs.InvalidProgressError, frozenset()),
    "ctx.progress(total)": (lambda v: progress_value(1, v, None), "total", jobs.InvalidProgressError, frozenset()),
    # ctx.sleep() and ctx.wait_for_signal(timeout=) check their seconds here, before any database.
    "ctx.sleep(seconds)": (lambda v: durable_seconds(v, "ctx.sleep()"), "ctx.sleep()", TYPED, frozenset()),
    "step(timeout=)": (lambda v: _step(timeout=v), "timeout", ConfigError, ENDLESS),
    "step(wait_timeout=)": (lambda v: _step(wait_for="go", wait_timeout=v), "wait_timeout=", ConfigError, frozenset()),
    "step(max_attempts=)": (lambda v: _step(max_attempts=v), "max_attempts=", ConfigError, frozenset()),
    "input_fingerprint": (lambda v: jobs.input_fingerprint(v), "input", TYPED, frozenset({"True", "digits"})),
    "publish(data)": (lambda v: livepush.publish("a", {"n": v}), "publish() data", TYPED,
                      frozenset({"10**400", "True", "digits"})),
    "sign_topic(ttl=)": (lambda v: livepush.sign_topic("a", ttl=v), "ttl", TYPED, frozenset({"10**400", "10**5000"})),
    "sessions.issue(ttl=)": (lambda v: livepush.sessions.issue("a", ttl=v), "ttl", TYPED, frozenset()),
    "sessions.issue(now=)": (lambda v: livepush.sessions.issue("a", now=v), "now=", TYPED, frozenset()),
    "App(authorize_timeout=)": (lambda v: livepush.App(authorize_timeout=v), "authorize_timeout", TYPED, frozenset()),
    "App(reverify_interval=)": (lambda v: livepush.App(reverify_interval=v), "reverify_interval", TYPED, frozenset()),
    "App(max_subscriptions=)": (lambda v: livepush.App(max_subscriptions=v), "max_subscriptions", TYPED,
                                frozenset({"10**400", "10**5000"})),
    "Allow(pattern)": (lambda v: livepush.Allow(v), "pattern", TYPED, frozenset({"digits"})),
    "latest_offset(topic)": (lambda v: livepush.latest_offset(v), "topic", InvalidTopic, frozenset()),
}

REFUSALS = [(call, value) for call, (_, _, _, takes) in CALLS.items() for value in VALUES if value not in takes]


@pytest.mark.parametrize(("call", "value"), REFUSALS, ids=[f"{c} {v}" for c, v in REFUSALS])
def test_a_number_the_call_does_not_take_is_refused_in_one_short_typed_line(call: str, value: str) -> None:
    """The refusal is the call's documented livepush error, one line of fewer than 300 characters
    naming the parameter, whatever the value: not the ValueError Python raises when asked to
    write an int of over 4,300 digits, nor the digits of a shorter one."""
    make, word, refusing, _ = CALLS[call]
    with pytest.raises(Exception) as raised:
        make(VALUES[value])
    error = raised.value
    message = str(error)
    assert isinstance(error, refusing), f"{type(error).__name__}: {message[:200]}"
    assert len(message) < MAX_MESSAGE and "\n" not in message, message[:400]
    assert word in message, message
    assert "integer string conversion" not in message and "9" * 100 not in message, message[:400]
    # A long int is named by its size, which reads as a number only where the value is quoted,
    # never where its digits would stand ("wait= of an int of 1329 bits seconds").
    assert " bits seconds" not in message, message


@pytest.mark.parametrize(("value", "written"), [
    (10**400, "an int of 1329 bits"),
    (-(10**5000), "a negative int of 16610 bits"),
    (2**128 - 1, str(2**128 - 1)),
    (2**128, "an int of 129 bits"),
    ("9" * 100, "'" + "9" * 56 + "..."),
    (Fraction(10**5000, 3), "a Fraction too long to write"),
    (("tenant", 10**5000), "('tenant', an int of 16610 bits)"),
], ids=["10**400", "-10**5000", "2**128-1", "2**128", "digits", "Fraction", "tuple"])  # pytest cannot write a long int either
def test_a_value_is_shown_in_a_refusal_by_its_repr_or_its_size(value: object, written: str) -> None:
    """An int of up to 128 bits, and any other value, is shown as its repr cut to 60 characters;
    a longer int by its size; a value whose repr Python refuses to write by its type."""
    assert shown(value) == written
    assert shown("5", typed=True) == "str '5'"
    # A repr that names its type already is not given it twice.
    assert shown(Decimal("1E+9"), typed=True) == "Decimal('1E+9')"


@pytest.mark.parametrize("value", [10**400, -(10**5000), math.inf, math.nan], ids=["10**400", "-10**5000", "inf", "nan"])
def test_the_advice_of_a_sleep_left_incomplete_is_a_call_that_runs(value: object) -> None:
    """ctx.sleep() given a lone number (or seconds without a name) is shown a call to write: the
    seconds it was given only when they are a number Python can take as written, else 3600; never
    a long int's size, nor nan or inf, as the code to type."""
    for advice in (_sleep_left_out(value, LEFT_OUT), _sleep_left_out(LEFT_OUT, value)):
        assert "ctx.sleep('nap', 3600)" in advice, advice
    assert "ctx.sleep('nap', 90)" in _sleep_left_out(90, LEFT_OUT)
    assert "ctx.sleep('nap', 90)" in _sleep_left_out(LEFT_OUT, 90)
