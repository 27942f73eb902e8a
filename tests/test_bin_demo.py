"""`bin/demo`, the README's first command, in a copy of the project: it makes or mends `.venv`,
installs livepush into it and starts the demo. These tests install livepush's dependencies with
pip, as a user's first run does, so they take a minute.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.support.procs import Processes

ROOT = Path(__file__).resolve().parents[1]
# pip installs every dependency into a new venv (from its cache when it can); past this it hangs.
INSTALL_TIMEOUT = 240.0

pytestmark = pytest.mark.slow


def project_copy(folder: Path) -> Path:
    """What bin/demo needs of the project, copied to `folder`."""
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, folder / name)
    shutil.copytree(ROOT / "sql", folder / "sql")
    shutil.copytree(ROOT / "livepush", folder / "livepush", symlinks=True,
                    ignore=shutil.ignore_patterns("__pycache__"))
    (folder / "bin").mkdir()
    shutil.copy2(ROOT / "bin" / "demo", folder / "bin" / "demo")
    return folder


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
