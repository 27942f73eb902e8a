"""python-socketio for the push suite, run under the bench-only virtualenv's python.

Two modes, each its own process:
- `serve PORT REDIS_URL CHANNEL`: an `AsyncServer` with an `AsyncRedisManager` on CHANNEL, as
  an ASGI app under uvicorn (its defaults: uvloop, permessage-deflate accepted when offered).
  A client joins one room, its topic, with the event `join` (acknowledged). Prints `READY PORT`.
- `publish REDIS_URL CHANNEL`: reads `TOPIC<TAB>DATA JSON` lines on stdin and emits each as the
  event `msg` to the room TOPIC through an `AsyncRedisManager(write_only=True)`, the way an
  application publishes from another process. Prints `READY` once connected.
"""

from __future__ import annotations

import asyncio
import json
import resource
import sys


async def serve(port: int, redis_url: str, channel: str) -> None:
    import socketio
    import uvicorn

    sio = socketio.AsyncServer(async_mode="asgi", client_manager=socketio.AsyncRedisManager(redis_url, channel=channel))

    @sio.on("join")
    async def join(sid: str, topic: str) -> bool:
        await sio.enter_room(sid, topic)
        return True

    config = uvicorn.Config(socketio.ASGIApp(sio), host="127.0.0.1", port=port, log_level="warning", lifespan="off",
                            timeout_graceful_shutdown=1)
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve())
    while not server.started:
        if task.done():
            task.result()
            return
        await asyncio.sleep(0.05)
    print(f"READY {port}", flush=True)
    await task


async def publish(redis_url: str, channel: str) -> None:
    import socketio

    manager = socketio.AsyncRedisManager(redis_url, channel=channel, write_only=True)
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(limit=2**24)
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    await manager.emit("msg", {"warm": True}, room="_nobody", namespace="/")  # connects to Redis before READY
    print("READY", flush=True)
    while line := await reader.readline():
        topic, _, data = line.decode().rstrip("\n").partition("\t")
        await manager.emit("msg", json.loads(data), room=topic, namespace="/")


def main() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))  # 10,000 connections and more
    try:
        import uvloop

        run = uvloop.run
    except ImportError:
        run = asyncio.run
    if sys.argv[1] == "serve":
        run(serve(int(sys.argv[2]), sys.argv[3], sys.argv[4]))
    else:
        run(publish(sys.argv[2], sys.argv[3]))


if __name__ == "__main__":
    main()
