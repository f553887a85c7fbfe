"""``/console``: the pages, the actions and the JSON the pages refresh themselves with.

Pages are rendered on the server (Jinja2, every value escaped); actions are HTML forms
that post back and are redirected to a page (a new API key is the exception: it is shown
once, on the answer itself, never stored). A refused action or bad input is answered with
the page's one sentence from the service that refused it.
"""

# No ``from __future__ import annotations``: the routes' parameter types (``Looker``,
# ``Changer``) are made inside console_router, and FastAPI must see them as objects.
import json
from collections.abc import AsyncIterator, Callable, Coroutine
from pathlib import Path
from typing import Annotated, Any

import jinja2
from fastapi import APIRouter, Depends, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse, RedirectResponse, Response
from fastapi.routing import APIRoute
from starlette.datastructures import FormData

from gateway.core.names import INT64_MAX
from gateway.server.calls import DataCalls
from gateway.server.http.bodies import error_response
from gateway.server.http.console import facts
from gateway.server.http.console.access import (
    CrossSite,
    SignInNeeded,
    Viewer,
    check_same_site,
    viewer_of,
)
from gateway.server.http.console.session import LOGIN_COOKIE, SESSION_COOKIE, Sessions
from gateway.tenancy import Tenancy
from gateway.wire.errors import InvalidRequest, TidegateError
from gateway.wire.schema import fields_to_json, parse_fields_text
from gateway.wire.types import QUOTA_FIELDS

__all__ = ["PREFIX", "console_router"]

PREFIX = "/console"
TEMPLATES = Path(__file__).parent / "templates"
#: How long a session lasts after sign-in.
SESSION_S = 8 * 3600
#: Records on one page of the record browser, at most.
MAX_RECORDS = 500
#: Tenants or tables on one page of the console (a search narrows them; "Next" pages on).
CONSOLE_PAGE = 50

#: Sent with every console answer: scripts, styles and data only from the gateway itself, no
#: framing, no referrer to other sites (``same-origin``, not ``no-referrer``: with the latter
#: Chromium sends ``Origin: null`` with our own forms), nothing cached (pages carry a
#: tenant's data; one carries a new key).
SECURITY_HEADERS = {
    "content-security-policy": "default-src 'none'; script-src 'self'; style-src 'self'; "
    "img-src 'self' data:; connect-src 'self'; form-action 'self'; base-uri 'none'; "
    "frame-ancestors 'none'",
    "x-frame-options": "DENY",
    "x-content-type-options": "nosniff",
    "referrer-policy": "same-origin",
    "cache-control": "no-store",
}


def _environment() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(TEMPLATES),
        autoescape=True,  # every value is text, whatever it holds
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters["bytes"] = _human_bytes
    env.filters["cell"] = _cell
    env.filters["count"] = "{:,}".format  # 60,000, as the page's script writes it
    env.globals["prefix"] = PREFIX
    env.globals["when"] = facts.when  # times to the second, in UTC
    return env


def _cell(value: Any) -> str:
    """A record's value as the record browser shows it: lists and structs as JSON."""
    if value is None:
        return ""
    if isinstance(value, dict | list):
        return json.dumps(value, ensure_ascii=False, default=str)
    return str(value)


def _human_bytes(n: int | None) -> str:
    if n is None:
        return ""
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if size < 1024 or unit == "TiB":
            return f"{int(size)} B" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{n} B"  # pragma: no cover - the loop always returns


def _form_int(form: FormData, name: str, what: str) -> int | None:
    """An optional integer field of a form (empty: None)."""
    raw = form.get(name)
    text = raw.strip() if isinstance(raw, str) else ""
    if not text:
        return None
    try:
        return int(text)
    except ValueError:
        raise InvalidRequest(f"{what} must be a whole number, got {text[:40]!r}") from None


def _bounded(what: str, text: str, default: int, low: int, high: int) -> int:
    """A whole number from ``low`` to ``high`` written in a query (empty: ``default``)."""
    text = text.strip()
    if not text:
        return default
    try:
        value = int(text)
    except ValueError:
        value = None
    if value is None or not low <= value <= high:
        raise InvalidRequest(f"{what} must be a whole number from {low} to {high}, got {text!r}")
    return value


def _form_text(form: FormData, name: str) -> str:
    raw = form.get(name)
    return raw.strip() if isinstance(raw, str) else ""


def _listing(request: Request) -> tuple[str, str]:
    """The search string (``q``) and page token (``page``) of a listing page."""
    q = request.query_params
    return q.get("q", "").strip(), q.get("page", "")


def console_router(tenancy: Tenancy, calls: DataCalls) -> APIRouter:
    """The console over this gateway's tenancy and data calls."""
    env = _environment()
    service = calls.service
    sessions = Sessions(
        tenancy.auth.derive_secret("console-session"),
        tenancy.auth.derive_secret("console-csrf"),
        SESSION_S,
    )

    def render(request: Request, template: str, status: int = 200, **context: Any) -> HTMLResponse:
        html = env.get_template(template).render(request=request, **context)
        return HTMLResponse(html, status_code=status, headers=SECURITY_HEADERS)

    def failure(request: Request, exc: Exception) -> Response:
        """An error as the console answers it: JSON for its own API, else a page saying
        it in one sentence (sign-in page for a missing or refused session)."""
        if isinstance(exc, RequestValidationError):
            first = exc.errors()[0] if exc.errors() else {}
            where = ".".join(str(p) for p in first.get("loc", ())[1:]) or "the request"
            exc = InvalidRequest(f"{where}: {first.get('msg', 'invalid value')}")
        assert isinstance(exc, TidegateError)
        if request.url.path.startswith(f"{PREFIX}/api/"):
            response = error_response(exc)
            response.headers.update(SECURITY_HEADERS)
            return response
        if isinstance(exc, SignInNeeded) and request.method == "GET":
            return RedirectResponse(f"{PREFIX}/login", 303, headers=SECURITY_HEADERS)
        return render(request, "error.html", exc.http_status, error=exc, viewer=None)

    class ConsoleRoute(APIRoute):
        def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
            handler = super().get_route_handler()

            async def handle(request: Request) -> Response:
                try:
                    return await handler(request)
                except (TidegateError, RequestValidationError) as exc:
                    return failure(request, exc)

            return handle

    router = APIRouter(prefix=PREFIX, route_class=ConsoleRoute, include_in_schema=False)

    async def looker(request: Request) -> AsyncIterator[Viewer]:
        async for viewer in viewer_of(request, tenancy, sessions, changes=False):
            yield viewer

    async def changer(request: Request) -> AsyncIterator[Viewer]:
        async for viewer in viewer_of(request, tenancy, sessions, changes=True):
            yield viewer

    Looker = Annotated[Viewer, Depends(looker)]
    Changer = Annotated[Viewer, Depends(changer)]

    def back(url: str) -> RedirectResponse:
        return RedirectResponse(url, 303, headers=SECURITY_HEADERS)

    def tenant_url(tenant: str) -> str:
        return f"{PREFIX}/tenants/{tenant}"

    # Signing in and out ----------------------------------------------------------------
    @router.get("")
    async def home(request: Request) -> Response:
        sealed = sessions.open(request.cookies.get(SESSION_COOKIE))
        if sealed is None:
            return back(f"{PREFIX}/login")
        return back(f"{PREFIX}/tenants")

    def login_form(request: Request, error: TidegateError | None = None) -> Response:
        """The sign-in page, with a fresh token for its form in a cookie of its own."""
        token = sessions.login_token()
        status = 200 if error is None else error.http_status
        response = render(request, "login.html", status, csrf=token, viewer=None, error=error)
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
        key = _form_text(form, "key")
        try:
            principal = await tenancy.authenticate(f"Bearer {key}")
        except TidegateError as exc:
            return login_form(request, exc)
        where = f"{PREFIX}/tenants"
        if principal.tenant is not None:
            where = tenant_url(principal.tenant)
        response = back(where)
        response.set_cookie(
            SESSION_COOKIE, sessions.seal(key), max_age=SESSION_S, path=PREFIX,
            httponly=True, samesite="strict", secure=request.url.scheme == "https",
        )  # fmt: skip
        response.delete_cookie(LOGIN_COOKIE, path=PREFIX, httponly=True, samesite="strict")
        return response

    @router.post("/logout")
    async def logout(request: Request) -> Response:
        # Not a Changer: a session whose key was revoked meanwhile may still sign out.
        check_same_site(request)
        sealed = sessions.open(request.cookies.get(SESSION_COOKIE))
        form = await request.form()
        if sealed is not None and not sessions.csrf_ok(sealed.cookie, form.get("csrf")):
            raise CrossSite("the form's CSRF token is missing or wrong; reload the page")
        response = back(f"{PREFIX}/login")
        response.delete_cookie(SESSION_COOKIE, path=PREFIX, httponly=True, samesite="strict")
        return response

    # Tenants ---------------------------------------------------------------------------
    @router.get("/tenants")
    async def tenants_page(request: Request, viewer: Looker) -> Response:
        if viewer.tenant is not None:
            return back(tenant_url(viewer.tenant))
        search, token = _listing(request)
        page = await tenancy.admin.list_tenants_page(CONSOLE_PAGE, token, search)
        return render(
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
        found = await tenancy.admin.placements(viewer.tenant)
        pins = {
            shard: owner
            for shard, owner in found["pins"].items()
            if viewer.is_operator or owner == viewer.tenant
        }
        return render(
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
        name = _form_text(await request.form(), "name")
        await tenancy.admin.create_tenant(name)
        return back(tenant_url(name))

    @router.get("/tenants/{tenant}")
    async def tenant_page(request: Request, tenant: str, viewer: Looker) -> Response:
        viewer.see(tenant)
        info = await tenancy.admin.get_tenant(tenant)
        keys = await tenancy.admin.list_keys(tenant)
        quota = await tenancy.admin.get_quota(tenant)
        search, token = _listing(request)
        tables = await service.list_tables_page(tenant, None, CONSOLE_PAGE, token, search)
        return render(
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
        await tenancy.admin.suspend(tenant)
        return back(tenant_url(tenant))

    @router.post("/tenants/{tenant}/resume")
    async def resume(tenant: str, viewer: Changer) -> Response:
        viewer.operate("resume tenants")
        await tenancy.admin.resume(tenant)
        return back(tenant_url(tenant))

    @router.post("/tenants/{tenant}/keys")
    async def issue_key(request: Request, tenant: str, viewer: Changer) -> Response:
        viewer.operate("issue keys")
        info, key = await tenancy.admin.issue_key(tenant)
        return render(request, "key.html", 201, viewer=viewer, info=info, key=key)

    @router.post("/tenants/{tenant}/keys/{key_id}/revoke")
    async def revoke_key(tenant: str, key_id: str, viewer: Changer) -> Response:
        viewer.operate("revoke keys")
        await tenancy.admin.revoke_key(key_id, tenant)
        return back(tenant_url(tenant))

    @router.post("/tenants/{tenant}/quota")
    async def set_quota(request: Request, tenant: str, viewer: Changer) -> Response:
        viewer.operate("set quotas")
        form = await request.form()
        values = {f: _form_int(form, f, f"quota {f}") for f in QUOTA_FIELDS}
        await tenancy.admin.set_quota(tenant, values)
        return back(tenant_url(tenant))

    @router.get("/tenants/{tenant}/groups")
    async def groups_page(request: Request, tenant: str, viewer: Looker) -> Response:
        viewer.see(tenant)
        groups = await facts.group_lags(service, tenant)
        return render(request, "groups.html", viewer=viewer, tenant=tenant, groups=groups)

    # Tables ----------------------------------------------------------------------------
    def table_url(tenant: str, namespace: str, name: str) -> str:
        return f"{tenant_url(tenant)}/tables/{namespace}/{name}"

    @router.post("/tenants/{tenant}/tables")
    async def create_table(request: Request, tenant: str, viewer: Changer) -> Response:
        viewer.see(tenant)
        form = await request.form()
        namespace, name = _form_text(form, "namespace"), _form_text(form, "name")
        partitions = _form_int(form, "partitions", "partitions")
        keys = [k.strip() for k in _form_text(form, "key_columns").split(",") if k.strip()]
        fields = parse_fields_text(_form_text(form, "schema"))
        await calls.create_table(
            tenant, namespace, name, fields, 1 if partitions is None else partitions, keys
        )
        return back(table_url(tenant, namespace, name))

    @router.get("/tenants/{tenant}/tables/{namespace}/{name}")
    async def table_page(
        request: Request, tenant: str, namespace: str, name: str, viewer: Looker
    ) -> Response:
        viewer.see(tenant)
        page = await facts.table_page(calls, tenant, namespace, name)
        catalog = None
        if request.app.state.iceberg:
            uri = f"{str(request.base_url).rstrip('/')}/iceberg"
            catalog = {"uri": uri, **facts.engine_snippets(uri, tenant, namespace, name)}
        return render(
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
        typed = _form_text(await request.form(), "confirm")
        if typed != f"{namespace}.{name}":
            raise InvalidRequest(
                f"to drop the table, type its name {namespace}.{name} again (got {typed[:60]!r})"
            )
        await service.drop_table(tenant, namespace, name)
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
        table = await service.table(tenant, namespace, name)
        records = await facts.read_records(
            calls,
            tenant,
            namespace,
            name,
            _bounded("partition", partition, 0, 0, table.definition.partitions - 1),
            _bounded("offset", offset, 0, 0, INT64_MAX),
            time,
            _bounded("limit", limit, 50, 1, MAX_RECORDS),
        )
        return render(
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

    # JSON the pages refresh themselves with ---------------------------------------------
    @router.get("/api/tenants/{tenant}/usage")
    async def usage(
        tenant: str, viewer: Looker, minutes: Annotated[int, Query(ge=1, le=7 * 24 * 60)] = 120
    ) -> Response:
        viewer.see(tenant)
        series = await facts.usage_series(tenancy, tenant, minutes)
        return JSONResponse(series, headers=SECURITY_HEADERS)

    @router.get("/api/tenants/{tenant}/tables/{namespace}/{name}/live")
    async def live(tenant: str, namespace: str, name: str, viewer: Looker) -> Response:
        viewer.see(tenant)
        got = await facts.live_table(service, tenant, namespace, name)
        return JSONResponse(got, headers=SECURITY_HEADERS)

    return router
