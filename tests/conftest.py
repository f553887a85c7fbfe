"""Session-wide real services. Nothing here is mocked.

The suite runs on several pytest-xdist workers (``make test``; docs/decisions/test-suite.md).
Each worker is a pytest session of its own: every session fixture here (redis-server,
PostgreSQL, moto's S3 server, the SparkSession) starts once per worker that needs it, on
ports from :func:`tests.services.free_port` and in folders of that worker's own. What keeps
that safe, and what a new test must do:

- Listen only on :func:`tests.services.free_port` ports (never a fixed one, never a port
  picked by binding port 0 yourself and handing the number to another process), write only
  under ``tmp_path``/``tmp_path_factory`` or a ``tempfile.mkdtemp()`` folder, and name
  tenants, tables, buckets and databases uniquely (``uuid``/``secrets``): the session
  services are shared by every test of a worker, in any order.
- Never write into the checkout (``REPO_ROOT``): four workers read it at once.
- :mod:`tests.xdist_groups` (its hooks are imported here) puts tests that must run on one
  worker in one xdist group: every test that uses the ``spark`` fixture (one JVM for the
  run, not one per worker), and the tests of a module that uses a module-, class- or
  package-scoped fixture (so that fixture, often a gateway process or a browser, starts
  once). A test that asks for the SparkSession with ``request.getfixturevalue("spark")``
  must carry ``pytest.mark.xdist_group("spark")`` itself.
- New services (the Iceberg REST catalog, the JVM Spark connector): a session fixture per
  worker on ``free_port()`` and a temporary folder is safe; one that must start once for
  the whole run belongs in a group (a module/class fixture groups its module by itself). A
  Spark test gets the run's one SparkSession from the ``spark`` fixture (never a session of
  its own: one JVM per worker is about 0.5 GB), and a connector jar is built once into a
  temporary folder, not into the checkout. Timing: wait on a condition with a generous
  deadline (see ``START_TIMEOUT_S``, ``FIRST_CONTACT_S`` in tests/services.py), never for a
  fixed time followed by a check that enough happened in it.
- Run one file serially with ``make pytest PYTEST_WORKERS=0 PYTEST_ARGS=tests/...`` or
  plain ``.venv/bin/python -m pytest tests/...`` (``-n`` is given by the Makefile alone).
"""

from __future__ import annotations

import gc
import os
import shutil
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import settings as hypothesis_settings

from gateway.config import Settings
from tests.cpu_ledger import pytest_runtest_protocol  # noqa: F401 - TIDEGATE_TEST_CPU_LOG
from tests.services import MotoServer, PostgresServer, RedisServer, SparkCluster
from tests.xdist_groups import (  # noqa: F401 - hooks of this conftest
    pytest_collection_finish,
    pytest_collection_modifyitems,
    pytest_configure_node,
    pytest_unconfigure,
    pytest_xdist_make_scheduler,
)

# No per-example deadline anywhere: the suite asserts no timings, and on a loaded 2-core
# machine the first example of a property test can take longer than Hypothesis's 200 ms.
hypothesis_settings.register_profile("tidegate", deadline=None)
hypothesis_settings.load_profile("tidegate")

# Every Spark driver of the tests (the session's SparkSession below, `tidegate tier
# --runner spark`, the Helm chart's rendered jobs, a gateway whose runner is Spark) with
# the client compiler alone and one GC thread, as the standalone cluster's JVMs:
# spark-submit's launcher adds SPARK_SUBMIT_OPTS to the driver's JVM options. Their jobs
# are small; the server compiler's threads cost them more than they give back on 2 cores.
os.environ.setdefault("SPARK_SUBMIT_OPTS", SparkCluster.JVM_OPTS)


@pytest.hookimpl(tryfirst=True)
def pytest_runtestloop(session: pytest.Session) -> None:
    """Before the first test: what collection imported (pyspark, pyarrow, pyiceberg, the
    test modules) goes out of the cyclic collector's sight, and the young generation
    collects less often. A worker spent about 7% of its CPU walking those objects again
    and again (measured over the stitch and Iceberg store tests: 2.6 s of 35)."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(20_000, 20, 20)


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    """One redis-server of our own for the session (``appendfsync always``)."""
    server = RedisServer(tmp_path_factory.mktemp("redis")).start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def moto_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MotoServer]:
    """moto's S3 server, one process for the session; tests make their own buckets."""
    server = MotoServer(tmp_path_factory.mktemp("moto")).start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def postgres_url() -> Iterator[str]:
    """Base URL of a PostgreSQL server for metadata and catalog tests: a server of our own
    on a free port (``TIDEGATE_TEST_POSTGRES_URL`` points the tests at another one instead).
    Tests create their own scratch databases on it and drop them."""
    configured = os.environ.get("TIDEGATE_TEST_POSTGRES_URL")
    if configured:
        yield configured
        return
    folder = Path(tempfile.mkdtemp(prefix="tidegate-test-postgres-"))
    server = PostgresServer(folder)  # the server's user owns it (see PostgresServer)
    try:
        yield server.start().url
    finally:
        server.stop()
        shutil.rmtree(folder, ignore_errors=True)


def hot_settings(kind: str, tmp_path: Path, redis_server: RedisServer | None) -> Settings:
    """Explicit settings for one hot tier kind ('disk' or 'redis')."""
    if kind == "disk":
        return Settings.explicit(data_dir=tmp_path, hot={"type": "disk", "fsync": "batch"})
    assert redis_server is not None
    return Settings.explicit(data_dir=tmp_path, hot={"type": "redis", "url": redis_server.url})


@pytest.fixture
def unique_tenant() -> str:
    return f"t{uuid.uuid4().hex[:12]}"


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    """The test session's one local[2] SparkSession (shared by every Spark test).

    ``local[2,2]``: two threads, and a failed task gets a second attempt (local mode
    otherwise never retries), so the Spark writer's test can fail an attempt on purpose.
    """
    import sys

    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    import gateway.spark
    from tiering.spark_runner import spark_session

    # The JVM connector's jar (`make test` builds it): both implementations of
    # format("tidegate") run in this one session (tests/spark parametrises over them).
    session = spark_session(
        "local[2,2]", "tidegate-tests", {"spark.jars": gateway.spark.jar_path()}
    )
    session.sparkContext.setLogLevel("ERROR")
    try:
        yield session
    finally:
        session.stop()
