"""Checks of the names and values a tenant sends the core."""

from __future__ import annotations

import datetime as dt
import re
from typing import Any

from gateway.wire.errors import InvalidRequest
from gateway.wire.scans import INT64_MAX

__all__ = [
    "INT64_MAX",
    "check_group",
    "check_ident",
    "check_retention",
    "check_text",
    "parse_as_of",
]

# Names are matched in full (``fullmatch``: "$" would let a final newline through), so two
# distinct names never map to one storage path, Iceberg namespace or Redis key.
_IDENT_RE = re.compile(r"[A-Za-z][A-Za-z0-9_\-]{0,127}")
_GROUP_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.\-]{0,254}")


def parse_as_of(as_of: Any) -> int | dt.datetime | None:
    """A snapshot id (int or digits) or an ISO-8601 time (UTC when naive)."""
    if as_of is None or as_of == "":
        return None
    if isinstance(as_of, bool):
        raise InvalidRequest(f"as_of must be a snapshot id or an ISO-8601 time, got {as_of!r}")
    if isinstance(as_of, int):
        return _snapshot_id(as_of)
    if isinstance(as_of, str):
        text = as_of.strip()
        if text.lstrip("-").isdigit():
            if len(text) > 20:
                raise InvalidRequest(
                    f"as_of {text[:24]!r}... is not a snapshot id", as_of=text[:24]
                )
            return _snapshot_id(int(text))
        try:
            when = dt.datetime.fromisoformat(text)
        except ValueError:
            raise InvalidRequest(
                f"as_of {as_of!r} is neither a snapshot id nor an ISO-8601 time", as_of=as_of
            ) from None
        return when if when.tzinfo else when.replace(tzinfo=dt.UTC)
    raise InvalidRequest(f"as_of must be a snapshot id or an ISO-8601 time, got {as_of!r}")


def _snapshot_id(value: int) -> int:
    if not -INT64_MAX - 1 <= value <= INT64_MAX:
        raise InvalidRequest(f"as_of {value} is not a snapshot id (a 64-bit integer)")
    return value


def check_text(kind: str, value: str, longest: int) -> None:
    """Refuse text that is not storable UTF-8 (a lone surrogate from JSON's \\ud800) or
    longer than ``longest`` characters.

    Raises:
        InvalidRequest: naming ``kind``.
    """
    if len(value) > longest:
        raise InvalidRequest(f"{kind} has {len(value)} characters; at most {longest}")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidRequest(f"{kind} {value[:40]!r} is not valid Unicode text") from None


def check_ident(kind: str, value: str) -> None:
    if not isinstance(value, str) or not _IDENT_RE.fullmatch(value):
        raise InvalidRequest(
            f"{kind} {value!r} must start with a letter and hold only letters, digits, "
            "'_' and '-' (at most 128)"
        )


def check_group(group: str) -> None:
    if not isinstance(group, str) or not _GROUP_RE.fullmatch(group):
        raise InvalidRequest(
            f"group {group!r} must start with a letter or digit and hold only letters, "
            "digits, '_', '.' and '-' (at most 255)"
        )


def check_retention(option: str, value: object) -> int | None:
    """A retention value as given (``retention_ms`` or ``retention_records``): None
    (not given) stays None, 0 means "no limit" and is returned as 0, any other value
    must be a positive 64-bit integer.

    Raises:
        InvalidRequest: one sentence naming the option, the value and what is accepted.
    """
    if value is None:
        return None
    unit = "milliseconds" if option == "retention_ms" else "records"
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= INT64_MAX:
        raise InvalidRequest(
            f"{option} {value!r} is not accepted: give a whole number of {unit} from 1 to "
            f"{INT64_MAX}, or 0 for no limit",
            option=option,
        )
    return value
