"""The module-level API (livepush.publish() and its kin) as a process that forks uses it."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

import livepush
from livepush import api
from livepush.config import Settings, set_settings
from tests.support.procs import fork_running, forked_exit_status

WAIT = 10.0


@pytest.fixture(autouse=True)
def local_settings() -> Iterator[None]:
    """The local fan-out: what is checked here is the API's own, before any store."""
    set_settings(Settings())
    api.set_default_fanout(None)
    yield
    api.set_default_fanout(None)
    set_settings(None)


def test_a_child_forked_while_a_parent_thread_was_making_the_fan_out_publishes() -> None:
    """A process forked while another of its threads held the lock under which the first
    publish() makes the process's fan-out (a server's master that publishes from a thread, then
    forks its workers) publishes in the child all the same: the lock the child inherited, held
    by a thread it does not have, was never released, and its first publish waited for ever."""
    livepush.publish("forked:a", {"from": "parent"})
    with api._lock:  # as a parent thread inside default_fanout() holds it at the fork
        pid = fork_running(lambda: livepush.publish("forked:a", {"from": "child"}))
    assert forked_exit_status(pid, WAIT) == 0, "the child failed to publish"
    livepush.publish("forked:a", {"from": "parent"})


@pytest.mark.parametrize("held", ["the fan-out's lock", "the epochs' lock"])
def test_a_child_forked_while_a_parent_thread_was_publishing_on_the_local_fan_out_publishes(held: str) -> None:
    """The same for the local fan-out's own locks: a child forked while a parent thread was inside
    a publish (or making a fan-out, which takes a new epoch) publishes all the same, on a fan-out
    of its own process."""
    from livepush.fanout import local

    livepush.publish("forked:a", {"from": "parent"})
    fanout = api.default_fanout()
    assert isinstance(fanout, local.LocalFanOut)
    with fanout._lock if held == "the fan-out's lock" else local._epochs_lock:
        pid = fork_running(lambda: livepush.publish("forked:a", {"from": "child"})
                           and local.LocalFanOut().publish("forked:b", {"from": "child"}))
    assert forked_exit_status(pid, WAIT) == 0, "the child failed to publish"
    livepush.publish("forked:a", {"from": "parent"})


def test_publishing_on_the_local_fan_out_says_once_that_no_server_hears_it(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """A process left without the servers' URL (the local fan-out) is told, once, at its first
    publish, that what it publishes reaches no `livepush serve` and which setting to give it:
    every publish returns an offset, so without a word its messages vanished unnoticed."""
    monkeypatch.setattr(api, "_local_warning_due", True)
    with caplog.at_level("WARNING", logger="livepush"):
        livepush.publish("lonely:a", {"i": 1})
        livepush.publish("lonely:a", {"i": 2})
        api.set_default_fanout(None)  # a new fan-out in the same process: said already
        livepush.publish("lonely:a", {"i": 3})
    said = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert len(said) == 1, said
    assert "reaches no `livepush serve`" in said[0] and "LIVEPUSH_DATABASE_URL" in said[0], said


def test_a_fan_out_the_process_was_given_is_not_warned_about(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """A server's process installs its own local fan-out, which its connections hear: its
    publishes (hooks, jobs beside it) reach them, and nothing is said."""
    from livepush.fanout.local import LocalFanOut

    monkeypatch.setattr(api, "_local_warning_due", True)
    api.set_default_fanout(LocalFanOut())
    with caplog.at_level("WARNING", logger="livepush"):
        livepush.publish("served:a", {"i": 1})
    assert not [r for r in caplog.records if r.levelname == "WARNING"]


def test_a_mistyped_name_of_livepush_jobs_names_the_module() -> None:
    """`jobs.enqueu_many` says which module lacks it, as `livepush.x` does, not a bare name."""
    from livepush import jobs

    with pytest.raises(AttributeError, match=r"module 'livepush\.jobs' has no attribute 'enqueu_many'"):
        jobs.enqueu_many  # noqa: B018
    assert callable(jobs.Runtime)


def test_a_bare_import_reaches_the_api_and_every_submodule_as_attributes() -> None:
    """`import livepush` loads its API on first use; the names the docs use after it (the
    package's functions, `livepush.sessions.issue`, `livepush.fanout.from_env`,
    `livepush.metrics.REGISTRY`) are all there, and a name that is none raises AttributeError."""
    import subprocess
    import sys

    code = ("import livepush\n"
            "assert callable(livepush.publish) and livepush.Allow and callable(livepush.sessions.issue)\n"
            "assert callable(livepush.fanout.from_env) and livepush.metrics.REGISTRY is not None\n"
            "assert callable(livepush.jobs.enqueue_many) and sorted(livepush.__all__) == sorted(set(livepush.__all__))\n"
            "assert all(hasattr(livepush, name) for name in livepush.__all__)\n"
            "assert not hasattr(livepush, 'no_such_name') and not hasattr(livepush, '_private')\n")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
