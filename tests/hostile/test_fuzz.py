"""Issue 18: a fuzz suite over both edges of a real gateway, with a fixed seed and a
bounded budget. Nothing a tenant sends may answer 5xx / INTERNAL or crash the process.

- HTTP: schemathesis, from the gateway's own OpenAPI document, positive and negative data,
  with a valid tenant key and, half the time, the real table's names in the path (so
  requests reach the data routes instead of answering 404);
- Arrow bodies: valid streams of random tables, then mutated (bytes flipped, cut,
  repeated, spliced) and sent to both edges;
- filter strings: random mixes of the filter language's tokens, on both edges;
- gRPC: request messages of every data-plane RPC with random fields;
- Kafka: valid frames of the APIs the listener serves, mutated (bytes flipped, cut,
  spliced, zeroed) and sent over an authenticated connection: each is answered without
  UNKNOWN_SERVER_ERROR or its connection closed, and the listener serves on.

The budget is ``TIDEGATE_FUZZ_EXAMPLES`` examples per part (60 by default, what CI runs).
The long mode is ``make fuzz`` (10,000 per part); the counts are printed at the end.
"""

from __future__ import annotations

import json
import os
import random
import struct
import uuid
from collections import Counter
from collections.abc import Iterator
from typing import Any

import grpc
import httpx
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, seed, settings
from hypothesis import strategies as st
from kio.index import load_request_schema, load_response_schema
from kio.serial import entity_reader

from gateway.server.kafka.protocol import build, first_error
from gateway.wire._proto.tidegate.v1 import tidegate_pb2 as pb
from gateway.wire._proto.tidegate.v1 import tidegate_pb2_grpc as pb_grpc
from gateway.wire.codec import encode_stream
from tests.hostile.conftest import ARROW, Tenant, new_tenant
from tests.kafka.conftest import KafkaTarget
from tests.kafka.raw import RawKafka, encode_request, produce_records, record_batch
from tests.kafka.test_edges import fetch_request, list_offsets_request, metadata_request
from tests.services import GatewayProcess

EXAMPLES = int(os.environ.get("TIDEGATE_FUZZ_EXAMPLES", "60"))
FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=None,
    derandomize=False,
    suppress_health_check=list(HealthCheck),
    database=None,
)
SCHEMA = {
    "id": "int64",
    "name": "string",
    "price": "decimal128(10, 2)",
    "at": "timestamp[us, tz=UTC]",
    "tags": "list<int32>",
    "info": "struct<k: string, n: int16>",
    "blob": "binary",
    "f": "float32",
}
#: Counts per edge, printed at the end of the module (the long mode's report).
COUNTS: Counter[str] = Counter()


@pytest.fixture
def fuzz_tenant(hostile_gateway: GatewayProcess) -> Iterator[Tenant]:
    """A tenant of its own per test, with table app.ev (the HTTP fuzz may drop it)."""
    t = new_tenant(hostile_gateway, "fz")
    with t.http() as http:
        r = http.post(
            "/v1/tables",
            json={"namespace": "app", "name": "ev", "schema": SCHEMA, "partitions": 2},
        )
        assert r.status_code == 201, r.text
        rows = [
            {"id": i, "name": f"n{i}", "price": "1.50", "at": "2024-01-01T00:00:00Z",
             "tags": [i], "info": {"k": "x", "n": 1}, "blob": "AAE=", "f": 0.5}
            for i in range(20)
        ]  # fmt: skip
        assert http.post("/v1/tables/app/ev/records", json={"rows": rows}).status_code == 200
    yield t
    print(f"\nfuzz requests so far: {dict(COUNTS)}")


def alive(t: Tenant) -> None:
    assert t.gw.proc is not None and t.gw.proc.poll() is None, t.gw.log()
    with t.gw.http_client(api_key=None) as h:
        assert h.get("/healthz").status_code == 200


def check_http(r: httpx.Response | Any, what: str) -> None:
    COUNTS["http"] += 1
    assert r.status_code < 500, (what, r.status_code, r.text[:500])


def check_grpc(fn: Any, what: str) -> None:
    COUNTS["grpc"] += 1
    try:
        result = fn()
        if hasattr(result, "__iter__") and not isinstance(result, bytes | str):
            for _ in result:
                pass
    except grpc.RpcError as exc:
        assert exc.code() not in (grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN), (
            what,
            exc.code(),
            exc.details(),
        )


# HTTP: schemathesis --------------------------------------------------------------------
def openapi_cases(t: Tenant, real: dict[str, Any], select: Any) -> st.SearchStrategy[Any]:
    """Requests made from the gateway's OpenAPI document (the operations ``select`` keeps),
    positive and negative, half of them with the ``real`` names in the path (so they reach
    the routes' work instead of answering 404)."""
    import schemathesis

    with t.gw.http_client(api_key=None) as h:
        doc = h.get("/openapi.json").json()
    schema = select(schemathesis.openapi.from_dict(doc))
    return st.one_of(
        schema.as_strategy(schemathesis.GenerationMode.POSITIVE),
        schema.as_strategy(schemathesis.GenerationMode.NEGATIVE),
        schema.as_strategy(schemathesis.GenerationMode.POSITIVE, path_parameters=real),
        schema.as_strategy(schemathesis.GenerationMode.NEGATIVE, path_parameters=real),
    )


def test_http_api_fuzzed_from_its_openapi_document(fuzz_tenant: Tenant) -> None:
    t = fuzz_tenant
    real = {"namespace": "app", "name": "ev", "partition": 0, "group": "g1"}
    cases = openapi_cases(t, real, lambda s: s.exclude(path_regex="^/v1/admin"))
    headers = {"authorization": f"Bearer {t.key}"}

    @seed(18)
    @FUZZ
    @given(case=cases)
    def run(case: Any) -> None:
        if case.path_parameters and case.path_parameters.get("follow") is not None:
            return
        query = dict(case.query or {})
        if str(query.get("follow", "")).lower() in ("true", "1"):
            query["wait_ms"] = 0  # a long poll would only wait
            case.query = query
        r = case.call(base_url=t.gw.http_url, headers=headers, timeout=30)
        check_http(r, f"{case.method} {case.formatted_path} {str(case.body)[:200]}")

    run()
    alive(t)


# Arrow bodies ------------------------------------------------------------------------
def _batch(n: int, rnd: random.Random) -> pa.RecordBatch:
    return pa.record_batch(
        {
            "id": pa.array([rnd.randrange(-(2**40), 2**40) for _ in range(n)], pa.int64()),
            "name": pa.array([f"n{rnd.random()}" for _ in range(n)]),
        }
    )


@st.composite
def mutated_bodies(draw: st.DrawFn) -> bytes:
    rnd = random.Random(draw(st.integers(0, 2**32)))
    batch = _batch(draw(st.integers(1, 50)), rnd)
    body = bytearray(
        encode_stream([batch], batch.schema, draw(st.sampled_from(["none", "zstd", "lz4"])))
    )
    for _ in range(draw(st.integers(1, 4))):
        kind = draw(st.sampled_from(["flip", "cut", "repeat", "splice", "zero"]))
        if not body:
            break
        at = draw(st.integers(0, len(body) - 1))
        if kind == "flip":
            body[at] ^= 1 << draw(st.integers(0, 7))
        elif kind == "cut":
            del body[at:]
        elif kind == "repeat":
            body += body[at:]
        elif kind == "splice":
            body[at:at] = draw(st.binary(min_size=1, max_size=32))
        else:
            end = min(len(body), at + draw(st.integers(1, 16)))
            body[at:end] = bytes(end - at)
    return bytes(body)


def test_mutated_arrow_bodies_on_both_edges(hostile_gateway: GatewayProcess) -> None:
    t = new_tenant(hostile_gateway, "fa")
    with t.http() as http:
        r = http.post(
            "/v1/tables",
            json={
                "namespace": "a",
                "name": "t",
                "schema": {"id": "int64", "name": "string"},
                "partitions": 1,
            },
        )
        assert r.status_code == 201
    stub = t.stub()
    ref = pb.TableRef(namespace="a", name="t")

    @seed(18)
    @FUZZ
    @given(body=mutated_bodies())
    def run(body: bytes) -> None:
        with t.http() as http:
            r = http.post("/v1/tables/a/t/records", content=body, headers={"content-type": ARROW})
            check_http(r, "append")
        check_grpc(lambda: stub.Append(pb.AppendRequest(table=ref, arrow_ipc=body)), "Append")

    run()
    # Whatever was accepted reads back, as Arrow and as JSON.
    with t.http() as http:
        r = http.get("/v1/tables/a/t/partitions/0/records", params={"max_records": 100_000})
        check_http(r, "read back")
        assert r.status_code == 200
    alive(t)


# Filters -----------------------------------------------------------------------------
TOKENS = [
    "id", "name", "price", "at", "tags", "info", "blob", "f", "_offset", "_partition",
    "_timestamp", "nope", '"id"', "and", "or", "not", "in", "is", "null", "nan", "like",
    "true", "false", "(", ")", ",", "=", "==", "!=", "<>", "<", "<=", ">", ">=", "1", "-1",
    "1.5", "1e400", "99999999999999999999999", "'x'", "'pre%'", "'%'", "'_'", "''",
    "'2024-01-01'", "'2024-01-01T00:00:00Z'", "'nan'", "'\\ud800'", "\x00", "'", '"',
]  # fmt: skip


def test_random_filters_on_both_edges(fuzz_tenant: Tenant) -> None:
    t = fuzz_tenant
    stub = t.stub()
    ref = pb.TableRef(namespace="app", name="ev")

    @seed(18)
    @FUZZ
    @given(words=st.lists(st.sampled_from(TOKENS), min_size=1, max_size=25))
    def run(words: list[str]) -> None:
        text = " ".join(words)
        with t.http() as http:
            r = http.post("/v1/tables/app/ev/scan", json={"filter": text, "limit": 5})
            check_http(r, text)
            assert r.status_code in (200, 400), (text, r.text)
        check_grpc(lambda: stub.Scan(pb.ScanRequest(table=ref, filter=text, limit=5)), text)

    run()
    alive(t)


# gRPC messages -------------------------------------------------------------------------
names = st.one_of(st.sampled_from(["app", "ev", "x"]), st.text(max_size=12))
refs = st.builds(pb.TableRef, namespace=names, name=names)
i64 = st.integers(-(2**63), 2**63 - 1)
i32 = st.integers(-(2**31), 2**31 - 1)
small = st.integers(-5, 5)


def requests() -> st.SearchStrategy[tuple[str, Any]]:
    return st.one_of(
        st.tuples(st.just("CreateTable"), st.builds(
            pb.CreateTableRequest, table=refs,
            fields=st.lists(st.builds(pb.Field, name=names, type=st.one_of(
                st.sampled_from(list(SCHEMA.values())), st.text(max_size=30)),
                nullable=st.booleans()), max_size=4),
            partitions=st.integers(-3, 5000), key_columns=st.lists(names, max_size=2))),
        st.tuples(st.just("DescribeTable"), st.builds(pb.DescribeTableRequest, table=refs)),
        st.tuples(st.just("ListTables"), st.builds(pb.ListTablesRequest, namespace=names)),
        st.tuples(st.just("Read"), st.builds(
            pb.ReadRequest, table=refs, partition=st.one_of(small, i32),
            offset=st.one_of(small, i64), max_records=st.one_of(small, i64),
            max_bytes=st.one_of(small, i64), follow=st.just(False))),
        st.tuples(st.just("OffsetsForTimes"), st.builds(
            pb.OffsetsForTimesRequest, table=refs, timestamp_us=i64,
            partitions=st.lists(i32, max_size=3))),
        st.tuples(st.just("CommitOffsets"), st.builds(
            pb.CommitOffsetsRequest, group=names, table=refs,
            offsets=st.lists(
                st.builds(pb.PartitionOffset, partition=small, offset=i64), max_size=3),
            member_id=st.one_of(st.just(""), names), generation=st.one_of(small, i64))),
        st.tuples(st.just("GroupHeartbeat"), st.builds(
            pb.GroupHeartbeatRequest, group=names, table=refs,
            member_id=st.one_of(st.just(""), names, st.text(min_size=200, max_size=300)),
            generation=st.one_of(small, i64), owned=st.lists(st.one_of(small, i32), max_size=3),
            session_timeout_ms=st.one_of(small, i32), leave=st.booleans(),
            client_id=st.text(max_size=20))),
        st.tuples(st.just("DescribeGroup"), st.builds(
            pb.DescribeGroupRequest, group=names, table=refs)),
        st.tuples(st.just("FetchOffsets"), st.builds(
            pb.FetchOffsetsRequest, group=names, table=refs,
            partitions=st.lists(small, max_size=3))),
        st.tuples(st.just("Scan"), st.builds(
            pb.ScanRequest, table=refs, columns=st.lists(names, max_size=3),
            filter=st.one_of(st.just(""), st.text(max_size=40)),
            as_of=st.one_of(st.just(""), st.text(max_size=30), i64.map(str)),
            limit=st.one_of(st.none(), i64))),
        st.tuples(st.just("PlanRead"), st.builds(
            pb.PlanReadRequest, table=refs, filter=st.text(max_size=40),
            as_of=st.one_of(st.just(""), st.text(max_size=30)))),
        st.tuples(st.just("Append"), st.builds(
            pb.AppendRequest, table=refs, arrow_ipc=st.binary(max_size=200),
            partition=st.one_of(st.none(), small), producer_id=st.text(max_size=10),
            sequence=st.one_of(st.none(), i64))),
    )  # fmt: skip


def test_grpc_request_messages(fuzz_tenant: Tenant) -> None:
    t = fuzz_tenant
    stub = pb_grpc.TidegateStub(t.gw.channel(api_key=t.key))

    @seed(18)
    @FUZZ
    @given(call=requests())
    def run(call: tuple[str, Any]) -> None:
        method, request = call
        if method == "DropTable":  # pragma: no cover - not generated: keep the table
            return
        check_grpc(lambda: getattr(stub, method)(request, timeout=30), f"{method} {request}")

    run()
    alive(t)


# The Iceberg REST catalog (issue 27) ----------------------------------------------------
OAUTH_ERRORS = {
    "invalid_request",
    "invalid_client",
    "invalid_grant",
    "unauthorized_client",
    "unsupported_grant_type",
    "invalid_scope",
}


def check_iceberg(r: httpx.Response, what: str) -> None:
    """Not a 5xx, and an error in the Iceberg spec's shape (``{"error": {message, type,
    code}}``; HEAD answers carry no body)."""
    check_http(r, what)
    if r.status_code >= 400 and r.request.method != "HEAD":
        err = r.json()["error"]
        assert err["code"] == r.status_code and err["type"] and err["message"], (what, r.text)


def test_iceberg_catalog_fuzzed_from_its_openapi_document(fuzz_tenant: Tenant) -> None:
    t = fuzz_tenant
    real = {"namespace": "app", "table": "ev"}
    cases = openapi_cases(t, real, lambda s: s.include(path_regex="^/iceberg/"))
    headers = {"authorization": f"Bearer {t.key}"}

    @seed(27)
    @FUZZ
    @given(case=cases)
    def run(case: Any) -> None:
        r = case.call(base_url=t.gw.http_url, headers=headers, timeout=30)
        what = f"{case.method} {case.formatted_path} {str(case.body)[:200]}"
        if case.formatted_path.endswith("/oauth/tokens"):
            check_http(r, what)
            if r.status_code >= 400:
                assert r.json()["error"] in OAUTH_ERRORS, (what, r.text)
        else:
            check_iceberg(r, what)

    run()
    with t.http() as http:  # the table is intact: every change was refused
        assert http.get("/iceberg/v1/namespaces/app/tables/ev").status_code == 200
    alive(t)


def test_iceberg_scan_plans_fuzzed_from_the_openapi_document(fuzz_tenant: Tenant) -> None:
    """Issue 40: the planning routes (plan, fetch, cancel, tasks), half the time on the real
    table and with a real plan id. No 5xx; errors in the spec's shape; every 200 answer
    parses as pyiceberg 0.12 (the client that plans on the server) reads it."""
    from pydantic import TypeAdapter
    from pyiceberg.catalog.rest.scan_planning import PlanningResponse, ScanTasks

    t = fuzz_tenant
    with t.http() as http:
        r = http.post("/iceberg/v1/namespaces/app/tables/ev/plan", json={})
        assert r.status_code == 200, r.text
        plan_id = r.json()["plan-id"]
    real = {"namespace": "app", "table": "ev", "plan_id": plan_id}
    cases = openapi_cases(t, real, lambda s: s.include(path_regex="^/iceberg/.*/(plan|tasks)"))
    headers = {"authorization": f"Bearer {t.key}"}
    planning = TypeAdapter(PlanningResponse)

    @seed(40)
    @FUZZ
    @given(case=cases)
    def run(case: Any) -> None:
        r = case.call(base_url=t.gw.http_url, headers=headers, timeout=30)
        check_iceberg(r, f"{case.method} {case.formatted_path} {str(case.body)[:200]}")
        if r.status_code == 200:
            assert "application/json" in str(r.headers["content-type"]), r.headers
            if case.formatted_path.endswith("/tasks"):
                ScanTasks.model_validate_json(r.text)
            else:
                planning.validate_json(r.text)

    run()
    alive(t)


form_values = st.one_of(
    st.sampled_from(
        ["client_credentials", "urn:ietf:params:oauth:grant-type:token-exchange", "", "catalog"]
    ),
    st.text(max_size=64),
)


@st.composite
def token_requests(draw: st.DrawFn) -> tuple[bytes, dict[str, str]]:
    fields = draw(
        st.dictionaries(
            st.sampled_from(
                ["grant_type", "client_id", "client_secret", "scope", "subject_token",
                 "subject_token_type", "x"]
            ) | st.text(max_size=8),
            form_values,
            max_size=6,
        )
    )  # fmt: skip
    from urllib.parse import urlencode

    body = urlencode(fields).encode()
    if draw(st.booleans()):
        body = draw(st.binary(max_size=256)) if draw(st.booleans()) else body + b"&%ff=%"
    headers = {
        "content-type": draw(
            st.sampled_from(
                ["application/x-www-form-urlencoded", "application/json", "text/plain", ""]
            )
        )
    }
    auth = draw(st.one_of(st.none(), st.text(max_size=40), st.sampled_from(["Basic", "Basic !"])))
    if auth is not None and auth.isascii() and "\n" not in auth and "\r" not in auth:
        headers["authorization"] = auth
    return body, headers


def test_iceberg_token_requests_fuzzed(fuzz_tenant: Tenant) -> None:
    t = fuzz_tenant

    @seed(27)
    @FUZZ
    @given(request=token_requests())
    def run(request: tuple[bytes, dict[str, str]]) -> None:
        body, headers = request
        with t.gw.http_client(api_key=None) as h:
            r = h.post("/iceberg/v1/oauth/tokens", content=body, headers=headers)
        check_http(r, f"{headers} {body[:100]!r}")
        assert r.status_code in (200, 400, 401, 413), r.text
        if r.status_code != 200:
            assert r.json()["error"] in OAUTH_ERRORS, r.text

    run()
    alive(t)


def test_iceberg_odd_names_in_paths(fuzz_tenant: Tenant) -> None:
    t = fuzz_tenant
    names = st.one_of(st.text(min_size=1, max_size=300), st.sampled_from(["app", "ev"]))

    @seed(27)
    @FUZZ
    @given(namespace=names, table=names, method=st.sampled_from(["GET", "HEAD", "POST", "DELETE"]))
    def run(namespace: str, table: str, method: str) -> None:
        from urllib.parse import quote

        path = f"/iceberg/v1/namespaces/{quote(namespace, safe='')}/tables/{quote(table, safe='')}"
        with t.http() as http:
            r = http.request(method, path)
        check_iceberg(r, f"{method} {path[:200]}")

    run()
    alive(t)


# The Kafka listener (issue 41) -------------------------------------------------------------
def kafka_frames(topic: str) -> list[bytes]:
    """Valid requests (without their length prefix) of the APIs the listener serves, on
    ``topic``: a fuzzed one may be any of them at any version, or none."""
    row = json.dumps({"id": 1, "name": "n", "price": "1.50", "at": "2024-01-01T00:00:00Z"})
    batch = record_batch([row.encode()] * 3)
    idempotent = record_batch([row.encode()], producer_id=7, epoch=0, sequence=0)
    requests: list[Any] = [
        produce_records(topic, 0, batch),
        produce_records(topic, 1, idempotent),
        fetch_request(topic, 0, 0),
        metadata_request([topic]),
        list_offsets_request(topic, -2),
        build(load_request_schema(22, 4), {"transactional_id": None, "producer_id": -1,
                                           "producer_epoch": -1}),
        build(load_request_schema(10, 4), {"key_type": 0, "coordinator_keys": ["fz"]}),
        build(load_request_schema(16, 4), {}),
        build(load_request_schema(11, 5), {"group_id": "fz", "session_timeout": 6000,
                                           "rebalance_timeout": 6000, "member_id": "",
                                           "protocol_type": "consumer",
                                           "protocols": [{"name": "range", "metadata": b"m"}]}),
        # The admin APIs: configs, partitions, the cluster, committed offsets.
        build(load_request_schema(32, 4), {"resources": [{"resource_type": 2,
                                                          "resource_name": topic,
                                                          "configuration_keys": None}]}),
        build(load_request_schema(44, 1), {"resources": [{
            "resource_type": 2, "resource_name": topic,
            "configs": [{"name": "retention.ms", "config_operation": 0,
                         "value": "86400000"}]}]}),
        build(load_request_schema(37, 3), {"topics": [{"name": topic, "count": 3,
                                                       "assignments": None}]}),
        build(load_request_schema(60, 2), {"include_cluster_authorized_operations": True}),
        build(load_request_schema(47, 0), {"group_id": "fz", "topics": [
            {"name": topic, "partitions": [{"partition_index": 0}]}]}),
        # KIP-848's consumer groups: a join, a member's heartbeat and commit, a describe.
        build(load_request_schema(68, 1), {"group_id": "fz848", "member_id": "m",
                                           "member_epoch": 0, "rebalance_timeout": 6000,
                                           "subscribed_topic_names": [topic],
                                           "topic_partitions": []}),
        build(load_request_schema(68, 1), {"group_id": "fz848", "member_id": "m",
                                           "member_epoch": 1, "rebalance_timeout": -1,
                                           "subscribed_topic_names": None,
                                           "topic_partitions": [{"topic_id": uuid.UUID(int=848),
                                                                 "partitions": [0, 1]}]}),
        build(load_request_schema(8, 9), {"group_id": "fz848", "member_id": "m",
                                          "generation_id_or_member_epoch": 1, "topics": [
            {"name": topic, "partitions": [{"partition_index": 0, "committed_offset": 0}]}]}),
        build(load_request_schema(9, 9), {"groups": [
            {"group_id": "fz848", "member_id": "m", "member_epoch": 1,
             "topics": [{"name": topic, "partition_indexes": [0, 1]}]},
            {"group_id": "fz", "member_id": None, "member_epoch": -1, "topics": None}]}),
        build(load_request_schema(69, 1), {"group_ids": ["fz848", "fz"],
                                           "include_authorized_operations": True}),
    ]  # fmt: skip
    return [encode_request(r, i + 1) for i, r in enumerate(requests)]


@st.composite
def mutated_frames(draw: st.DrawFn, frames: list[bytes]) -> bytes:
    frame = bytearray(draw(st.sampled_from(frames)))
    for _ in range(draw(st.integers(1, 4))):
        kind = draw(st.sampled_from(["flip", "cut", "splice", "zero"]))
        at = draw(st.integers(0, max(0, len(frame) - 1)))
        if kind == "flip" and frame:
            frame[at] ^= 1 << draw(st.integers(0, 7))
        elif kind == "cut":
            del frame[max(8, at) :]
        elif kind == "splice":
            frame[at:at] = draw(st.binary(min_size=1, max_size=32))
        else:
            end = min(len(frame), at + draw(st.integers(1, 16)))
            frame[at:end] = bytes(end - at)
    return bytes(frame)


def test_mutated_kafka_frames_on_the_listener(fuzz_tenant: Tenant) -> None:
    t = fuzz_tenant
    gw = t.gw
    target = KafkaTarget(gw, f"127.0.0.1:{gw.kafka_port}", t.name, t.key)
    conn: list[RawKafka] = []
    logged = gw.log_path.stat().st_size

    def connection() -> RawKafka:
        if not conn:
            raw = RawKafka(target, timeout=5)
            assert raw.authenticate(t.name, t.key).error_code == 0
            conn.append(raw)
        return conn[0]

    def drop() -> None:
        conn.pop().close()

    @seed(41)
    @FUZZ
    @given(frame=mutated_frames(kafka_frames("app.ev")))
    def run(frame: bytes) -> None:
        COUNTS["kafka"] += 1
        raw = connection()
        api_key, version = struct.unpack_from(">hh", frame) if len(frame) >= 4 else (-1, -1)
        try:
            raw.send_bytes(struct.pack(">i", len(frame)) + frame)
            answer = raw.read_frame()
        except (TimeoutError, ConnectionError, OSError):
            # Closed as Kafka closes it (a frame it cannot answer), or not answered (a
            # Produce whose acks became 0, a long poll): a new connection goes on.
            drop()
            return
        COUNTS["kafka answered"] += 1
        # An ApiVersions of a version not served is answered in v0 (Kafka's way).
        cls = load_response_schema(api_key, 0 if api_key == 18 and version > 3 else version)
        _, at = entity_reader(cls.__header_schema__)(answer, 0)
        body, _ = entity_reader(cls)(answer, at)
        assert first_error(body) != "unknown_server_error", (frame, body)

    try:
        run()
    finally:
        for raw in conn:
            raw.close()
    assert COUNTS["kafka answered"] > 0  # some reached the APIs, not only the framing
    # Nothing failed inside the gateway (an error it did not expect is logged so).
    with gw.log_path.open("rb") as log:
        log.seek(logged)
        assert b"unexpected error in a Kafka" not in log.read()
    with RawKafka(target) as raw:  # the listener serves on
        assert raw.authenticate(t.name, t.key).error_code == 0
        assert raw.call(metadata_request(["app.ev"])).topics[0].error_code == 0
    alive(t)
