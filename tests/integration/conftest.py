"""Real gateway processes, one per hot tier, shared by the session."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import httpx
import pytest

from gateway.client import Client
from tests.services import GatewayProcess, RedisServer


def gateway_env(kind: str, redis_server: RedisServer | None) -> dict[str, str]:
    env = {"TIDEGATE_SERVER__MAX_REQUEST_BYTES": str(1024 * 1024)}
    if kind == "redis":
        assert redis_server is not None
        env.update({"TIDEGATE_HOT__TYPE": "redis", "TIDEGATE_HOT__URL": redis_server.url})
    else:
        env.update({"TIDEGATE_HOT__TYPE": "disk", "TIDEGATE_HOT__FSYNC": "batch"})
    return env


@pytest.fixture(scope="session", params=["disk", "redis"])
def gateway(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[GatewayProcess]:
    kind = str(request.param)
    redis_server = request.getfixturevalue("redis_server") if kind == "redis" else None
    # No embedded tiering on the shared gateways: a pass every 30 s would land at a random
    # point of some test and move its hot batches into Iceberg under it (tests that check
    # how batches are stored flaked so). Tiering gets gateways of its own where it is tested.
    env = {**gateway_env(kind, redis_server), "TIDEGATE_TIERING__ENABLED": "false"}
    proc = GatewayProcess(tmp_path_factory.mktemp(f"gw-{kind}"), env)
    proc.kind = kind  # type: ignore[attr-defined]
    proc.start()
    try:
        yield proc
    finally:
        proc.stop()


@pytest.fixture
def client(gateway: GatewayProcess) -> Iterator[Client]:
    with gateway.client() as c:
        yield c


@pytest.fixture
def http(gateway: GatewayProcess) -> Iterator[httpx.Client]:
    with gateway.http_client() as c:
        yield c


@pytest.fixture
def namespace() -> str:
    return f"ns{uuid.uuid4().hex[:10]}"
