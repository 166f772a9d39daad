from kvstore.v1 import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class KeysRequest(_message.Message):
    __slots__ = ("keys", "writer")
    KEYS_FIELD_NUMBER: _ClassVar[int]
    WRITER_FIELD_NUMBER: _ClassVar[int]
    keys: _containers.RepeatedScalarFieldContainer[bytes]
    writer: str
    def __init__(self, keys: _Optional[_Iterable[bytes]] = ..., writer: _Optional[str] = ...) -> None: ...

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
    __slots__ = ("keys", "sizes", "checksums", "replicas", "writer")
    KEYS_FIELD_NUMBER: _ClassVar[int]
    SIZES_FIELD_NUMBER: _ClassVar[int]
    CHECKSUMS_FIELD_NUMBER: _ClassVar[int]
    REPLICAS_FIELD_NUMBER: _ClassVar[int]
    WRITER_FIELD_NUMBER: _ClassVar[int]
    keys: _containers.RepeatedScalarFieldContainer[bytes]
    sizes: _containers.RepeatedScalarFieldContainer[int]
    checksums: _containers.RepeatedScalarFieldContainer[int]
    replicas: int
    writer: str
    def __init__(self, keys: _Optional[_Iterable[bytes]] = ..., sizes: _Optional[_Iterable[int]] = ..., checksums: _Optional[_Iterable[int]] = ..., replicas: _Optional[int] = ..., writer: _Optional[str] = ...) -> None: ...

class PutStartItem(_message.Message):
    __slots__ = ("code", "message", "locations")
    CODE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    LOCATIONS_FIELD_NUMBER: _ClassVar[int]
    code: _common_pb2.Code
    message: str
    locations: _containers.RepeatedCompositeFieldContainer[_common_pb2.Location]
    def __init__(self, code: _Optional[_Union[_common_pb2.Code, str]] = ..., message: _Optional[str] = ..., locations: _Optional[_Iterable[_Union[_common_pb2.Location, _Mapping]]] = ...) -> None: ...

class PutStartResponse(_message.Message):
    __slots__ = ("error", "epoch", "items")
    ERROR_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    ITEMS_FIELD_NUMBER: _ClassVar[int]
    error: _common_pb2.Error
    epoch: int
    items: _containers.RepeatedCompositeFieldContainer[PutStartItem]
    def __init__(self, error: _Optional[_Union[_common_pb2.Error, _Mapping]] = ..., epoch: _Optional[int] = ..., items: _Optional[_Iterable[_Union[PutStartItem, _Mapping]]] = ...) -> None: ...

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
    __slots__ = ("keys", "lease_id", "lease_ttl", "holder")
    KEYS_FIELD_NUMBER: _ClassVar[int]
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    LEASE_TTL_FIELD_NUMBER: _ClassVar[int]
    HOLDER_FIELD_NUMBER: _ClassVar[int]
    keys: _containers.RepeatedScalarFieldContainer[bytes]
    lease_id: int
    lease_ttl: float
    holder: str
    def __init__(self, keys: _Optional[_Iterable[bytes]] = ..., lease_id: _Optional[int] = ..., lease_ttl: _Optional[float] = ..., holder: _Optional[str] = ...) -> None: ...

class ReadItem(_message.Message):
    __slots__ = ("code", "size", "checksum", "locations")
    CODE_FIELD_NUMBER: _ClassVar[int]
    SIZE_FIELD_NUMBER: _ClassVar[int]
    CHECKSUM_FIELD_NUMBER: _ClassVar[int]
    LOCATIONS_FIELD_NUMBER: _ClassVar[int]
    code: _common_pb2.Code
    size: int
    checksum: int
    locations: _containers.RepeatedCompositeFieldContainer[_common_pb2.Location]
    def __init__(self, code: _Optional[_Union[_common_pb2.Code, str]] = ..., size: _Optional[int] = ..., checksum: _Optional[int] = ..., locations: _Optional[_Iterable[_Union[_common_pb2.Location, _Mapping]]] = ...) -> None: ...

class GetReplicasResponse(_message.Message):
    __slots__ = ("error", "epoch", "lease_id", "ttl_remaining", "items")
    ERROR_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    TTL_REMAINING_FIELD_NUMBER: _ClassVar[int]
    ITEMS_FIELD_NUMBER: _ClassVar[int]
    error: _common_pb2.Error
    epoch: int
    lease_id: int
    ttl_remaining: float
    items: _containers.RepeatedCompositeFieldContainer[ReadItem]
    def __init__(self, error: _Optional[_Union[_common_pb2.Error, _Mapping]] = ..., epoch: _Optional[int] = ..., lease_id: _Optional[int] = ..., ttl_remaining: _Optional[float] = ..., items: _Optional[_Iterable[_Union[ReadItem, _Mapping]]] = ...) -> None: ...

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
    __slots__ = ("error", "epoch", "leader", "nodes", "objects_complete", "objects_pending", "bytes_complete", "bytes_pending", "active_leases", "counters_json")
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
    def __init__(self, error: _Optional[_Union[_common_pb2.Error, _Mapping]] = ..., epoch: _Optional[int] = ..., leader: _Optional[str] = ..., nodes: _Optional[_Iterable[_Union[NodeStatus, _Mapping]]] = ..., objects_complete: _Optional[int] = ..., objects_pending: _Optional[int] = ..., bytes_complete: _Optional[int] = ..., bytes_pending: _Optional[int] = ..., active_leases: _Optional[int] = ..., counters_json: _Optional[str] = ...) -> None: ...
