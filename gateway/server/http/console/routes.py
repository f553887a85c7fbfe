"""``/console``: the pages, the actions and the JSON the pages refresh themselves with.

Pages are rendered on the server (Jinja2, every value escaped); actions are HTML forms
that post back and are redirected to a page (a new API key is the exception: it is shown
once, on the answer itself, never stored). A refused action or bad input is answered with
the page's one sentence from the service that refused it.
"""

# No ``from __future__ import annotations``: the routes' parameter types (``Looker``,
# ``Changer``) are made inside each group of routes, and FastAPI must see them as objects.
from typing import Annotated

from fastapi import APIRouter, Depends, Query, Request
from fastapi.responses import JSONResponse, Response

from gateway.core.names import INT64_MAX
from gateway.server.calls import DataCalls
from gateway.server.http.console import facts
from gateway.server.http.console.access import CrossSite, Viewer, check_same_site
from gateway.server.http.console.context import (
    CONSOLE_PAGE,
    MAX_RECORDS,
    PREFIX,
    SECURITY_HEADERS,
    SESSION_S,
    Console,
    back,
    bounded,
    form_int,
    form_text,
    listing,
    table_url,
    tenant_url,
)
from gateway.server.http.console.session import LOGIN_COOKIE, SESSION_COOKIE, Sessions
from gateway.tenancy import Tenancy
from gateway.wire.errors import InvalidRequest, TidegateError
from gateway.wire.schema import fields_to_json, parse_fields_text
from gateway.wire.types import QUOTA_FIELDS

__all__ = ["PREFIX", "console_router"]


def console_router(tenancy: Tenancy, calls: DataCalls) -> APIRouter:
    """The console over this gateway's tenancy and data calls: its routes by what they
    concern, in this order."""
    c = Console(tenancy, calls)
    router = APIRouter(prefix=PREFIX, route_class=c.route_class(), include_in_schema=False)
    _sign_in_routes(router, c)
    _tenant_routes(router, c)
    _table_routes(router, c)
    _api_routes(router, c)
    return router


def _sign_in_routes(router: APIRouter, c: Console) -> None:
    """Signing in and out."""

    @router.get("")
    async def home(request: Request) -> Response:
        sealed = c.sessions.open(request.cookies.get(SESSION_COOKIE))
        if sealed is None:
            return back(f"{PREFIX}/login")
        return back(f"{PREFIX}/tenants")

    def login_form(request: Request, error: TidegateError | None = None) -> Response:
        """The sign-in page, with a fresh token for its form in a cookie of its own."""
        token = c.sessions.login_token()
        status = 200 if error is None else error.http_status
        response = c.render(request, "login.html", status, csrf=token, viewer=None, error=error)
        response.set_cookie(
            LOGIN_COOKIE, token, path=PREFIX, httponly=True, samesite="strict",
            secure=request.url.scheme == "https",
        )  # fmt: skip
        return response

    @router.get("/login")
    async def login_page(request: Request) -> Response:
        return login_form(request)

    @router.post("/login")
    async def login(request: Request) -> Response:
        check_same_site(request)
        form = await request.form()
        sent = form.get("csrf")
        if not Sessions.same(request.cookies.get(LOGIN_COOKIE), sent):
            raise CrossSite("the sign-in form expired or came from another site; sign in again")
        key = form_text(form, "key")
        try:
            principal = await c.tenancy.authenticate(f"Bearer {key}")
        except TidegateError as exc:
            return login_form(request, exc)
        where = f"{PREFIX}/tenants"
        if principal.tenant is not None:
            where = tenant_url(principal.tenant)
        response = back(where)
        response.set_cookie(
            SESSION_COOKIE, c.sessions.seal(key), max_age=SESSION_S, path=PREFIX,
            httponly=True, samesite="strict", secure=request.url.scheme == "https",
        )  # fmt: skip
        response.delete_cookie(LOGIN_COOKIE, path=PREFIX, httponly=True, samesite="strict")
        return response

    @router.post("/logout")
    async def logout(request: Request) -> Response:
        # Not a Changer: a session whose key was revoked meanwhile may still sign out.
        check_same_site(request)
        sealed = c.sessions.open(request.cookies.get(SESSION_COOKIE))
        form = await request.form()
        if sealed is not None and not c.sessions.csrf_ok(sealed.cookie, form.get("csrf")):
            raise CrossSite("the form's CSRF token is missing or wrong; reload the page")
        response = back(f"{PREFIX}/login")
        response.delete_cookie(SESSION_COOKIE, path=PREFIX, httponly=True, samesite="strict")
        return response


def _tenant_routes(router: APIRouter, c: Console) -> None:
    """Tenants, their keys, quotas and groups, and the hot tier's shards."""
    Looker = Annotated[Viewer, Depends(c.looker)]
    Changer = Annotated[Viewer, Depends(c.changer)]

    @router.get("/tenants")
    async def tenants_page(request: Request, viewer: Looker) -> Response:
        if viewer.tenant is not None:
            return back(tenant_url(viewer.tenant))
        search, token = listing(request)
        page = await c.tenancy.admin.list_tenants_page(CONSOLE_PAGE, token, search)
        return c.render(
            request,
            "tenants.html",
            viewer=viewer,
            tenants=page.items,
            search=search,
            next_page=page.next_page_token,
        )

    # Shards ----------------------------------------------------------------------------
    @router.get("/shards")
    async def shards_page(request: Request, viewer: Looker) -> Response:
        """The hot tier's shards, who reserved them and where each partition's segments
        live: all of it for the operator, a tenant's own partitions and shards for it."""
        found = await c.tenancy.admin.placements(viewer.tenant)
        pins = {
            shard: owner
            for shard, owner in found["pins"].items()
            if viewer.is_operator or owner == viewer.tenant
        }
        return c.render(
            request,
            "shards.html",
            viewer=viewer,
            shards=found["shards"],
            pins=pins,
            placements=found["placements"],
        )

    @router.post("/tenants")
    async def create_tenant(request: Request, viewer: Changer) -> Response:
        viewer.operate("create tenants")
        name = form_text(await request.form(), "name")
        await c.tenancy.admin.create_tenant(name)
        return back(tenant_url(name))

    @router.get("/tenants/{tenant}")
    async def tenant_page(request: Request, tenant: str, viewer: Looker) -> Response:
        viewer.see(tenant)
        info = await c.tenancy.admin.get_tenant(tenant)
        keys = await c.tenancy.admin.list_keys(tenant)
        quota = await c.tenancy.admin.get_quota(tenant)
        search, token = listing(request)
        tables = await c.service.list_tables_page(tenant, None, CONSOLE_PAGE, token, search)
        return c.render(
            request,
            "tenant.html",
            viewer=viewer,
            tenant=info,
            keys=keys,
            quota=[(f, quota.get(f)) for f in QUOTA_FIELDS],
            tables=[t.definition for t in tables.items],
            search=search,
            next_page=tables.next_page_token,
        )

    @router.post("/tenants/{tenant}/suspend")
    async def suspend(tenant: str, viewer: Changer) -> Response:
        viewer.operate("suspend tenants")
        await c.tenancy.admin.suspend(tenant)
        return back(tenant_url(tenant))

    @router.post("/tenants/{tenant}/resume")
    async def resume(tenant: str, viewer: Changer) -> Response:
        viewer.operate("resume tenants")
        await c.tenancy.admin.resume(tenant)
        return back(tenant_url(tenant))

    @router.post("/tenants/{tenant}/keys")
    async def issue_key(request: Request, tenant: str, viewer: Changer) -> Response:
        viewer.operate("issue keys")
        info, key = await c.tenancy.admin.issue_key(tenant)
        return c.render(request, "key.html", 201, viewer=viewer, info=info, key=key)

    @router.post("/tenants/{tenant}/keys/{key_id}/revoke")
    async def revoke_key(tenant: str, key_id: str, viewer: Changer) -> Response:
        viewer.operate("revoke keys")
        await c.tenancy.admin.revoke_key(key_id, tenant)
        return back(tenant_url(tenant))

    @router.post("/tenants/{tenant}/quota")
    async def set_quota(request: Request, tenant: str, viewer: Changer) -> Response:
        viewer.operate("set quotas")
        form = await request.form()
        values = {f: form_int(form, f, f"quota {f}") for f in QUOTA_FIELDS}
        await c.tenancy.admin.set_quota(tenant, values)
        return back(tenant_url(tenant))

    @router.get("/tenants/{tenant}/groups")
    async def groups_page(request: Request, tenant: str, viewer: Looker) -> Response:
        viewer.see(tenant)
        groups = await facts.group_lags(c.service, tenant)
        return c.render(request, "groups.html", viewer=viewer, tenant=tenant, groups=groups)


def _table_routes(router: APIRouter, c: Console) -> None:
    """A tenant's tables and the record browser."""
    Looker = Annotated[Viewer, Depends(c.looker)]
    Changer = Annotated[Viewer, Depends(c.changer)]

    @router.post("/tenants/{tenant}/tables")
    async def create_table(request: Request, tenant: str, viewer: Changer) -> Response:
        viewer.see(tenant)
        form = await request.form()
        namespace, name = form_text(form, "namespace"), form_text(form, "name")
        partitions = form_int(form, "partitions", "partitions")
        keys = [k.strip() for k in form_text(form, "key_columns").split(",") if k.strip()]
        fields = parse_fields_text(form_text(form, "schema"))
        await c.calls.create_table(
            tenant, namespace, name, fields, 1 if partitions is None else partitions, keys
        )
        return back(table_url(tenant, namespace, name))

    @router.get("/tenants/{tenant}/tables/{namespace}/{name}")
    async def table_page(
        request: Request, tenant: str, namespace: str, name: str, viewer: Looker
    ) -> Response:
        viewer.see(tenant)
        page = await facts.table_page(c.calls, tenant, namespace, name)
        catalog = None
        if request.app.state.iceberg:
            uri = f"{str(request.base_url).rstrip('/')}/iceberg"
            catalog = {"uri": uri, **facts.engine_snippets(uri, tenant, namespace, name)}
        return c.render(
            request,
            "table.html",
            viewer=viewer,
            tenant=tenant,
            page=page,
            table=page.view.definition,
            schema=fields_to_json(page.view.schema),
            catalog=catalog,
        )

    @router.post("/tenants/{tenant}/tables/{namespace}/{name}/drop")
    async def drop_table(
        request: Request, tenant: str, namespace: str, name: str, viewer: Changer
    ) -> Response:
        viewer.see(tenant)
        typed = form_text(await request.form(), "confirm")
        if typed != f"{namespace}.{name}":
            raise InvalidRequest(
                f"to drop the table, type its name {namespace}.{name} again (got {typed[:60]!r})"
            )
        await c.service.drop_table(tenant, namespace, name)
        return back(tenant_url(tenant))

    @router.get("/tenants/{tenant}/tables/{namespace}/{name}/records")
    async def records_page(
        request: Request,
        tenant: str,
        namespace: str,
        name: str,
        viewer: Looker,
        partition: Annotated[str, Query(max_length=20)] = "0",
        offset: Annotated[str, Query(max_length=20)] = "",
        time: Annotated[str, Query(max_length=64)] = "",
        limit: Annotated[str, Query(max_length=20)] = "50",
    ) -> Response:
        # Text, not int: the browse form sends its empty fields as empty strings.
        viewer.see(tenant)
        table = await c.service.table(tenant, namespace, name)
        records = await facts.read_records(
            c.calls,
            tenant,
            namespace,
            name,
            bounded("partition", partition, 0, 0, table.definition.partitions - 1),
            bounded("offset", offset, 0, 0, INT64_MAX),
            time,
            bounded("limit", limit, 50, 1, MAX_RECORDS),
        )
        return c.render(
            request,
            "records.html",
            viewer=viewer,
            tenant=tenant,
            table=table.definition,
            partition=partition,
            records=records,
            limit=limit,
            time=time,
        )


def _api_routes(router: APIRouter, c: Console) -> None:
    """JSON the pages refresh themselves with."""
    Looker = Annotated[Viewer, Depends(c.looker)]

    @router.get("/api/tenants/{tenant}/usage")
    async def usage(
        tenant: str, viewer: Looker, minutes: Annotated[int, Query(ge=1, le=7 * 24 * 60)] = 120
    ) -> Response:
        viewer.see(tenant)
        series = await facts.usage_series(c.tenancy, tenant, minutes)
        return JSONResponse(series, headers=SECURITY_HEADERS)

    @router.get("/api/tenants/{tenant}/tables/{namespace}/{name}/live")
    async def live(tenant: str, namespace: str, name: str, viewer: Looker) -> Response:
        viewer.see(tenant)
        got = await facts.live_table(c.service, tenant, namespace, name)
        return JSONResponse(got, headers=SECURITY_HEADERS)
