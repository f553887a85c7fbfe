"""Checks of the names and values a tenant sends the core."""

from __future__ import annotations

import datetime as dt
import re
from typing import Any

from gateway.wire.errors import InvalidRequest

__all__ = ["check_group", "check_ident", "parse_as_of"]

_IDENT_RE = re.compile(r"^[A-Za-z][A-Za-z0-9_\-]{0,127}$")
_GROUP_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,254}$")


def parse_as_of(as_of: Any) -> int | dt.datetime | None:
    """A snapshot id (int or digits) or an ISO-8601 time (UTC when naive)."""
    if as_of is None or as_of == "":
        return None
    if isinstance(as_of, bool):
        raise InvalidRequest(f"as_of must be a snapshot id or an ISO-8601 time, got {as_of!r}")
    if isinstance(as_of, int):
        return as_of
    if isinstance(as_of, str):
        text = as_of.strip()
        if text.lstrip("-").isdigit():
            return int(text)
        try:
            when = dt.datetime.fromisoformat(text)
        except ValueError:
            raise InvalidRequest(
                f"as_of {as_of!r} is neither a snapshot id nor an ISO-8601 time", as_of=as_of
            ) from None
        return when if when.tzinfo else when.replace(tzinfo=dt.UTC)
    raise InvalidRequest(f"as_of must be a snapshot id or an ISO-8601 time, got {as_of!r}")


def check_ident(kind: str, value: str) -> None:
    if not isinstance(value, str) or not _IDENT_RE.match(value):
        raise InvalidRequest(
            f"{kind} {value!r} must start with a letter and hold only letters, digits, "
            "'_' and '-' (at most 128)"
        )


def check_group(group: str) -> None:
    if not isinstance(group, str) or not _GROUP_RE.match(group):
        raise InvalidRequest(
            f"group {group!r} must start with a letter or digit and hold only letters, "
            "digits, '_', '.' and '-' (at most 255)"
        )
