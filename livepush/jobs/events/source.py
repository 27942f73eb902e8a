"""The state topics of jobs, groups and workflow runs, as the server reads them: `JobStates` is
the StateSource (livepush.types) the wiring registers for `job:`, `group:` and `workflow:`.

Changes ring `livepush_states` ("TOPIC [VERSION]" a line; an enqueue "job:FIRST-LAST" for the
id range it created) in the transaction that made them; `JobStates` hands each named topic or
range to the server, which reads the current state here, from the rows. A line that does not
parse is dropped with a debug line: the ring is only a hint. A server also rings the channel
itself ("canary TOKEN", `ring_canary`), to show its readiness check that rings are heard.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from psycopg.rows import dict_row

from ...channels import ListenerSlot
from ...postgres.connect import translated
from ...postgres.listener import Listener
from ...postgres.pools import LoopPools
from ...postgres.text import BIGINT_MAX
from ...topics import STATE_ID_PATTERN
from ...types import State, Topic
from .. import queries
from ..groups import queries as group_queries
from ..workflows import queries as workflow_queries
from .views import group_state, job_state, workflow_state

log = logging.getLogger("livepush.jobs.events")

_LINE = re.compile(rf"(job|group|workflow):({STATE_ID_PATTERN})(?: ([0-9]{{1,19}})|-({STATE_ID_PATTERN}))?")
MAX_LINES = 150  # what livepush_state_changed() puts in one notification
_CANARY = re.compile(r"canary ([0-9A-Za-z-]{1,64})")


@dataclass
class Ring:
    """What one `livepush_states` notification names: topics that changed (with their new
    version when it says), and id ranges of rows that may have been created."""

    changed: list[tuple[Topic, int | None]] = field(default_factory=list)
    created: list[tuple[str, int, int]] = field(default_factory=list)  # (prefix "job:", first, last)


def parse_ring(payload: str) -> Ring:
    """The lines of a `livepush_states` notification that parse ("TOPIC", "TOPIC VERSION",
    "KIND:FIRST-LAST", canonical ASCII decimal within a bigint); the rest is dropped."""
    ring = Ring()
    for line in payload.split("\n", MAX_LINES)[:MAX_LINES]:
        m = _LINE.fullmatch(line)
        kind, ident, version, last = m.groups() if m is not None else ("", "0", None, None)
        if (m is None or int(ident) > BIGINT_MAX or (version is not None and int(version) > BIGINT_MAX)
                or (last is not None and not int(ident) <= int(last) <= BIGINT_MAX)):
            if line:
                log.debug("dropped a line on %s that names no state topic: %r", queries.STATE_CHANNEL, line[:80])
            continue
        if last is not None:
            ring.created.append((f"{kind}:", int(ident), int(last)))
        else:
            ring.changed.append((f"{kind}:{ident}", int(version) if version else None))
    return ring


class JobStates:
    """`job:<id>`, `group:<id>` and `workflow:<id>`, read from the jobs' database at `url`. `listener`: the process's
    shared Postgres listener on that database (else one of its own)."""

    prefixes: tuple[str, ...] = ("job:", "group:", "workflow:")

    def __init__(self, url: str, *, listener: Listener | None = None) -> None:
        self.url = url
        self._pools = LoopPools(url, name="livepush-states")
        self._listener = ListenerSlot(listener, lambda: Listener(url))
        self._on_change: Callable[[Topic, int | None], None] | None = None
        self._on_created: Callable[[str, int, int], None] | None = None
        self._on_canary: Callable[[str], None] | None = None

    def watch(self, on_change: Callable[[Topic, int | None], None], on_resync: Callable[[], None],
              on_created: Callable[[str, int, int], None],
              on_canary: Callable[[str], None] | None = None) -> None:
        self._on_change = on_change
        self._on_created = on_created
        self._on_canary = on_canary
        self._listener.get().add(queries.STATE_CHANNEL, self._on_ring, on_resync=on_resync)

    async def listen(self) -> None:
        await self._listener.get().start()

    @property
    def listening(self) -> bool:
        return self._listener.listening

    def relisten(self, reason: str) -> None:
        # The listener's other channels (revocations, a runtime's rings) resync too: they heard
        # nothing either.
        self._listener.get().relisten(reason)

    def _on_ring(self, payload: str) -> None:
        if self._on_change is None or self._on_created is None:
            return
        canary = _CANARY.fullmatch(payload)
        if canary is not None:
            if self._on_canary is not None:
                self._on_canary(canary.group(1))
            return
        ring = parse_ring(payload)
        for topic, version in ring.changed:
            self._on_change(topic, version)
        for prefix, first, last in ring.created:
            self._on_created(prefix, first, last)

    async def read(self, topics: Sequence[Topic], *, timeout: float | None = None) -> dict[Topic, State]:
        ids: dict[str, list[int]] = {"job": [], "group": [], "workflow": []}
        for topic in topics:
            kind, _, ident = topic.partition(":")
            if kind in ids and ident.isascii() and ident.isdigit() and int(ident) <= BIGINT_MAX:
                ids[kind].append(int(ident))
        jobs, groups, workflows = ids["job"], ids["group"], ids["workflow"]
        out: dict[Topic, State] = {}
        if not jobs and not groups and not workflows:
            return out
        with translated(self.url):
            # `timeout` caps the wait for a connection (psycopg_pool's 30 s otherwise), all a read
            # does while Postgres restarts: a subscribe's answer keeps its bound with it.
            async with (await self._pools.aget()).connection(timeout=timeout) as conn:
                async with conn.cursor(row_factory=dict_row) as cur:
                    if jobs:
                        await cur.execute(queries.JOB_STATES, {"ids": jobs})
                        for row in await cur.fetchall():
                            out[f"job:{row['id']}"] = job_state(row)
                    if groups:
                        await cur.execute(group_queries.GROUP_VIEWS, {"ids": groups})
                        for row in await cur.fetchall():
                            out[f"group:{row['id']}"] = group_state(row)
                    if workflows:
                        await cur.execute(workflow_queries.TOPIC_VIEWS, {"ids": workflows})
                        for row in await cur.fetchall():
                            out[f"workflow:{row['id']}"] = workflow_state(row)
        return out

    async def ring_canary(self, token: str) -> None:
        """Ring "canary TOKEN" from the pool, not from the listening connection: a listener that
        hears nothing from other sessions (a frozen backend, a pooler in transaction mode) may
        still hear its own session's rings."""
        with translated(self.url):
            async with (await self._pools.aget()).connection() as conn:
                await conn.execute(queries.RING_STATES_CANARY, {"token": token})

    async def aclose(self) -> None:
        await self._listener.aclose()
        await self._pools.aclose()
