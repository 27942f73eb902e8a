"""Runs the benchmark suites against one throwaway PostgreSQL and Redis and reports every figure
in one shape: a header (the machine and the command), one table, and bench/report.json.

Run it through bin/bench, which makes .venv and the peers' .venv-bench first. Each suite is a
module of bench/ with `figures(ctx) -> list[report.Figure]`; one that fails is reported with its
error and the others still run (the exit status is then 1). A suite whose module is not in this
tree is reported as not built and skipped.

`--repeat N` runs the selected suites N times, round after round rather than one suite N times
in a row, so a slow spell of a shared machine falls on one round of several suites instead of on
every round of one. Each figure is then the median of its N runs.
"""

from __future__ import annotations

import argparse
import importlib
import os
import platform
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)

import report  # noqa: E402

# Suite name -> module in bench/, in the order they run.
SUITES = {
    "push": "push_suite",
    "history": "history_bench",
    "slow_client": "slow_client_bench",
    "jobs": "jobs_bench",
    "groups": "groups_bench",
    "enqueue_keys": "enqueue_keys_bench",
    "django": "django_enqueue_bench",
    "limits": "limits_bench",
    "durable": "durable_bench",
    "workflows": "workflows_bench",
}
PEERS = ("pgqueuer", "procrastinate", "dbos", "python-socketio", "uvicorn", "websockets")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="bin/bench", description=__doc__.split("\n\n")[0],
                                epilog="suites: " + ", ".join(SUITES))
    p.add_argument("--quick", action="store_true", help="smaller sizes and one round: the whole run under 3 minutes")
    p.add_argument("--only", metavar="SUITE[,SUITE]", help="run only these suites")
    p.add_argument("--repeat", type=int, default=1, metavar="N",
                   help="run the suites N times, round after round, and report each figure's median "
                        "and the median of its N paired ratios (default 1)")
    p.add_argument("--out", default=os.path.join("bench", "report.json"), help="where the JSON report goes")
    p.add_argument("--pg-port", type=int, default=0, help="port for the throwaway PostgreSQL (0: any free one)")
    p.add_argument("--redis-port", type=int, default=0, help="port for the throwaway Redis (0: any free one)")
    # bin/bench's first call: the arguments checked (exit 2 with the usage), nothing run, before it
    # spends minutes installing the peers for a command line that was wrong all along.
    p.add_argument("--check-arguments", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    names = [s.strip() for s in (args.only or "").split(",") if s.strip()] or list(SUITES)
    unknown = [s for s in names if s not in SUITES]
    if unknown:
        p.error(f"unknown suite(s) {', '.join(unknown)}: choose from {', '.join(SUITES)}")
    args.suites = names
    if args.repeat < 1:
        p.error(f"--repeat must be 1 or more, not {args.repeat}")
    return args


def machine(pg_admin: str, redis_url: str, bench_python: str | None) -> list[str]:
    """The header's lines: what the figures were measured on."""
    cpu = "unknown CPU"
    try:
        with open("/proc/cpuinfo") as fh:
            cpu = next(line.split(":", 1)[1].strip() for line in fh if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    import psycopg  # here, not at the top: --help runs before bin/setup, on a python3 without it

    with psycopg.connect(pg_admin) as c:
        pg = {name: c.execute(f"SHOW {name}").fetchone()[0]  # type: ignore[index]
              for name in ("server_version", "fsync", "synchronous_commit")}
    import redis

    client = redis.Redis.from_url(redis_url)
    try:
        redis_version = client.info("server")["redis_version"]
    finally:
        client.close()
    lines = [
        f"machine: {cpu}, {os.cpu_count()} cores, {ram:.0f} GiB RAM, Linux {platform.release()}, "
        f"Python {platform.python_version()}, load average {' '.join(f'{x:.1f}' for x in os.getloadavg())}",
        f"services: PostgreSQL {pg['server_version']} (fsync={pg['fsync']}, synchronous_commit="
        f"{pg['synchronous_commit']}), Redis {redis_version}",
    ]
    if bench_python:
        lines.append("peers: " + peer_versions(bench_python))
    return lines


def peer_versions(bench_python: str) -> str:
    code = ("import importlib.metadata as m\nfor n in %r:\n    try: print(n, m.version(n))\n"
            "    except m.PackageNotFoundError: print(n, 'missing')" % (PEERS,))
    out = subprocess.run([bench_python, "-c", code], capture_output=True, text=True, timeout=60, check=False)
    return ", ".join(out.stdout.split("\n")[:-1]) or f"unreadable ({out.stderr.strip()[-200:]})"


def run_suite(name: str, ctx: report.Context) -> tuple[list[report.Figure], str | None]:
    """The suite's figures, each labelled with the suite, and its error (None when it ran)."""
    module_name = SUITES[name]
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name == module_name:
            return [], "not built"
        raise
    got = module.figures(ctx)
    return [f if f.suite else report.dataclasses.replace(f, suite=name) for f in got], None


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.check_arguments:
        return 0
    # SIGTERM (a CI timeout, kill) unwinds like Ctrl-C, so the finally below stops the services.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    bench_python = os.path.join(ROOT, ".venv-bench", "bin", "python")
    from _services import Services  # imports psycopg: see machine()

    services = Services()
    workdir = tempfile.mkdtemp(prefix="livepush-bench-run-")
    figures: list[report.Figure] = []
    failed: dict[str, str] = {}
    skipped: list[str] = []
    t0 = time.monotonic()
    try:
        # Durable defaults (a commit waits for its WAL flush, as in production), and commit
        # timestamps: the durable and workflow suites time wake-ups from when an outcome committed.
        pg_admin = services.start_postgres(args.pg_port, durable=True, settings={"track_commit_timestamp": "on"})
        redis_url = services.start_redis(args.redis_port)
        ctx = report.Context(pg_admin_url=pg_admin, redis_url=redis_url, quick=args.quick, workdir=workdir,
                             bench_python=bench_python if os.path.exists(bench_python) else None)
        print(("command: bin/bench " + shlex.join(sys.argv[1:] if argv is None else argv)).rstrip())
        for line in machine(pg_admin, redis_url, ctx.bench_python):
            print(line)
        print(flush=True)
        runs: list[list[report.Figure]] = []
        for round_no in range(1, args.repeat + 1):
            runs.append([])
            for name in args.suites:
                started = time.monotonic()
                label = name if args.repeat == 1 else f"{name} (round {round_no} of {args.repeat})"
                report.note(f"== {label}")
                try:
                    got, why = run_suite(name, ctx)
                except Exception:
                    failed[label] = traceback.format_exc()
                    report.note(f"== {label} FAILED after {time.monotonic() - started:.0f} s:\n{failed[label]}")
                    continue
                if why:
                    if name not in skipped:
                        skipped.append(name)
                    report.note(f"== {label}: {why}, skipped")
                    continue
                runs[-1] += got
                report.note(f"== {label}: {len(got)} figures in {time.monotonic() - started:.0f} s")
        figures = runs[0] if args.repeat == 1 else report.combine(runs)
    finally:
        services.stop()
        shutil.rmtree(workdir, ignore_errors=True)
    print(report.table(figures))
    report.write(args.out, figures)
    print(f"\n{len(figures)} figures in {time.monotonic() - t0:.0f} s, written to {args.out}")
    for name in skipped:
        print(f"suite {name}: not built (no bench/{SUITES[name]}.py), skipped")
    for name, error in failed.items():
        print(f"suite {name} FAILED: {error.strip().splitlines()[-1]}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
