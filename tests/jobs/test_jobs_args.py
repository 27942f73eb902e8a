"""The JSON argument check (pure logic)."""

from __future__ import annotations

import collections
import datetime
import enum
import fractions
import math
import pathlib
import types
import uuid

import pytest

from livepush import LivepushError
from livepush.jobs import InvalidArgumentsError
from livepush.jobs.api.args import check_args, dumps


def test_plain_json_passes_as_given() -> None:
    """Plain JSON values pass the check as they are: a tuple or a list of arguments is not
    copied, anything else iterable becomes a list; all of them encode as one JSON array."""
    args = (1, "a", 1.5, True, None, [1, {"k": [2]}], (3, 4))
    assert check_args(args) is args
    listed = list(args)
    assert check_args(listed) is listed
    assert check_args(iter(args)) == listed
    assert dumps(check_args(args)) == '[1,"a",1.5,true,null,[1,{"k":[2]}],[3,4]]'


def test_error_names_the_path() -> None:
    """A datetime nested in a dict is reported with its path, as docs/reference.md §4 shows."""
    with pytest.raises(InvalidArgumentsError) as info:
        check_args((1, {"when": datetime.datetime.now()}))
    assert 'args[1]["when"] is a datetime' in str(info.value)
    assert isinstance(info.value, TypeError) and isinstance(info.value, LivepushError)


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        ((math.nan,), "args[0] is nan"),
        (([1, [2, {3}]],), "args[0][1][1] is a set"),
        (({1: "x"},), "args[0] has the key 1"),
        ((b"x",), "args[0] is a bytes"),
        (({"a": {"b": object()}},), 'args[0]["a"]["b"] is an object'),
        ((["ok", "a\x00b"],), "args[0][1] contains a NUL character"),
        (({"k\x00": 1},), "args[0] has a key with a NUL character"),
        (("caf\udce9",), "args[0] contains a lone surrogate"),
        (({"\ud800": 1},), "args[0] has a key with a lone surrogate"),
    ],
)
def test_refused_values(args: tuple, fragment: str) -> None:
    """NaN, sets, non-str keys, bytes, objects, NUL characters and lone surrogates
    (Postgres cannot store either) are refused with their path."""
    with pytest.raises(InvalidArgumentsError) as info:
        check_args(args)
    assert fragment in str(info.value)


class Plan(enum.Enum):
    FREE = "free"


@pytest.mark.parametrize(("value", "instead"), [
    (uuid.UUID(int=7), "use a str (str(value)) instead"),
    (datetime.timedelta(minutes=5), "use a number of seconds (value.total_seconds()) instead"),
    (Plan.FREE, "use its value (value.value) instead"),
    (pathlib.PurePosixPath("/srv/in.csv"), "use a str (str(value)) instead"),
    (fractions.Fraction(1, 3), "use a float (float(value)) instead"),
    (types.MappingProxyType({"a": 1}), "use a dict (dict(value)) instead"),
    (collections.deque([1, 2]), "use a list (list(value)) instead"),
    ((n for n in range(3)), "use a list (list(value)) instead"),
    ({3, 1}, "use a list (sorted(value)) instead"),
    # sorted() raises on items of kinds that do not compare: the advice must work when followed.
    ({"acme", 7}, "use a list (list(value)) instead"),
])
def test_a_value_json_cannot_hold_is_refused_with_advice_that_fits_it(value: object, instead: str) -> None:
    """The refusal says what stands in for the value it names: a UUID, an id already, was told to
    use "an id, or a dict of the fields that matter", and so were a timedelta, a number that is
    no int or float, a mapping that is no dict and a generator."""
    with pytest.raises(InvalidArgumentsError) as info:
        check_args((value,))
    assert str(info.value).endswith(instead), info.value


@pytest.mark.parametrize("args", [{"acme", 7}, frozenset({"acme", 7}), {"acme"}])
def test_a_set_of_arguments_is_refused_as_having_no_order(args: object) -> None:
    """An enqueue_many item's arguments `(job, {"acme", 7})` were spread in the set's order, which
    hashing picks and a str's changes from process to process: the job ran with its arguments
    swapped in some of them. A set (one of one element too, most often braces meant as a list)
    is refused, saying to pass a list; a set inside the arguments was refused already."""
    with pytest.raises(InvalidArgumentsError, match=r"^the job's arguments are a list or tuple of them .*"
                       r"a set has no order: pass a list\), got (set \{|frozenset\(\{)"):
        check_args(args)  # type: ignore[arg-type]


def test_json_past_one_message_to_postgres_is_refused_in_bytes_before_it_is_sent() -> None:
    """A statement's JSON text, all of its str parameters together, longer in UTF-8 bytes than one
    message to Postgres carries (a small limit here) raises MessageTooLarge, an
    InvalidArgumentsError: Postgres closes the connection on such a message. Characters past ASCII
    count as their bytes, and so do the str items of a list (a statement's array of JSON texts);
    other parameters do not count."""
    from livepush.jobs.api.args import check_sendable
    from livepush.jobs.errors import MessageTooLarge

    check_sendable({"args": "x" * 60, "more": "y" * 40, "n": 10**50, "none": None}, limit=100)
    check_sendable({"args": "é" * 50}, limit=100)  # 100 bytes
    for params in ({"args": "x" * 60, "more": "y" * 41}, {"args": "é" * 51}, {"args": "😀" * 26},
                   {"args": "x" * 101}, {"outputs": ["x" * 60, None, "y" * 41]}):
        with pytest.raises(MessageTooLarge, match="one message to Postgres"):
            check_sendable(params, limit=100)
    assert issubclass(MessageTooLarge, InvalidArgumentsError)
