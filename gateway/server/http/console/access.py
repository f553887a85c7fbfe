"""Who is looking at the console, and what they may see and do.

Every request opens the session cookie and hands the key inside to the gateway's
:class:`~gateway.tenancy.Tenancy`, exactly as the JSON API hands it the ``authorization``
header: the operator key is the operator, a tenant key is its tenant (counted, charged and
admitted as any data-plane request of the tenant), and a revoked key or a suspended tenant is
refused by the same code. The console adds one rule: a tenant sees only itself, and another
tenant is answered as a missing one (``TENANT_NOT_FOUND``), so an id typed into the URL
reveals nothing.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from urllib.parse import urlsplit

from fastapi import Request

from gateway.server.http.console.session import SESSION_COOKIE, Sessions
from gateway.tenancy import Tenancy
from gateway.wire.errors import PermissionDenied, TenantNotFound, TidegateError

__all__ = ["CrossSite", "SignInNeeded", "Viewer", "check_same_site", "viewer_of"]


class SignInNeeded(TidegateError):
    """No session, or one whose key no longer stands: the console asks to sign in."""

    http_status = 401
    reason = "UNAUTHENTICATED"


class CrossSite(PermissionDenied):
    """A state-changing request without this session's CSRF token or from another site."""


@dataclass(frozen=True, slots=True)
class Viewer:
    """The signed-in operator (``tenant is None``) or tenant, and the session's CSRF token."""

    tenant: str | None
    authorization: str
    cookie: str
    csrf: str

    @property
    def is_operator(self) -> bool:
        return self.tenant is None

    def see(self, tenant: str) -> str:
        """``tenant`` when this viewer may look at it.

        Raises:
            TenantNotFound: another tenant, for a tenant's session (as if it did not exist).
        """
        if self.tenant is not None and tenant != self.tenant:
            raise TenantNotFound(f"tenant {tenant!r} not found", tenant=tenant)
        return tenant

    def operate(self, what: str) -> None:
        """Raises: PermissionDenied for a tenant's session (``what`` is operator-only)."""
        if self.tenant is not None:
            raise PermissionDenied(f"only the operator may {what}; sign in with the operator key")


def check_same_site(request: Request) -> None:
    """Refuse a state-changing request that a browser says comes from another site.

    Raises:
        CrossSite: an ``Origin`` of another host, or ``Sec-Fetch-Site: cross-site``.
    """
    origin = request.headers.get("origin")
    if origin is not None and urlsplit(origin).netloc != request.headers.get("host"):
        raise CrossSite("a request from another site was refused")
    if request.headers.get("sec-fetch-site") == "cross-site":
        raise CrossSite("a request from another site was refused")


async def viewer_of(
    request: Request, tenancy: Tenancy, sessions: Sessions, *, changes: bool
) -> AsyncIterator[Viewer]:
    """The request's viewer, held admitted (a tenant's in-flight slot) while it is served.

    ``changes``: the request changes something, so it must carry the session's CSRF token
    in its form (field ``csrf``) and come from this site.

    Raises:
        SignInNeeded: no session, or its key is refused (revoked, unknown).
        TenantSuspended: the tenant is suspended.
        CrossSite: a state-changing request without the token, or from another site.
    """
    sealed = sessions.open(request.cookies.get(SESSION_COOKIE))
    if sealed is None:
        raise SignInNeeded("sign in to use the console")
    if changes:
        check_same_site(request)
        form = await request.form()
        if not sessions.csrf_ok(sealed.cookie, form.get("csrf")):
            raise CrossSite("the form's CSRF token is missing or wrong; reload the page")
    authorization = f"Bearer {sealed.key}"
    try:
        principal = await tenancy.authenticate(authorization)
    except TidegateError as exc:
        if exc.http_status == 401:
            raise SignInNeeded("the key of this session is no longer accepted; sign in") from None
        raise
    csrf = sessions.csrf(sealed.cookie)
    if principal.tenant is None:
        yield Viewer(None, authorization, sealed.cookie, csrf)
        return
    # A tenant's console request is a data-plane request of the tenant: counted, charged
    # against requests/s and holding one of its in-flight slots, as over /v1.
    tenant = await tenancy.tenant_of(authorization)
    async with tenancy.admit(tenant):
        yield Viewer(tenant, authorization, sealed.cookie, csrf)
