"""The `livepush` command: parsing and exit statuses (`main`), and the wiring of parts."""

from .main import main

__all__ = ["main"]
