"""One behaviour suite for the SDK, run over both flavours (sync, asyncio) and both hot
tiers, against a real gateway process."""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pyarrow as pa
import pytest

from gateway.client import (
    InvalidPartition,
    RecordMetadata,
    SchemaMismatch,
    TableAlreadyExists,
    TableNotFound,
)
from gateway.wire.errors import OffsetOutOfRange
from gateway.wire.routing import partition_for_key
from tests.integration.flavours import flavoured_client, result
from tests.services import GatewayProcess

pytestmark = pytest.mark.integration


@pytest.fixture(params=["sync", "aio"])
def sdk(request: pytest.FixtureRequest, gateway: GatewayProcess) -> Iterator[Any]:
    """A client of either flavour with the sync calling convention."""
    with flavoured_client(request.param, gateway) as client:
        yield client


def _read_all(sdk: Any, table: str, partition: int) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = sdk.read(
        table, partition=partition, offset=0, max_records=1_000_000
    ).to_pylist()
    return rows


def test_table_admin(sdk: Any, namespace: str) -> None:
    table = f"{namespace}.admin"
    info = sdk.create_table(table, {"a": "int64", "b": "string"}, partitions=3, key_columns=["a"])
    assert info.partitions == 3
    with pytest.raises(TableAlreadyExists):
        sdk.create_table(table, {"a": "int64"})
    parsed = sdk.table_info(table)
    assert parsed.schema == pa.schema([("a", pa.int64()), ("b", pa.string())])
    assert parsed.key_columns == ("a",)
    assert parsed.high_watermarks == (0, 0, 0)
    assert [t.table.name for t in sdk.list_tables(namespace)] == ["admin"]
    sdk.drop_table(table)
    assert sdk.list_tables(namespace) == []
    with pytest.raises(TableNotFound):
        sdk.describe_table(table)
    with pytest.raises(TableNotFound), sdk.producer(table):
        pass
    with pytest.raises(TableNotFound), sdk.consumer(table):
        pass


def test_producer_routes_rows_where_the_gateway_would(sdk: Any, namespace: str) -> None:
    table = f"{namespace}.keyed"
    sdk.create_table(table, {"user": "string", "n": "int64"}, partitions=4, key_columns=["user"])
    users = [f"user-{i}" for i in range(60)]
    with sdk.producer(table, batch_records=7, linger=0.01) as p:
        singles = [p.send({"user": u, "n": i}) for i, u in enumerate(users)]
        many = p.send(pa.table({"user": users, "n": list(range(100, 160))}))
        p.flush()
    for i, u in enumerate(users):
        md = result(singles[i])
        assert isinstance(md, RecordMetadata)
        assert md.partition == partition_for_key([u], 4)
    mds = result(many)
    assert [m.partition for m in mds] == [partition_for_key([u], 4) for u in users]
    # The gateway routes a plain append of the same keys to the same partitions.
    sdk.append(table, [{"user": u, "n": -1} for u in users])
    for p in range(4):
        rows = _read_all(sdk, table, p)
        assert {r["user"] for r in rows} == {u for u in users if partition_for_key([u], 4) == p}
        # Offsets in the futures are the records' offsets, in send order per partition.
        mine = [(r["_offset"], r["n"]) for r in rows if r["n"] >= 0]
        expected = sorted(
            [
                (result(singles[i]).offset, i)
                for i, u in enumerate(users)
                if partition_for_key([u], 4) == p
            ]
            + [
                (mds[i].offset, 100 + i)
                for i, u in enumerate(users)
                if partition_for_key([u], 4) == p
            ]
        )
        assert mine == expected


@pytest.mark.parametrize("compression", ["zstd", "lz4", "none"])
def test_batching_and_compression(sdk: Any, namespace: str, compression: str) -> None:
    table = f"{namespace}.batched"
    sdk.create_table(table, {"n": "int64", "s": "string"}, partitions=1)
    with sdk.producer(table, batch_records=100, linger=30, compression=compression) as p:
        futures = [p.send({"n": i, "s": "x" * (i % 13)}) for i in range(1000)]
        p.flush()
    assert [result(f).offset for f in futures] == list(range(1000))
    batches = [
        b
        for chunk, _, _ in sdk.read_batches(table, partition=0, offset=0, max_records=5000)
        for b in chunk
    ]
    assert [b.num_rows for b in batches] == [100] * 10  # one stored batch per request
    rows = [r for b in batches for r in b.to_pylist()]
    assert [(r["n"], r["s"]) for r in rows] == [(i, "x" * (i % 13)) for i in range(1000)]


def test_linger_sends_without_flush(sdk: Any, namespace: str) -> None:
    table = f"{namespace}.linger"
    sdk.create_table(table, {"n": "int64"})
    with sdk.producer(table, linger=0.02) as p:
        fut = p.send({"n": 1})
        assert result(fut, timeout=30) == RecordMetadata(0, 0)


def test_unkeyed_rows_spread_by_batch(sdk: Any, namespace: str) -> None:
    table = f"{namespace}.sticky"
    sdk.create_table(table, {"n": "int64"}, partitions=3)
    with sdk.producer(table, batch_records=10, linger=30) as p:
        futures = [p.send({"n": i}) for i in range(30)]
        explicit = p.send([{"n": 100}, {"n": 101}], partition=2)
    by_partition: dict[int, list[int]] = {}
    for i, f in enumerate(futures):
        by_partition.setdefault(result(f).partition, []).append(i)
    assert sorted(len(v) for v in by_partition.values()) == [10, 10, 10]
    assert all(v == sorted(v) and v[-1] - v[0] == 9 for v in by_partition.values())
    assert {m.partition for m in result(explicit)} == {2}


def test_bad_rows_fail_at_send_and_nothing_is_written(sdk: Any, namespace: str) -> None:
    table = f"{namespace}.strict"
    sdk.create_table(table, {"n": "int64"}, partitions=2)
    with sdk.producer(table) as p:
        with pytest.raises(SchemaMismatch):
            p.send(pa.table({"n": ["not a number"]}))
        with pytest.raises(InvalidPartition):
            p.send({"n": 1}, partition=7)
        ok = p.send({"n": 2})
    assert result(ok).offset == 0
    info = sdk.table_info(table)
    assert sum(info.high_watermarks) == 1


def test_idempotent_producer_stores_each_batch_once(sdk: Any, namespace: str) -> None:
    table = f"{namespace}.idem"
    sdk.create_table(table, {"n": "int64"}, partitions=2)
    with sdk.producer(table, producer_id="stable-id", batch_records=50, max_in_flight=5) as p:
        assert p.producer_id == "stable-id"
        futures = [p.send(pa.table({"n": list(range(i, i + 50))})) for i in range(0, 500, 50)]
    assert sorted(m.offset for f in futures for m in result(f)) == sorted(
        o for p in range(2) for o in range(len(_read_all(sdk, table, p)))
    )
    values = sorted(r["n"] for p in range(2) for r in _read_all(sdk, table, p))
    assert values == list(range(500))


def _fill(sdk: Any, table: str, partitions: int, per_partition: int) -> None:
    for p in range(partitions):
        sdk.append(table, [{"n": p * 1000 + i} for i in range(per_partition)], partition=p)


def test_consumer_start_positions(sdk: Any, namespace: str) -> None:
    table = f"{namespace}.starts"
    sdk.create_table(table, {"n": "int64"}, partitions=2)
    _fill(sdk, table, 2, 5)
    time.sleep(0.05)
    middle = dt.datetime.now(dt.UTC)
    time.sleep(0.05)
    _fill(sdk, table, 2, 3)

    def values(**options: Any) -> list[int]:
        with sdk.consumer(table, follow=False, **options) as c:
            return sorted(r["n"] for r in c)

    assert len(values()) == 16
    assert values(start="latest") == []
    assert values(start=6, partitions=[1]) == [1001, 1002]
    assert values(start=middle) == [0, 1, 2, 1000, 1001, 1002]
    assert sdk.offsets_for_times(table, middle) == {0: 5, 1: 5}
    assert sdk.offsets_for_times(table, middle - dt.timedelta(days=1), [1]) == {1: 0}
    assert sdk.offsets_for_times(table, time.time() + 3600) == {0: 8, 1: 8}


def test_consumer_batches_are_ordered_per_partition(sdk: Any, namespace: str) -> None:
    table = f"{namespace}.ordered"
    sdk.create_table(table, {"n": "int64"}, partitions=3)
    _fill(sdk, table, 3, 40)
    seen: dict[int, list[int]] = {0: [], 1: [], 2: []}
    with sdk.consumer(table, follow=False, max_records=7) as c:
        for batch in c.batches():
            assert isinstance(batch, pa.RecordBatch)
            p = batch.column("_partition")[0].as_py()
            seen[p].extend(batch.column("_offset").to_pylist())
    assert seen == {p: list(range(40)) for p in range(3)}


def test_consumer_group_commits_and_resumes(
    sdk: Any, namespace: str, gateway: GatewayProcess
) -> None:
    table = f"{namespace}.grouped"
    sdk.create_table(table, {"n": "int64"}, partitions=2)
    _fill(sdk, table, 2, 30)
    first: list[tuple[int, int]] = []
    with sdk.consumer(table, group="g1", follow=False, auto_commit_interval=None) as c:
        for record in c:
            first.append((record["_partition"], record["_offset"]))
            if len(first) == 25:
                c.commit()
                break
    committed = sdk.fetch_offsets("g1", table)
    got = {p: max([o for q, o in first if q == p], default=-1) + 1 for p in range(2)}
    assert committed == got
    second: list[tuple[int, int]] = []
    with sdk.consumer(table, group="g1", follow=False, auto_commit_interval=0) as c:
        second.extend((r["_partition"], r["_offset"]) for r in c)
    assert sorted(first + second) == sorted((p, o) for p in range(2) for o in range(30))
    assert sdk.fetch_offsets("g1", table) == {0: 30, 1: 30}  # auto-commit, then close
    assert sdk.fetch_offsets("other", table) == {}
    # The HTTP edge serves the same offsets.
    with gateway.http_client() as http:
        ns, name = table.split(".")
        body = http.get(f"/v1/groups/g1/tables/{ns}/{name}/offsets").json()
    assert body["offsets"] == [{"partition": 0, "offset": 30}, {"partition": 1, "offset": 30}]


def test_poll_only_consumption_commits_what_poll_returned(sdk: Any, namespace: str) -> None:
    """What ``poll`` returned counts as consumed: close() and auto-commit store the
    offset after the last record handed out, as Kafka's poll does (issue 31)."""
    table = f"{namespace}.polled"
    sdk.create_table(table, {"n": "int64"}, partitions=2)
    _fill(sdk, table, 2, 3)
    with sdk.consumer(table, group="pollers", follow=False, partitions=[0, 1]) as c:
        got = c.poll(timeout=5)
        assert got, "poll returned nothing"
        returned = {
            b.column("_partition")[0].as_py(): b.column("_offset")[-1].as_py() + 1 for b in got
        }
    assert sdk.fetch_offsets("pollers", table) == returned
    # Auto-commit at the next poll stores what the previous one returned.
    _fill(sdk, table, 2, 2)
    with sdk.consumer(
        table, group="pollers", follow=False, partitions=[0, 1], auto_commit_interval=0
    ) as c:
        seen: list[int] = []
        deadline = time.monotonic() + 30
        while len(seen) < 4 and time.monotonic() < deadline:
            seen.extend(v for b in c.poll(timeout=1) for v in b.column("_offset").to_pylist())
        assert sorted(seen) == [3, 3, 4, 4]
        c.poll(timeout=0.05)  # commits before it fetches
        assert sdk.fetch_offsets("pollers", table) == {0: 5, 1: 5}


def test_follow_mode_sees_new_records(sdk: Any, namespace: str) -> None:
    table = f"{namespace}.follow"
    sdk.create_table(table, {"n": "int64"}, partitions=2)
    with sdk.consumer(table, start="latest", poll_interval=0.02) as c:
        assert c.poll(timeout=0.1) == []
        _fill(sdk, table, 2, 3)
        got: list[int] = []
        deadline = time.monotonic() + 30
        while len(got) < 6 and time.monotonic() < deadline:
            got.extend(v for b in c.poll(timeout=1) for v in b.column("n").to_pylist())
    assert sorted(got) == [0, 1, 2, 1000, 1001, 1002]


def test_http_group_offsets(gateway: GatewayProcess, namespace: str) -> None:
    with gateway.client() as c:
        c.create_table(f"{namespace}.h", {"n": "int64"}, partitions=2)
        c.append(f"{namespace}.h", [{"n": i} for i in range(6)], partition=1)
    url = f"/v1/groups/readers.v1/tables/{namespace}/h/offsets"
    with gateway.http_client() as http:
        assert http.get(url).json()["offsets"] == []
        r = http.post(url, json={"offsets": [{"partition": 1, "offset": 4}]})
        assert r.status_code == 200, r.text
        assert r.json()["offsets"] == [{"partition": 1, "offset": 4}]
        bad = http.post(url, json={"offsets": [{"partition": 5, "offset": 1}]})
        assert (bad.status_code, bad.json()["error"]["reason"]) == (400, "INVALID_PARTITION")
        neg = http.post(url, json={"offsets": [{"partition": 0, "offset": -1}]})
        assert neg.status_code == 400
        missing = http.get(f"/v1/groups/g/tables/{namespace}/nope/offsets")
        assert (missing.status_code, missing.json()["error"]["reason"]) == (
            404,
            "TABLE_NOT_FOUND",
        )
        bad_group = http.get(f"/v1/groups/-x/tables/{namespace}/h/offsets")
        assert bad_group.status_code == 400
    assert isinstance(http, httpx.Client)


def test_a_group_cannot_commit_past_the_end(gateway: GatewayProcess, namespace: str) -> None:
    """Issue 33.10: a commit past a partition's high watermark is refused in one sentence
    naming the offset and the end, on both edges, and nothing of it is stored (before: it
    was accepted, then every read of the group failed until it was reset)."""
    table = f"{namespace}.end"
    with gateway.client() as c:
        c.create_table(table, {"n": "int64"}, partitions=2)
        c.append(table, [{"n": i} for i in range(3)], partition=0)
        c.commit_offsets("g", table, {0: 3, 1: 0})  # the end itself is a valid commit
        with pytest.raises(OffsetOutOfRange) as caught:
            c.commit_offsets("g", table, {0: 4})
        err = caught.value
        assert "offset 4 of partition 0 is past its end" in err.message
        assert "high watermark 3" in err.message and err.details["latest"] == 3
        with pytest.raises(OffsetOutOfRange):
            c.commit_offsets("g", table, {0: 2, 1: 1})  # one bad partition: nothing stored
        assert c.fetch_offsets("g", table) == {0: 3, 1: 0}
    with gateway.http_client() as http:
        url = f"/v1/groups/g/tables/{namespace}/end/offsets"
        r = http.post(url, json={"offsets": [{"partition": 1, "offset": 10}]})
        assert (r.status_code, r.json()["error"]["reason"]) == (416, "OFFSET_OUT_OF_RANGE")
        assert http.get(url).json()["offsets"][1] == {"partition": 1, "offset": 0}


def test_scan_and_plan(sdk: Any, namespace: str) -> None:
    table = f"{namespace}.scanned"
    sdk.create_table(table, {"n": "int64", "tag": "string"}, partitions=2)
    sdk.append(table, [{"n": i, "tag": "even" if i % 2 == 0 else "odd"} for i in range(20)])
    got = sdk.scan(table, columns=["n"], filter="tag = 'even' and n >= 10")
    assert got.schema.names == ["n"]
    assert sorted(got.column("n").to_pylist()) == [10, 12, 14, 16, 18]
    batches = list(sdk.scan_batches(table, filter="n < 3"))
    assert sorted(n for b in batches for n in b.column("n").to_pylist()) == [0, 1, 2]
    assert sdk.scan(table, limit=4).num_rows == 4
    plan = sdk.plan_read(table)
    # One pinned view: the planned files and the hot ranges hold every row exactly once.
    hot = sum(r.to_offset - r.from_offset for r in plan.hot_ranges)
    assert hot + sum(f.record_count for f in plan.files) == 20
    with pytest.raises(TableNotFound):
        sdk.scan(f"{namespace}.missing")
