"""An in-process livepush server on each fan-out, for the server and recovery tests; and one on
Postgres beside this process's jobs, for state topics."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass

import psycopg
import pytest

from livepush import api, topics
from livepush.cli.wiring import Parts, server_parts
from livepush.config import Settings, set_settings
from livepush.fanout import FanOut
from livepush.jobs import database
from livepush.server.app import PushServer
from tests.support.job_versions import VERSIONS_TABLE


@dataclass
class Served:
    """A started server, built as `livepush serve` builds it (livepush/cli/wiring.py)."""

    parts: Parts
    settings: Settings

    @property
    def server(self) -> PushServer:
        return self.parts.server

    @property
    def fanout(self) -> FanOut:
        return self.parts.server.fanout

    async def stop(self) -> None:
        await self.parts.server.stop()
        await self.parts.close()

    @property
    def url(self) -> str:
        return f"ws://127.0.0.1:{self.server.port}/"

    def sign(self, topic: str) -> str:
        return topics.sign(topic, self.settings.secrets)

    async def publish(self, topic: str, data: object) -> str:
        return await self.fanout.apublish(topic, data)


async def start_served(settings: Settings, app: object | None = None) -> Served:
    set_settings(settings)
    parts = server_parts(settings, app=app)  # type: ignore[arg-type]
    await parts.server.start()
    return Served(parts, settings)


def make_settings(kind: str, secret: str, pg_url: str | None, redis_url: str | None, **extra: object) -> Settings:
    return Settings(
        fanout=kind,
        database_url=pg_url if kind == "postgres" else None,
        redis_url=redis_url if kind == "redis" else None,
        secret=secret,
        port=0,
        **extra,  # type: ignore[arg-type]
    )


@pytest.fixture(params=["local", "postgres", "redis"])
def fanout_kind(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.fixture
async def served(fanout_kind: str, secret: str, request: pytest.FixtureRequest) -> AsyncIterator[Served]:
    pg = request.getfixturevalue("pg_url") if fanout_kind == "postgres" else None
    rd = request.getfixturevalue("redis_url") if fanout_kind == "redis" else None
    s = await start_served(make_settings(fanout_kind, secret, pg, rd))
    try:
        yield s
    finally:
        await s.stop()
        api.set_default_fanout(None)
        set_settings(None)


@pytest.fixture
async def served_jobs(pg_url: str, secret: str) -> AsyncIterator[Served]:
    """A server on Postgres whose state topics show this process's jobs (every job version recorded)."""
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute(VERSIONS_TABLE)
    served = await start_served(make_settings("postgres", secret, pg_url, None, env="test"))
    database.configure(pg_url)
    try:
        yield served
    finally:
        database.configure(None)
        await served.stop()
