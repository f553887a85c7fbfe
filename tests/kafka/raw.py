"""A bare Kafka connection for the tests that need exact frames (hostile input, exact
error codes): requests and answers are kio's classes, written and read by kio, record
batches aiokafka's. Only the 4-byte length prefix is framed here."""

from __future__ import annotations

import datetime as dt
import io
import socket
import struct
from typing import Any

from aiokafka.record.default_records import DefaultRecordBatchBuilder
from kio.index import load_response_schema
from kio.schema.api_versions.v3.request import ApiVersionsRequest
from kio.schema.produce.v9 import request as produce
from kio.schema.sasl_authenticate.v2.request import SaslAuthenticateRequest
from kio.schema.sasl_handshake.v1.request import SaslHandshakeRequest
from kio.serial import entity_reader, entity_writer

from tests.kafka.conftest import KafkaTarget


def encode_request(request: Any, correlation: int, client_id: str = "raw-test") -> bytes:
    """A request as kio writes it (its header and body), without the length prefix."""
    header_cls = request.__header_schema__
    fields = {
        "request_api_key": request.__api_key__,
        "request_api_version": request.__version__,
        "correlation_id": correlation,
        "client_id": client_id,
    }
    out = io.BytesIO()
    entity_writer(header_cls)(out, header_cls(**fields))
    entity_writer(type(request))(out, request)
    return out.getvalue()


class RawKafka:
    def __init__(self, target: KafkaTarget, timeout: float = 30.0) -> None:
        host, port = target.bootstrap.rsplit(":", 1)
        self.sock = socket.create_connection((host, int(port)), timeout=timeout)
        self.correlation = 0

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> RawKafka:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def send_bytes(self, data: bytes) -> None:
        self.sock.sendall(data)

    def send(self, request: Any) -> int:
        self.correlation += 1
        body = encode_request(request, self.correlation)
        self.sock.sendall(struct.pack(">i", len(body)) + body)
        return self.correlation

    def read_frame(self) -> bytes:
        head = self._exactly(4)
        (size,) = struct.unpack(">i", head)
        return self._exactly(size)

    def _exactly(self, n: int) -> bytes:
        buf = b""
        while len(buf) < n:
            chunk = self.sock.recv(n - len(buf))
            if not chunk:
                raise ConnectionError("closed by the gateway")
            buf += chunk
        return buf

    def call(self, request: Any) -> Any:
        correlation = self.send(request)
        frame = self.read_frame()
        cls = load_response_schema(request.__api_key__, request.__version__)
        header, at = entity_reader(cls.__header_schema__)(frame, 0)
        assert header.correlation_id == correlation
        answer, _ = entity_reader(cls)(frame, at)
        return answer

    def closed(self) -> bool:
        """Whether the gateway closed the connection (waits up to the socket timeout)."""
        try:
            return self.sock.recv(1) == b""
        except ConnectionResetError:
            return True

    def authenticate(self, user: str, password: str) -> Any:
        self.call(ApiVersionsRequest(client_software_name="raw", client_software_version="1"))
        self.call(SaslHandshakeRequest(mechanism="PLAIN"))
        token = b"\0" + user.encode() + b"\0" + password.encode()
        return self.call(SaslAuthenticateRequest(auth_bytes=token))


def record_batch(
    values: list[bytes],
    codec: int = 0,
    *,
    producer_id: int = -1,
    epoch: int = -1,
    sequence: int = -1,
) -> bytes:
    """A record batch of ``values`` (compressed with Kafka's ``codec``: 0 none, 1 gzip,
    2 snappy, 3 lz4, 4 zstd), as aiokafka's producer builds it; an idempotent producer's
    with ``producer_id``, ``epoch`` and its first record's ``sequence``."""
    builder = DefaultRecordBatchBuilder(
        magic=2,
        compression_type=codec,
        is_transactional=0,
        producer_id=producer_id,
        producer_epoch=epoch,
        base_sequence=sequence,
        batch_size=1 << 30,
    )
    for i, value in enumerate(values):
        builder.append(i, 0, None, value, [])
    return bytes(builder.build())


def produce_records(topic: str, partition: int, records: bytes) -> produce.ProduceRequest:
    """A Produce (v9, acks=all) of one partition's record set."""
    return produce.ProduceRequest(
        transactional_id=None,
        acks=-1,
        timeout=dt.timedelta(seconds=10),
        topic_data=(
            produce.TopicProduceData(
                name=topic,
                partition_data=(produce.PartitionProduceData(index=partition, records=records),),
            ),
        ),
    )
