"""Tags (docs/jobs.md "Enqueue options"): stored with the job, shown by get_job, listed by tag,
and cancelled by tag as jobs.cancel does (a running job in a runtime process too)."""

from __future__ import annotations

import asyncio
import re
import threading
from collections.abc import Callable
from typing import Any

import psycopg
import pytest

from livepush import jobs
from livepush.jobs import InvalidArgumentsError
from tests.jobs import sample_jobs
from tests.jobs.conftest import names_of, q, runtime_starter, version_gaps
from tests.support.procs import ChildProcess, Processes
from tests.support.settings import jobs_settings
from tests.support.waiting import async_wait_for, wait_for


@pytest.fixture
def start_runtime(jobs_db: str, procs: Processes, livepush_env: Callable[..., dict[str, str]]) -> Callable[..., ChildProcess]:
    return runtime_starter(jobs_db, "tests.jobs.sample_jobs", procs, livepush_env(database_url=jobs_db))


def test_tags_are_stored_and_shown_by_get_job(jobs_db: str) -> None:
    """get_job() returns the tags in the order given (duplicates dropped); an untagged job has none."""
    tagged = sample_jobs.record.enqueue("a", tags=["import:7", "tenant:3", "import:7"])
    plain = sample_jobs.record.enqueue("b")
    assert jobs.get_job(tagged.id).tags == ("import:7", "tenant:3")  # type: ignore[union-attr]
    assert jobs.get_job(plain.id).tags == ()  # type: ignore[union-attr]
    assert q(jobs_db, "SELECT tags FROM livepush_jobs WHERE id = %s", (plain.id,)) == [(None,)]


def test_list_tagged_newest_first_and_unfinished_only(jobs_db: str) -> None:
    handles = jobs.enqueue_many([(sample_jobs.record, [i], {"tags": ["batch:1"]}) for i in range(5)]
                                + [(sample_jobs.record, ["other"], {"tags": ["batch:2"]})])
    listed = jobs.list_tagged("batch:1")
    assert [j.id for j in listed] == [h.id for h in reversed(handles[:5])]
    assert [j.id for j in jobs.list_tagged("batch:1", limit=2)] == [handles[4].id, handles[3].id]
    assert jobs.cancel(handles[0].id)
    assert [j.id for j in jobs.list_tagged("batch:1", unfinished=True)] == [h.id for h in reversed(handles[1:5])]
    assert jobs.list_tagged("nothing") == []


@pytest.mark.parametrize("call", ["sync", "async"])
def test_list_tagged_unfinished_lists_no_job_that_finished_while_it_read(pg_url: str, call: str) -> None:
    """list_tagged(unfinished=True) reads the tagged ids and their jobs in one snapshot: a job that
    finished between two reads was listed as unfinished, with its finished state. Here the read
    of the jobs' payloads waits behind a lock while the job is cancelled."""
    with jobs_settings(pg_url):
        kept = sample_jobs.record.enqueue("kept", tags=["race"])
        ended = sample_jobs.record.enqueue("ended", tags=["race"])
        listed: list[Any] = []
        with psycopg.connect(pg_url) as holder:
            holder.execute("LOCK TABLE livepush_job_payloads IN ACCESS EXCLUSIVE MODE")
            lister = threading.Thread(target=lambda: listed.extend(
                jobs.list_tagged("race", unfinished=True) if call == "sync"
                else asyncio.run(jobs.alist_tagged("race", unfinished=True))))
            lister.start()
            wait_for(lambda: q(pg_url, "SELECT count(*) FROM pg_locks WHERE NOT granted AND relation = "
                                       "'livepush_job_payloads'::regclass")[0][0] == 1,
                     10.0, message="list_tagged to wait for the payloads")
            assert jobs.cancel(ended.id)
            holder.rollback()
        lister.join(10.0)
        assert not lister.is_alive()
        assert [(j.id, j.state) for j in listed] in ([(kept.id, "available")],
                                                      [(ended.id, "available"), (kept.id, "available")])


async def test_alist_tagged(jobs_db: str) -> None:
    handle = await sample_jobs.record.aenqueue("a", tags=["x"])
    assert [j.id for j in await jobs.alist_tagged("x")] == [handle.id]


def test_tags_are_checked_at_enqueue_and_nothing_is_written(jobs_db: str) -> None:
    """A bad tag raises InvalidArgumentsError naming it; nothing of the batch is written."""
    with pytest.raises(InvalidArgumentsError, match="wrap a single tag in a list"):
        sample_jobs.record.enqueue("a", tags="import:7")
    with pytest.raises(InvalidArgumentsError, match=r"tags\[1\] is int"):
        sample_jobs.record.enqueue("a", tags=["ok", 7])
    with pytest.raises(InvalidArgumentsError, match="more than 20"):
        sample_jobs.record.enqueue("a", tags=[f"t{i}" for i in range(21)])
    with pytest.raises(InvalidArgumentsError, match="more than 200"):
        sample_jobs.record.enqueue("a", tags=["t" * 201])
    with pytest.raises(InvalidArgumentsError, match=r"tags\[0\]"):
        jobs.enqueue_many([(sample_jobs.record, ["a"]), (sample_jobs.record, ["b"], {"tags": [""]})])
    assert q(jobs_db, "SELECT count(*) FROM livepush_jobs") == [(0,)]


@pytest.mark.parametrize("tag, says", [
    ("", "tag is str '': a tag is a non-empty str"),
    ("t" * 201, "tag is 201 characters long, more than 200"),
    (7, "tag is int 7"),
    ("a\x00b", "tag contains a NUL character"),
])
def test_a_bad_tag_to_look_up_is_named_as_the_one_tag_given(jobs_db: str, tag: object, says: str) -> None:
    """list_tagged and cancel_tagged take one tag: their errors name it as such, not as an item
    of a list the caller never passed."""
    for call in (jobs.list_tagged, jobs.cancel_tagged):
        with pytest.raises(InvalidArgumentsError, match="^" + re.escape(says)):
            call(tag)  # type: ignore[arg-type]


async def test_list_tagged_pages_past_one_call_with_before(jobs_db: str) -> None:
    """A tag on more jobs than one call lists (at most 1,000) is read page by page: before= the
    last listed id lists the older ones, sync and async alike; a cursor that is no int is refused."""
    handles = jobs.enqueue_many([(sample_jobs.record, [i], {"tags": ["paged"]}) for i in range(5)])
    ids = [h.id for h in reversed(handles)]
    first = jobs.list_tagged("paged", limit=2)
    assert [j.id for j in first] == ids[:2]
    assert [j.id for j in jobs.list_tagged("paged", limit=2, before=first[-1].id)] == ids[2:4]
    assert [j.id for j in await jobs.alist_tagged("paged", limit=2, before=ids[3])] == ids[4:]
    assert jobs.list_tagged("paged", before=ids[-1]) == []
    assert [j.id for j in jobs.list_tagged("paged", before=2**70)] == ids  # past every id: from the newest
    with pytest.raises(TypeError, match=r"before"):
        jobs.list_tagged("paged", before="7")  # type: ignore[arg-type]


@pytest.mark.parametrize("unfinished", ["no", 0, None])
async def test_unfinished_takes_only_true_or_false(jobs_db: str, unfinished: object) -> None:
    """unfinished="no" read as true would list the opposite of what was asked: anything but a
    bool is a TypeError naming unfinished=, from list_tagged and alist_tagged alike."""
    with pytest.raises(TypeError, match=r"^unfinished= must be True or False, got "):
        jobs.list_tagged("batch:1", unfinished=unfinished)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"^unfinished= must be True or False, got "):
        await jobs.alist_tagged("batch:1", unfinished=unfinished)  # type: ignore[arg-type]


def test_the_limit_counts_distinct_tags(jobs_db: str) -> None:
    """Up to 20 distinct tags: a tag repeated counts once (and is stored once), so a list naming
    20 tags with repeats is taken, and the 21st distinct tag is named in the refusal."""
    tags = [f"t{i % 20}" for i in range(45)]
    handle = sample_jobs.record.enqueue("a", tags=tags)
    assert jobs.get_job(handle.id).tags == tuple(f"t{i}" for i in range(20))  # type: ignore[union-attr]
    with pytest.raises(InvalidArgumentsError, match=r"more than 20 distinct tags: tags\[45\] 'extra'"):
        sample_jobs.record.enqueue("b", tags=[*tags, "extra"])


def test_cancel_tagged_cancels_queued_and_running_jobs_in_a_runtime_process(
        jobs_db: str, start_runtime: Callable[..., ChildProcess]) -> None:
    """cancel_tagged() cancels every unfinished job with the tag: queued ones at once, the one a
    runtime process is running when it next awaits; other tags and finished jobs are untouched."""
    running = sample_jobs.wait_flag.enqueue("never", tags=["imp:9"])
    child = start_runtime("--concurrency", "1")
    wait_for(lambda: jobs.get_job(running.id).state == "running", 15.0)  # type: ignore[union-attr]
    queued = [sample_jobs.record.enqueue(i, tags=["imp:9"], wait=60) for i in range(3)]
    other = sample_jobs.record.enqueue("o", tags=["imp:10"], wait=60)
    assert jobs.cancel_tagged("imp:9") == 4
    wait_for(lambda: jobs.get_job(running.id).state == "cancelled", 15.0)  # type: ignore[union-attr]
    assert {jobs.get_job(h.id).state for h in queued} == {"cancelled"}  # type: ignore[union-attr]
    assert jobs.get_job(other.id).state == "scheduled"  # type: ignore[union-attr]
    assert jobs.cancel_tagged("imp:9") == 0
    assert child.stop(timeout=15) == 0, child.output()


@pytest.mark.parametrize("call", ["sync", "async"])
def test_cancel_tagged_on_a_backlog_cancels_every_job_as_cancel_does(jobs_db: str, call: str) -> None:
    """A tag on a backlog of queued jobs (more than one statement's worth of them) is cancelled
    whole; tagged group members are still cancelled as cancel() does (counted in their group,
    whose on_failure runs), and each job's cancel is one version and one `cancelled` event."""
    many = jobs.enqueue_many([(sample_jobs.record, [i], {"tags": ["bulk"], **({"wait": 60} if i % 2 else {})})
                              for i in range(2_500)])
    with jobs.group(on_failure=sample_jobs.record.request("group failed")) as g:
        for i in range(3):
            g.enqueue(sample_jobs.record, f"member {i}", tags=["bulk"])
    untagged = sample_jobs.record.enqueue("untagged")
    cancelled = jobs.cancel_tagged("bulk") if call == "sync" else asyncio.run(jobs.acancel_tagged("bulk"))
    assert cancelled == 2_503
    assert q(jobs_db, "SELECT state, count(*) FROM livepush_jobs WHERE tags @> '{bulk}' GROUP BY state") == \
        [("cancelled", 2_503)]
    assert jobs.get_job(untagged.id).state == "available"  # type: ignore[union-attr]
    group = jobs.get_group(g.handle.id)
    assert group is not None and (group["state"], group["cancelled"]) == ("finished", 3), group
    assert q(jobs_db, "SELECT count(*) FROM livepush_jobs WHERE callback_of = %s", (g.handle.id,)) == [(1,)]
    assert names_of(jobs_db, many[0].id) == ["enqueued/available", "cancelled/cancelled"]
    assert names_of(jobs_db, many[1].id) == ["enqueued/scheduled", "cancelled/cancelled"]
    assert version_gaps(jobs_db) == []
    assert jobs.cancel_tagged("bulk") == 0


async def test_acancel_tagged(jobs_db: str) -> None:
    handles = [await sample_jobs.record.aenqueue(i, tags=["a:1"]) for i in range(2)]
    assert await jobs.acancel_tagged("a:1") == 2
    assert {(await jobs.aget_job(h.id)).state for h in handles} == {"cancelled"}  # type: ignore[union-attr]


async def test_a_job_that_cancels_its_own_tag_cancels_every_job_with_it(jobs_db: str) -> None:
    """A job awaiting acancel_tagged() of a tag it carries is told to stop by that very cancel
    (running jobs are taken one by one, its own id first): the cancel still goes on to its end,
    so the running jobs after it are cancelled too rather than left to run on."""
    from tests.jobs.conftest import running

    others = 40
    caller = await sample_jobs.cancels_own_tag.aenqueue("imp:self", others + 1, tags=["imp:self"])
    held = [await sample_jobs.hold.aenqueue(60, tags=["imp:self"]) for _ in range(others)]
    async with running(concurrency=others + 1):
        async def all_ended() -> bool:
            return not await jobs.alist_tagged("imp:self", unfinished=True)
        await async_wait_for(all_ended, 20.0, message="every job with the tag to end")
    states = {(await jobs.aget_job(h.id)).state for h in [caller, *held]}  # type: ignore[union-attr]
    assert states == {"cancelled"}, states
