from kvstore.v1 import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class KeysRequest(_message.Message):
    __slots__ = ("keys", "writer", "unsettled")
    KEYS_FIELD_NUMBER: _ClassVar[int]
    WRITER_FIELD_NUMBER: _ClassVar[int]
    UNSETTLED_FIELD_NUMBER: _ClassVar[int]
    keys: _containers.RepeatedScalarFieldContainer[bytes]
    writer: str
    unsettled: bool
    def __init__(self, keys: _Optional[_Iterable[bytes]] = ..., writer: _Optional[str] = ..., unsettled: _Optional[bool] = ...) -> None: ...

class CodesResponse(_message.Message):
    __slots__ = ("error", "epoch", "codes", "messages")
    ERROR_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    CODES_FIELD_NUMBER: _ClassVar[int]
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    error: _common_pb2.Error
    epoch: int
    codes: _containers.RepeatedScalarFieldContainer[_common_pb2.Code]
    messages: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, error: _Optional[_Union[_common_pb2.Error, _Mapping]] = ..., epoch: _Optional[int] = ..., codes: _Optional[_Iterable[_Union[_common_pb2.Code, str]]] = ..., messages: _Optional[_Iterable[str]] = ...) -> None: ...

class PutStartRequest(_message.Message):
    __slots__ = ("keys", "sizes", "checksums", "replicas", "writer", "ahead", "record_room", "columns_version")
    KEYS_FIELD_NUMBER: _ClassVar[int]
    SIZES_FIELD_NUMBER: _ClassVar[int]
    CHECKSUMS_FIELD_NUMBER: _ClassVar[int]
    REPLICAS_FIELD_NUMBER: _ClassVar[int]
    WRITER_FIELD_NUMBER: _ClassVar[int]
    AHEAD_FIELD_NUMBER: _ClassVar[int]
    RECORD_ROOM_FIELD_NUMBER: _ClassVar[int]
    COLUMNS_VERSION_FIELD_NUMBER: _ClassVar[int]
    keys: _containers.RepeatedScalarFieldContainer[bytes]
    sizes: _containers.RepeatedScalarFieldContainer[int]
    checksums: _containers.RepeatedScalarFieldContainer[int]
    replicas: int
    writer: str
    ahead: bool
    record_room: int
    columns_version: int
    def __init__(self, keys: _Optional[_Iterable[bytes]] = ..., sizes: _Optional[_Iterable[int]] = ..., checksums: _Optional[_Iterable[int]] = ..., replicas: _Optional[int] = ..., writer: _Optional[str] = ..., ahead: _Optional[bool] = ..., record_room: _Optional[int] = ..., columns_version: _Optional[int] = ...) -> None: ...

class PutStartItem(_message.Message):
    __slots__ = ("code", "message", "locations", "placement")
    CODE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    LOCATIONS_FIELD_NUMBER: _ClassVar[int]
    PLACEMENT_FIELD_NUMBER: _ClassVar[int]
    code: _common_pb2.Code
    message: str
    locations: _containers.RepeatedCompositeFieldContainer[_common_pb2.Location]
    placement: int
    def __init__(self, code: _Optional[_Union[_common_pb2.Code, str]] = ..., message: _Optional[str] = ..., locations: _Optional[_Iterable[_Union[_common_pb2.Location, _Mapping]]] = ..., placement: _Optional[int] = ...) -> None: ...

class PutStartResponse(_message.Message):
    __slots__ = ("error", "epoch", "items", "put_timeout", "record_room", "columns")
    ERROR_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    ITEMS_FIELD_NUMBER: _ClassVar[int]
    PUT_TIMEOUT_FIELD_NUMBER: _ClassVar[int]
    RECORD_ROOM_FIELD_NUMBER: _ClassVar[int]
    COLUMNS_FIELD_NUMBER: _ClassVar[int]
    error: _common_pb2.Error
    epoch: int
    items: _containers.RepeatedCompositeFieldContainer[PutStartItem]
    put_timeout: float
    record_room: int
    columns: ReadColumns
    def __init__(self, error: _Optional[_Union[_common_pb2.Error, _Mapping]] = ..., epoch: _Optional[int] = ..., items: _Optional[_Iterable[_Union[PutStartItem, _Mapping]]] = ..., put_timeout: _Optional[float] = ..., record_room: _Optional[int] = ..., columns: _Optional[_Union[ReadColumns, _Mapping]] = ...) -> None: ...

class PutCommitRequest(_message.Message):
    __slots__ = ("placeholders", "keys", "sizes", "checksums", "writer", "records")
    PLACEHOLDERS_FIELD_NUMBER: _ClassVar[int]
    KEYS_FIELD_NUMBER: _ClassVar[int]
    SIZES_FIELD_NUMBER: _ClassVar[int]
    CHECKSUMS_FIELD_NUMBER: _ClassVar[int]
    WRITER_FIELD_NUMBER: _ClassVar[int]
    RECORDS_FIELD_NUMBER: _ClassVar[int]
    placeholders: _containers.RepeatedScalarFieldContainer[bytes]
    keys: _containers.RepeatedScalarFieldContainer[bytes]
    sizes: _containers.RepeatedScalarFieldContainer[int]
    checksums: _containers.RepeatedScalarFieldContainer[int]
    writer: str
    records: bool
    def __init__(self, placeholders: _Optional[_Iterable[bytes]] = ..., keys: _Optional[_Iterable[bytes]] = ..., sizes: _Optional[_Iterable[int]] = ..., checksums: _Optional[_Iterable[int]] = ..., writer: _Optional[str] = ..., records: _Optional[bool] = ...) -> None: ...

class LookupRequest(_message.Message):
    __slots__ = ("keys", "lease_ttl", "holder")
    KEYS_FIELD_NUMBER: _ClassVar[int]
    LEASE_TTL_FIELD_NUMBER: _ClassVar[int]
    HOLDER_FIELD_NUMBER: _ClassVar[int]
    keys: _containers.RepeatedScalarFieldContainer[bytes]
    lease_ttl: float
    holder: str
    def __init__(self, keys: _Optional[_Iterable[bytes]] = ..., lease_ttl: _Optional[float] = ..., holder: _Optional[str] = ...) -> None: ...

class LookupResponse(_message.Message):
    __slots__ = ("error", "epoch", "count", "lease_id", "ttl_remaining")
    ERROR_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    TTL_REMAINING_FIELD_NUMBER: _ClassVar[int]
    error: _common_pb2.Error
    epoch: int
    count: int
    lease_id: int
    ttl_remaining: float
    def __init__(self, error: _Optional[_Union[_common_pb2.Error, _Mapping]] = ..., epoch: _Optional[int] = ..., count: _Optional[int] = ..., lease_id: _Optional[int] = ..., ttl_remaining: _Optional[float] = ...) -> None: ...

class GetReplicasRequest(_message.Message):
    __slots__ = ("keys", "lease_id", "lease_ttl", "holder", "unpinned", "columns", "columns_version")
    KEYS_FIELD_NUMBER: _ClassVar[int]
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    LEASE_TTL_FIELD_NUMBER: _ClassVar[int]
    HOLDER_FIELD_NUMBER: _ClassVar[int]
    UNPINNED_FIELD_NUMBER: _ClassVar[int]
    COLUMNS_FIELD_NUMBER: _ClassVar[int]
    COLUMNS_VERSION_FIELD_NUMBER: _ClassVar[int]
    keys: _containers.RepeatedScalarFieldContainer[bytes]
    lease_id: int
    lease_ttl: float
    holder: str
    unpinned: bool
    columns: bool
    columns_version: int
    def __init__(self, keys: _Optional[_Iterable[bytes]] = ..., lease_id: _Optional[int] = ..., lease_ttl: _Optional[float] = ..., holder: _Optional[str] = ..., unpinned: _Optional[bool] = ..., columns: _Optional[bool] = ..., columns_version: _Optional[int] = ...) -> None: ...

class ReadColumns(_message.Message):
    __slots__ = ("version", "codes", "sizes", "checksums", "placements", "location_counts", "location_ranges", "location_addrs", "location_sizes", "ranges", "keys", "locations", "packed")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    CODES_FIELD_NUMBER: _ClassVar[int]
    SIZES_FIELD_NUMBER: _ClassVar[int]
    CHECKSUMS_FIELD_NUMBER: _ClassVar[int]
    PLACEMENTS_FIELD_NUMBER: _ClassVar[int]
    LOCATION_COUNTS_FIELD_NUMBER: _ClassVar[int]
    LOCATION_RANGES_FIELD_NUMBER: _ClassVar[int]
    LOCATION_ADDRS_FIELD_NUMBER: _ClassVar[int]
    LOCATION_SIZES_FIELD_NUMBER: _ClassVar[int]
    RANGES_FIELD_NUMBER: _ClassVar[int]
    KEYS_FIELD_NUMBER: _ClassVar[int]
    LOCATIONS_FIELD_NUMBER: _ClassVar[int]
    PACKED_FIELD_NUMBER: _ClassVar[int]
    version: int
    codes: _containers.RepeatedScalarFieldContainer[int]
    sizes: _containers.RepeatedScalarFieldContainer[int]
    checksums: _containers.RepeatedScalarFieldContainer[int]
    placements: _containers.RepeatedScalarFieldContainer[int]
    location_counts: _containers.RepeatedScalarFieldContainer[int]
    location_ranges: _containers.RepeatedScalarFieldContainer[int]
    location_addrs: _containers.RepeatedScalarFieldContainer[int]
    location_sizes: _containers.RepeatedScalarFieldContainer[int]
    ranges: _containers.RepeatedCompositeFieldContainer[_common_pb2.Location]
    keys: int
    locations: int
    packed: bytes
    def __init__(self, version: _Optional[int] = ..., codes: _Optional[_Iterable[int]] = ..., sizes: _Optional[_Iterable[int]] = ..., checksums: _Optional[_Iterable[int]] = ..., placements: _Optional[_Iterable[int]] = ..., location_counts: _Optional[_Iterable[int]] = ..., location_ranges: _Optional[_Iterable[int]] = ..., location_addrs: _Optional[_Iterable[int]] = ..., location_sizes: _Optional[_Iterable[int]] = ..., ranges: _Optional[_Iterable[_Union[_common_pb2.Location, _Mapping]]] = ..., keys: _Optional[int] = ..., locations: _Optional[int] = ..., packed: _Optional[bytes] = ...) -> None: ...

class ReadItem(_message.Message):
    __slots__ = ("code", "size", "checksum", "locations", "placement")
    CODE_FIELD_NUMBER: _ClassVar[int]
    SIZE_FIELD_NUMBER: _ClassVar[int]
    CHECKSUM_FIELD_NUMBER: _ClassVar[int]
    LOCATIONS_FIELD_NUMBER: _ClassVar[int]
    PLACEMENT_FIELD_NUMBER: _ClassVar[int]
    code: _common_pb2.Code
    size: int
    checksum: int
    locations: _containers.RepeatedCompositeFieldContainer[_common_pb2.Location]
    placement: int
    def __init__(self, code: _Optional[_Union[_common_pb2.Code, str]] = ..., size: _Optional[int] = ..., checksum: _Optional[int] = ..., locations: _Optional[_Iterable[_Union[_common_pb2.Location, _Mapping]]] = ..., placement: _Optional[int] = ...) -> None: ...

class GetReplicasResponse(_message.Message):
    __slots__ = ("error", "epoch", "lease_id", "ttl_remaining", "items", "columns")
    ERROR_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    TTL_REMAINING_FIELD_NUMBER: _ClassVar[int]
    ITEMS_FIELD_NUMBER: _ClassVar[int]
    COLUMNS_FIELD_NUMBER: _ClassVar[int]
    error: _common_pb2.Error
    epoch: int
    lease_id: int
    ttl_remaining: float
    items: _containers.RepeatedCompositeFieldContainer[ReadItem]
    columns: ReadColumns
    def __init__(self, error: _Optional[_Union[_common_pb2.Error, _Mapping]] = ..., epoch: _Optional[int] = ..., lease_id: _Optional[int] = ..., ttl_remaining: _Optional[float] = ..., items: _Optional[_Iterable[_Union[ReadItem, _Mapping]]] = ..., columns: _Optional[_Union[ReadColumns, _Mapping]] = ...) -> None: ...

class RenewLeaseRequest(_message.Message):
    __slots__ = ("lease_id", "ttl")
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    TTL_FIELD_NUMBER: _ClassVar[int]
    lease_id: int
    ttl: float
    def __init__(self, lease_id: _Optional[int] = ..., ttl: _Optional[float] = ...) -> None: ...

class ReleaseLeaseRequest(_message.Message):
    __slots__ = ("lease_id", "keep_first_n")
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    KEEP_FIRST_N_FIELD_NUMBER: _ClassVar[int]
    lease_id: int
    keep_first_n: int
    def __init__(self, lease_id: _Optional[int] = ..., keep_first_n: _Optional[int] = ...) -> None: ...

class LeaseResponse(_message.Message):
    __slots__ = ("error", "epoch", "ttl_remaining")
    ERROR_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    TTL_REMAINING_FIELD_NUMBER: _ClassVar[int]
    error: _common_pb2.Error
    epoch: int
    ttl_remaining: float
    def __init__(self, error: _Optional[_Union[_common_pb2.Error, _Mapping]] = ..., epoch: _Optional[int] = ..., ttl_remaining: _Optional[float] = ...) -> None: ...

class ExistsResponse(_message.Message):
    __slots__ = ("error", "epoch", "exists")
    ERROR_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    EXISTS_FIELD_NUMBER: _ClassVar[int]
    error: _common_pb2.Error
    epoch: int
    exists: _containers.RepeatedScalarFieldContainer[bool]
    def __init__(self, error: _Optional[_Union[_common_pb2.Error, _Mapping]] = ..., epoch: _Optional[int] = ..., exists: _Optional[_Iterable[bool]] = ...) -> None: ...

class RemoveRequest(_message.Message):
    __slots__ = ("keys", "force")
    KEYS_FIELD_NUMBER: _ClassVar[int]
    FORCE_FIELD_NUMBER: _ClassVar[int]
    keys: _containers.RepeatedScalarFieldContainer[bytes]
    force: bool
    def __init__(self, keys: _Optional[_Iterable[bytes]] = ..., force: _Optional[bool] = ...) -> None: ...

class MountSegmentRequest(_message.Message):
    __slots__ = ("node_id", "segment", "base_addr", "size", "tier")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    SEGMENT_FIELD_NUMBER: _ClassVar[int]
    BASE_ADDR_FIELD_NUMBER: _ClassVar[int]
    SIZE_FIELD_NUMBER: _ClassVar[int]
    TIER_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    segment: str
    base_addr: int
    size: int
    tier: str
    def __init__(self, node_id: _Optional[str] = ..., segment: _Optional[str] = ..., base_addr: _Optional[int] = ..., size: _Optional[int] = ..., tier: _Optional[str] = ...) -> None: ...

class UnmountSegmentRequest(_message.Message):
    __slots__ = ("node_id",)
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    def __init__(self, node_id: _Optional[str] = ...) -> None: ...

class MountSegmentResponse(_message.Message):
    __slots__ = ("error", "epoch")
    ERROR_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    error: _common_pb2.Error
    epoch: int
    def __init__(self, error: _Optional[_Union[_common_pb2.Error, _Mapping]] = ..., epoch: _Optional[int] = ...) -> None: ...

class AuthenticateRequest(_message.Message):
    __slots__ = ("token",)
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    token: str
    def __init__(self, token: _Optional[str] = ...) -> None: ...

class AuthenticateResponse(_message.Message):
    __slots__ = ("error", "epoch", "name", "role", "tenant")
    ERROR_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    ROLE_FIELD_NUMBER: _ClassVar[int]
    TENANT_FIELD_NUMBER: _ClassVar[int]
    error: _common_pb2.Error
    epoch: int
    name: str
    role: str
    tenant: str
    def __init__(self, error: _Optional[_Union[_common_pb2.Error, _Mapping]] = ..., epoch: _Optional[int] = ..., name: _Optional[str] = ..., role: _Optional[str] = ..., tenant: _Optional[str] = ...) -> None: ...

class ClusterStatusRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class NodeStatus(_message.Message):
    __slots__ = ("node_id", "segment", "tier", "capacity", "used", "pinned", "objects")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    SEGMENT_FIELD_NUMBER: _ClassVar[int]
    TIER_FIELD_NUMBER: _ClassVar[int]
    CAPACITY_FIELD_NUMBER: _ClassVar[int]
    USED_FIELD_NUMBER: _ClassVar[int]
    PINNED_FIELD_NUMBER: _ClassVar[int]
    OBJECTS_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    segment: str
    tier: str
    capacity: int
    used: int
    pinned: int
    objects: int
    def __init__(self, node_id: _Optional[str] = ..., segment: _Optional[str] = ..., tier: _Optional[str] = ..., capacity: _Optional[int] = ..., used: _Optional[int] = ..., pinned: _Optional[int] = ..., objects: _Optional[int] = ...) -> None: ...

class ClusterStatusResponse(_message.Message):
    __slots__ = ("error", "epoch", "leader", "nodes", "objects_complete", "objects_pending", "bytes_complete", "bytes_pending", "active_leases", "counters_json", "recent_lookup_keys", "recent_hit_keys", "recent_seconds", "draining", "leader_for_seconds", "shard", "shards")
    ERROR_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    LEADER_FIELD_NUMBER: _ClassVar[int]
    NODES_FIELD_NUMBER: _ClassVar[int]
    OBJECTS_COMPLETE_FIELD_NUMBER: _ClassVar[int]
    OBJECTS_PENDING_FIELD_NUMBER: _ClassVar[int]
    BYTES_COMPLETE_FIELD_NUMBER: _ClassVar[int]
    BYTES_PENDING_FIELD_NUMBER: _ClassVar[int]
    ACTIVE_LEASES_FIELD_NUMBER: _ClassVar[int]
    COUNTERS_JSON_FIELD_NUMBER: _ClassVar[int]
    RECENT_LOOKUP_KEYS_FIELD_NUMBER: _ClassVar[int]
    RECENT_HIT_KEYS_FIELD_NUMBER: _ClassVar[int]
    RECENT_SECONDS_FIELD_NUMBER: _ClassVar[int]
    DRAINING_FIELD_NUMBER: _ClassVar[int]
    LEADER_FOR_SECONDS_FIELD_NUMBER: _ClassVar[int]
    SHARD_FIELD_NUMBER: _ClassVar[int]
    SHARDS_FIELD_NUMBER: _ClassVar[int]
    error: _common_pb2.Error
    epoch: int
    leader: str
    nodes: _containers.RepeatedCompositeFieldContainer[NodeStatus]
    objects_complete: int
    objects_pending: int
    bytes_complete: int
    bytes_pending: int
    active_leases: int
    counters_json: str
    recent_lookup_keys: int
    recent_hit_keys: int
    recent_seconds: float
    draining: _containers.RepeatedScalarFieldContainer[str]
    leader_for_seconds: float
    shard: int
    shards: int
    def __init__(self, error: _Optional[_Union[_common_pb2.Error, _Mapping]] = ..., epoch: _Optional[int] = ..., leader: _Optional[str] = ..., nodes: _Optional[_Iterable[_Union[NodeStatus, _Mapping]]] = ..., objects_complete: _Optional[int] = ..., objects_pending: _Optional[int] = ..., bytes_complete: _Optional[int] = ..., bytes_pending: _Optional[int] = ..., active_leases: _Optional[int] = ..., counters_json: _Optional[str] = ..., recent_lookup_keys: _Optional[int] = ..., recent_hit_keys: _Optional[int] = ..., recent_seconds: _Optional[float] = ..., draining: _Optional[_Iterable[str]] = ..., leader_for_seconds: _Optional[float] = ..., shard: _Optional[int] = ..., shards: _Optional[int] = ...) -> None: ...

class NodeListRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class NodeInfo(_message.Message):
    __slots__ = ("node_id", "state", "segments", "objects", "gone_seconds", "objects_lost")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    SEGMENTS_FIELD_NUMBER: _ClassVar[int]
    OBJECTS_FIELD_NUMBER: _ClassVar[int]
    GONE_SECONDS_FIELD_NUMBER: _ClassVar[int]
    OBJECTS_LOST_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    state: str
    segments: _containers.RepeatedCompositeFieldContainer[NodeStatus]
    objects: int
    gone_seconds: float
    objects_lost: int
    def __init__(self, node_id: _Optional[str] = ..., state: _Optional[str] = ..., segments: _Optional[_Iterable[_Union[NodeStatus, _Mapping]]] = ..., objects: _Optional[int] = ..., gone_seconds: _Optional[float] = ..., objects_lost: _Optional[int] = ...) -> None: ...

class NodeListResponse(_message.Message):
    __slots__ = ("error", "epoch", "nodes")
    ERROR_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    NODES_FIELD_NUMBER: _ClassVar[int]
    error: _common_pb2.Error
    epoch: int
    nodes: _containers.RepeatedCompositeFieldContainer[NodeInfo]
    def __init__(self, error: _Optional[_Union[_common_pb2.Error, _Mapping]] = ..., epoch: _Optional[int] = ..., nodes: _Optional[_Iterable[_Union[NodeInfo, _Mapping]]] = ...) -> None: ...

class ObjectInfo(_message.Message):
    __slots__ = ("key", "state", "size", "checksum", "replicas", "pins", "idle_seconds", "age_seconds", "writer")
    KEY_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    SIZE_FIELD_NUMBER: _ClassVar[int]
    CHECKSUM_FIELD_NUMBER: _ClassVar[int]
    REPLICAS_FIELD_NUMBER: _ClassVar[int]
    PINS_FIELD_NUMBER: _ClassVar[int]
    IDLE_SECONDS_FIELD_NUMBER: _ClassVar[int]
    AGE_SECONDS_FIELD_NUMBER: _ClassVar[int]
    WRITER_FIELD_NUMBER: _ClassVar[int]
    key: bytes
    state: str
    size: int
    checksum: int
    replicas: _containers.RepeatedCompositeFieldContainer[_common_pb2.Location]
    pins: int
    idle_seconds: float
    age_seconds: float
    writer: str
    def __init__(self, key: _Optional[bytes] = ..., state: _Optional[str] = ..., size: _Optional[int] = ..., checksum: _Optional[int] = ..., replicas: _Optional[_Iterable[_Union[_common_pb2.Location, _Mapping]]] = ..., pins: _Optional[int] = ..., idle_seconds: _Optional[float] = ..., age_seconds: _Optional[float] = ..., writer: _Optional[str] = ...) -> None: ...

class ListKeysRequest(_message.Message):
    __slots__ = ("prefix", "limit")
    PREFIX_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    prefix: bytes
    limit: int
    def __init__(self, prefix: _Optional[bytes] = ..., limit: _Optional[int] = ...) -> None: ...

class ListKeysResponse(_message.Message):
    __slots__ = ("error", "epoch", "objects", "truncated")
    ERROR_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    OBJECTS_FIELD_NUMBER: _ClassVar[int]
    TRUNCATED_FIELD_NUMBER: _ClassVar[int]
    error: _common_pb2.Error
    epoch: int
    objects: _containers.RepeatedCompositeFieldContainer[ObjectInfo]
    truncated: bool
    def __init__(self, error: _Optional[_Union[_common_pb2.Error, _Mapping]] = ..., epoch: _Optional[int] = ..., objects: _Optional[_Iterable[_Union[ObjectInfo, _Mapping]]] = ..., truncated: _Optional[bool] = ...) -> None: ...

class InspectItem(_message.Message):
    __slots__ = ("code", "object")
    CODE_FIELD_NUMBER: _ClassVar[int]
    OBJECT_FIELD_NUMBER: _ClassVar[int]
    code: _common_pb2.Code
    object: ObjectInfo
    def __init__(self, code: _Optional[_Union[_common_pb2.Code, str]] = ..., object: _Optional[_Union[ObjectInfo, _Mapping]] = ...) -> None: ...

class InspectResponse(_message.Message):
    __slots__ = ("error", "epoch", "items")
    ERROR_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    ITEMS_FIELD_NUMBER: _ClassVar[int]
    error: _common_pb2.Error
    epoch: int
    items: _containers.RepeatedCompositeFieldContainer[InspectItem]
    def __init__(self, error: _Optional[_Union[_common_pb2.Error, _Mapping]] = ..., epoch: _Optional[int] = ..., items: _Optional[_Iterable[_Union[InspectItem, _Mapping]]] = ...) -> None: ...

class EvictionStatsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class TierEvictions(_message.Message):
    __slots__ = ("tier", "evicted", "evicted_bytes", "recent_evicted", "recent_evicted_bytes", "demoted", "demoted_bytes", "recent_demoted", "recent_demoted_bytes")
    TIER_FIELD_NUMBER: _ClassVar[int]
    EVICTED_FIELD_NUMBER: _ClassVar[int]
    EVICTED_BYTES_FIELD_NUMBER: _ClassVar[int]
    RECENT_EVICTED_FIELD_NUMBER: _ClassVar[int]
    RECENT_EVICTED_BYTES_FIELD_NUMBER: _ClassVar[int]
    DEMOTED_FIELD_NUMBER: _ClassVar[int]
    DEMOTED_BYTES_FIELD_NUMBER: _ClassVar[int]
    RECENT_DEMOTED_FIELD_NUMBER: _ClassVar[int]
    RECENT_DEMOTED_BYTES_FIELD_NUMBER: _ClassVar[int]
    tier: str
    evicted: int
    evicted_bytes: int
    recent_evicted: int
    recent_evicted_bytes: int
    demoted: int
    demoted_bytes: int
    recent_demoted: int
    recent_demoted_bytes: int
    def __init__(self, tier: _Optional[str] = ..., evicted: _Optional[int] = ..., evicted_bytes: _Optional[int] = ..., recent_evicted: _Optional[int] = ..., recent_evicted_bytes: _Optional[int] = ..., demoted: _Optional[int] = ..., demoted_bytes: _Optional[int] = ..., recent_demoted: _Optional[int] = ..., recent_demoted_bytes: _Optional[int] = ...) -> None: ...

class EvictionStatsResponse(_message.Message):
    __slots__ = ("error", "epoch", "tiers", "evict_high", "evict_low", "pool_capacity", "pool_used", "pool_pinned", "pool_pending", "blocked", "blocked_bytes", "blocked_pinned_bytes", "held_seconds", "recent_seconds")
    ERROR_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    TIERS_FIELD_NUMBER: _ClassVar[int]
    EVICT_HIGH_FIELD_NUMBER: _ClassVar[int]
    EVICT_LOW_FIELD_NUMBER: _ClassVar[int]
    POOL_CAPACITY_FIELD_NUMBER: _ClassVar[int]
    POOL_USED_FIELD_NUMBER: _ClassVar[int]
    POOL_PINNED_FIELD_NUMBER: _ClassVar[int]
    POOL_PENDING_FIELD_NUMBER: _ClassVar[int]
    BLOCKED_FIELD_NUMBER: _ClassVar[int]
    BLOCKED_BYTES_FIELD_NUMBER: _ClassVar[int]
    BLOCKED_PINNED_BYTES_FIELD_NUMBER: _ClassVar[int]
    HELD_SECONDS_FIELD_NUMBER: _ClassVar[int]
    RECENT_SECONDS_FIELD_NUMBER: _ClassVar[int]
    error: _common_pb2.Error
    epoch: int
    tiers: _containers.RepeatedCompositeFieldContainer[TierEvictions]
    evict_high: float
    evict_low: float
    pool_capacity: int
    pool_used: int
    pool_pinned: int
    pool_pending: int
    blocked: int
    blocked_bytes: int
    blocked_pinned_bytes: int
    held_seconds: float
    recent_seconds: float
    def __init__(self, error: _Optional[_Union[_common_pb2.Error, _Mapping]] = ..., epoch: _Optional[int] = ..., tiers: _Optional[_Iterable[_Union[TierEvictions, _Mapping]]] = ..., evict_high: _Optional[float] = ..., evict_low: _Optional[float] = ..., pool_capacity: _Optional[int] = ..., pool_used: _Optional[int] = ..., pool_pinned: _Optional[int] = ..., pool_pending: _Optional[int] = ..., blocked: _Optional[int] = ..., blocked_bytes: _Optional[int] = ..., blocked_pinned_bytes: _Optional[int] = ..., held_seconds: _Optional[float] = ..., recent_seconds: _Optional[float] = ...) -> None: ...

class EvictRequest(_message.Message):
    __slots__ = ("ratio", "max_objects")
    RATIO_FIELD_NUMBER: _ClassVar[int]
    MAX_OBJECTS_FIELD_NUMBER: _ClassVar[int]
    ratio: float
    max_objects: int
    def __init__(self, ratio: _Optional[float] = ..., max_objects: _Optional[int] = ...) -> None: ...

class EvictResponse(_message.Message):
    __slots__ = ("error", "epoch", "evicted", "evicted_bytes", "used", "capacity", "reached", "held", "pinned")
    ERROR_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    EVICTED_FIELD_NUMBER: _ClassVar[int]
    EVICTED_BYTES_FIELD_NUMBER: _ClassVar[int]
    USED_FIELD_NUMBER: _ClassVar[int]
    CAPACITY_FIELD_NUMBER: _ClassVar[int]
    REACHED_FIELD_NUMBER: _ClassVar[int]
    HELD_FIELD_NUMBER: _ClassVar[int]
    PINNED_FIELD_NUMBER: _ClassVar[int]
    error: _common_pb2.Error
    epoch: int
    evicted: int
    evicted_bytes: int
    used: int
    capacity: int
    reached: bool
    held: bool
    pinned: int
    def __init__(self, error: _Optional[_Union[_common_pb2.Error, _Mapping]] = ..., epoch: _Optional[int] = ..., evicted: _Optional[int] = ..., evicted_bytes: _Optional[int] = ..., used: _Optional[int] = ..., capacity: _Optional[int] = ..., reached: _Optional[bool] = ..., held: _Optional[bool] = ..., pinned: _Optional[int] = ...) -> None: ...

class SetDrainingRequest(_message.Message):
    __slots__ = ("node_id", "draining")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    DRAINING_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    draining: bool
    def __init__(self, node_id: _Optional[str] = ..., draining: _Optional[bool] = ...) -> None: ...

class SetDrainingResponse(_message.Message):
    __slots__ = ("error", "epoch", "draining")
    ERROR_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    DRAINING_FIELD_NUMBER: _ClassVar[int]
    error: _common_pb2.Error
    epoch: int
    draining: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, error: _Optional[_Union[_common_pb2.Error, _Mapping]] = ..., epoch: _Optional[int] = ..., draining: _Optional[_Iterable[str]] = ...) -> None: ...

class DrainRequest(_message.Message):
    __slots__ = ("node_id", "max_objects")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    MAX_OBJECTS_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    max_objects: int
    def __init__(self, node_id: _Optional[str] = ..., max_objects: _Optional[int] = ...) -> None: ...

class DrainResponse(_message.Message):
    __slots__ = ("error", "epoch", "dropped", "dropped_bytes", "sole_keys", "sole_sizes", "remaining", "remaining_pinned", "remaining_pending")
    ERROR_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    DROPPED_FIELD_NUMBER: _ClassVar[int]
    DROPPED_BYTES_FIELD_NUMBER: _ClassVar[int]
    SOLE_KEYS_FIELD_NUMBER: _ClassVar[int]
    SOLE_SIZES_FIELD_NUMBER: _ClassVar[int]
    REMAINING_FIELD_NUMBER: _ClassVar[int]
    REMAINING_PINNED_FIELD_NUMBER: _ClassVar[int]
    REMAINING_PENDING_FIELD_NUMBER: _ClassVar[int]
    error: _common_pb2.Error
    epoch: int
    dropped: int
    dropped_bytes: int
    sole_keys: _containers.RepeatedScalarFieldContainer[bytes]
    sole_sizes: _containers.RepeatedScalarFieldContainer[int]
    remaining: int
    remaining_pinned: int
    remaining_pending: int
    def __init__(self, error: _Optional[_Union[_common_pb2.Error, _Mapping]] = ..., epoch: _Optional[int] = ..., dropped: _Optional[int] = ..., dropped_bytes: _Optional[int] = ..., sole_keys: _Optional[_Iterable[bytes]] = ..., sole_sizes: _Optional[_Iterable[int]] = ..., remaining: _Optional[int] = ..., remaining_pinned: _Optional[int] = ..., remaining_pending: _Optional[int] = ...) -> None: ...

class GetConfigRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ConfigSetting(_message.Message):
    __slots__ = ("name", "value")
    NAME_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    name: str
    value: float
    def __init__(self, name: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...

class GetConfigResponse(_message.Message):
    __slots__ = ("error", "epoch", "settings")
    ERROR_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    SETTINGS_FIELD_NUMBER: _ClassVar[int]
    error: _common_pb2.Error
    epoch: int
    settings: _containers.RepeatedCompositeFieldContainer[ConfigSetting]
    def __init__(self, error: _Optional[_Union[_common_pb2.Error, _Mapping]] = ..., epoch: _Optional[int] = ..., settings: _Optional[_Iterable[_Union[ConfigSetting, _Mapping]]] = ...) -> None: ...

class WhoLeadsRequest(_message.Message):
    __slots__ = ("shard",)
    SHARD_FIELD_NUMBER: _ClassVar[int]
    shard: int
    def __init__(self, shard: _Optional[int] = ...) -> None: ...

class WhoLeadsResponse(_message.Message):
    __slots__ = ("error", "epoch", "is_leader", "master_id", "address", "fast", "tls", "shard", "shards")
    ERROR_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    IS_LEADER_FIELD_NUMBER: _ClassVar[int]
    MASTER_ID_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    FAST_FIELD_NUMBER: _ClassVar[int]
    TLS_FIELD_NUMBER: _ClassVar[int]
    SHARD_FIELD_NUMBER: _ClassVar[int]
    SHARDS_FIELD_NUMBER: _ClassVar[int]
    error: _common_pb2.Error
    epoch: int
    is_leader: bool
    master_id: str
    address: str
    fast: str
    tls: bool
    shard: int
    shards: int
    def __init__(self, error: _Optional[_Union[_common_pb2.Error, _Mapping]] = ..., epoch: _Optional[int] = ..., is_leader: _Optional[bool] = ..., master_id: _Optional[str] = ..., address: _Optional[str] = ..., fast: _Optional[str] = ..., tls: _Optional[bool] = ..., shard: _Optional[int] = ..., shards: _Optional[int] = ...) -> None: ...

class SetConfigRequest(_message.Message):
    __slots__ = ("settings", "unset")
    SETTINGS_FIELD_NUMBER: _ClassVar[int]
    UNSET_FIELD_NUMBER: _ClassVar[int]
    settings: _containers.RepeatedCompositeFieldContainer[ConfigSetting]
    unset: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, settings: _Optional[_Iterable[_Union[ConfigSetting, _Mapping]]] = ..., unset: _Optional[_Iterable[str]] = ...) -> None: ...

class SetConfigResponse(_message.Message):
    __slots__ = ("error", "epoch", "settings")
    ERROR_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    SETTINGS_FIELD_NUMBER: _ClassVar[int]
    error: _common_pb2.Error
    epoch: int
    settings: _containers.RepeatedCompositeFieldContainer[ConfigSetting]
    def __init__(self, error: _Optional[_Union[_common_pb2.Error, _Mapping]] = ..., epoch: _Optional[int] = ..., settings: _Optional[_Iterable[_Union[ConfigSetting, _Mapping]]] = ...) -> None: ...
