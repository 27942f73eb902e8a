"""The processes of a fault test (servers, job runtimes) on one database, and outages of the
suite's shared PostgreSQL and Redis that always end with the service up again."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from typing import Any

from livepush import topics
from tests.jobs.conftest import q, registered, runtime_spawner
from tests.support import services
from tests.support.procs import ChildProcess, Processes
from tests.support.waiting import async_wait_for

# The jobs the runtimes run: `t.record` writes a row in job_runs each time it runs.
JOB_MODULE = "tests.jobs.sample_jobs"


@contextlib.asynccontextmanager
async def postgres_down(mode: str = "fast") -> AsyncIterator[None]:
    """PostgreSQL is stopped ("fast": its clients are disconnected; "immediate": a crash) inside
    the block and started again after it, whatever happens in it; pg_ctl runs in a thread so the
    event loop (clients, load, watches) goes on meanwhile."""
    await asyncio.to_thread(services.pg_stop, mode)
    try:
        yield
    finally:
        await asyncio.to_thread(services.pg_start)


@contextlib.asynccontextmanager
async def redis_down(*, hard: bool = False) -> AsyncIterator[None]:
    """Redis is stopped (hard=True: SIGKILL, a crash) inside the block and started again after it
    (empty: the test Redis keeps nothing), whatever happens in it; see `postgres_down`."""
    await asyncio.to_thread(services.redis_stop, hard=hard)
    try:
        yield
    finally:
        await asyncio.to_thread(services.redis_start)


@dataclass
class Server:
    """One `livepush serve` child process and its port."""

    child: ChildProcess
    port: int

    @property
    def url(self) -> str:
        return f"ws://127.0.0.1:{self.port}/"


class Fleet:
    """The processes of one deployment on one database: servers, job runtimes, and the settings
    (secret, URLs) they share."""

    def __init__(self, url: str, procs: Processes, livepush_env: Callable[..., dict[str, str]], secret: str) -> None:
        self.url = url
        self.procs = procs
        self._env = livepush_env
        self.secret = secret
        self.servers: list[Server] = []
        self.runtimes_started: list[ChildProcess] = []

    def env(self, *, fanout: str = "postgres", redis_url: str | None = None, **settings: object) -> dict[str, str]:
        """The environment of one child: this database, the fan-out, a fresh port."""
        return self._env(database_url=self.url, redis_url=redis_url, fanout=fanout, **settings)

    async def serve(self, count: int, *, fanout: str = "postgres", redis_url: str | None = None,
                    **settings: object) -> list[Server]:
        """Start `count` servers at once; return when each answers /healthz with 200."""
        started = []
        for _ in range(count):
            env = self.env(fanout=fanout, redis_url=redis_url, **settings)
            child = self.procs.livepush("serve", env=env, wait_healthy=False)
            started.append(Server(child, int(env["LIVEPUSH_PORT"])))
        await asyncio.gather(*(s.child.await_healthy() for s in started))
        self.servers += started
        return started

    async def runtimes(self, count: int, *flags: str, heartbeat: float = 1.0, fanout: str = "postgres",
                       redis_url: str | None = None, module: str = JOB_MODULE) -> list[ChildProcess]:
        """Start `count` `livepush jobs MODULE` (JOB_MODULE unless given) at once; return when each
        has registered."""
        spawn = runtime_spawner(module, self.procs, self.env(fanout=fanout, redis_url=redis_url), *flags,
                                heartbeat=heartbeat)
        children = [spawn() for _ in range(count)]
        for child in children:
            await asyncio.to_thread(registered, self.url, child)
        self.runtimes_started += children
        return children

    def sign(self, topic: str) -> str:
        return topics.sign(topic, [self.secret])

    def unfinished_jobs(self) -> list[tuple[Any, ...]]:
        """(id, state, attempt, event) of every job that has not succeeded."""
        return q(self.url, "SELECT id, state, attempt, event FROM livepush_jobs WHERE state <> 'succeeded' ORDER BY id")

    def jobs_run(self, ids: Sequence[int]) -> set[int]:
        """The ids among `ids` whose job ran to its end at least once (a row in job_runs)."""
        rows = q(self.url, "SELECT DISTINCT job_id FROM job_runs WHERE phase = 'done' AND job_id = ANY(%s)", (list(ids),))
        return {r[0] for r in rows}

    async def wait_jobs_done(self, ids: Sequence[int], timeout: float = 30.0) -> None:
        """Wait until every job in the database succeeded; then check each of `ids` ran to its end."""
        try:
            await async_wait_for(lambda: asyncio.to_thread(lambda: not self.unfinished_jobs()), timeout,
                                 interval=0.2, message="every enqueued job to succeed")
        except AssertionError as exc:
            left = await asyncio.to_thread(self.unfinished_jobs)
            outputs = "\n".join(c.output(3000) for c in self.runtimes_started)
            raise AssertionError(f"{exc}\n{len(left)} not succeeded, e.g. {left[:10]}\n{outputs}") from None
        ran = await asyncio.to_thread(self.jobs_run, ids)
        assert ran == set(ids), f"jobs that succeeded without running to their end: {sorted(set(ids) - ran)[:20]}"

    def server_log(self, *words: str) -> str:
        """The lines of the servers' stderr that hold one of `words` (all lines without words)."""
        return _lines([s.child for s in self.servers], words)

    def runtime_log(self, *words: str) -> str:
        """`server_log` for the job runtimes."""
        return _lines(self.runtimes_started, words)

    def still_running(self) -> list[str]:
        """Every child of the fleet that exited, with its output: [] while all of them run."""
        return [c.output() for c in [*(s.child for s in self.servers), *self.runtimes_started] if not c.running]

    def stop_all(self, timeout: float = 15.0) -> dict[str, int]:
        """SIGTERM every child and wait: {name (pid): exit status}; a clean stop is 0 for each."""
        children = [*(s.child for s in self.servers), *self.runtimes_started]
        for child in children:
            child.terminate()
        return {f"{c.name} (pid {c.pid})": c.wait(timeout) for c in children}


def _lines(children: Sequence[ChildProcess], words: Sequence[str]) -> str:
    return "\n".join(f"{c.pid}: {line}" for c in children for line in c.stderr().splitlines()
                     if not words or any(w in line for w in words))
