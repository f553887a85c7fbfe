"""What every settings section shares: no unknown keys, a backend's own ``options``, and the
check of a backend named by a built-in name or a dotted path.
"""

from __future__ import annotations

from pydantic import AfterValidator, BaseModel, ConfigDict

from gateway.plugins import check_name

__all__ = ["Section", "backend"]


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid")


class DiskHotConfig(Section):
    """Local-disk hot tier: per-partition segment files. Single node."""


def backend(kind: str) -> AfterValidator:
    """Accept a built-in name of ``kind`` (:data:`gateway.plugins.BUILTINS`) or a dotted path."""
    return AfterValidator(lambda name: check_name(kind, name))
