"""The servicer's table methods, and a table as the gRPC edge answers it."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from gateway.core import MaintenanceView, TableView
from gateway.server.grpc.calls import current_call
from gateway.server.grpc.service.base import ServicerBase, optional
from gateway.wire._proto.tidegate.v1 import tidegate_pb2 as pb
from gateway.wire.changes import engine_to_json

__all__ = ["TableMethods", "table_info"]


def table_info(view: TableView) -> pb.TableInfo:
    d = view.definition
    return pb.TableInfo(
        table=pb.TableRef(namespace=d.namespace, name=d.name),
        table_id=d.table_id,
        fields=[
            pb.Field(
                name=f["name"],
                type=f["type"],
                nullable=f["nullable"],
                doc=f.get("doc", ""),
                added=f.get("added", False),
            )
            for f in view.fields
        ],
        partitions=d.partitions,
        key_columns=d.key_columns,
        partition_info=[
            pb.PartitionInfo(
                partition=p.partition,
                earliest_offset=p.earliest_offset,
                high_watermark=p.high_watermark,
                tiered_watermark=p.tiered_watermark,
                hot_bytes=p.hot_bytes,
                lag_records=p.lag_records,
                lag_bytes=p.lag_bytes,
            )
            for p in view.partitions
        ],
        created_at_ms=int(d.created_at.timestamp() * 1000),
        iceberg_table=view.iceberg_table,
        iceberg_metadata=view.iceberg_metadata,
        schema_version=view.schema_version,
        iceberg_schema_id=view.iceberg_schema_id if view.iceberg_schema_id >= 0 else None,
        retention_ms=d.retention_ms,
        retention_records=d.retention_records,
        maintenance=_maintenance(view.maintenance),
        primary_key=list(d.primary_key.columns) if d.primary_key else [],
        merge_engine=pb.MergeEngine(**engine_to_json(d.primary_key.engine))
        if d.primary_key
        else None,
    )


def _ms(when: datetime) -> int:
    return int(when.timestamp() * 1000)


def _maintenance(m: MaintenanceView | None) -> pb.TableMaintenance | None:
    if m is None:
        return None
    return pb.TableMaintenance(
        data_files=m.stats.data_files,
        small_files=m.stats.small_files,
        small_file_ratio=m.stats.small_file_ratio,
        data_bytes=m.stats.data_bytes,
        snapshots=m.stats.snapshots,
        leases=[
            pb.SnapshotLease(
                snapshot_id=lease.snapshot_id, kind=lease.kind, expires_at_ms=_ms(lease.expires_at)
            )
            for lease in m.leases
        ],
        last_runs={
            job: pb.JobRun(finished_at_ms=_ms(r.finished_at), outcome=r.outcome, detail=r.detail)
            for job, r in m.last_runs.items()
        },
    )


class TableMethods(ServicerBase):
    async def CreateTable(self, request: pb.CreateTableRequest, context: Any) -> pb.TableInfo:
        fields = [
            {
                "name": f.name,
                "type": f.type,
                "nullable": f.nullable,
                **({"doc": f.doc} if f.doc else {}),
            }
            for f in request.fields
        ]
        view = await self.calls.create_table(
            current_call().tenant,
            request.table.namespace,
            request.table.name,
            fields,
            request.partitions,
            list(request.key_columns),
            retention_ms=optional(request, "retention_ms"),
            retention_records=optional(request, "retention_records"),
            primary_key=list(request.primary_key),
            merge_engine=(
                {"type": request.merge_engine.type, "column": request.merge_engine.column}
                if request.HasField("merge_engine")
                else None
            ),
        )
        return table_info(view)

    async def AlterTable(self, request: pb.AlterTableRequest, context: Any) -> pb.TableInfo:
        view = await self.service.set_retention(
            current_call().tenant,
            request.table.namespace,
            request.table.name,
            optional(request, "retention_ms"),
            optional(request, "retention_records"),
        )
        return table_info(view)

    async def DescribeTable(self, request: pb.DescribeTableRequest, context: Any) -> pb.TableInfo:
        view = await self.service.describe_table(
            current_call().tenant, request.table.namespace, request.table.name
        )
        return table_info(view)

    async def AlterSchema(self, request: pb.AlterSchemaRequest, context: Any) -> pb.TableInfo:
        changes = [
            {
                k: getattr(c, k)
                for k in ("op", "column", "type", "doc", "nullable")
                if k in ("op", "column") or c.HasField(k)
            }
            for c in request.changes
        ]
        view = await self.service.alter_schema(
            current_call().tenant, request.table.namespace, request.table.name, changes
        )
        return table_info(view)

    async def ListTables(
        self, request: pb.ListTablesRequest, context: Any
    ) -> pb.ListTablesResponse:
        page = await self.service.list_tables_page(
            current_call().tenant,
            request.namespace or None,
            request.page_size,
            request.page_token,
            request.name_contains,
        )
        return pb.ListTablesResponse(
            tables=[table_info(v) for v in page.items], next_page_token=page.next_page_token
        )

    async def ListSnapshots(
        self, request: pb.ListSnapshotsRequest, context: Any
    ) -> pb.ListSnapshotsResponse:
        snaps = await self.service.list_snapshots(
            current_call().tenant, request.table.namespace, request.table.name
        )
        return pb.ListSnapshotsResponse(
            snapshots=[
                pb.Snapshot(
                    snapshot_id=s.snapshot_id,
                    timestamp_ms=s.timestamp_ms,
                    operation=s.operation,
                    summary=dict(s.summary),
                )
                for s in snaps
            ]
        )

    async def DropTable(self, request: pb.DropTableRequest, context: Any) -> pb.DropTableResponse:
        await self.service.drop_table(
            current_call().tenant, request.table.namespace, request.table.name
        )
        return pb.DropTableResponse()
