"""The JSON argument check (SPEC §4): job arguments are plain JSON, checked at enqueue.

Plain JSON: str, int, finite float, bool, None, lists (tuples too, stored as lists) and
str-keyed dicts. Anything else raises InvalidArgumentsError naming the path, so the
mistake shows at the enqueue call and not later in a runtime's log.
"""

from __future__ import annotations

import json
import math
from typing import Any

from ..db import unstorable
from .errors import InvalidArgumentsError

_MAX_DEPTH = 100


def _describe(value: Any) -> str:
    kind = type(value)
    name = kind.__name__
    article = "an" if name[:1].lower() in "aeiou" else "a"
    return f"{article} {name}"


def _check(value: Any, path: str, depth: int) -> None:
    if depth > _MAX_DEPTH:
        raise InvalidArgumentsError(f"{path} is nested more than {_MAX_DEPTH} levels deep: flatten the job's arguments")
    if isinstance(value, str):
        bad = unstorable(value)
        if bad:
            raise InvalidArgumentsError(f"{path} contains {bad}, which Postgres cannot store: "
                                        "drop it, or pass binary data encoded (e.g. base64)")
        return
    if value is None or isinstance(value, bool):
        return
    if isinstance(value, int):
        return
    if isinstance(value, float):
        if not math.isfinite(value):
            raise InvalidArgumentsError(f"{path} is {value!r}, not a finite number: JSON has no NaN or infinity")
        return
    if isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            _check(item, f"{path}[{i}]", depth + 1)
        return
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str):
                raise InvalidArgumentsError(
                    f"{path} has the key {key!r}, {_describe(key)}: job arguments are plain JSON, whose keys are strings"
                )
            bad = unstorable(key)
            if bad:
                raise InvalidArgumentsError(f"{path} has a key with {bad}, which Postgres cannot store")
            _check(item, f"{path}[{json.dumps(key, ensure_ascii=False)}]", depth + 1)
        return
    raise InvalidArgumentsError(
        f"{path} is {_describe(value)}: job arguments are plain JSON (str, int, float, bool, None, "
        "list, dict with str keys); pass an id or an ISO string instead"
    )


def check_args(args: tuple[Any, ...] | list[Any]) -> list[Any]:
    """Raise InvalidArgumentsError unless `args` is plain JSON; return them as a list."""
    _check(list(args), "args", 0)
    return list(args)


# One encoder for every call: json.dumps() with options builds a new one each time, which
# was half the cost of encoding a job's arguments.
_ENCODER = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def dumps(value: Any) -> str:
    """JSON text for the database (arguments already checked)."""
    return _ENCODER.encode(value)
