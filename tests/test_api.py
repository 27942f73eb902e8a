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
