"""loops.run(): asyncio.run() whose end is bounded, whatever the tasks left on its loop do."""

from __future__ import annotations

import asyncio
import logging
import threading
import time

import pytest

from livepush import loops
from tests.support.waiting import wait_for


async def _deaf() -> None:
    """Swallows every cancellation, as job code retrying on BaseException does."""
    while True:
        try:
            await asyncio.sleep(3600)
        except GeneratorExit:  # closed when collected, at the interpreter's exit: asyncio may be gone
            raise
        except asyncio.CancelledError:
            pass


async def _deaf_spawning() -> None:
    """Swallows every cancellation and starts a new task on each turn of its loop."""
    while True:
        try:
            await asyncio.create_task(asyncio.sleep(0))
        except GeneratorExit:  # as in _deaf
            raise
        except asyncio.CancelledError:
            pass


@pytest.fixture(autouse=True)
def short_settle(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(loops, "SETTLE_SECONDS", 0.2)


@pytest.mark.parametrize("deaf", [_deaf, _deaf_spawning])
def test_a_task_that_swallows_its_cancellation_is_left_behind_after_the_settle(
        deaf: object, caplog: pytest.LogCaptureFixture) -> None:
    """run() returns the coroutine's value about SETTLE_SECONDS after it returned, though a task
    it left swallows every cancellation (and, in one case, starts another task on every turn):
    asyncio.run() waited for such a task for ever. A warning names what was left behind."""

    async def main() -> str:
        asyncio.create_task(deaf(), name="deaf-task")  # type: ignore[operator]
        await asyncio.sleep(0)
        return "value"

    started = time.monotonic()
    with caplog.at_level(logging.WARNING, logger="livepush"):
        assert loops.run(main()) == "value"
    assert time.monotonic() - started < 0.2 + 5.0
    assert any("deaf-task" in r.getMessage() and "leaving them behind" in r.getMessage() for r in caplog.records)


def test_tasks_that_end_when_cancelled_are_waited_for_and_no_warning_is_logged(
        caplog: pytest.LogCaptureFixture) -> None:
    """Tasks left on the loop that end once cancelled (their cleanup awaited) end before run()
    returns, and nothing is logged."""
    cleaned: list[str] = []

    async def polite() -> None:
        try:
            await asyncio.sleep(3600)
        finally:
            await asyncio.sleep(0.01)
            cleaned.append("done")

    async def main() -> None:
        asyncio.create_task(polite())
        await asyncio.sleep(0)

    with caplog.at_level(logging.WARNING, logger="livepush"):
        loops.run(main())
    assert cleaned == ["done"]
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


def test_a_call_still_running_in_the_default_executor_is_left_behind_after_the_settle(
        caplog: pytest.LogCaptureFixture) -> None:
    """run() returns about SETTLE_SECONDS after its coroutine, though a task it left waits on a
    call that runs on in the loop's default executor (an async job's `asyncio.to_thread()` of a
    blocking library): closing the loop waited for that thread, for as long as the call ran, with
    the command line's stop signals held back. The call is named as left behind."""
    release = threading.Event()

    async def main() -> str:
        asyncio.create_task(asyncio.to_thread(release.wait, 60), name="blocking-call")
        await asyncio.sleep(0.05)
        return "value"

    started = time.monotonic()
    try:
        with caplog.at_level(logging.WARNING, logger="livepush"):
            assert loops.run(main()) == "value"
        assert time.monotonic() - started < 0.2 + 5.0
        assert loops.threads_left_running() == 1
        assert any("left running" in r.getMessage() for r in caplog.records), caplog.text
    finally:
        release.set()
    wait_for(lambda: loops.threads_left_running() == 0, 5, message="the released call's thread to end")
