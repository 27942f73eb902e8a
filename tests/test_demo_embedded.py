"""`livepush demo` on its embedded Postgres (pgserver), run as a user runs it: in a folder of its
own (where it keeps `.livepush/`), with no database configured. A crash, or a stop while it starts,
must leave nothing running once the next demo in the folder has stopped, and nothing that makes
that next demo fail or harm another program.
"""

from __future__ import annotations

import os
import pwd
import shutil
import signal
import sys
import tempfile
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import psutil
import pytest

from tests.support.procs import ChildProcess, Processes
from tests.support.waiting import wait_for

# A first start runs initdb; a stop drains a runtime with nothing to do and stops Postgres.
START_TIMEOUT = 60.0
STOP_TIMEOUT = 30.0

StartDemo = Callable[..., ChildProcess]


@pytest.fixture
def folder() -> Iterator[Path]:
    """The folder the demo runs in: a new one in the temporary folder, this user's as a project
    folder is. Whatever Postgres a failed test left running in it is killed at teardown."""
    path = Path(tempfile.mkdtemp(prefix="livepush-demo-test-"))
    try:
        yield path
    finally:
        for pid_file in path.glob("**/.livepush/pg/postmaster.pid"):
            left = postmaster(pid_file.parents[2])
            if left is not None:
                left.kill()
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def start_demo(procs: Processes, livepush_env: Callable[..., dict[str, str]], folder: Path) -> StartDemo:
    """Starts `livepush demo` in `folder` (or `cwd`) with no database configured, so on its
    embedded Postgres."""

    def start(cwd: Path | None = None) -> ChildProcess:
        env = livepush_env()
        return procs.start([sys.executable, "-m", "livepush", "demo"], env=env, cwd=cwd or folder,
                           port=int(env["LIVEPUSH_PORT"]), name="livepush demo")

    return start


def postmaster(folder: Path) -> psutil.Process | None:
    """The embedded Postgres of the demo in `folder`, while it runs."""
    pgdata = (folder / ".livepush" / "pg").resolve()
    try:
        process = psutil.Process(int((pgdata / "postmaster.pid").read_text().split("\n", 1)[0]))
        return process if str(pgdata) in process.cmdline() else None
    except (OSError, ValueError, psutil.NoSuchProcess):  # a zombie too: it has stopped
        return None


def running(process: psutil.Process) -> bool:
    """Whether `process` runs: neither gone nor a zombie nobody reaped yet (it has stopped)."""
    try:
        return process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_a_demo_killed_outright_leaves_its_postgres_to_the_next_demo_which_stops_it(
    start_demo: StartDemo, folder: Path
) -> None:
    """A demo killed with SIGKILL cannot stop its Postgres; the next demo in the folder uses that
    Postgres and stops it when it stops itself (SIGTERM, exit 0)."""
    first = start_demo()
    first.wait_healthy(START_TIMEOUT)
    first.popen.kill()
    first.wait()
    left = postmaster(folder)
    assert left is not None, "the Postgres of the killed demo is gone: nothing left to take over"

    second = start_demo()
    second.wait_healthy(START_TIMEOUT)
    assert postmaster(folder) == left, "the next demo started a Postgres of its own"
    assert second.stop(STOP_TIMEOUT) == 0, second.output()
    assert not running(left), f"the demo exited 0 but its Postgres (pid {left.pid}) still runs"


@pytest.mark.parametrize("name", ["", "My Projects/live push"], ids=["socket-in-its-data", "socket-in-tmp"])
def test_a_stale_postmaster_pid_that_names_another_program_neither_fails_the_demo_nor_kills_that_program(
    start_demo: StartDemo, folder: Path, procs: Processes, name: str
) -> None:
    """The demo and its Postgres killed outright (a power cut) leave postmaster.pid and the lock of
    its socket behind; once their pid belongs to another program, the next demo starts its own
    Postgres, serves, and stops (exit 0) without signalling that program, whether the socket was
    in the data directory or (for a project folder whose path has spaces) in /tmp."""
    project = folder / name
    project.mkdir(parents=True, exist_ok=True)
    first = start_demo(project)
    first.wait_healthy(START_TIMEOUT)
    first.popen.kill()
    first.wait()
    server = postmaster(project)
    assert server is not None
    backends = server.children()
    server.kill()
    wait_for(lambda: not any(map(running, [server, *backends])), 10, message="the killed Postgres to end")

    # Run as root, pgserver runs Postgres as its own user, which sees a program of that user alive
    # (another user's it takes for gone).
    as_postgres = ["setpriv", "--reuid=pgserver", "--regid=pgserver", "--clear-groups"] if os.geteuid() == 0 else []
    other = procs.start([*as_postgres, "sleep", "600"], name="another program")
    pid_file = project / ".livepush" / "pg" / "postmaster.pid"
    lines = pid_file.read_text().split("\n")
    pid_file.write_text("\n".join([str(other.pid), *lines[1:]]))
    socket_locks = list(Path(lines[4]).glob(".s.PGSQL.*.lock"))  # line 5: the socket's folder
    assert socket_locks, f"no socket lock in {lines[4]}"
    for lock in socket_locks:
        lock.write_text("\n".join([str(other.pid), *lock.read_text().split("\n")[1:]]))

    second = start_demo(project)
    second.wait_healthy(START_TIMEOUT)
    assert second.stop(STOP_TIMEOUT) == 0, second.output()
    assert other.running, f"the demo killed pid {other.pid}, which was never its Postgres"
    assert postmaster(project) is None

@pytest.mark.parametrize("stage", ["pg/PG_VERSION", "pg/global/pg_filenode.map", "pg/postmaster.pid"],
                         ids=["initdb", "initdb-after-bootstrap", "postgres-start"])
@pytest.mark.parametrize("how", ["sigterm", "ctrl-c"])
def test_a_stop_while_the_embedded_postgres_starts_exits_0_and_leaves_nothing_running(
    start_demo: StartDemo, folder: Path, stage: str, how: str
) -> None:
    """SIGTERM to the demo, or Ctrl-C in its terminal (SIGINT to its whole process group, pg_ctl
    and initdb included), while its Postgres is being made or started: the demo exits 0 without a
    traceback or an error report (pgserver's, with initdb's whole output, for the initdb that
    Ctrl-C stopped), no Postgres is left running, and the next demo in the folder starts as usual."""
    demo = start_demo()
    wait_for(lambda: (folder / ".livepush" / stage).exists() or not demo.running, START_TIMEOUT, 0.005,
             message=f".livepush/{stage} to appear")
    assert demo.running, demo.output()
    if how == "sigterm":
        demo.signal(signal.SIGTERM)
    else:
        demo.signal(signal.SIGINT, group=True)
    assert demo.wait(STOP_TIMEOUT) == 0, demo.output()
    assert "Traceback" not in demo.stderr(), demo.output()
    assert " ERROR " not in demo.stderr(), demo.output()
    left = postmaster(folder)
    assert left is None, f"the demo exited but left its Postgres (pid {left.pid}) running"

    again = start_demo()
    again.wait_healthy(START_TIMEOUT)
    assert again.stop(STOP_TIMEOUT) == 0, again.output()


def test_a_demo_whose_terminal_closes_stops_as_on_ctrl_c_and_stops_its_postgres(
    start_demo: StartDemo, folder: Path
) -> None:
    """Closing the terminal the demo runs in sends SIGHUP to it (and to whatever it started in
    that terminal): the demo stops as on SIGTERM, exit 0, and stops its embedded Postgres,
    instead of dying at once with that Postgres left running."""
    demo = start_demo()
    demo.wait_healthy(START_TIMEOUT)
    server = postmaster(folder)
    assert server is not None
    demo.signal(signal.SIGHUP, group=True)
    assert demo.wait(STOP_TIMEOUT) == 0, demo.output()
    assert not running(server), f"the demo exited but its Postgres (pid {server.pid}) still runs"


def test_a_demo_started_with_nohup_keeps_running_when_its_terminal_closes(
    procs: Processes, livepush_env: Callable[..., dict[str, str]], folder: Path
) -> None:
    """A demo started under `nohup` asked for SIGHUP to be ignored: it goes on serving after one,
    and stops on SIGTERM as always (exit 0)."""
    env = livepush_env()
    demo = procs.start(["nohup", sys.executable, "-m", "livepush", "demo"], env=env, cwd=folder,
                       port=int(env["LIVEPUSH_PORT"]), name="nohup livepush demo")
    demo.wait_healthy(START_TIMEOUT)
    demo.signal(signal.SIGHUP, group=True)
    demo.wait_healthy(5.0)  # a round trip through the process, which a handled signal would stop
    assert demo.running and "stopping" not in demo.stderr(), demo.output()
    assert demo.stop(STOP_TIMEOUT) == 0, demo.output()


def test_a_first_demo_says_it_creates_its_postgres_before_the_wait_and_a_second_does_not(
    start_demo: StartDemo
) -> None:
    """A first start creates the embedded Postgres (initdb: seconds on a busy machine) before the
    URL comes: it says so as it begins, where the terminal stayed silent. A start that finds
    the database made says nothing of it."""
    demo = start_demo()
    demo.wait_healthy(START_TIMEOUT)
    first = demo.stderr()
    assert "creating the embedded Postgres" in first, demo.output()
    assert first.index("creating the embedded Postgres") < first.index("livepush serving"), demo.output()
    assert demo.stop(STOP_TIMEOUT) == 0, demo.output()

    again = start_demo()
    again.wait_healthy(START_TIMEOUT)
    assert again.stop(STOP_TIMEOUT) == 0, again.output()
    assert "creating the embedded Postgres" not in again.stderr(), again.output()


def test_a_demo_in_a_folder_too_deep_for_a_socket_path_in_it_still_starts(start_demo: StartDemo, folder: Path) -> None:
    """A Unix socket's path holds at most 107 bytes: in a project folder deeper than about 80
    characters, Postgres' socket cannot be in .livepush/pg/, and the demo still starts, serves
    and stops (exit 0) with its Postgres."""
    deep = folder / ("a-project-folder-deep-enough-" * 3)
    deep.mkdir()
    assert len(str(deep / ".livepush" / "pg" / ".s.PGSQL.5432")) > 107
    demo = start_demo(deep)
    demo.wait_healthy(START_TIMEOUT)
    assert demo.stop(STOP_TIMEOUT) == 0, demo.output()
    assert postmaster(deep) is None


@pytest.mark.parametrize("name", ["My Projects/live push ø", "clients,2024", "50%4150"],
                         ids=["spaces", "comma", "percent"])
def test_a_demo_in_a_folder_whose_path_has_spaces_or_punctuation_starts_its_postgres(
    start_demo: StartDemo, folder: Path, name: str
) -> None:
    """A project in "My Projects/" is common: the demo still starts, serves and stops (exit 0)
    with its Postgres, instead of pgserver's error reports and a hint to delete the folder, which
    would not help. Alike for a comma (Postgres reads a list of socket folders) and a percent sign
    (the URL of the socket decodes it)."""
    project = folder / name
    project.mkdir(parents=True)
    demo = start_demo(project)
    demo.wait_healthy(START_TIMEOUT)
    assert demo.stop(STOP_TIMEOUT) == 0, demo.output()
    assert postmaster(project) is None


@pytest.mark.parametrize("shared", [
    "group-writable",
    pytest.param("another-users", marks=pytest.mark.skipif(os.geteuid() != 0, reason="only root can give a folder away")),
])
def test_a_demo_in_a_folder_another_user_could_replace_starts_without_a_runtime_folder_warning(
    start_demo: StartDemo, folder: Path, shared: str
) -> None:
    """A project in a folder its group may write (a shared one), or one of another user's, as
    `sudo bin/demo` in a user's checkout or root in a container on a mounted checkout: the demo
    starts and stops with its Postgres and says nothing of its runtime folder, where platformdirs
    took none below such a folder and warned, with a line of its own source, on every start."""
    project = folder / "project"
    project.mkdir()
    if shared == "group-writable":
        project.chmod(0o775)
    else:
        os.chown(project, pwd.getpwnam("nobody").pw_uid, -1)
    demo = start_demo(project)
    demo.wait_healthy(START_TIMEOUT)
    assert demo.stop(STOP_TIMEOUT) == 0, demo.output()
    assert postmaster(project) is None
    assert "XDG_RUNTIME_DIR" not in demo.stderr() and "Warning" not in demo.stderr(), demo.output()


@pytest.mark.parametrize("configured", [False, True], ids=["embedded-postgres", "own-database-no-secret"])
def test_a_demo_that_cannot_write_its_data_folder_says_so_and_what_to_do_instead_of_a_traceback(
    procs: Processes, livepush_env: Callable[..., dict[str, str]], folder: Path, pg_url: str, configured: bool
) -> None:
    """Run from a folder where it cannot make `.livepush/` (here a file of that name is in the way;
    a folder the user may not write or a read-only mount fail alike), the demo, which would keep
    its Postgres or its generated secret there, exits 2 with one line naming the folder and what to
    do, instead of a traceback."""
    (folder / ".livepush").write_text("")
    env = livepush_env(database_url=pg_url if configured else None)
    del env["LIVEPUSH_SECRET"]
    demo = procs.start([sys.executable, "-m", "livepush", "demo"], env=env, cwd=folder, name="livepush demo")
    assert demo.wait(START_TIMEOUT) == 2, demo.output()
    err = demo.stderr()
    assert "Traceback" not in err, err
    assert str(folder / ".livepush") in err and "LIVEPUSH_DATABASE_URL" in err, err


@pytest.mark.skipif(os.geteuid() != 0, reason="only root can give the demo's folder to another user")
def test_a_demo_whose_data_folder_another_user_made_leaves_it_alone_and_says_whose_it_is(
    procs: Processes, livepush_env: Callable[..., dict[str, str]], folder: Path
) -> None:
    """A `.livepush/` that a demo run as another user made (the user's own, then `sudo bin/demo`;
    or the reverse) is left as it is: root's demo would hand that user's Postgres data to its own
    system user, and the user's demo cannot use root's. The demo exits 2 with one line naming
    the folder, its owner and what to do, instead of advice to remove or copy what cannot be."""
    data = folder / ".livepush"
    (data / "pg").mkdir(parents=True)
    (data / "pg" / "PG_VERSION").write_text("16\n")
    nobody = pwd.getpwnam("nobody")
    for path in (data, data / "pg", data / "pg" / "PG_VERSION"):
        os.chown(path, nobody.pw_uid, nobody.pw_gid)
    env = livepush_env()
    demo = procs.start([sys.executable, "-m", "livepush", "demo"], env=env, cwd=folder, name="livepush demo")
    assert demo.wait(START_TIMEOUT) == 2, demo.output()
    err = demo.stderr().strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert str(data) in err and "nobody's" in err and "run the demo as nobody" in err and "rm -rf" in err, err
    assert [p.stat().st_uid for p in (data, data / "pg")] == [nobody.pw_uid] * 2
    assert postmaster(folder) is None


def test_a_start_pressed_while_the_demos_database_is_down_is_answered_503_saying_so(
    start_demo: StartDemo, folder: Path
) -> None:
    """With its Postgres gone (killed here) after a first import, Start import still gets an answer the page shows: a
    503 that names the database, given before the server drops the request as unanswered (the
    page would then say the demo itself is not running)."""
    demo = start_demo()
    demo.wait_healthy(START_TIMEOUT)
    origin = f"http://127.0.0.1:{demo.port}"
    request = urllib.request.Request(f"{origin}/demo/start?n=3", method="POST",
                                     headers={"Origin": origin, "Sec-Fetch-Site": "same-origin"})
    with urllib.request.urlopen(request, timeout=30) as started:  # the demo's connections are open now
        assert started.status == 200
    server = postmaster(folder)
    assert server is not None
    backends = server.children()
    server.kill()
    wait_for(lambda: not any(map(running, [server, *backends])), 10, message="the killed Postgres to end")

    with pytest.raises(urllib.error.HTTPError) as answer:
        urllib.request.urlopen(request, timeout=30)
    assert answer.value.code == 503
    assert "database" in answer.value.read().decode()


def test_a_demo_that_finds_only_database_url_says_it_uses_that_database_not_an_embedded_one(
    procs: Processes, livepush_env: Callable[..., dict[str, str]], folder: Path, pg_url: str
) -> None:
    """DATABASE_URL is often exported for another application. Without LIVEPUSH_DATABASE_URL the
    demo uses it, as every livepush command does, adding livepush's tables there: it says so,
    naming the variable and how to run on its embedded Postgres instead, before it migrates."""
    env = livepush_env(fanout="postgres", extra={"DATABASE_URL": pg_url})
    demo = procs.start([sys.executable, "-m", "livepush", "demo"], env=env, cwd=folder,
                       port=int(env["LIVEPUSH_PORT"]), name="livepush demo")
    demo.wait_healthy(START_TIMEOUT)
    assert demo.stop(STOP_TIMEOUT) == 0, demo.output()
    assert postmaster(folder) is None, "the demo started an embedded Postgres beside DATABASE_URL's"
    said = [line for line in demo.stderr().splitlines() if "DATABASE_URL" in line]
    assert said and "WARNING" in said[0] and "unset DATABASE_URL" in said[0], demo.output()


def test_a_demo_whose_database_url_names_another_kind_of_database_runs_on_its_embedded_postgres(
    procs: Processes, livepush_env: Callable[..., dict[str, str]], folder: Path
) -> None:
    """A DATABASE_URL exported for another application on SQLite or MySQL names no database the
    demo could use: the demo runs on its embedded Postgres, saying that it ignores that variable,
    instead of refusing to start with advice to turn it into a Postgres URL."""
    env = livepush_env(extra={"DATABASE_URL": "sqlite:///db.sqlite3"})
    demo = procs.start([sys.executable, "-m", "livepush", "demo"], env=env, cwd=folder,
                       port=int(env["LIVEPUSH_PORT"]), name="livepush demo")
    demo.wait_healthy(START_TIMEOUT)
    assert postmaster(folder) is not None, demo.output()
    assert demo.stop(STOP_TIMEOUT) == 0, demo.output()
    said = [line for line in demo.stderr().splitlines() if "DATABASE_URL" in line]
    assert len(said) == 1 and "WARNING" in said[0] and "ignores DATABASE_URL" in said[0], demo.output()


def test_a_demo_on_its_embedded_postgres_keeps_the_redis_fan_out_the_user_chose(
    procs: Processes, livepush_env: Callable[..., dict[str, str]], folder: Path, redis_url: str
) -> None:
    """LIVEPUSH_FANOUT=redis with LIVEPUSH_REDIS_URL and no database URL, as a user sets them to
    try the demo on Redis: the demo runs on its embedded Postgres with the Redis fan-out, instead
    of putting the Postgres one in its place with nothing but its start line to say so."""
    env = livepush_env(redis_url=redis_url, fanout="redis")
    demo = procs.start([sys.executable, "-m", "livepush", "demo"], env=env, cwd=folder,
                       port=int(env["LIVEPUSH_PORT"]), name="livepush demo")
    demo.wait_healthy(START_TIMEOUT)
    assert "(fan-out: redis)" in demo.stderr(), demo.output()
    assert demo.stop(STOP_TIMEOUT) == 0, demo.output()
