"""The JSON check (docs/reference.md#4-python-api): job arguments are plain JSON, checked at
enqueue; so are job results and durable checkpoints' results, checked when they are returned.

Plain JSON: str, int, finite float, bool, None, lists (tuples too, stored as lists) and
str-keyed dicts. Anything else raises InvalidArgumentsError naming the path, so the
mistake shows at the enqueue call and not later in a runtime's log. So does a count of
arguments the job's function cannot take (arity, refuse_arity).
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import decimal
import enum
import inspect
import json
import math
import numbers
import pathlib
import re
import sys
from collections.abc import Callable, Iterable, Iterator, Mapping, Set as AbstractSet
from typing import Any

import psycopg

from ...types import shown
from ...errors import DependencyError
from ...postgres.text import unstorable
from ..errors import InvalidArgumentsError, MessageTooLarge

_MAX_DEPTH = 100


def _describe(value: Any) -> str:
    kind = type(value)
    name = kind.__name__
    article = "an" if name[:1].lower() in "aeiou" else "a"
    return f"{article} {name}"


def _check(value: Any, path: str, depth: int, error: type[Exception] = InvalidArgumentsError,
           what: str = "job arguments", stored: bool = True) -> None:
    if depth > _MAX_DEPTH:
        raise error(f"{path} is nested more than {_MAX_DEPTH} levels deep: flatten the {what}")
    if isinstance(value, str):
        bad = _unwritable(value, stored)
        if bad:
            raise error(f"{path} contains {bad}, which Postgres cannot store: "
                        "drop it, or pass binary data encoded (e.g. base64)")
        return
    if value is None or isinstance(value, bool):
        return
    if isinstance(value, int):
        # Python writes and reads ints as text up to a number of digits (4,300 by default), in
        # every runtime too: a longer one could be stored by no one and read by no one. Measured
        # here only, not on the check's fast path, where it would cost every int.
        limit = sys.get_int_max_str_digits()
        if limit and value.bit_length() > 3 * limit:
            try:
                str(value)
            except ValueError:
                raise error(f"{path} is an int of more than {limit} digits, more than JSON text carries "
                            f"here or in a runtime: pass it as a string") from None
        return
    if isinstance(value, float):
        if not math.isfinite(value):
            raise error(f"{path} is {value!r}, not a finite number: JSON has no NaN or infinity")
        return
    if isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            _check(item, f"{path}[{i}]", depth + 1, error, what, stored)
        return
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str):
                raise error(
                    f"{path} has the key {key!r}, {_describe(key)}: {what} are plain JSON, whose keys are strings"
                )
            bad = _unwritable(key, stored)
            if bad:
                raise error(f"{path} has a key with {bad}, which Postgres cannot store")
            _check(item, f"{path}[{json.dumps(key, ensure_ascii=False)}]", depth + 1, error, what, stored)
        return
    raise error(
        f"{path} is {_describe(value)}: {what} are plain JSON (str, int, float, bool, None, "
        f"list, dict with str keys); use {_instead(value)} instead"
    )


def _instead(value: Any) -> str:
    """What plain JSON stands in for `value`: advice for a datetime ("an ISO string") misleads
    the author of a set or a dataclass."""
    if isinstance(value, (datetime.date, datetime.time)):  # a datetime is a date
        return "an ISO string (value.isoformat())"
    if isinstance(value, AbstractSet):
        try:
            sorted(value)
        except TypeError:  # items of kinds that do not compare ({"acme", 7}): sorted() would raise
            return "a list (list(value))"
        return "a list (sorted(value))"
    if isinstance(value, (bytes, bytearray, memoryview)):
        return "text (base64) or a reference to where the bytes are kept"
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return "a dict (dataclasses.asdict(value))"
    if isinstance(value, decimal.Decimal):
        return "a str (str(value)) or an int of the smallest unit"
    # An id or a quantity already: "an id" told a UUID's author to use what they had, and a
    # timedelta has no fields to pick. uuid is loaded if a UUID was made: not imported for this.
    uuid = sys.modules.get("uuid")
    if isinstance(value, pathlib.PurePath) or (uuid is not None and isinstance(value, uuid.UUID)):
        return "a str (str(value))"
    if isinstance(value, datetime.timedelta):
        return "a number of seconds (value.total_seconds())"
    if isinstance(value, enum.Enum):
        return "its value (value.value)"
    if isinstance(value, numbers.Integral):  # numpy's int64 (its float64 is a float, and passes)
        return "an int (int(value))"
    if isinstance(value, numbers.Real):
        return "a float (float(value))"
    if isinstance(value, Mapping):
        return "a dict (dict(value))"
    if hasattr(value, "tolist"):  # a numpy array, whose list() would hold numpy scalars
        return "a list (value.tolist())"
    if isinstance(value, Iterable):  # a generator, a deque, a range
        return "a list (list(value))"
    return "an id, or a dict of the fields that matter"


def _is_plain(value: Any, depth: int) -> bool:
    """True if `value` is plain JSON of the exact built-in types; False sends it to _check,
    which accepts subclasses too or names what is wrong. This pass builds no paths, which
    was most of the check's cost (it runs twice a job for a JobRequest: at request() and
    at enqueue)."""
    if depth > _MAX_DEPTH:
        return False
    kind = type(value)
    if kind is str:
        return unstorable(value) is None
    if kind is int or kind is bool or value is None:
        return True
    if kind is float:
        return math.isfinite(value)
    if kind is list or kind is tuple:
        for item in value:
            if not _is_plain(item, depth + 1):
                return False
        return True
    if kind is dict:
        for key, item in value.items():
            if type(key) is not str or unstorable(key) is not None or not _is_plain(item, depth + 1):
                return False
        return True
    return False


def _unwritable(text: str, stored: bool) -> str | None:
    """What in `text` cannot be written: for Postgres (`stored`), or else as UTF-8 JSON text, which
    takes a NUL character (escaped) but no lone surrogate."""
    return unstorable(text if stored else text.replace("\x00", ""))


def check_json(value: Any, path: str, error: type[Exception], what: str, *, stored: bool = True) -> None:
    """Raise `error` naming the first path (from `path`) where `value` is not plain JSON, or holds
    text Postgres cannot store when it is to be `stored`."""
    if not _is_plain(value, 0):
        _check(value, path, 0, error, what, stored)


def check_args(args: object) -> tuple[Any, ...] | list[Any]:
    """Raise InvalidArgumentsError unless `args` is plain JSON; return them, as a list unless
    they are one already or a tuple (no copy: enqueue_many allocates as little per job as it
    can, since the collector's passes over what it allocates cost as much as the rest)."""
    if type(args) is tuple or type(args) is list:
        items = args
    else:
        # A str, bytes or dict is iterable too: spread, `(job, "acme")` would run the job with the
        # arguments "a", "c", "m", "e" (a dict with its keys). A set would be spread in the order
        # hashing gives it, which for str changes from process to process: arguments swapped.
        # Other iterables are read once.
        if isinstance(args, (str, bytes, bytearray, Mapping, AbstractSet)) or not isinstance(args, Iterable):
            unordered = "; a set has no order: pass a list" if isinstance(args, AbstractSet) else ""
            raise InvalidArgumentsError(f"the job's arguments are a list or tuple of them (wrap a single one: "
                                        f"[value]{unordered}), got {shown(args, typed=True, width=60)}")
        items = list(args)
    if not _is_plain(items, 0):
        _check(list(items), "args", 0)
    return items


# One encoder for every call: json.dumps() with options builds a new one each time, which
# was half the cost of encoding a job's arguments.
_ENCODER = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def dumps(value: Any) -> str:
    """Compact JSON text for the database (arguments already checked) and for views."""
    text = _ENCODER.encode(value)
    # Python writes a float from 1e16 up with an exponent ("1e+16"), which jsonb stores as the
    # integer it equals, so it would come back an int. Only such text pays for the second pass.
    return _with_fractions(value) if "e+" in text else text


# A float written with an exponent stands in the second pass as a string holding NUL, which no
# stored string holds (Postgres refuses it), so its encoded form is found only where it stands.
_MARK = "\x00float"
_MARKED = re.compile(r'"\\u0000float(\d+)"')


def _with_fractions(value: Any) -> str:
    written: list[str] = []

    def mark(item: Any) -> Any:
        if isinstance(item, float):
            text = float.__repr__(item)
            if "e+" not in text:
                return item
            # Every float this large is integral, and its int is exact: written with a fraction,
            # jsonb keeps it a non-integer numeric, which reads back as the same float.
            written.append(f"{int(item)}.0")
            return f"{_MARK}{len(written) - 1}"
        if isinstance(item, (list, tuple)):
            return [mark(x) for x in item]
        if isinstance(item, dict):
            return {key: mark(x) for key, x in item.items()}
        return item

    marked = _ENCODER.encode(mark(value))
    return _MARKED.sub(lambda m: written[int(m.group(1))], marked) if written else marked


def encode(value: Any, path: str, error: type[Exception], what: str) -> str:
    """check_json(), then dumps(), naming the path of what the encoder still refuses (an int too
    long for JSON text: the check's fast path does not measure ints)."""
    check_json(value, path, error, what)
    try:
        return dumps(value)
    except ValueError:
        _check(value, path, 0, error, what)
        raise


# Postgres closes the connection, rather than refuse the statement, on a message from a client
# past 1 GiB (PQ_LARGE_MESSAGE_LIMIT, 0x3fffffff bytes): to psycopg an OperationalError, said as an
# outage after seconds of sending, and met again by every retry. A statement's parameters travel
# in one message, so JSON text past it, all of a statement's together, is refused before anything
# is sent. SENDABLE leaves 1 MiB of the message for the rest (other parameters, their lengths).
MESSAGE_LIMIT = 0x3FFFFFFF
SENDABLE = MESSAGE_LIMIT - 2**20
PAST_ONE_MESSAGE = "past the 1 GiB one message to Postgres carries"
_CHUNK = 2**24  # characters encoded at a time to measure a text in bytes: no second copy of it


def _utf8_length(text: str) -> int:
    if text.isascii():
        return len(text)
    # surrogatepass: a lone surrogate is refused elsewhere, and takes three bytes meanwhile.
    return sum(len(text[at:at + _CHUNK].encode("utf-8", "surrogatepass")) for at in range(0, len(text), _CHUNK))


def check_sendable(params: Mapping[str, Any], limit: int | None = None) -> None:
    """Raise MessageTooLarge when a statement's str parameters (its JSON text: each str, and
    each str in a list), together, are longer in UTF-8 than `limit` bytes (SENDABLE): Postgres
    would close the connection on them. A text is measured in bytes only when its length in
    characters does not settle it (at most 4 bytes a character)."""
    limit = SENDABLE if limit is None else limit
    texts = [value for value in params.values() if isinstance(value, str)]
    texts += [item for value in params.values() if isinstance(value, list) for item in value if isinstance(item, str)]
    chars = sum(len(text) for text in texts)
    if chars * 4 <= limit:
        return
    if chars > limit or sum(_utf8_length(text) for text in texts) > limit:
        raise MessageTooLarge(f"a statement's JSON text is {PAST_ONE_MESSAGE}: keep large data elsewhere "
                              "(a table, a file) and pass a reference to it")


@contextlib.contextmanager
def stored_whole(what: str, *, plural: bool = False, advice: str = "",
                 sent: Mapping[str, Any] | None = None) -> Iterator[None]:
    """Around a call that stores `what` (JSON text from encode()): a value larger than one jsonb
    value holds (256 MiB), or than one message to Postgres carries (check_sendable: of `sent`, the
    parameters of the call's statement, first, and on every other path that sends such text),
    raises InvalidArgumentsError naming it, `advice` appended (a batch's: fewer jobs at a time).
    Postgres' refusal reached the caller as a DependencyError, which says the database failed and
    invites a retry that meets the same refusal."""
    try:
        if sent is not None:
            check_sendable(sent)
        yield
    except MessageTooLarge as exc:
        raise InvalidArgumentsError(_too_large(what, plural, PAST_ONE_MESSAGE, advice)) from exc
    except DependencyError as exc:
        cause = exc.__cause__
        if not isinstance(cause, psycopg.errors.ProgramLimitExceeded):
            raise
        said = cause.diag.message_primary or str(cause).splitlines()[0]
        raise InvalidArgumentsError(_too_large(what, plural, said, advice)) from exc


def _too_large(what: str, plural: bool, said: str, advice: str) -> str:
    return (f"{what} {'are' if plural else 'is'} too large for Postgres to store ({said}): "
            f"keep large data elsewhere (a table, a file) and pass a reference to it{advice}")


# Postgres refuses a jsonb value whose contents pass 2**28 - 1 bytes (a container's offsets have
# 28 bits). jsonb takes at most 6 bytes per character of the compact JSON text dumps() writes:
# measured, the most is a list of one-digit numbers, 2 characters an element ("0,") for a 4-byte
# entry and an 8-byte numeric; a string's character is at most 4 bytes (UTF-8), an empty list or
# object 8 bytes for 3 characters. Text of up to an eighth of the limit in characters (with room
# for what was not measured) is therefore never refused for its size.
MAY_BE_TOO_LARGE = 2**28 // 8


def may_be_too_large(params: Mapping[str, Any]) -> bool:
    """Whether a statement's parameters hold JSON text long enough (MAY_BE_TOO_LARGE, all of its
    text together) that Postgres may refuse it as larger than a jsonb value holds."""
    return sum(len(value) for value in params.values() if isinstance(value, str)) > MAY_BE_TOO_LARGE


def name_refused(arguments: Iterable[Any]) -> None:
    """After the encoder refused a batch: raise InvalidArgumentsError naming the first job's
    argument it refuses (an int too long for JSON text), as check_args() names what it refuses."""
    for args in arguments:
        _check(list(args), "args", 0)


def arity(func: Callable[..., Any]) -> tuple[int, int]:
    """How many arguments a job function takes after ctx (it is called `func(ctx, *args)`): the
    fewest and the most (sys.maxsize with *args; -1 when it cannot even take ctx). (0, sys.maxsize)
    when Python cannot read its signature (some builtins): the runtime finds out. The signature of
    what the runtime calls, not of what it wraps: a decorator (functools.wraps) may supply some of
    the wrapped function's arguments itself."""
    try:
        params = inspect.signature(func, follow_wrapped=False).parameters.values()
    except (TypeError, ValueError):
        return 0, sys.maxsize
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    required = sum(1 for p in positional if p.default is p.empty)
    most = sys.maxsize if any(p.kind is p.VAR_POSITIONAL for p in params) else len(positional) - 1
    return max(required - 1, 0), most


def required_keywords(func: Callable[..., Any]) -> list[str]:
    """The keyword-only parameters of a job function that have no default: the runtime calls it
    with ctx and the arguments by position, so with any of these it can never run."""
    try:
        params = inspect.signature(func, follow_wrapped=False).parameters.values()
    except (TypeError, ValueError):
        return []
    return [p.name for p in params if p.kind is p.KEYWORD_ONLY and p.default is p.empty]


def refuse_keywords(func: Callable[..., Any] | None, name: str, call: str, given: Mapping[str, Any],
                    options: Iterable[str]) -> None:
    """Raise InvalidArgumentsError for keywords `call` does not take (`given`, not empty): a job's
    arguments are stored as one JSON array and its function is called with them by position, so
    one given by keyword (enqueue(tenant="acme")) is named with its place after ctx; any other
    keyword is no option of `call`, whose `options` are named. Python's own "unexpected keyword
    argument" named neither. `func` None (a job function that shows none): only the options are named."""
    word = next(iter(given))
    found, params = None, []
    # What the runtime calls first; then, for a wrapper that passes its *args on, what it wraps.
    for follow in (False, True):
        if func is None:
            break
        try:
            params = list(inspect.signature(func, follow_wrapped=follow).parameters.values())[1:]
        except (TypeError, ValueError):
            continue
        found = next((p for p in params if p.name == word), None)
        if found is not None or not any(p.kind is p.VAR_POSITIONAL for p in params):
            break
    if found is not None and found.kind in (found.POSITIONAL_ONLY, found.POSITIONAL_OR_KEYWORD):
        raise InvalidArgumentsError(f"{name} takes its arguments by position: pass {word} as argument "
                                    f"{params.index(found) + 1} after ctx ({call}() stores them as one JSON array "
                                    "and the function is called with them in that order)")
    if found is not None and found.kind is found.KEYWORD_ONLY:
        raise InvalidArgumentsError(f"{name} cannot be given {word}: it is keyword-only, and a job's function is "
                                    "called with its arguments by position (make it a positional parameter)")
    raise InvalidArgumentsError(f"{call}() has no option {word}=: its options are "
                                f"{', '.join(o + '=' for o in options)} (and the job's arguments, by position)"
                                + _ELSEWHERE.get(word, ""))


# Options other job libraries take per call, and where livepush takes them: named when given.
_ELSEWHERE = {
    "queue": "; to put a job on another queue than its function's: jobs.enqueue_many([job.request(..., queue=...)])",
    "priority": "; a job's priority is its function's, @jobs.job(priority=)",
    "debounce": "; debounce= is for single enqueues, job.enqueue(..., key=, debounce=): a group's member is never "
                "debounced",
}
# Enqueue options, refused only by request(), which carries none: the call that enqueues it takes
# them (a group's, or a batch item's options dict). Celery's signature (task.s()) carried them, so
# they were looked for there. A durable child or a fan-out member takes none at all.
_ELSEWHERE.update({option: f"; a request carries no enqueue options: the call that enqueues it takes them "
                           f"(g.enqueue(request, {option}=...)), and a jobs.enqueue_many() item that needs one is "
                           f"a (job, [args], {{'{option}': ...}}) tuple"
                   for option in ("key", "tags", "wait", "at")})


def refuse_arity(name: str, takes: tuple[int, int], given: int) -> None:
    """Raise InvalidArgumentsError: the job function `name`, taking `takes` arguments (arity()),
    cannot be called with `given`."""
    fewest, most = takes
    if most < 0:
        raise InvalidArgumentsError(f"{name} cannot be run: its function takes no ctx (a job function's first "
                                    "parameter is ctx, then the job's arguments)")
    bound = "" if fewest == most else "at most " if given > most else "at least "
    count = most if fewest == most or given > most else fewest
    raise InvalidArgumentsError(f"{name} takes {bound}{count} argument{'' if count == 1 else 's'} after ctx, "
                                f"got {given}: enqueue it with the arguments its function takes after ctx")
