"""The Spark runner: one Spark task per ``(table, partition)`` hot range (tiering) or per
run of small files (compaction).

Tasks run their :meth:`~gateway.lake.tiering.LakeTask.run` on the executors
(:func:`gateway.lake.tiering.write_range`, :func:`gateway.lake.compaction.rewrite_files`:
pyarrow reads and writes the Parquet files, no Iceberg Spark runtime needed) and return the
files' metadata; the driver commits once per table through pyiceberg. Each tenant's jobs run
in its own fair-scheduler pool (``spark.scheduler.mode=FAIR``), so one tenant's volume does not
hold up another's.

Executors reopen the hot tier from the settings. With Redis that is always safe; the disk
tier belongs to one process, so run Spark over it only while no gateway appends to it
(the embedded gateway tiers the disk tier with the local runner instead).

Tenants come and go while a Spark application runs (``tidegate tier --every``, the gateway's
embedded schedule), so their pools cannot be listed in an allocation file read once at
start: :func:`declare_pool` declares each tenant's pool just before its first job, with the
settings Spark gives a pool it does not know (FIFO inside, minimum share 0, weight 1). Pools
that ``spark.scheduler.allocation.file`` declares are left as they are, so an operator can
still give a tenant a weight of its own there.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from gateway.cold.base import DataFile
from gateway.lake.runners import Runner
from gateway.lake.tasks import LakeTask
from gateway.plugins import BackendError

if TYPE_CHECKING:
    from gateway.config import Settings
    from gateway.hot import HotLog
    from gateway.lake.components import Components

__all__ = ["SparkRunner", "declare_pool", "executor_hot_log", "spark_session"]

log = logging.getLogger("tidegate.tiering")
_POOLS = threading.Lock()


def spark_session(
    master: str | None = "local[2]",
    app_name: str = "tidegate-tiering",
    config: Mapping[str, str] | None = None,
) -> Any:
    """A SparkSession fit for tiering (the active one when there is one). ``master=None``
    leaves the master to ``spark-submit --master``; ``config``: more settings (e.g.
    ``spark.jars``)."""
    try:
        from pyspark.sql import SparkSession
    except ImportError as exc:  # `make run` installs the server extra alone
        raise BackendError(
            f"the Spark runner needs pip install 'tidegate[spark]' and Java 17 ({exc}); "
            "the local runner needs neither (--runner local, tiering.runner=local)"
        ) from exc
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    builder = SparkSession.builder
    if master is not None:
        builder = builder.master(master)
    for key, value in (config or {}).items():
        builder = builder.config(key, value)
    return (
        builder.appName(app_name)
        .config("spark.scheduler.mode", "FAIR")
        .config("spark.sql.parquet.outputTimestampType", "TIMESTAMP_MICROS")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")  # a job's log says what it did
        .config("spark.sql.shuffle.partitions", "4")
        .getOrCreate()
    )


def declare_pool(sc: Any, name: str) -> None:
    """Declare the fair-scheduler pool ``name`` on ``sc`` (a ``SparkContext``) unless it
    exists, so a job submitted to it finds it configured.

    Spark reads pools only from its allocation file, at start, and has no public call to
    add one later; this adds it to the scheduler's root pool through the JVM, as the file
    would have. Where that fails (another Spark, a scheduler that is not the usual one),
    the job still runs: Spark creates the same pool itself and logs that it was not
    configured.
    """
    if str(sc.getConf().get("spark.scheduler.mode", "FIFO")).upper() != "FAIR":
        return
    with _POOLS:
        try:
            root = sc._jsc.sc().taskScheduler().rootPool()
            if root.getSchedulableByName(name) is not None:
                return
            scheduler = sc._jvm.org.apache.spark.scheduler
            root.addSchedulable(scheduler.Pool(name, scheduler.SchedulingMode.FIFO(), 0, 1))
        except Exception as exc:  # py4j errors: the pool is then Spark's own default
            log.debug("could not declare the Spark scheduler pool %r: %s", name, exc)


def _run_task(settings_json: Mapping[str, Any], task: LakeTask) -> list[DataFile]:
    """Open the hot log for this one task, when it reads one: a log cached in a reused
    Python worker would go stale (the disk tier keeps its index in the memory of the
    process that opened it), and opening Redis is one connection."""
    if not task.needs_hot:
        return task.run(None)
    with executor_hot_log(settings_json) as hot:
        return task.run(hot)


@contextmanager
def executor_hot_log(settings_json: Mapping[str, Any]) -> Iterator[HotLog]:
    """The hot log for one task, with the metadata store's placements bound when the
    hot tier has shards (a partition's segments may live on several)."""
    from gateway.config import Settings
    from gateway.hot import load_hot_log

    settings = Settings.explicit(**settings_json)
    hot = load_hot_log(settings)
    meta = None
    try:
        if settings_json["hot"]["type"] == "redis":
            from gateway.meta import MetadataStore

            meta = MetadataStore.from_settings(settings)
            hot.bind_placements(meta)
        yield hot
    finally:
        hot.close()
        if meta is not None:
            meta.close()


class _TaskFn:
    """The picklable function Spark ships to executors."""

    def __init__(self, settings_json: Mapping[str, Any]) -> None:
        self.settings_json = dict(settings_json)

    def __call__(self, task: LakeTask) -> list[DataFile]:
        return _run_task(self.settings_json, task)


class SparkRunner(Runner):
    """Runs a table's range tasks as one Spark job of one task per partition range, in
    the fair-scheduler pool named after the tenant."""

    def __init__(self, settings: Settings, spark: Any | None = None) -> None:
        self.spark = spark if spark is not None else spark_session(settings.tiering.master)
        # Executors rebuild the hot log from these settings (in the same hot tier).
        settings = settings.model_copy(update={"data_dir": settings.data_dir.resolve()})
        self.settings_json = settings.model_dump(mode="json")
        if self.settings_json["hot"]["type"] == "disk":
            # The driver holds the disk tier's lock; executors only read ranges it planned.
            self.settings_json["hot"]["lock"] = False

    @classmethod
    def create(cls, c: Components, master: str | None = None) -> SparkRunner:
        """The runner on this process's Spark session. Under ``spark-submit`` (its JVM
        gateway is there) and no explicit ``master``, the application's ``--master``
        wins; otherwise ``master`` or ``tiering.master``."""
        if master is None and not os.environ.get("PYSPARK_GATEWAY_PORT"):
            master = c.settings.tiering.master
        return cls(c.settings, spark_session(master))

    def write(self, tenant: str, tasks: Sequence[LakeTask]) -> list[DataFile]:
        if not tasks:
            return []
        sc = self.spark.sparkContext
        declare_pool(sc, tenant)
        sc.setLocalProperty("spark.scheduler.pool", tenant)
        job = tasks[0].job
        sc.setJobGroup(f"tidegate-{job}-{tenant}", f"{job} {tasks[0].table}", False)
        try:
            rdd = sc.parallelize(list(tasks), len(tasks))
            per_task: list[list[DataFile]] = rdd.map(_TaskFn(self.settings_json)).collect()
        finally:
            sc.setLocalProperty("spark.scheduler.pool", None)
        return [f for files in per_task for f in files]
