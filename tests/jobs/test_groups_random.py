"""Randomized interleavings of seal, add (from inside), finish, fail, retry and cancel, through
the real SQL on several connections at once; the invariants hold for every seed.

Each worker thread owns one connection and runs one command at a time; the driver gives a
command to an idle worker and waits a moment: a command blocked on another transaction's lock
stays blocked (its worker is busy) while the driver goes on, so transactions really overlap
and wait on each other as they would between runtimes. Nothing here models the database.
"""

from __future__ import annotations

import json
import queue
import random
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest
from psycopg.rows import dict_row

from livepush import jobs
from livepush.jobs import queries
from livepush.jobs.api.enqueue import Batch
from livepush.jobs.errors import GroupClosedError, LeaseLostError
from livepush.jobs.groups import building, outcomes, steps
from livepush.jobs.groups import queries as gq
from livepush.jobs.runtime.completer import complete_params
from tests.jobs import group_jobs as gj
from tests.jobs.conftest import events_of, group_events, q, read_states

SEEDS = 30
STEPS = 60
OK_ERRORS = (psycopg.errors.DeadlockDetected, LeaseLostError, GroupClosedError)


class Worker:
    """One connection in its own thread; `submit` a function of the connection."""

    def __init__(self, url: str) -> None:
        self.conn = psycopg.connect(url, autocommit=False)
        self.inbox: queue.Queue[Any] = queue.Queue()
        self.done = threading.Event()
        self.done.set()
        self.error: BaseException | None = None
        self.in_tx = False
        self.holding: set[int] = set()  # jobs this worker's open transaction is about
        self.after_commit: Callable[[], None] | None = None
        self.thread = threading.Thread(target=self._loop, daemon=True)
        self.thread.start()

    def _loop(self) -> None:
        while True:
            fn = self.inbox.get()
            if fn is None:
                return
            try:
                fn(self.conn)
            except OK_ERRORS:
                self.conn.rollback()
                self.in_tx = False
                self.after_commit = None
                self.holding = set()
            except BaseException as exc:  # reported by the test
                self.error = exc
                self.conn.rollback()
                self.in_tx = False
                self.holding = set()
            finally:
                self.done.set()

    def submit(self, fn: Callable[[psycopg.Connection], None], wait: float = 0.05) -> bool:
        self.done.clear()
        self.inbox.put(fn)
        return self.done.wait(wait)

    @property
    def idle(self) -> bool:
        return self.done.is_set()

    def close(self) -> None:
        self.inbox.put(None)
        self.thread.join(10)
        self.conn.close()


def claim(conn: psycopg.Connection, runtime_id: int, limit: int) -> list[dict[str, Any]]:
    with conn.cursor(row_factory=dict_row) as cur:
        cur.execute(queries.CLAIM, {"queue": "default", "excluded": [], "limit": limit, "runtime_id": runtime_id})
        rows = cur.fetchall()
    conn.commit()
    return rows


def _outcome_params(job: dict[str, Any], kind: str) -> dict[str, Any]:
    return complete_params([(job["id"], job["lease"], kind, "boom" if kind != "succeeded" else None, 0.0, None, None)])


def outcome(conn: psycopg.Connection, job: dict[str, Any], kind: str, counting: bool = True) -> list[dict[str, Any]]:
    """The completer's transaction for one outcome, left open: COMPLETE_COUNTING then the finish
    of any group whose shard it drained (what the completer runs for group members), or, with
    counting=False, COMPLETE then the count (the path of the other outcomes: cancel, rescue).
    Both record progress as a runtime without a progress publisher would (steps.progress_now)."""
    with conn.cursor(row_factory=dict_row) as cur:
        cur.execute(gq.COMPLETE_COUNTING if counting else queries.COMPLETE, _outcome_params(job, kind))
        rows = cur.fetchall()
    if counting:
        touched = steps.run(conn, steps.counted_shards((rows[0]["_shards"] or []) if rows else []))
    else:
        touched = steps.run(conn, outcomes.ended(rows))
    steps.run(conn, steps.progress_now(sorted(touched)))
    return rows


def add_inside(conn: psycopg.Connection, job: dict[str, Any]) -> None:
    """ctx.group.enqueue of a running member, left open."""
    batch = Batch()
    batch.add(gj.member, ["added"], None, job["group_id"])
    steps.run(conn, building.add_steps(job["group_id"], batch, states=["open", "sealed"],
                                       fence=(job["id"], job["lease"])))
    steps.run(conn, steps.progress_now([job["group_id"]]))


def seal(conn: psycopg.Connection, group_id: int) -> None:
    steps.run(conn, building._seal_steps(group_id))


@pytest.fixture
def groups_db(jobs_db: str) -> Iterator[str]:
    q(jobs_db, gj.CALLBACK_RUNS_TABLE)
    yield jobs_db


def run_seed(url: str, seed: int) -> dict[str, int]:
    rnd = random.Random(seed)
    runtime_id = q(url, "INSERT INTO livepush_job_runtimes (host, pid, queues, concurrency, heartbeat) "
                        "VALUES ('test', 0, '{default}', 1, 3600) RETURNING id")[0][0]
    gids: list[int] = []
    for i in range(3):
        cbs = dict(on_finish=gj.callback.request("fin"), on_success=gj.callback.request("ok"),
                   on_failure=gj.callback.request("bad"))
        if rnd.random() < 0.5:
            with jobs.group(**cbs) as g:
                for k in range(rnd.randint(0, 5)):
                    g.enqueue(gj.member, k)
            gids.append(g.handle.id)
        else:
            h = jobs.create_group(**cbs)
            jobs.add_many_to_group(h.id, [gj.member.request(k) for k in range(rnd.randint(0, 5))])
            gids.append(h.id)
    workers = [Worker(url) for _ in range(4)]
    running: dict[int, dict[str, Any]] = {}  # claimed, outcome not committed

    def busy() -> set[int]:
        return set().union(*(x.holding for x in workers))
    cancels: list[threading.Thread] = []
    try:
        for _ in range(STEPS):
            idle = [w for w in workers if w.idle]
            op = rnd.choice(["claim", "outcome", "outcome", "add", "seal", "commit", "commit", "rollback",
                             "cancel", "promote"])
            if not idle and op not in ("cancel",):
                continue
            w = rnd.choice(idle) if idle else None
            if op == "claim" and w is not None and not w.in_tx:
                got: list[dict[str, Any]] = []
                w.submit(lambda c, got=got: got.extend(claim(c, runtime_id, 2)), wait=1.0)
                for r in got:
                    if r["group_id"] is not None:
                        running[r["id"]] = r
            elif op == "outcome" and w is not None and not w.in_tx:
                free = [j for j in running.values() if j["id"] not in busy()]
                if free:
                    job = rnd.choice(free)
                    kind = rnd.choice(["succeeded", "succeeded", "retry", "fail", "cancelled"])
                    counting = rnd.random() < 0.5
                    w.holding = {job["id"]}
                    w.in_tx = True

                    def after(job: dict[str, Any] = job) -> None:
                        running.pop(job["id"], None)
                    w.after_commit = after
                    w.submit(lambda c, job=job, kind=kind, counting=counting: outcome(c, job, kind, counting))
            elif op == "add" and w is not None and not w.in_tx:
                live = [j for j in running.values() if j["id"] not in busy()]
                if live:
                    job = rnd.choice(live)
                    w.holding = {job["id"]}
                    w.in_tx = True
                    w.submit(lambda c, job=job: add_inside(c, job))
            elif op == "seal" and w is not None and not w.in_tx:
                w.in_tx = True
                w.submit(lambda c, gid=rnd.choice(gids): seal(c, gid))
            elif op in ("commit", "rollback") and w is not None and w.in_tx:
                def end(c: psycopg.Connection, w: Worker = w, op: str = op) -> None:
                    if op == "commit":
                        c.commit()
                        if w.after_commit:
                            w.after_commit()
                    else:
                        c.rollback()
                    w.in_tx = False
                    w.after_commit = None
                    w.holding = set()
                w.submit(end)
            elif op == "cancel" and rnd.random() < 0.3:
                t = threading.Thread(target=jobs.cancel_group, args=(rnd.choice(gids),), daemon=True)
                t.start()
                cancels.append(t)
            elif op == "promote" and w is not None and not w.in_tx:
                w.submit(lambda c: (c.execute(queries.PROMOTE_SCHEDULED, {"limit": 100}), c.commit()))
        # Settle: commit every open transaction, let cancels end.
        # A blocked worker waits for another's open transaction: commit the idle ones until none is left.
        deadline = time.monotonic() + 30
        while any(not w.idle or w.in_tx for w in workers):
            assert time.monotonic() < deadline, "workers stayed blocked"
            for w in workers:
                if w.idle and w.in_tx:
                    def end(c: psycopg.Connection, w: Worker = w) -> None:
                        c.commit()
                        if w.after_commit:
                            w.after_commit()
                        w.in_tx = False
                        w.holding = set()
                    w.submit(end, wait=0.01)
            time.sleep(0.01)
        for t in cancels:
            t.join(30)
            assert not t.is_alive()
        for w in workers:
            assert w.error is None, repr(w.error)
    finally:
        for w in workers:
            w.close()
    for gid in gids:
        jobs.seal_group(gid)
    # Run everything left (members, added members, retries, callbacks) to the end.
    with psycopg.connect(url, autocommit=False) as conn:
        for _ in range(200):
            conn.execute(queries.PROMOTE_SCHEDULED, {"limit": 1000})
            conn.commit()
            rows = claim(conn, runtime_id, 100)
            stuck = q(url, "SELECT id, lease, group_id FROM livepush_jobs WHERE state = 'running'")
            if not rows and not stuck:
                break
            for r in rows + [dict(id=s[0], lease=s[1], group_id=s[2]) for s in stuck if s[0] not in {x["id"] for x in rows}]:
                outcome(conn, r, "succeeded", counting=r["group_id"] is not None)
                conn.commit()
        assert q(url, "SELECT count(*) FROM livepush_jobs WHERE state NOT IN ('succeeded', 'failed', 'cancelled')")[0][0] == 0
    check_invariants(url, gids)
    return {
        "cancelled_groups": q(url, "SELECT count(*) FROM livepush_groups WHERE state = 'cancelled'")[0][0],
        "failed_members": q(url, "SELECT count(*) FROM livepush_jobs WHERE group_id IS NOT NULL AND state = 'failed'")[0][0],
        "retried_members": q(url, "SELECT count(*) FROM livepush_jobs WHERE group_id IS NOT NULL AND attempt > 1")[0][0],
        "added_inside": q(url, "SELECT count(*) FROM livepush_job_payloads p JOIN livepush_jobs j ON j.id = p.id "
                               "WHERE j.group_id IS NOT NULL AND p.args = '[\"added\"]'")[0][0],
        "empty_groups": q(url, "SELECT count(*) FROM livepush_groups WHERE total = 0")[0][0],
    }


def check_invariants(url: str, gids: list[int]) -> None:
    for gid in gids:
        v = jobs.get_group(gid)
        assert v is not None and v["finished_at"] is not None, v
        outcomes = dict(q(url, "SELECT state, count(*) FROM livepush_jobs WHERE group_id = %s GROUP BY state", (gid,)))
        assert v["total"] == sum(outcomes.values()), (v, outcomes)
        assert v["pending"] == 0
        for state in ("succeeded", "failed", "cancelled"):
            assert v[state] == outcomes.get(state, 0), (state, v, outcomes)
        kinds = sorted(r[0] for r in q(url, "SELECT kind FROM livepush_group_callbacks WHERE group_id = %s", (gid,)))
        cb_jobs = q(url, "SELECT count(*) FROM livepush_jobs WHERE callback_of = %s", (gid,))[0][0]
        good = v["state"] != "cancelled" and v["failed"] == 0 and v["cancelled"] == 0
        assert kinds == (["finish", "success"] if good else ["failure", "finish"]), (gid, kinds, v)
        assert cb_jobs == 2
        # Callbacks were created after every member finished (members have smaller ids, all finished).
        late = q(url, """SELECT count(*) FROM livepush_jobs m, livepush_group_callbacks c
                         WHERE c.group_id = %s AND m.group_id = %s AND m.id > c.job_id""", (gid, gid))[0][0]
        assert late == 0, gid
        history = group_events(gid)
        names = [e["event"] for e in history]
        assert names[0] == "created" and names.count("finished") == 1 and names[-1] == "finished", names
        # What the state topic shows now is what `finished` recorded.
        state = read_states(url, [f"group:{gid}"])[f"group:{gid}"]
        assert (state.event, json.loads(state.view_json)) == ("finished", history[-1]["data"]["group"])
    # Every job's versions went 1, 2, 3... through the interleavings (events_of checks), and its
    # last recorded version is its row as it is.
    for job_id, version, event in q(url, "SELECT id, version, event FROM livepush_jobs"):
        evs = events_of(url, job_id)
        assert (len(evs), evs[-1]["event"]) == (version, event), job_id


def test_random_interleavings(groups_db: str) -> None:
    """30 seeds x 60 random steps over 4 connections: every group finishes once, callbacks exist
    exactly once (finish + success or failure as the outcomes say), counts equal the members' states."""
    seen: dict[str, int] = {}
    for seed in range(SEEDS):
        jobs.clear()
        q(groups_db, "TRUNCATE test_job_versions, group_callback_runs")
        try:
            for k, v in run_seed(groups_db, seed).items():
                seen[k] = seen.get(k, 0) + v
        except AssertionError as exc:
            raise AssertionError(f"seed {seed}: {exc}") from exc
    # The seeds did exercise every kind of step.
    assert all(v > 0 for v in seen.values()), seen
    print("random interleavings:", seen)
