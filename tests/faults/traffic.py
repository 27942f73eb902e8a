"""Traffic through a fault: WebSocket clients on every server, a publisher, a job enqueuer and a
/healthz watch, started and stopped together, and the checks every fault test makes of them."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass

from livepush.fanout import FanOut
from livepush.jobs.api.functions import JobFunction
from tests.faults.clients import ResumingClient, delivery_report, wait_delivered
from tests.faults.fleet import Fleet, Server
from tests.faults.health import HealthWatch
from tests.faults.load import Enqueuer, Publisher
from tests.support.waiting import async_wait_for


@dataclass(frozen=True)
class Recovery:
    """How long an outage lasted (s), and each server's seconds (by port) from its end to 200."""

    down: float
    healthy_after: dict[int, float]


class Traffic:
    """What runs through a fault; `start()` it once the servers are healthy."""

    def __init__(self, servers: Sequence[Server], clients: list[ResumingClient], publisher: Publisher,
                 enqueuer: Enqueuer | None) -> None:
        self.servers = list(servers)
        self.clients = clients
        self.publisher = publisher
        self.enqueuer = enqueuer
        self.watch = HealthWatch(self.servers)

    @classmethod
    async def start(cls, fleet: Fleet, servers: Sequence[Server], fanout: FanOut, topic_names: Sequence[str], *,
                    clients_per_server: int = 2, job: JobFunction | None = None) -> Traffic:
        """Subscribe `clients_per_server` clients to every topic on each server, then start the
        watch, publishing on `fanout` and (with `job`) enqueuing `job`."""
        subscriptions = {t: fleet.sign(t) for t in topic_names}
        clients = [await ResumingClient.open(s.url, subscriptions, name=f"client{i}@{s.port}")
                   for s in servers for i in range(clients_per_server)]
        traffic = cls(servers, clients, Publisher(fanout, topic_names), Enqueuer(job) if job else None)
        traffic.watch.start()
        traffic.publisher.start()
        if traffic.enqueuer is not None:
            traffic.enqueuer.start()
        return traffic

    def _count(self, since: float) -> tuple[int, int]:
        return self.publisher.count_since(since), self.enqueuer.count_since(since) if self.enqueuer else 0

    async def reaches(self, published: int, enqueued: int = 0, *, since: float = 0.0, timeout: float = 20.0) -> None:
        """Wait until, since `since` (time.monotonic()), `published` publishes and `enqueued`
        enqueues returned."""
        def enough() -> bool:
            p, e = self._count(since)
            return p >= published and e >= enqueued

        try:
            await async_wait_for(enough, timeout, message=f"{published} publishes and {enqueued} enqueues to return")
        except AssertionError as exc:
            last = [x.last_error for x in (self.publisher, self.enqueuer) if x is not None]
            raise AssertionError(f"{exc}; the last errors: {last}") from None

    async def recovers(self, up_at: float, bound: float, published: int, enqueued: int = 0) -> dict[int, float]:
        """Every server answers /healthz with 200 within `bound` s, and then the load goes on
        (`published`, `enqueued` since `up_at`); returns each server's seconds from `up_at` to 200."""
        for s in self.servers:
            await s.child.await_healthy(bound)
        await self.reaches(published, enqueued, since=up_at)
        return {s.port: round((self.watch.back_at(s.port) or up_at) - up_at, 2) for s in self.servers}

    async def through(self, outage: AbstractAsyncContextManager[None], *, hold: float, bound: float, load: int,
                      noticed: Callable[[], bool] = lambda: True) -> Recovery:
        """Run through `outage` and stop the load: `load` publishes (a quarter as many enqueues)
        return before it; inside it, once every server answers 503 and `noticed()`, it lasts
        `hold` s more (as long as a restart takes); after it every server answers 200 within
        `bound` s and `load` more publishes return."""
        enqueues = load // 4 if self.enqueuer is not None else 0
        try:
            await self.reaches(load, enqueues)
            down_at = time.monotonic()
            async with outage:
                await async_wait_for(lambda: self.watch.all_answer(503) and noticed(), 10,
                                     message="every server (and the load) to notice the outage")
                await asyncio.sleep(hold)
            up_at = time.monotonic()
            healthy_after = await self.recovers(up_at, bound, load, enqueues)
        finally:
            await self.stop()
        assert self.watch.dipped_and_back({}), f"the outage did not show on /healthz: {self.watch.changes}"
        return Recovery(round(up_at - down_at, 2), healthy_after)

    async def stop(self) -> None:
        """Stop the load and the watch (the clients go on receiving)."""
        await self.publisher.stop()
        if self.enqueuer is not None:
            await self.enqueuer.stop()
        await self.watch.stop()

    async def delivered(self, timeout: float = 20.0) -> str:
        """What holds after any fault here: the servers answered /healthz with 200 or 503 only
        (never stopped answering); every published message reached every client or lies under a
        `reset`; no duplicate, no disorder, no reconnect. Returns the delivery report."""
        assert self.watch.answers_other_than(200, 503) == [], "a server stopped answering /healthz"
        await wait_delivered(self.publisher.published, self.clients, timeout)
        report = delivery_report(self.publisher.published, self.clients)
        assert all(not c.not_newer for c in self.clients), f"duplicates or disorder:\n{report}"
        assert all(c.reconnects == 0 for c in self.clients), f"a client was disconnected:\n{report}"
        return report

    async def ends_cleanly(self, fleet: Fleet) -> None:
        """Every enqueued job succeeds, no process of `fleet` exited on its own, and each stops
        with status 0 on SIGTERM."""
        if self.enqueuer is not None:
            await fleet.wait_jobs_done(self.enqueuer.ids)
        assert fleet.still_running() == [], "a process exited on its own"
        await self.close()
        statuses = fleet.stop_all()
        assert set(statuses.values()) == {0}, statuses

    def resets(self) -> list[int]:
        return [c.resets() for c in self.clients]

    async def close(self) -> None:
        """Close the clients and the publisher's fan-out."""
        for c in self.clients:
            await c.close()
        await self.publisher.fanout.aclose()

    def summary(self) -> str:
        jobs = f", {len(self.enqueuer.ids)} jobs ({self.enqueuer.failures} failed enqueues)" if self.enqueuer else ""
        return f"{len(self.publisher.published)} published ({self.publisher.failures} failed){jobs}; resets {self.resets()}"

