"""What every console route shares (:class:`Console`): the tenancy, the data calls, the
sealed sessions, the pages' rendering with the headers sent with every answer, an error
as the console answers it, and the small readers of forms and queries."""

# No ``from __future__ import annotations``: FastAPI must see the dependencies' types.
import json
from collections.abc import AsyncIterator, Callable, Coroutine
from pathlib import Path
from typing import Any

import jinja2
from fastapi import Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from fastapi.routing import APIRoute
from starlette.datastructures import FormData

from gateway.server.calls import DataCalls
from gateway.server.http.bodies import error_response
from gateway.server.http.console import facts
from gateway.server.http.console.access import SignInNeeded, Viewer, viewer_of
from gateway.server.http.console.session import Sessions
from gateway.tenancy import Tenancy
from gateway.wire.errors import InvalidRequest, TidegateError

__all__ = [
    "CONSOLE_PAGE",
    "MAX_RECORDS",
    "PREFIX",
    "SECURITY_HEADERS",
    "SESSION_S",
    "Console",
    "back",
    "bounded",
    "form_int",
    "form_text",
    "listing",
    "table_url",
    "tenant_url",
]

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


def form_int(form: FormData, name: str, what: str) -> int | None:
    """An optional integer field of a form (empty: None)."""
    raw = form.get(name)
    text = raw.strip() if isinstance(raw, str) else ""
    if not text:
        return None
    try:
        return int(text)
    except ValueError:
        raise InvalidRequest(f"{what} must be a whole number, got {text[:40]!r}") from None


def bounded(what: str, text: str, default: int, low: int, high: int) -> int:
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


def form_text(form: FormData, name: str) -> str:
    raw = form.get(name)
    return raw.strip() if isinstance(raw, str) else ""


def listing(request: Request) -> tuple[str, str]:
    """The search string (``q``) and page token (``page``) of a listing page."""
    q = request.query_params
    return q.get("q", "").strip(), q.get("page", "")


def back(url: str) -> RedirectResponse:
    return RedirectResponse(url, 303, headers=SECURITY_HEADERS)


def tenant_url(tenant: str) -> str:
    return f"{PREFIX}/tenants/{tenant}"


def table_url(tenant: str, namespace: str, name: str) -> str:
    return f"{tenant_url(tenant)}/tables/{namespace}/{name}"


class Console:
    """The console over this gateway's tenancy and data calls: what its routes share."""

    def __init__(self, tenancy: Tenancy, calls: DataCalls) -> None:
        self.tenancy = tenancy
        self.calls = calls
        self.service = calls.service
        self.env = _environment()
        self.sessions = Sessions(
            tenancy.auth.derive_secret("console-session"),
            tenancy.auth.derive_secret("console-csrf"),
            SESSION_S,
        )

    def render(
        self, request: Request, template: str, status: int = 200, **context: Any
    ) -> HTMLResponse:
        html = self.env.get_template(template).render(request=request, **context)
        return HTMLResponse(html, status_code=status, headers=SECURITY_HEADERS)

    def failure(self, request: Request, exc: Exception) -> Response:
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
        return self.render(request, "error.html", exc.http_status, error=exc, viewer=None)

    def route_class(self) -> type[APIRoute]:
        """The class of the console's routes: a refused request answered by
        :meth:`failure`."""
        failure = self.failure

        class ConsoleRoute(APIRoute):
            def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
                handler = super().get_route_handler()

                async def handle(request: Request) -> Response:
                    try:
                        return await handler(request)
                    except (TidegateError, RequestValidationError) as exc:
                        return failure(request, exc)

                return handle

        return ConsoleRoute

    async def looker(self, request: Request) -> AsyncIterator[Viewer]:
        """Who is looking (a dependency of the pages that only show)."""
        async for viewer in viewer_of(request, self.tenancy, self.sessions, changes=False):
            yield viewer

    async def changer(self, request: Request) -> AsyncIterator[Viewer]:
        """Who is changing something (a dependency of the forms' actions)."""
        async for viewer in viewer_of(request, self.tenancy, self.sessions, changes=True):
            yield viewer
