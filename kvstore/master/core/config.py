"""The knobs of the master core, checked once so the rest of the core can trust them."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, fields, replace

from kvstore.errors import InvalidArgument


@dataclass
class CoreConfig:
    put_timeout: float = 30.0  # PENDING objects older than this are reclaimed
    default_lease_ttl: float = 30.0
    max_lease_ttl: float = 300.0  # a ttl above this is refused
    evict_high: float = 0.98  # fraction of the DRAM pool's bytes
    evict_low: float = 0.97
    # At most this many objects per watermark round (one put batch or one tick): a
    # round costs O(evict_batch) however large the pool, and an allocation that finds
    # no room still evicts for itself one object at a time.
    evict_batch: int = 1024
    # Pinned DRAM bytes one lease holder (and one tenant) may hold, as a share of the
    # pool (pin_cap.py): a lookup beyond it reports a shorter prefix.
    pin_share: float = 0.5
    alignment: int = 64
    default_replicas: int = 1
    max_replicas: int = 8
    max_batch: int = 65536  # keys per call
    # Lease ids must not repeat across leaders: a client holding lease 7 from the old
    # leader must not release someone else's lease 7 on the new one. The daemon sets
    # this from its election epoch: `epoch << 32` (kvstore/master/daemon.py).
    first_lease_id: int = 1
    # Events wait here until the I/O layer drains them; past this many the oldest are
    # dropped (and counted) rather than letting an idle drainer grow memory forever.
    max_events: int = 100_000
    # Nodes that went (lease ended, or unmounted) stay listed this long, so an operator
    # can still see what was lost with them.
    departed_retention: float = 600.0

    def __post_init__(self) -> None:
        if not 0.0 < self.evict_low < self.evict_high <= 1.0:
            raise InvalidArgument(
                f"watermarks must satisfy 0 < evict_low < evict_high <= 1, "
                f"got evict_low={self.evict_low} evict_high={self.evict_high}"
            )
        if not (isinstance(self.evict_batch, int) and self.evict_batch >= 1):
            raise InvalidArgument(f"evict_batch must be a whole number >= 1, got {self.evict_batch}")
        if not 0.0 < self.pin_share <= 1.0:
            raise InvalidArgument(f"pin_share must be in (0, 1], got {self.pin_share}")
        if not self.put_timeout > 0:
            raise InvalidArgument(f"put_timeout must be > 0 seconds, got {self.put_timeout}")
        if not self.max_lease_ttl > 0:
            raise InvalidArgument(f"max_lease_ttl must be > 0 seconds, got {self.max_lease_ttl}")
        if not 0 < self.default_lease_ttl <= self.max_lease_ttl:
            raise InvalidArgument(
                f"default_lease_ttl must be in (0, max_lease_ttl={self.max_lease_ttl}], "
                f"got {self.default_lease_ttl}"
            )
        a = self.alignment
        if not isinstance(a, int) or a < 8 or a & (a - 1):
            raise InvalidArgument(f"alignment must be a power of two >= 8, got {a}")
        if self.max_replicas < 1:
            raise InvalidArgument(f"max_replicas must be >= 1, got {self.max_replicas}")
        if not 1 <= self.default_replicas <= self.max_replicas:
            raise InvalidArgument(
                f"default_replicas must be in [1, max_replicas={self.max_replicas}], "
                f"got {self.default_replicas}"
            )
        if not self.max_batch >= 1:
            raise InvalidArgument(f"max_batch must be >= 1, got {self.max_batch}")
        if not self.first_lease_id >= 1:
            raise InvalidArgument(f"first_lease_id must be >= 1, got {self.first_lease_id}")
        if not self.max_events >= 1:
            raise InvalidArgument(f"max_events must be >= 1, got {self.max_events}")
        if not self.departed_retention >= 0:
            raise InvalidArgument(
                f"departed_retention must be >= 0 seconds, got {self.departed_retention}")


# What an operator may change on a running leader (`kvstore config set NAME VALUE`).
# The values live in etcd under Layout.config, one key per setting; the leader reads
# them when elected and follows changes. Everything else in CoreConfig shapes data
# structures (alignment, batch size, lease id space) and needs a restart.
LIVE_SETTINGS: dict[str, str] = {
    "evict_high": "fraction of the DRAM pool in use above which eviction starts",
    "evict_low": "fraction of the DRAM pool eviction frees down to",
    "max_lease_ttl": "longest read lease a client may ask for, in seconds",
    "default_lease_ttl": "lease length when a client asks for none, in seconds",
    "put_timeout": "seconds before an uncommitted put is reclaimed",
    "evict_batch": "most objects one eviction round (a put batch or a tick) evicts",
    "pin_share": "share of the DRAM pool one client or one tenant may keep pinned",
}


def parse_setting(name: str, text: str) -> float:
    """The value of one live setting, from text; InvalidArgument with a sentence."""
    if name not in LIVE_SETTINGS:
        raise InvalidArgument(
            f"{name!r} is not a live setting; choose one of {', '.join(LIVE_SETTINGS)}")
    try:
        value = float(text)
    except ValueError:
        raise InvalidArgument(f"{name} must be a number, got {text!r}") from None
    if not math.isfinite(value):
        raise InvalidArgument(f"{name} must be a finite number, got {text!r}")
    if name == "evict_batch":
        if not (value >= 1 and value == int(value)):
            raise InvalidArgument(f"evict_batch is a number of objects: a whole number >= 1, "
                                  f"got {value:g}")
        return value
    if name == "pin_share":
        if not 0.0 < value <= 1.0:
            raise InvalidArgument(f"pin_share is a share of the DRAM pool: it must be in (0, 1], "
                                  f"got {value:g}")
        return value
    if name.startswith("evict_") and not 0.0 < value <= 1.0:
        raise InvalidArgument(
            f"{name} is a fraction of the DRAM pool: it must be in (0, 1], got {value:g}")
    if not name.startswith("evict_") and not value > 0:
        raise InvalidArgument(f"{name} is a number of seconds: it must be > 0, got {value:g}")
    return value


def live_settings(config: CoreConfig) -> dict[str, float]:
    return {name: float(getattr(config, name)) for name in LIVE_SETTINGS}


def with_settings(config: CoreConfig, settings: Mapping[str, float]) -> CoreConfig:
    """`config` with live settings replaced, checked as a whole (evict_low < evict_high,
    default_lease_ttl <= max_lease_ttl ...): InvalidArgument names the conflict."""
    unknown = sorted(set(settings) - set(LIVE_SETTINGS))
    if unknown:
        raise InvalidArgument(
            f"{', '.join(unknown)} cannot change at run time; live settings are "
            f"{', '.join(LIVE_SETTINGS)}")
    values = dict(settings)
    if "evict_batch" in values:  # a count: etcd and parse_setting give it as a float
        values["evict_batch"] = int(values["evict_batch"])
    return replace(config, **values)  # type: ignore[arg-type]


def same_structure(a: CoreConfig, b: CoreConfig) -> bool:
    """True when a and b differ in live settings only."""
    return all(getattr(a, f.name) == getattr(b, f.name)
               for f in fields(CoreConfig) if f.name not in LIVE_SETTINGS)
