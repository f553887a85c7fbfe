"""Small value types both sides of the wire share."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["QUOTA_FIELDS", "USAGE_FIELDS", "AppendRange"]

#: A tenant's quotas, by name (admin API, CLI and the metadata store's columns alike).
QUOTA_FIELDS = (
    "append_bytes_per_s",
    "read_bytes_per_s",
    "requests_per_s",
    "max_tables",
    "max_partitions",
    "max_hot_bytes",
)

#: A tenant's usage counters per minute, by name.
USAGE_FIELDS = (
    "append_bytes",
    "append_records",
    "read_bytes",
    "read_records",
    "requests",
    "throttled",
    "hot_bytes",
    "cold_bytes",
)


@dataclass(frozen=True, slots=True)
class AppendRange:
    """Offsets assigned to one appended batch in one partition: ``count`` records from
    ``base_offset`` on. ``duplicate``: a retried idempotent batch, answered with the offsets
    it was first stored at."""

    partition: int
    base_offset: int
    count: int
    duplicate: bool = False
