"""Issue 27: the tenant-scoped, read-only Iceberg REST catalog at ``/iceberg``, on a local
folder warehouse. pyiceberg's ``RestCatalog`` and DuckDB's ``iceberg`` extension, each
given only one tenant's key, list that tenant's namespaces and tables and read exactly the
tiered rows; another tenant's table is 404 on every route; changes are refused; a revoked
key or a suspended tenant is refused.

One gateway (Redis hot tier, no embedded tiering: ``tidegate tier`` runs when a test says)
serves the module, so a table can have a tiered part and a hot tail at once.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.integration.iceberg_catalog import (
    SCHEMA,
    Tenant,
    duckdb_with_extensions,
    fill,
    new_tenant,
    pyiceberg_catalog,
    rows_of,
    tier,
    tiered_rows,
    watermarks,
)
from tests.services import GatewayProcess, RedisServer

pytestmark = pytest.mark.integration

CATALOG = "/iceberg/v1"


@pytest.fixture(scope="module")
def gw(
    tmp_path_factory: pytest.TempPathFactory, redis_server: RedisServer
) -> Iterator[GatewayProcess]:
    env = {
        "TIDEGATE_HOT__TYPE": "redis",
        "TIDEGATE_HOT__URL": redis_server.url,
        "TIDEGATE_TIERING__ENABLED": "false",
        "TIDEGATE_TIERING__HOT_RETENTION_S": "0",
    }
    proc = GatewayProcess(tmp_path_factory.mktemp("iceberg-catalog"), env).start()
    try:
        yield proc
    finally:
        proc.stop()


@pytest.fixture(scope="module")
def tiered(gw: GatewayProcess) -> Tenant:
    """A tenant with two tables in two namespaces: 10 rows tiered then 6 hot in shop.orders,
    4 tiered in app.events."""
    t = new_tenant(gw, "a")
    with gw.client(api_key=t.key) as c:
        c.create_table("shop.orders", SCHEMA, partitions=2)
        c.create_table("app.events", SCHEMA, partitions=2)
    fill(gw, t, "shop.orders", 0, 10)
    fill(gw, t, "app.events", 0, 4)
    tier(gw)
    fill(gw, t, "shop.orders", 10, 6)  # the hot tail: not in the Iceberg table
    return t


def catalog_http(gw: GatewayProcess, key: str | None) -> httpx.Client:
    return gw.http_client(api_key=key)


def iceberg_error(r: httpx.Response) -> tuple[int, str, str]:
    body = r.json()
    assert set(body) == {"error"}, body
    err = body["error"]
    assert err["code"] == r.status_code, body
    return r.status_code, err["type"], err["message"]


# --------------------------------------------------------------------------------------
# Reading through the catalog
# --------------------------------------------------------------------------------------
def test_load_table_is_the_committed_metadata_with_the_watermarks(
    gw: GatewayProcess, tiered: Tenant
) -> None:
    with catalog_http(gw, tiered.key) as h:
        result = h.get(f"{CATALOG}/namespaces/shop/tables/orders").json()
        described = h.get("/v1/tables/shop/orders").json()
    assert result["metadata-location"] == described["iceberg_metadata"]
    marks = watermarks(result)
    assert marks == {p["partition"]: p["tiered_watermark"] for p in described["partition_info"]}
    assert sum(marks.values()) == 10
    high = {p["partition"]: p["high_watermark"] for p in described["partition_info"]}
    assert sum(high.values()) == 16  # six hot records above the watermarks
    assert result["config"] == {} and "storage-credentials" not in result  # local files


def test_pyiceberg_with_the_key_as_token_reads_exactly_the_tiered_rows(
    gw: GatewayProcess, tiered: Tenant
) -> None:
    # Planning on the client: the metadata's files (on the server the hot tail is in too:
    # tests/integration/test_iceberg_plans.py).
    catalog = pyiceberg_catalog(gw, token=tiered.key, **{"scan-planning-mode": "client"})
    assert sorted(catalog.list_namespaces()) == [("app",), ("shop",)]
    assert catalog.list_tables("shop") == [("shop", "orders")]
    assert catalog.table_exists("shop.orders") and not catalog.table_exists("shop.nope")
    table = catalog.load_table("shop.orders")
    got = table.scan().to_arrow()
    with catalog_http(gw, tiered.key) as h:
        marks = watermarks(h.get(f"{CATALOG}/namespaces/shop/tables/orders").json())
    expected = tiered_rows(gw, tiered, "shop.orders", marks)
    assert expected.num_rows == 10
    assert rows_of(got) == rows_of(expected)


def test_pyiceberg_through_the_oauth2_exchange(gw: GatewayProcess, tiered: Tenant) -> None:
    for credential in (f"{tiered.name}:{tiered.key}", tiered.key):
        catalog = pyiceberg_catalog(gw, credential=credential)
        rows = catalog.load_table("app.events").scan().to_arrow()
        assert sorted(rows["id"].to_pylist()) == [0, 1, 2, 3]


def test_duckdb_with_the_key_as_token_reads_exactly_the_tiered_rows(
    gw: GatewayProcess, tiered: Tenant
) -> None:
    con = duckdb_with_extensions()
    try:
        con.execute(
            f"ATTACH 'tidegate' AS tg (TYPE iceberg, ENDPOINT '{gw.http_url}/iceberg', "
            f"TOKEN '{tiered.key}')"
        )
        listed = con.sql(
            "SELECT schema, name FROM (SHOW ALL TABLES) WHERE database = 'tg' ORDER BY 1, 2"
        ).fetchall()
        assert listed == [("app", "events"), ("shop", "orders")]
        got = con.sql("SELECT * FROM tg.shop.orders").arrow().read_all()
    finally:
        con.close()
    with catalog_http(gw, tiered.key) as h:
        marks = watermarks(h.get(f"{CATALOG}/namespaces/shop/tables/orders").json())
    assert rows_of(got) == rows_of(tiered_rows(gw, tiered, "shop.orders", marks))


def test_duckdb_through_the_oauth2_exchange(gw: GatewayProcess, tiered: Tenant) -> None:
    con = duckdb_with_extensions()
    try:
        con.execute(
            "CREATE SECRET tgsecret (TYPE iceberg, CLIENT_ID ?, CLIENT_SECRET ?, "
            "OAUTH2_SERVER_URI ?)",
            [tiered.name, tiered.key, f"{gw.http_url}{CATALOG}/oauth/tokens"],
        )
        con.execute(
            f"ATTACH 'tidegate' AS tg (TYPE iceberg, ENDPOINT '{gw.http_url}/iceberg', "
            "SECRET tgsecret)"
        )
        ids = con.sql("SELECT id FROM tg.app.events ORDER BY id").fetchall()
    finally:
        con.close()
    assert ids == [(0,), (1,), (2,), (3,)]


# --------------------------------------------------------------------------------------
# Isolation
# --------------------------------------------------------------------------------------
def _every_route(h: httpx.Client, ns: str, name: str) -> dict[str, tuple[int, str, str]]:
    """What each route answers for ``ns.name`` (the namespace's own routes for ``ns``)."""
    table = f"{CATALOG}/namespaces/{ns}/tables/{name}"
    answers = {
        "load": h.get(table),
        "credentials": h.get(f"{table}/credentials"),
        "commit": h.post(table, json={"requirements": [], "updates": []}),
        "drop": h.delete(table),
        "metrics": h.post(f"{table}/metrics", json={"report-type": "scan-report"}),
        "namespace": h.get(f"{CATALOG}/namespaces/{ns}"),
        "tables": h.get(f"{CATALOG}/namespaces/{ns}/tables"),
        "views": h.get(f"{CATALOG}/namespaces/{ns}/views"),
        "drop namespace": h.delete(f"{CATALOG}/namespaces/{ns}"),
        "properties": h.post(f"{CATALOG}/namespaces/{ns}/properties", json={}),
        "children": h.get(f"{CATALOG}/namespaces", params={"parent": ns}),
    }
    out = {k: iceberg_error(r) for k, r in answers.items()}
    for label in ("table exists", "namespace exists"):
        path = table if label == "table exists" else f"{CATALOG}/namespaces/{ns}"
        head = h.head(path)
        out[label] = (head.status_code, "", "")
    return out


def test_another_tenants_table_is_404_on_every_route(gw: GatewayProcess, tiered: Tenant) -> None:
    b = new_tenant(gw, "b")
    with catalog_http(gw, b.key) as h:
        unknown = _every_route(h, "shop", "orders")  # b has no such table
    for label, (status, kind, _) in unknown.items():
        assert status == 404, label
        if kind:
            assert kind in ("NoSuchTableException", "NoSuchNamespaceException"), label
    # b makes a table of the same name elsewhere; a's is still invisible, and the answers
    # for a's table are byte for byte those for a table nobody has.
    with gw.client(api_key=b.key) as c:
        c.create_table("other.things", SCHEMA, partitions=1)
    with catalog_http(gw, b.key) as h:
        assert _every_route(h, "shop", "orders") == unknown
        assert h.get(f"{CATALOG}/namespaces").json() == {"namespaces": [["other"]]}
        assert h.get(f"{CATALOG}/namespaces/other/tables").json() == {
            "identifiers": [{"namespace": ["other"], "name": "things"}]
        }
    # And through the engines: b's catalog shows nothing of a's.
    catalog = pyiceberg_catalog(gw, token=b.key)
    assert catalog.list_namespaces() == [("other",)]
    assert not catalog.table_exists("shop.orders")


def test_the_operator_key_and_bad_credentials_are_refused(
    gw: GatewayProcess, tiered: Tenant
) -> None:
    for key in (None, "nonsense", "tgcat.forged", tiered.key[:-3] + "AAA", gw.operator_key):
        with catalog_http(gw, key) as h:
            status, kind, _ = iceberg_error(h.get(f"{CATALOG}/namespaces"))
        assert (status, kind) in (
            (401, "NotAuthorizedException"),
            (403, "ForbiddenException"),
        ), key


# --------------------------------------------------------------------------------------
# Read-only
# --------------------------------------------------------------------------------------
def test_changes_are_refused_with_a_sentence(gw: GatewayProcess, tiered: Tenant) -> None:
    table = f"{CATALOG}/namespaces/shop/tables/orders"
    with catalog_http(gw, tiered.key) as h:
        before = h.get(table).json()["metadata-location"]
        answers = [
            h.post(f"{CATALOG}/namespaces", json={"namespace": ["x"]}),
            h.post(f"{CATALOG}/namespaces/shop/tables", json={"name": "t", "schema": {}}),
            h.post(table, json={"requirements": [], "updates": []}),
            h.delete(table),
            h.post(f"{CATALOG}/tables/rename", json={}),
            h.post(f"{CATALOG}/namespaces/shop/register", json={}),
            h.post(f"{CATALOG}/transactions/commit", json={}),
            h.delete(f"{CATALOG}/namespaces/shop"),
            h.post(f"{CATALOG}/namespaces/shop/properties", json={}),
        ]
        for r in answers:
            status, kind, message = iceberg_error(r)
            assert (status, kind) == (403, "ForbiddenException"), r.request.url
            assert "tables are written through Tidegate's append API" in message
        assert h.get(table).json()["metadata-location"] == before
    from pyiceberg.exceptions import ForbiddenError
    from pyiceberg.schema import Schema
    from pyiceberg.types import LongType, NestedField

    catalog = pyiceberg_catalog(gw, token=tiered.key)
    table_obj = catalog.load_table("shop.orders")
    with pytest.raises((ForbiddenError, NotImplementedError)):
        catalog.drop_table("shop.orders")
    with pytest.raises((ForbiddenError, NotImplementedError)):
        catalog.create_table("shop.new", Schema(NestedField(1, "x", LongType())))
    with pytest.raises((ForbiddenError, NotImplementedError)), table_obj.transaction() as tx:
        tx.set_properties(owner="mallory")
    with catalog_http(gw, tiered.key) as h:
        assert h.get(table).json()["metadata-location"] == before


# --------------------------------------------------------------------------------------
# Revocation and suspension
# --------------------------------------------------------------------------------------
def _past_key_cache() -> None:
    """Past auth.key_cache_ttl_s (1 s): what another replica may have cached is gone."""
    time.sleep(1.2)


def test_a_revoked_key_and_its_tokens_are_refused(gw: GatewayProcess, tiered: Tenant) -> None:
    with gw.admin() as admin:
        key_id, key = admin.issue_key(tiered.name)
    with catalog_http(gw, None) as h:
        token = h.post(
            f"{CATALOG}/oauth/tokens",
            data={"grant_type": "client_credentials", "client_id": tiered.name,
                  "client_secret": key},
        ).json()["access_token"]  # fmt: skip
    catalog = pyiceberg_catalog(gw, token=key)
    assert catalog.list_tables("app") == [("app", "events")]
    for credential in (key, token):
        with catalog_http(gw, credential) as h:
            assert h.get(f"{CATALOG}/namespaces/app/tables/events").status_code == 200
    with gw.admin() as admin:
        admin.revoke_key(key_id)
    _past_key_cache()
    for credential in (key, token):
        with catalog_http(gw, credential) as h:
            for path in ("/namespaces", "/namespaces/app/tables/events", "/config"):
                assert iceberg_error(h.get(f"{CATALOG}{path}"))[:2] == (
                    401,
                    "NotAuthorizedException",
                ), (credential[:8], path)
        with catalog_http(gw, None) as h:
            refresh = h.post(
                f"{CATALOG}/oauth/tokens",
                data={"grant_type": "urn:ietf:params:oauth:grant-type:token-exchange",
                      "subject_token": credential,
                      "subject_token_type": "urn:ietf:params:oauth:token-type:access_token"},
            )  # fmt: skip
            assert refresh.status_code == 401 and refresh.json()["error"] == "invalid_client"
    from pyiceberg.exceptions import UnauthorizedError

    with pytest.raises(UnauthorizedError):
        catalog.list_tables("app")


def test_a_suspended_tenants_key_and_tokens_are_refused(gw: GatewayProcess) -> None:
    t = new_tenant(gw, "s")
    with gw.client(api_key=t.key) as c:
        c.create_table("s.t", SCHEMA, partitions=1)
    with catalog_http(gw, None) as h:
        token = h.post(
            f"{CATALOG}/oauth/tokens",
            data={"grant_type": "client_credentials", "client_secret": t.key},
        ).json()["access_token"]
    with gw.admin() as admin:
        admin.suspend_tenant(t.name)
    _past_key_cache()
    try:
        for credential in (t.key, token):
            with catalog_http(gw, credential) as h:
                status, kind, message = iceberg_error(h.get(f"{CATALOG}/namespaces/s/tables/t"))
            assert (status, kind) == (403, "ForbiddenException")
            assert "suspended" in message
        with catalog_http(gw, None) as h:
            r = h.post(
                f"{CATALOG}/oauth/tokens",
                data={"grant_type": "client_credentials", "client_secret": t.key},
            )
        assert (r.status_code, r.json()["error"]) == (400, "unauthorized_client")
    finally:
        with gw.admin() as admin:
            admin.resume_tenant(t.name)
    with catalog_http(gw, token) as h:  # the token lives on with the tenant
        assert h.get(f"{CATALOG}/namespaces/s/tables/t").status_code == 200


# --------------------------------------------------------------------------------------
# Bad input
# --------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("form", "headers", "expected"),
    [
        ({}, {}, (400, "invalid_request")),
        ({"grant_type": "password", "username": "x"}, {}, (400, "unsupported_grant_type")),
        ({"grant_type": "client_credentials"}, {}, (400, "invalid_request")),
        ({"grant_type": "client_credentials", "client_secret": "nope"}, {},
         (401, "invalid_client")),
        ({"grant_type": "client_credentials"}, {"authorization": "Basic !!!"},
         (401, "invalid_client")),
        ({"grant_type": "client_credentials"}, {"authorization": "Basic bm9jb2xvbg=="},
         (401, "invalid_client")),
        ({"grant_type": "urn:ietf:params:oauth:grant-type:token-exchange"}, {},
         (400, "invalid_request")),
    ],
)  # fmt: skip
def test_malformed_token_requests_answer_the_oauth_error_shape(
    gw: GatewayProcess, form: dict[str, str], headers: dict[str, str], expected: tuple[int, str]
) -> None:
    with catalog_http(gw, None) as h:
        r = h.post(f"{CATALOG}/oauth/tokens", data=form, headers=headers)
    body = r.json()
    assert (r.status_code, body["error"]) == expected, body
    assert isinstance(body["error_description"], str) and body["error_description"]


def test_token_requests_that_are_not_forms(gw: GatewayProcess, tiered: Tenant) -> None:
    with catalog_http(gw, None) as h:
        cases: list[Any] = [
            h.post(f"{CATALOG}/oauth/tokens", json={"grant_type": "client_credentials"}),
            h.post(
                f"{CATALOG}/oauth/tokens",
                content=b"grant_type=client_credentials&&&=\xff",
                headers={"content-type": "application/x-www-form-urlencoded"},
            ),
            h.post(
                f"{CATALOG}/oauth/tokens",
                content=b"grant_type=" + b"x" * 20_000,
                headers={"content-type": "application/x-www-form-urlencoded"},
            ),
            h.post(
                f"{CATALOG}/oauth/tokens",
                data={"grant_type": "client_credentials", "client_id": tiered.name},
                headers={"x": "y"},
                params={"client_secret": tiered.key},
            ),
        ]
        for r in cases:
            assert 400 <= r.status_code < 500, r.text
            assert r.json()["error"] in ("invalid_request", "invalid_client"), r.text
        # A client id that is not the key's tenant.
        r = h.post(
            f"{CATALOG}/oauth/tokens",
            data={"grant_type": "client_credentials", "client_id": "someone-else",
                  "client_secret": tiered.key},
        )  # fmt: skip
        assert (r.status_code, r.json()["error"]) == (401, "invalid_client")


@pytest.mark.parametrize(
    "path",
    [
        "/nope",
        "/namespaces/" + "n" * 5000,
        "/namespaces/" + "n" * 5000 + "/tables/" + "t" * 5000,
        "/namespaces/shop%1Fsub/tables/orders",
        "/namespaces/shop%1F/tables",
        "/namespaces/%E2%98%83/tables/%00",
        "/namespaces/..%2F..%2Fetc/tables/passwd",
        "/namespaces/shop/tables/orders%0A",
        "/namespaces/shop/tables/orders/nope",
        "/v2/config",
    ],
)
def test_odd_paths_answer_the_spec_error_shape(
    gw: GatewayProcess, tiered: Tenant, path: str
) -> None:
    with catalog_http(gw, tiered.key) as h:
        for method in ("GET", "POST", "DELETE", "PUT"):
            r = h.request(method, f"{CATALOG}{path}")
            status, kind, message = iceberg_error(r)
            assert 400 <= status < 500 and kind and message, (method, path, r.text)


def test_parent_and_paging_parameters(gw: GatewayProcess, tiered: Tenant) -> None:
    with catalog_http(gw, tiered.key) as h:
        assert h.get(f"{CATALOG}/namespaces", params={"parent": "shop"}).json() == {
            "namespaces": []
        }
        assert h.get(f"{CATALOG}/namespaces", params={"parent": "x\x1fy"}).status_code == 404
        assert h.get(f"{CATALOG}/namespaces").json() == {"namespaces": [["app"], ["shop"]]}
        first = h.get(f"{CATALOG}/namespaces", params={"pageSize": "1"}).json()
        assert first["namespaces"] == [["app"]] and first["next-page-token"]
        token = first["next-page-token"]
        second = h.get(f"{CATALOG}/namespaces", params={"pageSize": "1", "pageToken": token})
        assert second.json() == {"namespaces": [["shop"]]}  # the last page names no next
        config = h.get(f"{CATALOG}/config", params={"warehouse": "anything"}).json()
        assert set(config) == {"defaults", "overrides", "endpoints"}
        assert "GET /v1/{prefix}/namespaces/{namespace}/tables/{table}" in config["endpoints"]


def test_tables_come_in_pages_and_pyiceberg_follows_them(gw: GatewayProcess) -> None:
    t = new_tenant(gw, "paged")
    names = [f"t{i:02d}" for i in range(7)]
    with gw.client(api_key=t.key) as c:
        for name in names:
            c.create_table(f"many.{name}", SCHEMA, partitions=1)
    seen: list[str] = []
    token = None
    with catalog_http(gw, t.key) as h:
        for _ in range(10):
            params = {"pageSize": "3", **({"pageToken": token} if token else {})}
            page = h.get(f"{CATALOG}/namespaces/many/tables", params=params).json()
            assert len(page["identifiers"]) <= 3
            seen += [i["name"] for i in page["identifiers"]]
            token = page.get("next-page-token")
            if token is None:
                break
        bad = h.get(f"{CATALOG}/namespaces/many/tables", params={"pageToken": "%%%"})
        assert iceberg_error(bad)[0] == 400 and "pageToken" in iceberg_error(bad)[2]
        zero = h.get(f"{CATALOG}/namespaces/many/tables", params={"pageSize": "0"})
        assert iceberg_error(zero)[0] == 400 and "pageSize" in iceberg_error(zero)[2]
    assert seen == names  # every table once, in order, over three pages
    catalog = pyiceberg_catalog(gw, token=t.key)
    assert sorted(name for _, name in catalog.list_tables("many")) == names


# --------------------------------------------------------------------------------------
# Operations
# --------------------------------------------------------------------------------------
def test_metrics_count_each_route_and_what_engines_were_given(
    gw: GatewayProcess, tiered: Tenant
) -> None:
    with catalog_http(gw, tiered.key) as h:
        h.get(f"{CATALOG}/namespaces/app/tables/events")
        h.post(f"{CATALOG}/oauth/tokens", data={"grant_type": "client_credentials",
                                               "client_secret": tiered.key})  # fmt: skip
        text = h.get("/metrics").text
    route = 'route="/iceberg/v1/namespaces/{namespace}/tables/{table}"'
    assert any(route in line and 'status="200"' in line for line in text.splitlines())
    assert 'tidegate_iceberg_catalog_table_access_total{access="none"}' in text
    assert "tidegate_iceberg_catalog_tokens_total" in text


def test_the_operator_can_turn_the_catalog_off(tmp_path: Any) -> None:
    off = GatewayProcess(
        tmp_path / "gw",
        {"TIDEGATE_HOT__TYPE": "disk", "TIDEGATE_COLD__REST_CATALOG__ENABLED": "false"},
    ).start()
    try:
        with off.http_client() as h:
            for path in ("/config", "/namespaces", "/oauth/tokens"):
                status, _, message = iceberg_error(h.get(f"{CATALOG}{path}"))
                assert status == 404 and "cold.rest_catalog.enabled=true" in message
            assert h.get("/v1/tables").status_code == 200
    finally:
        off.stop()
