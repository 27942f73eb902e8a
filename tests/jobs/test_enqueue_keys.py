"""Idempotency keys and debounce (docs/reference.md §4 Jobs, docs/jobs.md "Enqueue options"):
one unfinished job per key, whatever the number of concurrent enqueuers; a finished job frees it."""

from __future__ import annotations

import datetime
import threading
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import psycopg
import pytest

from livepush import jobs
from livepush.errors import ArgumentTypeError
from livepush.jobs import InvalidArgumentsError
from livepush.jobs.groups import building
from tests.jobs import group_jobs, sample_jobs
from tests.jobs.conftest import q, running
from tests.support import services
from tests.support.procs import ChildProcess, Processes
from tests.support.settings import jobs_settings
from tests.support.waiting import async_wait_for, wait_for


def jobs_with_key(url: str, key: str) -> list[tuple[Any, ...]]:
    return q(url, "SELECT id, state, key_slot FROM livepush_jobs WHERE key = %s ORDER BY id", (key,))


def test_a_second_enqueue_with_the_key_returns_the_first_job_and_writes_nothing(jobs_db: str) -> None:
    """While the first job with a key is unfinished, enqueue, aenqueue and enqueue_many with the key
    return its handle; nothing else is written."""
    first = sample_jobs.record.enqueue("a", key="k")
    assert sample_jobs.record.enqueue("b", key="k") == first
    assert sample_jobs.record.enqueue("c", key="k", wait=60) == first
    again = jobs.enqueue_many([(sample_jobs.record, ["d"], {"key": "k"}), (sample_jobs.record, ["e"])])
    assert again[0] == first and again[1] != first
    assert q(jobs_db, "SELECT count(*) FROM livepush_jobs") == [(2,)]
    assert q(jobs_db, "SELECT args FROM livepush_job_payloads WHERE id = %s", (first.id,)) == [(["a"],)]


async def test_aenqueue_with_the_key_returns_the_first_job(jobs_db: str) -> None:
    first = await sample_jobs.record.aenqueue("a", key="ak")
    assert await sample_jobs.record.aenqueue("b", key="ak") == first
    assert (await jobs.aenqueue_many([(sample_jobs.record, ["c"], {"key": "ak"})])) == [first]


def test_two_items_with_one_key_in_a_batch_share_the_first_ones_job(jobs_db: str) -> None:
    """In one enqueue_many, a later item with an earlier item's key gets that item's handle."""
    handles = jobs.enqueue_many([(sample_jobs.record, [i], {"key": f"b{i % 3}"}) for i in range(9)])
    assert [h.id for h in handles[3:]] == [h.id for h in handles[:3]] * 2
    assert len({h.id for h in handles}) == 3
    assert sorted(r[0] for r in q(jobs_db, "SELECT args->>0 FROM livepush_job_payloads")) == ["0", "1", "2"]


def test_a_batch_mixing_held_new_repeated_and_unkeyed_items_answers_each_in_item_order(jobs_db: str) -> None:
    """Each item gets its own job or the one holding its key, in item order; only new keys and
    unkeyed items write a job."""
    held = sample_jobs.record.enqueue("held", key="m-held")
    items = [(sample_jobs.record, ["new"], {"key": "m-new"}), (sample_jobs.record, ["x"], {"key": "m-held"}),
             (sample_jobs.record, ["plain"]), (sample_jobs.record, ["y"], {"key": "m-new"}),
             (sample_jobs.record, ["z"], {"key": "m-held"})]
    new, held_again, plain, new_again, held_third = jobs.enqueue_many(items)
    assert held_again == held_third == held
    assert new_again == new and len({new.id, plain.id, held.id}) == 3
    assert q(jobs_db, "SELECT p.args->>0 FROM livepush_job_payloads p ORDER BY p.id") == [("held",), ("new",), ("plain",)]


def test_a_finished_job_frees_its_key_and_a_cancelled_one_too(jobs_db: str) -> None:
    """Once the job with the key succeeded (or was cancelled), the next enqueue creates a new job."""
    first = sample_jobs.record.enqueue("a", key="free")
    jobs.drain()
    assert jobs.get_job(first.id).state == "succeeded"  # type: ignore[union-attr]
    second = sample_jobs.record.enqueue("b", key="free")
    assert second != first
    assert jobs.cancel(second.id)
    third = sample_jobs.record.enqueue("c", key="free")
    assert third not in (first, second)
    assert [r[1] for r in jobs_with_key(jobs_db, "free")] == ["succeeded", "cancelled", "available"]


def test_a_job_being_retried_keeps_its_key(jobs_db: str) -> None:
    """A job that failed an attempt and waits for its retry is still unfinished: it holds the key."""
    first = sample_jobs.with_default_backoff.enqueue(key="retry")
    jobs.drain(max_jobs=1)
    assert jobs.get_job(first.id).state == "scheduled"  # type: ignore[union-attr]
    assert sample_jobs.with_default_backoff.enqueue(key="retry") == first


def test_retry_failed_leaves_a_failed_job_alone_while_its_key_is_held_again(jobs_db: str) -> None:
    """A failed job freed its key; retrying it while a new job holds the key does nothing."""
    failed = sample_jobs.never.enqueue(key="rf")
    jobs.drain()
    assert jobs.get_job(failed.id).state == "failed"  # type: ignore[union-attr]
    holder = sample_jobs.never.enqueue(key="rf")
    assert holder != failed
    assert jobs.retry_failed(failed.id) is False
    assert jobs.cancel(holder.id)
    assert jobs.retry_failed(failed.id) is True
    assert sample_jobs.never.enqueue(key="rf") == failed


def test_retry_failed_leaves_a_failed_job_alone_while_a_job_queued_behind_it_holds_the_key(jobs_db: str) -> None:
    """The key's holder may be in another place of the key: a job that a debounced enqueue
    queued behind the failed one while it ran. Retrying the failed job does nothing then."""
    failed = sample_jobs.debounce_self_then_fail.enqueue("k1", key="k1")
    assert jobs.drain(max_jobs=1) == {"failed": 1}
    unfinished = "SELECT id FROM livepush_jobs WHERE key = 'k1' AND state IN ('available', 'scheduled', 'running', 'waiting')"
    [(holder,)] = q(jobs_db, unfinished)
    assert holder != failed.id
    assert jobs.retry_failed(failed.id) is False
    assert q(jobs_db, unfinished) == [(holder,)]


def retry_while_an_enqueue_of_the_key_commits(url: str, job_id: int, key: str) -> bool:
    """jobs.retry_failed(job_id) called while another transaction has enqueued `key` and not yet
    committed; that transaction commits once the retry waits for it (or returned). Returns what
    the retry answered."""
    with psycopg.connect(url) as conn, ThreadPoolExecutor(1) as pool:
        sample_jobs.record.enqueue("holder", key=key, conn=conn)
        retried = pool.submit(jobs.retry_failed, job_id)
        wait_for(lambda: retried.done() or q(url, "SELECT count(*) FROM pg_stat_activity WHERE datname = "
                                                  "current_database() AND wait_event_type = 'Lock'")[0][0] > 0,
                 10.0, message="retry_failed to wait for the enqueue's transaction")
        conn.commit()
        return retried.result(10)


def unfinished_with_key(url: str, key: str) -> list[tuple[Any, ...]]:
    return q(url, "SELECT id FROM livepush_jobs WHERE key = %s "
                  "AND state IN ('available', 'scheduled', 'running', 'waiting')", (key,))


def test_retry_failed_returns_false_when_an_enqueue_of_the_key_commits_meanwhile(jobs_db: str) -> None:
    """An enqueue of the key that commits while retry_failed() runs holds the key: the retry
    answers False and leaves the job failed, as when the key was held before it started."""
    failed = sample_jobs.never.enqueue(key="rf-race")
    jobs.drain()
    assert retry_while_an_enqueue_of_the_key_commits(jobs_db, failed.id, "rf-race") is False
    assert jobs.get_job(failed.id).state == "failed"  # type: ignore[union-attr]
    assert len(unfinished_with_key(jobs_db, "rf-race")) == 1


async def test_retry_failed_of_a_job_once_queued_behind_another_meets_a_concurrent_enqueue(jobs_db: str) -> None:
    """A job that a debounce queued behind a started one (the key's second place) and that then
    failed: retried while an enqueue of the key commits, it stays failed, and the key has one
    unfinished job, not two."""
    async with running():
        front = await sample_jobs.wait_flag.aenqueue("rf-front", key="rf-behind")
        await async_wait_for(lambda: jobs.get_job(front.id).state == "running", 10.0)  # type: ignore[union-attr]
        behind = await sample_jobs.never.aenqueue(key="rf-behind", debounce=0)
        await async_wait_for(lambda: jobs.get_job(behind.id).state == "failed", 10.0)  # type: ignore[union-attr]
        q(jobs_db, "INSERT INTO job_flags VALUES ('rf-front')")
        await async_wait_for(lambda: jobs.get_job(front.id).state == "succeeded", 10.0)  # type: ignore[union-attr]
    assert [r[2] for r in jobs_with_key(jobs_db, "rf-behind")] == [0, 1]
    assert retry_while_an_enqueue_of_the_key_commits(jobs_db, behind.id, "rf-behind") is False
    assert jobs.get_job(behind.id).state == "failed"  # type: ignore[union-attr]
    assert len(unfinished_with_key(jobs_db, "rf-behind")) == 1


def test_a_key_enqueued_inside_a_rolled_back_transaction_stays_free(jobs_db: str) -> None:
    """With conn=, the key is taken only if the caller's transaction commits."""
    with psycopg.connect(jobs_db) as conn:
        sample_jobs.record.enqueue("a", key="tx", conn=conn)
        conn.rollback()
    handle = sample_jobs.record.enqueue("b", key="tx")
    assert q(jobs_db, "SELECT id FROM livepush_jobs WHERE key = 'tx'") == [(handle.id,)]


def test_concurrent_enqueues_of_one_key_from_threads_make_one_job(jobs_db: str) -> None:
    """16 threads enqueueing the same key at once (each on its own connection, in its own
    transaction held open a moment): one job, and every caller gets its handle."""
    barrier = threading.Barrier(16)
    got: list[Any] = []

    def enqueue(i: int) -> None:
        with psycopg.connect(jobs_db) as conn:
            barrier.wait(10)
            got.append(sample_jobs.record.enqueue(i, key="race", conn=conn))
            conn.execute("SELECT pg_sleep(0.01)")  # the others wait on the key until this commits

    threads = [threading.Thread(target=enqueue, args=(i,)) for i in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert len(got) == 16 and len(set(got)) == 1
    assert len(jobs_with_key(jobs_db, "race")) == 1


def shuffled_keys_at_once(url: str, threads: int, keys: list[str],
                          enqueue: Callable[[psycopg.Connection, list[str]], list[Any]]) -> list[dict[str, Any]]:
    """Each of `threads` threads opens a transaction, waits for the others, calls `enqueue(conn,
    keys)` with the keys in its own shuffled order and commits a moment later. Returns each
    thread's {key: handle}; fails naming any thread's error (a deadlock, say)."""
    import random
    barrier = threading.Barrier(threads)
    got: list[dict[str, Any]] = []
    errors: list[BaseException] = []

    def run(seed: int) -> None:
        mine = list(keys)
        random.Random(seed).shuffle(mine)
        try:
            with psycopg.connect(url) as conn:
                barrier.wait(10)
                handles = enqueue(conn, mine)
                conn.execute("SELECT pg_sleep(0.01)")
            got.append(dict(zip(mine, handles)))
        except BaseException as exc:  # noqa: BLE001 - reported by the assertion below
            errors.append(exc)

    started = [threading.Thread(target=run, args=(seed,)) for seed in range(threads)]
    for t in started:
        t.start()
    for t in started:
        t.join(60)
    assert errors == [] and len(got) == threads
    return got


def test_concurrent_batches_sharing_keys_in_any_order_make_one_job_per_key(jobs_db: str) -> None:
    """8 threads each enqueue_many the same 300 keys, shuffled, in transactions held open a moment:
    300 jobs, every batch got the same handle per key, and none deadlocked (each batch inserts in
    key order, whatever its item order)."""
    got = shuffled_keys_at_once(jobs_db, 8, [f"b{i}" for i in range(300)], lambda conn, keys: jobs.enqueue_many(
        [(sample_jobs.record, [k], {"key": k}) for k in keys], conn=conn))
    assert all(g == got[0] for g in got)
    assert q(jobs_db, "SELECT count(*), count(DISTINCT key) FROM livepush_jobs") == [(300, 300)]


def test_concurrent_group_batches_of_many_statements_sharing_keys_do_not_deadlock(
        jobs_db: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A group's members go in statements of at most CHUNK jobs (here 50, so 1,000 keys take 20):
    6 threads each add the same keys, shuffled, in their own group and transaction. A keyed
    batch is sliced in key order, so the transactions insert in one order and none deadlocks;
    each group's members come back in item order, one job per key across the groups."""
    from livepush.jobs.groups import building

    monkeypatch.setattr(building, "CHUNK", 50)

    def in_a_group(conn: psycopg.Connection, keys: list[str]) -> list[Any]:
        with jobs.group(conn=conn) as g:
            g.enqueue_many([(sample_jobs.record, [k], {"key": k}) for k in keys])
        return g.members

    got = shuffled_keys_at_once(jobs_db, 6, [f"c{i}" for i in range(1000)], in_a_group)
    assert all(g == got[0] for g in got)
    assert q(jobs_db, "SELECT count(*), count(DISTINCT key) FROM livepush_jobs") == [(1000, 1000)]
    assert all(q(jobs_db, "SELECT key FROM livepush_jobs WHERE id = %s", (h.id,)) == [(k,)] for k, h in got[0].items())


@pytest.fixture
def icu_jobs_db(pg_admin_url: str) -> Iterator[str]:
    """A migrated database whose collation is ICU English, as the jobs' database: 'a' sorts
    before 'B' there, where code points put 'B' first (the test cluster's C.UTF-8 does that)."""
    from livepush.migrate import migrate

    name = f"t_icu_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(pg_admin_url, autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE \"{name}\" ENCODING 'UTF8' LOCALE_PROVIDER icu ICU_LOCALE 'en' "  # type: ignore[arg-type]
                     "LOCALE 'C.UTF-8' TEMPLATE template0")
    url = services.db_url(pg_admin_url, name)
    try:
        migrate(url)
        with jobs_settings(url):
            yield url
    finally:
        services.drop_database(pg_admin_url, name)


def blocked(url: str, conn: psycopg.Connection) -> bool:
    """Whether `conn`'s backend waits for a lock."""
    return q(url, "SELECT count(*) FROM pg_locks WHERE pid = %s AND NOT granted", (conn.info.backend_pid,)) != [(0,)]


def test_a_sliced_group_batch_and_a_one_statement_batch_do_not_deadlock_whatever_the_collation(
        icu_jobs_db: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A group's batch goes in slices in key order and a smaller batch in one statement: both insert
    in code point order, whatever the database's collation. Under its collation the one statement
    inserted 'a' and then waited for the group's 'B', while the group, which sliced 'B' before 'a',
    waited for it: Postgres broke the deadlock by failing one of them."""
    url = icu_jobs_db
    assert q(url, "SELECT 'a' < 'B'") == [(True,)]
    monkeypatch.setattr(building, "CHUNK", 1)  # one statement per key: B, then C, then a
    errors: list[BaseException] = []
    got: dict[str, list[Any]] = {}

    def in_a_group(conn: psycopg.Connection) -> None:
        try:
            with jobs.group(conn=conn) as g:
                g.enqueue_many([(sample_jobs.record, [k], {"key": k}) for k in ("B", "C", "a")])
            conn.commit()
            got["group"] = g.members
        except BaseException as exc:  # noqa: BLE001 - reported by the assertion below
            errors.append(exc)

    def in_one_statement(conn: psycopg.Connection) -> None:
        try:
            got["batch"] = jobs.enqueue_many([(sample_jobs.record, [k], {"key": k}) for k in ("a", "B")], conn=conn)
            conn.commit()
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    with psycopg.connect(url) as gate, psycopg.connect(url) as first, psycopg.connect(url) as second:
        held = sample_jobs.record.enqueue("gate", key="C", conn=gate)  # holds the group at its second slice
        group = threading.Thread(target=in_a_group, args=(first,))
        group.start()
        wait_for(lambda: blocked(url, first), 10.0, message="the group's add waiting at key C")
        batch = threading.Thread(target=in_one_statement, args=(second,))
        batch.start()
        wait_for(lambda: blocked(url, second), 10.0, message="the batch waiting for the group's key")
        gate.commit()
        group.join(30)
        batch.join(30)
    assert errors == []
    by_key = {k: h for k, h in zip(("B", "C", "a"), got["group"])}
    assert by_key["C"] == held and got["batch"] == [by_key["a"], by_key["B"]]


def test_a_batch_of_twenty_thousand_keys_takes_no_lock_per_key(jobs_db: str) -> None:
    """A lock per key would run Postgres out of lock memory (64 per connection by default) long
    before this; the keys' unique index is what serializes enqueues of a key."""
    handles = jobs.enqueue_many([(sample_jobs.record, [i], {"key": f"big{i}"}) for i in range(20_000)])
    assert len(set(handles)) == 20_000
    assert jobs.enqueue_many([(sample_jobs.record, [0], {"key": "big0"})]) == [handles[0]]


RACER = """
import sys
from livepush import jobs
from livepush.errors import ArgumentTypeError
from tests.jobs import group_jobs, sample_jobs
handles = [sample_jobs.record.enqueue(i, key=f"p{i}") for i in range(int(sys.argv[1]))]
print(",".join(str(h.id) for h in handles), flush=True)
"""


def test_concurrent_enqueues_of_many_keys_from_processes_make_one_job_per_key(
        jobs_db: str, procs: Processes, livepush_env: Callable[..., dict[str, str]]) -> None:
    """4 processes enqueue the same 200 keys at once: 200 jobs, and all 4 got the same handles."""
    import sys
    env = livepush_env(database_url=jobs_db)
    children: list[ChildProcess] = [procs.start([sys.executable, "-c", RACER, "200"], env=env) for _ in range(4)]
    for child in children:
        assert child.wait(60) == 0, child.output()
    outputs = {child.stdout().strip() for child in children}
    assert len(outputs) == 1, outputs
    assert q(jobs_db, "SELECT count(*), count(DISTINCT key) FROM livepush_jobs") == [(200, 200)]


def test_debounce_replaces_a_pending_job_and_moves_its_run_time(jobs_db: str) -> None:
    """debounce= with a pending job of the key: its arguments are the new ones, it runs `debounce`
    seconds from now, and its topic gets a new version; no second job."""
    first = sample_jobs.record.enqueue("a", key="d", debounce=30)
    before = q(jobs_db, "SELECT run_at, version FROM livepush_jobs WHERE id = %s", (first.id,))[0]
    second = sample_jobs.record.enqueue("b", key="d", debounce=60)
    assert second == first
    run_at, version, state = q(jobs_db, "SELECT run_at, version, state FROM livepush_jobs WHERE id = %s",
                               (first.id,))[0]
    now = q(jobs_db, "SELECT now()")[0][0]
    assert state == "scheduled" and version == before[1] + 1
    assert datetime.timedelta(seconds=55) < run_at - now <= datetime.timedelta(seconds=60)
    assert run_at > before[0]
    assert q(jobs_db, "SELECT args FROM livepush_job_payloads WHERE id = %s", (first.id,)) == [(["b"],)]
    assert len(jobs_with_key(jobs_db, "d")) == 1


def test_debounce_leaves_a_job_waiting_for_its_retry_and_replaces_the_one_queued_behind_it(jobs_db: str) -> None:
    """A job waiting for its next attempt has started: its retry finishes what it began with its
    arguments. A debounce leaves it as it is (arguments, attempts spent, error) and queues the new
    arguments behind it; the next debounce replaces that job, the key's one pending job that has
    not started."""
    first = sample_jobs.flaky.enqueue(99, key="retrying")  # 3 attempts, each failing
    assert jobs.drain(max_jobs=1) == {"retrying": 1}
    behind = sample_jobs.flaky.enqueue(0, key="retrying", debounce=30)
    assert behind != first
    assert sample_jobs.flaky.enqueue(1, key="retrying", debounce=30) == behind
    waiting = jobs.get_job(first.id)
    assert waiting is not None and waiting.error
    assert (waiting.state, waiting.attempt, waiting.args) == ("scheduled", 1, [99])
    assert q(jobs_db, "SELECT args FROM livepush_job_payloads WHERE id = %s", (behind.id,)) == [([1],)]
    assert [(row[0], row[2]) for row in jobs_with_key(jobs_db, "retrying")] == [(first.id, 0), (behind.id, 1)]


def test_debounce_replacing_a_retried_failed_job_drops_the_error_of_the_arguments_it_replaced(jobs_db: str) -> None:
    """jobs.retry_failed() queues a failed job again, its last error kept. A debounce that then
    replaces it shows the new arguments as enqueued without that error, which they never met."""
    failed = sample_jobs.never.enqueue(key="retried")
    assert jobs.drain() == {"failed": 1} and jobs.retry_failed(failed.id)
    assert sample_jobs.record.enqueue("new", key="retried", debounce=30).id == failed.id
    replaced = jobs.get_job(failed.id)
    assert replaced is not None and (replaced.name, replaced.args, replaced.error) == ("t.record", ["new"], None)


def test_debounce_replaces_a_pending_job_of_another_function_with_the_job_it_asks_for(jobs_db: str) -> None:
    """Keys are shared by every job function. A debounced enqueue that replaces the key's pending
    job makes it the job asked for, whole: its function, queue, priority and attempts with the new
    arguments. Only the arguments moved, so the other function would have run them (unchecked
    by its schema, on its own queue)."""
    first = sample_jobs.record.enqueue("for record", key="shared", wait=60)
    second = sample_jobs.other_queue.enqueue("for other_queue", key="shared", debounce=30)
    assert second.id == first.id and second.name == "t.other_queue"
    info = jobs.get_job(second.id)
    assert info is not None
    assert (info.name, info.queue, info.args) == ("t.other_queue", "second", ["for other_queue"])
    assert len(jobs_with_key(jobs_db, "shared")) == 1


def test_debounce_leaves_a_task_group_member_alone_and_queues_one_behind_it(jobs_db: str) -> None:
    """A pending job that is a task group's member is the group's: replaced by a debounce from
    outside, it became that call's function and arguments while its group (or the durable job
    waiting for it as a child) counted its outcome as the member's. The debounce leaves it as it is
    and queues a job of its own, in no group, behind it; the next debounce replaces that one."""
    with jobs.group() as g:
        g.enqueue(sample_jobs.record, "member", key="grouped")
    (member,) = jobs_with_key(jobs_db, "grouped")
    behind = sample_jobs.other_queue.enqueue("outside", key="grouped", debounce=30)
    assert behind.id != member[0]
    assert sample_jobs.other_queue.enqueue("later", key="grouped", debounce=30) == behind
    kept = jobs.get_job(member[0])
    assert kept is not None and (kept.name, kept.args, kept.state) == ("t.record", ["member"], "available")
    assert q(jobs_db, "SELECT id, group_id FROM livepush_jobs WHERE key = 'grouped' ORDER BY id") == [
        (member[0], g.id), (behind.id, None)]
    assert jobs.get_job(behind.id).args == ["later"]  # type: ignore[union-attr]
    assert sample_jobs.record.enqueue("plain", key="grouped").id == member[0]


def test_debounce_in_a_long_transaction_counts_from_the_call_not_the_transactions_start(jobs_db: str) -> None:
    """debounce= runs the job that many seconds after the call. In a caller's transaction that
    has been open for longer than that, counting from its start made the job due at once, so the
    next debounced call found it started and queued a second job instead of replacing it."""
    with psycopg.connect(jobs_db) as conn:
        conn.execute("SELECT pg_sleep(0.5)")  # the transaction is half a second old
        (called,) = conn.execute("SELECT clock_timestamp()").fetchone()  # type: ignore[misc]
        handle = sample_jobs.record.enqueue("a", key="long-tx", debounce=0.2, conn=conn)
        (run_at,) = conn.execute("SELECT run_at FROM livepush_jobs WHERE id = %s", (handle.id,)).fetchone()  # type: ignore[misc]
    assert run_at - called >= datetime.timedelta(seconds=0.2)


def test_concurrent_debounced_enqueues_of_one_key_leave_one_pending_job(jobs_db: str) -> None:
    """12 threads debouncing one key at once: one job, holding one of their arguments, and every
    caller got its handle."""
    barrier = threading.Barrier(12)
    got: list[Any] = []

    def enqueue(i: int) -> None:
        with psycopg.connect(jobs_db) as conn:
            barrier.wait(10)
            got.append(sample_jobs.record.enqueue(i, key="deb", debounce=30, conn=conn))

    threads = [threading.Thread(target=enqueue, args=(i,)) for i in range(12)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert len(got) == 12 and len(set(got)) == 1
    assert [r[1] for r in jobs_with_key(jobs_db, "deb")] == ["scheduled"]
    [(args,)] = q(jobs_db, "SELECT args FROM livepush_job_payloads")
    assert args[0] in range(12)


def test_debounce_needs_a_key_and_excludes_wait() -> None:
    with pytest.raises(ValueError, match="debounce= needs key="):
        sample_jobs.record.enqueue("a", debounce=5)
    with pytest.raises(ValueError, match="without wait= or at="):
        sample_jobs.record.enqueue("a", key="x", debounce=5, wait=1)
    with pytest.raises(ValueError, match="zero or more"):
        sample_jobs.record.enqueue("a", key="x", debounce=-1)
    with pytest.raises(ValueError, match="more than a year"):
        sample_jobs.record.enqueue("a", key="x", debounce=1e12)
    with pytest.raises(InvalidArgumentsError, match="key= takes a non-empty str"):
        sample_jobs.record.enqueue("a", key="")
    with pytest.raises(TypeError, match="debounce= is for a single enqueue"):
        jobs.enqueue_many([(sample_jobs.record, ["a"], {"key": "x", "debounce": 1})])


def test_enqueue_many_item_options_that_are_not_a_dict_are_refused_by_name() -> None:
    with pytest.raises(TypeError, match="item options are a dict of .* got list"):
        jobs.enqueue_many([(sample_jobs.record, ["a"], ["key"])])


def test_enqueue_many_item_options_with_unknown_names_of_mixed_types_are_named_with_the_item(jobs_db: str) -> None:
    """Unknown option names that Python cannot order among themselves (a str and an int) are
    named as any unknown option is, after the call and the item's place; the refusal was
    sorted()'s own TypeError, naming neither the item nor the options it takes."""
    with pytest.raises(ArgumentTypeError, match=r"enqueue_many\(\) item 1: item options take .*got \[1, 'retries'\]"):
        jobs.enqueue_many([(sample_jobs.record, ["a"]), (sample_jobs.record, ["b"], {"retries": 3, 1: True})])
    assert q(jobs_db, "SELECT count(*) FROM livepush_jobs") == [(0,)]


async def test_debounce_leaves_a_running_job_alone_and_queues_one_behind_it(jobs_db: str) -> None:
    """A job with the key already running is not touched: the debounced enqueue queues a new one
    (the key then has one running and one pending job); a further debounce replaces the pending one,
    and a plain enqueue with the key returns the first (running) job."""
    async with running():
        front = await sample_jobs.wait_flag.aenqueue("go-front", key="dr", debounce=0)
        await async_wait_for(lambda: jobs.get_job(front.id).state == "running", 10.0)  # type: ignore[union-attr]
        behind = await sample_jobs.wait_flag.aenqueue("x", key="dr", debounce=30)
        assert behind != front
        assert await sample_jobs.wait_flag.aenqueue("go-behind", key="dr", debounce=30) == behind
        assert await sample_jobs.wait_flag.aenqueue("y", key="dr") == front
        rows = jobs_with_key(jobs_db, "dr")
        assert [(r[0], r[1], r[2]) for r in rows] == [(front.id, "running", 0), (behind.id, "scheduled", 1)]
        assert q(jobs_db, "SELECT args FROM livepush_job_payloads WHERE id = %s", (behind.id,)) == [(["go-behind"],)]
        q(jobs_db, "INSERT INTO job_flags VALUES ('go-front')")
        await async_wait_for(lambda: jobs.get_job(front.id).state == "succeeded", 10.0)  # type: ignore[union-attr]
    # The front job finished; the one behind holds the key now.
    assert sample_jobs.wait_flag.enqueue("z", key="dr") == behind


def test_a_key_longer_than_the_limit_is_refused() -> None:
    with pytest.raises(InvalidArgumentsError, match="characters long"):
        sample_jobs.record.enqueue("a", key="k" * 501)


def test_group_members_with_a_key_held_elsewhere_are_not_counted(jobs_db: str) -> None:
    """In a group, an item whose key an unfinished job holds gets that job's handle and is not a
    member; the group counts only the jobs it created."""
    outside = sample_jobs.record.enqueue("o", key="g1")
    with jobs.group() as g:
        g.enqueue(sample_jobs.record, "a", key="g1")
        g.enqueue(sample_jobs.record, "b", key="g2")
        g.enqueue(sample_jobs.record, "c", key="g2")
    assert g.members[0] == outside and g.members[1] == g.members[2] != outside
    assert q(jobs_db, "SELECT count(*) FROM livepush_jobs WHERE group_id = %s", (g.id,)) == [(1,)]
    jobs.drain()
    group = jobs.get_group(g.id)
    assert group is not None and (group["state"], group["total"], group["succeeded"]) == ("finished", 1, 1)


def test_a_group_block_whose_every_key_is_held_elsewhere_finishes_at_its_seal(jobs_db: str) -> None:
    """A block whose items all get the handles of jobs outside it has no member: it is an empty
    group, and an empty group finishes at its seal (its on_finish runs), rather than waiting for
    members that will never come."""
    outside = sample_jobs.record.enqueue("o", key="held")
    with jobs.group(on_finish=sample_jobs.record.request("fin")) as g:
        g.enqueue(sample_jobs.record, "a", key="held")
    assert g.members == [outside]
    group = jobs.get_group(g.id)
    assert group is not None and (group["state"], group["total"], group["pending"]) == ("finished", 0, 0)
    assert q(jobs_db, "SELECT count(*) FROM livepush_jobs WHERE callback_of = %s", (g.id,)) == [(1,)]


def test_a_refused_item_leaves_its_key_to_the_next_item_of_a_group_block(jobs_db: str) -> None:
    """A g.enqueue() refused for a bad option (here its tags) adds nothing, its key included: a
    block that catches the error and enqueues the key again gets one member with that key."""
    with jobs.group() as g:
        with pytest.raises(InvalidArgumentsError, match="tags"):
            g.enqueue(sample_jobs.record, "refused", key="kept", tags=[""])
        g.enqueue(sample_jobs.record, "taken", key="kept")
        g.enqueue(sample_jobs.record, "again", key="kept")
    first, again = g.members
    assert first == again
    assert q(jobs_db, "SELECT p.args->>0 FROM livepush_jobs j JOIN livepush_job_payloads p USING (id) "
                      "WHERE j.key = 'kept'") == [("taken",)]
    group = jobs.get_group(g.id)
    assert group is not None and group["total"] == 1


def test_a_refused_g_enqueue_many_adds_none_of_its_items(jobs_db: str) -> None:
    """g.enqueue_many() refused for one of its items adds none of them, keys included: a block
    that catches the error goes on with only what it adds afterwards."""
    with jobs.group() as g:
        with pytest.raises(InvalidArgumentsError, match="tags"):
            g.enqueue_many([(sample_jobs.record, ["before"]), (sample_jobs.record, ["keyed"], {"key": "many"}),
                            (sample_jobs.record, ["refused"], {"tags": [""]})])
        g.enqueue(sample_jobs.record, "after", key="many")
    assert q(jobs_db, "SELECT p.args->>0, j.key FROM livepush_jobs j JOIN livepush_job_payloads p USING (id)") \
        == [("after", "many")]
    assert len(g.members) == 1
    group = jobs.get_group(g.id)
    assert group is not None and group["total"] == 1


def test_a_key_repeated_across_a_large_groups_statements_gets_one_job(jobs_db: str,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """A group block too big for one insert statement is split in key order, never inside a run of
    one key: an item repeating a key gets its first item's job whatever the split."""
    monkeypatch.setattr(building, "CHUNK", 2)
    with jobs.group() as g:
        for i, key in enumerate(["b", "a", "a", "a", "c"]):
            g.enqueue(sample_jobs.record, i, key=f"split:{key}")
    b, a1, a2, a3, c = g.members
    assert a1 == a2 == a3 and len({b.id, a1.id, c.id}) == 3
    assert q(jobs_db, "SELECT count(*) FROM livepush_jobs WHERE group_id = %s", (g.id,)) == [(3,)]


def test_every_way_of_adding_to_a_group_takes_a_key(jobs_db: str) -> None:
    """add_to_group, GroupHandle.add and add_many_to_group: a key held by an unfinished job gives
    its handle back, and only the jobs created count as members."""
    g = jobs.create_group()
    first = jobs.add_to_group(g.id, sample_jobs.record, "a", key="m1", tags=["t1"])
    assert jobs.add_to_group(g.id, sample_jobs.record, "b", key="m1") == first
    assert g.add(sample_jobs.record, "c", key="m1") == first
    second, again = jobs.add_many_to_group(g.id, [(sample_jobs.record, ["d"], {"key": "m2"}),
                                                  (sample_jobs.record, ["e"], {"key": "m2"})])
    assert second == again != first
    assert jobs.get_job(first.id).tags == ("t1",)
    assert jobs.seal_group(g.id) is True
    jobs.drain()
    group = jobs.get_group(g.id)
    assert group is not None and (group["state"], group["total"], group["succeeded"]) == ("finished", 2, 2)


async def test_aadd_to_group_takes_a_key(jobs_db: str) -> None:
    g = await jobs.acreate_group()
    first = await jobs.aadd_to_group(g.id, sample_jobs.record, "a", key="am")
    assert await jobs.aadd_to_group(g.id, sample_jobs.record, "b", key="am") == first
    assert q(jobs_db, "SELECT count(*) FROM livepush_jobs WHERE group_id = %s", (g.id,)) == [(1,)]


def test_a_running_member_adds_to_its_group_with_a_key(jobs_db: str) -> None:
    """ctx.group.enqueue (async and sync jobs) with one key three times adds one member."""
    with jobs.group() as g:
        g.enqueue(group_jobs.keyed_spawner, 3, "ka")
        g.enqueue(group_jobs.keyed_spawner_sync, 3, "ks")
    jobs.drain()
    assert sorted(r[0] for r in q(jobs_db, "SELECT key FROM job_runs WHERE key LIKE 'k_:%%'")) == ["ka:1", "ks:1"]
    group = jobs.get_group(g.id)
    assert group is not None and (group["state"], group["total"], group["succeeded"]) == ("finished", 4, 4)
