from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Code(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    OK: _ClassVar[Code]
    NOT_FOUND: _ClassVar[Code]
    ALREADY_EXISTS: _ClassVar[Code]
    IN_PROGRESS: _ClassVar[Code]
    STORE_FULL: _ClassVar[Code]
    LEASE_EXPIRED: _ClassVar[Code]
    LEASE_NOT_FOUND: _ClassVar[Code]
    INVALID_ARGUMENT: _ClassVar[Code]
    UNAVAILABLE: _ClassVar[Code]
    CORRUPT: _ClassVar[Code]
    NOT_LEADER: _ClassVar[Code]
    INTERNAL: _ClassVar[Code]
    BUSY: _ClassVar[Code]
    UNAUTHENTICATED: _ClassVar[Code]
    PERMISSION_DENIED: _ClassVar[Code]
    QUOTA_EXCEEDED: _ClassVar[Code]
    WRONG_SHARD: _ClassVar[Code]
OK: Code
NOT_FOUND: Code
ALREADY_EXISTS: Code
IN_PROGRESS: Code
STORE_FULL: Code
LEASE_EXPIRED: Code
LEASE_NOT_FOUND: Code
INVALID_ARGUMENT: Code
UNAVAILABLE: Code
CORRUPT: Code
NOT_LEADER: Code
INTERNAL: Code
BUSY: Code
UNAUTHENTICATED: Code
PERMISSION_DENIED: Code
QUOTA_EXCEEDED: Code
WRONG_SHARD: Code

class Error(_message.Message):
    __slots__ = ("code", "message")
    CODE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    code: Code
    message: str
    def __init__(self, code: _Optional[_Union[Code, str]] = ..., message: _Optional[str] = ...) -> None: ...

class Location(_message.Message):
    __slots__ = ("node_id", "segment", "addr", "size", "tier")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    SEGMENT_FIELD_NUMBER: _ClassVar[int]
    ADDR_FIELD_NUMBER: _ClassVar[int]
    SIZE_FIELD_NUMBER: _ClassVar[int]
    TIER_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    segment: str
    addr: int
    size: int
    tier: str
    def __init__(self, node_id: _Optional[str] = ..., segment: _Optional[str] = ..., addr: _Optional[int] = ..., size: _Optional[int] = ..., tier: _Optional[str] = ...) -> None: ...
