"""Pages of a listing (tables, tenants), as Kafka's and AWS's list calls give them: at most
``page_size`` items in a stable order (by name), and an opaque ``next_page_token`` that
names where the next page starts (empty after the last page).

A token is the key of the last item served, encoded: a page is a keyset query on the
listing's unique index, so it costs the same on page 1 and on page 1,000, and an item
created or dropped meanwhile never shifts the others across pages.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from gateway.wire.errors import InvalidRequest

__all__ = [
    "DEFAULT_PAGE_SIZE",
    "MAX_PAGE_SIZE",
    "Page",
    "check_search",
    "decode_token",
    "encode_token",
    "size_of",
]

#: Items in a page when the caller names no size, and the most a page holds (a larger
#: size asked for is served as this one, AIP-158's rule).
DEFAULT_PAGE_SIZE = 1000
MAX_PAGE_SIZE = 1000
#: The longest search string and token accepted.
_MAX_TOKEN_CHARS = 1024

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Page(Generic[T]):
    items: list[T] = field(default_factory=list)
    #: Where the next page starts; empty when this page is the last.
    next_page_token: str = ""


def size_of(page_size: int | None) -> int:
    """The number of items a page holds for ``page_size`` (None or 0: the default).

    Raises:
        InvalidRequest: a negative size.
    """
    if page_size is None or page_size == 0:
        return DEFAULT_PAGE_SIZE
    if isinstance(page_size, bool) or not isinstance(page_size, int) or page_size < 0:
        raise InvalidRequest(
            f"page_size must be a positive integer (at most {MAX_PAGE_SIZE}), got {page_size!r}"
        )
    return min(page_size, MAX_PAGE_SIZE)


def encode_token(key: Sequence[str]) -> str:
    """The token of a page that starts after the item whose key is ``key``."""
    raw = json.dumps(list(key), separators=(",", ":")).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_token(token: str | None, parts: int) -> tuple[str, ...] | None:
    """The key a token names (None for no token: the first page).

    Raises:
        InvalidRequest: not a token of this listing.
    """
    if not token:
        return None
    bad = InvalidRequest(
        "page_token is not one this listing returned: pass the next_page_token of the "
        "previous page, or none for the first page"
    )
    if not isinstance(token, str) or len(token) > _MAX_TOKEN_CHARS:
        raise bad
    try:
        key = json.loads(base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)))
    except (binascii.Error, ValueError):
        raise bad from None
    if not isinstance(key, list) or len(key) != parts or not all(isinstance(k, str) for k in key):
        raise bad
    return tuple(key)


def check_search(contains: str | None) -> str | None:
    """The search string of a listing (None or empty: no search).

    Raises:
        InvalidRequest: longer than a name can be.
    """
    if not contains:
        return None
    if len(contains) > 128:
        raise InvalidRequest(
            f"the search string has {len(contains)} characters; a name has at most 128"
        )
    return contains
