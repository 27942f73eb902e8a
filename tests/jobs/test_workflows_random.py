"""Randomized interleavings of workflow step outcomes (the completer's, a rescue's, a cancel's),
parks, fan-out batches and operator verbs, through the real SQL on several connections at once:
every step starts once per job generation, and only when it may, for every seed.

Each worker thread owns one connection (async, on a loop of its own) and runs one command at a
time, leaving its transaction open until the driver commits or rolls it back: a command blocked
on another transaction's lock stays blocked (its worker is busy) while the driver goes on, so
transactions really overlap and wait on each other as they would between runtimes and operators.
The commands are the statements and transaction steps the runtime and the operator calls run:
the completer's COMPLETE_COUNTING then outcomes.counted, a rescue's RESCUE_ORPHANS then
outcomes.count, jobs.cancel's steps, a parking run's FENCE, TAKE_SIGNAL and PARK, a fan-out's
batch (DurableRun._spawn with the runner's SET_STEP_GROUP), the operator verbs' and signal's
steps; besides, threads call the public jobs.workflows verbs and jobs.cancel. A transaction that
Postgres broke (a deadlock) is run again at once, as every one of those paths does (in_tx and a
parking transaction retry it, the completer retries its batch, a rescue runs again next beat).
Nothing here models the database.
"""

from __future__ import annotations

import asyncio
import json
import queue
import random
import threading
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator
from types import SimpleNamespace
from typing import Any

import psycopg
import pytest
from psycopg.rows import dict_row

from livepush import jobs
from livepush.jobs import queries
from livepush.jobs.api import control
from livepush.jobs.durable import queries as dq
from livepush.jobs.durable.run import DurableRun
from livepush.jobs.errors import JobCancelled, JobFinishedError, Parked
from livepush.jobs.groups import outcomes, steps
from livepush.jobs.groups import queries as gq
from livepush.jobs.groups.cancel import cancel_children
from livepush.jobs.runtime.maintenance import RESCUE_ERROR
from livepush.jobs.workflows import operators
from livepush.jobs.workflows import queries as wq
from livepush.jobs.runtime.completer import complete_params
from tests.jobs import workflow_checks as checks
from tests.jobs import workflow_random_defs as rd
from tests.jobs.conftest import q
from tests.support.waiting import wait_for

SEEDS = 30
STEPS = 70  # random commands per seed
WORKERS = 4
RUNS = 3  # runs started per seed
RETRIES = 5  # a transaction Postgres broke is run again this many times at most, as in_tx does
CONFLICTS = (psycopg.errors.DeadlockDetected, psycopg.errors.SerializationFailure)
FINISHED = ("succeeded", "failed", "cancelled")
BOUND = 30.0  # seconds any wait of the driver may take

Body = Callable[[psycopg.AsyncConnection], Awaitable[tuple[bool, Callable[[], None] | None]]]


class Worker:
    """One connection on a loop of its own in its own thread; `run` a command of the connection."""

    def __init__(self, url: str, events: queue.Queue[Callable[[], None]]) -> None:
        self.url = url
        self.events = events  # after-commit effects, applied by the driver
        self.inbox: queue.Queue[Callable[[], Awaitable[None]] | None] = queue.Queue()
        self.done = threading.Event()
        self.done.set()
        self.error: BaseException | None = None
        self.in_tx = False
        self.holding: set[int] = set()  # jobs this worker's open transaction is about
        self.after: Callable[[], None] | None = None
        self.conflicts: Counter[str] = Counter()
        self.conn: psycopg.AsyncConnection[Any] | None = None
        ready = threading.Event()
        self.thread = threading.Thread(target=self._main, args=(ready,), daemon=True)
        self.thread.start()
        assert ready.wait(BOUND), "a worker did not connect"

    def _main(self, ready: threading.Event) -> None:
        loop = asyncio.new_event_loop()
        self.conn = loop.run_until_complete(psycopg.AsyncConnection.connect(self.url, autocommit=False))
        ready.set()
        try:
            while (item := self.inbox.get()) is not None:
                try:
                    loop.run_until_complete(item())
                except BaseException as exc:  # reported by the test
                    self.error = self.error or exc
                    loop.run_until_complete(self.conn.rollback())
                    self._clear()
                finally:
                    self.done.set()
        finally:
            loop.run_until_complete(self.conn.close())
            loop.close()

    def _clear(self) -> None:
        self.in_tx, self.after, self.holding = False, None, set()

    @property
    def idle(self) -> bool:
        return self.done.is_set()

    def run(self, name: str, body: Body, holding: set[int] | None = None, wait: float = 0.05) -> bool:
        """Run `body` (retried when Postgres broke it); it returns (hold, after): hold its
        transaction open for a later commit or rollback, or roll back what it did not commit
        itself; `after` is applied once the work is committed."""
        assert self.idle and not self.in_tx
        self.in_tx, self.holding = True, set(holding or ())
        conn = self.conn
        assert conn is not None

        async def go() -> None:
            for attempt in range(RETRIES):
                try:
                    hold, after = await body(conn)
                except CONFLICTS:
                    await conn.rollback()
                    self.conflicts[name] += 1
                    if attempt == RETRIES - 1:
                        raise
                    continue
                if hold:
                    self.after = after
                else:
                    await conn.rollback()
                    self._clear()
                    if after is not None:
                        self.events.put(after)
                return

        return self.submit(go, wait)

    def end(self, commit: bool, wait: float = 0.05) -> bool:
        assert self.idle and self.in_tx
        conn = self.conn
        assert conn is not None

        async def go() -> None:
            if commit:
                await conn.commit()
                if self.after is not None:
                    self.events.put(self.after)
            else:
                await conn.rollback()
            self._clear()

        return self.submit(go, wait)

    def submit(self, fn: Callable[[], Awaitable[None]], wait: float) -> bool:
        self.done.clear()
        self.inbox.put(fn)
        return self.done.wait(wait)

    def close(self) -> None:
        self.inbox.put(None)
        self.thread.join(BOUND)


def step_of(name: str) -> tuple[str, str] | None:
    """(workflow, step) of a step's job name, or None for a member."""
    flow, _, step = name.partition(".")
    return (flow, step) if flow in rd.FLOWS else None


def spec_of(name: str) -> Any:
    flow, step = step_of(name)  # type: ignore[misc]
    return rd.FLOWS[flow].steps[step]


async def fetch(conn: psycopg.AsyncConnection[Any], sql: str, params: Any = None) -> list[dict[str, Any]]:
    async with conn.cursor(row_factory=dict_row) as cur:
        await cur.execute(sql, params)
        return await cur.fetchall() if cur.description else []


async def step_gone(conn: psycopg.AsyncConnection[Any], job: dict[str, Any]) -> bool:
    """What the runner reads first (STEP_INPUTS): whether the run ended, or the step was skipped,
    cancelled or given another job, since this job was made; the job then ends cancelled."""
    rows = await fetch(conn, """
        SELECT w.state, s.state AS step_state, s.job_id FROM livepush_workflows w
        JOIN livepush_workflow_steps s ON s.workflow_id = w.id AND s.name = %s WHERE w.id = %s""",
                       (step_of(job["name"])[1], job["args"][0]))  # type: ignore[index]
    return (not rows or rows[0]["state"] in FINISHED or rows[0]["job_id"] != job["id"]
            or rows[0]["step_state"] not in ("running", "waiting"))


def durable_ctx(job: dict[str, Any]) -> Any:
    """What DurableRun's transaction steps read of a running job's context."""
    claimed = SimpleNamespace(id=job["id"], lease=job["lease"], has_steps=job["has_steps"])
    return SimpleNamespace(_job=claimed, job_id=job["id"], queue=job["queue"], _latest=None, _dirty=False, _pool=None,
                           _url=None, _cancel_requested=False)


class Seed:
    """One seed's runs, workers, and what the driver knows and expects."""

    def __init__(self, url: str, seed: int) -> None:
        self.url = url
        self.seed = seed
        self.rnd = random.Random(seed)
        self.events: queue.Queue[Callable[[], None]] = queue.Queue()
        self.workers = [Worker(url, self.events) for _ in range(WORKERS)]
        self.runs: dict[int, str] = {}  # run id -> workflow name
        self.running: dict[int, dict[str, Any]] = {}  # claimed, lease held, outcome not committed
        self.has_signal: set[int] = set()  # wait_for steps' jobs whose stored wait holds the signal
        self.asked: dict[int, int] = {}  # fan-out step job -> members its batch was made with
        self.verbs: set[tuple[int, str, str | None, str]] = set()  # applied: (run, verb, step, actor)
        self.signals_ok: set[tuple[int, str]] = set()  # (run, actor) of signals sent without an error
        self.signals_failed: list[tuple[int, str, str]] = []  # (run, actor, error) of signals that raised
        self.threads: list[threading.Thread] = []
        self.thread_errors: list[BaseException] = []
        self.seen: Counter[str] = Counter()
        self.actors = 0

    # -- helpers ------------------------------------------------------------------------------
    def actor(self) -> str:
        self.actors += 1
        return f"op{self.actors}"

    def apply_events(self) -> None:
        while True:
            try:
                effect = self.events.get_nowait()
            except queue.Empty:
                return
            effect()

    def busy(self) -> set[int]:
        return set().union(*(w.holding for w in self.workers))

    def background(self, fn: Callable[[], None]) -> None:
        def run() -> None:
            try:
                fn()
            except BaseException as exc:  # reported by the test
                self.thread_errors.append(exc)

        t = threading.Thread(target=run, daemon=True)
        t.start()
        self.threads.append(t)

    def alive_threads(self) -> int:
        return sum(t.is_alive() for t in self.threads)

    # -- commands -----------------------------------------------------------------------------
    def claim(self, limit: int) -> Body:
        async def body(conn: psycopg.AsyncConnection[Any]) -> tuple[bool, Callable[[], None] | None]:
            (rt,) = await fetch(conn, "INSERT INTO livepush_job_runtimes (host, pid, queues, concurrency, heartbeat) "
                                      "VALUES ('test', 0, %s, 1, 3600) RETURNING id", ([rd.QUEUE],))
            await conn.commit()
            # As a runtime that defines the steps claims: their jobs first (their own claim), then
            # the members (the plain one).
            step_names = [spec.job for flow in rd.FLOWS.values() for spec in flow.steps.values()]
            stepped = await fetch(conn, wq.CLAIM_STEPS, {"queue": rd.QUEUE, "names": step_names, "limit": limit,
                                                         "runtime_id": rt["id"]})
            rows = [r for r in stepped if r["id"] is not None]  # its one row when it claimed none
            await conn.commit()
            if len(rows) < limit:
                rows += await fetch(conn, queries.CLAIM, {"queue": rd.QUEUE, "excluded": [], "limit": limit - len(rows),
                                                          "runtime_id": rt["id"]})
                await conn.commit()

            def after() -> None:
                for r in rows:
                    self.running[r["id"]] = {**r, "runtime_id": rt["id"]}
                self.seen["claimed"] += len(rows)
            return False, after
        return body

    def ending(self) -> tuple[bool, str, str]:
        """A random ending of a job: (whether its body returns, the flow verb it returns with, the
        way it fails otherwise). Drawn by the driver alone, so a seed draws the same ones."""
        rnd = self.rnd
        return (rnd.random() < 0.75,
                rnd.choices(["complete", "pause", "skip", "cancel", "finish"], [10, 4, 2, 0.6, 1.5])[0],
                rnd.choices(["retry", "released", "fail", "cancelled"], [2, 1, 1, 0.5])[0])

    def result_for(self, job: dict[str, Any], ending: tuple[bool, str, str]
                   ) -> Callable[[psycopg.AsyncConnection[Any]], Awaitable[tuple[str, str | None]]]:
        """The (kind, result JSON) a job ends with, read as the runner would when it ends."""
        succeeded, verb, failure = ending

        async def decide(conn: psycopg.AsyncConnection[Any]) -> tuple[str, str | None]:
            if step_of(job["name"]) is None:  # a member: a plain job
                return ("succeeded" if succeeded else failure), None
            if await step_gone(conn, job):
                return "cancelled", None
            spec = spec_of(job["name"])
            if not succeeded:
                return failure, None
            if spec.kind == "fan_out":
                groups = await fetch(conn, "SELECT id FROM livepush_groups WHERE parent_id = %s", (job["id"],))
                views = await fetch(conn, gq.GROUP_VIEWS, {"ids": [g["id"] for g in groups]})
                if not views or views[0]["finished_at"] is None:
                    return "retry", None  # its function raised before its batch was made, or it woke early
                counts = {k: int(views[0][k]) for k in ("total", "succeeded", "failed", "cancelled")}
                said = "complete" if not counts["failed"] and not counts["cancelled"] else spec.on_batch_failure
                return "succeeded", json.dumps({"verb": said, "output": counts})
            if spec.wait_for is not None and job["id"] not in self.has_signal:
                return "retry", None  # it raised before its wait (none happened here)
            output = {"job": job["id"]} if verb in ("complete", "finish") else None
            return "succeeded", json.dumps({"verb": verb, "output": output, "reason": f"asked to {verb}"})
        return decide

    def outcome(self, batch: list[dict[str, Any]], endings: list[tuple[bool, str, str]]) -> Body:
        """The completer's transaction for a batch of outcomes, left open: COMPLETE_COUNTING, then
        outcomes.counted (the finish of any group whose shard it drained, the steps' ends)."""
        deciders = [self.result_for(job, ending) for job, ending in zip(batch, endings)]

        async def body(conn: psycopg.AsyncConnection[Any]) -> tuple[bool, Callable[[], None] | None]:
            decided = [await decide(conn) for decide in deciders]
            rows = await fetch(conn, gq.COMPLETE_COUNTING, complete_params(
                (job["id"], job["lease"], kind, None if kind == "succeeded" else f"{kind} by the test", 0.0, None, result)
                for job, (kind, result) in zip(batch, decided)))
            await outcomes.counted(conn, (rows[0]["_shards"] if rows else None) or [], rows)

            def after() -> None:
                for job in batch:
                    self.running.pop(job["id"], None)
                self.seen.update(f"outcome {r['kind']}" for r in rows)
                self.seen["outcome batches of several"] += len(rows) > 1
            return True, after
        return body

    def rescue(self, runtime_id: int) -> Body:
        async def body(conn: psycopg.AsyncConnection[Any]) -> tuple[bool, Callable[[], None] | None]:
            # The prune of a runtime that stopped beating (PRUNE_DEAD_RUNTIMES), then the rescue.
            await conn.execute("DELETE FROM livepush_job_runtimes WHERE id = %s", (runtime_id,))
            await conn.commit()
            # By a runtime that runs none of these jobs (the rescuer's own are never released).
            # The orphans read first, as maintenance.rescue does, each due again at once.
            found = await fetch(conn, queries.ORPHANS, {"error": RESCUE_ERROR, "runtime_id": None})
            rows = await fetch(conn, queries.RESCUE_ORPHANS, {
                "error": RESCUE_ERROR, "runtime_id": None, "ids": [r["id"] for r in found],
                "attempts": [r["attempt"] for r in found], "delays": [0.0] * len(found)})
            await outcomes.count(conn, outcomes.terminal(rows))

            def after() -> None:
                for r in rows:
                    self.running.pop(r["id"], None)
                self.seen["rescued"] += len(rows)
            return True, after
        return body

    def cancel(self, job_id: int) -> Body:
        async def body(conn: psycopg.AsyncConnection[Any]) -> tuple[bool, Callable[[], None] | None]:
            rows = await steps.arun(conn, control._cancel_steps(job_id))

            def after() -> None:
                if outcomes.terminal(rows):  # what jobs.cancel does after its commit
                    self.background(lambda: cancel_children([job_id]))
                self.seen["cancel"] += 1
            return True, after
        return body

    def verb(self, run_id: int, verb: str, step: str | None) -> Body:
        actor = self.actor()

        async def body(conn: psycopg.AsyncConnection[Any]) -> tuple[bool, Callable[[], None] | None]:
            applied, to_cancel = await steps.arun(conn, operators._verb_steps(run_id, verb, step, actor, "test"))

            def after() -> None:
                if applied:
                    self.verbs.add((run_id, verb, step, actor))
                    self.seen[f"verb {verb}"] += 1
                for job_id in to_cancel:  # what the verb does after its commit
                    self.background(lambda job_id=job_id: jobs.cancel(job_id))
            return True, after
        return body

    def signal(self, run_id: int) -> Body:
        actor = self.actor()
        data = {"from": actor}

        async def body(conn: psycopg.AsyncConnection[Any]) -> tuple[bool, Callable[[], None] | None]:
            refusal = await steps.arun(conn, operators._signal_steps(run_id, rd.SIGNAL, json.dumps(data), actor))
            if refusal is not None:
                # No step waits for it (any more), or the run finished: nothing audited. Held for its
                # commit all the same: a parked job of a step that ended meanwhile is stopped in it.
                return True, None

            def after() -> None:
                self.seen["signal"] += 1
                self.signals_ok.add((run_id, actor))
            return True, after
        return body

    def work(self, job: dict[str, Any], members: int) -> Body:
        """What a step's job does in its own transactions before it ends: a fan-out step makes its
        batch and parks on it (or parks again on a batch not finished), a step that waits for a
        signal takes it or parks. Like every parking transaction, it starts with FENCE."""
        spec = spec_of(job["name"])

        async def body(conn: psycopg.AsyncConnection[Any]) -> tuple[bool, Callable[[], None] | None]:
            if await step_gone(conn, job):
                return False, None  # its outcome will say cancelled
            run = DurableRun(durable_ctx(job))
            fenced = await fetch(conn, dq.FENCE, {"id": job["id"], "lease": job["lease"]})
            if not fenced:  # the run lost its claim: the runtime drops it
                return False, lambda: self.running.pop(job["id"], None)
            if fenced[0]["cancel_requested"]:
                return False, None  # JobCancelled: its outcome will say cancelled
            try:
                if spec.kind == "fan_out":
                    made = await fetch(conn, "SELECT id FROM livepush_groups WHERE parent_id = %s", (job["id"],))
                    if made:
                        done = await fetch(conn, dq.GROUP_FINISHED, {"group_id": made[0]["id"]})
                        if done[0]["finished"]:
                            return False, None
                        await steps.arun(conn, run._park({"for": "children", "name": f"group:{made[0]['id']}",
                                                          "group": made[0]["id"]}))
                    else:
                        def remember(group_id: int) -> steps.Steps[None]:
                            yield steps.Query(wq.SET_STEP_GROUP, {"id": job["args"][0], "name": spec.name,
                                                                  "group_id": group_id})

                        await steps.arun(conn, run._spawn("0", [rd.member.request(i) for i in range(members)],
                                                          remember))
                else:
                    taken = await fetch(conn, dq.TAKE_SIGNAL, {"id": job["id"], "name": rd.SIGNAL})
                    if taken:
                        await steps.arun(conn, run._save("signal", f"0:{rd.SIGNAL}", {"data": taken[0]["data"]}))

                        def took() -> None:
                            self.has_signal.add(job["id"])
                            self.seen["signal taken"] += 1
                        return True, took
                    await steps.arun(conn, run._save("signal", f"0:{rd.SIGNAL}", {"deadline": None}))
                    await steps.arun(conn, run._park({"for": "signal", "name": rd.SIGNAL}))
            except JobCancelled:
                # Its run ended while this transaction held the job (its end could not stop it):
                # the park rolls back and the job ends cancelled.
                self.seen["park refused in an ended run"] += 1
                return False, None
            except Parked:
                def parked() -> None:
                    self.running.pop(job["id"], None)
                    if spec.kind == "fan_out" and job["id"] not in self.asked:
                        self.asked[job["id"]] = members
                        self.seen["batch made"] += 1
                    self.seen["parked"] += 1
                return True, parked
            raise AssertionError("unreachable: every path above returns or parks")
        return body

    def promote(self) -> Body:
        async def body(conn: psycopg.AsyncConnection[Any]) -> tuple[bool, Callable[[], None] | None]:
            await conn.execute(queries.PROMOTE_SCHEDULED, {"limit": 1000})
            await conn.commit()
            return False, None
        return body

    def api(self) -> None:
        """A public call in a thread of its own: a workflow verb, a signal, or jobs.cancel."""
        run_id = self.rnd.choice(list(self.runs))
        actor = self.actor()
        what = self.rnd.choice(["pause", "resume", "resume", "skip", "signal", "cancel_job", "cancel"])
        if what == "signal":
            data = {"from": actor}

            def send() -> None:
                try:
                    jobs.workflows.signal(run_id, rd.SIGNAL, data, actor=actor)
                except JobFinishedError as exc:
                    self.signals_failed.append((run_id, actor, f"{type(exc).__name__}: {exc}"))
                except ValueError:
                    pass  # refused: nothing written
                else:
                    self.signals_ok.add((run_id, actor))
            self.background(send)
        elif what == "cancel_job":
            live = q(self.url, "SELECT id FROM livepush_jobs WHERE state NOT IN ('succeeded', 'failed', 'cancelled')")
            if live:
                job_id = self.rnd.choice(live)[0]
                self.background(lambda: jobs.cancel(job_id))
        else:
            step = self.rnd.choice(list(rd.FLOWS[self.runs[run_id]].steps)) if what == "skip" else None

            def call() -> None:
                fn = {"pause": jobs.workflows.pause, "resume": jobs.workflows.resume,
                      "cancel": jobs.workflows.cancel}.get(what)
                applied = jobs.workflows.skip(run_id, step, actor=actor, reason="test") if fn is None else \
                    fn(run_id, actor=actor, reason="test")
                if applied:
                    self.verbs.add((run_id, what, step, actor))
            self.background(call)

    # -- the seed -----------------------------------------------------------------------------
    def start(self) -> None:
        for i in range(RUNS):
            flow = self.rnd.choice(list(rd.FLOWS.values()))
            self.runs[flow.start({"seed": self.seed, "i": i}).id] = flow.name

    def step(self) -> None:
        self.apply_events()
        rnd = self.rnd
        free = [w for w in self.workers if w.idle and not w.in_tx]
        open_ = [w for w in self.workers if w.idle and w.in_tx]
        op = rnd.choices(["claim", "outcome", "work", "rescue", "cancel", "verb", "signal", "promote", "api",
                          "commit", "rollback"], [3, 6, 3, 0.7, 0.4, 3, 1.5, 0.7, 1, 7, 1.2])[0]
        if op in ("commit", "rollback"):
            if open_:
                rnd.choice(open_).end(op == "commit")
            return
        if op == "api":
            if self.alive_threads() < 3:
                self.api()
            return
        if not free:
            return
        w = rnd.choice(free)
        mine = [j for j in self.running.values() if j["id"] not in self.busy()]
        body: Body | None = None
        holding: set[int] = set()
        if op == "claim":
            body = self.claim(rnd.randint(1, 3))
        elif op == "outcome" and mine:
            batch = rnd.sample(mine, min(len(mine), rnd.choice([1, 1, 2, 3])))
            body, holding = self.outcome(batch, [self.ending() for _ in batch]), {j["id"] for j in batch}
        elif op == "work":
            parkers = [j for j in mine if step_of(j["name"]) is not None
                       and (spec_of(j["name"]).kind == "fan_out" or spec_of(j["name"]).wait_for is not None)
                       and j["id"] not in self.has_signal]
            if parkers:
                job = rnd.choice(parkers)
                body, holding = self.work(job, rnd.randint(1, 3)), {job["id"]}
        elif op == "rescue":
            owners = sorted({j["runtime_id"] for j in self.running.values()})
            if owners:
                body = self.rescue(rnd.choice(owners))
        elif op == "cancel":
            live = q(self.url, "SELECT id FROM livepush_jobs WHERE state NOT IN ('succeeded', 'failed', 'cancelled')")
            if live:
                body = self.cancel(rnd.choice(live)[0])
        elif op == "verb":
            run_id = rnd.choice(list(self.runs))
            verb = rnd.choices(["pause", "resume", "skip", "cancel"], [3, 4, 1, 0.3])[0]
            step = rnd.choice(list(rd.FLOWS[self.runs[run_id]].steps)) if verb == "skip" else None
            body = self.verb(run_id, verb, step)
        elif op == "signal":
            body = self.signal(rnd.choice(list(self.runs)))
        elif op == "promote":
            body = self.promote()
        if body is not None and not w.run(op, body, holding, wait=1.0 if op == "claim" else 0.05):
            self.seen[f"blocked {op}"] += 1  # waiting for another transaction's lock: the driver goes on

    def settle_workers(self) -> None:
        """Commit every open transaction; a blocked worker waits for another's, so commit the idle
        ones until none is left; then let the threads end."""
        deadline = time.monotonic() + BOUND
        while any(not w.idle or w.in_tx for w in self.workers):
            assert time.monotonic() < deadline, "workers stayed blocked"
            for w in self.workers:
                if w.idle and w.in_tx:
                    w.end(True, wait=0.01)
            time.sleep(0.005)  # not a synchronisation: how often the loop above looks again
        for t in self.threads:
            t.join(max(0.0, deadline - time.monotonic()))
            assert not t.is_alive(), "a public call stayed blocked"
        self.apply_events()

    def finish(self) -> None:
        """Run every run to its end: rescue what the random part left running, then play every job
        to success, resume paused runs and signal waiting steps, round after round."""
        w = self.workers[0]

        def do(name: str, body: Body) -> None:
            assert w.run(name, body, wait=BOUND), f"{name} stayed blocked"
            if w.in_tx:
                assert w.end(True, wait=BOUND)
            self.apply_events()

        for _ in range(200):
            q(self.url, "DELETE FROM livepush_job_runtimes")
            do("rescue", self.rescue(0))
            do("promote", self.promote())
            do("claim", self.claim(100))
            for job in list(self.running.values()):
                spec = spec_of(job["name"]) if step_of(job["name"]) is not None else None
                parks = spec is not None and (spec.kind == "fan_out" or spec.wait_for is not None)
                if parks and job["id"] not in self.has_signal:
                    do("work", self.work(job, self.rnd.randint(1, 3)))
                if job["id"] not in self.running:
                    continue  # parked
                do("outcome", self.outcome([job], [(True, "complete", "retry")]))
            for run_id, state in q(self.url, "SELECT id, state FROM livepush_workflows"):
                if state == "paused":
                    actor = self.actor()
                    if jobs.workflows.resume(run_id, actor=actor, reason="settle"):
                        self.verbs.add((run_id, "resume", None, actor))
            for run_id, step, step_state, job_state, unread, kept in q(self.url, """
                    SELECT s.workflow_id, s.name, s.state, j.state,
                           (SELECT count(*) FROM livepush_job_signals g WHERE g.job_id = s.job_id),
                           (SELECT count(*) FROM livepush_workflow_signals k WHERE k.workflow_id = s.workflow_id AND k.step = s.name)
                    FROM livepush_workflow_steps s JOIN livepush_workflows w ON w.id = s.workflow_id
                    LEFT JOIN livepush_jobs j ON j.id = s.job_id
                    WHERE w.state = 'running' AND s.state IN ('pending', 'running')
                      AND w.graph -> 'steps' -> s.name ->> 'wait_for' IS NOT NULL"""):
                if (step_state == "running" and job_state == "waiting" and unread == 0) or \
                        (step_state == "pending" and kept == 0):
                    actor = self.actor()
                    try:
                        jobs.workflows.signal(run_id, rd.SIGNAL, {"from": actor}, actor=actor)
                    except JobFinishedError as exc:
                        self.signals_failed.append((run_id, actor, f"{type(exc).__name__}: {exc}"))
                    else:
                        self.signals_ok.add((run_id, actor))
            runs_open = q(self.url, "SELECT count(*) FROM livepush_workflows WHERE state NOT IN "
                                    "('succeeded', 'failed', 'cancelled')")[0][0]
            jobs_open = q(self.url, """
                SELECT count(*) FROM livepush_jobs j LEFT JOIN livepush_workflows w ON w.id = j.workflow_id
                WHERE j.state IN ('available', 'scheduled', 'running')
                   OR (j.state = 'waiting' AND (w.id IS NULL OR w.state NOT IN ('succeeded', 'failed', 'cancelled')))
                   OR (j.state = 'waiting' AND EXISTS (SELECT 1 FROM livepush_groups g
                                                       WHERE g.parent_id = j.id AND g.finished_at IS NULL))""")[0][0]
            if runs_open == 0 and jobs_open == 0:
                return
        raise AssertionError(f"runs not finished after 200 rounds: "
                             f"{q(self.url, 'SELECT id, name, state FROM livepush_workflows')}")

    def close(self) -> None:
        for w in self.workers:
            w.close()


def check_invariants(s: Seed) -> None:
    url = s.url
    problems = checks.bad_starts(url) + checks.bad_generations(url) + checks.bad_batches(url)
    assert not problems, "\n".join(problems[:10])
    # Every fan-out batch holds the members its step's job asked for, made once.
    for parent_id, total in q(url, "SELECT parent_id, total FROM livepush_groups WHERE parent_id IS NOT NULL"):
        assert s.asked.get(parent_id) == total, (parent_id, total, s.asked.get(parent_id))
    # Every run finished, its state agreeing with its steps, and no job of it is left unfinished
    # (a step parked in a run that ended would wait for ever).
    steps_of: dict[int, dict[str, str]] = {}
    for run_id, name, state in q(url, "SELECT workflow_id, name, state FROM livepush_workflow_steps"):
        steps_of.setdefault(run_id, {})[name] = state
    audit = q(url, "SELECT workflow_id, verb, step, actor FROM livepush_workflow_audit")
    for run_id, state in q(url, "SELECT id, state FROM livepush_workflows"):
        got_steps = steps_of[run_id]
        assert state in FINISHED, (run_id, state, got_steps)
        assert not set(got_steps.values()) & {"pending", "running", "waiting"}, (run_id, state, got_steps)
        if state == "succeeded":
            assert set(got_steps.values()) <= {"succeeded", "skipped"}, (run_id, state, got_steps)
        if state == "failed":
            assert "failed" in got_steps.values(), (run_id, state, got_steps)
        if state == "cancelled":
            assert "cancelled" in got_steps.values() or any(
                a[0] == run_id and a[1] == "cancel" for a in audit), (run_id, state, got_steps)
    left = q(url, "SELECT id, name, state, workflow_id FROM livepush_jobs "
                  "WHERE state NOT IN ('succeeded', 'failed', 'cancelled')")
    assert not left, f"jobs never ending (id, name, state, run): {left}"
    # The audit holds exactly the operator verbs that returned True (each call has an actor of its
    # own), exactly the signals sent without an error, and the verbs steps ended with.
    got = {(r, v, st, a) for r, v, st, a in audit if a.startswith("op") and v != "signal"}
    assert got == s.verbs, f"audited but not applied: {sorted(got - s.verbs)}; applied but not audited: " \
                           f"{sorted(s.verbs - got)}"
    assert not s.signals_failed, f"signals that raised: {s.signals_failed}"
    signalled = {(r, a) for r, v, _, a in audit if v == "signal"}
    assert signalled == s.signals_ok, f"audited but not sent: {sorted(signalled - s.signals_ok)}; sent but " \
                                      f"not audited: {sorted(s.signals_ok - signalled)}"
    ended = Counter()
    for (run_id, name), rows in checks.step_jobs(url).items():
        for job in rows:
            if job["state"] == "succeeded" and isinstance(job["result"], dict):
                ended[(run_id, name.split(".", 1)[1], job["result"].get("verb"))] += 1
    by_steps = Counter((r, st, v) for r, v, st, a in audit if a == f"step:{st}")
    assert all(n <= ended[key] for key, n in by_steps.items()), \
        {key: (n, ended[key]) for key, n in by_steps.items() if n > ended[key]}
    assert not s.thread_errors, repr(s.thread_errors[:3])
    for w in s.workers:
        assert w.error is None, repr(w.error)


@pytest.fixture
def random_db(jobs_db: str) -> Iterator[str]:
    q(jobs_db, checks.STARTS_TABLE)
    yield jobs_db


def run_seed(url: str, seed: int) -> Seed:
    s = Seed(url, seed)
    try:
        s.start()
        for _ in range(STEPS):
            s.step()
        s.settle_workers()
        for w in s.workers:
            assert w.error is None, f"{type(w.error).__name__}: {w.error}"
        s.finish()
    finally:
        s.close()
    check_invariants(s)
    for w in s.workers:
        for name, n in w.conflicts.items():
            s.seen[f"retried {name}"] += n
    s.seen.update(state for (state,) in q(url, "SELECT state FROM livepush_workflows"))
    s.seen["reran steps"] += sum(len(v) > 1 for v in checks.step_jobs(url).values())
    return s


def test_random_interleavings_start_each_step_once(random_db: str) -> None:
    """30 seeds x 70 random commands over 4 connections (and public calls in threads): every step's
    job is created once per generation (again only after its step paused the run), only in a running
    run whose steps before it succeeded or were skipped; every run finishes with its steps agreeing
    and no job left waiting; the audit holds exactly the verbs that returned True and the signals sent."""
    seen: Counter[str] = Counter()
    began = time.monotonic()
    for seed in range(SEEDS):
        jobs.clear()
        q(random_db, "TRUNCATE test_job_versions, test_wf_starts")
        try:
            seen.update(run_seed(random_db, seed).seen)
        except AssertionError as exc:
            raise AssertionError(f"seed {seed}: {exc}") from exc
    print(f"random interleavings of workflows: {SEEDS} seeds in {time.monotonic() - began:.1f} s:",
          dict(sorted(seen.items())))
    # The seeds did exercise every kind of command and ending.
    for kind in ("batch made", "parked", "signal taken", "rescued", "cancel", "verb pause", "verb resume",
                 "verb skip", "reran steps", "succeeded", "failed", "cancelled", "outcome succeeded"):
        assert seen[kind] > 0, (kind, dict(seen))


def test_a_step_parking_while_its_run_ends_does_not_wait_for_ever(random_db: str) -> None:
    """A step's job that parks on its signal while another transaction ends its run (a sibling's
    `finish`) does not stay parked: its park is refused and the job ends cancelled.

    The interleaving, on three connections: an operator verb holds the run's row; the sibling's
    completer transaction waits for that row; the parking transaction takes its job's row (FENCE)
    and waits for the run's row too (PARK touches the run's topic); the verb commits. The completer
    goes first and ends the run, its STOP_JOBS skipping the job the park holds; then the park."""
    s = Seed(random_db, 0)
    try:
        run_id = rd.diamond.start({}).id
        s.runs[run_id] = rd.diamond.name
        w0, w1, w2 = s.workers[:3]

        def claimed(name: str) -> dict[str, Any]:
            assert w0.run("claim", s.claim(10), wait=BOUND)
            s.apply_events()
            return next(j for j in s.running.values() if j["name"] == f"{rd.diamond.name}.{name}")

        def waiting_for_locks(n: int) -> bool:
            return q(random_db, "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                                "AND wait_event_type = 'Lock'")[0][0] >= n

        a = claimed("a")
        assert w0.run("outcome", s.outcome([a], [(True, "complete", "retry")]), wait=BOUND) and w0.end(True, BOUND)
        s.apply_events()
        b, c = claimed("b"), claimed("c")
        assert w0.run("verb", s.verb(run_id, "pause", None), wait=BOUND)  # holds the run's row
        w1.run("outcome", s.outcome([b], [(True, "finish", "retry")]), {b["id"]})
        wait_for(lambda: waiting_for_locks(1), BOUND, message="the completer to wait for the run's row")
        w2.run("work", s.work(c, 0), {c["id"]})
        wait_for(lambda: waiting_for_locks(2), BOUND, message="the park to wait for the run's row")
        assert w0.end(True, BOUND)
        for w, what in ((w1, "the completer"), (w2, "the park")):
            wait_for(lambda: w.idle, BOUND, message=f"{what} to go on")
            if w.in_tx:
                assert w.end(True, BOUND)
        s.apply_events()
        assert jobs.workflows.get(run_id)["state"] == "succeeded"
        state, run_at = q(random_db, "SELECT state, run_at::text FROM livepush_jobs WHERE id = %s", (c["id"],))[0]
        assert (state, run_at) != ("waiting", "infinity"), f"step c's job {c['id']} parked for ever"
        if c["id"] in s.running:  # the park was refused: the runtime ends the job
            assert w0.run("outcome", s.outcome([c], [(True, "complete", "retry")]), wait=BOUND) and w0.end(True, BOUND)
        assert q(random_db, "SELECT state FROM livepush_jobs WHERE id = %s", (c["id"],)) == [("cancelled",)]
        for w in s.workers:
            assert w.error is None, repr(w.error)
    finally:
        s.close()
    assert jobs.workflows.get(run_id)["steps"]["c"]["state"] == "skipped"
    assert s.seen["park refused in an ended run"] == 1
