from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class TenantInfo(_message.Message):
    __slots__ = ("name", "status", "created_at_ms")
    NAME_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_MS_FIELD_NUMBER: _ClassVar[int]
    name: str
    status: str
    created_at_ms: int
    def __init__(self, name: _Optional[str] = ..., status: _Optional[str] = ..., created_at_ms: _Optional[int] = ...) -> None: ...

class CreateTenantRequest(_message.Message):
    __slots__ = ("name",)
    NAME_FIELD_NUMBER: _ClassVar[int]
    name: str
    def __init__(self, name: _Optional[str] = ...) -> None: ...

class TenantRequest(_message.Message):
    __slots__ = ("name",)
    NAME_FIELD_NUMBER: _ClassVar[int]
    name: str
    def __init__(self, name: _Optional[str] = ...) -> None: ...

class ListTenantsRequest(_message.Message):
    __slots__ = ("page_size", "page_token", "name_contains")
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    NAME_CONTAINS_FIELD_NUMBER: _ClassVar[int]
    page_size: int
    page_token: str
    name_contains: str
    def __init__(self, page_size: _Optional[int] = ..., page_token: _Optional[str] = ..., name_contains: _Optional[str] = ...) -> None: ...

class ListTenantsResponse(_message.Message):
    __slots__ = ("tenants", "next_page_token")
    TENANTS_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    tenants: _containers.RepeatedCompositeFieldContainer[TenantInfo]
    next_page_token: str
    def __init__(self, tenants: _Optional[_Iterable[_Union[TenantInfo, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class DeleteTenantResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class KeyInfo(_message.Message):
    __slots__ = ("key_id", "tenant", "created_at_ms", "revoked")
    KEY_ID_FIELD_NUMBER: _ClassVar[int]
    TENANT_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_MS_FIELD_NUMBER: _ClassVar[int]
    REVOKED_FIELD_NUMBER: _ClassVar[int]
    key_id: str
    tenant: str
    created_at_ms: int
    revoked: bool
    def __init__(self, key_id: _Optional[str] = ..., tenant: _Optional[str] = ..., created_at_ms: _Optional[int] = ..., revoked: _Optional[bool] = ...) -> None: ...

class IssueKeyResponse(_message.Message):
    __slots__ = ("key", "api_key")
    KEY_FIELD_NUMBER: _ClassVar[int]
    API_KEY_FIELD_NUMBER: _ClassVar[int]
    key: KeyInfo
    api_key: str
    def __init__(self, key: _Optional[_Union[KeyInfo, _Mapping]] = ..., api_key: _Optional[str] = ...) -> None: ...

class RevokeKeyRequest(_message.Message):
    __slots__ = ("key_id",)
    KEY_ID_FIELD_NUMBER: _ClassVar[int]
    key_id: str
    def __init__(self, key_id: _Optional[str] = ...) -> None: ...

class RevokeKeyResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListKeysResponse(_message.Message):
    __slots__ = ("keys",)
    KEYS_FIELD_NUMBER: _ClassVar[int]
    keys: _containers.RepeatedCompositeFieldContainer[KeyInfo]
    def __init__(self, keys: _Optional[_Iterable[_Union[KeyInfo, _Mapping]]] = ...) -> None: ...

class Quota(_message.Message):
    __slots__ = ("append_bytes_per_s", "read_bytes_per_s", "requests_per_s", "max_tables", "max_partitions", "max_hot_bytes")
    APPEND_BYTES_PER_S_FIELD_NUMBER: _ClassVar[int]
    READ_BYTES_PER_S_FIELD_NUMBER: _ClassVar[int]
    REQUESTS_PER_S_FIELD_NUMBER: _ClassVar[int]
    MAX_TABLES_FIELD_NUMBER: _ClassVar[int]
    MAX_PARTITIONS_FIELD_NUMBER: _ClassVar[int]
    MAX_HOT_BYTES_FIELD_NUMBER: _ClassVar[int]
    append_bytes_per_s: int
    read_bytes_per_s: int
    requests_per_s: int
    max_tables: int
    max_partitions: int
    max_hot_bytes: int
    def __init__(self, append_bytes_per_s: _Optional[int] = ..., read_bytes_per_s: _Optional[int] = ..., requests_per_s: _Optional[int] = ..., max_tables: _Optional[int] = ..., max_partitions: _Optional[int] = ..., max_hot_bytes: _Optional[int] = ...) -> None: ...

class SetQuotaRequest(_message.Message):
    __slots__ = ("tenant", "quota")
    TENANT_FIELD_NUMBER: _ClassVar[int]
    QUOTA_FIELD_NUMBER: _ClassVar[int]
    tenant: str
    quota: Quota
    def __init__(self, tenant: _Optional[str] = ..., quota: _Optional[_Union[Quota, _Mapping]] = ...) -> None: ...

class GetUsageRequest(_message.Message):
    __slots__ = ("tenant", "since_ms", "until_ms")
    TENANT_FIELD_NUMBER: _ClassVar[int]
    SINCE_MS_FIELD_NUMBER: _ClassVar[int]
    UNTIL_MS_FIELD_NUMBER: _ClassVar[int]
    tenant: str
    since_ms: int
    until_ms: int
    def __init__(self, tenant: _Optional[str] = ..., since_ms: _Optional[int] = ..., until_ms: _Optional[int] = ...) -> None: ...

class UsageRecord(_message.Message):
    __slots__ = ("minute_ms", "append_bytes", "append_records", "read_bytes", "read_records", "requests", "throttled", "hot_bytes", "cold_bytes")
    MINUTE_MS_FIELD_NUMBER: _ClassVar[int]
    APPEND_BYTES_FIELD_NUMBER: _ClassVar[int]
    APPEND_RECORDS_FIELD_NUMBER: _ClassVar[int]
    READ_BYTES_FIELD_NUMBER: _ClassVar[int]
    READ_RECORDS_FIELD_NUMBER: _ClassVar[int]
    REQUESTS_FIELD_NUMBER: _ClassVar[int]
    THROTTLED_FIELD_NUMBER: _ClassVar[int]
    HOT_BYTES_FIELD_NUMBER: _ClassVar[int]
    COLD_BYTES_FIELD_NUMBER: _ClassVar[int]
    minute_ms: int
    append_bytes: int
    append_records: int
    read_bytes: int
    read_records: int
    requests: int
    throttled: int
    hot_bytes: int
    cold_bytes: int
    def __init__(self, minute_ms: _Optional[int] = ..., append_bytes: _Optional[int] = ..., append_records: _Optional[int] = ..., read_bytes: _Optional[int] = ..., read_records: _Optional[int] = ..., requests: _Optional[int] = ..., throttled: _Optional[int] = ..., hot_bytes: _Optional[int] = ..., cold_bytes: _Optional[int] = ...) -> None: ...

class GetUsageResponse(_message.Message):
    __slots__ = ("tenant", "usage")
    TENANT_FIELD_NUMBER: _ClassVar[int]
    USAGE_FIELD_NUMBER: _ClassVar[int]
    tenant: str
    usage: _containers.RepeatedCompositeFieldContainer[UsageRecord]
    def __init__(self, tenant: _Optional[str] = ..., usage: _Optional[_Iterable[_Union[UsageRecord, _Mapping]]] = ...) -> None: ...

class ListPlacementsRequest(_message.Message):
    __slots__ = ("tenant",)
    TENANT_FIELD_NUMBER: _ClassVar[int]
    tenant: str
    def __init__(self, tenant: _Optional[str] = ...) -> None: ...

class Segment(_message.Message):
    __slots__ = ("shard", "start", "end")
    SHARD_FIELD_NUMBER: _ClassVar[int]
    START_FIELD_NUMBER: _ClassVar[int]
    END_FIELD_NUMBER: _ClassVar[int]
    shard: str
    start: int
    end: int
    def __init__(self, shard: _Optional[str] = ..., start: _Optional[int] = ..., end: _Optional[int] = ...) -> None: ...

class Placement(_message.Message):
    __slots__ = ("tenant", "table", "partition", "shard", "epoch", "move_target", "segments")
    TENANT_FIELD_NUMBER: _ClassVar[int]
    TABLE_FIELD_NUMBER: _ClassVar[int]
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    SHARD_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    MOVE_TARGET_FIELD_NUMBER: _ClassVar[int]
    SEGMENTS_FIELD_NUMBER: _ClassVar[int]
    tenant: str
    table: str
    partition: int
    shard: str
    epoch: int
    move_target: str
    segments: _containers.RepeatedCompositeFieldContainer[Segment]
    def __init__(self, tenant: _Optional[str] = ..., table: _Optional[str] = ..., partition: _Optional[int] = ..., shard: _Optional[str] = ..., epoch: _Optional[int] = ..., move_target: _Optional[str] = ..., segments: _Optional[_Iterable[_Union[Segment, _Mapping]]] = ...) -> None: ...

class ListPlacementsResponse(_message.Message):
    __slots__ = ("shards", "pins", "placements")
    class PinsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    SHARDS_FIELD_NUMBER: _ClassVar[int]
    PINS_FIELD_NUMBER: _ClassVar[int]
    PLACEMENTS_FIELD_NUMBER: _ClassVar[int]
    shards: _containers.RepeatedScalarFieldContainer[str]
    pins: _containers.ScalarMap[str, str]
    placements: _containers.RepeatedCompositeFieldContainer[Placement]
    def __init__(self, shards: _Optional[_Iterable[str]] = ..., pins: _Optional[_Mapping[str, str]] = ..., placements: _Optional[_Iterable[_Union[Placement, _Mapping]]] = ...) -> None: ...

class MovePartitionRequest(_message.Message):
    __slots__ = ("tenant", "table", "partition", "target")
    TENANT_FIELD_NUMBER: _ClassVar[int]
    TABLE_FIELD_NUMBER: _ClassVar[int]
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    TARGET_FIELD_NUMBER: _ClassVar[int]
    tenant: str
    table: str
    partition: int
    target: str
    def __init__(self, tenant: _Optional[str] = ..., table: _Optional[str] = ..., partition: _Optional[int] = ..., target: _Optional[str] = ...) -> None: ...

class MoveInfo(_message.Message):
    __slots__ = ("id", "tenant", "table", "partition", "source", "target", "state", "start", "started_at_ms", "seconds", "error")
    ID_FIELD_NUMBER: _ClassVar[int]
    TENANT_FIELD_NUMBER: _ClassVar[int]
    TABLE_FIELD_NUMBER: _ClassVar[int]
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    TARGET_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    START_FIELD_NUMBER: _ClassVar[int]
    STARTED_AT_MS_FIELD_NUMBER: _ClassVar[int]
    SECONDS_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    id: str
    tenant: str
    table: str
    partition: int
    source: str
    target: str
    state: str
    start: int
    started_at_ms: int
    seconds: float
    error: str
    def __init__(self, id: _Optional[str] = ..., tenant: _Optional[str] = ..., table: _Optional[str] = ..., partition: _Optional[int] = ..., source: _Optional[str] = ..., target: _Optional[str] = ..., state: _Optional[str] = ..., start: _Optional[int] = ..., started_at_ms: _Optional[int] = ..., seconds: _Optional[float] = ..., error: _Optional[str] = ...) -> None: ...

class ListMovesRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListMovesResponse(_message.Message):
    __slots__ = ("moves",)
    MOVES_FIELD_NUMBER: _ClassVar[int]
    moves: _containers.RepeatedCompositeFieldContainer[MoveInfo]
    def __init__(self, moves: _Optional[_Iterable[_Union[MoveInfo, _Mapping]]] = ...) -> None: ...

class PinShardsRequest(_message.Message):
    __slots__ = ("tenant", "shards")
    TENANT_FIELD_NUMBER: _ClassVar[int]
    SHARDS_FIELD_NUMBER: _ClassVar[int]
    tenant: str
    shards: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, tenant: _Optional[str] = ..., shards: _Optional[_Iterable[str]] = ...) -> None: ...
