"""The cold suite runs on every storage: local and S3 (moto's server) warehouses, SQLite
and PostgreSQL catalogs. Servers are shared by the session; each test gets its own
bucket, catalog name and data folder."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import create_engine, make_url
from sqlalchemy.pool import NullPool

from gateway.cold import load_cold_store
from gateway.cold.iceberg import IcebergColdStore
from gateway.config import Settings
from tests.services import MotoServer

#: (warehouse, catalog) combinations every cold test runs on.
STORAGES = ["local-sqlite", "s3-sqlite", "local-postgresql", "s3-postgresql"]


@pytest.fixture(scope="session")
def catalog_postgres(postgres_url: str | None) -> Iterator[str]:
    """A database of our own for Iceberg SQL catalogs, dropped at the end."""
    if postgres_url is None:
        if os.environ.get("CI"):
            pytest.fail(
                "TIDEGATE_TEST_POSTGRES_URL is not set: CI must run the PostgreSQL catalog "
                "tests (e.g. postgresql+psycopg://postgres@127.0.0.1:5432/postgres)"
            )
        pytest.skip("TIDEGATE_TEST_POSTGRES_URL is not set")
    base = make_url(postgres_url)
    name = f"tidegate_cold_{uuid.uuid4().hex[:16]}"
    admin = create_engine(base, isolation_level="AUTOCOMMIT", poolclass=NullPool)
    try:
        with admin.connect() as conn:
            conn.exec_driver_sql(f'CREATE DATABASE "{name}"')
        try:
            yield base.set(database=name).render_as_string(hide_password=False)
        finally:
            with admin.connect() as conn:
                conn.exec_driver_sql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    finally:
        admin.dispose()


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
