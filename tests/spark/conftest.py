"""Gateways with a cold tier for the Spark connector: a real gateway process over Redis
(so this process can tier a table while the gateway serves it, as `tidegate tier` does)
and the session's one SparkSession with the `tidegate` format registered."""

from __future__ import annotations

import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from gateway.config import Settings
from tests.services import GatewayProcess, MotoServer, RedisServer


@dataclass
class LakeGateway:
    """A gateway process and the settings of its backends, to tier its tables here."""

    gateway: GatewayProcess
    settings: Settings
    env: Mapping[str, str] = field(default_factory=dict)

    def options(self, table: str, **extra: Any) -> dict[str, str]:
        """The reader/writer options of ``table`` for this gateway's tenant."""
        assert self.gateway.api_key is not None
        # The gateway's HTTP URL: what both implementations take.
        out = {"endpoint": self.gateway.http_url, "api_key": self.gateway.api_key}
        out["table"] = table
        out.update({k: str(v) for k, v in extra.items()})
        return out

    def tier(self, table: str) -> None:
        """Move every hot record of ``table`` into Iceberg (in this process)."""
        from gateway.lake.components import Components
        from gateway.lake.tiering import tier_table

        ns, name = table.split(".")
        with Components.open(self.settings) as c:
            d = c.meta.get_table(self.gateway.tenant, ns, name)
            tier_table(c, d, trim=False)


def start_lake_gateway(
    tmp: Path, redis_server: RedisServer, cold_env: Mapping[str, str], cold: Mapping[str, Any]
) -> LakeGateway:
    """A gateway over ``redis_server`` that never tiers by itself: :meth:`LakeGateway.tier`
    does, when a test chooses."""
    env = {
        "TIDEGATE_HOT__TYPE": "redis",
        "TIDEGATE_HOT__URL": redis_server.url,
        # Tests tier when they choose to.
        "TIDEGATE_TIERING__ENABLED": "false",
        **cold_env,
    }
    gw = GatewayProcess(tmp, env).start()
    settings = Settings.explicit(
        data_dir=tmp, hot={"type": "redis", "url": redis_server.url}, cold=dict(cold)
    )
    return LakeGateway(gw, settings, env)


@pytest.fixture(scope="session")
def lake(
    redis_server: RedisServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[LakeGateway]:
    """A gateway over Redis with a local folder warehouse."""
    lg = start_lake_gateway(tmp_path_factory.mktemp("spark-gw"), redis_server, {}, {})
    try:
        yield lg
    finally:
        lg.gateway.stop()


@pytest.fixture(scope="module")
def disk_lake(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LakeGateway]:
    """A gateway over the disk hot tier with a local folder warehouse, tiered by the tests
    (in this process, the gateway stopped meanwhile: see ``test_key_read._tier``)."""
    tmp: Path = tmp_path_factory.mktemp("spark-key-disk")
    env = {"TIDEGATE_TIERING__ENABLED": "false"}
    gw = GatewayProcess(tmp, env).start()
    try:
        yield LakeGateway(gw, Settings.explicit(data_dir=tmp), env)
    finally:
        gw.stop()


@pytest.fixture(scope="session")
def s3_lake(
    redis_server: RedisServer, moto_server: MotoServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[LakeGateway]:
    """A gateway over Redis whose warehouse is on S3 (moto's server)."""
    bucket = moto_server.create_bucket(f"spark-{uuid.uuid4().hex[:10]}")
    warehouse = f"s3://{bucket}/warehouse"
    env = moto_server.gateway_env(warehouse)
    lg = start_lake_gateway(
        tmp_path_factory.mktemp("spark-gw-s3"),
        redis_server,
        env,
        {"warehouse": warehouse, "s3": moto_server.cold_s3_settings()},
    )
    try:
        yield lg
    finally:
        lg.gateway.stop()


@pytest.fixture(scope="session")
def tg_spark(spark: Any) -> Any:
    """The session's SparkSession with the `tidegate` format registered."""
    import gateway.spark

    gateway.spark.register(spark)
    return spark


@pytest.fixture
def table_name() -> str:
    return f"ns{uuid.uuid4().hex[:8]}.t{uuid.uuid4().hex[:6]}"


#: ``format(...)`` of each implementation in the test session (the jar is on it): the JVM
#: connector, and the Python source under its own name.
SOURCES = {"jvm": "tidegate", "python": "tidegate_python"}


@pytest.fixture(params=sorted(SOURCES))
def source(request: pytest.FixtureRequest, tg_spark: Any) -> str:
    """The format name of one implementation: the behaviour suite runs against both."""
    import gateway.spark

    assert gateway.spark.has_jvm_connector(tg_spark), "the session has no JVM connector jar"
    return SOURCES[request.param]


@pytest.fixture(params=sorted(SOURCES))
def stream_source(request: pytest.FixtureRequest, tg_spark: Any) -> tuple[Any, str]:
    """A session and the format name of one implementation, for streaming reads: the JVM
    connector in a session of its own where ``gateway.spark.register`` never ran (its
    streams need no Python source), the Python source in the registered one."""
    if request.param == "python":
        return tg_spark, SOURCES["python"]
    session = tg_spark.newSession()  # a session's Python data sources are its own
    return session, SOURCES["jvm"]
