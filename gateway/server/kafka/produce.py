"""Kafka's Produce: a batch's records decoded into the table's rows (JSON values into its
columns, or kept raw) and appended as one Arrow append of any edge."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from gateway.server.calls import OFFLOAD_BYTES, AppendBody, wire_error
from gateway.server.kafka.base import ApisBase, message, split_topic
from gateway.server.kafka.producers import ProducerEpochs, idempotence
from gateway.server.kafka.protocol import ErrorCode, Request, build, error_code, response_class
from gateway.server.kafka.records import decode_produce, is_raw, raw_rows, rows_from_values
from gateway.wire.errors import InvalidRequest
from gateway.wire.types import AppendRange


class ProduceApis(ApisBase):
    """Produce."""

    producers: ProducerEpochs

    async def produce(self, request: Request) -> Any | None:
        body = request.body
        deadline = time.monotonic() + min(body.timeout.total_seconds(), 60.0)
        topics = []
        # The partitions of a request are appended at once (each is its own log, and a
        # request names a partition once): the request takes as long as its slowest
        # partition rather than their sum, which a connection serving one request at a
        # time (as a Kafka broker does) would otherwise feel as its whole throughput.
        work = [
            (t.name, [self._produce_partition(t.name, p.index, p.records, deadline)
                      for p in t.partition_data])
            for t in body.topic_data
        ]  # fmt: skip
        flat = await asyncio.gather(*(c for _, calls in work for c in calls))
        at = 0
        for name, calls in work:
            topics.append({"name": name, "partition_responses": flat[at : at + len(calls)]})
            at += len(calls)
        if body.acks == 0:
            return None
        return build(response_class(request), {"responses": topics})

    async def _produce_partition(
        self, topic: str, partition: int, records: bytes | None, deadline: float
    ) -> dict[str, Any]:
        answer: dict[str, Any] = {"index": partition, "base_offset": -1}
        parts = split_topic(topic)
        if parts is None:
            answer["error_code"] = ErrorCode.unknown_topic_or_partition
            return answer
        namespace, name = parts
        nbytes = len(records or b"")
        big = nbytes >= OFFLOAD_BYTES
        refused: list[tuple[int, str]] = []

        async def decode() -> AppendBody:
            limit = self.service.settings.server.max_request_bytes
            produced = await self.calls.offload(big, decode_produce, records, limit)
            if produced.transactional:
                raise InvalidRequest(
                    f"{topic}: transactional produce is not supported by Tidegate's Kafka "
                    "listener yet; produce without transactional.id"
                )
            table = await self.service.table(self.tenant, namespace, name)
            # After the table: a topic not the tenant's is unknown whatever its batch says.
            producer = idempotence(produced, self.producers, self.tenant, topic)
            if is_raw(table.schema):
                raw = await self.calls.offload(big, raw_rows, produced, table.schema)
                return AppendBody([raw], partition, **producer)
            batch, bad = await self.calls.offload(
                big, rows_from_values, produced.values, table.schema, table.added_columns
            )
            if batch is None:
                refused.extend(bad)
                raise _Refused()
            return AppendBody([batch], partition, **producer)

        async def attempt() -> list[AppendRange]:
            # Refused without decoding while the tenant's appends are refused after a
            # throttle; held and tried again meanwhile.
            self.calls.refuse_append_early(self.tenant)
            return await self.calls.append(self.tenant, namespace, name, nbytes, decode)

        try:
            ranges = await self._muted(attempt, deadline)
        except _Refused:
            answer["error_code"] = ErrorCode.invalid_record
            answer["record_errors"] = [
                {"batch_index": i, "batch_index_error_message": m} for i, m in refused
            ]
            answer["error_message"] = (
                f"{topic}: {len(refused)} record(s) refused, nothing of the batch stored; "
                f"first: record {refused[0][0]}: {refused[0][1]}"
            )[:1000]
            return answer
        except Exception as exc:
            err = wire_error(exc, "a Kafka produce")
            answer["error_code"] = error_code(err)
            answer["error_message"] = message(err, topic)
            return answer
        answer["error_code"] = ErrorCode.none
        answer["base_offset"] = ranges[0].base_offset if ranges else -1
        return answer


class _Refused(Exception):
    """Records of a Produce refused one by one (the answer names each)."""
