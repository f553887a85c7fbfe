"""``/iceberg``: a read-only Iceberg REST catalog of the calling tenant's tables.

Any engine with an Iceberg REST client (pyiceberg, DuckDB, Spark, Trino...) is given the
catalog URI ``http://HOST:HTTP_PORT/iceberg`` and the tenant's API key, either as a bearer
``token`` or through the OAuth2 client-credentials exchange at ``/iceberg/v1/oauth/tokens``
(client id: the tenant's name or empty; client secret: the key). It sees the tenant's
namespaces and tables under their own names and nothing of another tenant's: an unknown
table and another tenant's answer the same ``404 NoSuchTableException``.

Loading a table answers its current committed metadata file (so ``tidegate.watermarks`` in
the current snapshot's summary says where the hot tail begins) and how to read its files
without the warehouse's keys (the cold store's :meth:`~gateway.cold.ColdStore.data_access`:
nothing for a local folder, temporary credentials limited to the table's folder on S3, as
``storage-credentials`` and in ``config``). Every change (create, commit, drop, rename,
register) is refused with 403: tables are written through Tidegate's append API only, so
offsets and watermarks stay the gateway's.

Routes follow the Iceberg REST catalog OpenAPI specification without a ``{prefix}``;
errors have its shape, ``{"error": {"message", "type", "code"}}``, and the token route the
OAuth2 one, ``{"error", "error_description"}``. Every route authenticates from the headers
before any body is read; only the token route reads one (a small form: RFC 6749 lets a
client send its credentials there).
"""

# No ``from __future__ import annotations``: the routes' parameter types (``Tenant``) are
# made inside each group of routes, and FastAPI must see them as objects.
import base64
import binascii
import hashlib
import json
import math
from collections.abc import AsyncIterator, Callable, Coroutine
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Header, Query, Request, Security
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from fastapi.routing import APIRoute

from gateway import metrics
from gateway.cold.base import CatalogEntry, DataAccess
from gateway.server.calls import DataCalls
from gateway.server.http import iceberg_plans
from gateway.server.http.deps import TENANT_KEY, Credential
from gateway.server.http.iceberg_errors import SEPARATOR, iceberg_error
from gateway.server.http.iceberg_oauth import OAuthError, token_route
from gateway.tenancy import Tenancy
from gateway.wire.errors import InvalidRequest, PermissionDenied, TableNotFound, TidegateError

__all__ = ["ENDPOINTS", "PREFIX", "Catalog", "iceberg_error", "iceberg_router"]

PREFIX = "/iceberg"

READ_ONLY = (
    "Tidegate's Iceberg catalog is read-only: tables are written through Tidegate's "
    "append API (POST /v1/tables/{namespace}/{name}/records), which assigns the offsets "
    "and tidegate.watermarks; create and drop tables with POST /v1/tables and "
    "DELETE /v1/tables/{namespace}/{name}"
)

#: What the catalog serves, as the spec's ``endpoints`` of ``GET /v1/config``.
ENDPOINTS = [
    "GET /v1/{prefix}/namespaces",
    "GET /v1/{prefix}/namespaces/{namespace}",
    "HEAD /v1/{prefix}/namespaces/{namespace}",
    "GET /v1/{prefix}/namespaces/{namespace}/tables",
    "GET /v1/{prefix}/namespaces/{namespace}/tables/{table}",
    "HEAD /v1/{prefix}/namespaces/{namespace}/tables/{table}",
    "GET /v1/{prefix}/namespaces/{namespace}/tables/{table}/credentials",
    "POST /v1/{prefix}/namespaces/{namespace}/tables/{table}/metrics",
    "GET /v1/{prefix}/namespaces/{namespace}/views",
]

#: The spec's error type per HTTP status, for errors that name no more precise one.


def _from_tidegate(err: TidegateError) -> JSONResponse:
    headers = {}
    retry_after_ms = getattr(err, "retry_after_ms", None)
    if retry_after_ms is not None:
        headers["Retry-After"] = str(max(0, math.ceil(retry_after_ms / 1000)))
    kind = "NoSuchTableException" if isinstance(err, TableNotFound) else None
    return iceberg_error(err.http_status, err.message, kind, headers)


def _no_namespace(namespace: str) -> JSONResponse:
    shown = namespace.replace(SEPARATOR, ".")[:200]
    return iceberg_error(404, f"Namespace does not exist: {shown!r}", "NoSuchNamespaceException")


class _Refused(Exception):
    """An answer decided before the route's work (a missing namespace)."""

    def __init__(self, response: Response) -> None:
        super().__init__()
        self.response = response


class _IcebergRoute(APIRoute):
    """Answers every error of its routes in the spec's shape (validation errors too)."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def handle(request: Request) -> Response:
            try:
                return await handler(request)
            except _Refused as exc:
                return exc.response
            except OAuthError as exc:
                return exc.response()
            except RequestValidationError as exc:
                first = exc.errors()[0] if exc.errors() else {}
                where = ".".join(str(p) for p in first.get("loc", ())) or "the request"
                return iceberg_error(400, f"{where}: {first.get('msg', 'invalid value')}")
            except TidegateError as exc:
                return _from_tidegate(exc)

        return handle


def _one_part(namespace: str) -> str | None:
    """A path's namespace as Tidegate's single-part name; None for a multipart one."""
    return None if SEPARATOR in namespace else namespace


def _load_result(entry: CatalogEntry, access: DataAccess) -> dict[str, Any]:
    config = {**access.config, **access.credentials}
    out: dict[str, Any] = {
        "metadata-location": entry.metadata_location,
        "metadata": entry.metadata,
        "config": config,
    }
    if access.credentials:
        out["storage-credentials"] = [
            {"prefix": access.prefix, "config": {**access.config, **access.credentials}}
        ]
    return out


#: The largest ``pageSize`` of a list (a larger one is served in pages of this size).
MAX_PAGE_SIZE = 1000


def _page(
    names: list[str], page_token: str | None, page_size: int | None
) -> tuple[list[str], str | None]:
    """One page of sorted ``names`` and the token of the next (None: the last page).

    Without ``pageSize`` and ``pageToken`` the whole list is one page, as for a client that
    does not page. A token is the last name of the page before it, encoded; the next page
    starts after that name, so tables created or dropped between pages shift nothing."""
    if page_size is not None and page_size < 1:
        raise InvalidRequest(f"pageSize must be a positive integer, not {page_size}")
    after = None
    if page_token:
        try:
            raw = base64.b64decode(page_token.encode("ascii"), altchars=b"-_", validate=True)
            after = raw.decode("utf-8")
            if not after:
                raise ValueError(page_token)
        except (UnicodeError, ValueError, binascii.Error):
            raise InvalidRequest(
                "pageToken is not a token this catalog gave: pass the next-page-token of "
                "the page before, or none for the first page"
            ) from None
    if page_size is None and after is None:
        return names, None
    size = min(page_size or MAX_PAGE_SIZE, MAX_PAGE_SIZE)
    rest = sorted(n for n in names if after is None or n > after)
    page = rest[:size]
    if len(rest) <= size:
        return page, None
    return page, base64.urlsafe_b64encode(page[-1].encode("utf-8")).decode("ascii")


def _paged(key: str, items: list[Any], next_token: str | None) -> JSONResponse:
    body: dict[str, Any] = {key: items}
    if next_token is not None:
        body["next-page-token"] = next_token
    return JSONResponse(body)


def _etag(entry: CatalogEntry, access: DataAccess, planning: dict[str, str]) -> str:
    """The spec's ``ETag`` of a ``loadTable`` answer: it changes when the table's metadata
    file, where its files are read from or how it is planned changes. The temporary
    credentials themselves are not in it (they differ on every answer; an engine holding
    an unchanged table refreshes them with ``loadCredentials``)."""
    seen = {
        "metadata-location": entry.metadata_location,
        "prefix": access.prefix,
        "config": sorted(access.config.items()),
        "credentials": sorted(access.credentials),
        "planning": sorted(planning.items()),
    }
    digest = hashlib.sha256(json.dumps(seen, sort_keys=True).encode()).hexdigest()[:32]
    return f'"{digest}"'


def _matches(if_none_match: str | None, etag: str) -> bool:
    """Whether an ``If-None-Match`` header names ``etag`` (or is ``*``)."""
    if not if_none_match:
        return False
    tags = [t.strip().removeprefix("W/") for t in if_none_match.split(",")]
    return "*" in tags or etag in tags


class Catalog:
    """What every route of the catalog shares: who is calling (:meth:`caller`, a
    dependency) and the tenant's own namespaces and tables."""

    def __init__(self, tenancy: Tenancy, calls: DataCalls) -> None:
        self.tenancy = tenancy
        self.calls = calls
        self.service = calls.service

    async def caller(
        self, request: Request, _key: Annotated[Credential, Security(TENANT_KEY)]
    ) -> AsyncIterator[str]:
        """The calling tenant, admitted for the request (one of its in-flight slots)."""
        tenant = await self.tenancy.catalog_tenant(request.headers.get("authorization"))
        async with self.tenancy.admit(tenant):
            yield tenant

    async def own_namespace(self, tenant: str, namespace: str) -> str:
        """The namespace's tables; a namespace without a table of the tenant's (or a
        multipart one) does not exist."""
        ns = _one_part(namespace)
        if ns is None or not await self.service.catalog_tables(tenant, ns):
            raise _Refused(_no_namespace(namespace))
        return ns

    async def own_table(self, tenant: str, namespace: str, table: str) -> CatalogEntry:
        ns = _one_part(namespace)
        if ns is None:
            raise TableNotFound(f"table {namespace[:200]!r}.{table[:200]!r} does not exist")
        return await self.service.catalog_entry(tenant, ns, table)


def iceberg_router(tenancy: Tenancy, calls: DataCalls) -> APIRouter:
    """The catalog of the tenants of ``tenancy`` over the service of ``calls``: its routes by
    what they concern, in this order."""
    cat = Catalog(tenancy, calls)
    router = APIRouter(prefix=f"{PREFIX}/v1", route_class=_IcebergRoute, tags=["iceberg catalog"])
    _config_route(router, cat)
    token_route(router, tenancy)
    _namespace_routes(router, cat)
    _table_routes(router, cat)
    _refused_routes(router, cat)
    iceberg_plans.add_plan_routes(router, tenancy, calls, cat.caller)
    return router


def _config_route(router: APIRouter, cat: Catalog) -> None:
    Tenant = Annotated[str, Depends(cat.caller)]

    @router.get("/config", summary="The catalog's configuration and the endpoints it serves.")
    async def get_config(tenant: Tenant) -> JSONResponse:
        """Any ``warehouse`` asked for is the calling tenant's one warehouse."""
        endpoints = ENDPOINTS + iceberg_plans.plan_endpoints(cat.calls)
        defaults = iceberg_plans.planning_config(cat.calls)
        return JSONResponse({"defaults": defaults, "overrides": {}, "endpoints": endpoints})


def _namespace_routes(router: APIRouter, cat: Catalog) -> None:
    Tenant = Annotated[str, Depends(cat.caller)]

    @router.get("/namespaces", summary="The tenant's namespaces (those holding its tables).")
    async def list_namespaces(
        tenant: Tenant,
        parent: str | None = None,
        page_token: Annotated[str | None, Query(alias="pageToken")] = None,
        page_size: Annotated[int | None, Query(alias="pageSize")] = None,
    ) -> JSONResponse:
        """Namespaces are single-part: under an existing ``parent`` there are none."""
        if parent:
            await cat.own_namespace(tenant, parent)
            return JSONResponse({"namespaces": []})
        names = await cat.service.catalog_namespaces(tenant)
        page, token = _page(list(names), page_token, page_size)
        return _paged("namespaces", [[n] for n in page], token)

    @router.get("/namespaces/{namespace}", summary="A namespace (it has no properties).")
    async def load_namespace(namespace: str, tenant: Tenant) -> JSONResponse:
        ns = await cat.own_namespace(tenant, namespace)
        return JSONResponse({"namespace": [ns], "properties": {}})

    @router.head("/namespaces/{namespace}", summary="Whether the namespace exists.")
    async def namespace_exists(namespace: str, tenant: Tenant) -> Response:
        await cat.own_namespace(tenant, namespace)
        return Response(status_code=204)


def _table_routes(router: APIRouter, cat: Catalog) -> None:
    """Tables, and views (there are none)."""
    Tenant = Annotated[str, Depends(cat.caller)]

    @router.get("/namespaces/{namespace}/tables", summary="The namespace's tables.")
    async def list_tables(
        namespace: str,
        tenant: Tenant,
        page_token: Annotated[str | None, Query(alias="pageToken")] = None,
        page_size: Annotated[int | None, Query(alias="pageSize")] = None,
    ) -> JSONResponse:
        ns = _one_part(namespace)
        names = await cat.service.catalog_tables(tenant, ns) if ns is not None else []
        if not names:
            return _no_namespace(namespace)
        page, token = _page(list(names), page_token, page_size)
        return _paged("identifiers", [{"namespace": [ns], "name": n} for n in page], token)

    @router.get(
        "/namespaces/{namespace}/tables/{table}",
        summary="A table's current committed metadata and how to read its files.",
    )
    async def load_table(
        namespace: str,
        table: str,
        tenant: Tenant,
        if_none_match: Annotated[str | None, Header()] = None,
    ) -> Response:
        """``metadata-location`` is the current snapshot's metadata file; its summary's
        ``tidegate.watermarks`` tells, per partition, the first offset not in it (read
        the rest, the hot tail, through Tidegate). On S3, temporary credentials that can
        only read this table's files are in ``storage-credentials`` (and ``config``).
        The answer's ``ETag`` given back in ``If-None-Match`` answers 304 while the table
        is unchanged."""
        entry = await cat.own_table(tenant, namespace, table)
        access = await cat.service.catalog_access(tenant, entry)
        result = _load_result(entry, access)
        planning = (
            iceberg_plans.planning_config(cat.calls, (tenant, namespace, table))
            if result["config"]
            else {}
        )
        result["config"].update(planning)  # see iceberg_plans.planning_config
        etag = _etag(entry, access, planning)
        if _matches(if_none_match, etag):
            return Response(status_code=304, headers={"ETag": etag})
        metrics.record_catalog_access(bool(access.credentials))
        return JSONResponse(result, headers={"ETag": etag})

    @router.head("/namespaces/{namespace}/tables/{table}", summary="Whether the table exists.")
    async def table_exists(namespace: str, table: str, tenant: Tenant) -> Response:
        await cat.own_table(tenant, namespace, table)
        return Response(status_code=204)

    @router.get(
        "/namespaces/{namespace}/tables/{table}/credentials",
        summary="Fresh temporary credentials for reading the table's files.",
    )
    async def load_credentials(namespace: str, table: str, tenant: Tenant) -> JSONResponse:
        entry = await cat.own_table(tenant, namespace, table)
        access = await cat.service.catalog_access(tenant, entry)
        metrics.record_catalog_access(bool(access.credentials))
        creds = (
            [{"prefix": access.prefix, "config": {**access.config, **access.credentials}}]
            if access.credentials
            else []
        )
        return JSONResponse({"storage-credentials": creds})

    @router.post(
        "/namespaces/{namespace}/tables/{table}/metrics",
        status_code=204,
        summary="Accept an engine's scan or commit report (and drop it).",
    )
    async def report_metrics(namespace: str, table: str, tenant: Tenant) -> Response:
        await cat.own_table(tenant, namespace, table)
        return Response(status_code=204)

    # Views: none -----------------------------------------------------------------------
    @router.get("/namespaces/{namespace}/views", summary="Views: Tidegate has none.")
    async def list_views(namespace: str, tenant: Tenant) -> JSONResponse:
        await cat.own_namespace(tenant, namespace)
        return JSONResponse({"identifiers": []})


def _refused_routes(router: APIRouter, cat: Catalog) -> None:
    """Changes: refused."""
    Tenant = Annotated[str, Depends(cat.caller)]

    async def refuse_in_namespace(namespace: str, tenant: Tenant) -> Response:
        await cat.own_namespace(tenant, namespace)
        raise PermissionDenied(READ_ONLY)

    async def refuse_on_table(namespace: str, table: str, tenant: Tenant) -> Response:
        await cat.own_table(tenant, namespace, table)
        raise PermissionDenied(READ_ONLY)

    async def refuse(tenant: Tenant) -> Response:
        raise PermissionDenied(READ_ONLY)

    forbidden: dict[int | str, dict[str, Any]] = {403: {"description": READ_ONLY}}
    for path, method, endpoint, what in (
        ("/namespaces", "POST", refuse, "Create a namespace"),
        ("/namespaces/{namespace}", "DELETE", refuse_in_namespace, "Drop a namespace"),
        ("/namespaces/{namespace}/properties", "POST", refuse_in_namespace, "Set properties"),
        ("/namespaces/{namespace}/tables", "POST", refuse, "Create a table"),
        ("/namespaces/{namespace}/register", "POST", refuse, "Register a table"),
        ("/namespaces/{namespace}/tables/{table}", "POST", refuse_on_table, "Commit"),
        ("/namespaces/{namespace}/tables/{table}", "DELETE", refuse_on_table, "Drop a table"),
        ("/tables/rename", "POST", refuse, "Rename a table"),
        ("/transactions/commit", "POST", refuse, "Commit a transaction"),
        ("/namespaces/{namespace}/views", "POST", refuse, "Create a view"),
    ):
        router.add_api_route(
            path,
            endpoint,
            methods=[method],
            responses=forbidden,
            summary=f"{what}: refused (403); tables are written through the append API.",
            name=f"iceberg {what.lower()}",
        )
