from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Field(_message.Message):
    __slots__ = ("name", "type", "nullable", "doc", "added")
    NAME_FIELD_NUMBER: _ClassVar[int]
    TYPE_FIELD_NUMBER: _ClassVar[int]
    NULLABLE_FIELD_NUMBER: _ClassVar[int]
    DOC_FIELD_NUMBER: _ClassVar[int]
    ADDED_FIELD_NUMBER: _ClassVar[int]
    name: str
    type: str
    nullable: bool
    doc: str
    added: bool
    def __init__(self, name: _Optional[str] = ..., type: _Optional[str] = ..., nullable: _Optional[bool] = ..., doc: _Optional[str] = ..., added: _Optional[bool] = ...) -> None: ...

class TableRef(_message.Message):
    __slots__ = ("namespace", "name")
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    namespace: str
    name: str
    def __init__(self, namespace: _Optional[str] = ..., name: _Optional[str] = ...) -> None: ...

class CreateTableRequest(_message.Message):
    __slots__ = ("table", "fields", "partitions", "key_columns", "retention_ms", "retention_records", "primary_key", "merge_engine")
    TABLE_FIELD_NUMBER: _ClassVar[int]
    FIELDS_FIELD_NUMBER: _ClassVar[int]
    PARTITIONS_FIELD_NUMBER: _ClassVar[int]
    KEY_COLUMNS_FIELD_NUMBER: _ClassVar[int]
    RETENTION_MS_FIELD_NUMBER: _ClassVar[int]
    RETENTION_RECORDS_FIELD_NUMBER: _ClassVar[int]
    PRIMARY_KEY_FIELD_NUMBER: _ClassVar[int]
    MERGE_ENGINE_FIELD_NUMBER: _ClassVar[int]
    table: TableRef
    fields: _containers.RepeatedCompositeFieldContainer[Field]
    partitions: int
    key_columns: _containers.RepeatedScalarFieldContainer[str]
    retention_ms: int
    retention_records: int
    primary_key: _containers.RepeatedScalarFieldContainer[str]
    merge_engine: MergeEngine
    def __init__(self, table: _Optional[_Union[TableRef, _Mapping]] = ..., fields: _Optional[_Iterable[_Union[Field, _Mapping]]] = ..., partitions: _Optional[int] = ..., key_columns: _Optional[_Iterable[str]] = ..., retention_ms: _Optional[int] = ..., retention_records: _Optional[int] = ..., primary_key: _Optional[_Iterable[str]] = ..., merge_engine: _Optional[_Union[MergeEngine, _Mapping]] = ...) -> None: ...

class MergeEngine(_message.Message):
    __slots__ = ("type", "column")
    TYPE_FIELD_NUMBER: _ClassVar[int]
    COLUMN_FIELD_NUMBER: _ClassVar[int]
    type: str
    column: str
    def __init__(self, type: _Optional[str] = ..., column: _Optional[str] = ...) -> None: ...

class AlterTableRequest(_message.Message):
    __slots__ = ("table", "retention_ms", "retention_records")
    TABLE_FIELD_NUMBER: _ClassVar[int]
    RETENTION_MS_FIELD_NUMBER: _ClassVar[int]
    RETENTION_RECORDS_FIELD_NUMBER: _ClassVar[int]
    table: TableRef
    retention_ms: int
    retention_records: int
    def __init__(self, table: _Optional[_Union[TableRef, _Mapping]] = ..., retention_ms: _Optional[int] = ..., retention_records: _Optional[int] = ...) -> None: ...

class PartitionInfo(_message.Message):
    __slots__ = ("partition", "earliest_offset", "high_watermark", "tiered_watermark", "hot_bytes", "lag_records", "lag_bytes")
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    EARLIEST_OFFSET_FIELD_NUMBER: _ClassVar[int]
    HIGH_WATERMARK_FIELD_NUMBER: _ClassVar[int]
    TIERED_WATERMARK_FIELD_NUMBER: _ClassVar[int]
    HOT_BYTES_FIELD_NUMBER: _ClassVar[int]
    LAG_RECORDS_FIELD_NUMBER: _ClassVar[int]
    LAG_BYTES_FIELD_NUMBER: _ClassVar[int]
    partition: int
    earliest_offset: int
    high_watermark: int
    tiered_watermark: int
    hot_bytes: int
    lag_records: int
    lag_bytes: int
    def __init__(self, partition: _Optional[int] = ..., earliest_offset: _Optional[int] = ..., high_watermark: _Optional[int] = ..., tiered_watermark: _Optional[int] = ..., hot_bytes: _Optional[int] = ..., lag_records: _Optional[int] = ..., lag_bytes: _Optional[int] = ...) -> None: ...

class TableInfo(_message.Message):
    __slots__ = ("table", "table_id", "fields", "partitions", "key_columns", "partition_info", "created_at_ms", "iceberg_table", "iceberg_metadata", "schema_version", "iceberg_schema_id", "retention_ms", "retention_records", "maintenance", "primary_key", "merge_engine")
    TABLE_FIELD_NUMBER: _ClassVar[int]
    TABLE_ID_FIELD_NUMBER: _ClassVar[int]
    FIELDS_FIELD_NUMBER: _ClassVar[int]
    PARTITIONS_FIELD_NUMBER: _ClassVar[int]
    KEY_COLUMNS_FIELD_NUMBER: _ClassVar[int]
    PARTITION_INFO_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_MS_FIELD_NUMBER: _ClassVar[int]
    ICEBERG_TABLE_FIELD_NUMBER: _ClassVar[int]
    ICEBERG_METADATA_FIELD_NUMBER: _ClassVar[int]
    SCHEMA_VERSION_FIELD_NUMBER: _ClassVar[int]
    ICEBERG_SCHEMA_ID_FIELD_NUMBER: _ClassVar[int]
    RETENTION_MS_FIELD_NUMBER: _ClassVar[int]
    RETENTION_RECORDS_FIELD_NUMBER: _ClassVar[int]
    MAINTENANCE_FIELD_NUMBER: _ClassVar[int]
    PRIMARY_KEY_FIELD_NUMBER: _ClassVar[int]
    MERGE_ENGINE_FIELD_NUMBER: _ClassVar[int]
    table: TableRef
    table_id: str
    fields: _containers.RepeatedCompositeFieldContainer[Field]
    partitions: int
    key_columns: _containers.RepeatedScalarFieldContainer[str]
    partition_info: _containers.RepeatedCompositeFieldContainer[PartitionInfo]
    created_at_ms: int
    iceberg_table: str
    iceberg_metadata: str
    schema_version: int
    iceberg_schema_id: int
    retention_ms: int
    retention_records: int
    maintenance: TableMaintenance
    primary_key: _containers.RepeatedScalarFieldContainer[str]
    merge_engine: MergeEngine
    def __init__(self, table: _Optional[_Union[TableRef, _Mapping]] = ..., table_id: _Optional[str] = ..., fields: _Optional[_Iterable[_Union[Field, _Mapping]]] = ..., partitions: _Optional[int] = ..., key_columns: _Optional[_Iterable[str]] = ..., partition_info: _Optional[_Iterable[_Union[PartitionInfo, _Mapping]]] = ..., created_at_ms: _Optional[int] = ..., iceberg_table: _Optional[str] = ..., iceberg_metadata: _Optional[str] = ..., schema_version: _Optional[int] = ..., iceberg_schema_id: _Optional[int] = ..., retention_ms: _Optional[int] = ..., retention_records: _Optional[int] = ..., maintenance: _Optional[_Union[TableMaintenance, _Mapping]] = ..., primary_key: _Optional[_Iterable[str]] = ..., merge_engine: _Optional[_Union[MergeEngine, _Mapping]] = ...) -> None: ...

class SnapshotLease(_message.Message):
    __slots__ = ("snapshot_id", "kind", "expires_at_ms")
    SNAPSHOT_ID_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    EXPIRES_AT_MS_FIELD_NUMBER: _ClassVar[int]
    snapshot_id: int
    kind: str
    expires_at_ms: int
    def __init__(self, snapshot_id: _Optional[int] = ..., kind: _Optional[str] = ..., expires_at_ms: _Optional[int] = ...) -> None: ...

class JobRun(_message.Message):
    __slots__ = ("finished_at_ms", "outcome", "detail")
    FINISHED_AT_MS_FIELD_NUMBER: _ClassVar[int]
    OUTCOME_FIELD_NUMBER: _ClassVar[int]
    DETAIL_FIELD_NUMBER: _ClassVar[int]
    finished_at_ms: int
    outcome: str
    detail: str
    def __init__(self, finished_at_ms: _Optional[int] = ..., outcome: _Optional[str] = ..., detail: _Optional[str] = ...) -> None: ...

class TableMaintenance(_message.Message):
    __slots__ = ("data_files", "small_files", "small_file_ratio", "data_bytes", "snapshots", "leases", "last_runs")
    class LastRunsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: JobRun
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[JobRun, _Mapping]] = ...) -> None: ...
    DATA_FILES_FIELD_NUMBER: _ClassVar[int]
    SMALL_FILES_FIELD_NUMBER: _ClassVar[int]
    SMALL_FILE_RATIO_FIELD_NUMBER: _ClassVar[int]
    DATA_BYTES_FIELD_NUMBER: _ClassVar[int]
    SNAPSHOTS_FIELD_NUMBER: _ClassVar[int]
    LEASES_FIELD_NUMBER: _ClassVar[int]
    LAST_RUNS_FIELD_NUMBER: _ClassVar[int]
    data_files: int
    small_files: int
    small_file_ratio: float
    data_bytes: int
    snapshots: int
    leases: _containers.RepeatedCompositeFieldContainer[SnapshotLease]
    last_runs: _containers.MessageMap[str, JobRun]
    def __init__(self, data_files: _Optional[int] = ..., small_files: _Optional[int] = ..., small_file_ratio: _Optional[float] = ..., data_bytes: _Optional[int] = ..., snapshots: _Optional[int] = ..., leases: _Optional[_Iterable[_Union[SnapshotLease, _Mapping]]] = ..., last_runs: _Optional[_Mapping[str, JobRun]] = ...) -> None: ...

class SchemaChange(_message.Message):
    __slots__ = ("op", "column", "type", "doc", "nullable")
    OP_FIELD_NUMBER: _ClassVar[int]
    COLUMN_FIELD_NUMBER: _ClassVar[int]
    TYPE_FIELD_NUMBER: _ClassVar[int]
    DOC_FIELD_NUMBER: _ClassVar[int]
    NULLABLE_FIELD_NUMBER: _ClassVar[int]
    op: str
    column: str
    type: str
    doc: str
    nullable: bool
    def __init__(self, op: _Optional[str] = ..., column: _Optional[str] = ..., type: _Optional[str] = ..., doc: _Optional[str] = ..., nullable: _Optional[bool] = ...) -> None: ...

class AlterSchemaRequest(_message.Message):
    __slots__ = ("table", "changes")
    TABLE_FIELD_NUMBER: _ClassVar[int]
    CHANGES_FIELD_NUMBER: _ClassVar[int]
    table: TableRef
    changes: _containers.RepeatedCompositeFieldContainer[SchemaChange]
    def __init__(self, table: _Optional[_Union[TableRef, _Mapping]] = ..., changes: _Optional[_Iterable[_Union[SchemaChange, _Mapping]]] = ...) -> None: ...

class ListSnapshotsRequest(_message.Message):
    __slots__ = ("table",)
    TABLE_FIELD_NUMBER: _ClassVar[int]
    table: TableRef
    def __init__(self, table: _Optional[_Union[TableRef, _Mapping]] = ...) -> None: ...

class Snapshot(_message.Message):
    __slots__ = ("snapshot_id", "timestamp_ms", "operation", "summary")
    class SummaryEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    SNAPSHOT_ID_FIELD_NUMBER: _ClassVar[int]
    TIMESTAMP_MS_FIELD_NUMBER: _ClassVar[int]
    OPERATION_FIELD_NUMBER: _ClassVar[int]
    SUMMARY_FIELD_NUMBER: _ClassVar[int]
    snapshot_id: int
    timestamp_ms: int
    operation: str
    summary: _containers.ScalarMap[str, str]
    def __init__(self, snapshot_id: _Optional[int] = ..., timestamp_ms: _Optional[int] = ..., operation: _Optional[str] = ..., summary: _Optional[_Mapping[str, str]] = ...) -> None: ...

class ListSnapshotsResponse(_message.Message):
    __slots__ = ("snapshots",)
    SNAPSHOTS_FIELD_NUMBER: _ClassVar[int]
    snapshots: _containers.RepeatedCompositeFieldContainer[Snapshot]
    def __init__(self, snapshots: _Optional[_Iterable[_Union[Snapshot, _Mapping]]] = ...) -> None: ...

class DescribeTableRequest(_message.Message):
    __slots__ = ("table",)
    TABLE_FIELD_NUMBER: _ClassVar[int]
    table: TableRef
    def __init__(self, table: _Optional[_Union[TableRef, _Mapping]] = ...) -> None: ...

class ListTablesRequest(_message.Message):
    __slots__ = ("namespace", "page_size", "page_token", "name_contains")
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    NAME_CONTAINS_FIELD_NUMBER: _ClassVar[int]
    namespace: str
    page_size: int
    page_token: str
    name_contains: str
    def __init__(self, namespace: _Optional[str] = ..., page_size: _Optional[int] = ..., page_token: _Optional[str] = ..., name_contains: _Optional[str] = ...) -> None: ...

class ListTablesResponse(_message.Message):
    __slots__ = ("tables", "next_page_token")
    TABLES_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    tables: _containers.RepeatedCompositeFieldContainer[TableInfo]
    next_page_token: str
    def __init__(self, tables: _Optional[_Iterable[_Union[TableInfo, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class DropTableRequest(_message.Message):
    __slots__ = ("table",)
    TABLE_FIELD_NUMBER: _ClassVar[int]
    table: TableRef
    def __init__(self, table: _Optional[_Union[TableRef, _Mapping]] = ...) -> None: ...

class DropTableResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class AppendRequest(_message.Message):
    __slots__ = ("table", "arrow_ipc", "partition", "producer_id", "sequence")
    TABLE_FIELD_NUMBER: _ClassVar[int]
    ARROW_IPC_FIELD_NUMBER: _ClassVar[int]
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    PRODUCER_ID_FIELD_NUMBER: _ClassVar[int]
    SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    table: TableRef
    arrow_ipc: bytes
    partition: int
    producer_id: str
    sequence: int
    def __init__(self, table: _Optional[_Union[TableRef, _Mapping]] = ..., arrow_ipc: _Optional[bytes] = ..., partition: _Optional[int] = ..., producer_id: _Optional[str] = ..., sequence: _Optional[int] = ...) -> None: ...

class AppendRange(_message.Message):
    __slots__ = ("partition", "base_offset", "count", "duplicate")
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    BASE_OFFSET_FIELD_NUMBER: _ClassVar[int]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    DUPLICATE_FIELD_NUMBER: _ClassVar[int]
    partition: int
    base_offset: int
    count: int
    duplicate: bool
    def __init__(self, partition: _Optional[int] = ..., base_offset: _Optional[int] = ..., count: _Optional[int] = ..., duplicate: _Optional[bool] = ...) -> None: ...

class AppendResponse(_message.Message):
    __slots__ = ("ranges",)
    RANGES_FIELD_NUMBER: _ClassVar[int]
    ranges: _containers.RepeatedCompositeFieldContainer[AppendRange]
    def __init__(self, ranges: _Optional[_Iterable[_Union[AppendRange, _Mapping]]] = ...) -> None: ...

class AppendStreamRequest(_message.Message):
    __slots__ = ("request_id", "append")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    APPEND_FIELD_NUMBER: _ClassVar[int]
    request_id: int
    append: AppendRequest
    def __init__(self, request_id: _Optional[int] = ..., append: _Optional[_Union[AppendRequest, _Mapping]] = ...) -> None: ...

class Error(_message.Message):
    __slots__ = ("code", "reason", "message", "metadata", "retry_after_ms")
    class MetadataEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    CODE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    METADATA_FIELD_NUMBER: _ClassVar[int]
    RETRY_AFTER_MS_FIELD_NUMBER: _ClassVar[int]
    code: int
    reason: str
    message: str
    metadata: _containers.ScalarMap[str, str]
    retry_after_ms: int
    def __init__(self, code: _Optional[int] = ..., reason: _Optional[str] = ..., message: _Optional[str] = ..., metadata: _Optional[_Mapping[str, str]] = ..., retry_after_ms: _Optional[int] = ...) -> None: ...

class AppendStreamResponse(_message.Message):
    __slots__ = ("request_id", "ok", "error")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    OK_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    request_id: int
    ok: AppendResponse
    error: Error
    def __init__(self, request_id: _Optional[int] = ..., ok: _Optional[_Union[AppendResponse, _Mapping]] = ..., error: _Optional[_Union[Error, _Mapping]] = ...) -> None: ...

class ReadRequest(_message.Message):
    __slots__ = ("table", "partition", "offset", "max_records", "max_bytes", "follow", "raw_hot")
    TABLE_FIELD_NUMBER: _ClassVar[int]
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    MAX_RECORDS_FIELD_NUMBER: _ClassVar[int]
    MAX_BYTES_FIELD_NUMBER: _ClassVar[int]
    FOLLOW_FIELD_NUMBER: _ClassVar[int]
    RAW_HOT_FIELD_NUMBER: _ClassVar[int]
    table: TableRef
    partition: int
    offset: int
    max_records: int
    max_bytes: int
    follow: bool
    raw_hot: bool
    def __init__(self, table: _Optional[_Union[TableRef, _Mapping]] = ..., partition: _Optional[int] = ..., offset: _Optional[int] = ..., max_records: _Optional[int] = ..., max_bytes: _Optional[int] = ..., follow: _Optional[bool] = ..., raw_hot: _Optional[bool] = ...) -> None: ...

class HotBatch(_message.Message):
    __slots__ = ("arrow_ipc", "base_offset", "timestamp_us", "skip", "count")
    ARROW_IPC_FIELD_NUMBER: _ClassVar[int]
    BASE_OFFSET_FIELD_NUMBER: _ClassVar[int]
    TIMESTAMP_US_FIELD_NUMBER: _ClassVar[int]
    SKIP_FIELD_NUMBER: _ClassVar[int]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    arrow_ipc: bytes
    base_offset: int
    timestamp_us: int
    skip: int
    count: int
    def __init__(self, arrow_ipc: _Optional[bytes] = ..., base_offset: _Optional[int] = ..., timestamp_us: _Optional[int] = ..., skip: _Optional[int] = ..., count: _Optional[int] = ...) -> None: ...

class ReadResponse(_message.Message):
    __slots__ = ("arrow_ipc", "next_offset", "high_watermark", "tiered_watermark", "hot_batches")
    ARROW_IPC_FIELD_NUMBER: _ClassVar[int]
    NEXT_OFFSET_FIELD_NUMBER: _ClassVar[int]
    HIGH_WATERMARK_FIELD_NUMBER: _ClassVar[int]
    TIERED_WATERMARK_FIELD_NUMBER: _ClassVar[int]
    HOT_BATCHES_FIELD_NUMBER: _ClassVar[int]
    arrow_ipc: bytes
    next_offset: int
    high_watermark: int
    tiered_watermark: int
    hot_batches: _containers.RepeatedCompositeFieldContainer[HotBatch]
    def __init__(self, arrow_ipc: _Optional[bytes] = ..., next_offset: _Optional[int] = ..., high_watermark: _Optional[int] = ..., tiered_watermark: _Optional[int] = ..., hot_batches: _Optional[_Iterable[_Union[HotBatch, _Mapping]]] = ...) -> None: ...

class PartitionOffset(_message.Message):
    __slots__ = ("partition", "offset")
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    partition: int
    offset: int
    def __init__(self, partition: _Optional[int] = ..., offset: _Optional[int] = ...) -> None: ...

class OffsetsForTimesRequest(_message.Message):
    __slots__ = ("table", "timestamp_us", "partitions")
    TABLE_FIELD_NUMBER: _ClassVar[int]
    TIMESTAMP_US_FIELD_NUMBER: _ClassVar[int]
    PARTITIONS_FIELD_NUMBER: _ClassVar[int]
    table: TableRef
    timestamp_us: int
    partitions: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, table: _Optional[_Union[TableRef, _Mapping]] = ..., timestamp_us: _Optional[int] = ..., partitions: _Optional[_Iterable[int]] = ...) -> None: ...

class OffsetsForTimesResponse(_message.Message):
    __slots__ = ("offsets",)
    OFFSETS_FIELD_NUMBER: _ClassVar[int]
    offsets: _containers.RepeatedCompositeFieldContainer[PartitionOffset]
    def __init__(self, offsets: _Optional[_Iterable[_Union[PartitionOffset, _Mapping]]] = ...) -> None: ...

class CommitOffsetsRequest(_message.Message):
    __slots__ = ("group", "table", "offsets", "member_id", "generation")
    GROUP_FIELD_NUMBER: _ClassVar[int]
    TABLE_FIELD_NUMBER: _ClassVar[int]
    OFFSETS_FIELD_NUMBER: _ClassVar[int]
    MEMBER_ID_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    group: str
    table: TableRef
    offsets: _containers.RepeatedCompositeFieldContainer[PartitionOffset]
    member_id: str
    generation: int
    def __init__(self, group: _Optional[str] = ..., table: _Optional[_Union[TableRef, _Mapping]] = ..., offsets: _Optional[_Iterable[_Union[PartitionOffset, _Mapping]]] = ..., member_id: _Optional[str] = ..., generation: _Optional[int] = ...) -> None: ...

class CommitOffsetsResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class FetchOffsetsRequest(_message.Message):
    __slots__ = ("group", "table", "partitions")
    GROUP_FIELD_NUMBER: _ClassVar[int]
    TABLE_FIELD_NUMBER: _ClassVar[int]
    PARTITIONS_FIELD_NUMBER: _ClassVar[int]
    group: str
    table: TableRef
    partitions: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, group: _Optional[str] = ..., table: _Optional[_Union[TableRef, _Mapping]] = ..., partitions: _Optional[_Iterable[int]] = ...) -> None: ...

class FetchOffsetsResponse(_message.Message):
    __slots__ = ("offsets",)
    OFFSETS_FIELD_NUMBER: _ClassVar[int]
    offsets: _containers.RepeatedCompositeFieldContainer[PartitionOffset]
    def __init__(self, offsets: _Optional[_Iterable[_Union[PartitionOffset, _Mapping]]] = ...) -> None: ...

class ListGroupsRequest(_message.Message):
    __slots__ = ("table",)
    TABLE_FIELD_NUMBER: _ClassVar[int]
    table: TableRef
    def __init__(self, table: _Optional[_Union[TableRef, _Mapping]] = ...) -> None: ...

class GroupTable(_message.Message):
    __slots__ = ("group", "table")
    GROUP_FIELD_NUMBER: _ClassVar[int]
    TABLE_FIELD_NUMBER: _ClassVar[int]
    group: str
    table: TableRef
    def __init__(self, group: _Optional[str] = ..., table: _Optional[_Union[TableRef, _Mapping]] = ...) -> None: ...

class ListGroupsResponse(_message.Message):
    __slots__ = ("groups",)
    GROUPS_FIELD_NUMBER: _ClassVar[int]
    groups: _containers.RepeatedCompositeFieldContainer[GroupTable]
    def __init__(self, groups: _Optional[_Iterable[_Union[GroupTable, _Mapping]]] = ...) -> None: ...

class GroupHeartbeatRequest(_message.Message):
    __slots__ = ("group", "table", "member_id", "generation", "owned", "session_timeout_ms", "leave", "client_id")
    GROUP_FIELD_NUMBER: _ClassVar[int]
    TABLE_FIELD_NUMBER: _ClassVar[int]
    MEMBER_ID_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    OWNED_FIELD_NUMBER: _ClassVar[int]
    SESSION_TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    LEAVE_FIELD_NUMBER: _ClassVar[int]
    CLIENT_ID_FIELD_NUMBER: _ClassVar[int]
    group: str
    table: TableRef
    member_id: str
    generation: int
    owned: _containers.RepeatedScalarFieldContainer[int]
    session_timeout_ms: int
    leave: bool
    client_id: str
    def __init__(self, group: _Optional[str] = ..., table: _Optional[_Union[TableRef, _Mapping]] = ..., member_id: _Optional[str] = ..., generation: _Optional[int] = ..., owned: _Optional[_Iterable[int]] = ..., session_timeout_ms: _Optional[int] = ..., leave: _Optional[bool] = ..., client_id: _Optional[str] = ...) -> None: ...

class GroupHeartbeatResponse(_message.Message):
    __slots__ = ("member_id", "generation", "assigned", "pending", "settling")
    MEMBER_ID_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    ASSIGNED_FIELD_NUMBER: _ClassVar[int]
    PENDING_FIELD_NUMBER: _ClassVar[int]
    SETTLING_FIELD_NUMBER: _ClassVar[int]
    member_id: str
    generation: int
    assigned: _containers.RepeatedScalarFieldContainer[int]
    pending: int
    settling: bool
    def __init__(self, member_id: _Optional[str] = ..., generation: _Optional[int] = ..., assigned: _Optional[_Iterable[int]] = ..., pending: _Optional[int] = ..., settling: _Optional[bool] = ...) -> None: ...

class DescribeGroupRequest(_message.Message):
    __slots__ = ("group", "table")
    GROUP_FIELD_NUMBER: _ClassVar[int]
    TABLE_FIELD_NUMBER: _ClassVar[int]
    group: str
    table: TableRef
    def __init__(self, group: _Optional[str] = ..., table: _Optional[_Union[TableRef, _Mapping]] = ...) -> None: ...

class GroupMemberInfo(_message.Message):
    __slots__ = ("member_id", "client_id", "generation", "assigned", "revoking", "pending", "session_timeout_ms", "joined_at_ms", "last_heartbeat_ms", "protocol")
    MEMBER_ID_FIELD_NUMBER: _ClassVar[int]
    CLIENT_ID_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    ASSIGNED_FIELD_NUMBER: _ClassVar[int]
    REVOKING_FIELD_NUMBER: _ClassVar[int]
    PENDING_FIELD_NUMBER: _ClassVar[int]
    SESSION_TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    JOINED_AT_MS_FIELD_NUMBER: _ClassVar[int]
    LAST_HEARTBEAT_MS_FIELD_NUMBER: _ClassVar[int]
    PROTOCOL_FIELD_NUMBER: _ClassVar[int]
    member_id: str
    client_id: str
    generation: int
    assigned: _containers.RepeatedScalarFieldContainer[int]
    revoking: _containers.RepeatedScalarFieldContainer[int]
    pending: _containers.RepeatedScalarFieldContainer[int]
    session_timeout_ms: int
    joined_at_ms: int
    last_heartbeat_ms: int
    protocol: str
    def __init__(self, member_id: _Optional[str] = ..., client_id: _Optional[str] = ..., generation: _Optional[int] = ..., assigned: _Optional[_Iterable[int]] = ..., revoking: _Optional[_Iterable[int]] = ..., pending: _Optional[_Iterable[int]] = ..., session_timeout_ms: _Optional[int] = ..., joined_at_ms: _Optional[int] = ..., last_heartbeat_ms: _Optional[int] = ..., protocol: _Optional[str] = ...) -> None: ...

class GroupPartitionInfo(_message.Message):
    __slots__ = ("partition", "member_id", "committed", "high_watermark", "lag")
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    MEMBER_ID_FIELD_NUMBER: _ClassVar[int]
    COMMITTED_FIELD_NUMBER: _ClassVar[int]
    HIGH_WATERMARK_FIELD_NUMBER: _ClassVar[int]
    LAG_FIELD_NUMBER: _ClassVar[int]
    partition: int
    member_id: str
    committed: int
    high_watermark: int
    lag: int
    def __init__(self, partition: _Optional[int] = ..., member_id: _Optional[str] = ..., committed: _Optional[int] = ..., high_watermark: _Optional[int] = ..., lag: _Optional[int] = ...) -> None: ...

class DescribeGroupResponse(_message.Message):
    __slots__ = ("group", "table", "generation", "state", "members", "partitions", "lag")
    GROUP_FIELD_NUMBER: _ClassVar[int]
    TABLE_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    MEMBERS_FIELD_NUMBER: _ClassVar[int]
    PARTITIONS_FIELD_NUMBER: _ClassVar[int]
    LAG_FIELD_NUMBER: _ClassVar[int]
    group: str
    table: TableRef
    generation: int
    state: str
    members: _containers.RepeatedCompositeFieldContainer[GroupMemberInfo]
    partitions: _containers.RepeatedCompositeFieldContainer[GroupPartitionInfo]
    lag: int
    def __init__(self, group: _Optional[str] = ..., table: _Optional[_Union[TableRef, _Mapping]] = ..., generation: _Optional[int] = ..., state: _Optional[str] = ..., members: _Optional[_Iterable[_Union[GroupMemberInfo, _Mapping]]] = ..., partitions: _Optional[_Iterable[_Union[GroupPartitionInfo, _Mapping]]] = ..., lag: _Optional[int] = ...) -> None: ...

class ScanRequest(_message.Message):
    __slots__ = ("table", "columns", "filter", "as_of", "limit")
    TABLE_FIELD_NUMBER: _ClassVar[int]
    COLUMNS_FIELD_NUMBER: _ClassVar[int]
    FILTER_FIELD_NUMBER: _ClassVar[int]
    AS_OF_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    table: TableRef
    columns: _containers.RepeatedScalarFieldContainer[str]
    filter: str
    as_of: str
    limit: int
    def __init__(self, table: _Optional[_Union[TableRef, _Mapping]] = ..., columns: _Optional[_Iterable[str]] = ..., filter: _Optional[str] = ..., as_of: _Optional[str] = ..., limit: _Optional[int] = ...) -> None: ...

class ScanResponse(_message.Message):
    __slots__ = ("arrow_ipc", "snapshot_id")
    ARROW_IPC_FIELD_NUMBER: _ClassVar[int]
    SNAPSHOT_ID_FIELD_NUMBER: _ClassVar[int]
    arrow_ipc: bytes
    snapshot_id: int
    def __init__(self, arrow_ipc: _Optional[bytes] = ..., snapshot_id: _Optional[int] = ...) -> None: ...

class LookupRequest(_message.Message):
    __slots__ = ("table", "arrow_ipc")
    TABLE_FIELD_NUMBER: _ClassVar[int]
    ARROW_IPC_FIELD_NUMBER: _ClassVar[int]
    table: TableRef
    arrow_ipc: bytes
    def __init__(self, table: _Optional[_Union[TableRef, _Mapping]] = ..., arrow_ipc: _Optional[bytes] = ...) -> None: ...

class LookupResponse(_message.Message):
    __slots__ = ("arrow_ipc",)
    ARROW_IPC_FIELD_NUMBER: _ClassVar[int]
    arrow_ipc: bytes
    def __init__(self, arrow_ipc: _Optional[bytes] = ...) -> None: ...

class PlanReadRequest(_message.Message):
    __slots__ = ("table", "filter", "as_of")
    TABLE_FIELD_NUMBER: _ClassVar[int]
    FILTER_FIELD_NUMBER: _ClassVar[int]
    AS_OF_FIELD_NUMBER: _ClassVar[int]
    table: TableRef
    filter: str
    as_of: str
    def __init__(self, table: _Optional[_Union[TableRef, _Mapping]] = ..., filter: _Optional[str] = ..., as_of: _Optional[str] = ...) -> None: ...

class PlannedDataFile(_message.Message):
    __slots__ = ("url", "partition", "record_count", "file_size_bytes", "min_offset", "max_offset", "expires_at_ms", "warehouse_path")
    URL_FIELD_NUMBER: _ClassVar[int]
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    RECORD_COUNT_FIELD_NUMBER: _ClassVar[int]
    FILE_SIZE_BYTES_FIELD_NUMBER: _ClassVar[int]
    MIN_OFFSET_FIELD_NUMBER: _ClassVar[int]
    MAX_OFFSET_FIELD_NUMBER: _ClassVar[int]
    EXPIRES_AT_MS_FIELD_NUMBER: _ClassVar[int]
    WAREHOUSE_PATH_FIELD_NUMBER: _ClassVar[int]
    url: str
    partition: int
    record_count: int
    file_size_bytes: int
    min_offset: int
    max_offset: int
    expires_at_ms: int
    warehouse_path: str
    def __init__(self, url: _Optional[str] = ..., partition: _Optional[int] = ..., record_count: _Optional[int] = ..., file_size_bytes: _Optional[int] = ..., min_offset: _Optional[int] = ..., max_offset: _Optional[int] = ..., expires_at_ms: _Optional[int] = ..., warehouse_path: _Optional[str] = ...) -> None: ...

class HotRange(_message.Message):
    __slots__ = ("partition", "from_offset", "to_offset")
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    FROM_OFFSET_FIELD_NUMBER: _ClassVar[int]
    TO_OFFSET_FIELD_NUMBER: _ClassVar[int]
    partition: int
    from_offset: int
    to_offset: int
    def __init__(self, partition: _Optional[int] = ..., from_offset: _Optional[int] = ..., to_offset: _Optional[int] = ...) -> None: ...

class PlanReadResponse(_message.Message):
    __slots__ = ("snapshot_id", "files", "hot_ranges", "arrow_schema", "earliest_offsets")
    SNAPSHOT_ID_FIELD_NUMBER: _ClassVar[int]
    FILES_FIELD_NUMBER: _ClassVar[int]
    HOT_RANGES_FIELD_NUMBER: _ClassVar[int]
    ARROW_SCHEMA_FIELD_NUMBER: _ClassVar[int]
    EARLIEST_OFFSETS_FIELD_NUMBER: _ClassVar[int]
    snapshot_id: int
    files: _containers.RepeatedCompositeFieldContainer[PlannedDataFile]
    hot_ranges: _containers.RepeatedCompositeFieldContainer[HotRange]
    arrow_schema: bytes
    earliest_offsets: _containers.RepeatedCompositeFieldContainer[PartitionOffset]
    def __init__(self, snapshot_id: _Optional[int] = ..., files: _Optional[_Iterable[_Union[PlannedDataFile, _Mapping]]] = ..., hot_ranges: _Optional[_Iterable[_Union[HotRange, _Mapping]]] = ..., arrow_schema: _Optional[bytes] = ..., earliest_offsets: _Optional[_Iterable[_Union[PartitionOffset, _Mapping]]] = ...) -> None: ...

class GetGatewayInfoRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class GatewayInfo(_message.Message):
    __slots__ = ("flight_port", "flight_location", "flight_appends")
    FLIGHT_PORT_FIELD_NUMBER: _ClassVar[int]
    FLIGHT_LOCATION_FIELD_NUMBER: _ClassVar[int]
    FLIGHT_APPENDS_FIELD_NUMBER: _ClassVar[int]
    flight_port: int
    flight_location: str
    flight_appends: bool
    def __init__(self, flight_port: _Optional[int] = ..., flight_location: _Optional[str] = ..., flight_appends: _Optional[bool] = ...) -> None: ...
