"""Issue 16, item 9: the HTTP docs of a running gateway. The OpenAPI document declares the
bearer keys (so Swagger UI's "Authorize" can make an authenticated call) and /docs and
/redoc load nothing from another host."""

from __future__ import annotations

import re
from typing import Any

import pytest

from tests.services import GatewayProcess

pytestmark = [
    pytest.mark.integration,
    pytest.mark.parametrize("gateway", ["disk"], indirect=True),  # the edge, not the tier
]

OPEN = {"/healthz", "/readyz", "/metrics", "/v1/endpoints"}
#: The Iceberg catalog's OAuth2 exchange: the credential is what it takes in.
TOKEN_ROUTE = "/iceberg/v1/oauth/tokens"
#: A read plan's link to a data file: the sealed token in its path is the credential.
FILE_ROUTE = "/v1/files/{token}"


def _operations(doc: dict[str, Any]) -> list[tuple[str, str, dict[str, Any]]]:
    return [
        (method.upper(), path, op)
        for path, ops in doc["paths"].items()
        for method, op in ops.items()
        if method in {"get", "put", "post", "delete", "patch"}
    ]


def test_openapi_declares_the_bearer_keys(gateway: GatewayProcess) -> None:
    with gateway.http_client(api_key=None) as h:
        doc = h.get("/openapi.json").json()
    schemes = doc["components"]["securitySchemes"]
    for name in ("tenantKey", "operatorKey"):
        assert (schemes[name]["type"], schemes[name]["scheme"]) == ("http", "bearer"), schemes
    ops = _operations(doc)
    assert {path for _, path, _ in ops} >= OPEN | {"/v1/tables", "/v1/admin/tenants", TOKEN_ROUTE}
    for method, path, op in ops:
        if path in OPEN or path in (TOKEN_ROUTE, FILE_ROUTE):
            assert "security" not in op, (method, path)
        elif path.startswith("/v1/admin/"):
            assert op["security"] == [{"operatorKey": []}], (method, path)
        else:
            assert op["security"] == [{"tenantKey": []}], (method, path)

    # What Swagger UI sends once "Authorize" holds the key: the declared scheme's header.
    with gateway.http_client(api_key=None) as h:
        assert h.get("/v1/tables").status_code == 401
        authorized = {"authorization": f"Bearer {gateway.api_key}"}
        assert h.get("/v1/tables", headers=authorized).status_code == 200


@pytest.mark.parametrize("page", ["/docs", "/redoc"])
def test_docs_pages_load_only_assets_the_gateway_serves(gateway: GatewayProcess, page: str) -> None:
    with gateway.http_client(api_key=None) as h:
        r = h.get(page)
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
        html = r.text
        assert re.findall(r"https?://[^\s\"'<>]*", html) == []  # no other host, no CDN
        assets = re.findall(r"(?:src|href)=\"([^\"]+)\"", html)
        scripts = [a for a in assets if a.endswith(".js")]
        assert scripts and all(a.startswith("/") and not a.startswith("//") for a in assets)
        for asset in assets:
            got = h.get(asset)
            assert got.status_code == 200, asset
            assert len(got.content) > 1000, asset  # the real file, not an error page
        assert "/openapi.json" in html  # the document itself, from the same gateway
