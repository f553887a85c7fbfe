from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from gateway.hot import HotLog, load_hot_log
from tests.conftest import hot_settings
from tests.services import RedisServer


@pytest.fixture(params=["disk", "redis"])
def hot_kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def hot_log(hot_kind: str, tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[HotLog]:
    redis_server: RedisServer | None = (
        request.getfixturevalue("redis_server") if hot_kind == "redis" else None
    )
    log = load_hot_log(hot_settings(hot_kind, tmp_path, redis_server))
    try:
        yield log
    finally:
        log.close()
