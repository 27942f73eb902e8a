"""How long-running commands log: plain lines for people, or one JSON object a line
(`--log-format json`) for log collectors; either way, credentials never reach the output.

The scrubber is the last line of defence: the code already logs redacted URLs and never logs a
token, but a third-party library's message (a driver's connection error quoting its DSN) passes
through here too.
"""

from __future__ import annotations

import json
import logging
import os
import re
import sys
from datetime import datetime, timezone

FORMATS = ("text", "json")
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
# Under `serve --workers N`, which process wrote the line: "supervisor" or "worker 2", and its pid.
SUPERVISOR = "supervisor"
PROCESS_TEXT_FORMAT = "%(asctime)s %(levelname)s [%(livepush_process)s pid %(process)d] %(name)s: %(message)s"

# user:password@ in a URL, the userinfo ending at its last '@' (redis-py reads a password with an
# unencoded '@' so, and a user name may hold one: Azure's user@server); token=, password=, secret=
# in a query string, a key=value DSN or an environment, under a longer name too (access_token=,
# client_secret=, PGPASSWORD=, LIVEPUSH_SECRET=: what a library's error quotes of a request, or a
# job of its settings); a session token's shape (a long base64url payload, a dot, its signature;
# a JWT's three parts too). The word PASSWORD alone as the password is the placeholder of
# livepush's own hints ("use redis://:PASSWORD@HOST:PORT/DB"), kept so that a hint does not say to
# write `***`; followed by more before the last '@' it is a password like any other.
_SECRETS = [
    (re.compile(r"(//[^/\s:]*:)(?!PASSWORD@[^\s/@]*(?:[\s/]|$))[^\s/]*@"), r"\1***@"),
    (re.compile(r"(?i)(?<![\w-])([\w-]*?(?:token|password|passwd|secret)\s*=\s*)"
                r"(?:'[^']*'|\"[^\"]*\"|[^&\s,;\"']+)"),
     r"\1***"),
    (re.compile(r"\b[A-Za-z0-9_-]{32,}\.[A-Za-z0-9_-]{20,}(?:\.[A-Za-z0-9_-]{16,})?"), "***"),
]


def scrub(text: str) -> str:
    for pattern, replacement in _SECRETS:
        text = pattern.sub(replacement, text)
    return text


def printable(text: str) -> str:
    """`text` with each character a terminal would act on (newlines, escape sequences, bidi
    overrides) written as its Python escape: what it quotes may be the application's data (a job's
    error naming its arguments, a tag), and none may forge a line or drive the operator's terminal."""
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in text)


# What starts each line of a traceback under its record's line: only a record's own line starts at
# the margin, so an exception whose message holds a newline cannot pass its next line off as a record.
CONTINUED = "  "


def _continued(text: str) -> str:
    return "\n".join(CONTINUED + printable(line) for line in text.split("\n"))


class Scrubbed(logging.Formatter):
    """Formats as its parent does, then removes credentials from the whole record. A record is one
    line (its message quotes data: a job's error holding its arguments), and the lines of a
    traceback under it are indented."""

    def format(self, record: logging.LogRecord) -> str:
        # The record's line holds no newline (formatMessage): what follows the first one is the
        # traceback or stack, however it was formatted (another handler may have cached it).
        line, newline, rest = super().format(record).partition("\n")
        return scrub(line + (newline + _continued(rest) if newline else ""))

    def formatMessage(self, record: logging.LogRecord) -> str:
        return printable(super().formatMessage(record))


class JsonLines(logging.Formatter):
    """One JSON object a line: time (UTC, ISO 8601), level, logger, message, and the exception
    (type, message and traceback text) when there is one; under `serve --workers N`, also the
    worker's index (absent on the supervisor's lines) and the pid."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, object] = {
            "time": datetime.fromtimestamp(record.created, timezone.utc).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": scrub(record.getMessage()),
        }
        if hasattr(record, "livepush_process"):
            worker = getattr(record, "livepush_worker", None)
            if worker is not None:
                entry["worker"] = worker
            entry["pid"] = record.process
        if record.exc_info and record.exc_info[0] is not None:
            entry["error"] = scrub(f"{record.exc_info[0].__name__}: {record.exc_info[1]}")
            entry["traceback"] = scrub(self.formatException(record.exc_info))
        return json.dumps(entry, ensure_ascii=False, default=str)


def error_line(message: str, log_format: str = "text") -> str:
    """The one line a command that cannot go on ends with: `livepush: MESSAGE`, or under
    `--log-format json` a JSON object like every other line (a collector reads each line as one),
    naming its process as the others do under `serve --workers N`."""
    if log_format != "json":
        # Scrubbed and escaped as every text line is: the message may quote the user's own code (a
        # module that failed at import with a URL and its password, or a terminal escape, in the
        # error) or a setting's value (a newline in a URL), and must stay one line.
        message = scrub(printable(message))
        if _named is not None:  # among `serve --workers N`'s processes: say which one gave up
            return f"livepush: [{_named.process_name} pid {os.getpid()}] {message}"
        return f"livepush: {message}"
    entry: dict[str, object] = {"time": datetime.now(timezone.utc).isoformat(timespec="milliseconds"),
                                "level": "error", "logger": "livepush", "message": scrub(message)}
    if _named is not None:
        if _named.worker is not None:
            entry["worker"] = _named.worker
        entry["pid"] = os.getpid()
    return json.dumps(entry, ensure_ascii=False)


class _NameProcess(logging.Filter):
    """Stamps every record with the process's role among `serve --workers N`'s processes."""

    def __init__(self, worker: int | None) -> None:
        super().__init__()
        self.worker = worker
        self.process_name = SUPERVISOR if worker is None else f"worker {worker}"

    def filter(self, record: logging.LogRecord) -> bool:
        record.livepush_process = self.process_name
        record.livepush_worker = self.worker
        return True


# This process's role under `serve --workers N`, once name_process() or setup() knows it (None: a
# lone process).
_named: _NameProcess | None = None


def name_process(*, worker: int | None = None, supervisor: bool = False) -> None:
    """Name this process among `serve --workers N`'s from now on, before logging is set up: what
    it does first (loading `--app`) may end it, and its error line must say which process gave up."""
    global _named
    if worker is not None or supervisor:
        _named = _NameProcess(worker)


def keep_livepush_loggers() -> None:
    """Enable again livepush's loggers that the project's modules disabled as they loaded. A
    project's dictConfig (Django's LOGGING, at django.setup()) disables every logger that exists
    and that it does not name, unless told not to: in a web process livepush's loggers come after
    it, but a command that loads the project's modules made its own before, and lost every line
    of theirs, a job failed for good included. A logger the configuration names is never disabled,
    so levels and handlers it gives livepush's loggers stay as it says."""
    for name, logger in logging.Logger.manager.loggerDict.items():
        if isinstance(logger, logging.Logger) and (name == "livepush" or name.startswith("livepush.")):
            logger.disabled = False


def setup(log_format: str = "text", level: int = logging.INFO, *, worker: int | None = None,
          supervisor: bool = False) -> None:
    """Log to stderr in `log_format`, once per process (a host that configured logging keeps its
    own); `worker` (its index) or `supervisor` name the process in every line."""
    root = logging.getLogger()
    if root.handlers:
        return
    handler = logging.StreamHandler(sys.stderr)
    name_process(worker=worker, supervisor=supervisor)
    named = worker is not None or supervisor
    if log_format == "json":
        handler.setFormatter(JsonLines())
    else:
        handler.setFormatter(Scrubbed(PROCESS_TEXT_FORMAT if named else TEXT_FORMAT))
    if named and _named is not None:
        handler.addFilter(_named)
    root.addHandler(handler)
    root.setLevel(level)
