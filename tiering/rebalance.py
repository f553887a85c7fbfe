"""The rebalancing job's Spark side: every partition's heat measured by Spark tasks (one
per slice of partitions, each reading batch headers from the shards), collected on the
driver, which plans and executes the moves (:mod:`gateway.lake.rebalance`)."""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from gateway.lake.rebalance import Heat, HeatMeter, partition_heat
from tiering.spark_runner import executor_hot_log

if TYPE_CHECKING:
    from gateway.config import Settings
    from gateway.lake.components import Components
    from gateway.meta import Placement

__all__ = ["SparkHeat"]


class _HeatFn:
    """The picklable function Spark ships to executors."""

    def __init__(self, settings_json: Mapping[str, Any], window_s: float, now_us: int) -> None:
        self.settings_json = dict(settings_json)
        self.window_s = window_s
        self.now_us = now_us

    def __call__(self, placements: Iterator[Placement]) -> Iterator[Heat]:
        with executor_hot_log(self.settings_json) as hot:
            for p in placements:
                yield partition_heat(hot, p, self.window_s, self.now_us)


class SparkHeat(HeatMeter):
    """Measures heat with Spark tasks, a slice of partitions each."""

    def __init__(self, settings: Settings, spark: Any, slices: int = 8) -> None:
        self.spark = spark
        self.slices = slices
        settings = settings.model_copy(update={"data_dir": settings.data_dir.resolve()})
        self.settings_json = settings.model_dump(mode="json")

    @classmethod
    def create(cls, c: Components, master: str | None = None) -> SparkHeat:
        from tiering.spark_runner import spark_session

        if master is None and not os.environ.get("PYSPARK_GATEWAY_PORT"):
            master = c.settings.tiering.master
        return cls(c.settings, spark_session(master))

    def measure(
        self, c: Components, placements: Sequence[Placement], window_s: float, now_us: int
    ) -> list[Heat]:
        if not placements:
            return []
        sc = self.spark.sparkContext
        sc.setJobGroup("tidegate-rebalance", "measure partition heat", False)
        rdd = sc.parallelize(list(placements), max(1, min(self.slices, len(placements))))
        fn = _HeatFn(self.settings_json, window_s, now_us)
        heat: list[Heat] = rdd.mapPartitions(fn).collect()
        return heat
