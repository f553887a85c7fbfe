"""The Iceberg REST catalog's error shape and path separator, shared by its route modules
(``iceberg``: the catalog's reads; ``iceberg_plans``: its scan planning)."""

from collections.abc import Mapping

from fastapi.responses import JSONResponse

__all__ = ["SEPARATOR", "iceberg_error"]

#: The namespace separator of multipart namespaces in paths (the spec's default, 0x1F).
SEPARATOR = "\x1f"

_TYPES = {
    400: "BadRequestException",
    401: "NotAuthorizedException",
    403: "ForbiddenException",
    404: "NotFoundException",
    405: "MethodNotAllowedException",
    406: "UnsupportedOperationException",
    409: "CommitFailedException",
    413: "BadRequestException",
    415: "BadRequestException",
    429: "TooManyRequestsException",
    503: "ServiceUnavailableException",
}


def iceberg_error(
    status: int,
    message: str,
    kind: str | None = None,
    headers: Mapping[str, str] | None = None,
) -> JSONResponse:
    """An error in the spec's shape: ``{"error": {"message", "type", "code"}}``."""
    kind = kind or _TYPES.get(status, "ServerErrorException" if status >= 500 else "RESTException")
    body = {"error": {"message": message, "type": kind, "code": status}}
    return JSONResponse(body, status_code=status, headers=headers)
