"""Tenants, keys, quotas and usage in the metadata store, on SQLite and PostgreSQL."""

from __future__ import annotations

import threading
from collections.abc import Callable
from datetime import UTC, datetime

import pytest
from sqlalchemy import text

from gateway.meta import MetadataStore
from gateway.meta.tenants import TenantStore
from gateway.wire.errors import KeyNotFound, TenantAlreadyExists, TenantNotFound
from tests.meta.test_metadata import db_url, open_store, scratch_postgres  # noqa: F401

MINUTE = datetime(2026, 11, 21, 6, 0, tzinfo=UTC)


@pytest.fixture
def tenants(open_store: Callable[[], MetadataStore]) -> TenantStore:  # noqa: F811
    return TenantStore(open_store())


def test_tenant_lifecycle(tenants: TenantStore) -> None:
    assert tenants.create_tenant("acme").status == "active"
    with pytest.raises(TenantAlreadyExists):
        tenants.create_tenant("acme")
    assert tenants.set_status("acme", "suspended").status == "suspended"
    assert [t.name for t in tenants.list_tenants()] == ["acme"]
    with pytest.raises(TenantNotFound):
        tenants.set_status("nobody", "active")


def test_keys_and_quotas(tenants: TenantStore) -> None:
    tenants.create_tenant("acme")
    tenants.add_key("acme", "0123456789abcdef", "00" * 16, "ff" * 32)
    found = tenants.key_for_auth("0123456789abcdef")
    assert found is not None and (found.tenant, found.tenant_status, found.revoked) == (
        "acme",
        "active",
        False,
    )
    assert tenants.key_for_auth("fedcba9876543210") is None
    tenants.revoke_key("0123456789abcdef")
    tenants.revoke_key("0123456789abcdef")  # idempotent
    revoked = tenants.key_for_auth("0123456789abcdef")
    assert revoked is not None and revoked.revoked
    with pytest.raises(KeyNotFound):
        tenants.revoke_key("0123456789abcdef", tenant="globex")
    with pytest.raises(TenantNotFound):
        tenants.add_key("globex", "1111111111111111", "00", "00")
    assert tenants.get_quota("acme")["max_tables"] is None
    assert tenants.set_quota("acme", {"max_tables": 3, "requests_per_s": -1})["max_tables"] == 3
    assert tenants.set_quota("acme", {"max_tables": None})["requests_per_s"] == -1


def test_usage_from_many_writers_adds_up(open_store: Callable[[], MetadataStore]) -> None:  # noqa: F811
    stores = [TenantStore(open_store()) for _ in range(4)]
    stores[0].create_tenant("acme")
    barrier = threading.Barrier(4)
    errors: list[BaseException] = []

    def write(s: TenantStore) -> None:
        try:
            barrier.wait()
            for _ in range(5):
                s.add_usage({("acme", MINUTE): {"append_records": 1, "hot_bytes": 7}})
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=write, args=(s,)) for s in stores]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert errors == []
    (row,) = stores[0].usage("acme")
    assert row.minute == MINUTE
    assert (row.counters["append_records"], row.counters["hot_bytes"]) == (20, 7)


def test_delete_tenant_removes_every_row(tenants: TenantStore) -> None:
    meta = tenants.store
    tenants.create_tenant("acme")
    tenants.create_tenant("globex")
    table = meta.create_table("acme", "ns", "t", [{"name": "v", "type": "int64"}], 2)
    meta.create_table("globex", "ns", "t", [{"name": "v", "type": "int64"}], 1)
    meta.commit_offsets("acme", "g", table.table_id, {0: 1})
    meta.update_group("acme", "g", table.table_id, lambda s: setattr(s, "generation", 1))
    tenants.add_key("acme", "0123456789abcdef", "00", "00")
    tenants.set_quota("acme", {"max_tables": 1})
    tenants.add_usage({("acme", MINUTE): {"requests": 1}})
    tenants.delete_tenant("acme")
    with meta.engine.connect() as conn:
        for table, column in (
            ("tg_tenants", "id"),
            ("tg_tables", "tenant_id"),
            ("tg_api_keys", "tenant_id"),
            ("tg_quotas", "tenant_id"),
            ("tg_usage", "tenant_id"),
            ("tg_group_offsets", "tenant_id"),
            ("tg_groups", "tenant_id"),
        ):
            count = conn.execute(
                text(f"SELECT count(*) FROM {table} WHERE {column} = 'acme'")
            ).scalar()
            assert count == 0, table
        assert conn.execute(text("SELECT count(*) FROM tg_partitions")).scalar() == 1
    assert [t.name for t in meta.list_tables("globex")] == ["t"]
    with pytest.raises(TenantNotFound):
        tenants.delete_tenant("acme")
