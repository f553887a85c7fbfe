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

#: Short name -> (class, extra that provides its dependencies).
BACKENDS: dict[str, tuple[str, str]] = {
    "iceberg": ("gateway.cold.iceberg:IcebergColdStore", "server"),
}


def load_cold_store(settings: Settings, name: str = "iceberg") -> ColdStore | None:
    """Build the cold store (None when ``settings.cold.enabled`` is false). ``name`` is a
    short name or a dotted ``module:Class`` path.

    Raises:
        BackendError: an unknown name, a missing extra, or a class that is not a ColdStore.
    """
    if not settings.cold.enabled:
        return None
    cls: type[ColdStore] = load_class("cold tier", name, BACKENDS, ColdStore)
    return cls.from_settings(settings)
