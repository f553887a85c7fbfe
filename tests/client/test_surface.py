"""The SDK's public surface and its import weight."""

from __future__ import annotations

import subprocess
import sys

import gateway.client
import gateway.client.aio
import gateway.wire.errors
from tests.services import REPO_ROOT


def test_public_surface_is_pinned() -> None:
    assert sorted(gateway.client.__all__) == [
        "AdminClient",
        "AlreadyExists",
        "AppendRange",
        "AsyncClient",
        "AsyncConsumer",
        "AsyncProducer",
        "Backoff",
        "Client",
        "CommitConflict",
        "ConstantBackoff",
        "Consumer",
        "ExponentialBackoff",
        "Field",
        "GroupInfo",
        "GroupMemberInfo",
        "GroupNotEmpty",
        "GroupPartitionInfo",
        "HotStateLost",
        "IllegalGeneration",
        "InvalidIdempotentAppend",
        "InvalidPartition",
        "InvalidRequest",
        "InvalidSchema",
        "JobRun",
        "KeyNotFound",
        "Maintenance",
        "MalformedPayload",
        "MemberFenced",
        "NotFound",
        "OffsetOutOfRange",
        "OutOfOrderSequence",
        "PartitionInfo",
        "PermissionDenied",
        "Producer",
        "QuotaExceeded",
        "RecordMetadata",
        "RequestTooLarge",
        "ResourceUnavailable",
        "Retry",
        "RetryableError",
        "SchemaChangeRefused",
        "SchemaMismatch",
        "Snapshot",
        "SnapshotLease",
        "SnapshotNotFound",
        "TableAlreadyExists",
        "TableInfo",
        "TableNotFound",
        "TableRef",
        "TenantAlreadyExists",
        "TenantNotFound",
        "TenantSuspended",
        "Throttled",
        "TidegateError",
        "Unauthenticated",
        "Unavailable",
        "Unimplemented",
        "UnknownMember",
        "UnknownProducer",
        "UnsupportedMediaType",
        "error_from_rpc",
    ]
    for name in gateway.client.__all__:
        assert getattr(gateway.client, name) is not None
    assert sorted(gateway.client.aio.__all__) == [
        "AsyncClient",
        "AsyncConsumer",
        "AsyncProducer",
        "Client",
        "Consumer",
        "Producer",
    ]
    assert gateway.client.aio.Client is gateway.client.AsyncClient


def test_errors_are_the_gateways_own_classes() -> None:
    """One tree: every server error class is re-exported, not copied."""
    for name in gateway.wire.errors.__all__:
        if name == "error_for_reason":
            continue
        assert getattr(gateway.client, name) is getattr(gateway.wire.errors, name)


def test_sync_and_async_clients_are_twins() -> None:
    """Every public method of the sync classes exists on the asyncio ones."""
    pairs = [
        (gateway.client.Client, gateway.client.AsyncClient),
        (gateway.client.Producer, gateway.client.AsyncProducer),
        (gateway.client.Consumer, gateway.client.AsyncConsumer),
    ]
    for sync_cls, async_cls in pairs:
        public = {n for n in vars(sync_cls) if not n.startswith("_")}
        assert public <= set(dir(async_cls)), public - set(dir(async_cls))


def test_importing_the_sdk_loads_no_server_or_heavy_dependency() -> None:
    code = (
        "import sys, gateway.client, gateway.client.aio\n"
        "banned = ('fastapi', 'sqlalchemy', 'pyspark', 'redis', 'alembic', 'uvicorn',\n"
        "          'pydantic', 'gateway.server', 'gateway.core', 'gateway.meta', 'gateway.hot')\n"
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in banned or\n"
        "             any(m == b or m.startswith(b + '.') for b in banned))\n"
        "print(','.join(bad))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    assert out.stdout.strip() == ""
