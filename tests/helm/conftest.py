"""Fixtures of the chart and image tests: a PostgreSQL database of our own."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator

import pytest


@contextlib.contextmanager
def scratch_database(base_url: str, prefix: str) -> Iterator[str]:
    """A database of our own on the server at ``base_url``, dropped afterwards."""
    from sqlalchemy import create_engine, make_url
    from sqlalchemy.pool import NullPool

    base = make_url(base_url)
    name = f"{prefix}_{uuid.uuid4().hex[:16]}"
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


@pytest.fixture
def helm_database(postgres_url: str | None) -> Iterator[str]:
    """An empty PostgreSQL database for one test."""
    if postgres_url is None:
        pytest.fail("the Helm tests need PostgreSQL: set TIDEGATE_TEST_POSTGRES_URL")
    with scratch_database(postgres_url, "tidegate_helm") as url:
        yield url
