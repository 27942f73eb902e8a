"""`jobs.input_fingerprint()`: what a checkpoint's `input=` is compared by on replay."""

from __future__ import annotations

import hashlib
import json
import math
from typing import Any

import rfc8785

from ..api.args import check_json
from ...errors import ArgumentValueError
from ...types import shown

# The default of ctx.checkpoint(input=): no input given (None is an input, and has a fingerprint).
NO_INPUT: Any = object()

# RFC 8785 writes every number as an IEEE double: past this magnitude two different integers can
# have one canonical form, so a changed input could keep its fingerprint.
MAX_SAFE_INTEGER = 2**53 - 1


def _check_numbers(value: Any, path: str) -> None:
    if isinstance(value, bool):
        return
    if isinstance(value, (int, float)):
        if isinstance(value, float) and not math.isfinite(value):
            return  # check_json names it
        if abs(value) > MAX_SAFE_INTEGER:
            raise ArgumentValueError(f"{path} is {shown(value)}, beyond ±(2**53-1): RFC 8785 writes numbers as IEEE "
                                     "doubles, so it cannot fingerprint it exactly; pass it as a string")
    elif isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            _check_numbers(item, f"{path}[{i}]")
    elif isinstance(value, dict):
        for key, item in value.items():
            _check_numbers(item, f"{path}[{json.dumps(key, ensure_ascii=False)}]")


def input_fingerprint(value: Any) -> str:
    """64 lowercase hex characters: SHA-256 of the RFC 8785 canonical JSON of `value`. Raises
    ValueError for a number whose magnitude is over 2**53-1, and for anything not plain JSON."""
    return fingerprint_of(value, "input")


def fingerprint_of(value: Any, path: str) -> str:
    """input_fingerprint(), its errors naming the value `path` (ctx.checkpoint: its checkpoint)."""
    # Only its fingerprint is stored: text Postgres could not store (a NUL) is an input all the same.
    check_json(value, path, ArgumentValueError, "checkpoint inputs", stored=False)
    _check_numbers(value, path)
    return hashlib.sha256(rfc8785.dumps(value)).hexdigest()
