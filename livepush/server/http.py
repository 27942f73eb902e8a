"""Plain HTTP on the WebSocket port: /healthz, /livepush.js, and the Origin gate."""

from __future__ import annotations

from http import HTTPStatus
from importlib import resources

from websockets.datastructures import Headers
from websockets.http11 import Request, Response

CLIENT_JS_CACHE: dict[str, bytes] = {}


def response(status: int, body: bytes, content_type: str = "text/plain; charset=utf-8", **extra: str) -> Response:
    headers = Headers({"Content-Type": content_type, "Content-Length": str(len(body)), "Cache-Control": "no-store"})
    for name, value in extra.items():
        headers[name.replace("_", "-")] = value
    return Response(status, HTTPStatus(status).phrase, headers, body)


def client_js() -> bytes:
    """The JS client, read once from the installed package (livepush/static/livepush.js)."""
    if "js" not in CLIENT_JS_CACHE:
        CLIENT_JS_CACHE["js"] = resources.files("livepush").joinpath("static/livepush.js").read_bytes()
    return CLIENT_JS_CACHE["js"]


def healthz(listening: bool, fanout_name: str) -> Response:
    if listening:
        return response(200, b'{"status":"ok","fanout":"' + fanout_name.encode() + b'"}\n', "application/json")
    return response(503, b'{"status":"unavailable","fanout":"' + fanout_name.encode() + b'"}\n', "application/json")


def serve_js(request: Request) -> Response:
    try:
        body = client_js()
    except (FileNotFoundError, OSError):
        return response(404, b"livepush.js is not installed\n")
    # A module script on the app's own origin loads this from ours: it needs CORS.
    return response(
        200,
        body,
        "text/javascript; charset=utf-8",
        Access_Control_Allow_Origin="*",
    )


def is_websocket(request: Request) -> bool:
    return "websocket" in request.headers.get("Upgrade", "").lower()

