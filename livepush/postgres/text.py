"""What Postgres values cannot hold: in text and jsonb, NUL and lone surrogates (not valid
Unicode, so not encodable as UTF-8; Python makes them from undecodable bytes, e.g. file names);
in a bigint (every livepush id), anything above BIGINT_MAX."""

from __future__ import annotations

import re

BIGINT_MAX = 2**63 - 1

_UNSTORABLE = re.compile("[\x00\ud800-\udfff]")


def unstorable(text: str) -> str | None:
    """What in `text` Postgres cannot store (NUL, a lone surrogate), described; else None."""
    if text.isascii():
        return "a NUL character (\\x00)" if "\x00" in text else None
    found = _UNSTORABLE.search(text)
    if found is None:
        return None
    char = found.group()
    return "a NUL character (\\x00)" if char == "\x00" else f"a lone surrogate ({char!r}: not valid Unicode text)"


def storable_text(text: str) -> str:
    """`text` with every character Postgres cannot store replaced by U+FFFD."""
    return _UNSTORABLE.sub("\ufffd", text)
