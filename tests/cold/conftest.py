"""The cold suite runs on every storage: local and S3 (moto's server) warehouses, SQLite
and PostgreSQL catalogs. Servers are shared by the session; each test gets its own
bucket, catalog name and data folder."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gateway.cold import load_cold_store
from gateway.cold.iceberg import IcebergColdStore
from gateway.config import Settings
from tests.services import MotoServer, scratch_database

#: (warehouse, catalog) combinations every cold test runs on.
STORAGES = ["local-sqlite", "s3-sqlite", "local-postgresql", "s3-postgresql"]


@pytest.fixture(scope="session")
def catalog_postgres(postgres_url: str) -> Iterator[str]:
    """A database of our own for Iceberg SQL catalogs, dropped at the end."""
    with scratch_database(postgres_url, "tidegate_cold") as url:
        yield url


def cold_section(storage: str, request: pytest.FixtureRequest) -> dict[str, Any]:
    warehouse, catalog = storage.split("-")
    cold: dict[str, Any] = {}
    if warehouse == "s3":
        moto: MotoServer = request.getfixturevalue("moto_server")
        bucket = moto.create_bucket(f"wh-{uuid.uuid4().hex[:12]}")
        cold["warehouse"] = f"s3://{bucket}/warehouse"
        cold["s3"] = moto.cold_s3_settings()
    if catalog == "postgresql":
        cold["catalog"] = {
            "type": "sql",
            "uri": request.getfixturevalue("catalog_postgres"),
            "name": f"c{uuid.uuid4().hex[:12]}",
        }
    return cold


@pytest.fixture(params=STORAGES)
def storage(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def cold_settings(storage: str, tmp_path: Path, request: pytest.FixtureRequest) -> Settings:
    return Settings.explicit(
        data_dir=tmp_path, hot={"type": "disk"}, cold=cold_section(storage, request)
    )


@pytest.fixture
def cold_store(cold_settings: Settings) -> Iterator[IcebergColdStore]:
    store = load_cold_store(cold_settings)
    assert isinstance(store, IcebergColdStore)
    try:
        yield store
    finally:
        store.close()
