"""livepush as a type-checked user meets it: `mypy --strict` on an application written the way the
docs show the Python API (tests/typing_sample.py) finds the types the docs promise, and catches
what a user gets wrong (a job enqueued with arguments its function does not take, a misspelt name).
And livepush's own code passes `mypy --strict` as it stands."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SAMPLE = ROOT / "tests" / "typing_sample.py"

# livepush's own modules are checked as an installed package's are: what they say about their own
# code is not the user's to see, only the types they give the user's.
CONFIG = """\
[mypy]
strict = True
[mypy-livepush.*]
follow_imports = silent
"""


def expected_errors() -> set[tuple[int, str]]:
    """The sample's lines marked `# error: [code]`, each with its code."""
    marked = set()
    for number, line in enumerate(SAMPLE.read_text().splitlines(), 1):
        found = re.search(r"# error: \[([a-z-]+)\]\s*$", line)
        if found:
            marked.add((number, found.group(1)))
    return marked


def test_a_user_app_written_from_the_docs_type_checks_strictly_and_its_mistakes_do_not(tmp_path: Path) -> None:
    """Every unmarked line of the sample passes `mypy --strict` (its assert_type()s: the handles,
    get_job()'s JobInfo, a workflow's start(), a job function's own signature), and every marked
    one fails with its code: a job's enqueue() and request() are checked against its function."""
    config = tmp_path / "mypy.ini"
    config.write_text(CONFIG)
    # From the checkout: livepush is found there, whatever an editable install hides from mypy.
    done = subprocess.run([sys.executable, "-m", "mypy", "--config-file", str(config), "--cache-dir",
                           str(tmp_path / "cache"), "--no-error-summary", str(SAMPLE.relative_to(ROOT))],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.stderr == "", done.stderr
    errors = re.findall(r"^tests/typing_sample\.py:(\d+): error: .*\[([a-z-]+)\]$", done.stdout, re.M)
    got = {(int(line), code) for line, code in errors}
    want = expected_errors()
    assert len(want) >= 10, "the sample lost its marked lines"
    assert got == want, (f"passed but marked to fail: {sorted(want - got)}; failed unmarked: {sorted(got - want)}\n"
                         f"{done.stdout}")
    # Nothing else: an error elsewhere (an import mypy could not follow) would say so here.
    assert all(line.startswith("tests/typing_sample.py:") for line in done.stdout.splitlines()), done.stdout


def test_livepush_itself_type_checks_strictly(tmp_path: Path) -> None:
    """`mypy --strict livepush` finds nothing, with pyproject.toml's [tool.mypy]: the libraries
    without types, and the few calls into untyped functions, are named there, not ignored here."""
    done = subprocess.run([sys.executable, "-m", "mypy", "--strict", "--cache-dir", str(tmp_path / "cache"),
                           "--no-error-summary", "livepush"],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.stderr == "", done.stderr
    assert (done.returncode, done.stdout) == (0, ""), done.stdout
