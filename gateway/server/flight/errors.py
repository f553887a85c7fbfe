"""A Tidegate error as a Flight error (:func:`flight_error`), which the SDK turns back."""

from __future__ import annotations

import json

import pyarrow.flight as fl

from gateway.wire.errors import (
    PermissionDenied,
    RetryableError,
    TidegateError,
    Unauthenticated,
    Unimplemented,
)
from gateway.wire.status import error_metadata

__all__ = ["flight_error", "unimplemented"]


def flight_error(err: TidegateError) -> fl.FlightError:
    """The Flight error carrying ``err``: its class by kind, and in ``extra_info`` the
    JSON the SDK turns back into the same :class:`TidegateError`."""
    info = json.dumps(
        {
            "reason": err.reason,
            "message": err.message,
            "metadata": error_metadata(err),
            "retry_after_ms": err.retry_after_ms if isinstance(err, RetryableError) else None,
        }
    ).encode()
    cls: type[fl.FlightError]
    if isinstance(err, Unauthenticated):
        cls = fl.FlightUnauthenticatedError
    elif isinstance(err, PermissionDenied):
        cls = fl.FlightUnauthorizedError
    elif isinstance(err, RetryableError):
        cls = fl.FlightUnavailableError
    else:
        cls = fl.FlightServerError
    return cls(err.message, extra_info=info)


def unimplemented(method: str, instead: str = "") -> fl.FlightError:
    return flight_error(
        Unimplemented(
            f"Tidegate's Flight edge does not serve {method}; it serves GetFlightInfo, "
            f"DoGet (scans and stream reads) and DoPut (appends)"
            f"{'; ' + instead if instead else ''}"
        )
    )
