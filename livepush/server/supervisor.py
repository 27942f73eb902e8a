"""The parent of `serve --workers N` (docs/reference.md#3-commands): starts N worker processes,
restarts one that dies (with a backoff, and gives up on a restart storm), and stops them all on
one signal.

It knows nothing of what a worker serves: it gets a command per worker and hears, on a pipe the
worker inherits, when that worker serves. The first worker boots alone, so that a boot failure
(a bad setting, a database down) is said once, by one process, and ends the supervisor with that
worker's exit status; the others then boot together. A worker that exits before it ever served
ends the boot so, unless a stop signal ended it (an operator's SIGTERM to that worker); that one,
and one that exits after it served (even while others still boot), is restarted; only a signal
to the supervisor stops them.

Workers run in a process group of their own: a terminal's Ctrl-C reaches the supervisor alone,
which forwards it, so each worker hears one signal (a second one would cut its drain short).

A stop is bounded, as gunicorn's graceful timeout bounds one: a worker that outlives its stop's
bound (StopBound) by the margin is killed with SIGKILL, named in an error, and the supervisor
exits 1, rather than wait for ever on a user's hook that never returns.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import os
import signal
import subprocess
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from .. import stopsignals

log = logging.getLogger("livepush.workers")

# (worker index, fd of the pipe's write end the worker inherits) -> the worker's argv.
WorkerCommand = Callable[[int, int], list[str]]
READY_LINE = b"ready\n"
# How a worker ends when a stop signal reached it: a clean exit, or killed by the signal before
# its handlers were installed. Never a boot failure; a stop of the supervisor's that ends so is clean.
_STOPPED = (0, -signal.SIGTERM, -signal.SIGINT)


@dataclass(frozen=True)
class RestartPolicy:
    """When a dead worker comes back, and when the supervisor stops trying."""

    first_delay: float = 0.5  # doubled for each exit of the same worker within `window`
    max_delay: float = 10.0
    window: float = 60.0
    limit: int = 10  # more unexpected exits than this within `window`, all workers together: give up

    def delay(self, recent_exits: int) -> float:
        doubling: int = 2 ** max(recent_exits - 1, 0)  # typeshed: int ** int may be a float
        return min(self.max_delay, self.first_delay * doubling)


@dataclass(frozen=True)
class StopBound:
    """How long a worker's stop may take before the supervisor kills it: `seconds` from the first
    stop signal, `hurried` from a second one (which cuts the stop short), each plus `margin`.
    `why` and `hurried_why` say in the error what each bound is made of."""

    seconds: float = 5.0
    hurried: float = 5.0
    margin: float = 10.0
    why: str = "its stop's bound plus a margin"
    hurried_why: str = "its hurried stop's bound plus a margin"


@dataclass
class _Slot:
    """One worker's place: the process holding it now, and its recent unexpected exits."""

    index: int
    process: asyncio.subprocess.Process | None = None
    ready: asyncio.Event = field(default_factory=asyncio.Event)
    exits: collections.deque[float] = field(default_factory=collections.deque)
    last_status: int | None = None
    served: bool = False  # a process of this slot said it serves, once at least
    killed: bool = False  # outlived its stop's bound: the supervisor killed it


def describe_exit(status: int) -> str:
    if status < 0:
        try:
            return f"was killed by {signal.Signals(-status).name}"
        except ValueError:
            return f"was killed by signal {-status}"
    return f"exited with status {status}"


class Supervisor:
    """Runs `count` workers until SIGTERM or SIGINT; `run()` returns the exit status."""

    def __init__(
        self,
        count: int,
        command: WorkerCommand,
        *,
        env: Mapping[str, str] | None = None,
        policy: RestartPolicy | None = None,
        on_exit: Callable[[int], None] | None = None,
        stop_bound: StopBound | None = None,
    ) -> None:
        self.count = count
        self.command = command
        self.env = dict(env) if env is not None else None
        self.policy = policy or RestartPolicy(limit=max(10, 2 * count))
        self.on_exit = on_exit  # called with a worker's pid once it has exited, whatever the reason
        self.stop_bound = stop_bound or StopBound()
        self.slots = [_Slot(i) for i in range(1, count + 1)]
        self._done = asyncio.Event()  # a signal came, a worker failed to boot, or restarts gave up
        self._stopping = False
        self._signalled = False
        self._status: int | None = None  # set by a boot failure or by giving up
        self._booted = False
        self._exits: collections.deque[float] = collections.deque()
        self._keepers: list[asyncio.Task[None]] = []
        self._hearing: set[asyncio.Task[None]] = set()
        # When a stopping worker is killed (loop time), and the signal it counts from; a second
        # signal brings it closer, and wakes the wait in _stop_all through `_deadline_moved`.
        self._deadline: float | None = None
        self._deadline_from, self._deadline_why, self._deadline_since = "the stop signal", "", 0.0
        self._deadline_moved = asyncio.Event()

    @property
    def pids(self) -> list[int]:
        return [s.process.pid for s in self.slots if s.process is not None and s.process.returncode is None]

    async def run(self, ready: Callable[[list[int]], None] | None = None) -> int:
        """Boot the workers (calling `ready` with their pids once all serve), keep them running,
        stop them all."""
        loop = asyncio.get_running_loop()
        for sig in stopsignals.STOP_SIGNALS:
            loop.add_signal_handler(sig, self._on_signal, sig)
        try:
            if await self._boot(self.slots[:1]) and await self._boot(self.slots[1:]):
                self._booted = True
                if ready is not None:
                    ready(self.pids)
                await self._done.wait()
            return await self._stop_all()
        finally:
            # Once a signal stopped the workers a second one (Ctrl-C twice) asks for what is done.
            stopsignals.remove_handlers(loop, stopsignals.STOP_SIGNALS, ignore=self._signalled)

    # -- booting and keeping ----------------------------------------------------------
    async def _boot(self, slots: list[_Slot]) -> bool:
        """Start `slots`' workers; True once every one serves, False if the boot was cut short."""
        self._keepers += [asyncio.create_task(self._keep(s), name=f"livepush-worker-{s.index}") for s in slots]

        async def all_ready() -> None:
            for slot in slots:
                await slot.ready.wait()

        waits = [asyncio.create_task(all_ready()), asyncio.create_task(self._done.wait())]
        try:
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in waits:
                task.cancel()
        return not self._done.is_set()

    async def _keep(self, slot: _Slot) -> None:
        """Run `slot`'s worker; start it again each time it dies, until the supervisor stops."""
        while not self._stopping:
            try:
                process = await self._start(slot)
            except OSError as exc:  # no process at all (out of fds or memory): nothing to wait for
                log.error("worker %d could not be started (%s): stopping every worker", slot.index, exc)
                self._give_up(1)
                return
            status = await process.wait()
            slot.last_status = status
            if self.on_exit is not None:
                self.on_exit(process.pid)
            if self._stopping:
                return
            # A boot failure is a worker that never served (a bad setting, a dependency down: the
            # next would fail alike). One that served and died while others still boot is a crash
            # like any later one, and is restarted; so is one stopped on purpose while it booted
            # (an operator's SIGTERM to it: exit 0, or killed by the signal before its handlers).
            if not self._booted and not slot.served and status not in _STOPPED:
                log.error("worker %d (pid %d) %s before it served: stopping", slot.index, process.pid,
                          describe_exit(status))
                self._give_up(status if status > 0 else 1)
                return
            delay = self._note_exit(slot)
            if delay is None:
                log.error("worker %d (pid %d) %s; %d unexpected exits within %g s: giving up, stopping every "
                          "worker", slot.index, process.pid, describe_exit(status), len(self._exits),
                          self.policy.window)
                self._give_up(1)
                return
            log.warning("worker %d (pid %d) %s; restarting it in %g s", slot.index, process.pid,
                        describe_exit(status), delay)
            slot.last_status = None  # told now; a stop meanwhile judges only how workers stop
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._done.wait(), delay)

    async def _start(self, slot: _Slot) -> asyncio.subprocess.Process:
        """Start `slot`'s worker; its `ready` is set when it says it serves."""
        slot.ready.clear()
        read_fd, write_fd = os.pipe()
        try:
            process = await asyncio.create_subprocess_exec(
                *self.command(slot.index, write_fd), env=self.env, stdin=subprocess.DEVNULL,
                pass_fds=(write_fd,), process_group=0,
            )
        finally:
            os.close(write_fd)  # the worker holds the only write end: its exit is the pipe's end
        slot.process = process
        if self._stopping:  # a signal came while it started: it has not heard it
            process.send_signal(signal.SIGTERM)
        hearing = asyncio.create_task(self._hear_ready(slot, process, read_fd),
                                      name=f"livepush-worker-{slot.index}-ready")
        self._hearing.add(hearing)  # the loop keeps only a weak reference to a task
        hearing.add_done_callback(self._hearing.discard)
        return process

    async def _hear_ready(self, slot: _Slot, process: asyncio.subprocess.Process, read_fd: int) -> None:
        loop = asyncio.get_running_loop()
        reader = asyncio.StreamReader()
        transport, _ = await loop.connect_read_pipe(
            lambda: asyncio.StreamReaderProtocol(reader), os.fdopen(read_fd, "rb", buffering=0))
        try:
            line = await reader.readline()  # b"" when the worker exited first
        finally:
            transport.close()
        if line == READY_LINE and process.returncode is None:
            if slot.served:
                log.info("worker %d (pid %d) serving again", slot.index, process.pid)
            slot.served = True
            slot.ready.set()

    def _note_exit(self, slot: _Slot) -> float | None:
        """The delay before `slot`'s worker starts again; None when restarts should stop."""
        now = asyncio.get_running_loop().time()
        for exits in (self._exits, slot.exits):
            exits.append(now)
            while exits and exits[0] < now - self.policy.window:
                exits.popleft()
        if len(self._exits) > self.policy.limit:
            return None
        return self.policy.delay(len(slot.exits))

    # -- stopping ---------------------------------------------------------------------
    def _on_signal(self, sig: int) -> None:
        """Forward the signal to every worker: the first one stops them, a second one hurries them."""
        if not self._stopping:
            log.info("stopping: %s to every worker", signal.Signals(sig).name)
            self._set_deadline(self.stop_bound.seconds, "the stop signal", self.stop_bound.why)
        else:  # forwarded, it is each worker's second signal (after a give-up's SIGTERM too)
            since = ("the second stop signal" if self._signalled
                     else "a stop signal after the supervisor's own SIGTERM")  # the operator's first
            self._set_deadline(self.stop_bound.hurried, since, self.stop_bound.hurried_why)
        self._stopping = self._signalled = True
        self._forward(sig)
        self._done.set()

    def _give_up(self, status: int) -> None:
        if self._stopping:
            return
        self._status = status
        self._stopping = True
        self._set_deadline(self.stop_bound.seconds, "the supervisor's SIGTERM", self.stop_bound.why)
        self._forward(signal.SIGTERM)
        self._done.set()

    def _forward(self, sig: int) -> None:
        for slot in self.slots:
            if slot.process is not None and slot.process.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    slot.process.send_signal(sig)

    def _set_deadline(self, seconds: float, since: str, why: str) -> None:
        """Kill what still runs `seconds` plus the margin from now, unless an earlier kill is due."""
        now = asyncio.get_running_loop().time()
        deadline = now + seconds + self.stop_bound.margin
        if self._deadline is None or deadline < self._deadline:
            self._deadline, self._deadline_from, self._deadline_why, self._deadline_since = deadline, since, why, now
            self._deadline_moved.set()

    async def _stop_all(self) -> int:
        """Wait for every worker to exit, killing those that outlive their stop's bound; 0 when a
        signal stopped them and each exited cleanly."""
        loop = asyncio.get_running_loop()
        ended = asyncio.ensure_future(asyncio.gather(*self._keepers, return_exceptions=True))
        while not ended.done():
            left = None if self._deadline is None else self._deadline - loop.time()
            if left is not None and left <= 0:
                self._kill_stragglers(loop.time() - self._deadline_since)
                # SIGKILL cannot be caught: each keeper's wait ends with its process.
                await ended
                break
            self._deadline_moved.clear()
            moved = asyncio.create_task(self._deadline_moved.wait())
            waits: list[asyncio.Future[Any]] = [ended, moved]
            try:
                await asyncio.wait(waits, timeout=left, return_when=asyncio.FIRST_COMPLETED)
            finally:
                moved.cancel()
        if self._status is not None:
            return self._status
        failed = [s for s in self.slots if s.last_status is not None and s.last_status not in _STOPPED]
        for slot in failed:
            if not slot.killed:  # its own error was logged as it was killed
                log.error("worker %d %s while stopping", slot.index, describe_exit(slot.last_status or 0))
        return 1 if failed else 0

    def _kill_stragglers(self, waited: float) -> None:
        for slot in self.slots:
            process = slot.process
            if process is None or process.returncode is not None:
                continue
            # Why it is late is the worker's own (a hook of the app, a job, a thread that never
            # ends): say where to look; its jobs in hand are left as after a crash (docs/jobs.md).
            log.error("worker %d (pid %d) did not stop within %.1f s of %s (%s): killed it with SIGKILL; look "
                      "for code of your app or jobs that does not end on a stop", slot.index, process.pid, waited,
                      self._deadline_from, self._deadline_why)
            slot.killed = True
            with contextlib.suppress(ProcessLookupError):
                process.kill()
