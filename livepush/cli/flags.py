"""The types of the command's numeric flags: each reads what the operator typed as the settings
read their variables (livepush.config.read_number), so `--port 1_000` or `--concurrency ١٠` exits 2
naming the flag instead of being read as another number. Ranges are checked where the value is
used (Settings, the job runtime), with the same message for the flag and its variable."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

from ..config import read_number


def _reader(kind: type[int] | type[float], wanted: str) -> Callable[[str], Any]:
    def read(text: str) -> Any:
        try:
            return kind(read_number(text, kind))
        except ValueError:
            raise argparse.ArgumentTypeError(f"takes {wanted}, got {text!r:.40}") from None

    return read


whole_number = _reader(int, "a whole number written with the digits 0-9")
seconds = _reader(float, "a number of seconds written with the digits 0-9 (e.g. 30 or 0.5)")


def positive_seconds(text: str) -> float:
    """A lifetime such as `token --ttl`: refused here, naming the flag, rather than by the API
    under its parameter's name."""
    value: float = seconds(text)
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"takes a positive number of seconds (e.g. 3600), got {text!r:.40}")
    return value
