"""Schema evolution end to end, on both hot tiers: every admitted change through the
edges, reads spanning hot batches and data files of two schema versions, DuckDB over the
evolved Iceberg table, refused changes that leave everything as it was, and two gateway
replicas that learn of a change at different times."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from gateway.client import Client, SchemaChangeRefused
from gateway.config import Settings
from gateway.meta import MetadataStore
from gateway.wire.codec import decode_stream
from gateway.wire.errors import CommitConflict, SchemaMismatch
from tests.integration.conftest import gateway_env
from tests.integration.test_cli import tidegate
from tests.services import GatewayProcess, RedisServer

pytestmark = pytest.mark.integration

V0 = pa.schema(
    [
        pa.field("id", pa.int32(), nullable=False),
        pa.field("score", pa.float32()),
        pa.field("note", pa.string()),
    ]
)
V1 = pa.schema(
    [
        pa.field("id", pa.int64()),
        pa.field("score", pa.float64()),
        pa.field("note", pa.string()),
        pa.field("region", pa.string()),
    ]
)
FIELDS = [
    {"name": "id", "type": "int32", "nullable": False},
    {"name": "score", "type": "float32"},
    {"name": "note", "type": "string", "doc": "free text"},
]
USER = ["id", "score", "note", "region"]


@dataclass
class Lake:
    """A gateway process and the settings of its backends, to tier its tables here."""

    kind: str
    gateway: GatewayProcess
    settings: Settings

    def tier(self, table: str) -> None:
        """Move every hot record of ``table`` to Iceberg in this process, as
        ``tidegate tier`` does (the disk tier is one process's: the gateway pauses)."""
        from gateway.lake.components import Components
        from gateway.lake.tiering import tier_table

        if self.kind == "disk":
            self.gateway.stop()
        try:
            ns, name = table.split(".")
            with Components.open(self.settings) as c:
                tier_table(c, c.meta.get_table(self.gateway.tenant, ns, name), trim=False)
        finally:
            if self.kind == "disk":
                self.gateway.start()


def _env(kind: str, redis: RedisServer | None) -> dict[str, str]:
    # Tests tier when they choose to.
    return {**gateway_env(kind, redis), "TIDEGATE_TIERING__ENABLED": "false"}


@pytest.fixture(scope="module", params=["disk", "redis"])
def lake(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Lake]:
    kind = str(request.param)
    redis = request.getfixturevalue("redis_server") if kind == "redis" else None
    data = tmp_path_factory.mktemp(f"evolve-{kind}")
    gw = GatewayProcess(data, _env(kind, redis)).start()
    hot: dict[str, Any] = (
        {"type": "disk", "fsync": "batch"} if redis is None else {"type": "redis", "url": redis.url}
    )
    try:
        yield Lake(kind, gw, Settings.explicit(data_dir=data, hot=hot))
    finally:
        gw.stop()


@pytest.fixture
def table() -> str:
    return f"ev{uuid.uuid4().hex[:8]}.t"


def _v0(ids: range) -> pa.Table:
    return pa.Table.from_pylist(
        [{"id": i, "score": i + 0.5, "note": f"n{i}"} for i in ids], schema=V0
    )


def _v1(ids: range, region: str) -> pa.Table:
    return pa.Table.from_pylist(
        [
            {"id": None if i % 4 == 0 else i, "score": i + 0.25, "note": f"n{i}", "region": region}
            for i in ids
        ],
        schema=V1,
    )


def _expected(t: pa.Table) -> list[dict[str, Any]]:
    return [{k: r.get(k) for k in USER} for r in t.to_pylist()]


def _user(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{k: r[k] for k in USER} for r in rows]


def _check_reads(c: Client, http: Any, table: str, want: dict[int, list[dict[str, Any]]]) -> Any:
    """Stream reads (gRPC and HTTP), a scan and a read plan all see every row, in the
    new schema, with nulls for the added column in rows written before it."""
    ns, name = table.split(".")
    for p, rows in want.items():
        got = c.read(table, partition=p, offset=0, max_records=1000)
        assert got.schema.field("id").type == pa.int64()
        assert got.schema.field("score").type == pa.float64()
        assert got.schema.field("region").type == pa.string()
        assert _user(got.to_pylist()) == rows
        assert got.column("_offset").to_pylist() == list(range(len(rows)))
        answer = http.get(f"/v1/tables/{ns}/{name}/partitions/{p}/records?offset=0").json()
        assert _user(answer["records"]) == rows
    scanned = c.scan(table).sort_by([("_partition", "ascending"), ("_offset", "ascending")])
    assert scanned.schema.names[:4] == USER
    assert _user(scanned.to_pylist()) == [r for p in sorted(want) for r in want[p]]
    eu = c.scan(table, filter="region = 'eu'").to_pylist()
    assert len(eu) == sum(r["region"] == "eu" for rows in want.values() for r in rows) > 0
    plan = c.plan_read(table)
    stored, _ = decode_stream(plan.arrow_schema)
    assert stored.names[:4] == USER and stored.field("id").type == pa.int64()
    planned = sum(f.record_count for f in plan.files) + sum(
        r.to_offset - r.from_offset for r in plan.hot_ranges
    )
    assert planned == sum(len(rows) for rows in want.values())
    return plan


def test_each_admitted_change_end_to_end(lake: Lake, table: str, tmp_path: Path) -> None:
    gw = lake.gateway
    ns, name = table.split(".")
    want: dict[int, list[dict[str, Any]]] = {0: [], 1: []}
    with gw.client() as c, gw.http_client() as http:
        info = c.create_table(table, FIELDS, partitions=2)
        assert info.schema_version == 0
        for p in (0, 1):  # tiered under the first schema
            rows = _v0(range(p * 100, p * 100 + 3))
            c.append(table, rows, partition=p)
            want[p] += _expected(rows)
        lake.tier(table)
        for p in (0, 1):  # hot, under the first schema
            rows = _v0(range(p * 100 + 3, p * 100 + 5))
            c.append(table, rows, partition=p)
            want[p] += _expected(rows)

        # HTTP: add a nullable column and change a doc.
        answer = http.post(
            f"/v1/tables/{ns}/{name}/schema",
            json={
                "changes": [
                    {"op": "add_column", "column": "region", "type": "string", "doc": "where"},
                    {"op": "update_doc", "column": "note", "doc": "what the user wrote"},
                ]
            },
        )
        assert answer.status_code == 200, answer.text
        body = answer.json()
        assert body["schema_version"] == 1
        assert body["schema"][3] == {
            "name": "region",
            "type": "string",
            "nullable": True,
            "doc": "where",
            "added": True,
        }
        assert body["schema"][2]["doc"] == "what the user wrote"
        # The CLI: one refused change (nothing happens), then a doc.
        refused = tidegate(gw, "table", "alter", table, "--widen", "note:int64", ok=False)
        assert refused.returncode != 0 and "Traceback" not in refused.stderr
        assert "cannot change the type of column 'note'" in refused.stderr
        out = tidegate(gw, "table", "alter", table, "--doc", "region=where it was sent")
        assert "schema      version 2" in out.stdout and "added  where it was sent" in out.stdout
        (tmp_path / "old.jsonl").write_text('{"id": 9, "score": 9.5, "note": "n9"}\n')
        out = tidegate(gw, "append", table, str(tmp_path / "old.jsonl"), "--partition", "0")
        assert "appended 1 record" in out.stdout
        want[0] += [{"id": 9, "score": 9.5, "note": "n9", "region": None}]
        # gRPC through the SDK: widen both numbers, make the required column optional.
        info = c.alter_schema(
            table,
            [
                {"op": "update_type", "column": "id", "type": "int64"},
                {"op": "update_type", "column": "score", "type": "float64"},
                {"op": "make_optional", "column": "id"},
            ],
        )
        assert info.schema_version == 3
        assert [(f.name, f.type, f.nullable) for f in info.fields] == [
            ("id", "int64", True),
            ("score", "double", True),
            ("note", "string", True),
            ("region", "string", True),
        ]
        assert info.fields[3].added and info.fields[2].doc == "what the user wrote"
        described = c.describe_table(table)
        assert described.schema_version == 3 and described.iceberg_schema_id is not None

        # Appends under the old schema keep working: Arrow with the old types and
        # without the new column, JSON rows without it, the SDK producer's dict rows.
        old = _v0(range(5, 7))
        c.append(table, old, partition=0)
        want[0] += _expected(old)
        json_rows = [{"id": 7, "score": 7.5, "note": "n7"}]
        answer = http.post(
            f"/v1/tables/{ns}/{name}/records", json={"rows": json_rows, "partition": 0}
        )
        assert answer.status_code == 200, answer.text
        want[0] += [{**r, "region": None} for r in json_rows]
        with c.producer(table) as producer:
            producer.send({"id": 8, "score": 8.5, "note": "n8"}, partition=0).result(60)
        want[0] += [{"id": 8, "score": 8.5, "note": "n8", "region": None}]
        new = _v1(range(108, 111), "eu")  # the new column and nulls in the optional one
        c.append(table, new, partition=1)
        want[1] += _expected(new)

        # Cold files of the first schema, hot batches of both.
        _check_reads(c, http, table, want)
        lake.tier(table)
        for p in (0, 1):  # hot again, under the new schema
            rows = _v1(range(p * 100 + 20, p * 100 + 22), "us")
            c.append(table, rows, partition=p)
            want[p] += _expected(rows)
        # Cold files of both schemas, then the hot tail.
        plan = _check_reads(c, http, table, want)
        with_region = [
            "region" in pq.read_schema(pa.BufferReader(http.get(f.url).content)).names
            for f in plan.files
        ]
        assert True in with_region and False in with_region

        described = c.describe_table(table)
        metadata = described.iceberg_metadata
    tiered = [r for p in (0, 1) for r in want[p][: described.partition_info[p].tiered_watermark]]
    assert _user(_duckdb(metadata)) == tiered


def _duckdb(metadata: str) -> list[dict[str, Any]]:
    """The Iceberg table's rows as DuckDB reads them (its extensions from PyPI)."""
    from tests.cold.helpers import duckdb_scan

    data = duckdb_scan(metadata)
    assert data.schema.field("id").type == pa.int64()
    assert data.schema.field("score").type == pa.float64()
    return list(data.to_pylist())


REFUSED = [
    ({"op": "drop_column", "column": "note"}, "cannot drop column 'note'"),
    ({"op": "rename_column", "column": "note"}, "cannot rename column 'note'"),
    ({"op": "update_type", "column": "id", "type": "int16"}, "int32 to int16 is a type change"),
    ({"op": "update_type", "column": "score", "type": "string"}, "float to string"),
    ({"op": "update_type", "column": "note", "type": "int64"}, "string to int64"),
    ({"op": "make_required", "column": "score"}, "cannot make required column 'score'"),
    (
        {"op": "add_column", "column": "x", "type": "int64", "nullable": False},
        "a new column must be nullable",
    ),
    ({"op": "add_column", "column": "note", "type": "string"}, "already has a column"),
    ({"op": "add_column", "column": "_offset", "type": "int64"}, "reserved"),
    ({"op": "add_column", "column": "u", "type": "uint8"}, "not supported"),
    ({"op": "make_optional", "column": "nope"}, "no such column"),
    ({"op": "truncate", "column": "note"}, "unknown schema change 'truncate'"),
]


def test_refused_changes_leave_the_table_untouched(lake: Lake, table: str) -> None:
    gw = lake.gateway
    ns, name = table.split(".")
    with gw.client() as c, gw.http_client() as http:
        c.create_table(table, FIELDS, partitions=1)
        c.append(table, _v0(range(4)), partition=0)
        c.append(table, _v0(range(4, 6)), partition=0)
        before = c.describe_table(table)
        rows = c.scan(table).to_pylist()
        for change, words in REFUSED:
            # All or none: a valid change ahead of the refused one is not applied either.
            changes = [{"op": "add_column", "column": "extra", "type": "string"}, change]
            answer = http.post(f"/v1/tables/{ns}/{name}/schema", json={"changes": changes})
            assert answer.status_code == 400, (change, answer.text)
            error = answer.json()["error"]
            assert error["reason"] == "SCHEMA_CHANGE_REFUSED"
            assert words in error["message"] and "accepted changes are" in error["message"]
            assert "Traceback" not in error["message"]
        with pytest.raises(SchemaChangeRefused, match=r"narrowing"):
            widen = {"op": "update_type", "column": "id", "type": "int64"}
            c.alter_schema(table, [widen, {**widen, "type": "int32"}])
        after = c.describe_table(table)
        assert after.fields == before.fields and after.schema_version == 0
        assert after.iceberg_metadata == before.iceberg_metadata  # no Iceberg commit
        assert after.iceberg_schema_id == before.iceberg_schema_id == 0
        assert c.scan(table).to_pylist() == rows


def test_replicas_with_stale_caches_append_across_a_change(
    redis_server: RedisServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Three gateways (in this process) over one Redis, metadata store and catalog. Two
    cached the table before the first changed its schema, and keep their cache here for
    as long as the test runs: the one appending under the old schema is read under the
    new one; the one appending with the new column looks at the table again and is
    accepted rather than refused; a stale one reading rows of the new schema looks again
    too, and answers in the new schema."""
    import asyncio

    import gateway.core.base
    from gateway.lake.components import Components
    from gateway.lake.tiering import tier_table
    from gateway.server.app import build_service
    from gateway.wire.stored import piece_rows

    monkeypatch.setattr(gateway.core.base, "_TABLE_CACHE_TTL_S", 3600.0)
    settings = Settings.explicit(data_dir=tmp_path, hot={"type": "redis", "url": redis_server.url})
    a, b, old = (build_service(settings) for _ in range(3))

    def batch(t: pa.Table) -> list[pa.RecordBatch]:
        return t.to_batches()

    async def main() -> None:
        await a.create_table("t", "r", "x", FIELDS, 1)
        await b.append("t", "r", "x", batch(_v0(range(1))), partition=0)
        await old.append("t", "r", "x", batch(_v0(range(1, 2))), partition=0)
        changes = [
            {"op": "add_column", "column": "region", "type": "string"},
            {"op": "update_type", "column": "id", "type": "int64"},
            {"op": "update_type", "column": "score", "type": "float64"},
            {"op": "make_optional", "column": "id"},
        ]
        await a.alter_schema("t", "r", "x", changes)
        assert (await b.table("t", "r", "x")).schema_version == 0  # stale, as assumed
        # Validated against the old schema while the new one is committed.
        await old.append("t", "r", "x", batch(_v0(range(2, 3))), partition=0)
        await b.append("t", "r", "x", batch(_v1(range(3, 5), "eu")), partition=0)
        assert (await b.table("t", "r", "x")).schema_version == 1
        with pytest.raises(SchemaMismatch, match=r"unexpected column\(s\) \['nope'\]"):
            bad = _v1(range(5, 6), "eu").append_column("nope", pa.array(["?"]))
            await b.append("t", "r", "x", batch(bad), partition=0)
        want = _expected(_v0(range(3))) + _expected(_v1(range(3, 5), "eu"))
        assert (await old.table("t", "r", "x")).schema_version == 0  # stale until it reads
        c = Components(a.settings, a.meta, a.hot, a.cold)  # type: ignore[arg-type]
        for step in ("hot", "tiered"):
            for svc in (a, b, old):
                # Hot payloads sent as stored first: the stale gateway sees a payload of
                # the newer schema from its schema message alone, and looks again.
                raw = await svc.read("t", "r", "x", 0, 0, max_records=100, raw_hot=True)
                user = pa.schema(list(raw.schema)[:-3])
                batches = list(raw.batches)
                for piece in raw.pieces:
                    batches.extend(piece_rows(piece, user, 0))
                rows = pa.Table.from_batches(batches, raw.schema).to_pylist()
                assert _user(rows) == want, (step, "raw", svc is old)
                got = await svc.read("t", "r", "x", 0, 0, max_records=100)
                rows = pa.Table.from_batches(got.batches).to_pylist()
                assert _user(rows) == want, (step, svc is old)
            if step == "hot":
                await asyncio.to_thread(tier_table, c, (await a.table("t", "r", "x")).definition)

    try:
        asyncio.run(main())
    finally:
        for svc in (a, b, old):
            svc.close()


def test_schema_versions_are_compare_and_set(tmp_path: Path) -> None:
    """Of two changes planned from one schema version, the second to commit is refused
    (the gateway answers it COMMIT_CONFLICT, retryable: it re-plans from the new one)."""
    store = MetadataStore(f"sqlite:///{tmp_path / 'meta.db'}")
    try:
        store.ensure_tenant("t")
        d = store.create_table("t", "ns", "x", FIELDS, 1)
        added = [*FIELDS, {"name": "a", "type": "string", "nullable": True, "added": True}]
        assert store.set_fields(d.table_id, 0, added).schema_version == 1
        with pytest.raises(CommitConflict, match="changed concurrently"):
            store.set_fields(d.table_id, 0, FIELDS)
        assert store.get_table("t", "ns", "x").fields == added
    finally:
        store.close()
