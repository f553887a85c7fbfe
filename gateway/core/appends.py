"""Appends: validate, route to partitions, store per partition with offsets."""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Sequence

import pyarrow as pa

from gateway.core.base import CoreBase
from gateway.core.names import INT64_MAX, check_text
from gateway.core.views import TableView
from gateway.hot import AppendResult, PartitionId, ProducerSequence
from gateway.wire.codec import encode_batch
from gateway.wire.errors import InvalidIdempotentAppend, InvalidRequest, SchemaMismatch
from gateway.wire.routing import partition_for_key, route_by_key
from gateway.wire.schema import conform_batch
from gateway.wire.types import AppendRange

__all__ = ["AppendOps"]


class AppendOps(CoreBase):
    async def append(
        self,
        tenant: str,
        namespace: str,
        name: str,
        batches: Sequence[pa.RecordBatch],
        *,
        partition: int | None = None,
        producer_id: str | None = None,
        sequence: int | None = None,
    ) -> list[AppendRange]:
        """Validate, route and store rows; one contiguous offset range per partition.

        Every check happens before anything is written: a request that fails validation
        stores nothing. A request whose rows span several partitions is stored per
        partition (not atomically across partitions, as in Kafka).

        Raises:
            TableNotFound, SchemaMismatch, InvalidPartition, InvalidRequest,
            InvalidIdempotentAppend, OutOfOrderSequence, Unavailable.
        """
        table = await self.table(tenant, namespace, name)
        d = table.definition
        if (producer_id is None) != (sequence is None):
            raise InvalidIdempotentAppend("producer_id and sequence go together")
        if producer_id is not None and (
            not isinstance(sequence, int)
            or not 0 <= sequence <= INT64_MAX
            or not producer_id
            or len(producer_id) > 128
        ):
            raise InvalidIdempotentAppend(
                f"sequence must be an integer from 0 to {INT64_MAX} and producer_id 1 to "
                "128 characters"
            )
        if producer_id is not None:
            check_text("producer_id", producer_id, 128)
        try:
            conformed = [
                conform_batch(b, table.schema, table.added_columns) for b in batches if b.num_rows
            ]
        except SchemaMismatch as exc:
            if not exc.details.get("unexpected"):
                raise
            # Columns this gateway does not know may have been added by a schema change
            # through another gateway since it cached the table: look again, once.
            table = await self.table(tenant, namespace, name, fresh=True)
            d = table.definition
            conformed = [
                conform_batch(b, table.schema, table.added_columns) for b in batches if b.num_rows
            ]
        if not conformed:
            raise InvalidRequest("an append needs at least one row")
        batch = (
            conformed[0]
            if len(conformed) == 1
            else pa.Table.from_batches(conformed, table.schema).combine_chunks().to_batches()[0]
        )
        routes = self._route(table, batch, partition, producer_id, sequence)
        if producer_id is not None and len(routes) != 1:
            raise InvalidIdempotentAppend(
                f"an idempotent append must target one partition, but its rows route to "
                f"{sorted(routes)}; set 'partition' or split the batch by key",
                partitions=",".join(str(p) for p in sorted(routes)),
            )
        producer = (
            ProducerSequence(producer_id, sequence)
            if producer_id is not None and sequence is not None
            else None
        )
        timestamp_us = time.time_ns() // 1000
        compression = self.settings.compression

        async def store(p: int, idx: pa.Array | None) -> AppendRange:
            part = PartitionId(d.tenant, d.table_id, p)

            def write() -> AppendResult:
                # Selecting and compressing the rows run here, on the I/O thread, with the
                # write: off the event loop, and in parallel for several partitions.
                rows = batch if idx is None else batch.take(idx)
                payload = encode_batch(rows, compression)
                return self.hot.append(part, payload, rows.num_rows, timestamp_us, producer)

            res = await self._run(write)
            self._notifier.notify(part)
            return AppendRange(p, res.base_offset, res.count, res.duplicate)

        jobs = [store(p, idx) for p, idx in routes.items()]
        return list(await asyncio.gather(*jobs))

    def _route(
        self,
        table: TableView,
        batch: pa.RecordBatch,
        partition: int | None,
        producer_id: str | None,
        sequence: int | None,
    ) -> dict[int, pa.Array | None]:
        d = table.definition
        if partition is not None:
            self._part(table, partition)
            return {partition: None}
        if d.key_columns:
            groups = route_by_key(batch, d.key_columns, d.partitions)
            if len(groups) == 1:
                return {next(iter(groups)): None}
            return dict(groups)
        if producer_id is not None:
            # Deterministic, so a retry lands where the first attempt did.
            return {partition_for_key([producer_id], d.partitions): None}
        counter = self._round_robin.setdefault(d.table_id, itertools.count())
        return {next(counter) % d.partitions: None}
