"""A small WebSocket test client that speaks livepush frames, with bounded waits."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed
from websockets.frames import Close

RECV_TIMEOUT = 5.0


class WSClient:
    def __init__(self, ws: ClientConnection) -> None:
        self.ws = ws
        self._ref = 0

    @classmethod
    async def open(cls, url: str, *, hello: bool = True, **kwargs: Any) -> WSClient:
        ws = await asyncio.wait_for(connect(url, open_timeout=5, max_size=None, **kwargs), timeout=10)
        client = cls(ws)
        if hello:
            frame = await client.recv()
            assert frame["op"] == "hello", frame
            client.hello = frame
        return client

    async def send(self, frame: Any) -> None:
        await self.ws.send(frame if isinstance(frame, (str, bytes)) else json.dumps(frame))

    async def recv(self, timeout: float = RECV_TIMEOUT) -> dict[str, Any]:
        raw = await asyncio.wait_for(self.ws.recv(), timeout=timeout)
        return json.loads(raw)

    async def subscribe(self, topic: str, since: str | None = None) -> dict[str, Any]:
        """Subscribe and return the `subscribed` or `refused` answer."""
        self._ref += 1
        await self.send({"op": "subscribe", "topic": topic, "since": since, "ref": self._ref})
        answer = await self.recv()
        assert answer.get("ref") == self._ref and answer["op"] in ("subscribed", "refused"), answer
        return answer

    async def messages(self, count: int, timeout: float = RECV_TIMEOUT) -> list[dict[str, Any]]:
        out = []
        while len(out) < count:
            frame = await self.recv(timeout)
            assert frame["op"] in ("message", "reset"), frame
            out.append(frame)
        return out

    async def closed_with(self, timeout: float = RECV_TIMEOUT) -> int | None:
        """Read until the server closes; return the close code."""
        frame = await self.close_frame(timeout)
        return frame.code if frame else None

    async def close_frame(self, timeout: float = RECV_TIMEOUT) -> Close | None:
        """Read until the server closes; return its close frame (code and reason), if it sent one."""
        try:
            async with asyncio.timeout(timeout):
                while True:
                    await self.ws.recv()
        except ConnectionClosed as exc:
            return exc.rcvd
        raise AssertionError("unreachable")

    async def close(self) -> None:
        await self.ws.close()
