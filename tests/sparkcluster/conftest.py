"""A standalone Spark cluster (a master and two workers, separate JVMs) for the tests of a
module, a gateway whose backends are all reached over the network (Redis, PostgreSQL,
moto's S3), and a Spark driver on the cluster the tests send commands to.

Nothing the executors need reaches them through this process's environment: the workers
start with a clean one (:class:`tests.services.SparkCluster`), and each application gives
its executors what they need in its Spark configuration.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from gateway.config import Settings
from tests.services import (
    GatewayProcess,
    MotoServer,
    RedisServer,
    SparkCluster,
    scratch_database,
)
from tests.spark.conftest import LakeGateway

#: Seconds an application on the cluster may take to start or answer a command: every
#: JVM of it (driver, one executor per worker) starts on two cores shared with the rest
#: of the suite.
APP_TIMEOUT_S = 300.0

#: What the submitting process's environment holds and the executors must never see.
DRIVER_ONLY_ENV = {
    "TIDEGATE_CLUSTER_CANARY": "driver-only",
    "AWS_ACCESS_KEY_ID": "driver-only",
    "AWS_SECRET_ACCESS_KEY": "driver-only",
}
#: What the executors get, through Spark's configuration alone.
EXECUTOR_ENV_CONF = {"spark.executorEnv.TIDEGATE_CLUSTER_NOTE": "from-spark-conf"}


def submitter_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment of a process that submits an application: this process's, less
    any ``TIDEGATE_*``/``AWS_*``/``PYSPARK_*`` of the developer's, plus
    :data:`DRIVER_ONLY_ENV` and ``extra``.

    ``PYSPARK_DRIVER_PYTHON`` names this interpreter for the driver's JVM: Spark looks up
    Python data sources in a Python process it starts on the driver with that variable
    (or ``PYSPARK_PYTHON``, else ``python3``), not ``spark.pyspark.python``. Executors
    still get their interpreter from ``spark.pyspark.python`` alone.
    """
    drop = ("TIDEGATE_", "AWS_", "PYSPARK_")
    env = {k: v for k, v in os.environ.items() if not k.startswith(drop)}
    env["PYSPARK_DRIVER_PYTHON"] = sys.executable
    env["SPARK_LOCAL_IP"] = "127.0.0.1"  # the driver's own address, never another
    env.update(DRIVER_ONLY_ENV)
    env.update(extra or {})
    return env


class ClusterLake(LakeGateway):
    """A gateway over Redis, PostgreSQL (metadata and Iceberg catalog) and an S3 warehouse,
    with its backends' settings for the lake jobs (``env``) and for this process; the
    source's options and :meth:`tier` (in this process, to set up a test's data) are
    those of the Spark tests."""

    def cold(self, table: str) -> tuple[list[dict[str, Any]], dict[int, int], list[int]]:
        """``table``'s Iceberg rows in (partition, offset) order, its tiered watermarks and
        its number of data files per partition, read in this process."""
        from gateway.lake.components import Components

        ns, name = table.split(".")
        with Components.open(self.settings) as c:
            d = c.meta.get_table(self.gateway.tenant, ns, name)
            cold = c.cold.table(d)
            snap = cold.snapshot()
            batches = list(cold.scan(snap))
            rows = pa.Table.from_batches(batches).to_pylist() if batches else []
            files = [len(cold.files(snap, p, 0, 2**62)) for p in range(d.partitions)]
            marks = dict(snap.watermarks)
        return sorted(rows, key=lambda r: (r["_partition"], r["_offset"])), marks, files


class SparkDriver:
    """``tests/sparkcluster/driver.py`` submitted to the cluster: one application, many
    commands, exchanged as files in :attr:`folder` (see that file)."""

    SCRIPT = Path(__file__).with_name("driver.py")

    def __init__(self, cluster: SparkCluster, workdir: Path) -> None:
        self.cluster = cluster
        self.workdir = workdir
        self.folder = workdir / "commands"
        self.proc: subprocess.Popen[bytes] | None = None
        self.log_path = workdir / "driver.log"
        self._sent = 0

    @staticmethod
    def conf() -> dict[str, str]:
        """The driver's own Spark configuration: the JVM connector's jar on the session
        (``spark.jars``: the driver serves it to the executors), so ``tidegate`` is the
        JVM connector and ``tidegate_python`` the Python source (``gateway.spark.register``)."""
        import gateway.spark

        return {**EXECUTOR_ENV_CONF, "spark.jars": gateway.spark.jar_path()}

    def start(self) -> SparkDriver:
        self.folder.mkdir(parents=True, exist_ok=True)
        log = open(self.log_path, "ab")  # noqa: SIM115 - owned by the child
        self.proc = subprocess.Popen(
            [*self.cluster.submit_args(self.conf()), str(self.SCRIPT), str(self.folder)],
            env=submitter_env(),
            cwd=self.workdir,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        log.close()
        self._answer("ready")
        return self

    def _answer(self, name: str) -> Any:
        path = self.folder / f"{name}.answer"
        deadline = time.monotonic() + APP_TIMEOUT_S
        while not path.exists():
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise RuntimeError(f"the driver exited with {self.proc.returncode}\n{self.log()}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"the driver did not answer {name}\n{self.log()}")
            time.sleep(0.05)
        answer: dict[str, Any] = json.loads(path.read_text())
        if "error" in answer:
            raise AssertionError(f"the driver's {name} failed:\n{answer['error']}")
        return answer["result"]

    def _send(self, command: dict[str, Any]) -> str:
        name = str(self._sent)
        partial = self.folder / f".{name}.partial"
        partial.write_text(json.dumps(command))
        partial.replace(self.folder / f"{name}.command")
        self._sent += 1
        return name

    def ask(self, op: str, **fields: Any) -> Any:
        """Run one command on the driver; its result, or a failure with its traceback."""
        return self._answer(self._send({"op": op, **fields}))

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-5000:]
        except FileNotFoundError:
            return ""

    def stop(self) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self._send({"op": "stop"})
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(60)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(10)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SparkCluster]:
    """The module's standalone cluster: a master and two workers of one core each."""
    started = SparkCluster(tmp_path_factory.mktemp("spark-cluster")).start()
    try:
        yield started
    finally:
        started.stop()
    assert started.process_groups() == [], "a JVM of the cluster outlived it"


@pytest.fixture(scope="module")
def cluster_lake(
    redis_server: RedisServer,
    moto_server: MotoServer,
    postgres_url: str,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[ClusterLake]:
    """A gateway whose every backend is a server (no file a job on another machine could
    not reach): Redis, PostgreSQL for the metadata and the Iceberg catalog, S3."""
    bucket = moto_server.create_bucket(f"cluster-{uuid.uuid4().hex[:10]}")
    warehouse = f"s3://{bucket}/warehouse"
    folder = tmp_path_factory.mktemp("cluster-gw")
    with (
        scratch_database(postgres_url, "cluster_meta") as meta_url,
        scratch_database(postgres_url, "cluster_catalog") as catalog_url,
    ):
        env = {
            "TIDEGATE_HOT__TYPE": "redis",
            "TIDEGATE_HOT__URL": redis_server.url,
            "TIDEGATE_METADATA__URL": meta_url,
            "TIDEGATE_COLD__CATALOG__TYPE": "sql",
            "TIDEGATE_COLD__CATALOG__URI": catalog_url,
            **moto_server.gateway_env(warehouse),
            # The tests run the lake jobs, on the cluster.
            "TIDEGATE_TIERING__ENABLED": "false",
            "TIDEGATE_COMPACTION__ENABLED": "false",
        }
        gateway = GatewayProcess(folder / "gateway", env).start()
        settings = Settings.explicit(
            data_dir=folder / "here",
            hot={"type": "redis", "url": redis_server.url},
            metadata={"url": meta_url},
            cold={
                "warehouse": warehouse,
                "s3": moto_server.cold_s3_settings(),
                "catalog": {"type": "sql", "uri": catalog_url},
            },
        )
        try:
            yield ClusterLake(gateway, settings, env)
        finally:
            gateway.stop()


@pytest.fixture(scope="module")
def driver(
    cluster: SparkCluster, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[SparkDriver]:
    """The module's driver application on the cluster (it holds both workers' cores while
    it runs: the tests that submit applications of their own come first)."""
    started = SparkDriver(cluster, tmp_path_factory.mktemp("cluster-driver")).start()
    try:
        yield started
    finally:
        started.stop()


@pytest.fixture
def table_name() -> str:
    return f"ns{uuid.uuid4().hex[:8]}.t{uuid.uuid4().hex[:6]}"
