"""Child processes of the benchmark suites whose output is read line by line, every wait bounded."""

from __future__ import annotations

import collections
import queue
import signal
import subprocess
import threading
import time
from collections.abc import Callable


class Child:
    """A subprocess whose output lines are read by a thread, so every wait on them is bounded."""

    def __init__(self, args: list[str], env: dict[str, str] | None = None, cwd: str | None = None) -> None:
        self.proc = subprocess.Popen(args, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     text=True, env=env, cwd=cwd)
        self.lines: queue.Queue[tuple[float, str]] = queue.Queue()
        self.tail: collections.deque[str] = collections.deque(maxlen=40)
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put((time.time(), line.rstrip("\n")))
        self.lines.put((time.time(), ""))  # end of output

    def wait_for(self, match: Callable[[str], bool], timeout: float, what: str) -> tuple[float, str]:
        """(time read, line) of the next line that matches."""
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            try:
                at, line = self.lines.get(timeout=max(left, 0.0))
            except queue.Empty:
                raise TimeoutError(f"{what}: nothing within {timeout:g} s; last output:\n" + "\n".join(self.tail)) from None
            if not line and self.proc.poll() is not None:
                raise RuntimeError(f"{what}: the process exited ({self.proc.returncode}); last output:\n"
                                   + "\n".join(self.tail))
            self.tail.append(line)
            if match(line):
                return at, line

    def send(self, line: str) -> None:
        """One line to the child's stdin."""
        assert self.proc.stdin is not None
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 15) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
