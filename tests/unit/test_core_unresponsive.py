"""A node that missed a record gets no placements until it answers again
(MasterCore.set_unresponsive; issue 32, item 5)."""

from __future__ import annotations

from kvstore.errors import Code
from kvstore.master.core import CoreConfig, ManualClock, MasterCore


def _core() -> MasterCore:
    core = MasterCore(CoreConfig(), ManualClock())
    core.mount_segment("a", "seg-a", 1 << 20, 1 << 20)
    core.mount_segment("b", "seg-b", 4 << 20, 1 << 20)
    return core


def test_an_unresponsive_node_gets_no_placements_until_it_answers() -> None:
    core = _core()
    core.set_unresponsive("a", True)
    keys = [b"k%d" % i for i in range(20)]
    results = core.put_start(keys, [100] * 20, [1] * 20)
    assert {loc.node_id for r in results for loc in r.locations} == {"b"}
    core.set_unresponsive("a", False)
    results = core.put_start([b"j%d" % i for i in range(20)], [100] * 20, [1] * 20, replicas=2)
    assert {loc.node_id for r in results for loc in r.locations} == {"a", "b"}


def test_what_it_holds_stays_readable() -> None:
    core = _core()
    core.put_start([b"x"], [100], [1], replicas=2)
    core.put_end([b"x"])
    core.set_unresponsive("a", True)
    (r,) = core.get_replicas([b"x"]).results
    assert r.code == Code.OK and {loc.node_id for loc in r.locations} == {"a", "b"}


def test_with_every_node_unresponsive_a_put_says_why() -> None:
    core = _core()
    core.set_unresponsive("a", True)
    core.set_unresponsive("b", True)
    (r,) = core.put_start([b"k"], [100], [1])
    assert r.code == Code.UNAVAILABLE  # retryable: such a node is taken back when it answers
    assert "answers" in r.message and "down or unreachable" in r.message
