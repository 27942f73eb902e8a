"""Batches of a bounded delete (the history's prune, the jobs' retention) that shrink to fit the
`statement_timeout` of the role, the database or the URL.

A prune deletes a bounded batch a statement. Under a `statement_timeout` shorter than one batch
takes, every statement was cancelled, every cycle, with a warning each time: nothing was ever
pruned and the tables grew. A cancelled statement halves the batch, down to a floor, and the
prune goes on at once; the first halving is said in one WARNING. The operator set that timeout
to protect the database, and a smaller batch keeps within it, where a `SET LOCAL
statement_timeout` of livepush's own would set it aside. A statement cancelled at the floor is
raised as before: the timeout is too short for any batch, and the caller says so each cycle.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import TypeVar

import psycopg

from ..tasks import reraise_if_cancelled

T = TypeVar("T")


class ShrinkingBatch:
    """The largest batch a statement of one kind may take here: none until one was cancelled,
    then half the size that was, never below `floor`. Kept for the process's life: a role's
    `statement_timeout` does not change between cycles, and finding it again each cycle would
    cost a cancelled statement each time."""

    def __init__(self, what: str, *, floor: int, log: logging.Logger) -> None:
        self.what = what  # what the batches delete, in the WARNING: "expired messages of the history"
        self.floor = floor
        self.cap: int | None = None
        self._log = log

    def size(self, full: int) -> int:
        """The batch to run now, `full` being the size the statement is written for."""
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
        said = self.cap is not None
        self.cap = max(size // 2, floor)
        if said:
            self._log.debug("a batch of %d %s was cancelled again: batches of %d now", size, self.what, self.cap)
            return
        self._log.warning(
            "a batch of %d %s was cancelled (a statement_timeout of the role, the database or the URL shorter than "
            "it takes, or a cancel from another session): pruning goes on in smaller batches, halved at each "
            "cancel down to %d, which keep within that timeout (said once)", size, self.what, floor)
