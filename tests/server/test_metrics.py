"""GET /metrics on the server's port: Prometheus text whose `livepush_` figures follow what
clients and publishers did (docs/reference.md#9-operations, docs/operations.md)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from livepush import jobs, metrics
from livepush.jobs import database
from tests.server.conftest import Served, make_settings, start_served
from tests.server.test_server import http_get
from tests.support.procs import ChildProcess, Processes
from tests.support.waiting import async_wait_for
from tests.support.wsclient import WSClient

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


async def scrape(port: int) -> Samples:
    status, body = await http_get(port, "/metrics")
    assert status == 200
    samples: Samples = {}
    for family in text_string_to_metric_families(body.decode()):
        for s in family.samples:
            samples[s.name, tuple(sorted(s.labels.items()))] = s.value
    return samples


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


async def test_metrics_follow_connections_subscriptions_publishes_deliveries_and_refusals(served: Served) -> None:
    port = served.server.port
    before = await scrape(port)
    client = await WSClient.open(served.url)
    await client.subscribe(served.sign("room.1"))
    await client.send({"op": "subscribe", "topic": "no spaces allowed", "ref": 2})
    assert (await client.recv())["reason"] == "invalid_topic"
    await served.publish("room.1", {"n": 1})
    assert (await client.messages(1))[0]["data"] == {"n": 1}

    after = await scrape(port)
    assert value(after, "livepush_connections") == value(before, "livepush_connections") + 1
    assert value(after, "livepush_subscriptions") == value(before, "livepush_subscriptions") + 1
    name = served.fanout.name
    assert value(after, "livepush_published_total", fanout=name) > value(before, "livepush_published_total",
                                                                           fanout=name)
    assert value(after, "livepush_delivered_total") >= value(before, "livepush_delivered_total") + 1
    assert value(after, "livepush_deliver_lag_seconds_count") >= value(before, "livepush_deliver_lag_seconds_count") + 1
    assert value(after, "livepush_refusals_total", reason="subscribe_invalid_topic") == \
        value(before, "livepush_refusals_total", reason="subscribe_invalid_topic") + 1

    await client.close()

    async def closed() -> bool:
        return value(await scrape(port), "livepush_connections") == value(before, "livepush_connections")

    await async_wait_for(closed, 5.0, message="the connection gauge to drop back")


async def test_a_resubscribe_with_since_counts_as_a_recovery(served: Served) -> None:
    port = served.server.port
    first = await served.publish("room.2", {"n": 1})
    await served.publish("room.2", {"n": 2})
    before = await scrape(port)
    client = await WSClient.open(served.url)
    await client.subscribe(served.sign("room.2"), since=first)
    assert [m["data"] for m in await client.messages(1)] == [{"n": 2}]
    await client.close()
    assert value(await scrape(port), "livepush_recoveries_total") == value(before, "livepush_recoveries_total") + 1


def test_the_delivery_tally_adds_to_the_lag_histogram_what_observing_each_lag_would() -> None:
    from prometheus_client import CollectorRegistry, Histogram

    from livepush import metrics

    lags = [-0.5, 0.0, 0.001, 0.0011, 0.02, 0.7, 29.0, 30.0, 31.0, 1e6]
    reference = Histogram("reference_lag_seconds", "observed one by one", buckets=metrics.LAG_BUCKETS,
                          registry=CollectorRegistry())
    for lag in lags:
        reference.observe(max(lag, 0.0))

    def lag_samples(histogram: Histogram) -> list[tuple[str, str, float]]:
        return [(s.name.rpartition("_")[2], s.labels.get("le", ""), s.value)
                for family in histogram.collect() for s in family.samples if not s.name.endswith("_created")]

    metrics.TALLY.flush()  # whatever the other tests left
    before = lag_samples(metrics.LAG)
    delivered = metrics.DELIVERED._value.get()
    for lag in lags:
        metrics.TALLY.lag(lag)
    metrics.TALLY.frames += 7
    metrics.TALLY.flush()
    after = lag_samples(metrics.LAG)

    added = [(name, le, round(v - v0, 9)) for (name, le, v), (_, _, v0) in zip(after, before)]
    assert added == [(name, le, round(v, 9)) for name, le, v in lag_samples(reference)]
    assert metrics.DELIVERED._value.get() == delivered + 7


@pytest.mark.parametrize("folder", ["an existing one", "a missing one"])
async def test_a_multiprocess_folder_livepush_inherits_gets_none_of_its_metrics(
        procs: Processes, livepush_env: Callable[..., dict[str, str]], tmp_path: Path, folder: str) -> None:
    """A PROMETHEUS_MULTIPROC_DIR set for a whole container (a web app's multiprocess mode) is
    not livepush's: `livepush serve` writes no file there, which the app's scrape would add up with
    its own (and keep after the server is gone), and starts as well when the folder is missing;
    its /metrics has its figures all the same."""
    shared = tmp_path / "web-app-metrics"
    if folder == "an existing one":
        shared.mkdir()
    child = procs.livepush("serve", env=livepush_env(extra={"PROMETHEUS_MULTIPROC_DIR": str(shared)}),
                           wait_healthy=False)
    await child.await_healthy()

    async def canary_counted() -> Samples | None:
        samples = await scrape(child.port or 0)
        return samples if value(samples, "livepush_published_total", fanout="local") >= 1 else None

    await async_wait_for(canary_counted, 10.0, message="the canary's publish in /metrics")
    assert (sorted(p.name for p in shared.iterdir()) if shared.exists() else []) == []
    assert child.stop(15) == 0, child.output()


async def serve(procs: Processes, env: dict[str, str], workers: str | None) -> tuple[ChildProcess, int]:
    """`livepush serve` with `env`, in one process or (`workers`) under a supervisor; (it, its port)."""
    from tests.server.test_workers import start_workers

    if workers:
        return await start_workers(procs, env, "--workers", workers)
    child = procs.livepush("serve", env=env)
    return child, child.port or 0


async def test_a_scrape_has_the_same_series_with_one_process_and_with_several_workers(
        procs: Processes, livepush_env: Callable[..., dict[str, str]], pg_url: str) -> None:
    """Dashboards and alerts written against one process keep working under --workers: the same
    series names either way. The workers' added-up scrape has no `_created` series (a per-process
    creation time has no sum), so one process has none either."""
    names: dict[str, set[str]] = {}
    for workers in (None, "2"):
        child, port = await serve(procs, livepush_env(database_url=pg_url, port=0 if workers else None), workers)

        async def canary_counted() -> Samples | None:
            samples = await scrape(port)
            return samples if value(samples, "livepush_published_total", fanout="postgres") >= 1 else None

        samples = await async_wait_for(canary_counted, 10.0, message="the canary's publish in /metrics")
        names[workers or "one"] = {name for name, _ in samples}
        assert child.stop(15) == 0, child.output()
    assert [n for n in names["one"] if n.endswith("_created")] == []
    assert names["one"] == names["2"], (names["one"] ^ names["2"])


@pytest.mark.parametrize("workers", [None, "2"])
async def test_the_counters_the_alerts_read_are_scraped_at_zero_before_anything_is_counted(
        procs: Processes, livepush_env: Callable[..., dict[str, str]], pg_url: str, workers: str | None) -> None:
    """Prometheus sees an increase only between two samples of one series: a series that first
    appears at 1 has no rate(), so the first reset from history or the first slow client closed
    after a start would never fire the alerts of docs/operations.md. Each label value known in
    advance is in the first scrape at 0, with one process and with several workers."""
    child, port = await serve(procs, livepush_env(database_url=pg_url, port=0 if workers else None), workers)
    samples = await scrape(port)
    expected = [("livepush_resets_total", "cause", "history"), ("livepush_resets_total", "cause", "slow_client"),
                ("livepush_slow_client_actions_total", "action", "conflated"),
                ("livepush_slow_client_actions_total", "action", "replayed"),
                ("livepush_slow_client_actions_total", "action", "reset"),
                ("livepush_slow_client_actions_total", "action", "closed"),
                ("livepush_refusals_total", "reason", "origin"), ("livepush_refusals_total", "reason", "full")]
    assert [samples.get((name, ((label, v),))) for name, label, v in expected] == [0.0] * len(expected)
    assert child.stop(15) == 0, child.output()


@pytest.mark.parametrize("workers", [None, "2"])
async def test_a_required_sessions_refusals_are_scraped_at_zero_before_the_first(
        procs: Processes, livepush_env: Callable[..., dict[str, str]], pg_url: str, workers: str | None) -> None:
    """With a session required, the first refusal of each reason (an expired session, a revoked one)
    is an increase the alerts see: its series is in the first scrape at 0."""
    env = livepush_env(database_url=pg_url, port=0 if workers else None, authenticate="required")
    child, port = await serve(procs, env, workers)
    samples = await scrape(port)
    reasons = ["missing", "malformed", "bad_signature", "expired", "revoked"]
    assert [samples.get(("livepush_refusals_total", (("reason", f"session_{r}"),))) for r in reasons] == [0.0] * 5
    assert child.stop(15) == 0, child.output()


@jobs.job(name="t.metrics.backlog", queue="metrics-backlog")
def _backlog(ctx: object) -> None:
    pass


async def test_a_server_whose_modules_chose_the_jobs_database_serves_its_queue_and_runtime_gauges(
        pg_url: str, redis_url: str, secret: str) -> None:
    """Without LIVEPUSH_DATABASE_URL, the jobs' database that an --app or --with-jobs module chose
    with jobs.configure() is the one the server reads its job topics from, and the one its
    /metrics reads the queue and runtime gauges from: without them, the `no runtime` alert, which
    fires on the gauge's absence, would fire beside a runtime that runs in that very server."""
    database.configure(pg_url)
    metrics.DATABASE_GAUGES.forget()  # nothing an earlier read in this process left
    try:
        served = await start_served(make_settings("redis", secret, None, redis_url))
        try:
            await asyncio.to_thread(_backlog.enqueue)

            async def gauged() -> bool:
                samples = await scrape(served.server.port)
                return (value(samples, "livepush_queue_depth", queue="metrics-backlog") >= 1
                        and ("livepush_runtimes_alive", ()) in samples)

            await async_wait_for(gauged, 5.0, message="the queue and runtime gauges of the jobs' database")
        finally:
            await served.stop()
    finally:
        database.configure(None)
