"""Lake job runners: what executes a job's tasks. ``local`` runs them on threads of this
process (:class:`LocalRunner`); ``spark`` on Spark executors (the top-level ``tiering``
package's ``tiering.spark_runner:SparkRunner``, imported only when chosen: the gateway never
imports ``tiering``); or a dotted path to a :class:`Runner` of your own. The built-in names
are in :data:`gateway.plugins.BUILTINS`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

from gateway.cold.base import DataFile
from gateway.lake.components import Components
from gateway.lake.tasks import LakeTask
from gateway.plugins import load_class

__all__ = ["LocalRunner", "Runner", "make_runner"]


class Runner(ABC):
    """Executes the range tasks of one table and returns the files they wrote; chosen by
    name (``tiering.runner``) through :func:`gateway.lake.runners.make_runner`."""

    @classmethod
    @abstractmethod
    def create(cls, c: Components, master: str | None = None) -> Runner:
        """Build the runner for the components of a job (``master``: a Spark master, for
        runners that have one)."""

    @abstractmethod
    def write(self, tenant: str, tasks: Sequence[LakeTask]) -> list[DataFile]:
        """Run the tasks (one per partition range, or per run of files to compact) and
        return every file they wrote.

        Raises:
            Exception: any task's failure (the table's run fails; other tables go on).
        """


class LocalRunner(Runner):
    """Runs range tasks on plain threads of this process, with the hot log it already
    holds: tiering with no Spark at all (the embedded gateway's schedule and the
    property tests use it)."""

    def __init__(self, components: Components, threads: int = 2) -> None:
        self.components = components
        self.threads = max(1, threads)

    @classmethod
    def create(cls, c: Components, master: str | None = None) -> LocalRunner:
        return cls(c)

    def write(self, tenant: str, tasks: Sequence[LakeTask]) -> list[DataFile]:
        if not tasks:
            return []
        hot = self.components.hot
        if len(tasks) == 1 or self.threads == 1:
            return [f for t in tasks for f in t.run(hot)]
        with ThreadPoolExecutor(min(self.threads, len(tasks)), f"tg-{tasks[0].job}") as pool:
            results = list(pool.map(lambda t: t.run(hot), tasks))
        return [f for r in results for f in r]


def make_runner(c: Components, name: str, master: str | None = None) -> Runner:
    """Runner ``name`` for ``c``: built-in (:data:`gateway.plugins.BUILTINS`) or ``module:Class``.

    Raises:
        BackendError: an unknown name, a missing extra, or not a :class:`Runner`.
    """
    cls: type[Runner] = load_class("tiering runner", name, Runner)
    return cls.create(c, master)
