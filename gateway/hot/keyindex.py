"""What both hot tiers' key indexes share: the keys of a primary-key table's batch as an
append hands them over, and each key's last change in a batch.

The index itself is :meth:`HotLog.latest_offsets <gateway.hot.base.HotLog.latest_offsets>`
and :meth:`~gateway.hot.base.HotLog.key_count`, kept by each backend with its log
(docs/decisions/primary-keys.md, "The hot tier's key index"): a Redis hash per segment
written by the append script (:mod:`gateway.hot.redis.keyindex`), a map per disk partition
checkpointed to ``keys.idx`` and replayed from the keys its records carry
(:mod:`gateway.hot.disk.keyindex`). Keys are opaque bytes here (a key's routing bytes).
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["batch_keys", "last_changes"]


def batch_keys(keys: Sequence[bytes] | None, count: int) -> list[bytes] | None:
    """``keys`` as a list of bytes, checked to hold one key per record of the batch.

    Raises:
        ValueError: not ``count`` keys, or a key that is not bytes.
    """
    if keys is None:
        return None
    out = [bytes(k) if isinstance(k, (bytes, bytearray, memoryview)) else k for k in keys]
    if len(out) != count:
        raise ValueError(f"a keyed batch of {count} records needs {count} keys, not {len(out)}")
    for k in out:
        if not isinstance(k, bytes):
            raise ValueError(f"a key is the bytes of its columns, not {type(k).__name__}")
    return out


def last_changes(keys: Sequence[bytes]) -> dict[bytes, int]:
    """Each key of a batch -> the position of its last record in the batch (the last
    change of a key within a batch wins)."""
    return {k: i for i, k in enumerate(keys)}
