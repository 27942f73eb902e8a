"""Batches of a bounded delete (the history's prune, the jobs' retention) that shrink to fit the
`statement_timeout` of the role, the database or the URL.

A prune deletes a bounded batch a statement. Under a `statement_timeout` shorter than one batch
takes, every statement was cancelled, every cycle, with a warning each time: nothing was ever
pruned and the tables grew. A cancelled statement halves the batch, down to a floor, and the
prune goes on at once; the first halving is said in one WARNING. The operator set that timeout
to protect the database, and a smaller batch keeps within it, where a `SET LOCAL
statement_timeout` of livepush's own would set it aside. A statement cancelled at the floor is
raised as before: the timeout is too short for any batch, and the caller says so each cycle.
A cancel can also be one slow moment (a checkpoint, a lock, an operator's cancel): REGROW_AFTER
seconds after the last one, the batch doubles again, up to its full size, so such moments do not
slow pruning for the rest of the process's life; a timeout that still holds costs one cancelled
statement each time.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

import psycopg

from ..tasks import reraise_if_cancelled

T = TypeVar("T")

REGROW_AFTER = 600.0  # seconds since the last cancel before the batch doubles again


class ShrinkingBatch:
    """The largest batch a statement of one kind may take here: none until one was cancelled,
    then half the size that was, never below `floor`; doubled again each REGROW_AFTER seconds
    without a cancel, until it is the full size again. Not found again each cycle: a role's
    `statement_timeout` does not change between cycles, and each try costs a cancelled statement."""

    def __init__(self, what: str, *, floor: int, log: logging.Logger,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.what = what  # what the batches delete, in the WARNING: "expired messages of the history"
        self.floor = floor
        self.cap: int | None = None
        self._log = log
        self._clock = clock
        self._since = 0.0  # when the cap was last set (halved or doubled)
        self._said = False

    def size(self, full: int) -> int:
        """The batch to run now, `full` being the size the statement is written for."""
        if self.cap is not None and self._clock() - self._since >= REGROW_AFTER:
            self.cap = self.cap * 2 if self.cap * 2 < full else None
            self._since = self._clock()
        return full if self.cap is None else min(full, self.cap)

    async def run(self, full: int, statement: Callable[[int], Awaitable[T]]) -> tuple[T, int]:
        """`statement(size)`, run again with half the size while Postgres cancels it (a statement
        timeout, or a cancel from another session); its result and the size it ran with."""
        while True:
            size = self.size(full)
            try:
                return await statement(size), size
            except psycopg.errors.QueryCanceled:
                reraise_if_cancelled()  # our own task's cancel, which psycopg sends as a query cancel
                if size <= min(self.floor, full):
                    raise
                self._halve(size, min(self.floor, full))

    def _halve(self, size: int, floor: int) -> None:
        self.cap = max(size // 2, floor)
        self._since = self._clock()
        if self._said:
            self._log.debug("a batch of %d %s was cancelled again: batches of %d now", size, self.what, self.cap)
            return
        self._said = True
        self._log.warning(
            "a batch of %d %s was cancelled (a statement_timeout of the role, the database or the URL shorter than "
            "it takes, or a cancel from another session): pruning goes on in smaller batches, halved at each "
            "cancel down to %d, which keep within that timeout (said once)", size, self.what, floor)
