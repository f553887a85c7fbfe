"""Declaring primary-key tables (issue 42) through the SDK, HTTP and the CLI, on both hot
tiers: the key and merge engine are stored, described and immutable, the key's columns
are non-null and route rows, and every bad declaration is one clear sentence."""

from __future__ import annotations

import json
import re
import uuid
from typing import Any

import httpx
import pytest

from gateway.client import Client, InvalidSchema, SchemaChangeRefused
from tests.integration.test_cli import tidegate
from tests.services import GatewayProcess

pytestmark = pytest.mark.integration

SCHEMA = {"id": "int64", "region": "string", "v": "int64", "balance": "double"}


def test_a_key_table_is_declared_and_described_by_every_edge(
    client: Client, http: httpx.Client, namespace: str
) -> None:
    info = client.create_table(
        f"{namespace}.accounts",
        SCHEMA,
        partitions=4,
        primary_key=["id", "region"],
        merge_engine={"type": "versioned", "column": "v"},
    )
    assert info.primary_key == ("id", "region")
    assert info.merge_engine == {"type": "versioned", "column": "v"}
    # Rows route by the key unless told otherwise, so a key's versions meet in a partition.
    assert info.key_columns == ("id", "region")
    nullable = {f.name: f.nullable for f in info.fields}
    assert nullable == {"id": False, "region": False, "v": True, "balance": True}

    described = http.get(f"/v1/tables/{namespace}/accounts").json()
    assert described["primary_key"] == ["id", "region"]
    assert described["merge_engine"] == {"type": "versioned", "column": "v"}
    assert client.describe_table(f"{namespace}.accounts").primary_key == ("id", "region")

    made = http.post(
        "/v1/tables",
        json={
            "namespace": namespace,
            "name": "devices",
            "schema": SCHEMA,
            "partitions": 2,
            "primary_key": ["id", "region"],
            "key_columns": ["id"],
        },
    )
    assert made.status_code == 201, made.text
    body = made.json()
    assert (body["primary_key"], body["key_columns"]) == (["id", "region"], ["id"])
    assert body["merge_engine"] == {"type": "last_row"}

    # A key table takes writes as upserts (tests/integration/test_key_writes.py).
    row = {"id": 1, "region": "eu", "v": 1, "balance": 2.5}
    client.append(f"{namespace}.accounts", [row])
    assert sum(client.describe_table(f"{namespace}.accounts").high_watermarks) == 1

    plain = client.create_table(f"{namespace}.events", SCHEMA)
    assert (plain.primary_key, plain.merge_engine) == ((), None)
    assert http.get(f"/v1/tables/{namespace}/events").json()["merge_engine"] is None


@pytest.mark.parametrize(
    ("declaration", "message"),
    [
        ({"primary_key": ["balance"]}, r"primary key column 'balance' is double; a key column"),
        ({"primary_key": ["nope"]}, r"primary key column 'nope' is not a column of the schema"),
        ({"primary_key": ["id", "id"]}, r"primary key column 'id' is named twice"),
        ({"merge_engine": "first_row"}, r"a merge engine is declared with a primary key"),
        (
            {"primary_key": ["id"], "merge_engine": "newest"},
            r"merge engine 'newest' is unknown; last_row, first_row, versioned",
        ),
        (
            {"primary_key": ["id"], "merge_engine": {"type": "versioned", "column": "region"}},
            r"version column 'region' is string; a version is an integer, date32 or timestamp",
        ),
        (
            {"primary_key": ["id"], "key_columns": ["region"]},
            r"key column 'region' is not in the primary key \(id\)",
        ),
    ],
)
def test_a_bad_declaration_is_refused_in_one_sentence_and_creates_nothing(
    client: Client, http: httpx.Client, namespace: str, declaration: dict[str, Any], message: str
) -> None:
    name = f"t{uuid.uuid4().hex[:8]}"
    answer = http.post(
        "/v1/tables",
        json={"namespace": namespace, "name": name, "schema": SCHEMA, **declaration},
    )
    assert answer.status_code == 400, answer.text
    assert re.search(message, answer.json()["error"]["message"]), answer.json()["error"]["message"]
    with pytest.raises(InvalidSchema, match=message):
        client.create_table(f"{namespace}.{name}", SCHEMA, **declaration)
    assert http.get(f"/v1/tables/{namespace}/{name}").status_code == 404


def test_a_key_stays_non_null_through_schema_changes(client: Client, namespace: str) -> None:
    table = f"{namespace}.balances"
    client.create_table(
        table, SCHEMA, primary_key=["id"], merge_engine={"type": "versioned", "column": "v"}
    )
    for column, why in (
        ("id", "it is a primary key column, and a key is never null"),
        ("v", "it is the versioned merge engine's version column"),
    ):
        with pytest.raises(
            SchemaChangeRefused, match=f"cannot make optional column '{column}': {why}"
        ):
            client.alter_schema(table, [{"op": "make_optional", "column": column}])
    # Other columns change as in any table.
    info = client.alter_schema(table, [{"op": "add_column", "column": "note", "type": "string"}])
    assert info.primary_key == ("id",) and "note" in info.schema.names


def test_the_cli_declares_a_key_table(
    gateway: GatewayProcess, client: Client, namespace: str
) -> None:
    made = tidegate(
        gateway, "table", "create", f"{namespace}.orders", "--schema",
        "id:int64,status:string,v:int64", "--primary-key", "id", "--merge-engine", "versioned:v",
        "--json",
    )  # fmt: skip
    assert json.loads(made.stdout)["merge_engine"] == {"type": "versioned", "column": "v"}
    info = client.describe_table(f"{namespace}.orders")
    assert (info.primary_key, info.merge_engine) == (("id",), {"type": "versioned", "column": "v"})
    described = tidegate(gateway, "table", "describe", f"{namespace}.orders")
    assert "primary key id, merge engine versioned:v" in described.stdout
