"""Issue 33.6: a schema is bounded in total (fields at every depth, characters of names,
types and docs), its refusal is cheap and one sentence, and schema work runs off the
event loop, so one tenant's giant schema does not stall another tenant's appends."""

from __future__ import annotations

import threading

import grpc
import pytest

from gateway.wire._proto.tidegate.v1 import tidegate_pb2 as pb
from gateway.wire.schema import MAX_FIELDS, MAX_SCHEMA_CHARS
from tests.hostile.conftest import grpc_error, http_error, new_tenant, table_ref
from tests.services import GatewayProcess

pytestmark = pytest.mark.integration


def _struct(n: int) -> str:
    return "struct<" + ", ".join(f"f{i}: int8" for i in range(n)) + ">"


#: The probe's schema: 150 struct columns of 1,345 fields each, 201,750 leaves, 2.4 MB.
HUGE = [{"name": f"c{i}", "type": _struct(1345)} for i in range(150)]
#: Under the character bound, over the field bound: 20 x 301 fields.
MANY = [{"name": f"c{i}", "type": _struct(300)} for i in range(20)]


def test_an_oversized_schema_is_refused_while_another_tenant_appends(
    hostile_gateway: GatewayProcess,
) -> None:
    attacker, calm = new_tenant(hostile_gateway, "sa"), new_tenant(hostile_gateway, "sc")
    with calm.http() as http:
        r = http.post(
            "/v1/tables",
            json={"namespace": "c", "name": "t", "schema": {"v": "int64"}, "partitions": 1},
        )
        assert r.status_code == 201
    statuses: list[int] = []
    stop = threading.Event()

    def append() -> None:  # the calm tenant appends throughout
        with calm.http(timeout=30) as http:
            while not stop.is_set():
                r = http.post("/v1/tables/c/t/records", json={"rows": [{"v": len(statuses)}]})
                statuses.append(r.status_code)

    appender = threading.Thread(target=append, daemon=True)
    appender.start()
    try:
        with attacker.http(timeout=60) as http:
            for _ in range(3):
                body = {"namespace": "a", "name": "t", "schema": HUGE, "partitions": 1}
                status, reason, message = http_error(http.post("/v1/tables", json=body))
                assert (status, reason) == (400, "INVALID_SCHEMA"), message
                assert f"at most {MAX_SCHEMA_CHARS} are accepted" in message
            body = {"namespace": "a", "name": "t", "schema": MANY, "partitions": 1}
            status, reason, message = http_error(http.post("/v1/tables", json=body))
            assert (status, reason) == (400, "INVALID_SCHEMA")
            assert f"more than {MAX_FIELDS} fields" in message and "'c13'" in message
            # Grown by schema changes instead: the same bounds on the result.
            small = {"namespace": "a", "name": "s", "schema": {"v": "int64"}, "partitions": 1}
            assert http.post("/v1/tables", json=small).status_code == 201
            changes = [
                {"op": "add_column", "column": f"c{i}", "type": _struct(300)} for i in range(20)
            ]
            status, reason, message = http_error(
                http.post("/v1/tables/a/s/schema", json={"changes": changes})
            )
            assert (status, reason) == (400, "SCHEMA_CHANGE_REFUSED")
            assert f"more than {MAX_FIELDS} fields" in message
            assert [t["name"] for t in http.get("/v1/tables").json()["tables"]] == ["s"]
        fields = [pb.Field(name=f["name"], type=f["type"], nullable=True) for f in HUGE]
        code, reason, message = grpc_error(
            lambda: attacker.stub().CreateTable(
                pb.CreateTableRequest(table=table_ref("a", "g"), fields=fields, partitions=1)
            )
        )
        assert (code, reason) == (grpc.StatusCode.INVALID_ARGUMENT, "INVALID_SCHEMA")
        assert f"at most {MAX_SCHEMA_CHARS} are accepted" in message
    finally:
        stop.set()
        appender.join(30)
    # Every append of the calm tenant went through meanwhile.
    assert statuses and set(statuses) == {200}, statuses[-5:]
