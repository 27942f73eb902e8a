"""A job function's claim limits: `concurrency=(param, n)` and `rate="N/s" | "N/m"` (docs/jobs.md,
"Limits and paused queues")."""

from __future__ import annotations

import dataclasses
import inspect
import json
import re
from collections.abc import Callable, Sequence
from typing import Any

from ...types import shown
from ...errors import ConfigError
from ...postgres.text import unstorable
from ..errors import InvalidArgumentsError
from .args import name_refused
from .options import MAX_KEY_LENGTH

_RATE = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*/\s*(s|sec|second|m|min|minute)\s*$")
_MISSING = object()
# The claim counts a bucket's whole tokens as an integer (sql/0008_claim_limits.sql), so its burst
# (a tenth of the rate) must stay well inside one: a rate past about 2e10 a second failed every
# claim of the function with "integer out of range".
MAX_RATE = 1e9
# livepush_job_limits.max_running is an integer column, written by every runtime that starts: a
# larger count failed each start with "integer out of range".
MAX_RUNNING = 2**31 - 1
# A running job's name and concurrency key are one entry of livepush_jobs_key_running_idx, which
# Postgres caps at 2,704 bytes with its headers. 500 characters each fit in ASCII, but not in a
# script of 3 or 4 bytes a character: such a job was taken at enqueue and then failed every claim
# of its queue (the claim moves it into the index).
MAX_NAME_AND_KEY_BYTES = 2600
# So is a waiting limited job's queue and name, in livepush_jobs_limited_claim_idx: a name of 500
# characters and a queue of 200, in a script of 4 bytes a character, failed every enqueue.
MAX_NAME_AND_QUEUE_BYTES = 2600


def parse_rate(text: str) -> float:
    """Starts a second from "100/s" or "30/m"."""
    m = _RATE.match(text) if isinstance(text, str) else None
    if m is None or float(m.group(1)) <= 0:
        raise ConfigError(f"@jobs.job(rate={shown(text)}): write a positive number of starts per second or minute, "
                          "e.g. \"100/s\" or \"30/m\"")
    per = 1.0 if m.group(2).startswith("s") else 60.0
    rate = float(m.group(1)) / per
    if rate > MAX_RATE:  # infinity too
        raise ConfigError(f"@jobs.job(rate={shown(text)}): at most {MAX_RATE:,.0f} starts a second; a rate that high "
                          "limits nothing: leave rate= out")
    return rate


def burst_of(rate: float) -> float:
    """The bucket's capacity: a tenth of a second's starts, at least two. Small, so that the rate
    holds over short spans too; large enough that a runtime waking late (every 10 ms at most, or
    a busy loop's late wake-up) loses no token."""
    return max(2.0, rate / 10.0)


def _one_number_kind(value: Any) -> Any:
    """`value` with each whole float as the int it equals (-0.0 as 0): keys are compared as JSON,
    which has one kind of number, and 7.0 (an id from a float column) wrote the key "7.0", whose
    slots were not those of "7". Large ones too: Python writes 2.0**53 as "9007199254740992.0" and
    1e20 as "1e+20", while the ints they equal are written in full (a finite float has at most 309
    digits). bool is no float: true stays apart from 1."""
    if isinstance(value, float):
        return int(value) if value.is_integer() else value
    if isinstance(value, (list, tuple)):
        return [_one_number_kind(v) for v in value]
    if isinstance(value, dict):
        return {k: _one_number_kind(v) for k, v in value.items()}
    return value


@dataclasses.dataclass(frozen=True)
class Limits:
    """What livepush_job_limits stores for one job name, and where its concurrency key comes from."""

    max_running: int | None = None
    rate: float | None = None
    key_param: str | None = None
    key_index: int | None = None  # the parameter's position among the job's arguments (after ctx)
    key_default: Any = _MISSING

    @property
    def burst(self) -> float | None:
        return None if self.rate is None else burst_of(self.rate)

    @property
    def any(self) -> bool:
        return self.max_running is not None or self.rate is not None

    def key_of(self, args: Sequence[Any], name: str = "") -> str | None:
        """The concurrency key of a job of `name` with these arguments: the named argument as JSON
        text."""
        if self.key_index is None:
            return None
        if self.key_index < len(args):
            value = args[self.key_index]
        elif self.key_default is not _MISSING:
            value = self.key_default
        else:
            raise InvalidArgumentsError(f"the concurrency key {self.key_param!r} is missing from the arguments "
                                        f"{shown(list(args), width=80)}: pass it, by position, to every enqueue of {name}")
        try:
            text = key_text(value)
        except ValueError:
            # An int longer than Python writes as text: refused naming the argument, as the
            # arguments' own encoding names it, not with json's bare ValueError.
            name_refused([args])
            raise
        too_large = key_too_large(text, name)
        if too_large is not None:
            raise InvalidArgumentsError(f"the concurrency key {self.key_param!r} {too_large}: pass a shorter value "
                                        "(e.g. an id rather than the whole record), or give the job a shorter name=")
        return text


def key_text(value: Any) -> str:
    """A concurrency key as stored: its value as JSON text, one kind of number. ValueError for a
    NaN or an infinity (no JSON), or an int longer than Python writes as text."""
    return json.dumps(_one_number_kind(value), sort_keys=True, separators=(",", ":"), ensure_ascii=False,
                      allow_nan=False)


def key_too_large(text: str, name: str) -> str | None:
    """Why a key's JSON `text` cannot be stored for a job of `name` (it is an index entry, as key=
    is, and one with the name while the job runs), said after the key's own name; None when it can."""
    if len(text) > MAX_KEY_LENGTH:
        return f"is {len(text)} characters as JSON, more than {MAX_KEY_LENGTH}"
    size = len(text.encode()) + len(name.encode())
    if size > MAX_NAME_AND_KEY_BYTES:
        return (f"is {size} bytes of UTF-8 together with the job's name, more than {MAX_NAME_AND_KEY_BYTES} "
                "(an index entry holds them)")
    return None


def check_claim_entry(name: str, queue: str, where: str) -> None:
    """Refuse a job name and queue that, for a function with limits, are too large together for
    an entry of the limited claim's index."""
    size = len(name.encode()) + len(queue.encode())
    if size > MAX_NAME_AND_QUEUE_BYTES:
        raise ConfigError(f"{where}: a waiting job of a function with limits is an index entry with its name and "
                          f"queue, and its name and queue are {size} bytes of UTF-8 together, more than "
                          f"{MAX_NAME_AND_QUEUE_BYTES}: give it a shorter name= or queue")


def _key_params(func: Callable[..., Any], key_param: str) -> list[inspect.Parameter]:
    """The parameters after ctx that the concurrency key is looked up in: those of what the
    runtime calls, as the count of arguments is (args.arity), not of a function it wraps, whose
    wrapper may supply some of its arguments itself and shift the others. A wrapper that names
    no such parameter but takes *args passes its arguments on: the wrapped function's are read."""
    try:
        own = list(inspect.signature(func, follow_wrapped=False).parameters.values())
    except (TypeError, ValueError):
        own = []
    if any(p.name == key_param for p in own[1:]) or not any(p.kind is p.VAR_POSITIONAL for p in own):
        return own[1:]
    return list(inspect.signature(func).parameters.values())[1:]


def limits_of(func: Callable[..., Any], concurrency: Any, rate: Any, name: str) -> Limits:
    """Check `concurrency=` and `rate=` of @jobs.job against the function's signature, for a job
    function named `name`."""
    max_running = key_param = key_index = None
    key_default: Any = _MISSING
    if concurrency is not None:
        if (not isinstance(concurrency, tuple) or len(concurrency) != 2 or not isinstance(concurrency[0], str)
                or isinstance(concurrency[1], bool) or not isinstance(concurrency[1], int)
                or not 1 <= concurrency[1] <= MAX_RUNNING):
            raise ConfigError(f"@jobs.job(concurrency={shown(concurrency)}): give (parameter name, at most N running), "
                              f"N from 1 to {MAX_RUNNING}, e.g. (\"tenant\", 2)")
        key_param, max_running = concurrency
        params = _key_params(func, key_param)
        found = [i for i, p in enumerate(params) if p.name == key_param]
        if not found or params[found[0]].kind not in (inspect.Parameter.POSITIONAL_ONLY,
                                                      inspect.Parameter.POSITIONAL_OR_KEYWORD):
            raise ConfigError(f"@jobs.job(concurrency=({key_param!r}, {max_running})): {func.__qualname__} has no "
                              f"positional parameter {key_param!r} after ctx")
        key_index = found[0]
        if params[key_index].default is not inspect.Parameter.empty:
            key_default = params[key_index].default
            # Every call that leaves the parameter out stores its default as JSON text: one JSON
            # cannot hold would fail each of them, with nothing naming the key. And NaN or an
            # infinity, which json writes as the text NaN or Infinity, was stored as a key that
            # is no JSON, while the same value passed as the argument is refused at enqueue.
            try:
                text = key_text(key_default)
            except (TypeError, ValueError) as exc:
                raise ConfigError(f"@jobs.job(concurrency=({key_param!r}, {max_running})): the default of "
                                  f"{key_param!r} is the concurrency key of calls that leave it out, stored as "
                                  f"JSON, which cannot hold {shown(key_default, width=60)} ({exc}): give a JSON default "
                                  "(a str, a finite number, None)") from None
            # A lone surrogate (undecodable bytes) is written as it is, and Postgres refuses the
            # text: each such call failed at enqueue with a bare UnicodeEncodeError.
            bad = unstorable(text)
            if bad is not None:
                raise ConfigError(f"@jobs.job(concurrency=({key_param!r}, {max_running})): the default of "
                                  f"{key_param!r} is the concurrency key of calls that leave it out, stored as "
                                  f"text, and it holds {bad}, which Postgres cannot store: give a default of "
                                  "valid text")
            # Measured as each such call's key is (Limits.key_of): too large, it refused every one.
            too_large = key_too_large(text, name)
            if too_large is not None:
                raise ConfigError(f"@jobs.job(concurrency=({key_param!r}, {max_running})): the default of "
                                  f"{key_param!r} is the concurrency key of calls that leave it out, and it "
                                  f"{too_large}: give a shorter default (e.g. an id), or the job a shorter name=")
    return Limits(max_running=max_running, rate=None if rate is None else parse_rate(rate),
                  key_param=key_param, key_index=key_index, key_default=key_default)
