from kvstore.v1 import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class MoveItem(_message.Message):
    __slots__ = ("kind", "key", "size", "checksum", "dram_offset", "ssd_offset")
    KIND_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    SIZE_FIELD_NUMBER: _ClassVar[int]
    CHECKSUM_FIELD_NUMBER: _ClassVar[int]
    DRAM_OFFSET_FIELD_NUMBER: _ClassVar[int]
    SSD_OFFSET_FIELD_NUMBER: _ClassVar[int]
    kind: str
    key: bytes
    size: int
    checksum: int
    dram_offset: int
    ssd_offset: int
    def __init__(self, kind: _Optional[str] = ..., key: _Optional[bytes] = ..., size: _Optional[int] = ..., checksum: _Optional[int] = ..., dram_offset: _Optional[int] = ..., ssd_offset: _Optional[int] = ...) -> None: ...

class MoveRequest(_message.Message):
    __slots__ = ("epoch", "items", "shard")
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    ITEMS_FIELD_NUMBER: _ClassVar[int]
    SHARD_FIELD_NUMBER: _ClassVar[int]
    epoch: int
    items: _containers.RepeatedCompositeFieldContainer[MoveItem]
    shard: int
    def __init__(self, epoch: _Optional[int] = ..., items: _Optional[_Iterable[_Union[MoveItem, _Mapping]]] = ..., shard: _Optional[int] = ...) -> None: ...

class MoveResponse(_message.Message):
    __slots__ = ("error", "codes")
    ERROR_FIELD_NUMBER: _ClassVar[int]
    CODES_FIELD_NUMBER: _ClassVar[int]
    error: _common_pb2.Error
    codes: _containers.RepeatedScalarFieldContainer[_common_pb2.Code]
    def __init__(self, error: _Optional[_Union[_common_pb2.Error, _Mapping]] = ..., codes: _Optional[_Iterable[_Union[_common_pb2.Code, str]]] = ...) -> None: ...

class Replica(_message.Message):
    __slots__ = ("key", "offset", "size", "checksum", "tier", "pending", "record")
    KEY_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    SIZE_FIELD_NUMBER: _ClassVar[int]
    CHECKSUM_FIELD_NUMBER: _ClassVar[int]
    TIER_FIELD_NUMBER: _ClassVar[int]
    PENDING_FIELD_NUMBER: _ClassVar[int]
    RECORD_FIELD_NUMBER: _ClassVar[int]
    key: bytes
    offset: int
    size: int
    checksum: int
    tier: str
    pending: bool
    record: bool
    def __init__(self, key: _Optional[bytes] = ..., offset: _Optional[int] = ..., size: _Optional[int] = ..., checksum: _Optional[int] = ..., tier: _Optional[str] = ..., pending: _Optional[bool] = ..., record: _Optional[bool] = ...) -> None: ...

class Change(_message.Message):
    __slots__ = ("replica", "drop")
    REPLICA_FIELD_NUMBER: _ClassVar[int]
    DROP_FIELD_NUMBER: _ClassVar[int]
    replica: Replica
    drop: bool
    def __init__(self, replica: _Optional[_Union[Replica, _Mapping]] = ..., drop: _Optional[bool] = ...) -> None: ...

class ApplyRequest(_message.Message):
    __slots__ = ("epoch", "add", "drop", "changes", "shard")
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    ADD_FIELD_NUMBER: _ClassVar[int]
    DROP_FIELD_NUMBER: _ClassVar[int]
    CHANGES_FIELD_NUMBER: _ClassVar[int]
    SHARD_FIELD_NUMBER: _ClassVar[int]
    epoch: int
    add: _containers.RepeatedCompositeFieldContainer[Replica]
    drop: _containers.RepeatedCompositeFieldContainer[Replica]
    changes: _containers.RepeatedCompositeFieldContainer[Change]
    shard: int
    def __init__(self, epoch: _Optional[int] = ..., add: _Optional[_Iterable[_Union[Replica, _Mapping]]] = ..., drop: _Optional[_Iterable[_Union[Replica, _Mapping]]] = ..., changes: _Optional[_Iterable[_Union[Change, _Mapping]]] = ..., shard: _Optional[int] = ...) -> None: ...

class ApplyResponse(_message.Message):
    __slots__ = ("error",)
    ERROR_FIELD_NUMBER: _ClassVar[int]
    error: _common_pb2.Error
    def __init__(self, error: _Optional[_Union[_common_pb2.Error, _Mapping]] = ...) -> None: ...

class InventoryRequest(_message.Message):
    __slots__ = ("epoch", "identity_only", "shard", "shards")
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    IDENTITY_ONLY_FIELD_NUMBER: _ClassVar[int]
    SHARD_FIELD_NUMBER: _ClassVar[int]
    SHARDS_FIELD_NUMBER: _ClassVar[int]
    epoch: int
    identity_only: bool
    shard: int
    shards: int
    def __init__(self, epoch: _Optional[int] = ..., identity_only: _Optional[bool] = ..., shard: _Optional[int] = ..., shards: _Optional[int] = ...) -> None: ...

class InventoryResponse(_message.Message):
    __slots__ = ("error", "node_id", "replicas", "segment", "base_addr", "size")
    ERROR_FIELD_NUMBER: _ClassVar[int]
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    REPLICAS_FIELD_NUMBER: _ClassVar[int]
    SEGMENT_FIELD_NUMBER: _ClassVar[int]
    BASE_ADDR_FIELD_NUMBER: _ClassVar[int]
    SIZE_FIELD_NUMBER: _ClassVar[int]
    error: _common_pb2.Error
    node_id: str
    replicas: _containers.RepeatedCompositeFieldContainer[Replica]
    segment: str
    base_addr: int
    size: int
    def __init__(self, error: _Optional[_Union[_common_pb2.Error, _Mapping]] = ..., node_id: _Optional[str] = ..., replicas: _Optional[_Iterable[_Union[Replica, _Mapping]]] = ..., segment: _Optional[str] = ..., base_addr: _Optional[int] = ..., size: _Optional[int] = ...) -> None: ...
