"""Writes to primary-key tables (issue 42) through real gateways on both hot tiers: upserts
and deletes by the SDK (sync and asyncio, over gRPC) and HTTP (JSON and Arrow) are stored
as the changelog they make, the stream read is that changelog with ``_change``, an
idempotent producer's retry after kill -9 is applied once, bad writes are one sentence
and write nothing, and tiering moves key tables to the lake while their hot tier stays whole."""

from __future__ import annotations

import contextlib
import random
import re
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pyarrow as pa
import pytest

from gateway.client import Client, SchemaMismatch, Unimplemented
from gateway.wire.retry import Retry
from tests.integration.conftest import gateway_env
from tests.integration.flavours import flavoured_client
from tests.keytables import USER, Key, replay
from tests.services import GatewayProcess

pytestmark = pytest.mark.integration

SCHEMA = {"id": "int64", "region": "string", "v": "int64", "note": "string"}


@pytest.fixture(params=["sync", "aio"])
def any_client(request: pytest.FixtureRequest, gateway: GatewayProcess) -> Iterator[Any]:
    with flavoured_client(str(request.param), gateway) as c:
        yield c


def changelog(client: Any, table: str, partitions: int) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for p in range(partitions):
        got = client.read(table, partition=p, offset=0, max_records=100_000)
        assert got.column_names[: len(USER) + 1] == [*USER, "_change"]
        out += got.to_pylist()
    return out


def test_random_upserts_and_deletes_replay_to_the_model(any_client: Any, namespace: str) -> None:
    table = f"{namespace}.accounts"
    any_client.create_table(table, SCHEMA, partitions=3, primary_key=["id", "region"])
    rng = random.Random(7)
    model: dict[Key, dict[str, Any]] = {}
    for step in range(30):
        rows: list[dict[str, Any]] = []
        for _ in range(rng.randint(1, 25)):
            key = (rng.randrange(80), rng.choice(["eu", "us", "ap"]))
            if rng.random() < 0.25:
                rows.append({"id": key[0], "region": key[1], "_change": 3})
                model.pop(key, None)
            else:
                row = {"id": key[0], "region": key[1], "v": step, "note": f"n{rng.random():.3f}"}
                model[key] = dict(row)
                rows.append({**row, "_change": rng.choice([0, 2])} if step % 2 else row)
        any_client.append(table, rows)
        if step % 5 == 4 and model:
            gone = rng.sample(sorted(model), min(3, len(model)))
            ranges = any_client.delete(table, [{"id": i, "region": r} for i, r in gone])
            assert sum(r.count for r in ranges) == len(gone)  # one -D per live key
            for key in gone:
                del model[key]
    changes = changelog(any_client, table, 3)
    assert replay(changes) == model
    # A delete of a key that is not live changes nothing and stores nothing.
    before = sum(any_client.describe_table(table).high_watermarks)
    assert [r.count for r in any_client.delete(table, {"id": 10_000, "region": "eu"})] == [0]
    assert sum(any_client.describe_table(table).high_watermarks) == before


def test_http_writes_deletes_and_reads_carry_the_change(http: httpx.Client, namespace: str) -> None:
    made = http.post(
        "/v1/tables",
        json={
            "namespace": namespace,
            "name": "kv",
            "schema": SCHEMA,
            "partitions": 1,
            "primary_key": ["id", "region"],
            "merge_engine": {"type": "versioned", "column": "v"},
        },
    )
    assert made.status_code == 201, made.text
    url = f"/v1/tables/{namespace}/kv"
    rows = [
        {"id": 1, "region": "eu", "v": 2, "note": "a"},
        {"id": 1, "region": "eu", "v": 1, "note": "older"},  # a lower version: nothing
        {"id": 2, "region": "eu", "v": 1, "note": "b", "_change": 2},
        {"id": 3, "region": "eu", "v": 1, "note": "c"},
        {"id": 3, "region": "eu", "_change": 3},  # a delete names its key only
    ]
    answer = http.post(f"{url}/records", json={"rows": rows})
    assert answer.status_code == 200, answer.text
    # +I 1, +I 2, +I 3, -D 3
    assert answer.json()["ranges"] == [
        {"partition": 0, "base_offset": 0, "count": 4, "duplicate": False}
    ]
    sink = pa.BufferOutputStream()
    batch = pa.record_batch(
        {"id": [2], "region": ["eu"], "v": [5], "note": ["b2"], "_change": pa.array([0], pa.int8())}
    )
    with pa.ipc.new_stream(sink, batch.schema) as w:
        w.write_batch(batch)
    arrow = http.post(
        f"{url}/records",
        content=sink.getvalue().to_pybytes(),
        headers={"content-type": "application/vnd.apache.arrow.stream"},
    )
    assert arrow.status_code == 200, arrow.text
    deleted = http.post(f"{url}/deletes", json={"keys": [{"id": 1, "region": "eu"}]})
    assert deleted.status_code == 200, deleted.text
    read = http.get(f"{url}/partitions/0/records", params={"offset": 0}).json()["records"]
    kinds = [(r["id"], r["_change"], r["note"]) for r in read]
    assert kinds == [
        (1, 0, "a"),
        (2, 0, "b"),
        (3, 0, "c"),
        (3, 3, "c"),
        (2, 1, "b"),
        (2, 2, "b2"),
        (1, 3, "a"),
    ]
    high = http.get(url).json()["partition_info"][0]["high_watermark"]

    def refused(path: str, body: dict[str, Any], message: str) -> None:
        got = http.post(f"{url}/{path}", json=body)
        assert got.status_code == 400, got.text
        text = got.json()["error"]["message"]
        assert message in text, text
        assert text.count(". ") == 0 and text.count(";") <= 1, text

    refused(
        "records",
        {"rows": [{"id": 9, "region": "eu", "v": 1, "note": "x", "_change": 1}]},
        "row 0._change is 1; a write's _change is 0 or 2 (upsert) and 3 (delete)",
    )
    refused(
        "deletes",
        {"keys": [{"id": 2, "region": "eu"}, {"id": 9}]},
        "key 1 names ['id']; a key of " + f"{namespace}.kv names exactly its "
        "primary key columns ['id', 'region']",
    )
    refused("deletes", {"keys": [{"id": "two", "region": "eu"}]}, "key 0.id:")
    assert http.get(url).json()["partition_info"][0]["high_watermark"] == high
    plain = http.post(
        "/v1/tables", json={"namespace": namespace, "name": "plain", "schema": SCHEMA}
    )
    assert plain.status_code == 201
    got = http.post(f"/v1/tables/{namespace}/plain/deletes", json={"keys": [{"id": 1}]})
    assert got.status_code == 400
    assert "has no primary key; only a key table is keyed" in got.json()["error"]["message"]


def _describes(gw: GatewayProcess) -> float:
    text = httpx.get(f"{gw.http_url}/metrics", timeout=10).text
    pattern = r'^tidegate_grpc_requests_total\{[^}]*method="DescribeTable"[^}]*\} ([0-9.e+]+)$'
    return sum(float(v) for v in re.findall(pattern, text, re.M))


def test_lookups_and_deletes_describe_their_table_once(
    gateway: GatewayProcess, namespace: str
) -> None:
    """A client describes a key table once for its keys, not once per get or delete (a
    round trip each), and again only when the table changed under it."""
    table = f"{namespace}.described"
    with gateway.client() as c:
        c.create_table(table, SCHEMA, partitions=2, primary_key=["id", "region"])
        c.append(table, [{"id": i, "region": "eu", "v": i, "note": "n"} for i in range(10)])
        before = _describes(gateway)
        for i in range(20):
            assert c.get(table, {"id": i % 10, "region": "eu"}).num_rows == 1
        c.delete(table, [{"id": 1, "region": "eu"}])
        assert c.get(table, {"id": 1, "region": "eu"}).num_rows == 0
        assert _describes(gateway) - before <= 1
        # Dropped and made again with another key: the stale key is described anew.
        c.drop_table(table)
        c.create_table(table, SCHEMA, partitions=1, primary_key=["id"])
        c.append(table, [{"id": 7, "region": "us", "v": 1, "note": "m"}])
        assert c.get(table, {"id": 7}).to_pylist()[0]["region"] == "us"


def test_a_refused_sdk_write_stores_nothing(client: Client, namespace: str) -> None:
    table = f"{namespace}.t"
    client.create_table(table, SCHEMA, partitions=2, primary_key=["id", "region"])
    good = {"id": 1, "region": "eu", "v": 1, "note": "x"}
    with pytest.raises(SchemaMismatch, match=r"row 1\._change is 1; a write's _change is 0"):
        client.append(table, [good, {**good, "id": 2, "_change": 1}])
    with pytest.raises(SchemaMismatch, match=r"key 0 names \['id', 'v'\]; a key of"):
        client.delete(table, [{"id": 1, "v": 3}])
    assert client.describe_table(table).high_watermarks == (0, 0)


@pytest.mark.parametrize("kind", ["disk", "redis"])
def test_an_idempotent_retry_after_kill_9_is_applied_once(
    kind: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    redis = request.getfixturevalue("redis_server") if kind == "redis" else None
    env = gateway_env(kind, redis)
    gw = GatewayProcess(tmp_path / "gw", env).start()
    table = f"keyidem{kind}.t"
    row = {"id": 1, "region": "eu", "v": 1, "note": "a"}
    try:
        with gw.client() as c:
            c.create_table(table, SCHEMA, partitions=1, primary_key=["id", "region"])
            first = c.append(table, [row], producer_id="p", sequence=0)[0]
            assert (first.base_offset, first.count) == (0, 1)
            upd = c.append(table, [{**row, "note": "b"}], producer_id="p", sequence=1)[0]
            assert (upd.base_offset, upd.count) == (1, 2)
            # Nothing to change (a delete of an absent key): no record, the sequence moves.
            nothing = c.delete(table, {"id": 5, "region": "eu"}, producer_id="p", sequence=2)[0]
            assert (nothing.base_offset, nothing.count, nothing.duplicate) == (3, 0, False)
        gw.kill()
        gw = GatewayProcess(tmp_path / "gw", env, tenant=gw.tenant, api_key=gw.api_key).start()
        with gw.client() as c:
            # The retried update would resolve to -U/+U of itself now: answered as stored.
            again = c.append(table, [{**row, "note": "b"}], producer_id="p", sequence=1)[0]
            assert (again.base_offset, again.count, again.duplicate) == (1, 2, True)
            empty = c.delete(table, {"id": 5, "region": "eu"}, producer_id="p", sequence=2)[0]
            assert (empty.count, empty.duplicate) == (0, True)
            nxt = c.delete(table, {"id": 1, "region": "eu"}, producer_id="p", sequence=3)[0]
            assert (nxt.base_offset, nxt.count, nxt.duplicate) == (3, 1, False)
            changes = changelog(c, table, 1)
            assert [ch["_change"] for ch in changes] == [0, 1, 2, 3]
            assert replay(changes) == {}
    finally:
        gw.stop()


def test_tiering_moves_key_tables_to_the_lake(tmp_path: Path) -> None:
    """The embedded tiering moves a key table's changelog, applies it to the state table
    and trims the hot tier (hot retention 0); the changelog, the scan, ``get`` and a
    delete of a key held in Iceberg only answer as before."""
    gw = GatewayProcess(
        tmp_path / "gw",
        {"TIDEGATE_TIERING__INTERVAL_S": "0.5", "TIDEGATE_TIERING__HOT_RETENTION_S": "0"},
    ).start()
    try:
        with gw.client() as c:
            c.create_table("app.kv", SCHEMA, partitions=1, primary_key=["id", "region"])
            for v in range(3):
                c.append(
                    "app.kv", [{"id": i, "region": "eu", "v": v, "note": None} for i in range(4)]
                )
            deadline = time.monotonic() + 60
            while c.describe_table("app.kv").partition_info[0].tiered_watermark < 20:
                assert time.monotonic() < deadline, "the key table was never tiered"
                time.sleep(0.2)
            kv = c.describe_table("app.kv").partition_info[0]
            assert (kv.earliest_offset, kv.high_watermark) == (0, 20)  # no retention
            time.sleep(1.5)  # a few more passes (each trims the hot tier below 20)
            c.append("app.kv", [{"id": 0, "region": "eu", "_change": 3}])  # -D of (0, eu)
            model = {
                (i, "eu"): {"id": i, "region": "eu", "v": 2, "note": None} for i in range(1, 4)
            }
            changes = changelog(c, "app.kv", 1)
            assert [x["_change"] for x in changes[-1:]] == [3] and len(changes) == 21
            assert replay(changes) == model  # the -D carries the row held in Iceberg
            scanned = c.scan("app.kv").to_pylist()
            assert {(r["id"], r["region"]): {n: r[n] for n in USER} for r in scanned} == model
            got = c.get("app.kv", [{"id": i, "region": "eu"} for i in range(5)]).to_pylist()
            assert {(r["id"], r["region"]): {n: r[n] for n in USER} for r in got} == model
    finally:
        gw.stop()


def test_scans_and_lookups_answer_current_state(
    any_client: Any, http: httpx.Client, namespace: str
) -> None:
    table = f"{namespace}.state"
    any_client.create_table(
        table, SCHEMA, partitions=2, primary_key=["id", "region"], merge_engine="partial_update"
    )
    rng = random.Random(3)
    model: dict[Key, dict[str, Any]] = {}
    for step in range(20):
        rows: list[dict[str, Any]] = []
        for _ in range(rng.randint(1, 15)):
            key = (rng.randrange(30), rng.choice(["eu", "us"]))
            if rng.random() < 0.2:
                rows.append({"id": key[0], "region": key[1], "_change": 3})
                model.pop(key, None)
                continue
            note = None if key in model and rng.random() < 0.5 else f"s{step}"
            rows.append({"id": key[0], "region": key[1], "v": step, "note": note})
            had = model.get(key, {})
            model[key] = {"id": key[0], "region": key[1], "v": step,
                          "note": note if note is not None else had.get("note")}  # fmt: skip
        any_client.append(table, rows)
    scanned = any_client.scan(table).to_pylist()  # the plan is refused: the gateway scans
    assert len(scanned) == len(model)  # one row per live key
    assert {(r["id"], r["region"]): {n: r[n] for n in USER} for r in scanned} == model
    assert "_change" not in any_client.scan(table).column_names
    low = any_client.scan(table, columns=["id", "region"], filter="id < 10").to_pylist()
    assert sorted((r["id"], r["region"]) for r in low) == sorted(k for k in model if k[0] < 10)
    asked = [*rng.sample(sorted(model), min(5, len(model))), (999, "eu")]
    got = any_client.get(table, [{"id": i, "region": r} for i, r in asked]).to_pylist()
    assert {(r["id"], r["region"]): {n: r[n] for n in USER} for r in got} == {
        k: model[k] for k in asked if k in model
    }
    assert all(r["_offset"] >= 0 for r in got)
    ns, name = table.split(".")
    answer = http.post(
        f"/v1/tables/{ns}/{name}/lookup", json={"keys": [{"id": i, "region": r} for i, r in asked]}
    )
    assert answer.status_code == 200, answer.text
    assert {(r["id"], r["region"]): r["v"] for r in answer.json()["rows"]} == {
        k: model[k]["v"] for k in asked if k in model
    }
    bad = http.post(f"/v1/tables/{ns}/{name}/lookup", json={"keys": [{"id": 1}]})
    assert bad.status_code == 400
    assert "key 0 names ['id']; a key of" in bad.json()["error"]["message"]
    with pytest.raises(SchemaMismatch, match=r"key 0 names \['region'\]"):
        any_client.get(table, {"region": "eu"})
    # Keys as Arrow (a table or a batch of the key's columns, in any order, cast to the
    # key's types) find the same rows; a null, another column or a type that does not fit
    # is one sentence.
    arrow_keys = pa.table(
        {"region": [r for _, r in asked], "id": pa.array([i for i, _ in asked], pa.int32())}
    )
    assert sorted(map(str, any_client.get(table, arrow_keys).to_pylist())) == sorted(map(str, got))
    batch_keys = pa.record_batch({"id": [asked[0][0]], "region": [asked[0][1]]})
    assert any_client.get(table, batch_keys).num_rows == (1 if asked[0] in model else 0)
    with pytest.raises(SchemaMismatch, match=r"key column 'id' holds a null"):
        any_client.get(table, pa.table({"id": [1, None], "region": ["eu", "eu"]}))
    with pytest.raises(SchemaMismatch, match=r"the keys have the columns \['id'\]; a key of"):
        any_client.get(table, pa.table({"id": [1]}))
    with pytest.raises(SchemaMismatch, match=r"key column 'id' is string, which does not fit"):
        any_client.get(table, pa.table({"id": ["one"], "region": ["eu"]}))
    live = next(iter(model))
    any_client.delete(table, pa.table({"id": [live[0]], "region": [live[1]]}))
    assert any_client.get(table, {"id": live[0], "region": live[1]}).num_rows == 0


def test_the_idempotent_producer_upserts(client: Client, namespace: str) -> None:
    """The SDK's batching producer (idempotent, routed by key) sends upserts; every
    batch is resolved and the changelog replays to the last row per key."""
    table = f"{namespace}.prod"
    client.create_table(table, SCHEMA, partitions=2, primary_key=["id", "region"])
    model: dict[Key, dict[str, Any]] = {}
    with client.producer(table, linger=0.001, batch_records=7) as producer:
        futures = []
        for i in range(60):
            row = {"id": i % 13, "region": "eu", "v": i, "note": None}
            model[(row["id"], "eu")] = row
            futures.append(producer.send(row))
        producer.flush()
        for f in futures:
            f.result(30)
    assert replay(changelog(client, table, 2)) == model


def test_plans_of_a_key_table_are_refused_in_one_sentence(
    client: Client, http: httpx.Client, namespace: str
) -> None:
    """Its hot ranges hold changes, not rows: neither the gateway's read plan nor the
    REST catalog's server-side plan is served (the SDK's auto scan falls back to the
    gateway's scan, which answers current state: see above)."""
    client.create_table(f"{namespace}.kp", SCHEMA, primary_key=["id", "region"])
    client.append(f"{namespace}.kp", [{"id": 1, "region": "eu", "v": 1, "note": None}])
    got = http.post(f"/v1/tables/{namespace}/kp/plan", json={})
    assert got.status_code == 501, got.text
    assert (
        "has a primary key: its current state is answered by the gateway's scan"
        in (got.json()["error"]["message"])
    )
    with pytest.raises(Unimplemented, match="not a read plan"):
        client.scan(f"{namespace}.kp", mode="client")
    catalog = http.post(f"/iceberg/v1/namespaces/{namespace}/tables/kp/plan", json={})
    assert catalog.status_code == 501, catalog.text
    assert "its current state is not planned for engines" in catalog.text


@pytest.mark.parametrize("kind", ["disk", "redis"])
def test_kill_9_while_writing_applies_every_batch_once(
    kind: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """An idempotent writer of upserts and deletes whose gateway is killed (-9) while a
    batch is in flight, three times: it sends that batch again to the restarted gateway
    (answered as stored if it was, applied if not) and goes on. The changelog replays
    to the model of every batch applied once."""
    redis = request.getfixturevalue("redis_server") if kind == "redis" else None
    env = gateway_env(kind, redis)
    gw = GatewayProcess(tmp_path / "gw", env).start()
    table = f"keykill{kind}.t"
    rng = random.Random(13)
    model: dict[Key, dict[str, Any]] = {}
    batches: list[list[dict[str, Any]]] = []
    for s in range(40):
        rows: list[dict[str, Any]] = []
        for _ in range(rng.randint(1, 12)):
            key = (rng.randrange(25), "eu")
            if rng.random() < 0.25:
                rows.append({"id": key[0], "region": "eu", "_change": 3})
                model.pop(key, None)
            else:
                row = {"id": key[0], "region": "eu", "v": s, "note": f"{s}"}
                rows.append(row)
                model[key] = row
        batches.append(rows)
    # The changes the batches make applied once each (last_row): a batch applied twice
    # would add its upserts' -U/+U pairs again.
    state: set[Key] = set()
    expected = 0
    for rows in batches:
        for row in rows:
            key = (row["id"], "eu")
            if row.get("_change") == 3:
                expected += key in state
                state.discard(key)
            else:
                expected += 2 if key in state else 1
                state.add(key)
    kills = {8, 19, 31}
    try:
        with gw.client() as c:
            c.create_table(table, SCHEMA, partitions=1, primary_key=["id", "region"])
        for seq, rows in enumerate(batches):
            if seq in kills:
                with gw.client(connect_timeout=2, timeout=3, retry=Retry.none()) as c:
                    c.describe_table(table)  # connected: the kill lands in the append
                    killer = threading.Timer(rng.uniform(0.0, 0.01), gw.kill)
                    killer.start()
                    with contextlib.suppress(Exception):
                        c.append(table, rows, producer_id="w", sequence=seq)
                    killer.join()
                gw = GatewayProcess(
                    tmp_path / "gw", env, tenant=gw.tenant, api_key=gw.api_key
                ).start()
            with gw.client() as c:
                c.append(table, rows, producer_id="w", sequence=seq)
        with gw.client() as c:
            changes = changelog(c, table, 1)
            assert replay(changes) == model
            assert len(changes) == expected
    finally:
        gw.stop()
