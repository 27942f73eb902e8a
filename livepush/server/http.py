"""Plain HTTP on the WebSocket port: /healthz, /livepush.js, and the Origin gate."""

from __future__ import annotations

import gzip
import hashlib
from dataclasses import dataclass
from http import HTTPStatus
from importlib import resources
from urllib.parse import urlsplit

from websockets.datastructures import Headers
from websockets.exceptions import RequestLineTooLong
from websockets.http11 import MAX_LINE_LENGTH, MAX_NUM_HEADERS, Request, Response

# What the read-only routes answer: anything else would be answered as a GET, and a POST that a
# proxy or a script thought did something got a 200.
READ_METHODS = ("GET", "HEAD")


def response(status: int, body: bytes, content_type: str = "text/plain; charset=utf-8", **extra: str) -> Response:
    headers = Headers({"Content-Type": content_type, "Content-Length": str(len(body)), "Cache-Control": "no-store"})
    for name, value in extra.items():
        headers[name.replace("_", "-")] = value
    return Response(status, HTTPStatus(status).phrase, headers, body)


def route(target: str) -> str:
    """The path a request target routes by: an absolute URL's path (RFC 9112 §3.2.2: a server
    must accept one; a proxy may send it), "/" for `*` or a URL with no path, "" (no route) for
    a target urlsplit cannot read, e.g. `//[`: anyone can send any target, and it must get an
    answer, not a traceback. The metrics port of `livepush jobs` routes by it too."""
    if not target.startswith("/") and "://" not in target:
        return "/"
    try:
        return urlsplit(target).path or "/"
    except ValueError:
        return ""


def not_allowed(allow: tuple[str, ...] = READ_METHODS) -> Response:
    """405 naming the methods the route takes (RFC 9110 §15.5.6: Allow is required)."""
    return response(405, f"use {' or '.join(allow)}\n".encode(), Allow=", ".join(allow))


def for_head(answer: Response) -> Response:
    """The answer to a HEAD: the GET's status and headers, Content-Length included, and no body
    (RFC 9110 §9.3.2); a body there would be read as the start of the next response."""
    return Response(answer.status_code, answer.reason_phrase, answer.headers, b"")


@dataclass(frozen=True)
class ClientJS:
    """The JS client as served: its bytes, the same gzipped, and an entity tag of them."""

    body: bytes
    gzipped: bytes
    etag: str


CLIENT_JS_CACHE: dict[str, ClientJS] = {}


def client_js() -> ClientJS:
    """The JS client, read and compressed once from the installed package (livepush/static/livepush.js)."""
    if "js" not in CLIENT_JS_CACHE:
        body = resources.files("livepush").joinpath("static/livepush.js").read_bytes()
        CLIENT_JS_CACHE["js"] = ClientJS(body, gzip.compress(body, mtime=0),
                                         '"' + hashlib.sha256(body).hexdigest()[:32] + '"')
    return CLIENT_JS_CACHE["js"]


def list_field(request: Request, name: str) -> str:
    """Every line of header `name`, joined by commas: one list, as RFC 9110 §5.3 reads a list field
    sent in several lines (which a proxy may do). `headers.get()` raised on a second line, and any
    client could answer itself a 500 and put a traceback in the log."""
    return ", ".join(request.headers.get_all(name))


def _accepts_gzip(accept_encoding: str) -> bool:
    """Whether an Accept-Encoding header takes gzip (RFC 9110 §12.5.3: `gzip` or `*`, q not 0).
    gzip named (or x-gzip) decides wherever it stands: `*` only speaks for codings the list does
    not name, so `*, gzip;q=0` refuses gzip, and a client given it anyway could not read the JS."""
    named: bool | None = None
    wildcard: bool | None = None
    for item in accept_encoding.split(","):
        name, *params = (part.strip() for part in item.split(";"))
        name = name.lower()
        if name not in ("gzip", "x-gzip", "*"):
            continue
        q = next((p.partition("=")[2].strip() for p in params if p.lower().startswith("q=")), "1")
        try:
            takes = float(q) > 0
        except ValueError:
            takes = False
        if name == "*":
            wildcard = takes if wildcard is None else wildcard
        else:
            # A refusal under either name stands: they are one coding (RFC 9110 §8.4.1.3).
            named = takes if named is None else named and takes
    return named if named is not None else bool(wildcard)


def _matches(if_none_match: str, etag: str) -> bool:
    """Whether If-None-Match names `etag` (weakly, as RFC 9110 §13.1.2 asks) or is `*`."""
    tags = [tag.strip() for tag in if_none_match.split(",")]
    return "*" in tags or etag in (tag.removeprefix("W/") for tag in tags)


def healthz(listening: bool, fanout_name: str) -> Response:
    if listening:
        return response(200, b'{"status":"ok","fanout":"' + fanout_name.encode() + b'"}\n', "application/json")
    return response(503, b'{"status":"unavailable","fanout":"' + fanout_name.encode() + b'"}\n', "application/json")


def serve_js(request: Request) -> Response:
    """The JS client. Every page load revalidates it (`no-cache`: a new livepush takes effect at
    the next load) and gets 304 while it is unchanged; a browser that takes gzip gets ~a quarter
    of the bytes."""
    try:
        js = client_js()
    except (FileNotFoundError, OSError):
        return response(404, b"livepush.js is not installed\n")
    # A module script on the app's own origin loads this from ours: it needs CORS.
    headers = Headers({"Cache-Control": "no-cache", "ETag": js.etag, "Vary": "Accept-Encoding",
                       "Access-Control-Allow-Origin": "*"})
    if _matches(list_field(request, "If-None-Match"), js.etag):
        # No Content-Length: a 304's would have to be the 200's (RFC 9110 §8.6), and it has no body.
        return Response(304, "Not Modified", headers, b"")
    body = js.body
    if _accepts_gzip(list_field(request, "Accept-Encoding")):
        body = js.gzipped
        headers["Content-Encoding"] = "gzip"
    headers["Content-Type"] = "text/javascript; charset=utf-8"
    headers["Content-Length"] = str(len(body))
    return Response(200, "OK", headers, body)


def content_length(value: bytes) -> bytes | None:
    """The one length a Content-Length field value says, in its plain spelling (`0` for `00`, `5`
    for `5, 5`), or None if it says none (RFC 9110 §8.6: 1*DIGIT, and a list of copies of one
    length may be read as that length). websockets takes only `0` for a request with no body,
    and told a request sent with `00` or `0, 0` that its body was too large."""
    items = [item.strip(b" \t") for item in value.split(b",")]
    if not all(item.isdigit() for item in items):
        return None
    values = {item.lstrip(b"0") or b"0" for item in items}
    return values.pop() if len(values) == 1 else None


def _says_a_length(lengths: bytes) -> bool:
    """Whether the Content-Length values of a request (each followed by a comma, each in its
    plain spelling where it has one: `content_length`) are one length, every line the same."""
    values = set(lengths.split(b",")[:-1])
    return len(values) == 1 and values.pop().isdigit()


def unreadable(cause: BaseException | None, lengths: bytes = b"") -> Response | None:
    """The answer to a request websockets could not read (it would end the connection with no
    status at all), from why it could not, while the client is still there (its EOF is answered
    by nothing). No route on this port reads a body: a request that has one (a POST with data, a
    chunked upload) gets 413; anything else that is no HTTP/1.1 request head gets 400, lines
    that end in a bare LF included (websockets reports those as an EOFError, "line without
    CRLF", before any EOF came), and a Content-Length that is no length (`-1`, two that differ:
    RFC 9112 §6.3), which websockets refuses as a body too. `lengths`: the request's
    Content-Length values as `_says_a_length` reads them."""
    if cause is None:
        return None
    refused_length = str(cause) == "unsupported request body"
    if isinstance(cause, NotImplementedError) or refused_length and _says_a_length(lengths):
        answer = response(413, b"this server reads no request body: send the request without one\n")
    elif refused_length:
        # The one header at fault, named: "not a request" alone left the client to guess which.
        answer = response(400, b"the request's Content-Length is no length (digits, the same in every line): "
                               b"send Content-Length: 0, or none, as this server reads no request body\n")
    else:
        answer = response(400, b"not an HTTP/1.1 request this server can read\n")
    answer.headers["Connection"] = "close"  # the connection ends with the answer
    return answer


def too_large(cause: Exception) -> Response:
    """The answer to a request head past websockets' limits (`cause`: RequestLineTooLong, else a
    header line too long or too many): 414 or 431, in words that fit any request. websockets' own
    said "Failed to open a WebSocket connection" to a plain GET of a route too."""
    if isinstance(cause, RequestLineTooLong):
        answer = response(414, f"the request line is over {MAX_LINE_LENGTH} bytes: "
                               "send a shorter target (path and query)\n".encode())
    else:
        answer = response(431, f"the request's header fields are too large (a line over {MAX_LINE_LENGTH} "
                               f"bytes, or over {MAX_NUM_HEADERS} lines): send fewer or shorter ones, "
                               "such as fewer cookies\n".encode())
    answer.headers["Connection"] = "close"  # the connection ends with the answer
    return answer


def is_websocket(request: Request) -> bool:
    return "websocket" in list_field(request, "Upgrade").lower()

