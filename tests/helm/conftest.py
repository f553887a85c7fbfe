"""Fixtures of the chart and image tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.services import scratch_database


@pytest.fixture
def helm_database(postgres_url: str) -> Iterator[str]:
    """An empty PostgreSQL database for one test, dropped afterwards."""
    with scratch_database(postgres_url, "tidegate_helm") as url:
        yield url
