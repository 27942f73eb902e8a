"""`livepush demo`: Postgres (embedded when none is configured), migrations, the server, the job
runtime and a page, in one process. Ctrl-C stops everything cleanly.

The page starts work only through a same-origin POST (a GET gets 405, another site's request
403), and is served with a Content-Security-Policy that allows its own files and its own server
only. It shows three kinds of import: a task group of jobs, a durable job that parks while its
children run and again until someone approves it (durable.py), and a workflow whose steps are
drawn as a live graph, with Approve, Pause, Resume and Cancel buttons and its audit trail (workflow.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import ipaddress
import json
import logging
import os
import re
import secrets
import shlex
import signal
import tempfile
from collections.abc import Awaitable, Callable, Iterator, Mapping
from importlib import resources
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import psycopg
from websockets.http11 import Request, Response

from .. import config, migrate, stopsignals
from ..cli.runner import run_async
from ..cli.wiring import server_parts
from ..errors import ConfigError, DependencyError, SchemaError
from ..postgres.urls import redact
from ..server import http
from ..server.core import OPEN_TIMEOUT
from ..server.run import host_port, serve
from ..usercode import current_folder
from ..sessions.handshake import header_values, origin_allowed
from . import durable, workflow

log = logging.getLogger("livepush.demo")

DEMO_JOBS = "livepush.demo.jobs"
MAX_ROWS = 5000
# The server drops a request it has not answered within OPEN_TIMEOUT, and the page then says the
# demo is not running. A database that does not answer keeps an action waiting for a connection
# longer than that: the action is given up sooner, so the page hears what is wrong. (A group
# import runs in a thread, which cannot be cut short: it may still commit once the database
# answers, unfollowed by the page.)
ACTION_SECONDS = OPEN_TIMEOUT - 3
_FILES = {"/": ("page.html", "text/html; charset=utf-8"), "/index.html": ("page.html", "text/html; charset=utf-8"),
          "/demo/page.js": ("page.js", "text/javascript; charset=utf-8"),
          "/demo/common.js": ("common.js", "text/javascript; charset=utf-8"),
          "/demo/durable.js": ("durable.js", "text/javascript; charset=utf-8"),
          "/demo/workflow.js": ("workflow.js", "text/javascript; charset=utf-8"),
          "/demo/page.css": ("page.css", "text/css; charset=utf-8")}


def _file(name: str) -> bytes:
    return resources.files("livepush.demo").joinpath(name).read_bytes()


def _csp(request: Request) -> str:
    """Its own files, its own WebSocket server, nothing else (no inline script, no frames)."""
    hosts = header_values(request.headers, "host")
    host = hosts[0] if len(hosts) == 1 and all(c.isalnum() or c in ".-:[]" for c in hosts[0]) else ""
    sockets = f" ws://{host} wss://{host}" if host else ""
    return (f"default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'{sockets}; "
            "img-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'")


def _same_origin(request: Request) -> bool:
    """A request the demo's own page made: Sec-Fetch-Site says so or an Origin is the server's
    own (browsers send both on a POST), and neither says otherwise. A request with neither shows
    no sign of the page; an older browser's cross-site form sends neither, so it is refused."""
    sites = header_values(request.headers, "sec-fetch-site")
    if sites and sites != ["same-origin"]:
        return False
    if not sites and not header_values(request.headers, "origin"):
        return False
    return origin_allowed(request.headers, None)


async def start_import(rows: int) -> dict[str, object]:
    """Enqueue the import: a group of `rows` jobs, created, filled and sealed in one transaction."""
    from livepush import jobs

    from . import jobs as demo_jobs

    def enqueue() -> dict[str, object]:
        with jobs.group(on_finish=demo_jobs.import_finished.request(0)) as g:
            for row in range(rows):
                g.enqueue(demo_jobs.import_row, demo_jobs.PAGE_IMPORT, row)
        return {
            "group_id": g.handle.id,
            "group_topic": g.handle.signed_topic,
            "job_topics": [h.signed_topic for h in g.members],  # known once the block committed
        }

    return await asyncio.to_thread(enqueue)


async def cancel_import(group: int) -> dict[str, object]:
    """Cancel the import `group`: its queued rows never run, its running ones stop at their next
    await. Refused (404) for any group but an import the page started, (409) once it finished."""
    from livepush import jobs

    from . import jobs as demo_jobs

    members, _ = await jobs.agroup_members(group, limit=1)
    first = await jobs.aget_job(members[0]["id"]) if members else None
    if first is None or first.name != demo_jobs.import_row.name or (first.args or [None])[0] != demo_jobs.PAGE_IMPORT:
        raise durable.Refused(404, f"there is no import {group}")
    if not await jobs.acancel_group(group):
        raise durable.Refused(409, f"import {group} has finished: there is nothing to cancel")
    return {"group_id": group, "cancelled": True}


def _rows(query: dict[str, list[str]], default: int, most: int) -> int:
    try:
        rows = int(query.get("n", [str(default)])[0])
    except ValueError:
        raise durable.Refused(400, "n must be a whole number") from None
    if not 1 <= rows <= most:
        raise durable.Refused(400, f"n must be between 1 and {most}")
    return rows


async def _start(query: dict[str, list[str]]) -> dict[str, object]:
    return await start_import(_rows(query, 200, MAX_ROWS))


async def _cancel(query: dict[str, list[str]]) -> dict[str, object]:
    return await cancel_import(durable.query_id(query, "group", "an import"))


async def _start_durable(query: dict[str, list[str]]) -> dict[str, object]:
    return await durable.start(_rows(query, 20, durable.MAX_ROWS))


async def _children(query: dict[str, list[str]]) -> dict[str, object]:
    return await durable.children(durable.job_id(query))


async def _approve(query: dict[str, list[str]]) -> dict[str, object]:
    return await durable.approve(durable.job_id(query))


async def _cancel_durable(query: dict[str, list[str]]) -> dict[str, object]:
    return await durable.cancel(durable.job_id(query))


async def _start_workflow(query: dict[str, list[str]]) -> dict[str, object]:
    return await workflow.start(_rows(query, 12, workflow.MAX_ROWS))


def _on_run(verb: Callable[[int], Awaitable[dict[str, object]]]
            ) -> Callable[[dict[str, list[str]]], Awaitable[dict[str, object]]]:
    """An action on the run the `run` parameter names."""

    async def action(query: dict[str, list[str]]) -> dict[str, object]:
        return await verb(workflow.run_id(query))

    return action


# Every action the page takes: a same-origin POST, answered with JSON or a one-line refusal.
_ACTIONS: dict[str, tuple[str, Callable[[dict[str, list[str]]], Awaitable[dict[str, object]]]]] = {
    "/demo/start": ("start an import", _start),
    "/demo/cancel": ("cancel an import", _cancel),
    "/demo/durable/start": ("start a durable import", _start_durable),
    "/demo/durable/children": ("follow a durable import's children", _children),
    "/demo/durable/approve": ("approve a durable import", _approve),
    "/demo/durable/cancel": ("cancel a durable import", _cancel_durable),
    "/demo/workflow/start": ("start a workflow run", _start_workflow),
    "/demo/workflow/batch": ("follow a workflow run's batch", _on_run(workflow.batch)),
    "/demo/workflow/approve": ("approve a workflow run", _on_run(workflow.approve)),
    "/demo/workflow/pause": ("pause a workflow run", _on_run(workflow.pause)),
    "/demo/workflow/resume": ("resume a workflow run", _on_run(workflow.resume)),
    "/demo/workflow/cancel": ("cancel a workflow run", _on_run(workflow.cancel)),
    "/demo/workflow/audit": ("read a workflow run's audit trail", _on_run(workflow.audit)),
}


async def routes(request: Request) -> Response | None:
    try:
        url = urlsplit(request.path)
    except ValueError:  # e.g. an unbalanced "[" in a garbage request target: not the demo's
        return None
    if url.path == "/favicon.ico":
        return http.response(204, b"")
    if url.path in _FILES:
        if request.method not in http.READ_METHODS:
            return http.not_allowed()
        name, kind = _FILES[url.path]
        return http.response(200, _file(name), kind, Content_Security_Policy=_csp(request),
                             X_Content_Type_Options="nosniff")
    if url.path not in _ACTIONS:
        return None
    what, action = _ACTIONS[url.path]
    if request.method != "POST":
        return http.response(405, f"{what} with a POST from the demo page\n".encode(), Allow="POST")
    if not _same_origin(request):
        return http.response(403, f"only the demo's own page may {what}\n".encode())
    try:
        body = json.dumps(await asyncio.wait_for(action(parse_qs(url.query)), ACTION_SECONDS))
    except durable.Refused as refused:
        return http.response(refused.status, f"{refused.reason}\n".encode())
    except (DependencyError, SchemaError) as exc:
        # The page gets a line it can show; the details (which database, what to run) go to the log.
        log.warning("could not %s: %s", what, exc)
        return http.response(503, b"the demo's database is unavailable or not migrated: see the demo's log\n")
    except TimeoutError:
        log.warning("could not %s: the database did not answer within %g s; is it running?", what, ACTION_SECONDS)
        return http.response(503, f"the demo's database did not answer within {ACTION_SECONDS:g} s: see the demo's "
                                  "log\n".encode())
    return http.response(200, body.encode(), "application/json")


def demo_secret(folder: Path) -> str:
    """A generated secret, kept in `folder` so signed topics a page holds survive a restart.

    Demos starting at once in a new folder all end up with the first one kept: each would
    otherwise use its own while only the last written is kept, and the pages of every other one
    would hold signed topics that no longer verify once it restarts."""
    path = folder / "secret"
    unusable = False
    if path.exists():
        value = path.read_text().strip()
        try:
            config.Settings().replace(secret=value)
            return value
        except ConfigError:
            # Left empty by a demo stopped while it wrote the file, or edited: nobody set it as
            # LIVEPUSH_SECRET, so a complaint about that setting would help no one. A new one
            # only costs the signed topics of pages opened before.
            log.warning("the demo's secret in %s is not usable: making a new one", path)
            unusable = True
    folder.mkdir(parents=True, exist_ok=True)
    value = secrets.token_urlsafe(48)
    # Written whole under another name, then put in place: a stop midway leaves no half-written
    # file. A new one is linked, which fails if another demo's came first; that one is used then.
    fd, temporary = tempfile.mkstemp(dir=folder, prefix=".secret-")  # mode 0600
    try:
        with os.fdopen(fd, "w") as out:
            out.write(value)
        if unusable:
            os.replace(temporary, path)
        else:
            try:
                os.link(temporary, path)
            except FileExistsError:
                return demo_secret(folder)
            except OSError:  # a file system without hard links: the race stays possible there
                os.replace(temporary, path)
    finally:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
    return value


# A URL's scheme; a Postgres conninfo string ("host=... dbname=...") has none.
_SCHEME = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*):")
_WILDCARDS = {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1"}


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def for_its_page(settings: config.Settings) -> config.Settings:
    """`settings` with what the demo's page needs: it connects from the demo's own origin and signs
    no one in. LIVEPUSH_ALLOWED_ORIGINS, or LIVEPUSH_AUTHENTICATE=required, exported for the user's
    own app would keep it from ever connecting, showing "reconnecting" with no reason given (the
    server logs refused handshakes at debug level only)."""
    ignored = [name for name, set_ in (("LIVEPUSH_ALLOWED_ORIGINS", settings.allowed_origins is not None),
                                       ("LIVEPUSH_AUTHENTICATE=required", settings.authenticate == "required"))
               if set_]
    if not ignored:
        return settings
    log.warning("the demo ignores %s: its page connects from the demo's own origin, signed in as no one",
                " and ".join(ignored))
    authenticate = "optional" if settings.authenticate == "required" else settings.authenticate
    return dataclasses.replace(settings, allowed_origins=None, authenticate=authenticate)


def run() -> int:
    from . import embedded

    # Until the server's loop takes them over (server/run.py), SIGTERM stops the demo as SIGINT
    # does: KeyboardInterrupt, which goes through the `finally` below (and `livepush` exits 0),
    # instead of ending the process where it stands with its Postgres left running.
    stopsignals.term_as_interrupt()
    # Closing its terminal stops it too, its Postgres with it.
    stopsignals.hangup_as_term()
    settings = for_its_page(config.Settings.from_env(_environ()))
    logging.getLogger("pgserver").setLevel(logging.WARNING)  # it narrates every command at INFO
    pg = None
    try:
        if not settings.database_url or not settings.secret:
            folder = _data_folder()
        if not settings.database_url:
            url, pg = embedded.start(folder)
            # Without a database URL the fan-out was local for want of one: the embedded Postgres
            # carries it now. A Redis fan-out was the user's choice (to try the demo on Redis), and
            # stays: replaced, it left the demo on Postgres with only its start line to say so.
            fanout = settings.fanout if settings.fanout == "redis" else "postgres"
            settings = settings.replace(database_url=url, fanout=fanout)
        elif settings.database_url_setting == "DATABASE_URL":
            # Often another application's: the demo is about to add livepush's tables there.
            log.warning("the demo uses the database of DATABASE_URL (%s), as LIVEPUSH_DATABASE_URL is not set: it "
                        "adds livepush's tables and its jobs there; unset DATABASE_URL to run it on its own embedded "
                        "Postgres instead", redact(settings.database_url))
        if not settings.secret:
            settings = settings.replace(secret=demo_secret(folder))
        config.set_settings(settings)
        if not _loopback(settings.host):
            log.warning("the demo listens on %s, not only on this machine: anyone who can reach it can start "
                        "imports; bind it to 127.0.0.1 (LIVEPUSH_HOST) unless you mean to share it", settings.host)
        _migrate(settings, folder=folder if pg is not None else None)

        def ready(server: object) -> None:
            port = getattr(server, "port")
            # A wildcard address is where it listens, not a page a browser opens (some refuse
            # http://0.0.0.0/): show this machine's own, which the wildcard covers.
            shown = _WILDCARDS.get(settings.host, settings.host)
            url = f"http://{host_port(shown, port)}/"
            try:
                print(f"\n  livepush demo: open {url}  (Ctrl-C stops)\n", flush=True)
            except OSError as exc:
                # Its reader gone (`livepush demo | head -0`) or a full disk: the demo serves all
                # the same, and says where on stderr; what is left unprinted goes nowhere at exit.
                os.dup2(os.open(os.devnull, os.O_WRONLY), 1)
                log.warning("could not print to standard output (%s): the demo is at %s", exc.strerror or exc, url)

        async def main() -> int:
            parts = server_parts(settings, with_jobs=[DEMO_JOBS], pages=routes)
            return await serve(parts.server, sidecars=parts.sidecars, closers=[parts.close], ready=ready)

        return run_async(main())
    finally:
        if pg is not None:
            # Stopping Postgres is what a signal asks for by now: another one must not cut it short.
            for sig in embedded.STOP_SIGNALS:
                signal.signal(sig, signal.SIG_IGN)
            pg.cleanup()


def _environ() -> Mapping[str, str]:
    """The environment, less a DATABASE_URL that names another kind of database than Postgres
    (`sqlite:`, `mysql:`, exported for another application), when LIVEPUSH_DATABASE_URL is unset.
    Read as the demo's database it stopped the demo with advice to make it a Postgres URL, while
    the demo has its embedded Postgres for just this case."""
    fallback = (os.environ.get("DATABASE_URL") or "").strip()
    scheme = _SCHEME.match(fallback)
    if (os.environ.get("LIVEPUSH_DATABASE_URL") or "").strip() or scheme is None:
        return os.environ
    if scheme.group(1).lower().startswith("postgres"):
        return os.environ  # Postgres' own, or a misspelt one that the settings refuse, naming it
    log.warning("the demo ignores DATABASE_URL, a %s: URL of another database than Postgres: it runs on its embedded "
                "Postgres (set LIVEPUSH_DATABASE_URL to run it on a Postgres of yours)", scheme.group(1))
    return {name: value for name, value in os.environ.items() if name != "DATABASE_URL"}


def _data_folder() -> Path:
    """`.livepush/` in the current directory, made if need be, once it is known that this user may
    write in it: the embedded Postgres' data and the generated secret go there. A folder the user
    cannot write (a checkout of someone else's, a read-only mount) would otherwise end the demo
    with a traceback from deep inside its start."""
    folder = Path(current_folder(), ".livepush")
    try:
        folder.mkdir(exist_ok=True)
        _check_made_by_this_user(folder)
        # mkdir accepts a folder that exists: only writing in it shows that this user may.
        tempfile.TemporaryFile(dir=folder).close()
    except OSError as exc:
        reason = "a file of that name is in the way" if folder.is_file() else exc.strerror or str(exc)
        # bin/demo runs it in its checkout from whatever folder it was started in: for it, running
        # from another folder changes nothing, and a copy of the checkout is what does.
        raise ConfigError(f"the demo keeps its data in {folder} and cannot write there ({reason}): run it from a "
                          "folder you can write to (bin/demo runs it in its checkout: copy the checkout to a folder "
                          "of yours), or set LIVEPUSH_DATABASE_URL and LIVEPUSH_SECRET") from None
    return folder


def _check_made_by_this_user(folder: Path) -> None:
    """Refuse a `.livepush/` that a demo run as another user made (the user's own, then `sudo
    bin/demo`, or the reverse). Root's embedded Postgres takes its data over for its own system
    user, which left the user's demo unable to start, or to delete the folder as it advised; a
    user's demo cannot read root's data, and was told to copy a checkout that is its own."""
    owner, me = folder.stat().st_uid, os.geteuid()
    if owner == me:
        return
    name, quoted = _user_name(owner), shlex.quote(str(folder))
    made = "a demo run as root (with sudo, say)" if owner == 0 else f"a demo run as {name}"
    delete = f"sudo rm -rf {quoted}" if owner == 0 else f"rm -rf {quoted}" if me == 0 else f"as {name}: rm -rf {quoted}"
    raise ConfigError(f"the demo's data in {folder} is {name}'s, made by {made}, and this demo runs as "
                      f"{_user_name(me)}: run the demo as {name}, or delete that folder ({delete}) to start afresh")


def _user_name(uid: int) -> str:
    import pwd  # here, as fcntl below: a demo on a database and a secret of the user's own reads no accounts

    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:  # a uid with no account, as in a container that a folder came into from outside
        return f"uid {uid}"


def _migrate(settings: config.Settings, *, folder: Path | None) -> None:
    """As `livepush migrate` (its lock timeout, its tries, exit 75 when they all waited), each try
    that waited said in a warning: the page's URL comes only once this is done. `folder` holds the
    embedded database (None: the user's own, never reset)."""
    if folder is None:
        migrate.migrate_configured(settings, on_retry=log.warning)
        return
    with _one_migration_at_a_time(folder):
        try:
            migrate.migrate_configured(settings, on_retry=log.warning)
        except SchemaError:
            # The embedded database holds nothing but earlier demo runs: start it afresh.
            log.warning("the demo's database in .livepush/ was made by another livepush version: resetting it")
            with psycopg.connect(settings.require_database(), autocommit=True) as conn:
                conn.execute("DROP SCHEMA public CASCADE")
                conn.execute("CREATE SCHEMA public")
            migrate.migrate_configured(settings, on_retry=log.warning)


@contextlib.contextmanager
def _one_migration_at_a_time(folder: Path) -> Iterator[None]:
    """Demos started together in one folder migrate its database one after the other: each would
    otherwise find a former livepush's schema and reset it, the second dropping what the first was
    migrating, or already served from. The next one finds it migrated. (A lock on a file: it is
    gone with its process, however that ends.)"""
    import fcntl  # here: the demo on a database of the user's own needs no POSIX file locks

    with open(folder / "migrate.lock", "a") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            log.info("waiting for another demo in %s to migrate its database", folder)
            fcntl.flock(lock, fcntl.LOCK_EX)
        yield  # closing the file releases the lock
