"""DBOS Transact under the durable jobs benchmark: run by bench/durable_bench.py with .venv-bench's python.

    .venv-bench/bin/python bench/competitors/dbos_driver.py URL install|seq|queue|replay [N]
    .venv-bench/bin/python bench/competitors/dbos_driver.py URL victim|recover WORKFLOW_ID

URL is the DBOS system database (Postgres). Prints one JSON object of figures, except
victim and recover, which print a line per event ("durable-bench ready|step I|done" and the
time.time() it happened), for the benchmark to read as they come.

Configuration: sync workflows and steps (async ones ran no faster here), a fixed
application_version and executor_id so a second process recovers what the first left PENDING,
logging at WARNING. The queue is registered with worker_concurrency=10 and a 10 ms polling
interval: DBOS queues are polled (the default is 1 s, which would cap a queue at 10 workflows a
second and measure the poll, not DBOS).
"""

from __future__ import annotations

import json
import sys
import threading
import time
from typing import Any

import psycopg
from dbos import DBOS, DBOSConfig, SetWorkflowID

APP_VERSION = "durable-bench-1"
EXECUTOR_ID = "durable-bench"
QUEUE = "durable_bench"
QUEUE_POLL = 0.01
KILL_AT = 5  # the victim's step that never returns: the kill lands inside it
KILL_STEPS = 10
STEPS = 10
REPLAY = 100

URL = sys.argv[1]
MODE = sys.argv[2]
finished = 0
finished_lock = threading.Lock()
all_finished = threading.Event()
target = 0
marks: dict[str, float] = {}


def emit(*words: Any) -> None:
    print("durable-bench", *words, time.time(), flush=True)


@DBOS.step()
def noop_step() -> None:
    pass


@DBOS.step()
def last_step() -> None:
    # Counted here, not after the workflow returns: the wait below then polls the status table
    # only for the few workflows whose SUCCESS is still being written.
    global finished
    with finished_lock:
        finished += 1
        if finished >= target:
            all_finished.set()


@DBOS.workflow()
def ten_steps() -> None:
    for _ in range(STEPS - 1):
        noop_step()
    last_step()


@DBOS.step()
def final_step() -> None:
    marks["final"] = time.perf_counter()


@DBOS.workflow()
def hundred_steps() -> None:
    marks["entry"] = time.perf_counter()
    for _ in range(REPLAY):
        noop_step()
    final_step()


@DBOS.step()
def kill_step(i: int) -> None:
    emit("step", i)
    if MODE == "victim" and i == KILL_AT:
        time.sleep(60)  # the benchmark SIGKILLs this process while it sleeps here


@DBOS.workflow()
def kill_workflow() -> None:
    for i in range(1, KILL_STEPS + 1):
        kill_step(i)
    emit("done")
    all_finished.set()


def launch(**extra: Any) -> None:
    config: DBOSConfig = {"name": "durable-bench", "system_database_url": URL, "application_version": APP_VERSION,
                          "executor_id": EXECUTOR_ID, "log_level": "WARNING", **extra}  # type: ignore[typeddict-item]
    DBOS(config=config)
    DBOS.launch()


def wait_succeeded(names: list[str], n: int, timeout: float) -> None:
    """Until n workflows of these names are SUCCESS in the system database (bounded)."""
    deadline = time.monotonic() + timeout
    with psycopg.connect(URL, autocommit=True) as c:
        while True:
            got = c.execute("SELECT count(*) FROM dbos.workflow_status WHERE status = 'SUCCESS' AND name = ANY(%s)",
                            (names,)).fetchone()[0]
            if got >= n:
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"{got}/{n} workflows succeeded within {timeout} s")
            time.sleep(0.002)


def clear() -> None:
    with psycopg.connect(URL, autocommit=True) as c:
        c.execute("TRUNCATE dbos.workflow_status CASCADE")


def install(n: int) -> dict:
    launch()  # runs DBOS's migrations of the system database
    return {}


def seq(n: int) -> dict:
    """n workflows of 10 steps, one after another in this thread."""
    global target
    launch()
    clear()
    target = n + 1
    ten_steps()  # warm: the first workflow pays for connections and statement caches
    t = time.perf_counter()
    for _ in range(n):
        ten_steps()
    rate = n * STEPS / (time.perf_counter() - t)
    return {"seq_steps": rate}


def queue(n: int) -> dict:
    """n workflows enqueued on a paused queue (worker_concurrency 0: its worker claims none), then
    run at worker concurrency 10, timed from the release."""
    global target
    launch()
    clear()
    q = DBOS.register_queue(QUEUE, worker_concurrency=0, polling_interval_sec=QUEUE_POLL, on_conflict="always_update")
    target = n
    for _ in range(n):
        q.enqueue(ten_steps)
    t = time.perf_counter()
    q.set_worker_concurrency(10)
    if not all_finished.wait(300):
        raise TimeoutError(f"{finished}/{n} workflows reached their last step within 300 s")
    wait_succeeded([ten_steps.__qualname__], n, 60)
    rate = n * STEPS / (time.perf_counter() - t)
    q.set_worker_concurrency(0)
    return {"queue_steps": rate}


def replay(n: int) -> dict:
    """A 100-step workflow run once, then forked at its final step: the fork replays the 100
    stored steps and runs the final one. Time from the fork's entry to its final step."""
    launch()
    clear()
    with SetWorkflowID("replay-original"):
        hundred_steps()
    steps = DBOS.list_workflow_steps("replay-original", load_output=False)
    final_id = max(s["function_id"] for s in steps if s["function_name"].endswith("final_step"))
    marks.clear()
    handle = DBOS.fork_workflow("replay-original", final_id)
    deadline = time.monotonic() + 30
    while "final" not in marks:  # the fork runs from DBOS's internal queue, polled once a second
        if time.monotonic() > deadline:
            raise TimeoutError("the forked workflow did not reach its final step within 30 s")
        time.sleep(0.001)
    handle.get_result()
    replayed = sum(1 for s in DBOS.list_workflow_steps(handle.get_workflow_id(), load_output=False)
                   if s["function_name"].endswith("noop_step"))
    return {"replay_ms": (marks["final"] - marks["entry"]) * 1000, "replayed": replayed}


def victim(workflow_id: str) -> None:
    clear_kill(workflow_id)
    launch()
    emit("ready")
    with SetWorkflowID(workflow_id):
        DBOS.start_workflow(kill_workflow)
    time.sleep(120)  # killed long before; the bound keeps a forgotten victim from living on


def clear_kill(workflow_id: str) -> None:
    with psycopg.connect(URL, autocommit=True) as c:
        if c.execute("SELECT to_regclass('dbos.workflow_status')").fetchone()[0]:
            c.execute("DELETE FROM dbos.workflow_status WHERE workflow_uuid = %s", (workflow_id,))


def recover(workflow_id: str) -> None:
    # DBOS.launch() finds this executor's PENDING workflows of this application version and
    # re-enqueues them on its internal queue, which its queue thread polls once a second.
    launch()
    emit("ready")
    if not all_finished.wait(60):
        raise TimeoutError(f"{workflow_id} was not recovered within 60 s")


def main() -> None:
    import logging

    logging.disable(logging.WARNING)
    if MODE in ("victim", "recover"):
        try:
            (victim if MODE == "victim" else recover)(sys.argv[3])
        finally:
            DBOS.destroy()
        return
    n = int(sys.argv[3]) if len(sys.argv) > 3 else 1000
    fn = {"install": install, "seq": seq, "queue": queue, "replay": replay}[MODE]
    try:
        out = fn(n)
    finally:
        DBOS.destroy()
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
