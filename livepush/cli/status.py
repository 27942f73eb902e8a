"""`livepush status [--json] [--limit N]`: the job runtime as the database shows it now, and the
servers listening.

Plain output is a report for people (one section each: queues, runtimes, groups, workflows,
tags, periodic jobs, servers); `--json` prints the same data as one JSON document for scripts. Servers register
nowhere: the report lists the listening connections their database (and Redis, when one is
configured) shows, each server holding one on each.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from datetime import datetime, timedelta

from typing import Any

from ..config import Settings, read_number
from ..errors import DependencyError, LoginRefused
from ..jobs import database
from ..jobs.api.status import DEFAULT_LIMIT, MAX_LIMIT, Status, status
from ..jobs.events.views import iso
from ..postgres.urls import redact
from ..postgres.listener import listening_backends
from ..redis.client import deployment_prefix, listener_name
from ..redis.subscriber import subscribed_clients
from .logs import printable

SERVERS_NOTE = "each server's own view: GET /readyz on its port (what a load balancer should ask)"


def _limit(text: str) -> int:
    try:
        value = int(read_number(text, int))
    except ValueError:
        value = 0
    if not 1 <= value <= MAX_LIMIT:
        raise argparse.ArgumentTypeError(f"takes a whole number from 1 to {MAX_LIMIT}, got {text!r}")
    return value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print one JSON document instead of the report")
    parser.add_argument("--limit", type=_limit, default=DEFAULT_LIMIT, metavar="N",
                        help=f"task groups and workflow runs in progress shown, newest first, and tags most carried, "
                             f"from 1 to {MAX_LIMIT} (default {DEFAULT_LIMIT})")


def run(args: argparse.Namespace, settings: Settings) -> int:
    from ..migrate import schema_named_when_missing

    url = settings.require_database()
    try:
        with schema_named_when_missing(url, "livepush status"):
            report = status(args.limit)
    finally:
        # A one-shot command: close the pool now rather than leave it to interpreter exit.
        database.close_pools()
    servers, missing = listening_servers(settings)
    at = datetime.fromisoformat(report.at)
    servers = [_dated(s, at) for s in servers]
    if args.json:
        # A listener's start time as the report's other times are (ISO 8601, UTC), not str()'s form.
        print(json.dumps(report.as_dict() | {"servers": [{k: iso(v) for k, v in s.items()} for s in servers]},
                         indent=2, default=str))
    else:
        print(render(report, redact(url), servers))
    if isinstance(missing, LoginRefused):
        # Redis is up and refused the URL's login: the report is printed, and the command ends as a
        # refused Postgres login ends it (exit 2, one line), not as Redis down, which a script
        # retries though nothing changes until the setting is corrected.
        sys.stdout.flush()  # the report before the line, and a reader gone is still caught as one
        raise LoginRefused(f"the servers listening on Redis are not listed: {missing}") from None
    return 0 if missing is None else 1


def listening_servers(settings: Settings) -> tuple[list[dict[str, Any]], DependencyError | None]:
    """The listening connections of servers: on the database, and on Redis when one is set; and
    why Redis could not be asked (None when it could). Redis down is said on stderr here; a
    refused login is left to the caller, whose exit status differs."""
    servers: list[dict[str, Any]] = [{"via": "postgres", **row}
                                     for row in listening_backends(settings.require_database())]
    if settings.redis_url:
        # Only this deployment's: other deployments may share the Redis, under other prefixes.
        prefix = deployment_prefix(settings.redis_url, settings.redis_prefix)
        try:
            on_redis = subscribed_clients(settings.redis_url, listener_name(prefix))
        except LoginRefused as exc:
            return servers, exc
        except DependencyError as exc:
            # Redis down is when an operator most needs the jobs' report: print it with the
            # database's servers, say what is missing, and exit 1 as for any dependency that failed.
            print(f"livepush status: the servers listening on Redis are not listed: {exc}", file=sys.stderr)
            return servers, exc
        if on_redis is None:
            # The rest of the report stands: say what is missing rather than fail the command.
            print("livepush status: the servers listening on Redis are not listed: its user may not run CLIENT LIST "
                  "(a user limited to the deployment's prefix, as docs/security.md shows, may not)", file=sys.stderr)
        servers += [{"via": "redis", **row} for row in on_redis or ()]
    return servers, None


def _dated(server: dict[str, Any], at: datetime) -> dict[str, Any]:
    """A Redis listener, which Redis gives an age (whole seconds), with its `since` as well: the
    instant the report describes less that age, so that every server of `--json` says since when
    it listens as a Postgres one does."""
    if server.get("since") is None and server.get("since_seconds") is not None:
        return {**server, "since": at - timedelta(seconds=float(server["since_seconds"]))}
    return server


# -- the plain report ---------------------------------------------------------------------------

def duration(seconds: float) -> str:
    """A short, human age: 0.4s, 12s, 4m05s, 2h13m, 3d04h."""
    if seconds < 10:
        return f"{seconds:.1f}s"
    s = int(seconds)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    if s < 86400:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 86400}d{s % 86400 // 3600:02d}h"


def table(headers: Sequence[str], rows: Sequence[Sequence[str]], right: frozenset[int] = frozenset()) -> list[str]:
    """Aligned columns, indented under their section; columns in `right` (numbers) align right."""
    rows = [[printable(str(c)) for c in row] for row in rows]
    widths = [max(len(str(c)) for c in col) for col in zip(headers, *rows)]
    lines = []
    for row in (headers, *rows):
        cells = [str(c).rjust(w) if i in right else str(c).ljust(w) for i, (c, w) in enumerate(zip(row, widths))]
        lines.append("  " + "  ".join(cells).rstrip())
    return lines


def _section(title: str, body: list[str]) -> list[str]:
    return [title, *(body or ["  none"]), ""]


def render(report: Status, database_name: str, servers: Sequence[dict[str, Any]] = ()) -> str:
    at = datetime.fromisoformat(report.at).replace(microsecond=0).isoformat()
    out = [f"livepush status of {database_name} at {at}", ""]

    out += _section(f"Queues ({len(report.queues)})", table(
        ["QUEUE", "STATE", "DEPTH", "OLDEST", "HELD", "SCHEDULED", "RUNNING", "WAITING", "FAILED"],
        [[q.queue, "paused" if q.paused else "active", str(q.depth),
          "-" if q.oldest_age is None else duration(q.oldest_age), str(q.held), str(q.scheduled),
          str(q.running), str(q.waiting), str(q.failed)] for q in report.queues],
        right=frozenset({2, 3, 4, 5, 6, 7, 8})) if report.queues else [])

    runtimes = table(
        ["ID", "HOST", "PID", "QUEUES", "STATE", "IN HAND", "LAST BEAT"],
        [[str(r.id), r.host, str(r.pid), ",".join(r.queues), r.state, f"{r.in_hand}/{r.concurrency}",
          f"{duration(r.since_heartbeat)} ago" + (f", OVERDUE (beats every {r.heartbeat:g}s)" if r.overdue else "")]
         for r in report.runtimes],
        right=frozenset({0, 2, 5})) if report.runtimes else []
    if any(r.overdue for r in report.runtimes):
        runtimes.append("  OVERDUE: silent for more than 3 beats, dead or stalled; the next runtime to beat "
                        "releases its jobs")
    out += _section(f"Runtimes ({len(report.runtimes)})", runtimes)

    out += _section(_shown("Groups in progress", len(report.groups), report.groups_in_progress), table(
        ["ID", "STATE", "TOTAL", "PENDING", "SUCCEEDED", "FAILED", "CANCELLED", "CREATED"],
        [[str(g.id), g.state, str(g.total), str(g.pending), str(g.succeeded), str(g.failed), str(g.cancelled),
          f"{duration(g.age)} ago"] for g in report.groups],
        right=frozenset({0, 2, 3, 4, 5, 6})) if report.groups else [])

    out += _section(_shown("Workflows in progress", len(report.workflows), report.workflows_in_progress), table(
        ["ID", "NAME", "STATE", "CREATED", "STEPS"],
        [[str(w.id), w.name, w.state, f"{duration(w.age)} ago", w.summary] for w in report.workflows],
        right=frozenset({0})) if report.workflows else [])

    out += _section(_shown("Tags on unfinished jobs", len(report.tags), report.tags_carried, "most carried"), table(
        ["TAG", "JOBS"], [[tag, str(n)] for tag, n in report.tags.items()], right=frozenset({1}))
        if report.tags else [])

    out += _section(f"Periodic jobs ({len(report.periodic)})", table(
        ["NAME", "LAST TICK", "AGE"],
        [[p.name, p.last_tick, duration(p.since_last_tick)] for p in report.periodic],
        right=frozenset({2})) if report.periodic else [])

    now = datetime.fromisoformat(report.at)
    rows = [[s["via"], s.get("address") or "-", _since(s, now)] for s in servers]
    body = table(["VIA", "ADDRESS", "LISTENING FOR"], rows) if rows else ["  none"]
    out += [f"Servers listening ({len(servers)})", *body, f"  {SERVERS_NOTE}"]
    return "\n".join(out)


def _since(server: dict[str, Any], at: datetime) -> str:
    if server.get("since") is not None:
        return duration(max((at - server["since"]).total_seconds(), 0.0))
    if server.get("since_seconds") is not None:
        return duration(float(server["since_seconds"]))
    return "-"


def _shown(title: str, shown: int, total: int, which: str = "newest") -> str:
    return f"{title} ({total}, {which} {shown} shown)" if shown < total else f"{title} ({total})"
