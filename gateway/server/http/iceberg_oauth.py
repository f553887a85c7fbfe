"""``/iceberg/v1/oauth/tokens``: the Iceberg catalog's OAuth2 token route, which exchanges a
tenant's API key (client credentials) or a token of its own (token exchange) for an access
token, and answers its errors in the OAuth2 shape, ``{"error", "error_description"}``."""

# No ``from __future__ import annotations``: FastAPI must see the route's types as objects.
import base64
import binascii
from urllib.parse import parse_qsl

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from gateway import metrics
from gateway.server.http.bodies import media_type, read_body
from gateway.tenancy import Tenancy
from gateway.wire.errors import InvalidRequest, PermissionDenied, Unauthenticated

__all__ = ["ACCESS_TOKEN_TYPE", "TOKEN_EXCHANGE", "OAuthError", "token_route"]

#: Largest body the token route reads (a form of a few short fields).
_TOKEN_BODY = 8 * 1024
_FORM_FIELDS = 32
TOKEN_EXCHANGE = "urn:ietf:params:oauth:grant-type:token-exchange"
ACCESS_TOKEN_TYPE = "urn:ietf:params:oauth:token-type:access_token"


class OAuthError(Exception):
    def __init__(self, status: int, error: str, description: str) -> None:
        super().__init__(description)
        self.status, self.error, self.description = status, error, description

    def response(self) -> JSONResponse:
        headers = {"cache-control": "no-store"}
        if self.status == 401:
            headers["www-authenticate"] = 'Basic realm="iceberg"'
        body = {"error": self.error, "error_description": self.description}
        return JSONResponse(body, status_code=self.status, headers=headers)


def _basic(authorization: str | None) -> tuple[str, str] | None:
    """``(client_id, client_secret)`` of an ``authorization: Basic`` header, or None when
    the header is absent or another scheme.

    Raises:
        OAuthError: a Basic header that does not decode.
    """
    if not authorization:
        return None
    scheme, _, value = authorization.strip().partition(" ")
    if scheme.lower() != "basic":
        return None
    try:
        text = base64.b64decode(value.strip(), validate=True).decode("utf-8")
    except (binascii.Error, UnicodeDecodeError):
        raise OAuthError(
            401, "invalid_client", "the Basic credentials are not base64 of 'client_id:secret'"
        ) from None
    client_id, sep, secret = text.partition(":")
    if not sep:
        raise OAuthError(
            401, "invalid_client", "the Basic credentials must be 'client_id:client_secret'"
        )
    return client_id, secret


async def _form(request: Request) -> dict[str, str]:
    """The token request's ``application/x-www-form-urlencoded`` fields.

    Raises:
        OAuthError: another media type, a body over 8 KiB, or a form that does not parse.
    """
    kind = media_type(request.headers.get("content-type"))
    try:
        body = await read_body(request, _TOKEN_BODY)
    except InvalidRequest as exc:
        raise OAuthError(400, "invalid_request", exc.message) from None
    if not body.strip():
        return {}
    if kind != "application/x-www-form-urlencoded":
        raise OAuthError(
            400,
            "invalid_request",
            f"the token request must be application/x-www-form-urlencoded, not {kind[:80]!r}",
        )
    try:
        text = body.decode("utf-8")
        pairs = parse_qsl(
            text, keep_blank_values=True, strict_parsing=True, max_num_fields=_FORM_FIELDS
        )
    except (UnicodeDecodeError, ValueError):
        raise OAuthError(
            400, "invalid_request", "the token request's body is not a URL-encoded form"
        ) from None
    form: dict[str, str] = {}
    for key, value in pairs:
        if key in form:
            raise OAuthError(400, "invalid_request", f"the form field {key[:40]!r} is repeated")
        form[key] = value
    return form


def token_route(router: APIRouter, tenancy: Tenancy) -> None:
    """The token route, on the catalog's ``router``."""

    @router.post(
        "/oauth/tokens",
        summary="Exchange the tenant's API key for an access token (OAuth2 client "
        "credentials: client_id = the tenant or empty, client_secret = the key).",
    )
    async def get_token(request: Request) -> Response:
        """``grant_type=client_credentials`` with the credentials as HTTP Basic or form
        fields, or ``grant_type=urn:ietf:params:oauth:grant-type:token-exchange`` with
        ``subject_token`` (a token of this route, to get a fresh one). The token expires
        after ``cold.rest_catalog.token_ttl_s`` and stops working as soon as the key is
        revoked or the tenant suspended."""
        basic = _basic(request.headers.get("authorization"))
        form = await _form(request)
        grant = form.get("grant_type", "")
        if grant == "client_credentials":
            client_id, secret = basic or (form.get("client_id", ""), form.get("client_secret", ""))
            if not secret:
                raise OAuthError(
                    400,
                    "invalid_request",
                    "client_credentials needs client_secret (the tenant's API key), as a "
                    "form field or HTTP Basic",
                )
        elif grant == TOKEN_EXCHANGE:
            client_id, secret = "", form.get("subject_token", "")
            if not secret:
                raise OAuthError(400, "invalid_request", "token-exchange needs subject_token")
        elif not grant:
            raise OAuthError(
                400,
                "invalid_request",
                "grant_type is required: client_credentials or "
                "urn:ietf:params:oauth:grant-type:token-exchange",
            )
        else:
            raise OAuthError(
                400,
                "unsupported_grant_type",
                f"grant_type {grant[:80]!r} is not served; use client_credentials or "
                "urn:ietf:params:oauth:grant-type:token-exchange",
            )
        try:
            token, _ = await tenancy.catalog_token(client_id or None, secret)
        except Unauthenticated as exc:
            raise OAuthError(401, "invalid_client", exc.message) from None
        except PermissionDenied as exc:
            raise OAuthError(400, "unauthorized_client", exc.message) from None
        metrics.record_catalog_token()
        return JSONResponse(
            {
                "access_token": token,
                "token_type": "bearer",
                "expires_in": tenancy.catalog_tokens.ttl_s,
                "issued_token_type": ACCESS_TOKEN_TYPE,
            },
            headers={"cache-control": "no-store", "pragma": "no-cache"},
        )
