"""Kafka's Fetch and ListOffsets: the stitched stream read of any edge (Iceberg below the
tiered watermark, the hot tier above), with Kafka's long poll."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

from gateway.core import ReadResult, TableView
from gateway.server.calls import wire_error
from gateway.server.kafka.base import ApisBase
from gateway.server.kafka.protocol import ErrorCode, Request, build, error_code, response_class
from gateway.server.kafka.records import encode_fetch, is_raw
from gateway.wire.errors import OffsetOutOfRange

#: ListOffsets' special timestamps.
_LATEST, _EARLIEST, _MAX_TIMESTAMP = -1, -2, -3


class FetchApis(ApisBase):
    """Fetch (with its long poll) and ListOffsets."""

    async def fetch(self, request: Request) -> Any:
        body = request.body
        wait_s = max(0.0, min(body.max_wait.total_seconds(), 30.0))
        room = [max(1, body.max_bytes)]
        wanted = [(t.topic, p) for t in body.topics for p in t.partitions]
        answers = [await self._fetch_partition(topic, p, room) for topic, p in wanted]
        got = sum(len(a.get("records") or b"") for a in answers)
        if got < max(1, body.min_bytes) and wait_s > 0 and wanted:
            await self._wait_for_records(wanted, answers, wait_s)
            room = [max(1, body.max_bytes)]
            answers = [await self._fetch_partition(topic, p, room) for topic, p in wanted]
        by_topic: dict[str, list[dict[str, Any]]] = {}
        for (topic, _), answer in zip(wanted, answers, strict=True):
            by_topic.setdefault(topic, []).append(answer)
        return build(
            response_class(request),
            {
                "session_id": 0,
                "responses": [{"topic": t, "partitions": ps} for t, ps in by_topic.items()],
            },
        )

    async def _fetch_partition(self, topic: str, p: Any, room: list[int]) -> dict[str, Any]:
        answer: dict[str, Any] = {
            "partition_index": p.partition,
            "high_watermark": -1,
            "last_stable_offset": -1,
            "log_start_offset": -1,
            "records": b"",
            "preferred_read_replica": -1,
        }
        table = await self._table(topic)
        if table is None:
            answer["error_code"] = ErrorCode.unknown_topic_or_partition
            return answer
        d = table.definition
        limit = max(1, min(p.partition_max_bytes, room[0]))

        raw = is_raw(table.schema)

        def encode(result: ReadResult) -> tuple[tuple[bytes, int], int]:
            data, _ = encode_fetch(result.batches, d.key_columns, raw)
            return (data, result.high_watermark), len(data)

        try:
            data, high = await self.calls.read(
                self.tenant, d.namespace, d.name, p.partition, p.fetch_offset, None, limit, encode
            )
        except OffsetOutOfRange as err:
            answer["error_code"] = ErrorCode.offset_out_of_range
            answer["high_watermark"] = answer["last_stable_offset"] = err.details["latest"]
            answer["log_start_offset"] = err.details["earliest"]
            return answer
        except Exception as exc:
            answer["error_code"] = error_code(wire_error(exc, "a Kafka fetch"))
            return answer
        room[0] = max(0, room[0] - len(data))
        answer.update(
            error_code=ErrorCode.none,
            high_watermark=high,
            last_stable_offset=high,
            records=data,
        )
        return answer

    async def _wait_for_records(
        self, wanted: list[tuple[str, Any]], answers: list[dict[str, Any]], wait_s: float
    ) -> None:
        """Wait until a record arrives in any of the partitions that answered without an
        error (a follow read of each, as the HTTP long poll does), or ``wait_s``."""

        async def one(topic: str, p: Any) -> None:
            table = await self._table(topic)
            if table is None:
                return
            d = table.definition

            def nothing(result: ReadResult) -> tuple[int, int]:
                return result.num_records, 0

            results = self.calls.follow(
                self.tenant,
                d.namespace,
                d.name,
                p.partition,
                p.fetch_offset,
                nothing,
                max_records=1,
                max_bytes=1,
                max_wait_s=wait_s,
                authorization=self.authorization,
            )
            try:
                async for found in results:
                    if found:
                        return
                    await asyncio.sleep(wait_s + 1)  # nothing: let the others decide
            finally:
                await results.aclose()  # type: ignore[attr-defined]

        followed = [
            asyncio.ensure_future(one(topic, p))
            for (topic, p), a in zip(wanted, answers, strict=True)
            if a.get("error_code") == ErrorCode.none
        ]
        if not followed:
            await asyncio.sleep(wait_s)
            return
        try:
            await asyncio.wait(followed, timeout=wait_s, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in followed:
                task.cancel()
            for task in followed:
                with contextlib.suppress(BaseException):
                    await task

    async def list_offsets(self, request: Request) -> Any:
        topics = []
        for t in request.body.topics:
            answers = []
            table = await self._table(t.name)
            for p in t.partitions:
                answers.append(await self._list_offset(table, p.partition_index, p.timestamp))
            topics.append({"name": t.name, "partitions": answers})
        return build(response_class(request), {"topics": topics})

    async def _list_offset(
        self, table: TableView | None, partition: int, ts: int
    ) -> dict[str, Any]:
        answer: dict[str, Any] = {"partition_index": partition, "timestamp": -1, "offset": -1}
        if table is None:
            answer["error_code"] = ErrorCode.unknown_topic_or_partition
            return answer
        d = table.definition
        try:
            if ts in (_LATEST, _EARLIEST, _MAX_TIMESTAMP):
                bounds = await self.calls.offset_bounds(
                    self.tenant, d.namespace, d.name, [partition]
                )
                earliest, latest = bounds[partition]
                answer["offset"] = earliest if ts == _EARLIEST else latest
            elif ts >= 0:
                found = await self.calls.offsets_for_times(
                    self.tenant, d.namespace, d.name, ts * 1000, [partition]
                )
                bounds = await self.calls.offset_bounds(
                    self.tenant, d.namespace, d.name, [partition]
                )
                if found[partition] < bounds[partition][1]:
                    answer["offset"] = found[partition]
                    answer["timestamp"] = ts
                # else no record at or after the time: offset -1, as Kafka answers
            else:
                answer["error_code"] = ErrorCode.invalid_request
                return answer
        except Exception as exc:
            answer["error_code"] = error_code(wire_error(exc, "a Kafka list offsets"))
            return answer
        answer["error_code"] = ErrorCode.none
        return answer


def fetch_waits(body: Any) -> bool:
    return bool(body.max_wait.total_seconds() > 0)
