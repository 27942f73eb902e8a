"""Server-to-client WebSocket frames as bytes (RFC 6455 §5.2), for the connection core.

A server frame is never masked and livepush negotiates no extension, so a text frame is a
header and the payload as it is: built once per message, the same bytes go to every
subscriber's transport. Control frames the sweep sends (keepalive pings) are constants.
"""

from __future__ import annotations

import struct

_TEXT = 0x81  # FIN, opcode 1
PING = b"\x89\x00"  # FIN, opcode 9, no payload: the peer's pong (or any data) proves it alive


def text(payload: bytes) -> bytes:
    """One complete, unmasked text frame carrying `payload` (UTF-8 already)."""
    n = len(payload)
    if n < 126:
        return bytes((_TEXT, n)) + payload
    if n < 65536:
        return struct.pack("!BBH", _TEXT, 126, n) + payload
    return struct.pack("!BBQ", _TEXT, 127, n) + payload
