"""The WARNING for a sync call made on a running event loop (docs/reference.md#4-python-api).

A sync call of livepush's that makes a round trip (a publish, an enqueue, a job's read) works on
a running loop (an async view or endpoint, an async job), but the loop waits for it and serves
nothing else meanwhile: the app slows down without an error. Each such call says so once a
process, naming where it was made and the async twin to await. Its own module, imported by both
livepush.api and livepush.jobs, which import nothing of each other for it.
"""

from __future__ import annotations

import asyncio
import logging
import os
import sys

log = logging.getLogger("livepush")

# The calls this process has warned about: one WARNING per call name, since an async view that
# makes one makes it at every request, and one call's warning must not hide another's.
_said: set[str] = set()

# Code of livepush's own (an integration's wrapper, the Django backend, the demo) calls the sync
# API where its own user made the call: that user's call is the one to name, or none at all.
_PACKAGE = os.path.dirname(os.path.abspath(__file__)) + os.sep


def _after_fork() -> None:
    """A forked worker is a process of its own, which says its own warnings."""
    _said.clear()


os.register_at_fork(after_in_child=_after_fork)


def due(call: str) -> bool:
    """Whether `call` runs on a running event loop and has not been warned about yet. The hot
    path's whole cost: a set lookup, and get_running_loop(), a C call that reads the thread's
    state. A thread (asyncio.to_thread(), sync_to_async()) has no running loop: what a sync call is for."""
    if call in _said:
        return False
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


def say(call: str, instead: str, depth: int, shown: str | None = None, where: str | None = None,
        advice: str | None = None) -> None:
    """Warn once about `call` (shown as `shown`, a job's own name in it, when given), made by the
    code `depth` frames above this one, unless that code is livepush's own (its user's call, if
    any, is warned about where it was made). `where` names the place instead of that frame, and
    `advice` replaces the advice to await `instead`: for a template tag, whose caller is the
    template engine and whose template cannot await."""
    caller = sys._getframe(depth)
    if caller.f_code.co_filename.startswith(_PACKAGE):
        return
    if call in _said:
        return
    _said.add(call)
    advice = advice or (f"write `await {instead}` there, or call it in a thread (asyncio.to_thread(), "
                        "sync_to_async())")
    log.warning("livepush: %s was called on a running event loop, at %s (an async view or endpoint, an async "
                "job): it works, but the loop waits for its round trip and serves nothing else meanwhile; "
                "%s. Said once a process for each such call, at its first", shown or call,
                where or f"{caller.f_code.co_filename}:{caller.f_lineno}", advice)


def warn_if_on_event_loop(call: str, instead: str) -> None:
    """Called first thing by the sync `call`: warn once a process if it runs on a running event
    loop, naming the code that called it and `instead`, its async twin."""
    if due(call):
        say(call, instead, 3)  # 0: say, 1: this, 2: `call`, 3: its caller
