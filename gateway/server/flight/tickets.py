"""The JSON of Flight tickets, commands and ``DoPut`` descriptors, parsed and checked (the
forms are in :mod:`gateway.server.flight`'s docstring)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import pyarrow.flight as fl

from gateway.wire.errors import InvalidRequest

__all__ = [
    "MAX_TICKET_BYTES",
    "ReadCommand",
    "ScanCommand",
    "descriptor_command",
    "parse_command",
    "parse_put",
]

#: Longest ticket or command accepted (they are a few hundred bytes).
MAX_TICKET_BYTES = 64 * 1024


@dataclass(frozen=True, slots=True)
class ScanCommand:
    namespace: str
    name: str
    columns: list[str] | None
    filter: str | None
    as_of: int | str | None
    limit: int | None


@dataclass(frozen=True, slots=True)
class ReadCommand:
    namespace: str
    name: str
    partition: int
    offset: int
    max_records: int | None
    max_bytes: int | None


def _field(body: dict[str, Any], key: str, kinds: tuple[type, ...], required: bool) -> Any:
    value = body.get(key)
    if value is None:
        if required:
            raise InvalidRequest(f"the Flight ticket needs {key!r}")
        return None
    if isinstance(value, bool) or not isinstance(value, kinds):
        wanted = " or ".join("an integer" if k is int else "a string" for k in kinds)
        raise InvalidRequest(f"{key!r} of the Flight ticket must be {wanted}, not {value!r}")
    return value


def parse_command(raw: bytes) -> ScanCommand | ReadCommand:
    """A ticket's or command's JSON as a command.

    Raises:
        InvalidRequest: not one JSON object ``{"scan": {...}}`` or ``{"read": {...}}``
            with fields of the right types.
    """
    if len(raw) > MAX_TICKET_BYTES:
        raise InvalidRequest(f"the Flight ticket is over {MAX_TICKET_BYTES} bytes")
    try:
        doc = json.loads(raw)
    except (UnicodeDecodeError, ValueError):
        raise InvalidRequest(
            'the Flight ticket is not JSON; send {"scan": {...}} or {"read": {...}}'
        ) from None
    if not isinstance(doc, dict) or len(doc) != 1 or next(iter(doc)) not in ("scan", "read"):
        raise InvalidRequest(
            'the Flight ticket must be one object, {"scan": {...}} or {"read": {...}}'
        )
    kind, body = next(iter(doc.items()))
    if not isinstance(body, dict):
        raise InvalidRequest(f"the Flight ticket's {kind!r} must be an object")
    unknown = sorted(set(body) - set(_KNOWN[kind]))
    if unknown:
        raise InvalidRequest(
            f"unknown field(s) {unknown} in the Flight {kind} ticket; known: {_KNOWN[kind]}"
        )
    namespace = _field(body, "namespace", (str,), True)
    name = _field(body, "name", (str,), True)
    if kind == "scan":
        columns = body.get("columns")
        if columns is not None and (
            not isinstance(columns, list) or not all(isinstance(c, str) for c in columns)
        ):
            raise InvalidRequest("'columns' of the Flight ticket must be a list of names")
        return ScanCommand(
            namespace,
            name,
            columns or None,
            _field(body, "filter", (str,), False) or None,
            _field(body, "as_of", (int, str), False),
            _field(body, "limit", (int,), False),
        )
    return ReadCommand(
        namespace,
        name,
        _field(body, "partition", (int,), True),
        _field(body, "offset", (int,), True),
        _field(body, "max_records", (int,), False),
        _field(body, "max_bytes", (int,), False),
    )


_KNOWN = {
    "scan": ["namespace", "name", "columns", "filter", "as_of", "limit"],
    "read": ["namespace", "name", "partition", "offset", "max_records", "max_bytes"],
}


def descriptor_command(descriptor: fl.FlightDescriptor) -> bytes:
    """The command a GetFlightInfo or GetSchema descriptor names: its own, or a whole-table
    scan for a path ``[namespace, name]``."""
    if descriptor.descriptor_type == fl.DescriptorType.PATH:
        path = [p.decode() if isinstance(p, bytes) else str(p) for p in descriptor.path]
        if len(path) != 2:
            raise InvalidRequest(f"a Flight path names a table as [namespace, name], not {path}")
        return json.dumps({"scan": {"namespace": path[0], "name": path[1]}}).encode()
    return bytes(descriptor.command)


def parse_put(descriptor: fl.FlightDescriptor) -> tuple[str, str]:
    """The ``(namespace, name)`` a ``DoPut`` appends to: a path ``[namespace, name]`` or the
    command ``{"append": {"namespace": ..., "name": ...}}``.

    Raises:
        InvalidRequest: neither.
    """
    if descriptor.descriptor_type == fl.DescriptorType.PATH:
        path = [p.decode() if isinstance(p, bytes) else str(p) for p in descriptor.path]
        if len(path) == 2:
            return path[0], path[1]
        raise InvalidRequest(f"a DoPut path names a table as [namespace, name], not {path}")
    raw = bytes(descriptor.command)
    wanted = 'a DoPut command is {"append": {"namespace": ..., "name": ...}}'
    if len(raw) > MAX_TICKET_BYTES:
        raise InvalidRequest(f"the DoPut command is over {MAX_TICKET_BYTES} bytes")
    try:
        doc = json.loads(raw)
    except (UnicodeDecodeError, ValueError):
        raise InvalidRequest(f"the DoPut command is not JSON; {wanted}") from None
    body = doc.get("append") if isinstance(doc, dict) and len(doc) == 1 else None
    if not isinstance(body, dict) or set(body) - {"namespace", "name"}:
        raise InvalidRequest(wanted)
    return _field(body, "namespace", (str,), True), _field(body, "name", (str,), True)
