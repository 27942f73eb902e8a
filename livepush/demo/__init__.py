"""`livepush demo`: Postgres (embedded when none is configured), migrations, the server, the
job runtime and a page, in one process. Ctrl-C stops everything cleanly."""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import secrets
from importlib import resources
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

from websockets.http11 import Request, Response

from .. import config, migrate
from ..server import http

log = logging.getLogger("livepush.demo")

DEMO_JOBS = "livepush.demo.jobs"
MAX_ROWS = 5000


def page() -> bytes:
    return resources.files("livepush.demo").joinpath("page.html").read_bytes()


async def start_import(rows: int) -> dict[str, object]:
    """Enqueue the import: a group of `rows` jobs, created, filled and sealed in one transaction."""
    from .. import jobs

    from . import jobs as demo_jobs

    def enqueue() -> dict[str, object]:
        with jobs.group(on_finish=demo_jobs.import_finished.request(0)) as g:
            for row in range(rows):
                g.enqueue(demo_jobs.import_row, 0, row)
        return {
            "group_id": g.handle.id,
            "group_topic": g.handle.signed_topic,
            "job_topics": [h.signed_topic for h in g.members],  # known once the block committed
        }

    return await asyncio.to_thread(enqueue)


async def routes(request: Request) -> Response | None:
    url = urlsplit(request.path)
    if url.path == "/favicon.ico":
        return http.response(204, b"")
    if url.path in ("/", "/index.html"):
        return http.response(200, page(), "text/html; charset=utf-8")
    if url.path == "/demo/start":
        try:
            rows = int(parse_qs(url.query).get("n", ["200"])[0])
        except ValueError:
            return http.response(400, b"n must be a whole number\n")
        if not 1 <= rows <= MAX_ROWS:
            return http.response(400, f"n must be between 1 and {MAX_ROWS}\n".encode())
        body = json.dumps(await start_import(rows)).encode()
        return http.response(200, body, "application/json")
    return None


def demo_secret(folder: Path) -> str:
    """A generated secret, kept in `folder` so signed topics a page holds survive a restart."""
    path = folder / "secret"
    if path.exists():
        return path.read_text().strip()
    folder.mkdir(parents=True, exist_ok=True)
    value = secrets.token_urlsafe(48)
    path.touch(mode=0o600)
    path.write_text(value)
    return value


def run(args: argparse.Namespace) -> int:
    from ..cli.main import run_async
    from ..cli.jobs import sidecar
    from ..server.run import serve
    from . import embedded

    settings = config.Settings.from_env()
    logging.getLogger("pgserver").setLevel(logging.WARNING)  # it narrates every command at INFO
    pg = None
    if not settings.database_url:
        url, pg = embedded.start(Path.cwd() / ".livepush")
        settings = settings.replace(database_url=url, fanout="postgres")
    if not settings.secret:
        settings = settings.replace(secret=demo_secret(Path.cwd() / ".livepush"))
    config.set_settings(settings)
    migrate.migrate(settings.require_database())

    def ready(server: object) -> None:
        port = getattr(server, "port")
        print(f"\n  livepush demo: open http://{settings.host}:{port}/  (Ctrl-C stops)\n", flush=True)

    try:
        return run_async(serve(settings, pages=routes, sidecars=[sidecar(DEMO_JOBS, settings)], ready=ready))
    finally:
        if pg is not None:
            pg.cleanup()  # type: ignore[attr-defined]
