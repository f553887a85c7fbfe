"""What every scenario shares: the services of one run and how results are compared."""

from __future__ import annotations

import contextlib
import secrets
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import grpc

from benchmarks.scenarios import CHANNEL_OPTIONS
from gateway.wire._proto.tidegate.v1 import tidegate_pb2_grpc as pb_grpc
from tests.services import GatewayProcess, RedisServer

if TYPE_CHECKING:
    from benchmarks.passthrough import PassThroughProcess
    from gateway.config import Settings
    from gateway.lake.components import Components
    from gateway.meta import TableDef


@dataclass
class Bench:
    """The services of one benchmark run (all started by the run, on free ports).

    ``gateways["disk"]`` and ``gateways["redis"]`` serve every hot-tier workload. The Redis
    one runs without its embedded tiering schedule: scenarios that need cold data tier it
    themselves, in this process or as a ``tidegate tier`` job beside it (the deployment
    the README recommends with Redis), so that tiering never runs unasked under another
    scenario's load.
    """

    mode: str
    workdir: Path
    redis: RedisServer
    gateways: dict[str, GatewayProcess]
    #: The pass-through baseline on each hot tier's raw store (``benchmarks.passthrough``).
    passthroughs: dict[str, PassThroughProcess] = field(default_factory=dict)

    @property
    def tiered(self) -> GatewayProcess:
        """The gateway that cold, scan and tiering scenarios use."""
        return self.gateways["redis"]

    @staticmethod
    def auth(gw: GatewayProcess, api_key: str | None = None) -> tuple[tuple[str, str], ...]:
        return (("authorization", f"Bearer {api_key or gw.api_key}"),)

    @contextlib.asynccontextmanager
    async def stub(self, gw: GatewayProcess) -> AsyncIterator[Any]:
        async with self.stub_at(gw.grpc_target) as stub:
            yield stub

    @contextlib.asynccontextmanager
    async def stub_at(self, target: str) -> AsyncIterator[Any]:
        """A Tidegate stub on ``target`` (a gateway's gRPC edge, or a pass-through's)."""
        async with grpc.aio.insecure_channel(target, options=CHANNEL_OPTIONS) as ch:
            yield pb_grpc.TidegateStub(ch)

    @contextlib.contextmanager
    def tenants(self, gw: GatewayProcess, n: int, **quotas: int) -> Iterator[list[str]]:
        """API keys of ``n`` tenants created for the block (with ``quotas``) and deleted
        after it; for ``n == 1`` the gateway's own tenant, untouched."""
        with self.named_tenants(gw, n, **quotas) as pairs:
            yield [key for _, key in pairs]

    @contextlib.contextmanager
    def named_tenants(
        self, gw: GatewayProcess, n: int, **quotas: int
    ) -> Iterator[list[tuple[str, str]]]:
        """:meth:`tenants` as (name, API key) pairs (a Kafka login names both)."""
        if n <= 1 and not quotas:
            yield [(gw.tenant, gw.api_key or "")]
            return
        names = [f"bench-{secrets.token_hex(4)}" for _ in range(n)]
        pairs = []
        with gw.admin() as admin:
            for name in names:
                admin.create_tenant(name)
                if quotas:
                    admin.set_quota(name, **quotas)
                pairs.append((name, admin.issue_key(name)[1]))
        try:
            yield pairs
        finally:
            with gw.admin() as admin:
                for name in names:
                    admin.delete_tenant(name)

    def settings(self, **tiering: Any) -> Settings:
        """Settings of the tiered gateway's backends (same data folder, Redis, catalog
        and warehouse), for tiering and baselines run in this process."""
        from gateway.config import Settings

        return Settings.explicit(
            data_dir=self.tiered.data_dir,
            hot={"type": "redis", "url": self.redis.url},
            tiering={"enabled": False, **tiering},
        )

    @contextlib.contextmanager
    def components(self, **tiering: Any) -> Iterator[Components]:
        from gateway.lake.components import Components

        with Components.open(self.settings(**tiering)) as c:
            yield c

    def table_def(self, c: Components, ref: Any) -> TableDef:
        return c.meta.get_table(self.tiered.tenant, ref.namespace, ref.name)

    def catalog(self) -> Any:
        """The tiered gateway's Iceberg catalog, opened with pyiceberg alone."""
        from pyiceberg.catalog.sql import SqlCatalog

        s = self.settings()
        return SqlCatalog(s.cold.catalog.name, uri=s.cold_catalog_uri, warehouse=s.cold_warehouse)

    def iceberg_table(self, ref: Any) -> Any:
        """The pyiceberg table behind ``ref``, loaded straight from the catalog (what a
        user of pyiceberg, DuckDB or Spark would open), with no Tidegate code involved."""
        return self.catalog().load_table((self.tiered.tenant, ref.namespace, ref.name))


def compare(result: dict[str, Any], baselines: list[dict[str, Any]]) -> dict[str, Any]:
    """Add ``ratios``: Tidegate's records/s divided by each baseline's, on the same records
    (1.00 = as fast as the baseline; for a closed loop this is also the inverse of the
    latency ratio). Records, not bytes: a Tidegate read also returns the system columns."""
    result["ratios"] = {
        b["system"]: (result["records_per_s"] / b["records_per_s"] if b["records_per_s"] else None)
        for b in baselines
    }
    return result
