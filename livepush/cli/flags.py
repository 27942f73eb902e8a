"""The types of the command's numeric flags: each reads what the operator typed as the settings
read their variables (livepush.config.read_number), so `--port 1_000` or `--concurrency ١٠` exits 2
naming the flag instead of being read as another number. Ranges are checked where the value is
used (Settings, the job runtime), with the same message for the flag and its variable."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

from ..types import shown
from ..config import read_number


def _reader(kind: type[int] | type[float], wanted: str) -> Callable[[str], Any]:
    def read(text: str) -> Any:
        try:
            return kind(read_number(text, kind))
        except ValueError:
            raise argparse.ArgumentTypeError(f"takes {wanted}, got {shown(text, width=40)}") from None

    return read


whole_number = _reader(int, "a whole number written with the digits 0-9")
seconds = _reader(float, "a number of seconds written with the digits 0-9 (e.g. 30 or 0.5)")


def positive_seconds(text: str) -> float:
    """A lifetime such as `token --ttl`: refused here, naming the flag, rather than by the API
    under its parameter's name."""
    value: float = seconds(text)
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"takes a positive number of seconds (e.g. 3600), got {shown(text, width=40)}")
    return value


class Joined(argparse.Action):
    """A comma-separated list flag (`--queues`, `--with-jobs`) that may be given more than once:
    `--queues a --queues b` is `--queues a,b`. argparse would keep the last alone, and the rest
    would go unserved without a word."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:
        before = getattr(namespace, self.dest, None)
        setattr(namespace, self.dest, values if before is None else f"{before},{values}")


class Once(argparse.Action):
    """A flag only one value can answer (`--app`: a server has one App; `--runtime-role`: one role
    per migrate run): a second is refused, where argparse would keep it and silently drop the
    first. `instead` says what to do to have both, when there is a way."""

    def __init__(self, *args: Any, instead: str = "", **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.instead = instead

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:
        if getattr(namespace, self.dest, None) is not None:
            raise argparse.ArgumentError(self, f"given more than once ({shown(getattr(namespace, self.dest), width=80)}, then "
                                               f"{shown(values, width=80)}): give it once{self.instead}")
        setattr(namespace, self.dest, values)
