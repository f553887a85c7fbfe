"""Lake job runners by name: ``local`` (threads of this process) or ``spark`` (the Spark
jobs of the top-level ``tiering`` package), or a dotted path to a :class:`Runner` of your
own. The Spark runner is imported only when chosen: the gateway never imports ``tiering``.
"""

from __future__ import annotations

from gateway.lake.components import Components
from gateway.lake.tiering import Runner
from gateway.plugins import load_class

__all__ = ["RUNNERS", "make_runner"]

#: Short name -> (class, extra that installs its dependencies).
RUNNERS: dict[str, tuple[str, str]] = {
    "local": ("gateway.lake.tiering:LocalRunner", "server"),
    "spark": ("tiering.spark:SparkRunner", "spark"),
}


def make_runner(c: Components, name: str, master: str | None = None) -> Runner:
    """The runner ``name`` (a key of :data:`RUNNERS` or ``module:Class``) for ``c``.

    Raises:
        BackendError: an unknown name, a missing extra, or not a :class:`Runner`.
    """
    cls: type[Runner] = load_class("tiering runner", name, RUNNERS, Runner)
    return cls.create(c, master)
