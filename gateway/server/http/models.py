"""The HTTP edge's wire models (what the OpenAPI document describes). Request models
forbid unknown keys and do not coerce types."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

__all__ = [
    "ARROW_BINARY",
    "ARROW_STREAM",
    "ERRORS",
    "GROUP_ERRORS",
    "HEADER_HIGH_WATERMARK",
    "HEADER_NEXT_OFFSET",
    "HEADER_TIERED_WATERMARK",
    "JSON",
    "WATERMARK_HEADERS",
    "AppendRequest",
    "AppendResponse",
    "CommitOffsetsRequest",
    "CreateTableRequest",
    "ErrorResponse",
    "GroupDescription",
    "GroupList",
    "GroupOffsets",
    "HeartbeatRequest",
    "HeartbeatResponse",
    "PlanRequest",
    "ReadResponse",
    "ScanRequest",
    "SnapshotList",
    "TableDescription",
    "TableList",
]

ARROW_STREAM = "application/vnd.apache.arrow.stream"
JSON = "application/json"
HEADER_NEXT_OFFSET = "Tidegate-Next-Offset"
HEADER_HIGH_WATERMARK = "Tidegate-High-Watermark"
HEADER_TIERED_WATERMARK = "Tidegate-Tiered-Watermark"


class _Request(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class FieldSpec(_Request):
    """One column of a table schema."""

    name: str = Field(description="Column name: a letter, then letters, digits or '_'.")
    type: str = Field(
        description="Arrow type name: int64, string, timestamp[us, tz=UTC], "
        "decimal128(10, 2), list<int32>, struct<a: int32, b: string>..."
    )
    nullable: bool = Field(True, description="Whether the column admits nulls.")
    doc: str | None = Field(None, description="What the column holds (Iceberg's column doc).")


class CreateTableRequest(_Request):
    """``POST /v1/tables``."""

    namespace: str = Field(description="Namespace of the table, within the tenant.")
    name: str = Field(description="Table name, unique within the namespace.")
    schema_: list[FieldSpec] | dict[str, str] = Field(
        alias="schema",
        description="A list of fields, or the shorthand {column: type} (all nullable).",
    )
    partitions: int = Field(
        1,
        description="Number of partitions, fixed for the table's life (default 1, as in the "
        "SDK and CLI).",
    )
    key_columns: list[str] = Field(
        default_factory=list,
        description="Columns whose stable hash routes a row to a partition; empty: "
        "round-robin per batch.",
    )
    retention_ms: int | None = Field(
        None,
        description="Remove records this many milliseconds after their append (Kafka's "
        "retention.ms); null or 0: no limit by age.",
    )
    retention_records: int | None = Field(
        None,
        description="Keep at most this many records per partition, the newest (removing "
        "those further below the high watermark); null or 0: no limit by count.",
    )
    primary_key: list[str] = Field(
        default_factory=list,
        description="Columns of the primary key (immutable; made non-null): appends are "
        "upserts and the table's scans answer the latest live row per key. Empty: an "
        "append-only table. key_columns, when given, must be a part of it.",
    )
    merge_engine: str | dict[str, str] | None = Field(
        None,
        description="How writes of one key merge: last_row (default), first_row, "
        'partial_update, or {"type": "versioned", "column": c}. Only with primary_key.',
    )


class AlterTableRequest(_Request):
    """``PATCH /v1/tables/{namespace}/{name}``: change the table's options; a field left
    out keeps its value."""

    retention_ms: int | None = Field(
        None, description="New retention by age in milliseconds; 0 removes the limit."
    )
    retention_records: int | None = Field(
        None, description="New retention by count per partition; 0 removes the limit."
    )


class SchemaChange(_Request):
    """One change of ``POST /v1/tables/{namespace}/{name}/schema``."""

    op: str = Field(
        description="add_column (nullable), update_type (int32 to int64, float32 to "
        "float64), make_optional, or update_doc."
    )
    column: str = Field(description="The column changed (or added).")
    type: str | None = Field(
        None, description="add_column: the new column's type; update_type: the wider type."
    )
    doc: str | None = Field(
        None, description="add_column, update_doc: the column's doc (null clears it)."
    )
    nullable: bool | None = Field(
        None, description="add_column: must be true (or left out): a new column is nullable."
    )


class AlterSchemaRequest(_Request):
    """``POST /v1/tables/{namespace}/{name}/schema``: changes applied in order, all or
    none."""

    changes: list[SchemaChange] = Field(description="The changes, applied in order.")


class AppendRequest(_Request):
    """The JSON body of ``POST /v1/tables/{namespace}/{name}/records``."""

    rows: list[dict[str, Any]] = Field(
        description="Rows as objects holding every column of the table schema. Timestamps "
        "are ISO-8601 strings (with an offset for zoned columns) or integer microseconds, "
        "decimals strings or numbers, binary base64."
    )
    partition: int | None = Field(None, description="Write every row to this partition.")
    producer_id: str | None = Field(
        None, description="Idempotent producer id; goes with 'sequence'."
    )
    sequence: int | None = Field(
        None, description="Per-partition batch sequence of the producer; goes with producer_id."
    )


class DeleteRequest(_Request):
    """The JSON body of ``POST /v1/tables/{namespace}/{name}/deletes``."""

    keys: list[dict[str, Any]] = Field(
        description="The keys to delete, each an object of the primary key's columns."
    )
    producer_id: str | None = Field(
        None, description="Idempotent producer id; goes with 'sequence'."
    )
    sequence: int | None = Field(
        None, description="Per-partition batch sequence of the producer; goes with producer_id."
    )


class LookupRequest(_Request):
    """The JSON body of ``POST /v1/tables/{namespace}/{name}/lookup``."""

    keys: list[dict[str, Any]] = Field(
        description="The keys to look up, each an object of the primary key's columns."
    )


class ScanRequest(_Request):
    """The JSON body of ``POST /v1/tables/{namespace}/{name}/scan``."""

    columns: list[str] | None = Field(
        None, description="Columns to return (user or system columns); default all."
    )
    filter: str | None = Field(
        None,
        description="Row filter (SQL-like; see the README), e.g. "
        "\"id > 5 and name = 'x'\", \"ts >= '2024-01-01T00:00:00+00:00'\", "
        '"tag is null", "id in (1, 2)", "name like \'pre%\'".',
    )
    as_of: int | str | None = Field(
        None,
        description="A snapshot id or an ISO-8601 time: read only that Iceberg snapshot "
        "(the hot tier keeps no history, so recent untiered records are not included).",
    )
    limit: int | None = Field(None, ge=0, description="At most this many rows.")


class PlanRequest(_Request):
    """The JSON body of ``POST /v1/tables/{namespace}/{name}/plan``."""

    filter: str | None = Field(None, description="Row filter (same syntax as scan).")
    as_of: int | str | None = Field(None, description="A snapshot id or an ISO-8601 time.")


class PartitionInfo(BaseModel):
    partition: int
    earliest_offset: int = Field(description="Earliest offset still readable.")
    high_watermark: int = Field(description="Next offset to be assigned.")
    tiered_watermark: int = Field(description="Every offset below this is in Iceberg.")
    hot_bytes: int = Field(description="Bytes held by the hot tier.")
    lag_records: int = Field(description="Records not yet tiered (HW - T).")
    lag_bytes: int = Field(description="Estimated hot bytes of the records not yet tiered.")


class LeaseInfo(BaseModel):
    snapshot_id: int
    kind: str = Field(description="'scan' (released when it ends) or 'plan'.")
    expires_at: str = Field(description="ISO-8601, UTC.")


class JobRunInfo(BaseModel):
    finished_at: str = Field(description="ISO-8601, UTC.")
    outcome: str = Field(description="'ok' or 'failed'.")
    detail: str = Field(description="What the run did, or why it failed.")


class MaintenanceInfo(BaseModel):
    data_files: int = Field(description="Data files of the current snapshot.")
    small_files: int = Field(description="Of which below compaction.small_file_bytes.")
    small_file_ratio: float = Field(description="small_files / data_files (0 with none).")
    data_bytes: int = Field(description="Bytes of the current snapshot's data files.")
    snapshots: int = Field(description="Snapshots retained in the table's metadata.")
    leases: list[LeaseInfo] = Field(
        description="Snapshots open scans and read plans hold against expiry."
    )
    last_runs: dict[str, JobRunInfo] = Field(
        description="Last run per maintenance job: compact, expire, orphans, retention."
    )


class TableDescription(BaseModel):
    namespace: str
    name: str
    table_id: str = Field(description="Unique for the table's lifetime.")
    schema_: list[dict[str, Any]] = Field(alias="schema", description="The user schema.")
    partitions: int
    key_columns: list[str]
    primary_key: list[str] = Field(
        default_factory=list, description="The primary key's columns; empty: append-only."
    )
    merge_engine: dict[str, str] | None = Field(
        None, description="The merge engine of a primary-key table; null: append-only."
    )
    created_at: str = Field(description="ISO-8601, UTC.")
    retention_ms: int | None = Field(None, description="Retention by age; null: none.")
    retention_records: int | None = Field(None, description="Retention by count; null: none.")
    partition_info: list[PartitionInfo] | None = Field(
        None, description="Live offsets per partition (describe and create only)."
    )
    iceberg_table: str | None = Field(
        None, description="The Iceberg table's identifier in the catalog (describe only)."
    )
    iceberg_metadata: str | None = Field(
        None, description="Its current metadata file, for engines that read it directly."
    )
    schema_version: int = Field(
        0, description="Raised by one at every schema change (0 at create)."
    )
    iceberg_schema_id: int | None = Field(
        None, description="The Iceberg table's current schema id (describe only)."
    )
    maintenance: MaintenanceInfo | None = Field(
        None, description="Files, snapshots, leases and maintenance runs (describe only)."
    )


class Snapshot(BaseModel):
    snapshot_id: int
    timestamp_ms: int
    operation: str = Field(description="Iceberg's operation: append, overwrite, ...")
    summary: dict[str, str]


class SnapshotList(BaseModel):
    snapshots: list[Snapshot] = Field(description="Oldest first.")


class GroupTable(BaseModel):
    group: str
    namespace: str
    name: str


class GroupList(BaseModel):
    groups: list[GroupTable]


class TableList(BaseModel):
    tables: list[TableDescription]
    next_page_token: str = Field(
        "", description="Where the next page starts (pass it as page_token); empty: last page."
    )


class AppendedRange(BaseModel):
    partition: int
    base_offset: int = Field(description="Offset of the first record of the range.")
    count: int
    duplicate: bool = Field(description="A retried idempotent batch: original offsets.")


class AppendResponse(BaseModel):
    ranges: list[AppendedRange]


class ReadResponse(BaseModel):
    records: list[dict[str, Any]] = Field(
        description="Records in offset order: the user columns then _partition, _offset, "
        "_timestamp."
    )
    next_offset: int = Field(description="Offset to read from next.")
    high_watermark: int = Field(description="The partition's high watermark at the read.")
    tiered_watermark: int = Field(
        description="Records below this offset came from the Iceberg table, the others from "
        "the hot tier."
    )


class PartitionOffset(_Request):
    partition: int = Field(description="Partition number, 0..N-1.")
    offset: int = Field(description="Next offset the group will consume.")


class CommitOffsetsRequest(_Request):
    """``POST /v1/groups/{group}/tables/{namespace}/{name}/offsets``."""

    offsets: list[PartitionOffset] = Field(description="Committed offsets per partition.")
    member_id: str = Field(
        "",
        description="A member's commit: refused (409 ILLEGAL_GENERATION / UNKNOWN_MEMBER_ID) "
        "unless the member holds every partition at `generation`. Without it the commit is "
        "refused (409 NON_EMPTY_GROUP) while the group has live members.",
    )
    generation: int = Field(0, description="The member's generation (its last heartbeat's).")


class HeartbeatRequest(_Request):
    """``POST /v1/groups/{group}/tables/{namespace}/{name}/heartbeat``."""

    member_id: str = Field(
        "", description="The member's id; empty on a join: the gateway draws one."
    )
    generation: int = Field(0, description="0 to join; then the last answer's generation.")
    owned: list[int] = Field(
        default_factory=list, description="The partitions the member holds now."
    )
    session_timeout_ms: int = Field(
        10_000, description="Without a heartbeat for this long the member is removed."
    )
    leave: bool = Field(False, description="Leave the group: its partitions move at once.")
    client_id: str = Field("", description="Who the member is, for describe (host/pid...).")


class HeartbeatResponse(BaseModel):
    member_id: str
    generation: int = Field(description="The member's generation: its commits carry it.")
    assigned: list[int] = Field(
        description="What the member may read now; a partition it holds and is not named "
        "here it must give up (commit, stop reading, say so in its next heartbeat)."
    )
    pending: int = Field(description="Partitions of its target still held by other members.")
    settling: bool = Field(description="The group has not converged: heartbeat again soon.")


class GroupMember(BaseModel):
    member_id: str
    client_id: str
    generation: int
    assigned: list[int] = Field(description="What it reads now.")
    revoking: list[int] = Field(description="What it is giving up.")
    pending: list[int] = Field(description="What it waits for (held by others still).")
    session_timeout_ms: int
    joined_at_ms: int
    last_heartbeat_ms: int
    protocol: str = Field(
        description="Whose protocol it joined by: `tidegate` (the SDK, HTTP, gRPC), or the "
        "edge that coordinates its group (`kafka-classic`, `kafka-consumer`)."
    )


class GroupPartition(BaseModel):
    partition: int
    member_id: str | None = Field(description="Its member; null when nobody reads it.")
    committed: int | None = Field(description="The committed offset; null: never committed.")
    high_watermark: int
    lag: int = Field(description="Records appended and not committed yet.")


class GroupDescription(BaseModel):
    """``GET /v1/groups/{group}/tables/{namespace}/{name}``."""

    group: str
    namespace: str
    name: str
    generation: int
    state: str = Field(description="empty (no live member), stable or rebalancing.")
    members: list[GroupMember]
    partitions: list[GroupPartition]
    lag: int


class GroupOffsets(BaseModel):
    group: str
    namespace: str
    name: str
    offsets: list[dict[str, int]] = Field(
        description="[{partition, offset}] for every partition the group has committed."
    )


class ErrorBody(BaseModel):
    model_config = ConfigDict(extra="allow")

    reason: str = Field(description="Stable machine-readable reason, e.g. TABLE_NOT_FOUND.")
    message: str = Field("", description="Human-readable explanation.")


class ErrorResponse(BaseModel):
    error: ErrorBody


ERRORS: dict[int | str, dict[str, Any]] = {
    400: {"model": ErrorResponse, "description": "Invalid request"},
    401: {"model": ErrorResponse, "description": "No valid 'authorization: Bearer <key>'"},
    403: {"model": ErrorResponse, "description": "Tenant suspended, or the operator key"},
    404: {"model": ErrorResponse, "description": "No such table"},
    429: {"model": ErrorResponse, "description": "Over a quota; see Retry-After"},
    503: {"model": ErrorResponse, "description": "A backend is unavailable"},
}
#: The answers of the group routes: ERRORS and the refusals of membership.
GROUP_ERRORS: dict[int | str, dict[str, Any]] = {
    **ERRORS,
    409: {
        "model": ErrorResponse,
        "description": "A fenced member (ILLEGAL_GENERATION, UNKNOWN_MEMBER_ID) or a commit "
        "from outside a group with live members (NON_EMPTY_GROUP)",
    },
}
ARROW_BINARY = {"schema": {"type": "string", "format": "binary"}}
WATERMARK_HEADERS = {
    HEADER_NEXT_OFFSET: {"description": "Offset to read from next.", "schema": {"type": "integer"}},
    HEADER_HIGH_WATERMARK: {
        "description": "The partition's high watermark at the read.",
        "schema": {"type": "integer"},
    },
    HEADER_TIERED_WATERMARK: {
        "description": "Offsets below it came from the Iceberg table, the rest from the hot tier.",
        "schema": {"type": "integer"},
    },
}
