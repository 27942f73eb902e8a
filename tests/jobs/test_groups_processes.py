"""Task groups across runtimes in child processes (`livepush jobs`): 2,000 members on 2
runtimes, kill -9 of a runtime in the middle of a group, and groups cancelled while runtimes
finish, fail, retry and add their members and one of them is killed."""

from __future__ import annotations

import random
import signal
import threading
from collections.abc import Callable, Iterator

import psycopg
import pytest

from livepush import jobs
from tests.jobs import group_jobs as gj
from tests.jobs.conftest import group_events, q, runtime_starter, version_gaps
from tests.support.procs import ChildProcess, Processes
from tests.support.waiting import wait_for

MODULE = "tests.jobs.group_jobs"


@pytest.fixture
def groups_db(jobs_db: str) -> Iterator[str]:
    q(jobs_db, gj.CALLBACK_RUNS_TABLE)
    yield jobs_db


@pytest.fixture
def start_runtime(groups_db: str, procs: Processes, livepush_env: Callable[..., dict[str, str]]) -> Callable[..., ChildProcess]:
    return runtime_starter(groups_db, MODULE, procs, livepush_env(database_url=groups_db))


def member_outcomes(url: str, group_id: int) -> dict[str, int]:
    return dict(q(url, "SELECT state, count(*) FROM livepush_jobs WHERE group_id = %s GROUP BY state", (group_id,)))


def test_two_thousand_members_two_runtimes(groups_db: str, start_runtime: Callable[..., ChildProcess]) -> None:
    """2,000 members (with retries, failures and members adding members) across 2 runtimes at
    concurrency 16: exact counts, and exactly one of each due callback (on_finish, on_failure)."""
    with jobs.group(on_finish=gj.callback.request("fin"), on_success=gj.callback.request("ok"),
                    on_failure=gj.callback.request("bad")) as g:
        for i in range(1800):
            g.enqueue(gj.member, i)
        for i in range(50):
            g.enqueue(gj.flaky, 1, f"f{i}")  # fails once, then succeeds
        for i in range(50):
            g.enqueue(gj.fail, f"x{i}")  # fails for good
        for i in range(50):
            g.enqueue(gj.spawner, 1, f"s{i}")  # adds one member each
    assert len(g.members) == 1950
    children = [start_runtime("--concurrency", "16") for _ in range(2)]
    wait_for(lambda: (jobs.get_group(g.handle.id) or {}).get("finished_at"), 120.0, interval=0.2,
             message="the group to finish")
    wait_for(lambda: len(gj.callback_runs(groups_db)) >= 2, 30.0)
    view = jobs.get_group(g.handle.id)
    assert (view["state"], view["total"], view["pending"]) == ("finished", 2000, 0)
    assert (view["succeeded"], view["failed"], view["cancelled"]) == (1950, 50, 0)
    assert member_outcomes(groups_db, g.handle.id) == {"succeeded": 1950, "failed": 50}
    for child in children:
        assert child.stop(timeout=15) == 0, child.output()
    runs = gj.callback_runs(groups_db)
    assert sorted(r[0] for r in runs) == ["bad", "fin"]
    assert q(groups_db, "SELECT count(DISTINCT pid) FROM job_runs")[0][0] == 2
    assert q(groups_db, "SELECT count(*) FROM livepush_jobs WHERE callback_of = %s", (g.handle.id,))[0][0] == 2
    assert version_gaps(groups_db) == []  # every job's topic went 1, 2, 3... across both runtimes


def test_kill_9_in_the_middle_of_a_group(groups_db: str, start_runtime: Callable[..., ChildProcess]) -> None:
    """kill -9 of a runtime mid-group: its members are rescued and rerun elsewhere, the group
    still finishes with exact counts, and each callback runs once."""
    with jobs.group(on_finish=gj.callback.request("fin"), on_success=gj.callback.request("ok")) as g:
        for i in range(284):
            g.enqueue(gj.slow, 0.05, i)
        # Claimed last (claim order is by id), these hold the victim's 16 slots until the rescue:
        # the victim cannot finish the group however late a loaded machine delivers the kill.
        for _ in range(16):
            g.enqueue(gj.wait_flag, "go")
    victim = start_runtime("--concurrency", "16")
    wait_for(lambda: q(groups_db, "SELECT count(*) FROM job_runs")[0][0] >= 60, 30.0)
    victim.kill()
    assert q(groups_db, "SELECT count(*) FROM livepush_jobs WHERE group_id = %s AND state = 'running'",
             (g.handle.id,))[0][0] > 0, "the kill should leave members running"
    q(groups_db, "INSERT INTO job_flags VALUES ('go')")
    rescuer = start_runtime("--concurrency", "16")
    wait_for(lambda: (jobs.get_group(g.handle.id) or {}).get("finished_at"), 60.0, interval=0.2,
             message="the group to finish")
    wait_for(lambda: len(gj.callback_runs(groups_db)) >= 2, 30.0)
    assert rescuer.stop(timeout=15) == 0, rescuer.output()
    view = jobs.get_group(g.handle.id)
    assert (view["state"], view["total"], view["succeeded"], view["pending"]) == ("finished", 300, 300, 0)
    assert sorted(r[0] for r in gj.callback_runs(groups_db)) == ["fin", "ok"]
    assert q(groups_db, "SELECT count(*) FROM livepush_jobs WHERE group_id = %s AND attempt = 2", (g.handle.id,))[0][0] > 0
    assert version_gaps(groups_db) == []  # the rescue included: every job's topic went 1, 2, 3...


@pytest.mark.parametrize("how", ["kill -9", "stopped"])
def test_progress_a_dead_runtime_counted_is_shown_once_it_is_found_dead(
        groups_db: str, start_runtime: Callable[..., ChildProcess], how: str) -> None:
    """Progress may be coalesced, keeping the latest (docs/guarantees.md), and nothing about a
    group lives in a process (docs/groups.md): when a runtime dies in the middle of its progress
    flush, the outcomes it had counted (committed) still reach group:<id> once the runtime is
    found dead, although the group has nothing else to do for an hour. Killed -9, the next
    runtime on the machine finds it at its start; stopped (a hung or partitioned machine), the
    heartbeat finds it three beats later."""
    from tests.jobs.conftest import group_events

    with jobs.group() as g:
        for i in range(3):
            g.enqueue(gj.member, i)
        g.enqueue(gj.member, "later", wait=3600)  # keeps the group unfinished, and quiet
    with psycopg.connect(groups_db) as holder:
        # The publisher's flush locks the group row first: it waits for this lock.
        holder.execute("SELECT 1 FROM livepush_groups WHERE id = %s FOR UPDATE", (g.handle.id,))
        victim = start_runtime("--concurrency", "4")
        wait_for(lambda: (jobs.get_group(g.handle.id) or {}).get("succeeded") == 3, 30.0,
                 message="three members to be counted")
        wait_for(lambda: q(groups_db, "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                                      "AND wait_event_type = 'Lock'")[0][0] >= 1, 10.0,
                 message="the runtime's progress flush to wait for the group row")
        if how == "kill -9":
            victim.kill()
        else:
            victim.signal(signal.SIGSTOP)
    start_runtime()  # finds the victim dead (it rescues its jobs; there are none)

    def latest() -> dict[str, int] | None:
        progress = [e["data"]["group"] for e in group_events(g.handle.id) if e["data"]["event"] == "progress"]
        return progress[-1] if progress else None

    wait_for(lambda: (latest() or {}).get("succeeded") == 3, 10.0,
             message="the counted outcomes to be rung on group:<id>")


def test_groups_cancelled_while_two_runtimes_work_and_one_is_killed_finish_once_in_order(
        groups_db: str, start_runtime: Callable[..., ChildProcess]) -> None:
    """Forty groups of members that succeed, fail, retry and add members, on two runtimes; from
    another thread, cancel_group and cancels of single members at random, and kill -9 of one
    runtime midway. Every group finishes once, with counts that are its members' states, its
    callbacks run exactly once each as its outcome says, and group:<id>'s history starts with
    `created`, ends with the one `finished`, shows `cancelled` for every change after a cancel,
    and never shows fewer members ended than an earlier event did."""
    rnd = random.Random(7)
    groups: list[int] = []
    for n in range(40):
        with jobs.group(on_finish=gj.callback.request(f"fin{n}"), on_success=gj.callback.request(f"ok{n}"),
                        on_failure=gj.callback.request(f"bad{n}")) as g:
            for i in range(rnd.randint(0, 150)):
                r = rnd.random()
                if r < 0.1:
                    g.enqueue(gj.fail, f"{n}.{i}")
                elif r < 0.2:
                    g.enqueue(gj.flaky, 1, f"{n}.{i}")
                elif r < 0.3:
                    g.enqueue(gj.spawner, 2, f"{n}.{i}")
                else:
                    g.enqueue(gj.slow, rnd.random() * 0.1, f"{n}.{i}")
        groups.append(g.id)
    victim = start_runtime("--concurrency", "8")
    start_runtime("--concurrency", "8")
    stop = threading.Event()
    errors: list[Exception] = []

    def cancels() -> None:
        r = random.Random(3)
        while not stop.wait(r.random() * 0.3):
            group_id = r.choice(groups)
            try:
                if r.random() < 0.5:
                    jobs.cancel_group(group_id)
                else:
                    members, _ = jobs.group_members(group_id)
                    if members:
                        jobs.cancel(r.choice(members)["id"])
            except Exception as exc:  # reported below, after the runtimes are done
                errors.append(exc)

    def runs() -> int:
        return int(q(groups_db, "SELECT count(*) FROM job_runs")[0][0])

    canceller = threading.Thread(target=cancels, daemon=True)
    canceller.start()
    try:
        wait_for(lambda: runs() >= 400, 60.0, message="members to run on both runtimes")
        victim.kill()
        start_runtime("--concurrency", "8")
        done = runs()
        wait_for(lambda: runs() >= done + 400, 60.0, message="members to run after the kill")
    finally:
        stop.set()
        canceller.join(30)
    assert errors == []
    wait_for(lambda: all((jobs.get_group(g) or {}).get("finished_at") for g in groups), 90.0, interval=0.3,
             message="every group to finish")
    wait_for(lambda: q(groups_db, "SELECT count(*) FROM livepush_jobs WHERE callback_of IS NOT NULL "
                                  "AND state NOT IN ('succeeded', 'failed', 'cancelled')")[0][0] == 0, 30.0,
             message="every callback to run")
    ran = sorted(r[0] for r in gj.callback_runs(groups_db))
    for n, group_id in enumerate(groups):
        view = jobs.get_group(group_id)
        assert view is not None
        states = member_outcomes(groups_db, group_id)
        assert (view["pending"], view["succeeded"], view["failed"], view["cancelled"], view["total"]) == (
            0, states.get("succeeded", 0), states.get("failed", 0), states.get("cancelled", 0),
            sum(states.values())), (view, states)
        good = view["state"] == "finished" and view["failed"] == view["cancelled"] == 0
        assert [t for t in ran if t in (f"fin{n}", f"ok{n}", f"bad{n}")] == sorted(
            [f"fin{n}", f"ok{n}" if good else f"bad{n}"]), (view, ran)
        messages = [e["data"] for e in group_events(group_id)]
        names = [m["event"] for m in messages]
        assert names[0] == "created" and names[-1] == "finished" and names.count("finished") == 1, names
        if "cancelled" in names:
            assert set(names[names.index("cancelled"):]) <= {"cancelled", "finished"}, names
        ended = [m["group"]["succeeded"] + m["group"]["failed"] + m["group"]["cancelled"] for m in messages]
        assert ended == sorted(ended), messages
