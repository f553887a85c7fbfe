"""Issue 30.3: tables and tenants are listed a page at a time, in a stable order (by name),
with an opaque token for the next page, on gRPC, HTTP, the SDK and the CLI (the console's
pages: tests/integration/test_console.py)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from gateway.client import Client
from gateway.wire.errors import InvalidRequest
from tests.integration.test_cli import tidegate
from tests.services import GatewayProcess

pytestmark = pytest.mark.integration

#: (namespace, name) of the tables made for a tenant, in the order a listing gives them.
TABLES = sorted((ns, f"t{i:02d}") for ns in ("b", "a") for i in range(12))


@pytest.fixture
def tenant(gateway: GatewayProcess) -> Iterator[tuple[str, str]]:
    """A tenant of its own (name, key) holding :data:`TABLES`, so listings see only them."""
    name = f"pg{uuid.uuid4().hex[:8]}"
    with gateway.admin() as admin:
        admin.create_tenant(name)
        key = admin.issue_key(name)[1]
    with gateway.client(api_key=key) as c:
        for ns, table in TABLES:
            c.create_table(f"{ns}.{table}", {"id": "int64"})
    yield name, key


def names(infos: list[Any]) -> list[tuple[str, str]]:
    return [(i.table.namespace, i.table.name) for i in infos]


def test_sdk_pages_through_tables_by_namespace_and_name(
    gateway: GatewayProcess, tenant: tuple[str, str]
) -> None:
    with gateway.client(api_key=tenant[1]) as c:
        pages, token = [], ""
        while True:
            page, token = c.list_tables_page(page_size=10, page_token=token)
            pages.append(names(page))
            if not token:
                break
        assert [len(p) for p in pages] == [10, 10, 4]
        assert [t for p in pages for t in p] == TABLES
        # The list helper walks every page; namespaces and searches page the same way.
        assert names(c.list_tables()) == TABLES
        page, token = c.list_tables_page("b", page_size=5)
        assert names(page) == [t for t in TABLES if t[0] == "b"][:5] and token
        assert names(c.list_tables(name_contains="T1")) == [t for t in TABLES if "t1" in t[1]]
        # A page asked for beyond the bound is served at the bound.
        page, token = c.list_tables_page(page_size=10**6)
        assert names(page) == TABLES and token == ""


def test_a_page_token_is_stable_under_creates_and_drops(
    gateway: GatewayProcess, tenant: tuple[str, str]
) -> None:
    with gateway.client(api_key=tenant[1]) as c:
        first, token = c.list_tables_page(page_size=10)
        # Meanwhile a table of the first page goes and one sorting before everything comes.
        c.drop_table("a.t00")
        c.create_table("a.a00", {"id": "int64"})
        second, _ = c.list_tables_page(page_size=10, page_token=token)
        assert names(first) == TABLES[:10]
        assert names(second) == TABLES[10:20]


def test_a_bad_page_token_or_size_is_refused_in_one_sentence(
    gateway: GatewayProcess, tenant: tuple[str, str], client: Client
) -> None:
    with gateway.client(api_key=tenant[1]) as c:
        with pytest.raises(InvalidRequest, match="page_token is not one this listing returned"):
            c.list_tables_page(page_token="not-a-token")
        with pytest.raises(InvalidRequest, match="page_size must be a positive integer"):
            c.list_tables_page(page_size=-1)
    with gateway.http_client(api_key=tenant[1]) as http:
        r = http.get("/v1/tables", params={"page_token": "%%%"})
        assert r.status_code == 400
        assert "page_token is not one this listing returned" in r.json()["error"]["message"]
        r = http.get("/v1/tables", params={"page_size": -1})
        assert r.status_code in (400, 422) and "page_size" in r.text


def test_http_pages_through_tables(gateway: GatewayProcess, tenant: tuple[str, str]) -> None:
    seen: list[tuple[str, str]] = []
    params: dict[str, Any] = {"page_size": 7}
    with gateway.http_client(api_key=tenant[1]) as http:
        while True:
            body = http.get("/v1/tables", params=params).json()
            assert len(body["tables"]) <= 7
            seen += [(t["namespace"], t["name"]) for t in body["tables"]]
            if not body["next_page_token"]:
                break
            params["page_token"] = body["next_page_token"]
        assert seen == TABLES
        body = http.get("/v1/tables", params={"name_contains": "t0", "namespace": "a"}).json()
        assert [t["name"] for t in body["tables"]] == [f"t0{i}" for i in range(10)]
        assert body["next_page_token"] == ""


def test_tenants_page_by_page_on_grpc_and_http(gateway: GatewayProcess) -> None:
    prefix = f"tp{uuid.uuid4().hex[:6]}"
    made = sorted(f"{prefix}-{i:02d}" for i in range(12))
    with gateway.admin() as admin:
        for name in reversed(made):
            admin.create_tenant(name)
        pages, token = [], ""
        while True:
            page, token = admin.list_tenants_page(
                page_size=5, page_token=token, name_contains=prefix.upper()
            )
            pages.append([t["name"] for t in page])
            if not token:
                break
        assert pages == [made[:5], made[5:10], made[10:]]
        assert [t["name"] for t in admin.list_tenants(name_contains=prefix)] == made
        everyone = [t["name"] for t in admin.list_tenants()]
        assert everyone == sorted(everyone) and set(made) <= set(everyone)
    seen: list[str] = []
    params: dict[str, Any] = {"page_size": 4, "name_contains": prefix}
    with gateway.http_client(api_key=gateway.operator_key) as http:
        while True:
            body = http.get("/v1/admin/tenants", params=params).json()
            seen += [t["name"] for t in body["tenants"]]
            if not body["next_page_token"]:
                break
            params["page_token"] = body["next_page_token"]
    assert seen == made


def test_cli_prints_one_page_and_where_the_next_starts(
    gateway: GatewayProcess, tenant: tuple[str, str]
) -> None:
    key = tenant[1]
    out = tidegate(gateway, "table", "list", "--page-size", "3", api_key=key)
    assert out.stdout.splitlines() == [f"{ns}.{t}\t1 partition" for ns, t in TABLES[:3]]
    token = out.stderr.strip().removeprefix("more: --page-token ")
    assert token and token != out.stderr.strip()
    out = tidegate(gateway, "table", "list", "--page-size", "3", "--page-token", token, api_key=key)
    assert [line.split("\t")[0] for line in out.stdout.splitlines()] == [
        f"{ns}.{t}" for ns, t in TABLES[3:6]
    ]
    everything = tidegate(gateway, "table", "list", "--contains", "t1", api_key=key)
    assert len(everything.stdout.splitlines()) == 4 and everything.stderr == ""
    out = tidegate(gateway, "tenant", "list", "--contains", tenant[0])
    assert out.stdout.splitlines() == [f"{tenant[0]}\tactive"]
