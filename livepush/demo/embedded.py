"""An embedded PostgreSQL for the demo when no database URL is configured (pgserver)."""

from __future__ import annotations

import os
from pathlib import Path

from ..errors import ConfigError, DependencyError


def start(folder: Path) -> tuple[str, object]:
    """Start (or reattach to) a PostgreSQL whose data lives in `folder`; return (url, handle).

    The data stays inside the project's folder on purpose: run as root, pgserver opens the
    rights of every parent folder of its data directory to its own system user.
    """
    # platformdirs (imported by pgserver) warns on stderr when this is unset (as under root)
    # or not private.
    if "XDG_RUNTIME_DIR" not in os.environ:
        run_dir = folder / "run"
        run_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        run_dir.chmod(0o700)
        os.environ["XDG_RUNTIME_DIR"] = str(run_dir)
    try:
        import pgserver
    except ImportError:
        raise ConfigError(
            "no LIVEPUSH_DATABASE_URL is set and the embedded Postgres is not installed: "
            "run bin/demo (it installs it) or `pip install 'livepush[demo]'`, or set LIVEPUSH_DATABASE_URL"
        ) from None
    folder.mkdir(parents=True, exist_ok=True)
    try:
        server = pgserver.get_server(folder / "pg", cleanup_mode="stop")
    except Exception as exc:  # pgserver raises plain exceptions for a failed start
        raise DependencyError(f"the embedded Postgres in {folder / 'pg'} did not start ({exc}): delete that folder and retry") from exc
    return server.get_uri(), server
