"""The state topics of jobs and groups (job:<id>, group:<id>): owned by their rows. Each change
is one new version that rings `livepush_states` at commit, and only then; what the server reads
(JobStates) is what the jobs API says; a ring is a hint that is never believed."""

from __future__ import annotations

import asyncio
import datetime
import json
import secrets
import time
import uuid
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from psycopg.rows import dict_row

import livepush
from livepush import jobs
from livepush.jobs import queries
from livepush.jobs.events.source import MAX_LINES, JobStates, Ring, parse_ring
from livepush.jobs.events.views import GROUP_KEYS
from livepush.jobs.groups import queries as group_queries
from livepush.types import State
from livepush.jobs.runtime.completer import complete_params
from tests.jobs import sample_jobs
from tests.jobs.conftest import events_of, group_events, names_of, q, read_states, versions_of
from tests.support.services import dbname_of
from tests.support.waiting import async_wait_for

NOTIFY_LIMIT = 8000  # bytes: Postgres refuses a longer notification payload


class Rings:
    """What one test connection hears on `livepush_states` (and the other channels named).

    `sync()` is a barrier without sleeping: it rings a marker from this connection and returns
    what was heard before it. Postgres delivers notifications in commit order, so that is every
    ring of every transaction that committed before the call, and nothing of one still open."""

    def __init__(self, url: str, *channels: str) -> None:
        self.conn = psycopg.connect(url, autocommit=True)
        self.channels = (queries.STATE_CHANNEL, *channels)
        for channel in self.channels:
            self.conn.execute(f"LISTEN {channel}")  # type: ignore[arg-type]
        self.heard: list[tuple[str, str]] = []  # (channel, payload) not yet returned by sync()

    def sync(self, timeout: float = 10.0) -> list[tuple[str, str]]:
        marker = f"test-marker-{uuid.uuid4().hex}"
        self.conn.execute("SELECT pg_notify(%s, %s)", (queries.STATE_CHANNEL, marker))
        deadline = time.monotonic() + timeout
        while (queries.STATE_CHANNEL, marker) not in self.heard:
            left = deadline - time.monotonic()
            assert left > 0, f"timed out after {timeout:g} s waiting for our own marker; heard {self.heard[-5:]}"
            for n in self.conn.notifies(timeout=left, stop_after=1):
                self.heard.append((n.channel, n.payload))
        end = self.heard.index((queries.STATE_CHANNEL, marker))
        got, self.heard = self.heard[:end], self.heard[end + 1:]
        return got

    def states(self) -> list[str]:
        """sync(), keeping the payloads on livepush_states."""
        return [payload for channel, payload in self.sync() if channel == queries.STATE_CHANNEL]

    def states_until(self, line: tuple[str, int | None], timeout: float = 10.0) -> list[str]:
        """The payloads on livepush_states heard until one names `line` (at most `timeout` s)."""
        got: list[str] = []
        deadline = time.monotonic() + timeout
        while line not in lines(got):
            left = deadline - time.monotonic()
            assert left > 0, f"timed out after {timeout:g} s waiting for {line}; heard {got[-5:]}"
            for n in self.conn.notifies(timeout=left, stop_after=1):
                if n.channel == queries.STATE_CHANNEL:
                    got.append(n.payload)
        return got

    def close(self) -> None:
        self.conn.close()


def lines(payloads: list[str]) -> list[tuple[str, int | None]]:
    """The (topic, version or None) lines of livepush_states payloads, read by this test's own
    parser (not parse_ring, which is tested below); a creation range "job:FIRST-LAST" stands
    for each of its jobs at version 1."""
    out: list[tuple[str, int | None]] = []
    for payload in payloads:
        for line in payload.split("\n"):
            topic, _, version = line.partition(" ")
            kind, _, ids = topic.partition(":")
            first, dash, last = ids.partition("-")
            if dash:
                out.extend((f"{kind}:{i}", 1) for i in range(int(first), int(last) + 1))
            else:
                out.append((topic, int(version) if version else None))
    return out


@pytest.fixture
def rings(jobs_db: str) -> Iterator[Rings]:
    """A connection listening on livepush_states from the start of the test."""
    r = Rings(jobs_db)
    try:
        yield r
    finally:
        r.close()


# -- versions and rings ---------------------------------------------------------------------

def test_an_enqueue_rings_its_version_at_commit_and_a_rollback_rings_nothing(jobs_db: str, rings: Rings) -> None:
    """An enqueue (and a group's creation) in the caller's transaction rings job:<id> at version
    1 (group:<id> without one) when it commits, not before; a rolled-back one rings nothing."""
    with psycopg.connect(jobs_db) as conn:
        gone = sample_jobs.record.enqueue("gone", conn=conn)
        gone_many = jobs.enqueue_many([sample_jobs.record.request(i) for i in range(3)], conn=conn)
        gone_group = jobs.create_group(conn=conn)
        assert rings.states() == []  # still open
        conn.rollback()
        kept = sample_jobs.record.enqueue("kept", conn=conn)
        kept_many = jobs.enqueue_many([sample_jobs.record.request(i) for i in range(2)], conn=conn)
        kept_group = jobs.create_group(conn=conn)
        assert rings.states() == []  # the rollback rang nothing; the new transaction is still open
        conn.commit()
    assert lines(rings.states()) == [(kept.topic, 1), *((h.topic, 1) for h in kept_many), (kept_group.topic, None)]
    for h in (gone, *gone_many):
        assert versions_of(jobs_db, h.id) == [] and jobs.job_state(h.id) is None
    assert jobs.get_group(gone_group.id) is None
    assert [e["event"] for e in events_of(jobs_db, kept.id)] == ["enqueued"]


def test_every_version_of_every_job_is_rung_once_in_order(jobs_db: str, rings: Rings) -> None:
    """Through drain, retries, progress, failure, retry_failed, cancel, the rescue of a dead
    runtime's job, the release of a deregistering runtime's job and a group with a callback:
    every committed version of every job was rung at most once, as "job:<id> <version>", in
    version order, and nothing else was rung for a job; every version but a claim's `started`
    was rung, and so was every job's last one (the claim rings nothing: a runtime rings its
    `started` with its next statement, unless that statement rings a later version of the job,
    and the claims this test makes by hand have no runtime behind them); a group rang at least
    once for each event livepush recorded for it."""
    from psycopg_pool import AsyncConnectionPool

    from livepush.jobs.runtime import maintenance
    from tests.jobs import group_jobs as gj

    q(jobs_db, gj.CALLBACK_RUNS_TABLE)
    handles = [
        sample_jobs.progress.enqueue(3),
        sample_jobs.flaky.enqueue(1),  # retried once, at once
        sample_jobs.never.enqueue(),  # failed, then retried by hand below
        sample_jobs.record.enqueue(wait=60),  # scheduled, then cancelled
        sample_jobs.record.enqueue("cancelled"),
        sample_jobs.other_queue.enqueue("rescued"),
        sample_jobs.other_queue.enqueue("given back"),
    ]
    with jobs.group(on_finish=gj.callback.request("fin")) as g:
        for i in range(3):
            g.enqueue(gj.member, i)
    assert jobs.cancel(handles[3].id) and jobs.cancel(handles[4].id)
    (alive,) = q(jobs_db, "INSERT INTO livepush_job_runtimes (host, pid, queues, concurrency, heartbeat) "
                          "VALUES ('test', 0, '{second}', 1, 3600) RETURNING id")[0]

    async def claim_rescue_and_give_back() -> None:
        async with AsyncConnectionPool(jobs_db, min_size=1, max_size=2, open=False) as pool:
            async with pool.connection() as conn:
                for runtime_id in (alive + 1000, alive):  # a runtime with no row (dead), then a live one
                    await conn.execute(queries.CLAIM, {"queue": "second", "limit": 1, "excluded": [],
                                                       "runtime_id": runtime_id})
                    await conn.commit()
            rescued, _ = await maintenance.rescue(pool, alive)
            given_back, _ = await maintenance.deregister(pool, alive)
        assert [r["id"] for r in rescued] == [handles[5].id] and given_back == 1

    asyncio.run(claim_rescue_and_give_back())
    assert names_of(jobs_db, handles[5].id) == ["enqueued/available", "started/running", "retrying/available"]
    assert names_of(jobs_db, handles[6].id) == ["enqueued/available", "started/running", "enqueued/available"]
    jobs.drain()
    assert jobs.retry_failed(handles[2].id)
    jobs.drain()
    rung = lines(rings.states())
    recorded = q(jobs_db, "SELECT 'job:' || id, version, event FROM test_job_versions ORDER BY seq")
    job_rings = [(t, v) for t, v in rung if t.startswith("job:")]
    assert len(set(job_rings)) == len(job_rings) and set(job_rings) <= {(t, v) for t, v, _ in recorded}
    assert {(t, v) for t, v, event in recorded if event != "started"} <= set(job_rings)
    topics = {t for t, _, _ in recorded}
    assert len(topics) == len(handles) + 3 + 1  # the jobs, the members, the callback
    for topic in topics:
        mine = [v for t, v in job_rings if t == topic]
        assert mine == sorted(mine) and mine[-1] == len(events_of(jobs_db, int(topic[4:]))), (topic, mine)
    group_rings = [v for t, v in rung if t == g.handle.topic]
    assert set(group_rings) == {None} and len(group_rings) >= len(group_events(g.handle.id))
    assert {t for t, _ in rung} == topics | {g.handle.topic}


def test_each_statement_on_a_running_job_is_one_version_fenced_by_the_lease(jobs_db: str, rings: Rings) -> None:
    """The claim is the job's `started` (attempt 1, running; it rings nothing itself); a progress
    write or an outcome under another lease than the claim's changes nothing, bumps no version and
    rings nothing; under the claim's lease each is one version, rung once."""
    h = sample_jobs.record.enqueue("fenced")
    progress = json.dumps({"done": 1, "total": 2, "message": "half"})

    def write_progress(conn: psycopg.Connection, lease: int) -> list[Any]:
        params = {"ids": [h.id], "leases": [lease], "progress": [progress]}
        return conn.execute(queries.WRITE_PROGRESS, params).fetchall()

    def complete(conn: psycopg.Connection, lease: int) -> list[Any]:
        return conn.execute(queries.COMPLETE, complete_params([(h.id, lease, "succeeded", None, 0.0, None, None)])).fetchall()

    with psycopg.connect(jobs_db, autocommit=True) as conn:
        with conn.cursor(row_factory=dict_row) as cur:
            (claimed,) = cur.execute(queries.CLAIM, {"queue": "default", "limit": 1, "excluded": [],
                                                     "runtime_id": 1}).fetchall()
        lease = claimed["lease"]
        assert write_progress(conn, lease + 1) == [] and complete(conn, lease + 1) == []
        assert names_of(jobs_db, h.id) == ["enqueued/available", "started/running"]
        assert write_progress(conn, lease) == [(h.id,)]
        assert [r[0] for r in complete(conn, lease)] == [h.id]
        assert write_progress(conn, lease) == [] and complete(conn, lease) == []
    evs = events_of(jobs_db, h.id)
    assert [e["event"] for e in evs] == ["enqueued", "started", "progress", "succeeded"]
    assert evs[1]["job"]["attempt"] == 1
    assert evs[2]["job"]["progress"] == evs[3]["job"]["progress"] == {"done": 1, "total": 2, "message": "half"}
    assert lines(rings.states()) == [(h.topic, v) for v in (1, 3, 4)]


async def test_a_runtime_rings_a_long_jobs_started_while_it_runs(jobs_db: str, rings: Rings) -> None:
    """A job that runs for a while has its `started` version rung by its runtime shortly after the
    claim, long before its outcome."""
    from livepush.jobs.runtime.runtime import Runtime

    running = asyncio.Event()
    finish = asyncio.Event()

    @jobs.job(name="t.states.long", queue="long")
    async def long_job(ctx: Any) -> None:
        running.set()
        await asyncio.wait_for(finish.wait(), 30)

    runtime = Runtime(queues=["long"], install_signals=False, heartbeat=0.5, poll_interval=0.05)
    task = asyncio.create_task(runtime.run())
    try:
        await runtime.wait_started()
        h = await long_job.aenqueue()
        await asyncio.wait_for(running.wait(), 10)
        states = await asyncio.to_thread(rings.states_until, (h.topic, 2), 5.0)
        assert (h.topic, 2) in lines(states)
        assert (await asyncio.to_thread(jobs.job_state, h.id))["state"] == "running"  # type: ignore[index]
        finish.set()
    finally:
        finish.set()
        runtime.stop()
        await asyncio.wait_for(task, 15)


def test_a_lone_enqueue_and_a_batch_write_the_same_first_version(jobs_db: str, rings: Rings) -> None:
    """enqueue() of one job (queries.ENQUEUE_ONE) and enqueue_many() (queries.ENQUEUE), sync
    and async, all write version 1, `enqueued`, showing the job as job_state() does, and ring it."""

    async def from_async() -> list[jobs.JobHandle]:
        return [await sample_jobs.record.aenqueue("async solo", wait=60),
                *await jobs.aenqueue_many([sample_jobs.record.request("async a"), sample_jobs.flaky.request(1)])]

    one = sample_jobs.record.enqueue("solo")
    many = jobs.enqueue_many([sample_jobs.record.request("a"), (sample_jobs.record, ["b"], {"wait": 60})])
    handles = [one, *many, *asyncio.run(from_async())]
    for h in handles:
        assert events_of(jobs_db, h.id) == [{"event": "enqueued", "job": jobs.job_state(h.id)}]
    assert [e["job"]["state"] for h in handles for e in events_of(jobs_db, h.id)] == \
        ["available", "available", "scheduled", "scheduled", "available", "available"]
    assert lines(rings.states()) == [(h.topic, 1) for h in handles]


def test_a_batch_of_1000_rings_its_id_range_in_one_line(jobs_db: str, rings: Rings) -> None:
    """enqueue_many() of 1,000 jobs rings one line naming their id range, however many jobs;
    livepush_state_changed() chunks topics and versions of the largest size in notifications
    under Postgres' 8,000-byte limit, each of at most the lines parse_ring reads."""
    handles = jobs.enqueue_many([sample_jobs.record.request(i) for i in range(1000)])
    payloads = rings.states()
    ids = [h.id for h in handles]
    assert payloads == [f"job:{min(ids)}-{max(ids)}"] and sorted(ids) == list(range(min(ids), max(ids) + 1))
    assert parse_ring(payloads[0]).created == [("job:", min(ids), max(ids))]
    biggest = 2**63 - 1
    with psycopg.connect(jobs_db, autocommit=True) as conn:
        conn.execute("SELECT livepush_state_changed(array_agg('job:' || (%(n)s - g) ORDER BY g), "
                     "array_agg(%(n)s - g ORDER BY g)) FROM generate_series(0, 999) g", {"n": biggest})
    large = rings.states()
    assert lines(large) == [(f"job:{biggest - g}", biggest - g) for g in range(1000)]
    for payload in large:
        assert len(payload.encode()) < NOTIFY_LIMIT and payload.count("\n") < MAX_LINES
        assert len(parse_ring(payload).changed) == payload.count("\n") + 1


def test_a_batch_of_300_outcomes_completes_every_job_once(jobs_db: str, rings: Rings) -> None:
    """One completion statement for 300 running jobs (successes, retries with errors, final
    progress) moves each job once, keeps errors and progress, and writes and rings one version
    each."""
    handles = jobs.enqueue_many([sample_jobs.record.request(i) for i in range(300)])
    ids = [h.id for h in handles]
    kinds = ["succeeded" if i % 3 else "retry" for i in range(300)]
    rings.sync()
    with psycopg.connect(jobs_db, autocommit=True) as conn, conn.cursor(row_factory=dict_row) as cur:
        cur.execute("UPDATE livepush_jobs SET state = 'running', attempt = 1, lease = id WHERE id = ANY(%s)", (ids,))
        rows = cur.execute(queries.COMPLETE, complete_params(
            (job_id, job_id, kind, None if kind == "succeeded" else "E: no", 60.0, {"done": i, "total": 300, "message": None},
             None) for i, (job_id, kind) in enumerate(zip(ids, kinds)))).fetchall()
        assert sorted(r["id"] for r in rows) == ids
        cur.execute("SELECT j.id, j.state, coalesce(p.error, '') AS error, p.progress->>'done' AS done "
                    "FROM livepush_jobs j JOIN livepush_job_payloads p USING (id) WHERE j.id = ANY(%s)", (ids,))
        states = {r["id"]: f"{r['state']}/{r['error']}/{r['done']}" for r in cur.fetchall()}
    for i, job_id in enumerate(ids):
        expected = f"succeeded//{i}" if kinds[i] == "succeeded" else f"scheduled/E: no/{i}"
        assert states[job_id] == expected
    last = events_of(jobs_db, ids[1])
    assert [e["event"] for e in last] == ["enqueued", "succeeded"] and last[-1]["job"]["progress"]["done"] == 1
    retried = events_of(jobs_db, ids[0])
    assert [e["event"] for e in retried] == ["enqueued", "retrying"] and retried[-1]["job"]["error"] == "E: no"
    assert sorted(lines(rings.states())) == sorted((h.topic, 2) for h in handles)


def _nodes(plan: dict[str, Any]) -> list[dict[str, Any]]:
    return [plan, *(n for child in plan.get("Plans", []) for n in _nodes(child))]


def test_a_large_batch_reads_its_arrays_once(jobs_db: str) -> None:
    """The completer's statements over a batch larger than PREPARED_BATCH_MAX (progress,
    outcomes, outcomes of group members), executed as the completer does (planned for their
    size), never re-read a batch parameter (an array, or the outcomes' JSON) per row: the quadratic plan that made one batch of
    3,570 starts take 1.5 s."""
    from livepush.jobs.runtime.completer import PREPARED_BATCH_MAX

    n = PREPARED_BATCH_MAX * 4
    with jobs.group() as g:
        for i in range(n):
            g.enqueue(sample_jobs.record, i)
    ids = [h.id for h in g.members]
    # A table the size where the generic plan goes wrong: its statistics say that a lookup of a
    # few ids finds one row.
    q(jobs_db, "INSERT INTO livepush_jobs (queue, name, state) SELECT 'default', 'old', 'succeeded' "
               "FROM generate_series(1, 20000)")
    q(jobs_db, "ANALYZE livepush_jobs")
    outcome = complete_params([(i, i, "succeeded", None, 0.0, None, None) for i in ids], [(i, 2) for i in ids])
    progress = {"ids": ids, "leases": ids, "progress": [json.dumps({"done": 1, "total": 2, "message": None})] * n}
    with psycopg.connect(jobs_db) as conn:
        for sql, params in ((queries.WRITE_PROGRESS, progress), (queries.COMPLETE, outcome),
                            (group_queries.COMPLETE_COUNTING, outcome)):
            conn.execute("UPDATE livepush_jobs SET state = 'running', attempt = 1, lease = id WHERE id = ANY(%s)",
                         (ids,))
            plan = conn.execute("EXPLAIN (ANALYZE, FORMAT JSON) " + sql, params,
                                prepare=False).fetchone()[0][0]["Plan"]  # type: ignore[index]
            rescans = [node for node in _nodes(plan)
                       if node["Node Type"] == "Function Scan" and node["Actual Loops"] > 1]
            assert not rescans, (sql[:40], rescans)
            conn.rollback()


# -- what the server reads --------------------------------------------------------------------

@jobs.job(name='t.odd "name" \\ é\u2028', queue='q "odd" \t ü')
async def oddly_named(ctx: Any) -> None:
    pass


def test_the_state_a_server_reads_is_what_job_state_and_get_group_say(jobs_db: str) -> None:
    """JobStates.read() (what the server sends) gives, for jobs in every state (names and
    queues that need escaping, progress, errors, running under a claim) and for a group before
    and after it finished: the view job_state()/get_group() give, the last recorded version and
    its event, run_at in UTC whatever the session's time zone; nothing for unknown ids or other
    topics."""
    from tests.jobs import group_jobs as gj

    q(jobs_db, gj.CALLBACK_RUNS_TABLE)
    q(jobs_db, f'ALTER DATABASE "{dbname_of(jobs_db)}" SET timezone = \'Asia/Kolkata\'')
    jobs.configure(jobs_db)  # new connections: they take the database's time zone
    at = datetime.datetime(2031, 5, 6, 7, 8, 9, 123456, tzinfo=datetime.timezone.utc)
    odd, odd_later = jobs.enqueue_many([oddly_named.request(), (oddly_named, [], {"at": at})])
    done = sample_jobs.odd_progress.enqueue(2.5, 'héllo "q" \\ \u2028')
    failed = sample_jobs.never.enqueue()
    running = sample_jobs.other_queue.enqueue("claimed")
    with jobs.group(on_finish=gj.callback.request("fin")) as g:
        g.enqueue(gj.member, "a")
        g.enqueue(gj.member, "b")

    def group_state() -> tuple[State, dict[str, Any]]:
        state = read_states(jobs_db, [g.handle.topic])[g.handle.topic]
        view = jobs.get_group(g.handle.id)
        assert view is not None and json.loads(state.view_json) == {k: view[k] for k in GROUP_KEYS}
        (version,) = q(jobs_db, "SELECT g.version + (SELECT sum(s.version) FROM livepush_group_shards s "
                                "WHERE s.group_id = g.id) FROM livepush_groups g WHERE g.id = %s",
                       (g.handle.id,))[0]
        assert state.version == version and state.event == group_events(g.handle.id)[-1]["event"]
        return state, view

    before, _ = group_state()
    assert before.event == "created"
    assert jobs.drain(["default"]) == {"succeeded": 4, "failed": 1}  # two members, their callback, done, failed
    with psycopg.connect(jobs_db, autocommit=True) as conn, conn.cursor(row_factory=dict_row) as cur:
        (claim,) = cur.execute(queries.CLAIM, {"queue": "second", "limit": 1, "excluded": [], "runtime_id": 1}).fetchall()
        cur.execute(queries.WRITE_PROGRESS, {"ids": [running.id], "leases": [claim["lease"]],
                                             "progress": [json.dumps({"done": 1, "total": None, "message": "on"})]})
    after, view = group_state()
    assert (after.event, view["state"], view["succeeded"]) == ("finished", "finished", 2)
    assert after.version > before.version
    (callback,) = q(jobs_db, "SELECT id FROM livepush_jobs WHERE callback_of = %s", (g.handle.id,))[0]

    handles = [odd, odd_later, done, failed, running, *g.members]
    topics = [h.topic for h in handles] + [f"job:{callback}"]
    states = read_states(jobs_db, topics)
    assert set(states) == set(topics)
    for topic in topics:
        job_id = int(topic.split(":")[1])
        state, evs, view = states[topic], events_of(jobs_db, job_id), jobs.job_state(job_id)
        assert view is not None and json.loads(state.view_json) == view == evs[-1]["job"], topic
        assert (state.version, state.event) == (len(evs), evs[-1]["event"]), topic
        assert json.loads(state.data_json()) == {"event": state.event, "job": view}
        assert json.loads(state.data_json(snapshot=True)) == {"event": "snapshot", "job": view}
        (run_at,) = q(jobs_db, "SELECT run_at FROM livepush_jobs WHERE id = %s", (job_id,))[0]
        assert view["run_at"].endswith("+00:00") and datetime.datetime.fromisoformat(view["run_at"]) == run_at
    assert json.loads(states[odd.topic].view_json)["name"] == 't.odd "name" \\ é\u2028'
    assert json.loads(states[odd.topic].view_json)["queue"] == 'q "odd" \t ü'
    assert json.loads(states[odd_later.topic].view_json)["run_at"] == "2031-05-06T07:08:09.123456+00:00"
    assert [json.loads(states[h.topic].view_json)["state"] for h in handles[:5]] == \
        ["available", "scheduled", "succeeded", "failed", "running"]
    assert json.loads(states[done.topic].view_json)["progress"] == {"done": 2.5, "total": 10,
                                                                   "message": 'héllo "q" \\ \u2028'}
    assert json.loads(states[failed.topic].view_json)["error"] == "ValueError: bad input"
    assert states[running.topic].event == "progress"
    assert read_states(jobs_db, ["job:999999999", "group:999999999", "job:x", "chat:1"]) == {}


def test_jobs_write_nothing_to_the_message_log(jobs_db: str) -> None:
    """Jobs and groups never touch the message log: publish() refuses their topics, nothing is
    rung on `livepush`, no log row names them, and a transaction holding a log row of job:<id>
    open (written in SQL) neither blocks that job's enqueue nor changes its versions."""
    import concurrent.futures

    with pytest.raises(livepush.InvalidTopic):
        livepush.publish("job:1", {"forged": True})
    with pytest.raises(livepush.InvalidTopic):
        livepush.publish("group:1", {"forged": True})
    log = Rings(jobs_db, "livepush")
    try:
        with psycopg.connect(jobs_db) as other, concurrent.futures.ThreadPoolExecutor(1) as pool:
            try:
                (last,) = other.execute("SELECT nextval('livepush_jobs_id_seq')").fetchone()  # type: ignore[misc]
                other.execute("SELECT livepush_publish(%s, '\"early\"')", (f"job:{last + 1}",))
                # An enqueue that wrote the topic's log row would wait for `other` here.
                h = pool.submit(sample_jobs.progress.enqueue, 2).result(timeout=10)
                assert h.id == last + 1
                with jobs.group() as g:
                    g.enqueue(sample_jobs.record, "member")
                assert jobs.drain() == {"succeeded": 2}
            finally:
                other.rollback()
        heard = log.sync()
    finally:
        log.close()
    names = [e["event"] for e in events_of(jobs_db, h.id)]  # versions 1, 2, 3... as if no log row existed
    assert names[:2] == ["enqueued", "started"] and set(names[2:-1]) == {"progress"} and names[-1] == "succeeded"
    assert {channel for channel, _ in heard} == {queries.STATE_CHANNEL}
    assert {t.split(":")[0] for t, _ in lines([p for _, p in heard])} == {"job", "group"}
    assert q(jobs_db, "SELECT count(*) FROM livepush_topics") == [(0,)]
    assert q(jobs_db, "SELECT count(*) FROM livepush_messages") == [(0,)]


# -- a ring is only a hint ----------------------------------------------------------------------

@pytest.mark.parametrize("line", [
    "job:0001 3", "job:0 1", "group:07", "job:1 -1", "job:1 1.5", "job:1  2", " job:1", "job:1 ", "job:1\r",
    "job:+1", "job:1_0", "job:\u0661", "job:1 \u0662", "workflows:1 2", "jobs:1", "job:", "job", "job 1",
    "job:9223372036854775808", "job:92233720368547758070 1", "job:1 99999999999999999999", "job:1 2 3",
    "job:1,job:2", "job:1\x00", "", "job:5-4", "job:0-3", "job:1-0", "job:1-", "job:-1", "job:1-2 1",
    "job:1-9223372036854775808", "job:1--2", "job:1-\u0662", "job:1-2-3",
])
def test_parse_ring_drops_a_malformed_line(line: str) -> None:
    """A line that is not "job:<id> [<version>]", "group:<id> [<version>]", "workflow:<id> [<version>]" or an id range
    "job:<first>-<last>" (first <= last) in canonical ASCII decimal (ids within a bigint) is
    dropped, and the lines around it are kept."""
    ring = parse_ring(f"job:1 2\n{line}\ngroup:3\njob:4-6")
    assert ring.changed == [("job:1", 2), ("group:3", None)] and ring.created == [("job:", 4, 6)]


def test_parse_ring_reads_what_livepush_rings_and_no_more() -> None:
    """parse_ring() reads the lines livepush_state_changed() writes, the largest ids and versions
    included, and at most MAX_LINES of them (what one of its notifications holds)."""
    biggest = 2**63 - 1
    assert parse_ring(f"job:{biggest} {biggest}\ngroup:{biggest}\njob:5 1").changed == \
        [(f"job:{biggest}", biggest), (f"group:{biggest}", None), ("job:5", 1)]
    assert parse_ring(f"job:7-7\njob:1-{biggest}").created == [("job:", 7, 7), ("job:", 1, biggest)]
    assert parse_ring("\n".join(f"job:{i} 1" for i in range(1, MAX_LINES + 50))).changed == \
        [(f"job:{i}", 1) for i in range(1, MAX_LINES + 1)]
    assert parse_ring("") == parse_ring("\n\n") == Ring()


async def test_a_forged_ring_only_makes_the_server_read_the_rows(jobs_db: str) -> None:
    """A role without privileges on livepush's tables can ring livepush_states (Postgres has no
    privileges on NOTIFY): JobStates hands on only the lines that parse, and what it then reads
    is the rows' state, not the forged version."""
    h = await sample_jobs.record.aenqueue("real")
    g = await asyncio.to_thread(jobs.create_group)
    role = f"test_nobody_{secrets.token_hex(6)}"
    await asyncio.to_thread(q, jobs_db, f'CREATE ROLE "{role}" LOGIN')
    source = JobStates(jobs_db)
    heard: list[tuple[str, int | None]] = []
    created: list[tuple[str, int, int]] = []
    try:
        source.watch(lambda topic, version: heard.append((topic, version)), lambda: None,
                     lambda prefix, first, last: created.append((prefix, first, last)))
        await source.listen()
        nobody = psycopg.conninfo.make_conninfo(jobs_db, user=role)
        async with await psycopg.AsyncConnection.connect(nobody, autocommit=True) as conn:
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                await conn.execute("SELECT * FROM livepush_jobs")
            forged = f"{h.topic} 999\nnot a topic\njob:0{h.id} 5\n{g.topic}\njob:{h.id}; DROP TABLE x\njob:1-{2**63 - 1}"
            await conn.execute("SELECT pg_notify('livepush_states', %s)", (forged,))
        await async_wait_for(lambda: heard, 5.0, message="the forged ring")
        assert heard == [(h.topic, 999), (g.topic, None)] and created == [("job:", 1, 2**63 - 1)]
        states = await source.read([t for t, _ in heard])
        assert (states[h.topic].version, states[h.topic].event) == (1, "enqueued")
        assert states[g.topic].event == "created"
    finally:
        await source.aclose()
        await asyncio.to_thread(q, jobs_db, f'DROP ROLE "{role}"')
    assert names_of(jobs_db, h.id) == ["enqueued/available"]

