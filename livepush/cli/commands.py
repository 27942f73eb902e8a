"""The `livepush` command (docs/reference.md#3-commands). Exit status: 0 clean stop, 1 a dependency
failed, 2 bad usage or configuration, 75 a lock held too long (try again), 130 a printing command
stopped by Ctrl-C; errors are one line on stderr, never a traceback."""

from __future__ import annotations

import argparse
import contextlib
import errno
import json
import os
import sys
from collections.abc import Callable, Collection, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .. import config, stopsignals
from ..errors import ConfigError, DependencyError, InvalidTopic, LivepushError, SchemaBusyError, SchemaError
from . import flags, logs

if TYPE_CHECKING:
    from _typeshed import SupportsWrite

EXIT_OK, EXIT_DEPENDENCY, EXIT_USAGE = 0, 1, 2
# A read that a schema change held up (`livepush migrate` under way), or a migrate that a long
# transaction held up: nothing is wrong, try again. sysexits' EX_TEMPFAIL, so a script can tell
# it from a database that is down (1).
EXIT_TRY_AGAIN = 75
# A command that prints its result and ends, stopped by SIGINT before it finished: 128 + SIGINT,
# what a shell reports for a command Ctrl-C stopped (SIGTERM, left to its default, gives 143).
EXIT_INTERRUPTED = 130
# The commands that print their result and end: a broken pipe on stdout is their reader gone.
_PRINTING = ("migrate", "status", "publish", "token")
# Of those, the ones whose printout is all they give (a token, a report): run with stdout closed,
# they refuse. A migration or a publish is done all the same, and its exit status says so.
_ONLY_PRINTING = ("status", "token")
# The commands that run until stopped: a stop signal while they start is their clean stop (exit 0).
_RUNNING = ("serve", "jobs", "demo")
# What a write to standard output fails with when the file behind it cannot take it.
_OUTPUT_ERRNOS = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EIO)


class _Parser(argparse.ArgumentParser):
    # Set by main() when the command line asks for --log-format json: a usage error is then one
    # JSON line as well, since the parser fails before the arguments (and the format) are read.
    json_errors = False

    # The subcommands' parsers by name, on the top-level parser (build_parser() sets it).
    commands: Mapping[str, argparse.ArgumentParser] = {}

    def parse_args(self, args: Sequence[str] | None = None,  # type: ignore[override]
                   namespace: argparse.Namespace | None = None) -> argparse.Namespace:
        parsed, extras = self.parse_known_args(args, namespace)
        if extras:
            # argparse leaves a subcommand's unknown arguments to the top-level parser, whose usage
            # lists the commands: the command's own usage says what it does take.
            command = getattr(parsed, "command", None) or ""
            given = list(sys.argv[1:] if args is None else args)
            self.commands.get(command, self).error(f"unrecognized arguments: {' '.join(extras)}"
                                                   f"{_variable_instead(extras, command)}"
                                                   f"{_commas_instead(given, extras, command)}")
        return parsed

    def _print_message(self, message: str, file: SupportsWrite[str] | None = None) -> None:
        # argparse drops a write's OSError, so `--help` to a full disk exited 0 with nothing
        # written: standard output gets what the printing commands get (stderr stays argparse's).
        if message and file is sys.stdout:
            _print_or_exit(self, message, f"{self.prog.partition(' ')[2]} --help".lstrip())
        else:
            super()._print_message(message, file)

    def error(self, message: str) -> None:  # type: ignore[override]
        if _Parser.json_errors:
            self.exit(EXIT_USAGE, logs.error_line(message, "json") + "\n")
        self.print_usage(sys.stderr)
        self.exit(EXIT_USAGE, f"livepush: {message}\n")


def _asks_json(argv: Sequence[str]) -> bool:
    """Whether the command line holds `--log-format json`, spelled as the parser takes it:
    `--log-format=json`, or the flag shortened (`--log json`), which argparse accepts."""
    for flag, following in zip(argv, [*argv[1:], None]):
        name, equals, value = flag.partition("=")
        # From `--lo` on: `--l` may be `status --limit`'s shortening.
        if len(name) >= 4 and "--log-format".startswith(name):
            if (value if equals else following) == "json":
                return True
    return False


# The flags that stand in for a setting (and so for its variable): their argparse names, which
# spell the flag, and the setting. A command has those of them its parser defines: `serve` the
# first five, `migrate` --lock-timeout.
_FLAGS = {"host": "host", "port": "port", "fanout": "fanout", "authenticate": "authenticate",
          "drain_seconds": "drain_seconds", "lock_timeout": "migrate_lock_timeout"}


def _flag(name: str) -> str:
    """The flag of argparse name `name`."""
    return "--" + name.replace("_", "-")


# The flags of `serve` that a command without them reads from its variable instead.
_READ_FROM_VARIABLES = {"demo": ("host", "port")}


def _variable_instead(extras: Sequence[str], command: str) -> str:
    """For `serve`'s flag given to a command that reads its variable instead (`livepush demo
    --port 9000`): that variable, else nothing."""
    for extra in extras:
        name = extra.partition("=")[0].removeprefix("--").replace("-", "_")
        if extra.startswith("--") and name in _READ_FROM_VARIABLES.get(command, ()):
            variable = config.variable_of(_FLAGS[name])
            return f" ({command} reads {variable} instead, e.g. {variable}=... livepush {command})"
    return ""


# The list flags, comma-separated, that a user may give with spaces instead, as many commands take one.
_LIST_FLAGS = {"jobs": ("--queues",), "serve": ("--with-jobs",)}


def _commas_instead(given: Sequence[str], extras: Sequence[str], command: str) -> str:
    """For words left over after a list (`livepush jobs myapp.jobs other.jobs`, `--queues a b`): the
    list as it is written, with commas; else nothing."""
    stray = next((e for e in extras if not e.startswith("-")), None)
    if stray is None or command not in _LIST_FLAGS:
        return ""
    at = len(given) - 1 - given[::-1].index(stray)  # its last place: a word may also be given before
    if at < 1:
        return ""
    end = at
    while end < len(given) and not given[end].startswith("-"):
        end += 1
    head = given[at - 1]
    flag, equals, value = head.partition("=")
    if not equals:
        flag, value = (given[at - 2] if at >= 2 else ""), head
    if any(len(flag) >= 4 and name.startswith(flag) for name in _LIST_FLAGS[command]):
        name = next(name for name in _LIST_FLAGS[command] if name.startswith(flag))
        example = f"{name} {','.join([value, *given[at:end]])}"
    elif command == "jobs" and not head.startswith("-") and not flag.startswith("-"):  # not a flag's value
        example = f"livepush jobs {','.join([head, *given[at:end]])}"
    else:
        return ""
    return f" (a list is one argument, its entries separated by commas, e.g. {example})"


def _settings(args: argparse.Namespace, *, replaced: Collection[str] = ()) -> config.Settings:
    """The settings, with this command's flags applied (their errors name them as the operator gave
    them: `Settings.named()`); `replaced` names further variables a flag given on this command
    line stands in for."""
    flags = {setting: _flag(name) for name, setting in _FLAGS.items() if hasattr(args, name)}
    given = {setting: getattr(args, name) for name, setting in _FLAGS.items() if getattr(args, name, None) is not None}
    # A flag overrides its variable (docs/reference.md#2-configuration): a variable the flag
    # replaces is not read at all, so a stale bad value there does not refuse `--port 9000`.
    unread = {config.variable_of(setting) for setting in given} | set(replaced)
    environ = {k: v for k, v in os.environ.items() if k not in unread}
    settings = config.Settings.from_env(environ, flags=flags).replace(**given)
    config.set_settings(settings)
    return settings


def _shared_fan_out(settings: config.Settings, unset: str = "unset LIVEPUSH_FANOUT") -> str:
    """What gives a command that refuses the local fan-out one that other processes hear: with a
    database URL set, the local one was chosen over the database's, and setting the URL is no fix.
    `unset`: how this command's choice of it is undone."""
    if settings.database_url:
        return (f"{unset} (with {settings.database_url_setting} set the fan-out is then postgres), or set "
                "LIVEPUSH_FANOUT=redis with LIVEPUSH_REDIS_URL")
    return "set LIVEPUSH_DATABASE_URL (or LIVEPUSH_REDIS_URL with LIVEPUSH_FANOUT=redis)"


# -- commands ------------------------------------------------------------------------
def cmd_migrate(args: argparse.Namespace) -> int:
    from .. import migrate
    from ..postgres.text import unstorable

    settings = _settings(args)  # --lock-timeout stands in for LIVEPUSH_MIGRATE_LOCK_TIMEOUT
    if args.runtime_role is not None and not args.runtime_role.strip():
        # `--runtime-role "$ROLE"` with the variable unset: "no such role ''" would send the
        # operator to create a role, when what is missing is the variable.
        raise ConfigError("--runtime-role is empty: name the role serve and jobs log in as, e.g. --runtime-role "
                          "app_runtime, or leave the flag out to grant nothing")
    wrong = unstorable(args.runtime_role) if args.runtime_role is not None else None
    if wrong is not None:
        # A name read from a file in another encoding: the driver would fail to send it, with a
        # traceback, after the migrations ran (and were rolled back with the grants).
        raise ConfigError(f"--runtime-role {args.runtime_role!r} holds {wrong}, which no role name can: "
                          "give the role's name as Postgres knows it (\\du in psql lists them)")
    # Each try that waited for a lock is said as it ends: the whole run may take a while.
    applied = migrate.migrate_configured(settings, args.runtime_role,
                                         on_retry=lambda line: print(logs.error_line(line, "text"), file=sys.stderr))
    for m in applied:
        print(f"applied {m.version:04d}_{m.name}")
    have, ours = migrate.schema_version(settings.require_database()), migrate.required_version()
    # A newer livepush migrated first (upgrades do): say so rather than report our own version.
    newer = f", newer than this livepush's {ours}" if have > ours else ""
    print(f"schema at version {have}{newer}" + ("" if applied else " (nothing to do)"))
    if args.runtime_role:
        print(f"granted {args.runtime_role} what the runtime needs")
        # Not an error: the grants are in, and the fix is a statement for the database's owner.
        for line in migrate.runtime_leftovers(settings.require_database(), args.runtime_role):
            print(f"warning: {line}", file=sys.stderr)
    return EXIT_OK


def cmd_serve(args: argparse.Namespace) -> int:
    from ..server.run import serve
    from . import wiring, workers
    from ..usercode import importable_from_cwd
    from .jobs import modules_of
    from .runner import run_async

    settings = _settings(args)
    settings.require_secret()
    # Given but naming nothing (`--with-jobs "$MODULES"` with the variable unset): the server would
    # run without its job runtime, or without its rules, and say nothing.
    if args.with_jobs is not None and not modules_of(args.with_jobs):
        raise ConfigError(f"--with-jobs {args.with_jobs!r} names no module: name the modules that define your "
                          "job functions, e.g. --with-jobs myapp.jobs, or leave the flag out")
    if args.app is not None and not args.app.strip():
        raise ConfigError("--app is empty: name your livepush.App as MODULE:ATTR, e.g. --app myapp.push:app, "
                          "or leave the flag out")
    role = workers.WorkerRole.parse(args.supervised_as) if args.supervised_as else None
    if role is None:
        count = workers.worker_count(args.workers)
        if count > 1 and settings.fanout == "local":
            # Each worker is a process of its own: what one publishes (its jobs, the app's hooks)
            # would reach only the clients the kernel happened to give it, and its history only
            # them, with nothing to say so.
            raise ConfigError(f"{workers.workers_named(args.workers)} with {settings.named('fanout', 'local')}: "
                              "the local fan-out reaches only the process that publishes, so each worker's "
                              "clients would miss what the others publish: "
                              f"{_shared_fan_out(settings, 'leave out --fanout local and LIVEPUSH_FANOUT')}, or run "
                              "one worker")
        if count > 1:
            logs.setup(args.log_format, supervisor=True)
            return workers.supervise(count, args.argv, settings, with_jobs=bool(args.with_jobs))
    else:
        from .. import metrics

        role.start()
        logs.name_process(worker=role.index)  # before --app loads: its failure is this worker's line
        metrics.add_up_workers(role.index)
        role.hold_metrics_folder()
    index = role.index if role is not None else None
    # Before the modules load, as `livepush jobs` does: one that calls logging.basicConfig() at its
    # top would otherwise own the root logger, and --log-format and the scrubbing would be lost.
    logs.setup(args.log_format, worker=index)
    if args.app or args.with_jobs:
        # Only then: a server with no module of the project's imports nothing from the current
        # folder, so one started from a folder since removed serves all the same.
        importable_from_cwd()  # --with-jobs modules, as `livepush jobs` finds them
    if settings.fanout == "local":
        from .. import api

        # What the modules publish at import is this server's (it serves that fan-out), not
        # another process': the warning that it reaches no server would be wrong here.
        api.local_fanout_explained()
    app = None
    if args.app:
        from ..sessions.rules import load_app

        app = load_app(args.app)
    if args.with_jobs:
        from ..jobs.runtime.runtime import load_modules

        load_modules(modules_of(args.with_jobs))  # outside the loop, as `livepush jobs` imports them
    logs.keep_livepush_loggers()

    async def main() -> int:
        parts = wiring.server_parts(settings, app=app, with_jobs=modules_of(args.with_jobs or ""), worker=index)
        return await serve(parts.server, sidecars=parts.sidecars, closers=[parts.close],
                           ready=role.tell_ready if role is not None else None)

    return run_async(main())


def cmd_publish(args: argparse.Namespace) -> int:
    from .. import api
    from ..fanout.base import encode_payload

    settings = _settings(args)
    text, given = _publish_json(args.json)
    try:
        data = json.loads(text)
    except ValueError as exc:
        fix = ("write one JSON document to it" if args.json == "-"
               else "quote it, e.g. '{\"text\": \"hi\"}'")
        raise ConfigError(f"{given} is not valid JSON ({exc}): {fix}") from None
    except RecursionError:
        # The decoder recurses once per level: a document deeper than the interpreter's stack
        # allows is the user's input, not a crash.
        raise ConfigError(f"{given} is nested too deeply to decode: publish a flatter document") from None
    if settings.fanout == "local":
        # What the operator typed is checked first; then, since the local fan-out reaches only
        # this process, which no server is part of, the message would be lost whatever it is.
        api.publishable(args.topic)
        encode_payload(data)
        raise ConfigError("LIVEPUSH_FANOUT=local reaches only the process that publishes, and no server is part "
                          f"of this one: {_shared_fan_out(settings)}, as your servers have it")
    from ..migrate import schema_named_when_missing

    # Through Postgres, a function it lacks may be a schema out of the role's reach: say which.
    named = (schema_named_when_missing(settings.require_database(), "livepush publish")
             if settings.fanout == "postgres" else contextlib.nullcontext())
    with named:
        offset = api.publish(args.topic, data)
    print(offset)
    return EXIT_OK


# How many times a message's 1 MiB limit `publish -` reads of standard input before it refuses it.
_STDIN_PAYLOAD_FACTOR = 16


def _publish_json(argument: str) -> tuple[str, str]:
    """`publish`'s JSON text and how to name it in an error: the argument, or for `-` standard
    input (a document from a file or a program, or too long for a command line), as `-` means to
    most commands that read data. `-` is no JSON, so no message is taken for it."""
    if argument != "-":
        return argument, "JSON argument"
    if sys.stdin is None:
        raise ConfigError("JSON argument '-' reads the message from standard input, which is closed: "
                          "give the JSON as the argument, or pipe it in (... | livepush publish TOPIC -)")
    from ..fanout.base import MAX_PAYLOAD_BYTES

    # Read as bytes (JSON is UTF-8 whatever the locale decodes stdin with), and only so far: a
    # message is at most 1 MiB encoded, which whitespace and escapes may pad many times over, but a
    # larger file, or an endless stream, would otherwise be held in memory whole before its refusal.
    most = _STDIN_PAYLOAD_FACTOR * MAX_PAYLOAD_BYTES
    if sys.stdin.isatty():  # typed in: without a word it would look hung
        print("livepush publish: reading the message's JSON from standard input; end it with Ctrl-D",
              file=sys.stderr, flush=True)
    read = sys.stdin.buffer.read(most + 1)
    if len(read) > most:
        raise ConfigError(f"standard input holds more than {most // 2**20} MiB, and a message is at most "
                          f"{MAX_PAYLOAD_BYTES // 2**20} MiB of JSON: send a reference (an id or URL) and let the "
                          "page fetch the rest")
    try:  # utf-8-sig: a file some editors saved with a byte order mark is still the same JSON
        return read.decode("utf-8-sig"), "JSON from standard input"
    except UnicodeDecodeError as exc:
        raise ConfigError(f"JSON from standard input is not UTF-8 ({exc.reason} at byte {exc.start}): "
                          "write the document as UTF-8") from None


def cmd_token(args: argparse.Namespace) -> int:
    # A topic's --ttl is the LIVEPUSH_SIGNED_TOPIC_TTL it would otherwise sign for.
    signs_for = args.kind == "topic" and args.ttl is not None
    settings = _settings(args, replaced=("LIVEPUSH_SIGNED_TOPIC_TTL",) if signs_for else ())
    settings.require_secret()
    if args.kind == "session":
        from .. import sessions
        from ..sessions.tokens import MAX_TTL

        if args.ttl is not None and args.ttl > MAX_TTL:
            # Refused here, naming the flag as typed: the API's refusal names its `ttl` parameter.
            # Every digit kept: `:g` wrote 31622401 as 3.16224e+07, which reads as the limit itself.
            raise ConfigError(f"--ttl {args.ttl:.15g}: a session token lasts at most {MAX_TTL:.0f} seconds "
                              "(366 days): issue a new one when it ends")
        print(sessions.issue(args.value, ttl=args.ttl if args.ttl is not None else 86400))
    else:
        from .. import api

        print(api.sign_topic(args.value, ttl=args.ttl if args.ttl is not None else settings.signed_topic_ttl))
    return EXIT_OK


def cmd_jobs(args: argparse.Namespace) -> int:
    from . import jobs as jobs_cli
    from .runner import run_async

    settings = _settings(args)
    logs.setup(args.log_format)
    jobs_cli.load(args)
    logs.keep_livepush_loggers()
    return run_async(jobs_cli.run(args, settings))


def cmd_status(args: argparse.Namespace) -> int:
    from . import status as status_cli

    return status_cli.run(args, _settings(args))


def cmd_demo(args: argparse.Namespace) -> int:
    from .. import demo

    logs.setup(args.log_format)
    return demo.run()


def _log_format(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--log-format", choices=logs.FORMATS, default="text",
                        help="text (default): lines for people; json: one JSON object a line")


class _Version(argparse.Action):
    """`--version`: livepush's version and the schema version it migrates to, which `livepush
    migrate` and the refusals of a schema too old name. Read when asked: the schema's needs a
    look at the migrations, which no other command line pays for."""

    def __init__(self, option_strings: Sequence[str], dest: str, **kwargs: Any) -> None:
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, **kwargs)

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:
        from importlib.metadata import PackageNotFoundError, version

        from .. import migrate

        try:
            mine = version("livepush")
        except PackageNotFoundError:  # run from a checkout on PYTHONPATH, not installed
            mine = "(not installed: run from its source)"
        _print_or_exit(parser, f"livepush {mine} (schema {migrate.required_version()})\n", "--version")
        parser.exit(EXIT_OK)


def _print_or_exit(parser: argparse.ArgumentParser, text: str, command: str) -> None:
    """`text` on standard output (argparse's own answers: `--version`, `--help`), or exit 1 as
    _main() does for the printing commands: saying nothing when the reader went away, one line
    for a full disk. What is left unwritten would fail again at exit: it goes nowhere."""
    try:
        sys.stdout.write(text)
        sys.stdout.flush()
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        parser.exit(EXIT_DEPENDENCY)
    except OSError as exc:
        if exc.errno not in _OUTPUT_ERRNOS:
            raise
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        parser.exit(EXIT_DEPENDENCY, logs.error_line(_unwritten(command, exc), "text") + "\n")


def build_parser() -> argparse.ArgumentParser:
    from . import jobs as jobs_cli
    from . import status as status_cli

    # The statuses a script tests for: 75 is "try again", not "down" (reference §3).
    parser = _Parser(prog="livepush", description="Real-time push for Python applications.",
                     epilog=f"exit status: {EXIT_OK} done (or a clean stop), {EXIT_DEPENDENCY} Postgres or Redis down "
                            "(or serve --workers killed a worker that outlived its stop), "
                            f"{EXIT_USAGE} bad usage or configuration, {EXIT_TRY_AGAIN} a lock held too long "
                            f"(try again), {EXIT_INTERRUPTED} {', '.join(_PRINTING[:-1])} or {_PRINTING[-1]} "
                            "stopped by Ctrl-C before it finished (docs/reference.md, Commands)")
    parser.add_argument("--version", action=_Version, help="print livepush's version and the schema version it needs")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    parser.commands = sub.choices

    def command(name: str, summary: str, **more: Any) -> argparse.ArgumentParser:
        # Its line in the command list opens its own --help too, which otherwise lists flags alone.
        return sub.add_parser(name, help=summary, description=summary[0].upper() + summary[1:] + ".", **more)

    p = command("migrate", "apply the database migrations (safe to repeat)")
    p.add_argument("--runtime-role", metavar="ROLE", action=flags.Once,
                   instead=" (run livepush migrate once for each runtime role)",
                   help="also grant ROLE exactly what serve, jobs, publish() and enqueues need")
    p.add_argument("--lock-timeout", type=flags.seconds, metavar="S",
                   help="seconds each migration waits for a table's lock before it tries again "
                        "(LIVEPUSH_MIGRATE_LOCK_TIMEOUT; default: the role's lock_timeout, else 5; 0: no limit; "
                        f"from 0 to {config.MAX_MIGRATE_LOCK_TIMEOUT:g})")
    p.set_defaults(func=cmd_migrate)

    p = command("serve", "run the WebSocket server")
    p.add_argument("--host", help="address to listen on (LIVEPUSH_HOST; default 127.0.0.1)")
    p.add_argument("--port", type=flags.whole_number,
                   help="port to listen on (LIVEPUSH_PORT; default 8765; 0: any free one)")
    p.add_argument("--fanout", choices=config.FANOUTS, type=str.lower,
                   help="LIVEPUSH_FANOUT (default postgres with a database URL, else local)")
    p.add_argument("--authenticate", choices=config.AUTH_MODES, type=str.lower, help="LIVEPUSH_AUTHENTICATE (default optional)")
    p.add_argument("--app", metavar="MODULE:ATTR", action=flags.Once, help="your livepush.App (topic rules, hooks)")
    p.add_argument("--with-jobs", metavar="MODULE[,MODULE...]", action=flags.Joined,
                   help="also run the job runtime for these job modules (the flag may be repeated)")
    _log_format(p)
    p.add_argument("--drain-seconds", type=flags.seconds, metavar="S",
                   help="on SIGTERM, close connections in batches over S seconds "
                        f"(LIVEPUSH_DRAIN_SECONDS; default 0: all at once; from 0 to {config.MAX_DRAIN_SECONDS:g})")
    p.add_argument("--workers", metavar="N",
                   help=f"N server processes on one port, from 1 to {config.MAX_WORKERS} (LIVEPUSH_WORKERS; "
                        "default 1; auto: one per core)")
    p.add_argument("--supervised-as", help=argparse.SUPPRESS)  # set by the supervisor of --workers
    p.set_defaults(func=cmd_serve)

    p = command("jobs", "run the job runtime")
    jobs_cli.add_arguments(p)
    _log_format(p)
    p.set_defaults(func=cmd_jobs)

    p = command("status", "queues, runtimes, groups and workflows in progress, from the database")
    status_cli.add_arguments(p)
    p.set_defaults(func=cmd_status)

    p = command("demo", "run the demo: server, jobs and a live page in one process",
                epilog="LIVEPUSH_PORT picks its port (default 8765) and LIVEPUSH_HOST its address: it takes no --port "
                       "or --host. LIVEPUSH_DATABASE_URL (else DATABASE_URL) runs it on your Postgres; without one it "
                       "runs on an embedded Postgres, its data in .livepush/ under the current folder. Ctrl-C stops "
                       "it (exit 0).")
    _log_format(p)
    p.set_defaults(func=cmd_demo)

    p = command("publish", "publish a message")
    p.add_argument("topic", metavar="TOPIC", help="the topic, e.g. chat:lobby (not a job:, group: or workflow: state topic)")
    p.add_argument("json", metavar="JSON", help="the message's data as JSON, e.g. '{\"text\": \"hi\"}', or - to "
                                                "read it from standard input")
    p.set_defaults(func=cmd_publish)

    p = command("token", "make a session token or a signed topic")
    p.add_argument("kind", choices=("session", "topic"), metavar="session|topic",
                   help="session: a session token for SUBJECT; topic: TOPIC signed, its own permission")
    p.add_argument("value", metavar="SUBJECT|TOPIC", help="the session's subject, or the topic to sign")
    p.add_argument("--ttl", type=flags.positive_seconds, metavar="S", help="seconds until it expires (default: 86400 for a session, "
                   "which lasts at most 366 days; LIVEPUSH_SIGNED_TOPIC_TTL for a topic)")
    p.set_defaults(func=cmd_token)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    # First: the package's imports are still to come (the parser's own, a command's), and a stop
    # signal among them must wait for the handlers the command sets (_main), not kill by default.
    stopsignals.hold_start()
    try:
        return _main(argv)
    except ModuleNotFoundError as exc:
        # The modules of the user's project are imported where a failure is turned into its own
        # line (load_modules, load_app): one that gets here is livepush's, missing from this Python
        # (bin/jobs run with python3 in a checkout that has no .venv).
        if not exc.name or exc.name.partition(".")[0] == "livepush":
            raise
        json_errors = _asks_json(list(sys.argv[1:] if argv is None else argv))
        print(logs.error_line(_not_installed(exc.name), "json" if json_errors else "text"), file=sys.stderr)
        return EXIT_USAGE
    finally:
        # On every way out too (a usage error exits before the command runs): the processes it
        # starts, or the rest of a program that called main(), would inherit the signals held.
        stopsignals.release_start()


def _unwritten(command: str, exc: OSError) -> str:
    """The line for output that standard output could not take (a full disk)."""
    return (f"could not write the output of `livepush {command}` to standard output ({exc.strerror or exc}); "
            "free space or write it elsewhere")


def _not_installed(module: str) -> str:
    """What to do when `module`, which livepush imports, is not installed in this Python."""
    checkout = Path(__file__).resolve().parents[2]
    how = (f"{sys.executable} -m pip install -e {checkout}" if (checkout / "pyproject.toml").is_file()
           else f"{sys.executable} -m pip install livepush")
    return (f"this Python ({sys.executable}) lacks {module!r}, which livepush needs: install livepush with its "
            f"dependencies into it ({how}), or run livepush from the virtualenv it was installed in (bin/demo "
            "makes the checkout's .venv, which bin/jobs and bin/websocket_server then use)")


def _main(argv: Sequence[str] | None) -> int:
    from .runner import open_standard_descriptors

    # Before any command opens a file or a socket that would take a closed descriptor's number
    # (sys.stdout stays None, so the commands that only print still see stdout closed).
    open_standard_descriptors()
    parser = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    _Parser.json_errors = _asks_json(argv)
    args = parser.parse_args(argv)
    args.argv = argv  # what `serve --workers N` runs again in each worker
    func: Callable[[argparse.Namespace], int] = args.func
    log_format: str = getattr(args, "log_format", "text")

    def fail(exc: BaseException, status: int) -> int:
        # The last line of a command run with --log-format json is JSON too: it is the one line
        # a log collector most needs to read.
        print(logs.error_line(str(exc), log_format), file=sys.stderr)
        return status

    try:
        if args.command in _RUNNING:
            # Until its loop takes the stop signals over, a SIGTERM (while the modules import, a
            # Django project set up among them, or it waits for a database) stops it as Ctrl-C
            # does: KeyboardInterrupt, below, exit 0.
            stopsignals.term_as_interrupt()
            # A closed terminal or a dropped ssh session stops it as SIGTERM does: a runtime
            # drains rather than dies with its jobs in hand (left for the rescue, attempt spent),
            # a server closes its connections with 1001 rather than dropping them all at once,
            # and a supervisor of `serve --workers` forwards the SIGTERM to its workers.
            stopsignals.hangup_as_term()
        stopsignals.release_start()  # here, inside the try: one held back since the start lands now
        if sys.stdout is None and args.command in _ONLY_PRINTING:
            # Started with descriptor 1 closed (`>&-`): Python drops what is printed, and a token
            # made, or the report asked for, would be lost with exit 0.
            raise ConfigError(f"standard output is closed: `livepush {args.command}` prints its result there; "
                              "run it with stdout open (redirect it to a file to keep the result)")
        status = func(args)
        if sys.stdout is not None:
            sys.stdout.flush()  # here, not at exit: a reader that went away is then caught below
    except BrokenPipeError:
        if args.command not in _PRINTING:
            raise
        # `livepush status | head -1`: the reader has what it wanted, and no one reads the rest.
        # Python would report the pipe again when it flushes stdout at exit: point it at nothing.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        status = EXIT_DEPENDENCY
    except OSError as exc:
        if args.command not in _PRINTING or exc.errno not in _OUTPUT_ERRNOS:
            raise
        # `livepush status > file` on a full disk: what was printed is lost, and saying so is
        # the whole answer. The unwritten rest would fail again at exit: it goes nowhere.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        status = fail(OSError(_unwritten(args.command, exc)), EXIT_DEPENDENCY)
    except ConfigError as exc:
        status = fail(exc, EXIT_USAGE)
    except (SchemaError, InvalidTopic) as exc:
        status = fail(exc, EXIT_USAGE)
    except (ValueError, TypeError) as exc:
        # The operator tools pass what the user typed straight to the API: a ValueError there is
        # the user's input, not a bug, and gets one line, not a traceback.
        if isinstance(exc, LivepushError) or args.command in ("publish", "token"):
            status = fail(exc, EXIT_USAGE)
        else:
            raise
    except SchemaBusyError as exc:
        status = fail(exc, EXIT_TRY_AGAIN)
    except DependencyError as exc:
        status = fail(exc, EXIT_DEPENDENCY)
    except KeyboardInterrupt:
        if args.command in _PRINTING:
            # Its work may not be done (a migrate is rolled back whole): exit 0 would let a deploy
            # script's `livepush migrate && restart` go on as if it were.
            status = fail(KeyboardInterrupt(f"interrupted (SIGINT) before {args.command} finished"),
                          EXIT_INTERRUPTED)
        else:
            status = EXIT_OK  # a server's or runtime's stop asked for while it starts
    # Here, once the status and its error line are settled, for every command that runs jobs
    # (jobs, serve --with-jobs, demo): a sync job given back may still run in its thread.
    from .jobs import leave_if_threads_run

    leave_if_threads_run(status)
    return status


if __name__ == "__main__":
    sys.exit(main())
