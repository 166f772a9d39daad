"""The master's core: object index, allocation, leases, eviction — no I/O.

The gRPC server and the etcd layer drive a `MasterCore` by method calls and map its
results onto messages; tests drive it with a `ManualClock`. See core.py for the rules
and the map of the collaborators behind the facade.
"""

from .clock import Clock, ManualClock, MonotonicClock
from .config import CoreConfig
from .core import MasterCore
from .results import (
    CoreStats,
    Event,
    EventKind,
    EvictionReport,
    GetReplicasResult,
    Location,
    LookupResult,
    MoveKind,
    NodeStats,
    ObjectInfo,
    PutStartResult,
    ReadResult,
    ReplicaChange,
    SegmentStats,
    TickReport,
    Tier,
    TierMove,
)

__all__ = [
    "Clock",
    "CoreConfig",
    "CoreStats",
    "Event",
    "EventKind",
    "EvictionReport",
    "GetReplicasResult",
    "Location",
    "LookupResult",
    "ManualClock",
    "MasterCore",
    "MonotonicClock",
    "MoveKind",
    "NodeStats",
    "ObjectInfo",
    "PutStartResult",
    "ReadResult",
    "ReplicaChange",
    "SegmentStats",
    "TickReport",
    "Tier",
    "TierMove",
]
