"""Issue 33.4: default limits keep one tenant from holding the gateway's resources: a
table's partitions are bounded for everyone, a tenant's by a default quota."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from gateway.config import QuotaConfig, Settings
from gateway.server.app import build_service
from gateway.wire.errors import QuotaExceeded

pytestmark = pytest.mark.anyio

FIELDS = [{"name": "k", "type": "string"}]


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


async def test_a_table_has_at_most_max_table_partitions(tmp_path: Path) -> None:
    settings = Settings.explicit(data_dir=tmp_path, quota={"max_table_partitions": 16})
    svc = build_service(settings)
    try:
        tenant = f"t{uuid.uuid4().hex[:8]}"
        with pytest.raises(QuotaExceeded) as err:
            await svc.create_table(tenant, "ns", "wide", FIELDS, 17)
        assert err.value.message == (
            "a table may have at most 16 partitions on this gateway "
            "(quota.max_table_partitions); ns.wide asks for 17"
        )
        assert not err.value.retryable
        assert (await svc.create_table(tenant, "ns", "ok", FIELDS, 16)).definition.partitions == 16
    finally:
        svc.close()


def test_defaults_bound_partitions_per_table_and_per_tenant() -> None:
    """The issue's 4,096-partition tables: refused by default, and a tenant's partitions
    are bounded by default (an operator raises either on purpose)."""
    q = QuotaConfig()
    assert q.max_table_partitions == 1024
    assert q.max_partitions is not None and q.max_partitions <= 16384
