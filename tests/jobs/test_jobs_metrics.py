"""`livepush jobs --metrics-port P`: the runtime's own /metrics counts what it claimed and how
each job ended, and shows every queue's backlog and the runtimes alive (docs/operations.md)."""

from __future__ import annotations

import urllib.error
import urllib.request
from collections.abc import Callable
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from livepush import jobs, metrics
from livepush.jobs.api.status import arefresh_metrics
from tests.jobs import sample_jobs
from tests.jobs.conftest import q, runtime_starter
from tests.support.http import http_exchange, raw_exchange
from tests.support.procs import ChildProcess, Processes, free_port
from tests.support.services import dbname_of, pg_refusing_connections, pg_terminate
from tests.support.waiting import wait_for


# A workflow step that polls something not ready yet: it asks to run again later, failing nothing.
polling = jobs.workflow("metrics_polling", queue="metrics_polling")


@polling.step()
async def not_ready_yet(ctx: Any) -> None:
    ctx.flow.reattempt(3600)


def scrape(port: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
        assert resp.status == 200 and resp.headers["Content-Type"].startswith("text/plain")
        text = resp.read().decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def test_the_runtime_serves_its_job_counts_and_the_queues_backlog(
        jobs_db: str, procs: Processes, livepush_env: Callable[..., dict[str, str]]) -> None:
    start: Callable[..., ChildProcess] = runtime_starter(jobs_db, "tests.jobs.sample_jobs", procs,
                                                         livepush_env(database_url=jobs_db))
    port = free_port()
    child = start("--queues", "default", "--metrics-port", str(port))
    jobs.enqueue_many([sample_jobs.other_queue.request(i) for i in range(3)])  # a queue nobody serves
    sample_jobs.flaky.enqueue(1)  # fails once, then succeeds
    sample_jobs.never.enqueue()  # fails for good
    sample_jobs.record.enqueue("x")
    wait_for(lambda: q(jobs_db, "SELECT count(*) FROM livepush_jobs WHERE queue = 'default' "
                                "AND state IN ('succeeded', 'failed')")[0][0] == 3, 15.0, message="three jobs to end")

    def counted() -> dict[tuple[str, tuple[tuple[str, str], ...]], float] | None:
        m = scrape(port)
        return m if m.get(("livepush_jobs_succeeded_total", (("queue", "default"),))) == 2 else None

    m = wait_for(counted, 5.0, message="the outcomes to be counted")
    assert m["livepush_jobs_claimed_total", (("queue", "default"),)] == 4
    assert m["livepush_jobs_retried_total", (("queue", "default"),)] == 1
    assert m["livepush_jobs_failed_total", (("queue", "default"),)] == 1
    assert m["livepush_queue_depth", (("queue", "second"),)] == 3
    assert m["livepush_queue_oldest_age_seconds", (("queue", "second"),)] > 0
    assert m["livepush_queue_depth", (("queue", "default"),)] == 0
    assert m["livepush_runtimes_alive", ()] == 1
    # A runtime holds no connection: the server's series (at 0 here) would read as a server that
    # serves nobody, and one short in the count of serving processes.
    shown = {name for name, _ in m}
    assert not {"livepush_connections", "livepush_serving_processes", "livepush_delivered_total",
                "livepush_refusals_total"} & shown, sorted(shown)
    assert child.stop(timeout=15) == 0, child.output()


def test_a_runtimes_job_counters_start_at_zero_for_each_queue_it_serves_so_that_a_first_failure_is_seen(
        jobs_db: str, procs: Processes, livepush_env: Callable[..., dict[str, str]]) -> None:
    """Prometheus reads an increase only between two samples of a series: a counter that first
    appears at 1 (a queue's first job failed for good since the runtime started) has no rate, and
    the failures alert of docs/operations.md would stay quiet. Each queue's series is there at 0
    from the runtime's start."""
    start: Callable[..., ChildProcess] = runtime_starter(jobs_db, "tests.jobs.sample_jobs", procs,
                                                         livepush_env(database_url=jobs_db))
    port = free_port()
    child = start("--queues", "default,second", "--metrics-port", str(port))
    m = scrape(port)
    for queue in ("default", "second"):
        for counter in ("claimed", "succeeded", "failed", "retried"):
            assert m.get((f"livepush_jobs_{counter}_total", (("queue", queue),))) == 0, (counter, queue)
    assert m.get(("livepush_jobs_rescued_total", ())) == 0
    assert child.stop(timeout=15) == 0, child.output()


def healthz(port: int) -> int:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=5) as resp:
            return resp.status
    except urllib.error.HTTPError as exc:
        return exc.code


def test_the_runtimes_healthz_answers_503_while_it_cannot_hear_its_database(
        jobs_db: str, pg_admin_url: str, procs: Processes, livepush_env: Callable[..., dict[str, str]]) -> None:
    """GET /healthz on `--metrics-port` says of the runtime what the server's /healthz says of one
    beside it: 200 while its loops run and its listener hears the database, 503 while it does not.
    It answered 200 whatever happened: a probe pointed there never saw a runtime deaf to its
    enqueues and cancels."""
    start: Callable[..., ChildProcess] = runtime_starter(jobs_db, "tests.jobs.sample_jobs", procs,
                                                         livepush_env(database_url=jobs_db))
    port = free_port()
    child = start("--metrics-port", str(port))
    wait_for(lambda: healthz(port) == 200, 10.0, message="/healthz 200 once the runtime runs")
    with pg_refusing_connections(pg_admin_url, dbname_of(jobs_db)):
        assert pg_terminate(pg_admin_url, dbname_of(jobs_db), "livepush-jobs-listener") == 1
        wait_for(lambda: healthz(port) == 503, 10.0, message="/healthz 503 while the listener is away")
    wait_for(lambda: healthz(port) == 200, 15.0, message="/healthz 200 once the listener is back")
    assert child.stop(timeout=15) == 0, child.output()


def test_jobs_a_rescue_ends_count_as_failed_for_good_or_retried(
        jobs_db: str, procs: Processes, livepush_env: Callable[..., dict[str, str]]) -> None:
    """A runtime killed with its jobs in hand: the runtime that rescues them counts the one that
    had no attempt left in livepush_jobs_failed_total, which the failures alert reads, and the
    one released to run again in livepush_jobs_retried_total, as their events say."""
    start: Callable[..., ChildProcess] = runtime_starter(jobs_db, "tests.jobs.sample_jobs", procs,
                                                         livepush_env(database_url=jobs_db))
    last, again = (h.id for h in jobs.enqueue_many([sample_jobs.wait_flag.request("never") for _ in range(2)]))
    q(jobs_db, "UPDATE livepush_jobs SET max_attempts = 1 WHERE id = %s", (last,))
    victim = start("--concurrency", "2")
    wait_for(lambda: q(jobs_db, "SELECT count(*) FROM livepush_jobs WHERE state = 'running'")[0][0] == 2, 15.0,
             message="both jobs to start")
    port = free_port()
    rescuer = start("--queues", "other", "--metrics-port", str(port))  # rescues, but claims nothing back
    victim.kill()
    wait_for(lambda: q(jobs_db, "SELECT id, state FROM livepush_jobs ORDER BY id")
             == sorted([(last, "failed"), (again, "available")]), 15.0, message="the rescue")

    def counted() -> dict[tuple[str, tuple[tuple[str, str], ...]], float] | None:
        m = scrape(port)
        return m if m.get(("livepush_jobs_rescued_total", ())) == 2 else None

    m = wait_for(counted, 5.0, message="the rescue to be counted")
    assert m.get(("livepush_jobs_failed_total", (("queue", "default"),))) == 1, m
    assert m.get(("livepush_jobs_retried_total", (("queue", "default"),))) == 1, m
    assert rescuer.stop(timeout=15) == 0, rescuer.output()


def test_a_workflow_step_that_asks_to_run_again_later_is_not_counted_as_a_retried_failure(jobs_db: str) -> None:
    """ctx.flow.reattempt(wait=S) spends no attempt and is no failure: livepush_jobs_retried_total
    (failed attempts scheduled to run again) does not count it, whatever the wait, and drain()
    counts it `released`, as a reattempt with no wait."""

    def retried() -> float:
        return metrics.REGISTRY.get_sample_value("livepush_jobs_retried_total", {"queue": "metrics_polling"}) or 0.0

    before = retried()
    polling.start({})
    assert jobs.drain(["metrics_polling"]) == {"released": 1}
    assert retried() == before
    assert q(jobs_db, "SELECT state, attempt FROM livepush_jobs WHERE queue = 'metrics_polling'") == [("scheduled", 0)]  # its attempt given back


def test_a_busy_metrics_port_is_a_clear_error(jobs_db: str, procs: Processes,
                                              livepush_env: Callable[..., dict[str, str]]) -> None:
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        child = procs.livepush("jobs", "tests.jobs.sample_jobs", "--metrics-port", str(port),
                               env=livepush_env(database_url=jobs_db), wait_healthy=False)
        assert child.wait(15) == 2
        assert "--metrics-port" in child.output() and "Traceback" not in child.output()


def test_metrics_port_0_says_which_port_it_picked(jobs_db: str, procs: Processes,
                                                  livepush_env: Callable[..., dict[str, str]]) -> None:
    """--metrics-port takes 0 (any free port): the runtime then logs the port it got, or the
    metrics could not be found; the address it logs answers GET /metrics."""
    import re

    child = procs.livepush("jobs", "tests.jobs.sample_jobs", "--metrics-port", "0",
                           env=livepush_env(database_url=jobs_db), wait_healthy=False)
    found = wait_for(lambda: re.search(r"metrics on http://127\.0\.0\.1:(\d+)/metrics", child.stderr())
                     or (not child.running and child.output()), 15.0, message="the metrics address in the log")
    assert isinstance(found, re.Match), found
    assert ("livepush_runtimes_alive", ()) in scrape(int(found.group(1)))
    assert child.stop(timeout=15) == 0, child.output()


async def test_the_metrics_port_answers_head_like_get_and_other_methods_with_405() -> None:
    """The runtime's metrics port holds to the server port's rules: /metrics and /healthz answer
    GET, HEAD gets the same status and headers without the body, any other method 405 with
    `Allow: GET, HEAD`; a HEAD or a POST of /metrics is not a 404 (the route exists)."""
    from livepush import metrics

    server = await metrics.serve("127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        for path in ("/metrics", "/healthz"):
            status, headers, body = await http_exchange(port, "GET", path)
            assert status == 200 and body
            status, head_headers, head_body = await http_exchange(port, "HEAD", path)
            assert (status, head_body) == (200, b"") and head_headers["content-type"] == headers["content-type"]
            for method in ("POST", "DELETE"):
                status, headers, _ = await http_exchange(port, method, path)
                assert (status, headers.get("allow")) == (405, "GET, HEAD"), (method, path)
        assert (await http_exchange(port, "GET", "/nope"))[0] == 404
    finally:
        server.close()


async def test_the_metrics_port_answers_a_large_head_and_an_absolute_target_as_the_server_port_does() -> None:
    """As on the server's port: a target in absolute form is routed by its path, a request line
    past 8 KiB gets 414, a header line past 8 KiB or a 129th header line 431, each answered
    (not a connection closed without a word), and a head that fits is served."""
    server = await metrics.serve("127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        answer = await raw_exchange(port, b"GET http://127.0.0.1/healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        assert answer.startswith(b"HTTP/1.1 200"), answer[:80]
        answer = await raw_exchange(port, b"GET /healthz?" + b"a" * 9000 + b" HTTP/1.1\r\nHost: x\r\n\r\n")
        assert answer.startswith(b"HTTP/1.1 414"), answer[:80]
        answer = await raw_exchange(port, b"GET /healthz HTTP/1.1\r\nCookie: " + b"a" * 9000 + b"\r\n\r\n")
        assert answer.startswith(b"HTTP/1.1 431"), answer[:80]
        many = b"".join(b"X-%d: 1\r\n" % i for i in range(129))
        answer = await raw_exchange(port, b"GET /healthz HTTP/1.1\r\n" + many + b"\r\n")
        assert answer.startswith(b"HTTP/1.1 431"), answer[:80]
        # 128 header lines of 8000 bytes, a head of 1 MB: within the limits, served.
        large = b"".join(b"X-%d: %s\r\n" % (i, b"a" * 7990) for i in range(128))
        answer = await raw_exchange(port, b"GET /healthz HTTP/1.1\r\n" + large + b"\r\n")
        assert answer.startswith(b"HTTP/1.1 200"), answer[:80]
        answer = await raw_exchange(port, b"HEAD /healthz?" + b"a" * 9000 + b" HTTP/1.1\r\nHost: x\r\n\r\n")
        assert answer.startswith(b"HTTP/1.1 414") and answer.endswith(b"\r\n\r\n"), answer[-80:]
    finally:
        server.close()


def test_a_metrics_host_it_cannot_listen_on_names_the_host_not_the_port(
        jobs_db: str, procs: Processes, livepush_env: Callable[..., dict[str, str]]) -> None:
    """--metrics-port listens on LIVEPUSH_HOST: a host that does not resolve, or is another
    machine's address, is that setting's fault, and the one line says so; no port would help."""
    for host in ("no-such-host.invalid", "192.0.2.1"):
        child = procs.livepush("jobs", "tests.jobs.sample_jobs", "--metrics-port", "0",
                               env=livepush_env(database_url=jobs_db, host=host), wait_healthy=False)
        assert child.wait(15) == 2, child.output()
        lines = [line for line in child.stderr().splitlines() if line.strip()]
        assert len(lines) == 1 and "Traceback" not in child.stderr(), child.output()
        assert "LIVEPUSH_HOST" in lines[0] and host in lines[0] and "free port" not in lines[0], lines[0]


async def test_database_gauges_a_process_cannot_read_leave_its_scrape_until_it_reads_them_again(
        jobs_db: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The queue and runtime gauges are the database's, and every process shows the same value
    (alerts take their max): one whose read fails (its database away, its role refused) shows
    none, rather than its last read for ever, which pinned a backlog alert on and held `no
    runtime` off. Its next read that works shows them again."""
    monkeypatch.setattr(metrics, "REFRESH_EVERY", 0.0)  # every scrape reads
    q(jobs_db, "INSERT INTO livepush_job_runtimes (host, pid, queues, concurrency, heartbeat) "
               "VALUES ('h', 1, '{emails}', 1, 10)")
    sample_jobs.other_queue.enqueue(1)

    async def gauges() -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
        text = (await metrics.render([arefresh_metrics])).decode()
        return {(s.name, tuple(sorted(s.labels.items()))): s.value
                for family in text_string_to_metric_families(text) for s in family.samples
                if s.name in ("livepush_runtimes_alive", "livepush_queue_depth", "livepush_queue_oldest_age_seconds")}

    read = await gauges()
    assert read["livepush_runtimes_alive", ()] == 1 and read["livepush_queue_depth", (("queue", "second"),)] == 1
    q(jobs_db, "ALTER TABLE livepush_job_runtimes RENAME TO livepush_job_runtimes_away")
    try:
        assert await gauges() == {}
    finally:
        q(jobs_db, "ALTER TABLE livepush_job_runtimes_away RENAME TO livepush_job_runtimes")
    again = await gauges()
    assert again["livepush_runtimes_alive", ()] == 1 and again["livepush_queue_depth", (("queue", "second"),)] == 1


async def test_a_paused_queue_is_marked_so_that_the_backlog_alert_can_leave_it_out(
        jobs_db: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A queue paused on purpose grows a backlog: livepush_queue_paused says so (1), which the
    documented backlog alert leaves out; a queue paused with nothing in it is listed too, and a
    resumed one shows 0."""
    monkeypatch.setattr(metrics, "REFRESH_EVERY", 0.0)  # every scrape reads
    sample_jobs.other_queue.enqueue(1)  # on "second", which nobody serves
    assert await jobs.apause_queue("second") and await jobs.apause_queue("quiet")

    async def gauges() -> dict[tuple[str, str], float]:
        text = (await metrics.render([arefresh_metrics])).decode()
        return {(s.name, s.labels["queue"]): s.value for family in text_string_to_metric_families(text)
                for s in family.samples if s.name in ("livepush_queue_paused", "livepush_queue_depth")}

    read = await gauges()
    assert read["livepush_queue_paused", "second"] == 1 and read["livepush_queue_depth", "second"] == 1
    assert read["livepush_queue_paused", "quiet"] == 1 and read["livepush_queue_depth", "quiet"] == 0
    assert await jobs.aresume_queue("second")
    again = await gauges()
    assert again["livepush_queue_paused", "second"] == 0 and again["livepush_queue_depth", "second"] == 1
