"""``tidegate migrate``: the command the chart's pre-install/pre-upgrade hook runs."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from sqlalchemy import create_engine, inspect
from sqlalchemy.pool import NullPool

from gateway.meta import MetadataStore
from gateway.meta.engine import alembic_config
from gateway.meta.models import VERSION_TABLE
from tests.services import REPO_ROOT


def run_migrate(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("TIDEGATE_")}
    return subprocess.run(
        [sys.executable, "-m", "gateway", "migrate"],
        env={**base, **env},
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )


def head_revision() -> str:
    from alembic.script import ScriptDirectory

    head = ScriptDirectory.from_config(alembic_config()).get_current_head()
    assert head is not None
    return head


def test_migrate_creates_then_keeps_the_schemas(helm_database: str, tmp_path: Path) -> None:
    env = {
        "TIDEGATE_DATA_DIR": str(tmp_path),
        "TIDEGATE_METADATA__URL": helm_database,
        "TIDEGATE_COLD__CATALOG__TYPE": "sql",
        "TIDEGATE_COLD__CATALOG__URI": helm_database,
    }
    first = run_migrate(env)
    assert first.returncode == 0, first.stderr
    assert f"at revision {head_revision()}" in first.stdout
    engine = create_engine(helm_database, poolclass=NullPool)
    try:
        tables = set(inspect(engine).get_table_names())
    finally:
        engine.dispose()
    assert {VERSION_TABLE, "tg_tenants", "tg_tables", "iceberg_tables"} <= tables

    again = run_migrate(env)  # an upgrade with nothing to do
    assert again.returncode == 0, again.stderr
    assert f"at revision {head_revision()}" in again.stdout
    with MetadataStore(helm_database) as meta:  # what a gateway does next
        meta.ensure_tenant("shop")
        assert meta.revision() == head_revision()


def test_migrate_names_an_unreachable_database_in_one_sentence(tmp_path: Path) -> None:
    done = run_migrate(
        {
            "TIDEGATE_DATA_DIR": str(tmp_path),
            "TIDEGATE_METADATA__URL": "postgresql+psycopg://tg:hunter2secret@127.0.0.1:1/tg",
        }
    )
    assert done.returncode == 2
    assert "Traceback" not in done.stderr
    assert done.stderr.startswith(
        "error: cannot migrate the metadata store at postgresql+psycopg://tg:***@127.0.0.1:1/tg"
    )
    assert "hunter2secret" not in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1


def test_migrate_refuses_a_url_that_is_not_one(tmp_path: Path) -> None:
    done = run_migrate({"TIDEGATE_DATA_DIR": str(tmp_path), "TIDEGATE_METADATA__URL": "db"})
    assert done.returncode == 2
    assert done.stderr.strip() == (
        "error: TIDEGATE_METADATA__URL 'db' is not a SQLAlchemy URL "
        "(e.g. postgresql+psycopg://user:password@host:5432/tidegate)"
    )
