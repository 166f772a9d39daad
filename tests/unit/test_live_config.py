"""The leader's side of live settings: etcd records -> core.reconfigure, bad ones refused."""

from __future__ import annotations

from kvstore.coord.layout import Layout
from kvstore.master.core import CoreConfig, ManualClock, MasterCore
from kvstore.master.live_config import LiveConfig, settings_from

L = Layout("t")


def rec(name: str, value: str) -> tuple[bytes, bytes]:
    return L.setting(name), value.encode()


def live() -> LiveConfig:
    lc = LiveConfig(None, L)  # type: ignore[arg-type]  # apply() needs no etcd
    lc.base = CoreConfig(evict_high=0.9, evict_low=0.8, max_lease_ttl=60.0)
    return lc


def test_bad_records_are_skipped_one_by_one() -> None:
    got = settings_from(L.config, [rec("evict_high", "0.7"), rec("evict_low", "lots"),
                                   rec("alignment", "128"), rec("put_timeout", " 12 ")])
    assert got == {"evict_high": 0.7, "put_timeout": 12.0}


def test_apply_swaps_settings_and_a_deleted_key_falls_back_to_the_base() -> None:
    lc = live()
    core = MasterCore(lc.base, ManualClock())
    assert lc.apply([rec("evict_high", "0.5"), rec("evict_low", "0.4")], core)
    assert (core.config.evict_high, core.config.evict_low) == (0.5, 0.4)
    assert lc.apply([rec("evict_low", "0.4")], core)  # evict_high unset: back to 0.9
    assert (core.config.evict_high, core.config.evict_low) == (0.9, 0.4)


def test_an_inconsistent_set_is_refused_and_the_settings_in_force_stay() -> None:
    lc = live()
    core = MasterCore(lc.base, ManualClock())
    assert lc.apply([rec("evict_high", "0.6"), rec("evict_low", "0.5")], core)
    assert not lc.apply([rec("evict_high", "0.3"), rec("evict_low", "0.5")], core)
    assert (core.config.evict_high, core.config.evict_low) == (0.6, 0.5)
    assert not lc.apply([rec("default_lease_ttl", "100")], core)  # above max_lease_ttl 60
    assert core.config.default_lease_ttl == 30.0
