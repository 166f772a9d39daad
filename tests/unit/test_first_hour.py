"""The pure parts of the first-hour fixes: progress lines printed once, credentials that
name a missing file, the SIGTERM flush of DRAM objects to the SSD tier, the docs'
word on lease TTLs agreeing with the master, and a put that waits for a store node to
mount within the client's timeout."""

from __future__ import annotations

import io
import json
import re
from pathlib import Path
from typing import Any

import pytest

from kvstore.admin.output import ProgressBar
from kvstore.checksum import checksum
from kvstore.errors import Code, InvalidArgument, StoreFull, Unavailable
from kvstore.master.core import EventKind
from kvstore.master.core.writes import AHEAD_TIMEOUT
from kvstore.security.credentials import Credentials
from kvstore.store.inventory import Held
from kvstore.store.shutdown import flush_to_ssd
from kvstore.store.ssd import SsdTier
from kvstore.v1 import master_pb2 as pb
from kvstore_client import reservations
from kvstore_client.clock import ManualClock
from kvstore_client.control import backoff
from tests.unit.test_client_clock import ClockRig
from tests.unit.test_client_data_path import small_thresholds
from tests.unit.test_core_objects import make, put

ROOT = Path(__file__).resolve().parents[2]


# ------------------------------------------------------------------ progress


def test_a_bar_that_did_not_move_prints_its_line_once() -> None:
    """`kvstore drain` that moved nothing, or `evict` held: the first line was printed
    again by finish()."""
    out = io.StringIO()
    p = ProgressBar("draining node-0", 0, stream=out)
    for _ in range(3):
        p.update(0, "0 dropped, 0 moved, 0 gone, 32 left", total=32)
    p.finish()
    assert out.getvalue().splitlines() == [
        "draining node-0 [..............................]   0%  0/32  0 dropped, 0 moved, 0 gone, 32 left"]


def test_a_bar_done_in_one_step_prints_one_line() -> None:
    out = io.StringIO()
    p = ProgressBar("evicting", 100, stream=out)
    p.update(0)
    p.update(100)
    p.finish()
    lines = out.getvalue().splitlines()
    assert len(lines) == len(set(lines)) == 2 and lines[-1].endswith("100/100")


# ------------------------------------------------------------------ credentials


@pytest.fixture
def creds_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "credentials.json"
    monkeypatch.setenv("KVSTORE_CREDENTIALS", str(path))
    for name in ("KVSTORE_TOKEN", "KVSTORE_TLS_CA", "KVSTORE_ADMIN_TOKEN", "KVSTORE_TLS_CERT",
                 "KVSTORE_TLS_KEY"):
        monkeypatch.delenv(name, raising=False)
    return path


def test_a_missing_ca_file_names_the_file_and_the_entry(creds_file: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    entry = "127.0.0.1:2379/default"
    creds_file.write_text(json.dumps({entry: {"token": "t", "tls_ca": ".kvstore/secrets/ca.pem"}}))
    creds = Credentials.resolve(cluster=entry)  # resolving reads no file...
    with pytest.raises(InvalidArgument) as err:
        creds.tls  # noqa: B018 - ...the first connection does
    msg = err.value.message
    assert ".kvstore/secrets/ca.pem" in msg and repr(entry) in msg and str(creds_file) in msg
    assert "relative" in msg  # what an older `kvstore up` wrote, and what to do
    monkeypatch.setenv("KVSTORE_TLS_CA", str(creds_file.parent / "no-such-ca.pem"))
    with pytest.raises(InvalidArgument, match=r"no-such-ca.pem named by \$KVSTORE_TLS_CA"):
        Credentials.resolve(cluster=entry).grpc_channel("127.0.0.1:1", True, [])


def test_a_ca_file_that_is_there_resolves(creds_file: Path, tmp_path: Path) -> None:
    ca = tmp_path / "ca.pem"
    ca.write_text("not checked here")
    entry = "127.0.0.1:2379/default"
    creds_file.write_text(json.dumps({entry: {"token": "t", "tls_ca": str(ca)}}))
    got = Credentials.resolve(cluster=entry)
    assert got.tls_ca == str(ca) and got.tls_ca_from == "file" and got.token == "t"
    assert got.tls.ca == str(ca)


# ------------------------------------------------------------------ SIGTERM flush


def _segment(objects: dict[bytes, bytes]) -> tuple[memoryview, list[tuple[bytes, Held]]]:
    buf = bytearray(1 << 20)
    held = []
    offset = 0
    for key, data in objects.items():
        buf[offset:offset + len(data)] = data
        held.append((key, Held(offset, len(data), checksum(data))))
        offset += (len(data) + 4095) // 4096 * 4096
    return memoryview(buf), held


def test_flush_writes_dram_objects_that_a_reopened_tier_reads(tmp_path: Path) -> None:
    objects = {f"dev/k{i}".encode(): bytes([i]) * (1000 + i) for i in range(20)}
    view, held = _segment(objects)
    held.append((b"dev/stale", Held(0, 500, 12345)))  # a stale entry: other bytes now
    with SsdTier(tmp_path / "ssd", 64 << 20) as ssd:
        ssd.open()
        ssd.put(b"dev/k0", objects[b"dev/k0"], checksum(objects[b"dev/k0"]))  # demoted before
        report = flush_to_ssd(held, view, ssd, budget=60.0)
    assert (report.written, report.already, report.corrupt, report.left) == (19, 1, 1, 0)
    with SsdTier(tmp_path / "ssd", 64 << 20) as again:
        again.open()
        assert {k: again.read(k) for k in objects} == objects
        assert not again.contains(b"dev/stale")


def test_flush_stops_at_its_deadline_and_when_the_tier_is_full(tmp_path: Path) -> None:
    objects = {f"k{i}".encode(): b"x" * 8000 for i in range(10)}
    view, held = _segment(objects)
    ticks = iter(range(100))
    with SsdTier(tmp_path / "a", 64 << 20) as ssd:
        ssd.open()
        # the clock: 0 at the start, then one second per look: 3 objects fit in 3.5 s
        report = flush_to_ssd(held, view, ssd, budget=3.5, clock=lambda: float(next(ticks)))
        assert (report.written, report.left, report.why_left) == (3, 7, "deadline")
        assert len(ssd) == 3
    with SsdTier(tmp_path / "b", 5 * 12288) as small:
        small.open()
        report = flush_to_ssd(held, view, small, budget=60.0)
        assert report.why_left == "full" and 0 < report.written < 10
        assert small.stats().evictions == 0  # it never evicts to make room


# ------------------------------------------------------------------ lease TTLs


def test_docs_and_master_agree_on_a_ttl_above_the_cap() -> None:
    """`lookup(ttl=1000)` is refused, naming the limit: the docs say so (they said
    "capped"). A lease shorter than asked would expire under a reader that planned for
    the time it asked for, far from the cause; the refusal says it at once."""
    core, _ = make(max_lease_ttl=60.0)
    put(core, [b"a"])
    with pytest.raises(InvalidArgument, match=r"<= 60.0 s, got 1000"):
        core.lookup([b"a"], lease_ttl=1000)
    ops = (ROOT / "docs" / "operations.md").read_text()
    assert not re.search(r"capped by `--max-lease-ttl`", ops)
    assert "refused" in ops[ops.index("--max-lease-ttl"):][:400]


# ------------------------------------------------------------------ a put before any node

NO_NODE = ("no store node has mounted a DRAM segment yet; retry once one has "
           "(kvstore status lists the mounted nodes)")


@pytest.fixture
def clock_rig(monkeypatch: pytest.MonkeyPatch) -> ClockRig:
    small_thresholds(monkeypatch)
    return ClockRig()


def _no_node_until(rig: ClockRig, mounted_at: float | None,
                   code: Code = Code.UNAVAILABLE, message: str = NO_NODE) -> None:
    """The fake master answers `code` to every PutStart until the clock reaches
    `mounted_at` (None: never), as a master with no store node mounted does."""
    real = rig.master.PutStart

    def put_start(req: pb.PutStartRequest) -> pb.PutStartResponse:
        if mounted_at is not None and rig.clock.now() >= mounted_at:
            return real(req)
        reply = pb.PutStartResponse(epoch=rig.master.epoch)
        for _ in req.keys:
            reply.items.add(code=code, message=message)
        return reply

    rig.master.PutStart = put_start  # type: ignore[method-assign]


def test_a_put_waits_for_the_first_node_to_mount(clock_rig: ClockRig) -> None:
    """A program started with its cluster: its first put waits (backing off on the
    client's clock) until a node has mounted, then stores."""
    rig = clock_rig
    rig.state.timeout = 10.0
    start = rig.clock.now()
    _no_node_until(rig, start + 2.0)
    keys, values = [b"k0", b"k1"], [b"a" * 100, b"b" * 200]
    assert rig.client.put_many(keys, values) == [None, None]
    assert rig.master.objects.keys() == {b"k0", b"k1"}
    assert rig.clock.now() - start >= 2.0
    # Backed off as a control call's retries are, and asked again after each wait.
    assert rig.slept[:4] == pytest.approx([backoff(i, 10.0) for i in range(4)])
    assert rig.asked("PutStart") == len(rig.slept) + 1 and rig.asked("PutEnd") == 1


def test_a_put_gives_up_at_the_clients_timeout_with_the_masters_sentence(
        clock_rig: ClockRig) -> None:
    rig = clock_rig
    rig.state.timeout = 3.0
    _no_node_until(rig, None)
    start = rig.clock.now()
    errs = rig.client.put_many([b"k"], [b"v" * 10])
    assert [type(e) for e in errs] == [Unavailable]
    assert NO_NODE in str(errs[0])
    # The whole timeout was waited, and not more: the last wait ends at the deadline.
    assert rig.clock.now() - start == pytest.approx(3.0)
    assert rig.asked("PutStart") > 2 and not rig.master.pending


def test_a_full_store_is_not_waited_for(clock_rig: ClockRig) -> None:
    """StoreFull is an answer, not a cluster starting: no wait, one PutStart."""
    rig = clock_rig
    _no_node_until(rig, None, Code.STORE_FULL, "store full (fake)")
    errs = rig.client.put_many([b"k"], [b"v" * 10])
    assert [type(e) for e in errs] == [StoreFull]
    assert rig.asked("PutStart") == 1 and not rig.slept


def test_only_the_keys_without_a_node_are_asked_again(clock_rig: ClockRig) -> None:
    """A batch where some keys got space (or a final answer) keeps those answers."""
    rig = clock_rig
    real = rig.master.PutStart
    asked: list[list[bytes]] = []

    def put_start(req: pb.PutStartRequest) -> pb.PutStartResponse:
        asked.append(list(req.keys))
        reply = real(req)
        for key, item in zip(req.keys, reply.items, strict=True):
            if key == b"late" and len(asked) < 3:
                item.Clear()
                item.code = Code.UNAVAILABLE
                item.message = NO_NODE
            elif key == b"full":
                item.Clear()
                item.code = Code.STORE_FULL
                item.message = "store full (fake)"
        return reply

    rig.master.PutStart = put_start  # type: ignore[method-assign]
    errs = rig.client.put_many([b"now", b"late", b"full"], [b"1" * 10, b"2" * 10, b"3" * 10])
    assert errs[0] is None and errs[1] is None and isinstance(errs[2], StoreFull)
    assert asked == [[b"now", b"late", b"full"], [b"late"], [b"late"]]


# ------------------------------------------------------------------ placeholders left behind

W = "writer-1"


def _ahead(core: Any, keys: list[bytes], size: int = 1024) -> list[Any]:
    rs = core.put_start(keys, [size] * len(keys), [0] * len(keys), None, W, ahead=True)
    assert [r.code for r in rs] == [Code.OK] * len(keys)
    return rs


def test_placeholders_a_writer_left_are_reclaimed_at_the_ahead_timeout() -> None:
    """A client that went quiet (or lost its pool to a failover's retries) never
    revokes its placeholders; with a long put timeout they stayed PENDING all that
    while. They go at AHEAD_TIMEOUT; a plain put started with them stays PENDING."""
    core, clock = make(put_timeout=600.0)
    assert core.put_timeout(ahead=True) == AHEAD_TIMEOUT < core.put_timeout() == 600.0
    holders = [b"~put/w/1", b"~put/w/2"]
    _ahead(core, holders)
    clock.advance(1.0)
    core.put_start([b"plain"], [1024], [5], None, W)  # written by a live put
    _ahead(core, [b"~put/w/3"])
    clock.advance(AHEAD_TIMEOUT - 1.0 - 1e-6)
    core.tick()
    assert core.stats().objects_pending == 4
    clock.advance(2e-6)
    core.tick()
    assert core.stats().objects_pending == 2  # the two granted first
    events = [e for e in core.take_events() if e.kind is EventKind.RECLAIMED]
    assert [sorted(e.keys) for e in events] == [holders]
    clock.advance(1.0)
    core.tick()
    assert core.stats().objects_pending == 1
    assert core.inspect(b"plain") is not None and core.put_end([b"plain"], W) == [Code.OK]
    # Its writer finding it gone puts the value the plain way (kvstore_client.puts).
    assert core.put_commit([holders[0]], [b"k"], [1024], [9], W) == [Code.NOT_FOUND]


def test_a_reclaimed_placeholders_range_waits_for_its_writer() -> None:
    """Reclaimed early, a placeholder's range is held as long as a PENDING one's was:
    until its writer's next call for it (here the revoke of a client that finds it past
    its age) or the put timeout. A late write then lands nowhere in use."""
    core, clock = make(put_timeout=600.0)
    [r] = _ahead(core, [b"~put/w/1"], size=4096)
    clock.advance(AHEAD_TIMEOUT)
    core.tick()
    assert core.stats().objects_pending == 0
    assert core.eviction_stats().pool_used == 4096  # still allocated: held
    for i in range(50):  # nothing placed there meanwhile
        [other] = core.put_start([b"o%d" % i], [4096], [5], None, "another")
        assert other.code == Code.OK and other.locations[0].addr != r.locations[0].addr
    assert core.put_revoke([b"~put/w/1"], W) == [Code.NOT_FOUND]
    assert core.eviction_stats().pool_used == 50 * 4096  # given back


def test_a_short_put_timeout_bounds_placeholders_too() -> None:
    core, clock = make(put_timeout=4.0)
    assert core.put_timeout(ahead=True) == 4.0
    _ahead(core, [b"~put/w/1"])
    clock.advance(4.0)
    core.tick()
    assert core.stats().objects_pending == 0


def test_the_put_start_reply_says_how_long_a_placeholder_is_kept() -> None:
    """The client writes a placeholder only in the first half of the reply's
    put_timeout (kvstore_client.reservations): for space started ahead that is the
    ahead timeout, so it has used it or given it up long before the master drops it."""
    from kvstore.master.metrics import MasterMetrics
    from kvstore.master.service import MasterService
    from tests.unit.test_core_put_commit import Leader

    core, _ = make(put_timeout=600.0)
    service = MasterService(core, Leader(), MasterMetrics())
    ahead = service.handle("PutStart", pb.PutStartRequest(
        keys=[b"~put/w/1"], sizes=[10], checksums=[0], writer=W, ahead=True))
    plain = service.handle("PutStart", pb.PutStartRequest(
        keys=[b"k"], sizes=[10], checksums=[5], writer=W))
    assert (ahead.put_timeout, plain.put_timeout) == (AHEAD_TIMEOUT, 600.0)
    clock = ManualClock()
    rs = reservations.Reservations(W, clock=clock)
    sent = clock.now()
    rs.granted([(b"~put/w/1", 10)], 0, ahead, sent)
    [r] = rs.take([10], 0, ahead.epoch) or []
    assert r.usable_until - sent <= AHEAD_TIMEOUT / 2
