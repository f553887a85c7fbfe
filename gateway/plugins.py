"""Backends chosen by a short name or a dotted path, imported only when chosen.

Every pluggable part (the hot log, the cold store, the lake job runners) names its built-in
backends in a small table, ``short name -> ("module:Class", extra)``; any other name is
taken as a dotted path to a class of the user's own, ``"mypkg.mymod:MyHotLog"`` (or
``"mypkg.mymod.MyHotLog"``), which must subclass the part's interface. Nothing is imported
before it is chosen, so an install without an extra still starts with the other backends.
"""

from __future__ import annotations

import importlib
import re
from typing import Any

__all__ = ["BUILTINS", "DOTTED_PATH", "BackendError", "check_name", "load_class"]

#: Every built-in backend, in one table: part -> short name -> ("module:Class", the extra
#: that installs its dependencies). The settings (``hot.type``, ``cold.type``,
#: ``tiering.runner``) accept these names or a dotted path.
BUILTINS: dict[str, dict[str, tuple[str, str]]] = {
    "hot tier": {
        "disk": ("gateway.hot.disk:DiskHotLog", "server"),
        "redis": ("gateway.hot.redis:RedisHotLog", "server"),
    },
    "cold tier": {
        "iceberg": ("gateway.cold.iceberg:IcebergColdStore", "server"),
    },
    "tiering runner": {
        "local": ("gateway.lake.runners:LocalRunner", "server"),
        "spark": ("tiering.spark_runner:SparkRunner", "spark"),
    },
    "heat meter": {
        "local": ("gateway.lake.rebalance:LocalHeat", "server"),
        "spark": ("tiering.rebalance:SparkHeat", "spark"),
    },
}

#: A dotted path to a class: ``package.module:Class`` (or ``package.module.Class``).
DOTTED_PATH = r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*[:.][A-Za-z_]\w*"
_DOTTED = re.compile(DOTTED_PATH, re.ASCII)


class BackendError(ValueError):
    """A backend name that names nothing usable: an unknown short name, a module that does
    not import, or a class that does not implement the interface."""


def check_name(kind: str, name: str) -> str:
    """``name`` if it is a built-in ``kind`` (a key of :data:`BUILTINS`) or a dotted path.

    Raises:
        BackendError: neither.
    """
    builtins = BUILTINS[kind]
    if name in builtins or _DOTTED.fullmatch(name):
        return name
    raise BackendError(
        f"unknown {kind} {name!r}: use one of {sorted(builtins)} or a dotted path "
        "'package.module:Class' to a class of your own"
    )


def load_class(kind: str, name: str, base: type[Any]) -> type[Any]:
    """The backend class ``name`` stands for.

    Args:
        kind: the part being loaded, a key of :data:`BUILTINS` ("hot tier"...).
        name: one of its built-in names or a dotted path ``package.module:Class``.
        base: the interface the class must subclass.

    Raises:
        BackendError: unknown name, unimportable module or missing dependency (naming the
            extra to install), no such class, or not a subclass of ``base``.
    """
    extra: str | None = None
    builtins = BUILTINS[kind]
    if name in builtins:
        path, extra = builtins[name]
    else:
        path = check_name(kind, name)
    module_name, _, class_name = path.rpartition(":") if ":" in path else path.rpartition(".")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        hint = f"; install it with pip install 'tidegate[{extra}]'" if extra else ""
        raise BackendError(f"the {kind} {name!r} cannot be imported ({exc}){hint}") from exc
    cls = getattr(module, class_name, None)
    if not isinstance(cls, type):
        raise BackendError(
            f"the {kind} {name!r}: module {module_name!r} has no class {class_name!r}"
        )
    if not issubclass(cls, base):
        raise BackendError(
            f"the {kind} {name!r} is not a {base.__module__}.{base.__qualname__} "
            f"(it must subclass that interface)"
        )
    return cls
