"""A stop signal's handler leaves the loop without a moment in which a second signal kills:
the process whose stop was asked for ignores later ones; one that was not asked keeps the
default action (livepush/stopsignals.py)."""

from __future__ import annotations

import signal
import subprocess
import sys

import pytest

# Takes the loop's SIGTERM handler off while a SIGTERM is already on its way: the signal lands
# exactly in the gap that a plain remove-then-ignore leaves open.
_SCRIPT = """
import asyncio, os, signal, sys
from livepush import stopsignals

async def main():
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, lambda: None)
    with stopsignals.held_then_ignored(ignore=sys.argv[1] == "stopping"):
        loop.remove_signal_handler(signal.SIGTERM)
        os.kill(os.getpid(), signal.SIGTERM)
    os.kill(os.getpid(), signal.SIGTERM)
    print("alive", flush=True)

asyncio.run(main())
"""


def run(mode: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", _SCRIPT, mode], capture_output=True, text=True, timeout=30)


def test_a_process_whose_stop_was_asked_for_outlives_later_signals() -> None:
    done = run("stopping")
    assert (done.returncode, done.stdout.strip()) == (0, "alive"), done.stderr


def test_a_process_not_stopping_gets_the_default_action_back() -> None:
    done = run("serving")
    assert done.returncode == -signal.SIGTERM and "alive" not in done.stdout, done.stderr


def test_the_command_line_run_in_process_leaves_the_signal_mask_as_it_found_it() -> None:
    """`livepush` holds the stop signals back while it starts. Whichever way main() ends (here a
    usage error, before any command ran), it lets them through again: else the program that
    called it, and every process it starts, never hears SIGTERM or Ctrl-C again."""
    from livepush.cli.commands import main

    before = signal.pthread_sigmask(signal.SIG_BLOCK, [])
    with pytest.raises(SystemExit):
        main(["jobs", "m", "--bogus"])
    assert signal.pthread_sigmask(signal.SIG_BLOCK, []) == before
