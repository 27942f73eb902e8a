"""The example app: a FastAPI page where a signed-in user starts a report job and watches its
progress live, with a list of notices the job leaves on the user's own topic.

From the repository root, with LIVEPUSH_DATABASE_URL and LIVEPUSH_SECRET set (the same for every
process) and `livepush migrate` run once:

    LIVEPUSH_ALLOWED_ORIGINS=http://127.0.0.1:8000 livepush serve --with-jobs examples.fastapi_app.tasks
    uvicorn examples.fastapi_app.app:app --host 127.0.0.1 --port 8000

then open http://127.0.0.1:8000/. The first command runs the WebSocket server (port 8765,
LIVEPUSH_PORT) and the job runtime beside it; `livepush serve` and `livepush jobs
examples.fastapi_app.tasks` as two processes work as well. The page connects to the server on its
own host at LIVEPUSH_PORT (EXAMPLE_PUSH_URL overrides it). The session cookie the app sets reaches
the server with the handshake: cookies are per host, not per port.
"""

from __future__ import annotations

import html
import os
from importlib import resources
from pathlib import Path
from string import Template
from urllib.parse import urlsplit

from fastapi import Depends, FastAPI, Request, Response
from fastapi.responses import HTMLResponse
from pydantic import BaseModel, Field

from livepush.config import get_settings
from livepush.contrib.starlette import (
    aset_session_cookie,
    current_session,
    lifespan,
    logout,
    optional_session,
    page_topic,
)
from livepush.sessions import Session

from . import tasks

HERE = Path(__file__).resolve().parent
SESSION_TTL = 8 * 3600.0
MAX_STEPS = 20

app = FastAPI(title="livepush FastAPI example", lifespan=lifespan)


class Login(BaseModel):
    # A user id that fills a topic (user:<name>) as it is: no separator, nothing to escape.
    name: str = Field(min_length=1, max_length=40, pattern=r"^[A-Za-z0-9_-]+$")


class ReportRequest(BaseModel):
    steps: int = Field(default=5, ge=1, le=MAX_STEPS)


def push_url(request: Request) -> str:
    """Where the page's WebSocket connects."""
    return os.environ.get("EXAMPLE_PUSH_URL") or f"ws://{request.url.hostname}:{get_settings().port}/"


def _csp(push: str) -> str:
    """Its own files and its push server, nothing else (no inline script)."""
    parts = urlsplit(push)
    return (f"default-src 'none'; script-src 'self'; style-src 'self'; "
            f"connect-src 'self' {parts.scheme}://{parts.netloc}; base-uri 'none'; form-action 'none'; "
            "frame-ancestors 'none'")


@app.get("/", response_class=HTMLResponse)
async def page(request: Request, session: Session | None = Depends(optional_session)) -> HTMLResponse:
    """The page: a sign-in form, or the report starter with the user's notices."""
    notices = await page_topic(tasks.notices_topic(session.subject)) if session else None
    push = push_url(request)
    values = {"subject": session.subject if session else "", "push": push,
              "notices": notices.signed if notices else "", "since": (notices.since or "") if notices else ""}
    body = Template((HERE / "page.html").read_text()).substitute({k: html.escape(v) for k, v in values.items()})
    return HTMLResponse(body, headers={"Content-Security-Policy": _csp(push), "Cache-Control": "no-store"})


@app.post("/login")
async def login(body: Login, request: Request, response: Response) -> dict[str, str]:
    """Signs in as anyone (an example has no passwords): sets the livepush session cookie, revoking
    another user's session this browser still carries."""
    await aset_session_cookie(response, request, body.name, ttl=SESSION_TTL)
    return {"subject": body.name}


@app.post("/logout")
async def sign_out(request: Request, response: Response) -> dict[str, bool]:
    """Revokes the session (its open sockets close with 4403) and deletes the cookie."""
    return {"signed_out": await logout(response, request) is not None}


@app.post("/reports")
async def start_report(body: ReportRequest, session: Session = Depends(current_session)) -> dict[str, object]:
    """Enqueues a report for the signed-in user; the page follows its signed job topic."""
    handle = await tasks.build_report.aenqueue(session.subject, body.steps)
    return {"job": handle.id, "topic": handle.signed_topic}


def _file(data: bytes, kind: str) -> Response:
    return Response(data, media_type=kind, headers={"X-Content-Type-Options": "nosniff"})


@app.get("/static/livepush.js")
async def client_js() -> Response:
    """The livepush JS client, as installed with the package."""
    return _file(resources.files("livepush").joinpath("static/livepush.js").read_bytes(), "text/javascript")


@app.get("/static/page.js")
async def page_js() -> Response:
    return _file((HERE / "page.js").read_bytes(), "text/javascript")


@app.get("/static/page.css")
async def page_css() -> Response:
    return _file((HERE / "page.css").read_bytes(), "text/css")
