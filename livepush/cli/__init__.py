"""The `livepush` command: its entry (`main`), parsing and exit statuses (`commands`), and the
wiring of parts."""

from __future__ import annotations

from collections.abc import Sequence

from .. import stopsignals


def main(argv: Sequence[str] | None = None) -> int:
    """The command line (livepush.cli.commands.main), the stop signals held back before its
    modules import: that import is a good part of every command's start, and a Ctrl-C or SIGTERM
    in it came before the command had set what they do (a traceback, or death by the signal)."""
    stopsignals.hold_start()
    try:
        from .commands import main as command_line
    except BaseException:
        stopsignals.release_start()  # a caller in-process keeps its signals
        raise
    return command_line(argv)


__all__ = ["main"]
