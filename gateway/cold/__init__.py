"""Cold tier backends (Apache Iceberg), chosen by a short name, imported lazily."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from gateway.cold.base import (
    WATERMARKS_PROPERTY,
    ColdSnapshot,
    ColdStore,
    ColdTable,
    DataFile,
    PlannedFile,
    StorageOptions,
    fs_path,
    write_data_file,
)

if TYPE_CHECKING:
    from gateway.config import Settings

__all__ = [
    "WATERMARKS_PROPERTY",
    "ColdSnapshot",
    "ColdStore",
    "ColdTable",
    "DataFile",
    "PlannedFile",
    "StorageOptions",
    "fs_path",
    "load_cold_store",
    "write_data_file",
]

#: Short name -> (module, class, extra that provides its dependencies).
_BACKENDS: dict[str, tuple[str, str, str]] = {
    "iceberg": ("gateway.cold.iceberg", "IcebergColdStore", "server"),
}


def load_cold_store(settings: Settings, name: str = "iceberg") -> ColdStore | None:
    """Build the cold store (None when ``settings.cold.enabled`` is false). ``name`` is a
    short name or a dotted ``module:Class`` path."""
    if not settings.cold.enabled:
        return None
    module_name, class_name, extra = _BACKENDS.get(name, (*name.split(":", 1), "server"))
    try:
        module = importlib.import_module(module_name)
        importlib.import_module("pyiceberg")
    except ImportError as exc:  # pragma: no cover - depends on the install
        raise RuntimeError(
            f"the {name!r} cold tier needs extra dependencies: "
            f"pip install 'tidegate[{extra}]' ({exc})"
        ) from exc
    cls: type[ColdStore] = getattr(module, class_name)
    return cls.from_settings(settings)
