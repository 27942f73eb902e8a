"""Every `livepush_` metric, in one registry: what `/metrics` serves (docs/operations.md says what
each one means and when to alert on it).

Counters and the lag histogram are per process; Prometheus sums them across processes. The
gauges of queues and runtimes describe the database, not the process: whoever serves `/metrics`
refreshes them (through `refreshers`) just before rendering, at most once a second, so a
scrape costs no query when scrapes come in bursts.

Under `serve --workers N` every worker writes its values to files in one directory
(prometheus_client's multiprocess mode, switched on by PROMETHEUS_MULTIPROC_DIR, which the
supervisor sets) and `/metrics`, on whichever worker answers, adds them all up: one scrape
target, the whole server's numbers. Each gauge says how its workers' values combine. Anywhere
else livepush's values stay in memory, whatever PROMETHEUS_MULTIPROC_DIR the process inherited.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import threading
import time
from bisect import bisect_left
from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import Any

import prometheus_client
from prometheus_client import CollectorRegistry, multiprocess, values
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest
from websockets.exceptions import HeaderLineTooLong, RequestLineTooLong, TooManyHeaders
from websockets.http11 import MAX_LINE_LENGTH, MAX_NUM_HEADERS, Response

from .server import http

log = logging.getLogger("livepush.metrics")

REGISTRY = CollectorRegistry(auto_describe=True)
CONTENT_TYPE = CONTENT_TYPE_LATEST

# Where prometheus_client writes each process's values (it reads the variable itself).
MULTIPROCESS_DIR_VARIABLE = "PROMETHEUS_MULTIPROC_DIR"
# The folder whose files /metrics adds up: set in a worker of `serve --workers N` only
# (add_up_workers()), to the one its supervisor made.
_workers_directory: str | None = None

# The class of livepush's own values: in this process's memory, until add_up_workers() hands them
# to the files of `serve --workers N`. prometheus_client picks one class for the whole process from
# PROMETHEUS_MULTIPROC_DIR at its import; set for a whole container, that folder is a web app's, whose
# scrape would add up livepush's files with its own (and keep them after the process is gone), and
# a folder missing there stopped every livepush process at import.
_value_class: Any = values.MutexValue
# Held while a livepush metric makes its values under _value_class (values.ValueClass swapped).
_making_values = threading.Lock()


class _OwnValues:
    """Makes a livepush metric's values (at its creation, and per label set at the first
    labels()) of _value_class: never on an update, which costs what it did."""

    def _metric_init(self) -> None:
        with _making_values:
            shared, values.ValueClass = values.ValueClass, _value_class
            try:
                super()._metric_init()  # type: ignore[misc]
            finally:
                values.ValueClass = shared


class _NoCreated:
    """Leaves out a counter's or histogram's `_created` sample: the added-up scrape of `serve
    --workers N` has none (one process's creation time has no sum), so a scrape has the same series
    with one process as with N. Per metric, not prometheus_client.disable_created_metrics(): that
    would change the metrics of an app livepush runs in too."""

    def _child_samples(self) -> Iterable[Any]:
        return [s for s in super()._child_samples() if s.name != "_created"]  # type: ignore[misc]


class Counter(_NoCreated, _OwnValues, prometheus_client.Counter):
    pass


class Gauge(_OwnValues, prometheus_client.Gauge):
    pass


class Histogram(_NoCreated, _OwnValues, prometheus_client.Histogram):
    pass

# -- the push side ----------------------------------------------------------------------------
# Workers' connections add up; a dead worker's are gone with it ("live").
CONNECTIONS = Gauge("livepush_connections", "WebSocket connections open now.", registry=REGISTRY,
                    multiprocess_mode="livesum")
SUBSCRIPTIONS = Gauge("livepush_subscriptions", "Topic subscriptions held by open connections now.",
                      registry=REGISTRY, multiprocess_mode="livesum")
# 1 in each server process from its start to its stop; summed over the live workers, it says how
# many of `serve --workers N` serve: a worker whose restarts keep failing shows as one short.
SERVING = Gauge("livepush_serving_processes", "Server processes serving now (1 in each; under serve --workers N, "
                "the live workers that serve).", registry=REGISTRY, multiprocess_mode="livesum")
PUBLISHED = Counter("livepush_published", "Messages published from this process (publish() returned an offset).", ["fanout"],
                    registry=REGISTRY)
# Counted as the hub hands a frame to its recipients (one add per frame, whatever their number), not
# as each leaves a socket, which would cost a count per recipient on the hot path: so a state that a
# slow client's queue replaced with a newer one counts here too, and in SLOW_CLIENT_ACTIONS ("conflated").
DELIVERED = Counter("livepush_delivered", "Message frames handed live to clients' connections (one per recipient), "
                    "a state that a slow client's queue later replaced with a newer one included.", registry=REGISTRY)
LAG_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
LAG = Histogram("livepush_deliver_lag_seconds",
                "From publish (its commit on Postgres) to the live frame leaving this server, once per message.",
                buckets=LAG_BUCKETS, registry=REGISTRY)
RECOVERIES = Counter("livepush_recoveries", "Subscriptions with `since` served from history.", registry=REGISTRY)
RESETS = Counter("livepush_resets", "`reset` frames sent: history could not fill a gap, or a slow client fell "
                 "too far behind on a message topic.", ["cause"], registry=REGISTRY)
SLOW_CLIENT_ACTIONS = Counter("livepush_slow_client_actions", "What the server did about clients that could "
                              "not keep up: conflated (an older state replaced), replayed (a message topic's share "
                              "passed: read on from history), reset, closed (1013).",
                              ["action"], registry=REGISTRY)
# A page never comes near the budget: a count that rises names a client (or an integration) that
# sends hundreds of frames a second, slowed, not refused.
FRAME_BUDGET_PAUSES = Counter("livepush_frame_budget_pauses", "Times this server stopped reading a connection "
                              "past its frame budget until the budget refilled.", registry=REGISTRY)
REFUSALS = Counter("livepush_refusals", "Connections and subscriptions refused, by reason.", ["reason"],
                   registry=REGISTRY)
# Each worker sends its own canary; the slowest live one is the one to alert on.
CANARY_SECONDS = Gauge("livepush_canary_round_trip_seconds",
                       "The last canary's trip through the fan-out and back (what /readyz checks).",
                       registry=REGISTRY, multiprocess_mode="livemax")

# -- jobs ---------------------------------------------------------------------------------------
JOBS_CLAIMED = Counter("livepush_jobs_claimed", "Jobs claimed by runtimes in this process.", ["queue"],
                       registry=REGISTRY)
JOBS_SUCCEEDED = Counter("livepush_jobs_succeeded", "Jobs that succeeded.", ["queue"], registry=REGISTRY)
JOBS_FAILED = Counter("livepush_jobs_failed", "Jobs that failed for good (no attempt left, or a "
                      "non-retryable error).", ["queue"], registry=REGISTRY)
JOBS_RETRIED = Counter("livepush_jobs_retried", "Failed attempts scheduled to run again.", ["queue"],
                       registry=REGISTRY)
JOBS_RESCUED = Counter("livepush_jobs_rescued", "Jobs taken back from runtimes that died.", registry=REGISTRY)


# Every label value known before it is first counted, made at 0 when the process starts: Prometheus
# sees an increase only between two samples of one series, so a series first scraped at 1 (the
# first slow client closed, the first reset from history) has no rate() and the alerts of
# docs/operations.md would miss it.
_KNOWN_LABELS: tuple[tuple[Counter, tuple[str, ...]], ...] = (
    (RESETS, ("history", "slow_client")),
    (SLOW_CLIENT_ACTIONS, ("conflated", "replayed", "reset", "closed")),
    (REFUSALS, ("origin", "full", "duplicate_header", "missing_host", "session_store_unavailable")),
)
_QUEUE_COUNTERS = (JOBS_CLAIMED, JOBS_SUCCEEDED, JOBS_FAILED, JOBS_RETRIED)


def _from_zero() -> None:
    for metric, label_values in _KNOWN_LABELS:
        for label in label_values:
            metric.labels(label)


def count_refusals(reasons: Iterable[str]) -> None:
    """Make the refusal series of `reasons` at 0, for those known only once the server's settings
    are (a required session's reasons): the first expired session refused is then an increase."""
    for reason in reasons:
        REFUSALS.labels(reason)


def count_queues(queues: Iterable[str]) -> None:
    """Make each job counter's series of `queues` at 0, as a runtime starts serving them: a queue's
    first job failed for good is then an increase the failures alert sees."""
    for queue in queues:
        for counter in _QUEUE_COUNTERS:
            counter.labels(queue)


class DeliveryTally:
    """DELIVERED and LAG between flushes, as plain numbers. A prometheus_client update takes a
    lock (and under `serve --workers`, writes a file): once per message, that was a tenth of a
    server's CPU with many topics of few subscribers each. The connection core flushes every
    quarter second and `render()` before each scrape, so `/metrics` is never further behind."""

    __slots__ = ("frames", "_lags", "_lag_sum")

    def __init__(self) -> None:
        self.frames = 0  # message frames handed live to connections, one per recipient
        self._lags = [0] * (len(LAG_BUCKETS) + 1)  # per bucket, the last one +Inf: as LAG counts them
        self._lag_sum = 0.0

    def lag(self, seconds: float) -> None:
        """One message's publish-to-deliver lag."""
        seconds = max(seconds, 0.0)
        self._lags[bisect_left(LAG_BUCKETS, seconds)] += 1  # the first bucket whose bound is >= it
        self._lag_sum += seconds

    def flush(self) -> None:
        frames, self.frames = self.frames, 0
        if frames:
            DELIVERED.inc(frames)
        if any(self._lags):  # every lag counts in a bucket
            lags, total = self._lags, self._lag_sum
            self._lags, self._lag_sum = [0] * len(lags), 0.0
            # LAG's own bucket counters (prometheus_client keeps one per bound, not cumulative):
            # one add per bucket instead of one observe() per message.
            for bucket, n in zip(LAG._buckets, lags):
                if n:
                    bucket.inc(n)
            LAG._sum.inc(total)


TALLY = DeliveryTally()


class _DatabaseGauges(Collector):
    """The gauges that describe the database: what this process read last, kept in memory and
    never in the multiprocess files. The process that answers a scrape has just read them, so
    its read is the whole answer; in the files, a queue gone from the database would stay at its
    last value for ever (prometheus_client cannot remove a series there).

    None of them before the first read, nor after a read that failed: every process shows the
    same values and alerts take their max, so one that cannot read showing its last read would
    pin a backlog alert on, or hold the alert on no runtime alive off, for as long as it cannot."""

    def __init__(self) -> None:
        self.queues: dict[str, tuple[int, float, int, bool]] = {}  # depth, oldest age, held, paused
        self.runtimes_alive: int | None = None

    def forget(self) -> None:
        self.queues, self.runtimes_alive = {}, None

    def collect(self) -> Iterable[Metric]:
        depth = GaugeMetricFamily("livepush_queue_depth", "Jobs available to run now, per queue.",
                                  labels=["queue"])
        oldest = GaugeMetricFamily("livepush_queue_oldest_age_seconds",
                                   "Seconds the oldest available job of the queue has been due (0 when none is).",
                                   labels=["queue"])
        held = GaugeMetricFamily("livepush_queue_held", "Available jobs their function's concurrency= or rate= "
                                 "holds back now, per queue (on purpose: not in the depth).", labels=["queue"])
        paused = GaugeMetricFamily("livepush_queue_paused", "1 while the queue is paused (jobs.pause_queue), else 0.",
                                   labels=["queue"])
        for queue, (count, age, held_back, is_paused) in self.queues.items():
            depth.add_metric([queue], count)
            oldest.add_metric([queue], age)
            held.add_metric([queue], held_back)
            paused.add_metric([queue], 1 if is_paused else 0)
        alive = GaugeMetricFamily("livepush_runtimes_alive", "Job runtimes registered and beating.")
        if self.runtimes_alive is not None:
            alive.add_metric([], self.runtimes_alive)
        return [depth, oldest, held, paused, alive]


_from_zero()

DATABASE_GAUGES = _DatabaseGauges()
REGISTRY.register(DATABASE_GAUGES)

Refresher = Callable[[], Awaitable[None]]
REFRESH_EVERY = 1.0
_refreshed: dict[int, float] = {}
_refreshing: dict[int, asyncio.Future[None]] = {}
_warned: dict[int, float] = {}
_merged: dict[str, CollectorRegistry] = {}


# The push server's own series: a process without one (a job runtime's --metrics-port) leaves them
# out, where at 0 they read as a server that serves nobody.
SERVER_SERIES = frozenset(family.name for metric in (
    CONNECTIONS, SUBSCRIPTIONS, SERVING, DELIVERED, LAG, RECOVERIES, RESETS, SLOW_CLIENT_ACTIONS, FRAME_BUDGET_PAUSES,
    REFUSALS, CANARY_SECONDS) for family in metric.describe())


class _Without:
    """A registry's series but those named (generate_latest() reads any object with collect())."""

    def __init__(self, registry: CollectorRegistry, names: frozenset[str]) -> None:
        self.registry, self.names = registry, names

    def collect(self) -> Iterable[Metric]:
        return [m for m in self.registry.collect() if m.name not in self.names]


async def render(refreshers: Sequence[Refresher] = (), *, leave_out: frozenset[str] = frozenset()) -> bytes:
    """The registry in Prometheus text format, after the database gauges are fresh enough, but the
    families named in `leave_out`. A refresher that fails takes its gauges out of the scrape until
    one works (_DatabaseGauges); one that has not answered within 2 s leaves them as they were:
    the scrape still answers."""
    now = time.monotonic()
    for refresh in refreshers:
        key = id(refresh)
        if now - _refreshed.get(key, float("-inf")) < REFRESH_EVERY:
            continue
        running = _refreshing.get(key)
        if running is None:
            running = _refreshing[key] = asyncio.ensure_future(refresh())
            running.add_done_callback(functools.partial(_refresh_done, key))
        try:
            await asyncio.wait_for(asyncio.shield(running), timeout=2.0)
        except Exception:  # a database that does not answer must not hang the scrape
            pass
    TALLY.flush()
    registry = _registry()
    return generate_latest(_Without(registry, leave_out) if leave_out else registry)


def _registry() -> CollectorRegistry:
    """This process's registry, or, in multiprocess mode, one that reads every process's files."""
    directory = _workers_directory
    if not directory:
        return REGISTRY  # this process's values, wherever prometheus_client keeps them
    if directory not in _merged:
        merged = CollectorRegistry()
        merged.register(_OwnFiles(multiprocess.MultiProcessCollector(None, path=directory)))
        merged.register(DATABASE_GAUGES)  # this process's read, the freshest (see _DatabaseGauges)
        _merged[directory] = merged
    return _merged[directory]


class _OwnFiles(Collector):
    """livepush's series of the workers' files, and no other. The project's modules (--app,
    --with-jobs) run in every worker, where prometheus_client writes their own metrics to the
    same folder: added to /metrics, the project's figures would be counted there beside its own
    scrape, as they never are with one process."""

    def __init__(self, files: multiprocess.MultiProcessCollector) -> None:
        self.files = files
        self.names = {family.name for metric in _own_metrics() for family in metric.describe()}  # type: ignore[attr-defined]

    def collect(self) -> Iterable[Metric]:
        return [m for m in self.files.collect() if m.name in self.names]


def _own_metrics() -> list[_OwnValues]:
    """Every metric this module defines (each made with one of the classes above)."""
    return [m for m in globals().values() if isinstance(m, _OwnValues)]


def worker_files(index: int) -> str:
    """What names the files of worker `index` (from 1) in the folder: its index, not its pid."""
    return f"worker{index}"


def add_up_workers(index: int) -> None:
    """In worker `index` of `serve --workers N`: /metrics adds up the files of every worker, in the
    folder its supervisor set as PROMETHEUS_MULTIPROC_DIR. Anywhere else that variable is not
    livepush's (a web app's multiprocess mode, set for a whole container): its files hold that
    app's metrics, which the app's own scrape counts already; added to livepush's /metrics, every
    sum over both scrapes would count them twice."""
    global _workers_directory, _value_class
    _workers_directory = os.environ.get(MULTIPROCESS_DIR_VARIABLE) or None
    if _workers_directory is None:
        return
    # Files named by the worker's index: a worker started in a dead one's place counts on in its
    # predecessor's files (their values are read back), where files named by pid left two more
    # per restart, all read by every scrape, for as long as a worker kept failing its boot. A
    # process this worker forks writes files of its own pid, as prometheus_client's do: two live
    # processes must never write one file.
    me = os.getpid()
    _value_class = values.MultiProcessValue(
        process_identifier=lambda: worker_files(index) if os.getpid() == me else str(os.getpid()))
    for metric in _own_metrics():
        if metric._is_parent():  # type: ignore[attr-defined]
            with metric._lock:  # type: ignore[attr-defined]
                metric._metrics.clear()  # type: ignore[attr-defined]  # label sets made again, in the files
        else:
            metric._metric_init()
    _from_zero()  # in the files too


def forget_worker(index: int, directory: str) -> None:
    """Drop the "live" gauges of worker `index`, which has exited, from the multiprocess files; its
    counters stay, so the sums keep growing across worker restarts. Called before a worker is
    started in its place, which then opens its gauges' files anew."""
    multiprocess.mark_process_dead(worker_files(index), directory)


def _refresh_done(key: int, future: asyncio.Future[None]) -> None:
    _refreshing.pop(key, None)
    _refreshed[key] = time.monotonic()
    if not future.cancelled() and future.exception() is not None:
        DATABASE_GAUGES.forget()
        # Say why once in a while, not at every scrape.
        if time.monotonic() - _warned.get(key, float("-inf")) >= 60.0:
            _warned[key] = time.monotonic()
            log.warning("could not refresh the database gauges of /metrics (left out of it until a read works): %s",
                        future.exception())


def set_queue_gauges(queues: dict[str, tuple[int, float | None, int, bool]], runtimes_alive: int) -> None:
    """Replace the per-queue gauges (depth, oldest age, held by limits, paused): a queue gone from
    the database disappears from the scrape."""
    DATABASE_GAUGES.queues = {queue: (depth, oldest or 0.0, held, paused)
                              for queue, (depth, oldest, held, paused) in queues.items()}
    DATABASE_GAUGES.runtimes_alive = runtimes_alive


# Connections serve() holds at once, at most; past it a new one is closed as it comes. A scraper
# asks one request at a time, and a connection that sends nothing is held until its request times
# out: without a cap, a flood of silent connections took every file descriptor of the runtime, which
# could then open no database connection.
SCRAPES_AT_ONCE = 16


async def serve(host: str, port: int, refreshers: Sequence[Refresher] = (),
                healthy: Callable[[], bool] = lambda: True) -> asyncio.Server:
    """A minimal HTTP server answering GET /metrics, and GET /healthz with 200 while `healthy()`
    (503 otherwise), for a process that has no HTTP port of its own (the job runtime's
    `--metrics-port`): a probe there learns what the server's /healthz says of a runtime beside it."""
    held = 0

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal held
        if held >= SCRAPES_AT_ONCE:
            writer.transport.abort()
            return
        held += 1
        try:
            method, path = await asyncio.wait_for(_read_head(reader), timeout=5.0)
            if isinstance(path, Response):
                await _refuse(reader, writer, http.for_head(path) if method == b"HEAD" else path)
                return
            extra = b""
            if path not in (b"/metrics", b"/healthz"):
                status, ctype, body = b"404 Not Found", b"text/plain", b"not found: GET /metrics\n"
            elif method not in (b"GET", b"HEAD"):
                # Read-only routes, as on the server's port: 405 names what they take.
                status, ctype, body = b"405 Method Not Allowed", b"text/plain", b"use GET or HEAD\n"
                extra = b"Allow: GET, HEAD\r\n"
            elif path == b"/metrics":
                status, ctype, body = b"200 OK", CONTENT_TYPE.encode(), await render(refreshers,
                                                                                    leave_out=SERVER_SERIES)
            elif healthy():
                status, ctype, body = b"200 OK", b"application/json", b'{"status":"ok"}\n'
            else:
                status, ctype, body = b"503 Service Unavailable", b"application/json", b'{"status":"unavailable"}\n'
            writer.write(b"HTTP/1.1 " + status + b"\r\nContent-Type: " + ctype + b"\r\nContent-Length: "
                         + str(len(body)).encode() + b"\r\n" + extra + b"Connection: close\r\n\r\n"
                         + (b"" if method == b"HEAD" else body))  # a HEAD's answer has no body (RFC 9110)
            await writer.drain()
        except (asyncio.TimeoutError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, OSError):
            pass  # a scraper that went away or sent no request: nothing to answer
        finally:
            held -= 1
            writer.close()

    # A line's LF at most MAX_LINE_LENGTH bytes in, as websockets reads the server port's lines.
    return await asyncio.start_server(handle, host, port, limit=MAX_LINE_LENGTH - 1)


async def _read_head(reader: asyncio.StreamReader) -> tuple[bytes, bytes | Response]:
    """The method of a request head, and the path to route by, read within the server port's
    limits (lines of at most MAX_LINE_LENGTH bytes, at most MAX_NUM_HEADERS header lines), or the
    server port's answer to a head past them: 414 for its request line, else 431. The two ports
    answer alike (docs/reference.md#3-commands): this one closed the connection without a word
    on a head over 16 KiB, and answered 404 to a target in absolute form."""
    try:
        request_line = await reader.readuntil(b"\n")
    except asyncio.LimitOverrunError:
        # The line waits in the reader, longer than the limit: its method is among its first bytes.
        return (await reader.readexactly(5)).partition(b" ")[0], http.too_large(RequestLineTooLong())
    method, _, rest = request_line.partition(b" ")
    for _ in range(MAX_NUM_HEADERS + 1):
        try:
            line = await reader.readuntil(b"\n")
        except asyncio.LimitOverrunError:
            return method, http.too_large(HeaderLineTooLong())
        if line.strip(b"\r\n") == b"":
            break
    else:
        return method, http.too_large(TooManyHeaders())
    return method, http.route(rest.partition(b" ")[0].decode("latin-1")).encode("latin-1")


async def _refuse(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, answer: Response) -> None:
    """Send `answer` to a head past the limits, then take the rest of the head until the client
    ends (at most 5 s): closed with its bytes unread, the connection would be reset, and the
    client lose the answer."""
    writer.write(answer.serialize())
    if writer.can_write_eof():
        writer.write_eof()
    await writer.drain()
    with contextlib.suppress(asyncio.TimeoutError):
        async with asyncio.timeout(5.0):
            while await reader.read(64 * 1024):
                pass
