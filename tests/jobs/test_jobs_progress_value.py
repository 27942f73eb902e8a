"""What ctx.progress() accepts (pure logic): finite numbers; a message Postgres can store."""

from __future__ import annotations

import math

import pytest

from livepush.jobs import InvalidProgressError
from livepush.jobs.runtime.context import MAX_MESSAGE, progress_value


def test_numbers_and_a_message_pass() -> None:
    """Ints and floats pass as given; total may be None; the message becomes a str."""
    assert progress_value(3, 10, "parsing") == {"done": 3, "total": 10, "message": "parsing"}
    assert progress_value(0.5, None, None) == {"done": 0.5, "total": None, "message": None}
    assert progress_value(1, 2, 42)["message"] == "42"


@pytest.mark.parametrize(("done", "total", "fragment"), [
    (math.nan, 1, "a finite number for done, got nan"),
    (1, math.inf, "a finite number for total, got inf"),
    (10 ** 400, 1, "a finite number for done"),
    ("3", 10, "a number for done, got str '3'"),
    (None, 10, "a number for done, got NoneType"),
    (True, 10, "a number for done, got bool"),
    (1, "10", "a number for total, got str"),
])
def test_anything_else_raises_naming_the_argument(done: object, total: object, fragment: str) -> None:
    """NaN, infinity, numbers too large for JSON's floats, strings, None and bools raise
    InvalidProgressError (a ValueError) naming done or total."""
    with pytest.raises(InvalidProgressError) as info:
        progress_value(done, total, None)
    assert fragment in str(info.value) and isinstance(info.value, ValueError)


def test_message_is_cut_and_cleaned_of_nul() -> None:
    """A long message keeps its first MAX_MESSAGE characters; a NUL or a lone surrogate
    becomes U+FFFD."""
    assert progress_value(1, 2, "x" * (MAX_MESSAGE + 5))["message"] == "x" * MAX_MESSAGE
    assert progress_value(1, 2, "a\x00b\udce9c")["message"] == "a\ufffdb\ufffdc"


def test_an_async_jobs_progress_from_a_thread_it_started_is_handed_to_the_loop() -> None:
    """An async job may report progress from a thread it started (`asyncio.to_thread`): the
    context's state and the completer's wake-up belong to the runtime's loop, so the value is
    recorded on the loop's thread, not in the caller's (asyncio's objects are not thread-safe)."""
    import asyncio
    import threading
    from datetime import datetime, timezone

    from livepush.jobs.runtime.context import ClaimedJob, JobContext

    class Sink:
        def __init__(self) -> None:
            self.threads: list[int] = []

        def progress(self, ctx: JobContext) -> None:
            self.threads.append(threading.get_ident())

    async def main() -> tuple[int, list[int], dict | None]:
        sink = Sink()
        job = ClaimedJob(id=1, name="j", queue="default", priority=0, attempt=1, max_attempts=1, lease=1, args=[],
                         run_at=datetime.now(timezone.utc))
        ctx = JobContext(job, sink)
        await asyncio.to_thread(ctx.progress, 4, 10, "from a thread")
        for _ in range(3):  # the hand-over's turn of the loop
            await asyncio.sleep(0)
        return threading.get_ident(), sink.threads, ctx._latest

    loop_thread, threads, latest = asyncio.run(main())
    assert threads == [loop_thread]
    assert latest == {"done": 4, "total": 10, "message": "from a thread", "attempt": 1}
