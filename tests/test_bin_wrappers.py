"""`bin/websocket_server` and `bin/jobs` are `livepush serve` and `livepush jobs`, run from the
project's folder as the console script is (docs/reference.md#3-commands)."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

from tests.support.procs import Processes
from tests.support.waiting import wait_for

BIN = Path(__file__).resolve().parents[1] / "bin"


def _only_python_3_10(tmp_path: Path, rest: str) -> Path:
    """A folder for the PATH where every name a newer Python goes by is a Python 3.10: `-V` says
    so, and `rest` (shell) answers anything else."""
    old = tmp_path / "old-python"
    old.mkdir()
    for name in ("python3", "python3.11", "python3.12", "python3.13", "python3.14"):
        fake = old / name
        fake.write_text("#!/bin/sh\ncase $1 in -V|--version) echo 'Python 3.10.12'; exit 0;; esac\n" + rest)
        fake.chmod(0o755)
    return old


def _project(folder: Path) -> Path:
    """A project whose own modules share names with libraries livepush imports."""
    for name in ("redis", "websockets"):
        (folder / f"{name}.py").write_text(f"raise ImportError('the project own {name}.py was imported')\n")
    (folder / "project_push.py").write_text("import livepush\napp = livepush.App(rules=[])\n")
    (folder / "project_jobs.py").write_text("from livepush import jobs\n\n@jobs.job()\ndef noop(ctx) -> None:\n"
                                            "    pass\n")
    return folder


def test_websocket_server_from_a_project_loads_its_app_and_not_its_namesakes(procs: Processes, livepush_env,
                                                                           pg_url: str, tmp_path: Path) -> None:
    """bin/websocket_server run in a project holding a redis.py serves, with the project's --app."""
    env = livepush_env(database_url=pg_url)
    child = procs.start([str(BIN / "websocket_server"), "--app", "project_push:app"], env=env,
                        cwd=_project(tmp_path), port=int(env["LIVEPUSH_PORT"]))
    child.wait_healthy()
    assert child.stop(15) == 0, child.output()
    assert "the project own" not in child.stderr(), child.output()


def test_jobs_from_a_project_loads_its_jobs_and_not_its_namesakes(procs: Processes, livepush_env, pg_url: str,
                                                                tmp_path: Path) -> None:
    """bin/jobs run in a project holding a redis.py runs the project's job modules."""
    child = procs.start([str(BIN / "jobs"), "project_jobs"], env=livepush_env(database_url=pg_url),
                        cwd=_project(tmp_path))
    wait_for(lambda: "running: queues" in child.stderr() or not child.running, 30.0,
             message="the runtime's 'running' line")
    assert child.running, child.output()
    assert child.stop(15) == 0, child.output()


def test_the_wrappers_reached_through_a_symlink_run_the_checkouts_livepush(procs: Processes, livepush_env,
                                                                           pg_url: str, tmp_path: Path) -> None:
    """bin/websocket_server and bin/jobs linked into a folder on the PATH (`ln -s`) find the
    checkout they belong to, its .venv and its livepush, as when run by their own path: not
    "No module named livepush" from a Python looking beside the link."""
    links = tmp_path / "links"
    links.mkdir()
    for name in ("websocket_server", "jobs"):
        (links / name).symlink_to(BIN / name)
    project = tmp_path / "project"
    project.mkdir()
    # A user's shell: no venv on the PATH, no checkout on PYTHONPATH (the tests' own env has both).
    env = livepush_env(database_url=pg_url)
    env["PATH"] = os.pathsep.join(p for p in env["PATH"].split(os.pathsep) if p != str(Path(sys.executable).parent))
    env.pop("PYTHONPATH")
    server = procs.start([str(links / "websocket_server"), "--app", "project_push:app"], env=env,
                         cwd=_project(project), port=int(env["LIVEPUSH_PORT"]))
    server.wait_healthy()
    assert server.stop(15) == 0, server.output()

    runtime = procs.start([str(links / "jobs"), "project_jobs"], env=env, cwd=project)
    wait_for(lambda: "running: queues" in runtime.stderr() or not runtime.running, 30.0,
             message="the runtime's 'running' line")
    assert runtime.running, runtime.output()
    assert runtime.stop(15) == 0, runtime.output()


def test_a_python_without_livepushs_dependencies_exits_2_saying_what_to_install(procs, livepush_env,
                                                                                tmp_path: Path) -> None:
    """bin/jobs and bin/websocket_server fall back to python3 in a checkout with no .venv: where
    that Python lacks a dependency of livepush, each says which and how to install it, in one
    line and exit 2, rather than a traceback from inside livepush's imports."""
    missing = tmp_path / "missing" / "prometheus_client"
    missing.mkdir(parents=True)
    # Stands in for a Python where the dependency is not installed, whatever this one has.
    (missing / "__init__.py").write_text(
        "raise ModuleNotFoundError(\"No module named 'prometheus_client'\", name='prometheus_client')\n")
    env = livepush_env()
    env["PYTHONPATH"] = os.pathsep.join([str(missing.parent), env["PYTHONPATH"]])
    for command in ([str(BIN / "jobs"), "project_jobs"], [str(BIN / "websocket_server")],
                    [sys.executable, "-m", "livepush", "--help"]):
        child = procs.start(command, env=env, cwd=tmp_path)
        assert child.wait(30) == 2, child.output()
        err = child.stderr()
        assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
        assert "prometheus_client" in err and "pip install" in err, err


def test_the_wrappers_without_a_venv_and_with_an_old_python3_say_what_to_install(procs, livepush_env,
                                                                                 tmp_path: Path) -> None:
    """In a checkout with no .venv, bin/jobs and bin/websocket_server run python3: one older than
    3.11 (Ubuntu 22.04's) failed with "Unknown option: -P" and Python's usage. Each now exits 2
    with one line saying livepush needs 3.11 and what to install."""
    checkout = tmp_path / "checkout"
    shutil.copytree(BIN, checkout / "bin")
    old = _only_python_3_10(tmp_path, "case $1 in -c) exit 1;; esac\necho 'Unknown option: -P' >&2; exit 2\n")
    env = livepush_env()
    env["PATH"] = os.pathsep.join([str(old), "/usr/bin", "/bin"])
    for name in ("jobs", "websocket_server"):
        child = procs.start([str(checkout / "bin" / name), "project_jobs"], env=env, cwd=tmp_path)
        assert child.wait(30) == 2, child.output()
        err = child.stderr()
        assert "Unknown option" not in err and len(err.strip().splitlines()) == 1, err
        assert f"bin/{name}: livepush needs Python 3.11 or newer, and python3 is Python 3.10.12" in err, err


def test_bin_setup_with_only_an_old_python3_says_what_to_install_and_makes_no_venv(procs, livepush_env,
                                                                                   tmp_path: Path) -> None:
    """bin/test's install made .venv with plain python3: on Ubuntu 22.04 (3.10) pip then failed
    to find a livepush for it, deep in its output. It now picks a Python 3.11 or newer as bin/demo
    does, and with none says in one line what to install."""
    checkout = tmp_path / "checkout"
    shutil.copytree(BIN, checkout / "bin")
    shutil.copy(BIN.parent / "pyproject.toml", checkout)
    # It has venv and ensurepip (no Debian package to install), but is 3.10.
    old = _only_python_3_10(tmp_path, "case $2 in *version_info*) exit 1;; esac\nexit 0\n")
    env = livepush_env()
    env["PATH"] = os.pathsep.join([str(old), "/usr/bin", "/bin", "/usr/sbin", "/sbin"])
    child = procs.start([str(checkout / "bin" / "setup")], env=env, cwd=checkout)
    assert child.wait(60) == 1, child.output()
    err = child.stderr()
    assert "bin/setup: livepush needs Python 3.11 or newer, and python3 is Python 3.10.12" in err, err
    assert "python3.11-venv" in err and "Traceback" not in err, err
    assert not (checkout / ".venv").exists()
