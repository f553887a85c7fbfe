"""What the key-table tests share: a mirror that replays a table's changelog."""

from __future__ import annotations

from typing import Any

from gateway.wire.changes import Change

#: The user columns of the key-table tests' schema (key: id, region).
USER = ["id", "region", "v", "note"]
#: That schema's fields, as a table is created with them.
FIELDS = [
    {"name": "id", "type": "int64"},
    {"name": "region", "type": "string"},
    {"name": "v", "type": "int64"},
    {"name": "note", "type": "string"},
]
Key = tuple[int, str]


def replay(changes: list[dict[str, Any]]) -> dict[Key, dict[str, Any]]:
    """A mirror applying the changelog in offset order (checking each change against what
    it holds: ``-U`` and ``-D`` carry the live row, ``+I`` finds none)."""
    state: dict[Key, dict[str, Any]] = {}
    for c in sorted(changes, key=lambda c: (c["_partition"], c["_offset"])):
        key, row, kind = (c["id"], c["region"]), {n: c[n] for n in USER}, c["_change"]
        if kind == Change.INSERT:
            assert key not in state, c
            state[key] = row
        elif kind == Change.UPDATE_BEFORE:
            assert state.get(key) == row, c
        elif kind == Change.UPDATE_AFTER:
            assert key in state, c
            state[key] = row
        else:
            assert state.pop(key) == row, c
    return state
