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
import math
from collections.abc import AsyncIterator, Callable, Coroutine
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Request, Security
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
from gateway.wire.errors import PermissionDenied, TableNotFound, TidegateError

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
    async def list_namespaces(tenant: Tenant, parent: str | None = None) -> JSONResponse:
        """Namespaces are single-part: under an existing ``parent`` there are none."""
        if parent:
            await cat.own_namespace(tenant, parent)
            return JSONResponse({"namespaces": []})
        names = await cat.service.catalog_namespaces(tenant)
        return JSONResponse({"namespaces": [[n] for n in names]})

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
    async def list_tables(namespace: str, tenant: Tenant) -> JSONResponse:
        ns = _one_part(namespace)
        names = await cat.service.catalog_tables(tenant, ns) if ns is not None else []
        if not names:
            return _no_namespace(namespace)
        return JSONResponse({"identifiers": [{"namespace": [ns], "name": n} for n in names]})

    @router.get(
        "/namespaces/{namespace}/tables/{table}",
        summary="A table's current committed metadata and how to read its files.",
    )
    async def load_table(namespace: str, table: str, tenant: Tenant) -> JSONResponse:
        """``metadata-location`` is the current snapshot's metadata file; its summary's
        ``tidegate.watermarks`` tells, per partition, the first offset not in it (read
        the rest, the hot tail, through Tidegate). On S3, temporary credentials that can
        only read this table's files are in ``storage-credentials`` (and ``config``)."""
        entry = await cat.own_table(tenant, namespace, table)
        access = await cat.service.catalog_access(tenant, entry)
        metrics.record_catalog_access(bool(access.credentials))
        result = _load_result(entry, access)
        if result["config"]:  # see iceberg_plans.planning_config
            result["config"].update(iceberg_plans.planning_config(cat.calls))
        return JSONResponse(result)

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
