"""A mistake in the arguments of a public call raises a LivepushError at the call: typed, naming the
argument, and still the ValueError or TypeError it always was."""

from __future__ import annotations

import traceback
from collections.abc import Callable, Iterator
from typing import Any

import pytest

import livepush
from livepush import ArgumentTypeError, ArgumentValueError, LivepushError, jobs
from tests.support.settings import local_settings

SECRET = "k3Yq9-rT7pW2xZ8vN4bL6mC1dF5gH0jS"


@pytest.fixture(autouse=True)
def local_only() -> Iterator[None]:
    """The local fan-out and no database: every call below must refuse before it needs either."""
    with local_settings(SECRET):
        yield


@jobs.job(queue="errors-test")
def noop(ctx: Any, value: Any = None) -> None:
    pass


# (call, the builtin base it always had, a word the message must hold)
CASES: dict[str, tuple[Callable[[], Any], type[Exception], str]] = {
    "publish data": (lambda: livepush.publish("a", object()), TypeError, "plain JSON"),
    "publish conn": (lambda: livepush.publish("a", {}, conn=object()), ValueError, "conn="),
    "publish_many not pairs": (lambda: livepush.publish_many(5), TypeError, "publish_many()"),
    "publish_many item": (lambda: livepush.publish_many([("a",)]), TypeError, "item 0"),
    "sign_topic ttl": (lambda: livepush.sign_topic("a", ttl="1"), ValueError, "ttl"),
    "sessions.issue ttl": (lambda: livepush.sessions.issue("a", ttl=-1), ValueError, "ttl"),
    # An int past a float's range raised a bare OverflowError from math.isfinite().
    "sessions.issue huge ttl": (lambda: livepush.sessions.issue("a", ttl=10**400), ValueError, "ttl"),
    "sessions.issue subject": (lambda: livepush.sessions.issue(5), ValueError, "subject"),
    "enqueue wait type": (lambda: noop.enqueue(wait="1"), TypeError, "wait="),
    "enqueue wait value": (lambda: noop.enqueue(wait=-1), ValueError, "wait="),
    "enqueue at": (lambda: noop.enqueue(at="tomorrow"), TypeError, "at="),
    "enqueue debounce": (lambda: noop.enqueue(debounce=1), ValueError, "debounce="),
    "enqueue conn": (lambda: noop.enqueue(conn=5), TypeError, "conn="),
    "enqueue_many": (lambda: jobs.enqueue_many(5), TypeError, "enqueue_many()"),
    "enqueue_many options": (lambda: jobs.enqueue_many([(noop, [1], {"wait": "x"})]), TypeError, "wait="),
    "drain max_jobs": (lambda: jobs.drain(max_jobs="1"), TypeError, "max_jobs="),
    "drain queues": (lambda: jobs.drain(queues="imports"), TypeError, "queues="),
    "drain registry": (lambda: jobs.drain(registry=5), TypeError, "registry="),
    "configure": (lambda: jobs.configure(5), TypeError, "jobs.configure()"),
    "cancel": (lambda: jobs.cancel("1"), TypeError, "job_id"),
    "cancel_group": (lambda: jobs.cancel_group("x"), TypeError, "group_id"),
    "signal name": (lambda: jobs.signal(1, 5), ValueError, "name"),
    "list_tagged limit type": (lambda: jobs.list_tagged("a", limit="1"), TypeError, "limit="),
    "list_tagged limit": (lambda: jobs.list_tagged("a", limit=0), ValueError, "limit="),
    "status limit": (lambda: jobs.status(limit=0), ValueError, "limit"),
    "status limit type": (lambda: jobs.status(limit="5"), TypeError, "limit"),
    "input_fingerprint object": (lambda: jobs.input_fingerprint(object()), ValueError, "input"),
    "input_fingerprint too big": (lambda: jobs.input_fingerprint(2**60), ValueError, "2**53"),
    "default_backoff": (lambda: jobs.default_backoff("1"), TypeError, "attempt"),
    "job priority": (lambda: jobs.job(priority="1")(lambda ctx: None), TypeError, "priority="),
    "job max_attempts": (lambda: jobs.job(max_attempts=0)(lambda ctx: None), ValueError, "max_attempts="),
    "job unknown option": (lambda: jobs.job(foo=1)(lambda ctx: None), TypeError, "foo"),
    "create_group callback": (lambda: jobs.create_group(on_success=5), TypeError, "on_success="),
    "add_many_to_group": (lambda: jobs.add_many_to_group(1, 5), TypeError, "add_many_to_group()"),
    "group_members limit type": (lambda: jobs.group_members(1, limit="x"), TypeError, "limit"),
    "group_members limit": (lambda: jobs.group_members(1, limit=0), ValueError, "limit"),
    "workflows.list state": (lambda: jobs.workflows.list(state="nope"), ValueError, "state="),
    "workflows.pause id": (lambda: jobs.workflows.pause("x"), TypeError, "run_id"),
    "Allow pattern": (lambda: livepush.Allow(""), ValueError, "pattern"),
    "App rules": (lambda: livepush.App(rules=[5]), TypeError, "rules"),
    "App huge timeout": (lambda: livepush.App(authorize_timeout=10**400), ValueError, "authorize_timeout"),
}


@pytest.mark.parametrize("name", CASES)
def test_a_bad_argument_raises_a_typed_livepush_error_at_the_call(name: str) -> None:
    """Each refusal is a LivepushError (ArgumentValueError or ArgumentTypeError, or a subclass) that is
    also the ValueError or TypeError it was, names the argument, and comes from livepush's own
    check, not from Python deep inside (an "'int' object is not iterable")."""
    call, builtin, word = CASES[name]
    with pytest.raises(LivepushError) as raised:
        call()
    error = raised.value
    assert isinstance(error, builtin), type(error).__mro__
    assert isinstance(error, ArgumentValueError if builtin is ValueError else ArgumentTypeError), type(error)
    assert word in str(error), str(error)
    assert "is not iterable" not in str(error) and "not supported between" not in str(error), str(error)
    assert traceback.extract_tb(error.__traceback__)[-1].filename.endswith(".py")


def test_a_group_builder_used_outside_its_block_raises_a_typed_group_error() -> None:
    """Reading a jobs.group() builder's id, or adding a member, before its `with` block raises
    jobs.GroupBlockError (a GroupError, and the RuntimeError it always was) saying to do it inside."""
    g = jobs.group()
    with pytest.raises(jobs.GroupBlockError, match="inside `with jobs.group") as raised:
        g.enqueue(noop, 1)
    assert isinstance(raised.value, jobs.GroupError) and isinstance(raised.value, RuntimeError)
    with pytest.raises(jobs.GroupBlockError):
        g.handle  # noqa: B018 -- the read is what raises


def _raised_errors() -> list[BaseException]:
    """One of every livepush error whose constructor takes more than a message."""
    from livepush.errors import InvalidSession, InvalidTopic
    from livepush.jobs.errors import ChildFailed, Reattempt
    return [InvalidTopic("bad topic", "expired"), InvalidSession("bad session", "bad_signature"),
            ChildFailed("1 child failed", [(7, "app.resize", "failed", "ValueError: no")]), Reattempt(2.5)]


@pytest.mark.parametrize("error", _raised_errors(), ids=lambda e: type(e).__name__)
def test_an_error_crosses_a_process_boundary_with_its_fields(error: BaseException) -> None:
    """A job run in a process pool, or an error handed to a task framework that pickles it, comes
    back as the same error with the same fields, not a TypeError from its constructor."""
    import pickle
    again = pickle.loads(pickle.dumps(error))
    assert type(again) is type(error)
    assert str(again) == str(error)
    assert vars(again) == vars(error)
