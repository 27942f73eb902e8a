"""The frames a reading client got, that jobs run by jobs.drain() in another thread wait on to keep
pace with it (tests/server/test_slow_clients.py).

The reader is set here, not in the test module that defines those jobs: pytest imports a test
module under its file's name, a module that borrows its helpers imports it again as
`tests.server.<name>`, and the job registry then runs the functions of whichever copy came
last. Both copies read this one module.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from typing import Any


class Frames:
    """The frames a reading client got, that a job in another thread can wait on."""

    def __init__(self) -> None:
        self._got: list[dict[str, Any]] = []
        self._changed = threading.Condition()

    def got(self, frame: dict[str, Any]) -> None:
        with self._changed:
            self._got.append(frame)
            self._changed.notify_all()

    def count(self) -> int:
        with self._changed:
            return len(self._got)

    def wait_past(self, count: int, timeout: float) -> None:
        with self._changed:
            self._changed.wait_for(lambda: len(self._got) > count, timeout)

    def wait_for(self, shows: Callable[[dict[str, Any]], bool], timeout: float) -> None:
        """Until a frame got has data that `shows` holds for."""
        with self._changed:
            self._changed.wait_for(lambda: any(shows(f["data"]) for f in self._got), timeout)


# The reader that paced jobs wait for, while a test sets one (paced()); None: they run at their own pace.
READER: Frames | None = None


@contextlib.contextmanager
def paced() -> Iterator[Frames]:
    """A new reader for paced jobs to wait for, until the block ends."""
    global READER
    READER = Frames()
    try:
        yield READER
    finally:
        READER = None
