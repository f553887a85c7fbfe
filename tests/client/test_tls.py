"""TLS options against an in-process fake gateway with a self-signed certificate."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path

import grpc
import pytest

from gateway.client import Retry, TidegateError
from gateway.wire._proto.tidegate.v1 import tidegate_pb2_grpc as pb_grpc
from tests.client.test_retry_after import FakeGateway
from tests.services import connect, connect_async, self_signed


@pytest.fixture(scope="module")
def certificate(tmp_path_factory: pytest.TempPathFactory) -> tuple[bytes, bytes]:
    folder = tmp_path_factory.mktemp("tls")
    cert, key = self_signed(folder)
    return Path(key).read_bytes(), Path(cert).read_bytes()


@pytest.fixture
def tls_target(certificate: tuple[bytes, bytes]) -> Iterator[str]:
    key, cert = certificate
    server = grpc.server(futures.ThreadPoolExecutor(2))
    pb_grpc.add_TidegateServicer_to_server(FakeGateway("per_request", set()), server)
    port = server.add_secure_port("127.0.0.1:0", grpc.ssl_server_credentials([(key, cert)]))
    server.start()
    try:
        yield f"127.0.0.1:{port}"
    finally:
        server.stop(None)


def test_tls_with_root_certificates(tls_target: str, certificate: tuple[bytes, bytes]) -> None:
    _, cert = certificate
    with connect(tls_target, root_certificates=cert, api_key="k") as c:
        assert c.table_info("ns.t").partitions == 1

    async def main() -> int:
        async with connect_async(f"grpcs://{tls_target}", root_certificates=cert) as c:
            return (await c.table_info("ns.t")).partitions

    assert asyncio.run(main()) == 1


def test_plaintext_client_cannot_talk_to_a_tls_gateway(tls_target: str) -> None:
    with connect(tls_target, timeout=2, retry=Retry.none()) as c, pytest.raises(TidegateError):
        c.describe_table("ns.t")
