"""The groups an edge's protocol coordinates (Kafka's) in the metadata store: a replica's
snapshot replaces what it published before, the replica a group moved to takes its rows
over, and rows past their lease no longer count, on SQLite and PostgreSQL."""

from __future__ import annotations

import time
from collections.abc import Callable

from gateway.meta import EdgeGroup, EdgeMember, MetadataStore
from tests.meta.test_metadata import db_url, open_store, scratch_postgres  # noqa: F401


def _group(group: str, table: str, *held: tuple[int, ...], state: str = "Stable") -> EdgeGroup:
    members = tuple(
        EdgeMember(f"m{i}", "rdkafka", 3, ps, session_timeout_ms=45_000, joined_ms=1, seen_ms=2)
        for i, ps in enumerate(held)
    )
    return EdgeGroup("t", group, "ns", table, "kafka-classic", state, 3, members)


def test_a_replica_s_snapshot_replaces_its_last_and_moves_with_the_group(
    open_store: Callable[[], MetadataStore],  # noqa: F811 - the fixture
) -> None:
    a, b = open_store(), open_store()  # two replicas' own engines on one database
    a.publish_edge_groups("a", [_group("g", "x", (0, 1), (2,)), _group("h", "x", (0,))], 30)
    b.publish_edge_groups("b", [_group("k", "y", (0,))], 30)
    assert [(g.group, g.name) for g in b.edge_groups("t")] == [("g", "x"), ("h", "x"), ("k", "y")]
    assert b.edge_groups("t", "g", "ns", "x")[0].members[0].assigned == (0, 1)
    assert b.edge_groups("other") == [] and b.edge_groups("t", "g", "ns", "y") == []
    # A's next snapshot: h emptied, g rebalancing; b's rows untouched.
    a.publish_edge_groups("a", [_group("g", "x", (0, 1, 2), state="PreparingRebalance")], 30)
    assert [(g.group, g.state) for g in b.edge_groups("t")] == [
        ("g", "PreparingRebalance"),
        ("k", "Stable"),
    ]
    # Group g moved to b (a died, its lease not yet out): b's row is the one kept.
    b.publish_edge_groups("b", [_group("k", "y", (0,)), _group("g", "x", (2,))], 30)
    assert [m.assigned for m in a.edge_groups("t", "g", "ns", "x")[0].members] == [(2,)]
    # A replica that stops clears its own.
    b.publish_edge_groups("b", [], 30)
    assert a.edge_groups("t") == []


def test_rows_past_their_lease_no_longer_count(
    open_store: Callable[[], MetadataStore],  # noqa: F811 - the fixture
) -> None:
    store = open_store()
    store.publish_edge_groups("dead", [_group("g", "x", (0,))], 30)
    store.publish_edge_groups("live", [_group("h", "x", (1,))], 30)
    assert len(store.edge_groups("t")) == 2
    # The replica's last renewal, with a lease that runs out at once (no pause of the
    # machine between two calls can make a 30 s lease run out, nor this one live on).
    store.publish_edge_groups("dead", [_group("g", "x", (0,))], 0.05)
    time.sleep(0.1)
    assert [g.group for g in store.edge_groups("t")] == ["h"]
