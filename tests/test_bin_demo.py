"""`bin/demo`, the README's first command, in a copy of the project: it makes or mends `.venv`,
installs livepush into it and starts the demo. These tests install livepush's dependencies with
pip, as a user's first run does, so they take a minute. `bin/setup` (which `bin/test` runs) makes
the same `.venv`, and mends a copied one as bin/demo does.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.support.procs import Processes
from tests.support.waiting import wait_for

ROOT = Path(__file__).resolve().parents[1]
# pip installs every dependency into a new venv (from its cache when it can); past this it hangs.
INSTALL_TIMEOUT = 240.0

pytestmark = pytest.mark.slow


def project_copy(folder: Path) -> Path:
    """What bin/demo and bin/setup need of the project, copied to `folder`."""
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, folder / name)
    shutil.copytree(ROOT / "sql", folder / "sql")
    shutil.copytree(ROOT / "livepush", folder / "livepush", symlinks=True,
                    ignore=shutil.ignore_patterns("__pycache__"))
    (folder / "bin").mkdir()
    for name in ("demo", "setup"):
        shutil.copy2(ROOT / "bin" / name, folder / "bin" / name)
    shutil.copytree(ROOT / "bin" / "lib", folder / "bin" / "lib")  # the Python it picks, a copied .venv
    return folder


def installed(project: Path) -> Path:
    """`project` with a .venv that bin/demo takes as it is: its python is this interpreter, and
    its stamp is current, so nothing is installed."""
    (project / ".venv" / "bin").mkdir(parents=True)
    python = project / ".venv" / "bin" / "python"
    python.write_text(f'#!/bin/sh\nexec {shlex.quote(sys.executable)} "$@"\n')
    python.chmod(0o755)
    (project / ".venv" / ".livepush-demo-stamp").write_text(
        hashlib.sha256((project / "pyproject.toml").read_bytes()).hexdigest() + "\n")
    return project


def test_bin_demo_mends_a_venv_left_without_pip_and_runs_the_demo(
    tmp_path: Path, procs: Processes, livepush_env: Callable[..., dict[str, str]], pg_url: str
) -> None:
    """On Debian, `python3 -m venv` without the python3-venv package fails after making
    .venv/bin/python but no pip (as does a venv creation cut short). Run again once that is
    fixed, bin/demo gives the venv its pip, installs livepush and serves the demo (exit 0 on
    SIGTERM), instead of failing with "No module named pip" on every run."""
    project = project_copy(tmp_path)
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(project / ".venv")], check=True, timeout=60)

    env = livepush_env(database_url=pg_url)
    demo = procs.start([str(project / "bin" / "demo")], env=env, cwd=project, port=int(env["LIVEPUSH_PORT"]),
                       name="bin/demo")
    demo.wait_healthy(INSTALL_TIMEOUT)
    assert demo.stop(15) == 0, demo.output()


def test_bin_demo_on_a_machine_whose_python3_is_too_old_runs_the_demo_on_a_newer_python_beside_it(
    tmp_path: Path, procs: Processes, livepush_env: Callable[..., dict[str, str]], pg_url: str
) -> None:
    """Ubuntu 22.04's python3 is 3.10, with a Python 3.11 installed beside it as python3.11.
    bin/demo makes .venv with the newer one, making again a .venv that an earlier run made with
    the older python3, and serves the demo (exit 0 on SIGTERM), instead of failing on every run
    in pip with "No matching distribution found" for a dependency."""
    (tmp_path / "project").mkdir()
    project = project_copy(tmp_path / "project")
    shims = tmp_path / "shims"
    shims.mkdir()
    # It stands in for a Python older than 3.11: whatever it is asked to run fails, as livepush
    # would on one.
    old = shims / "python3"
    old.write_text("#!/bin/sh\necho 'Python 3.10.12: livepush needs 3.11 or newer' >&2\nexit 1\n")
    old.chmod(0o755)
    newer = f"python3.{sys.version_info.minor}"
    (shims / newer).symlink_to(getattr(sys, "_base_executable", sys.executable))
    (project / ".venv" / "bin").mkdir(parents=True)
    (project / ".venv" / "bin" / "python").symlink_to(old)

    env = livepush_env(database_url=pg_url)
    env["PATH"] = f"{shims}:{env['PATH']}"
    demo = procs.start([str(project / "bin" / "demo")], env=env, cwd=project, port=int(env["LIVEPUSH_PORT"]),
                       name="bin/demo")
    demo.wait_healthy(INSTALL_TIMEOUT)
    assert demo.stop(15) == 0, demo.output()
    assert (project / ".venv" / "bin" / "python").resolve() != old, "bin/demo kept the older python's .venv"


def test_bin_demo_reached_through_a_symlink_runs_in_its_checkout(
    tmp_path: Path, procs: Processes, livepush_env: Callable[..., dict[str, str]], pg_url: str
) -> None:
    """bin/demo linked into a folder on the PATH (`ln -s .../bin/demo ~/bin/livepush-demo`) and run
    from elsewhere makes its .venv in the checkout and serves the demo (exit 0 on SIGTERM), instead
    of making a .venv beside the link and failing on a pyproject.toml it looks for there."""
    (tmp_path / "project").mkdir()
    project = project_copy(tmp_path / "project")
    links = tmp_path / "links"
    links.mkdir()
    (links / "livepush-demo").symlink_to(project / "bin" / "demo")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()

    env = livepush_env(database_url=pg_url)
    demo = procs.start([str(links / "livepush-demo")], env=env, cwd=elsewhere, port=int(env["LIVEPUSH_PORT"]),
                       name="bin/demo")
    demo.wait_healthy(INSTALL_TIMEOUT)
    assert demo.stop(15) == 0, demo.output()
    assert (project / ".venv" / "bin" / "python").exists(), "bin/demo made no .venv in its checkout"
    assert not (tmp_path / ".venv").exists(), "bin/demo made a .venv beside its link"


def copied_checkout(tmp_path: Path) -> tuple[Path, Path]:
    """(original, copy): a project whose .venv is made and current for bin/demo and bin/setup
    alike, and a copy of it made with that .venv, as `cp -r` makes one."""
    (tmp_path / "original").mkdir()
    original = installed(project_copy(tmp_path / "original"))
    shutil.rmtree(original / ".venv")
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(original / ".venv")], check=True, timeout=60)
    stamp = hashlib.sha256((original / "pyproject.toml").read_bytes()).hexdigest() + "\n"
    for name in (".livepush-demo-stamp", ".livepush-test-stamp"):
        (original / ".venv" / name).write_text(stamp)
    copy = tmp_path / "copy"
    shutil.copytree(original, copy, symlinks=True)
    return original, copy


def test_bin_demo_in_a_copied_checkout_makes_its_venv_again_for_the_copy(
    tmp_path: Path, procs: Processes, livepush_env: Callable[..., dict[str, str]], pg_url: str
) -> None:
    """A checkout copied with its .venv (`cp -r`, as bin/demo advises for a checkout of someone
    else's) has a venv that names the folder it was made in: its activate script and commands,
    and its editable install, would run the other checkout. bin/demo says so, makes .venv again
    in the copy and serves the demo (exit 0 on SIGTERM)."""
    original, copy = copied_checkout(tmp_path)

    env = livepush_env(database_url=pg_url)
    demo = procs.start([str(copy / "bin" / "demo")], env=env, cwd=copy, port=int(env["LIVEPUSH_PORT"]), name="bin/demo")
    wait_for(lambda: "making it again" in demo.stderr() or not demo.running, 30.0,
             message="bin/demo to make the copied .venv again or to end")
    assert f".venv was made for {original}" in demo.stderr(), demo.output()
    demo.wait_healthy(INSTALL_TIMEOUT)
    assert demo.stop(15) == 0, demo.output()
    assert str(original) not in (copy / ".venv" / "bin" / "activate").read_text()
    assert f"{copy}/.venv" in (copy / ".venv" / "pyvenv.cfg").read_text()


def test_bin_setup_in_a_copied_checkout_makes_its_venv_again_for_the_copy(
    tmp_path: Path, procs: Processes, livepush_env: Callable[..., dict[str, str]]
) -> None:
    """bin/setup, which bin/test runs first, takes a .venv copied with its checkout as bin/demo
    does: it says so and makes .venv again in the copy before installing into it, rather than keep
    a venv whose commands (the `livepush` the tests run) start the other checkout's Python. What it
    installs then is what it installs into any new .venv: the test stops it there."""
    original, copy = copied_checkout(tmp_path)

    setup = procs.start([str(copy / "bin" / "setup")], env=livepush_env(), cwd=copy, name="bin/setup")
    wait_for(lambda: "installing the project" in setup.stderr() or not setup.running, 60.0,
             message="bin/setup to make the copied .venv again and start installing, or to end")
    setup.kill()
    assert f"bin/setup: .venv was made for {original}" in setup.stderr(), setup.output()
    assert "installing the project" in setup.stderr(), setup.output()
    assert str(original) not in (copy / ".venv" / "bin" / "activate").read_text()
    assert f"{copy}/.venv" in (copy / ".venv" / "pyvenv.cfg").read_text()


def test_bin_setup_leaves_a_venv_linked_from_elsewhere_as_it_is(
    tmp_path: Path, procs: Processes, livepush_env: Callable[..., dict[str, str]]
) -> None:
    """A checkout whose .venv is a link to a venv made elsewhere (one venv for several checkouts)
    runs that venv: bin/setup, as bin/demo, does not take it for a copied one to make again, which
    through the link would empty the venv every other checkout runs."""
    shared = tmp_path / "shared" / ".venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(shared)], check=True, timeout=60)
    (tmp_path / "project").mkdir()
    project = project_copy(tmp_path / "project")
    (shared / ".livepush-test-stamp").write_text(
        hashlib.sha256((project / "pyproject.toml").read_bytes()).hexdigest() + "\n")
    (project / ".venv").symlink_to(shared)

    # Were it to install, pip finds no index and fails at once.
    setup = procs.start([str(project / "bin" / "setup")], env={**livepush_env(), "PIP_NO_INDEX": "1"}, cwd=project,
                        name="bin/setup")
    assert setup.wait(60) == 0, setup.output()
    assert "made for" not in setup.stderr(), setup.output()
    assert (shared / ".livepush-test-stamp").exists(), "bin/setup emptied the linked venv"


def test_bin_demo_keeps_the_venv_made_in_its_checkout_whatever_the_checkout_path_holds(
    tmp_path: Path, procs: Processes, livepush_env: Callable[..., dict[str, str]], pg_url: str
) -> None:
    """pyvenv.cfg names the folder a .venv was made in as it is, spaces and all, at the end of its
    `command` line: a checkout below a folder whose name ends in a space (`/srv/a /livepush`) has
    its own .venv taken as its own, not made again on every run as if copied from elsewhere."""
    (tmp_path / "a " / "livepush").mkdir(parents=True)
    project = installed(project_copy(tmp_path / "a " / "livepush"))
    (project / ".venv" / "pyvenv.cfg").write_text(
        f"home = {Path(sys.executable).parent}\ncommand = {sys.executable} -m venv {project}/.venv\n")

    env = livepush_env(database_url=pg_url)
    demo = procs.start([str(project / "bin" / "demo")], env=env, cwd=project, port=int(env["LIVEPUSH_PORT"]),
                       name="bin/demo")
    demo.wait_healthy(INSTALL_TIMEOUT)
    assert demo.stop(15) == 0, demo.output()
    assert "making it again" not in demo.stderr(), demo.output()
    assert (project / ".venv" / "bin" / "python").read_text().startswith("#!/bin/sh\n"), "bin/demo made .venv again"


def test_bin_demo_waits_while_bin_setup_installs_into_the_same_venv(
    tmp_path: Path, procs: Processes, livepush_env: Callable[..., dict[str, str]], pg_url: str
) -> None:
    """bin/demo and bin/test (through bin/setup) both install into .venv, and the quick start gives
    them together: run at once in two terminals, two pips wrote the same venv at the same time.
    While bin/setup holds the venv's lock, bin/demo says it waits and leaves .venv alone; then it
    installs and serves the demo (exit 0 on SIGTERM)."""
    project = project_copy(tmp_path)
    with open(project / ".venv.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # as bin/setup's `flock` takes it while pip installs
        env = livepush_env(database_url=pg_url)
        demo = procs.start([str(project / "bin" / "demo")], env=env, cwd=project, port=int(env["LIVEPUSH_PORT"]),
                           name="bin/demo")
        wait_for(lambda: "waiting for another install" in demo.stderr() or not demo.running, 30.0,
                 message="bin/demo to say that it waits")
        assert demo.running and not (project / ".venv" / "bin" / "python").exists(), demo.output()
    demo.wait_healthy(INSTALL_TIMEOUT)
    assert demo.stop(15) == 0, demo.output()


def test_ctrl_c_while_bin_demo_still_imports_livepush_stops_it_with_exit_0_and_no_traceback(
    tmp_path: Path, procs: Processes, livepush_env: Callable[..., dict[str, str]], pg_url: str
) -> None:
    """A newcomer who presses Ctrl-C right after typing bin/demo (a wrong port, a second
    thought) stops it while Python is still importing livepush, which takes half a second or
    more on a slow machine. The demo stops as it does at any later point of its start: exit 0,
    without a KeyboardInterrupt traceback."""
    project = installed(project_copy(tmp_path))
    env = livepush_env(database_url=pg_url)
    env["PYTHONPROFILEIMPORTTIME"] = "1"  # a line on stderr as each module is imported: the moment to press Ctrl-C
    demo = procs.start([str(project / "bin" / "demo")], env=env, cwd=project, name="bin/demo")
    wait_for(lambda: "livepush.errors" in demo.stderr() or not demo.running, 30.0, 0.002,
             message="bin/demo to start importing livepush")
    demo.signal(signal.SIGINT, group=True)  # Ctrl-C: the terminal's whole process group
    assert demo.wait(30) == 0, demo.output()
    assert "Traceback" not in demo.stderr(), demo.output()


def test_bin_demo_in_a_checkout_this_user_cannot_write_says_what_to_do_in_one_line(
    procs: Processes, livepush_env: Callable[..., dict[str, str]], pg_url: str
) -> None:
    """A checkout of someone else's, or on a read-only mount, cannot hold the .venv that bin/demo
    makes: it says so in one line naming the checkout and what to do (copy it to a folder of
    one's own), instead of venv's bare "Error: [Errno 13] Permission denied" or "[Errno 30]
    Read-only file system". The `cp -r` it gives copies `.livepush/` too, another user's demo
    data that cp cannot read: the line says that cp's "Permission denied" for it is harmless."""
    folder = Path(tempfile.mkdtemp(prefix="livepush-not-writable-"))
    try:
        folder.chmod(0o755)
        project = project_copy(folder)
        if os.geteuid() == 0:
            # root writes anywhere: the checkout is left root's, and bin/demo runs as another user.
            args = ["runuser", "-u", "nobody", "--", str(project / "bin" / "demo")]
        else:
            subprocess.run(["chmod", "-R", "a-w", str(project)], check=True, timeout=30)
            args = [str(project / "bin" / "demo")]
        env = livepush_env(database_url=pg_url)
        demo = procs.start(args, env=env, cwd=folder, name="bin/demo")
        assert demo.wait(60) == 1, demo.output()
        err = demo.stderr().strip()
        assert len(err.splitlines()) == 1 and "Errno" not in err, err
        assert f"cannot make .venv in {project}" in err and "copy the checkout" in err, err
        assert f"cp -r {project} " in err and '"Permission denied" for .livepush/' in err and "harmless" in err, err
        assert not (project / ".venv").exists()
    finally:
        subprocess.run(["chmod", "-R", "u+w", str(folder)], check=False, timeout=30)
        shutil.rmtree(folder, ignore_errors=True)


def test_bin_demo_that_cannot_keep_its_data_in_its_checkout_says_to_copy_the_checkout(
    tmp_path: Path, procs: Processes, livepush_env: Callable[..., dict[str, str]]
) -> None:
    """bin/demo keeps the embedded Postgres and its secret in `.livepush/` of its checkout, from
    whatever folder it is run. Where it cannot write that (here a file of that name is in the
    way; a checkout of someone else's or a read-only mount fail alike), its one line says what
    works for bin/demo, copying the checkout, not only to run it from a folder one can write to,
    which the user run from already."""
    (tmp_path / "project").mkdir()
    project = installed(project_copy(tmp_path / "project"))
    (project / ".livepush").write_text("")
    env = livepush_env()
    del env["LIVEPUSH_SECRET"]
    demo = procs.start([str(project / "bin" / "demo")], env=env, cwd=tmp_path, name="bin/demo")
    assert demo.wait(60) == 2, demo.output()
    err = demo.stderr().strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert str(project / ".livepush") in err and "copy the checkout" in err, err
