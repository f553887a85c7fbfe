"""A producer over its tenant's quota slows down by itself and loses nothing."""

from __future__ import annotations

import secrets

import pyarrow as pa
import pytest

from gateway.client import ConstantBackoff, Retry, SchemaMismatch
from gateway.client._arrow import ipc as _ipc
from tests.services import GatewayProcess

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def test_producer_over_quota_backs_off_and_delivers_everything(gateway: GatewayProcess) -> None:
    tenant = f"quota{secrets.token_hex(4)}"
    rate = 60_000  # bytes/s; the producer below offers ~4x that at once
    with gateway.admin() as admin:
        admin.create_tenant(tenant)
        _, key = admin.issue_key(tenant)
        admin.set_quota(tenant, append_bytes_per_s=rate)
    rows = [{"n": i, "pad": secrets.token_hex(60)} for i in range(2_000)]  # ~250 KB, incompressible
    with gateway.client(api_key=key) as c:
        c.create_table("q.events", {"n": "int64", "pad": "string"}, partitions=2)
        # A tiny backoff: any wait beyond it comes from the server's retry-after hint.
        retry = Retry(ConstantBackoff(0.001), attempts=None, timeout=120.0)
        with c.producer("q.events", batch_bytes=16_384, linger=0.001, retry=retry) as producer:
            futures = [producer.send(r) for r in rows]
            producer.flush()
        placed = [f.result(timeout=60) for f in futures]
        stored = []
        for p in range(2):
            table = c.read("q.events", partition=p, offset=0, max_records=10_000)
            stored.extend(
                zip(table.column("n").to_pylist(), table.column("_offset").to_pylist(), strict=True)
            )
            assert table.column("_offset").to_pylist() == list(range(table.num_rows))
    assert sorted(n for n, _ in stored) == list(range(len(rows))), "every record exactly once"
    assert len({(m.partition, m.offset) for m in placed}) == len(rows)
    with gateway.admin() as admin:
        usage = admin.usage(tenant)
    assert sum(u["throttled"] for u in usage) > 0, "the quota must actually have pushed back"
    assert sum(u["append_records"] for u in usage) == len(rows)


def test_a_refused_append_costs_no_quota(gateway: GatewayProcess) -> None:
    """Bytes are charged before the append runs and refunded when it is refused, so bad
    batches (or sequences behind a throttled one) cannot drain a tenant's bucket."""
    tenant = f"refund{secrets.token_hex(4)}"
    bad = pa.table({"n": list(range(500)), "wrong": [secrets.token_hex(40)] * 500})
    good = pa.table({"n": list(range(500)), "pad": [secrets.token_hex(40)] * 500})
    with gateway.admin() as admin:
        admin.create_tenant(tenant)
        _, key = admin.issue_key(tenant)
    with gateway.client(api_key=key) as c:
        c.create_table("r.events", {"n": "int64", "pad": "string"})
        size = len(_ipc(good))
        with gateway.admin() as admin:
            admin.set_quota(tenant, append_bytes_per_s=int(size * 1.5))
        for _ in range(5):  # each would take most of the bucket if it were kept
            with pytest.raises(SchemaMismatch):
                c.append("r.events", bad, partition=0)
        (r,) = c.append("r.events", good, partition=0)  # not Throttled: nothing was kept
        assert (r.base_offset, r.count) == (0, 500)
