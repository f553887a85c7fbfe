"""Cold tier backends (Apache Iceberg), chosen by a short name or a dotted path, imported
lazily."""

from __future__ import annotations

from typing import TYPE_CHECKING

from gateway.cold.base import (
    WATERMARKS_PROPERTY,
    ColdSnapshot,
    ColdStore,
    ColdTable,
    DataFile,
    PlannedFile,
    ScanSlice,
    StorageOptions,
    fs_path,
    write_data_file,
)
from gateway.plugins import load_class

if TYPE_CHECKING:
    from gateway.config import Settings

__all__ = [
    "WATERMARKS_PROPERTY",
    "ColdSnapshot",
    "ColdStore",
    "ColdTable",
    "DataFile",
    "PlannedFile",
    "ScanSlice",
    "StorageOptions",
    "fs_path",
    "load_cold_store",
    "write_data_file",
]


def load_cold_store(settings: Settings) -> ColdStore | None:
    """Build the cold store named by ``settings.cold.type`` (a short name or a dotted
    ``module:Class`` path); None when ``settings.cold.enabled`` is false.

    Raises:
        BackendError: an unknown name, a missing extra, or a class that is not a ColdStore.
    """
    if not settings.cold.enabled:
        return None
    cls: type[ColdStore] = load_class("cold tier", settings.cold.type, ColdStore)
    return cls.from_settings(settings)
