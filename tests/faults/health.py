"""A watch on the servers' /healthz that keeps every change of answer, so a fault test can see a
503 come and go however briefly."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from tests.faults.fleet import Server
from tests.faults.load import stop_tasks
# The HTTP status probe the child-process helpers use (no client library, each call bounded).
from tests.support.procs import _async_http_status


@dataclass
class HealthWatch:
    """Polls GET /healthz of each server every POLL s and records each change of answer, per port:
    [(time.monotonic(), 200 | 503 | "error text")]. Start with `start()`, end with `stop()`."""

    servers: Sequence[Server]
    poll: float = 0.005
    changes: dict[int, list[tuple[float, int | str]]] = field(default_factory=dict)
    _tasks: list[asyncio.Task[None]] = field(default_factory=list)
    _stopping: bool = False

    def start(self) -> None:
        self._stopping = False
        for s in self.servers:
            self.changes[s.port] = []
            self._tasks.append(asyncio.create_task(self._watch(s.port), name=f"healthz-{s.port}"))

    async def _watch(self, port: int) -> None:
        answers = self.changes[port]
        while not self._stopping:
            status = await _async_http_status(port, "/healthz")
            if not answers or answers[-1][1] != status:
                answers.append((time.monotonic(), status))
            await asyncio.sleep(self.poll)

    async def stop(self) -> None:
        # The flag, not only the cancel: Python 3.11's wait_for() inside the probe can swallow
        # a cancellation that lands as the probe completes.
        self._stopping = True
        await stop_tasks(self._tasks)

    def mark(self) -> dict[int, int]:
        """Where each server's record is now: pass it to `dipped_and_back`."""
        return {port: len(answers) for port, answers in self.changes.items()}

    def dipped_and_back(self, mark: Mapping[int, int]) -> bool:
        """Whether every server answered 503 and then 200 again since `mark`."""
        for port, answers in self.changes.items():
            seen = [status for _, status in answers[mark.get(port, 0):]]
            if 503 not in seen or 200 not in seen[seen.index(503):]:
                return False
        return True

    def all_answer(self, status: int) -> bool:
        """Whether every server's latest answer is `status`."""
        return all(answers and answers[-1][1] == status for answers in self.changes.values())

    def answers_other_than(self, *allowed: int) -> list[tuple[int, float, int | str]]:
        """Every recorded answer that is not one of `allowed` (e.g. a refused connection)."""
        return [(port, t, status) for port, answers in self.changes.items() for t, status in answers
                if status not in allowed]

    def back_at(self, port: int) -> float | None:
        """When `port` last turned 200, or None if it is not 200 now."""
        answers = self.changes[port]
        return answers[-1][0] if answers and answers[-1][1] == 200 else None
