"""The live gateway replicas in the metadata store (the Kafka cluster's brokers): a row
per replica under a lease it renews, gone when it stops or once its lease ran out, on
SQLite and PostgreSQL."""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Callable

import pytest
from sqlalchemy.exc import IntegrityError

from gateway.meta import MetadataStore
from tests.meta.test_metadata import db_url, open_store, scratch_postgres  # noqa: F401


def test_replicas_renew_see_each_other_and_leave(
    open_store: Callable[[], MetadataStore],  # noqa: F811 - the fixture
) -> None:
    a, b = open_store(), open_store()  # two replicas' own engines on one database
    seen = a.renew_replica("a:1", 7, "10.0.0.1", 9092, 30)
    assert [(r.replica_id, r.node_id, r.host, r.port) for r in seen] == [
        ("a:1", 7, "10.0.0.1", 9092)
    ]
    seen = b.renew_replica("b:1", 3, "10.0.0.2", 9093, 30)
    assert [(r.node_id, r.host, r.port) for r in seen] == [
        (3, "10.0.0.2", 9093),
        (7, "10.0.0.1", 9092),
    ]
    # A renewal moves the lease on and may change the address; the row stays one.
    before = {r.replica_id: r.expires_at for r in a.live_replicas()}
    time.sleep(0.01)
    seen = a.renew_replica("a:1", 7, "10.0.0.9", 9092, 30)
    renewed = {r.replica_id: r for r in seen}
    assert renewed["a:1"].expires_at > before["a:1"] and renewed["a:1"].host == "10.0.0.9"
    assert len(seen) == 2
    # Another live replica may not hold the same node id.
    with pytest.raises(IntegrityError):
        b.renew_replica("c:1", 7, "10.0.0.3", 9092, 30)
    # A replica that stops leaves at once.
    a.drop_replica("a:1")
    assert [r.replica_id for r in b.live_replicas()] == ["b:1"]
    a.drop_replica("a:1")  # unknown: ignored


def test_a_replica_past_its_lease_is_gone_and_its_row_swept(
    open_store: Callable[[], MetadataStore],  # noqa: F811 - the fixture
) -> None:
    store = open_store()
    store.renew_replica("dead:1", 11, "10.0.0.1", 9092, 0.5)
    store.renew_replica("live:1", 12, "10.0.0.2", 9092, 30)
    later = dt.datetime.now(dt.UTC) + dt.timedelta(seconds=1)
    assert [r.replica_id for r in store.live_replicas(at=later)] == ["live:1"]
    time.sleep(0.6)
    # The next renewal sweeps the expired row: its node id is free again.
    seen = store.renew_replica("live:1", 12, "10.0.0.2", 9092, 30)
    assert [r.replica_id for r in seen] == ["live:1"]
    seen = store.renew_replica("other:1", 11, "10.0.0.3", 9092, 30)
    assert [r.node_id for r in seen] == [11, 12]
