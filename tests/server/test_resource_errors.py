"""Issue 33.4: a resource the gateway runs out of (descriptors, disk space, memory) is a
retryable UNAVAILABLE on every edge, never a 500, however deep a library wrapped it."""

from __future__ import annotations

import errno
import os

import grpc
import pyarrow.flight as fl
import pytest

from gateway.server.calls import wire_error
from gateway.server.flight import flight_error
from gateway.wire.errors import ResourceUnavailable, error_for_reason


class _LibraryError(Exception):
    """What pyiceberg or SQLAlchemy raise around the OSError they met."""


def _raised(code: int) -> BaseException:
    """An OSError of ``code`` as a library re-raises it (``raise ... from``)."""
    try:
        try:
            raise OSError(code, os.strerror(code), "/warehouse/t/metadata/snap.avro")
        except OSError as exc:
            raise _LibraryError("cannot read the manifest list") from exc
    except _LibraryError as wrapped:
        return wrapped


@pytest.mark.parametrize("code", [errno.EMFILE, errno.ENFILE, errno.ENOSPC, errno.EDQUOT])
def test_a_resource_error_is_retryable_unavailable_on_every_edge(code: int) -> None:
    err = wire_error(_raised(code), "a test")
    assert isinstance(err, ResourceUnavailable)
    assert err.retryable and err.retry_after_ms
    assert err.http_status == 503
    assert err.grpc_code == grpc.StatusCode.UNAVAILABLE
    assert isinstance(flight_error(err), fl.FlightUnavailableError)
    # The SDK turns the reason back into the same retryable class.
    assert error_for_reason(err.reason) is ResourceUnavailable
    # The answer names the resource, never the server's files.
    assert os.strerror(code).lower() in err.message
    assert "/warehouse" not in err.message


def test_memory_exhaustion_is_retryable_too() -> None:
    try:
        try:
            raise MemoryError
        except MemoryError as exc:
            raise _LibraryError("decode") from exc
    except _LibraryError as wrapped:
        assert isinstance(wire_error(wrapped), ResourceUnavailable)


def test_other_os_errors_stay_internal() -> None:
    """Only exhaustion is retryable: a missing file is the gateway's own bug (500)."""
    err = wire_error(_raised(errno.ENOENT), "a test")
    assert not isinstance(err, ResourceUnavailable)
    assert err.http_status == 500
    assert "internal error" in err.message
