"""Projection of a sharded control plane: throughput and latency for N shards.

    python -m bench.shard_sim [--shards 1,2,4,8,16,32,64] [--kind lookup] [--batch 128]
                              [--clients 64 | --rate CALLS_PER_S] [--think-us 0]
                              [--call-us ..] [--KIND-key-us ..] [--rtt-us ..]
                              [--send-us ..] [--read-us ..]
                              [--spread hash|even] [--service-cv 1] [--calls 20000] [--seed 1]

A discrete-event simulation, seeded and so deterministic, of clients calling a control
plane split into N shards (docs/scaling.md is the design, and says where each default
below was measured). Nothing is started: the inputs are the measured costs.

- A call carries a batch of --batch keys. With --spread hash (the design) each key goes
  to a shard drawn uniformly (hash of the key mod N), so a batch touches at most
  min(N, batch) shards, fewer when two keys draw the same one; with --spread even it
  touches exactly min(N, batch) shards, its keys dealt out evenly.
- The client sends one message per touched shard, one after another, each --send-us of
  the client's own time after the first (the first is inside the round trip), then
  reads the replies as they come, each further one --read-us more (one thread does
  both). The call ends when the last reply has been read: it finishes with its slowest
  shard.
- A shard is one single-core process: a FIFO queue whose service time for a message of
  k keys is --call-us + k x --key-us, drawn from a gamma distribution of that mean and
  coefficient of variation --service-cv (0: exactly that long).
- Half of --rtt-us (the round trip of the cheapest call, the master's own time in it
  included: a conservative floor) goes each way.
- --kind put is two such fan-outs in a row (PutStart, then PutEnd), each with half of
  --key-us per key. --kind a=W[:B],b=W[:B] mixes kinds, a share W of the calls each,
  B keys a call (--batch where not given).
- Closed loop: --clients clients, each calling again --think-us (exponential mean) after
  its last call ended. Open loop: --rate calls a second arriving at random (Poisson),
  however many are in flight.

For each N it prints the shards a call touched (mean), calls and keys a second, the
shards' busy share, p50 and p99 of a call, and what binds: the shards (busy 90% or
more), or the clients (closed loop: fewer calls in flight than the shards could serve).
The first tenth of the calls warms the queues up and is not counted.
"""

from __future__ import annotations

import argparse
import heapq
import random
import sys
from collections import Counter, deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from bench.stats import Latency, fmt_rate, fmt_seconds, format_table

MODULE = "bench.shard_sim"


@dataclass(frozen=True)
class Kind:
    phases: int      # sequential fan-outs per call (put: PutStart, then PutEnd)
    key_us: float    # the shard's CPU per key handled, over all phases


# The master's CPU per key beyond the per-call cost, by kind: docs/scaling.md says how
# each was measured (bench.master_ops, 8 clients) and what it was.
KINDS = {
    "exists": Kind(1, 0.07),
    "lookup": Kind(1, 0.57),
    "replicas": Kind(1, 1.9),
    "put": Kind(2, 15.2),
}
DEFAULT_CALL_US = 28.5   # the master's CPU per message, whatever its keys
DEFAULT_RTT_US = 21.0    # the raw fast channel's Exists of 1 key, p50
DEFAULT_SEND_US = 15.0   # the client's time to send one more request
DEFAULT_READ_US = 12.0   # ...and to read one more reply that is already there


@dataclass
class Model:
    shards: int
    batch: int
    kinds: list[tuple[str, float, int]]   # (kind, share of the calls, keys a call; 0: batch)
    call_us: float = DEFAULT_CALL_US
    key_us: dict[str, float] = field(default_factory=dict)  # overrides of KINDS' key_us
    rtt_us: float = DEFAULT_RTT_US
    send_us: float = DEFAULT_SEND_US
    read_us: float = DEFAULT_READ_US
    clients: int = 64
    rate: float = 0.0                # calls/s, open loop; 0: closed loop with `clients`
    think_us: float = 0.0
    spread: str = "hash"
    service_cv: float = 1.0
    calls: int = 10000
    seed: int = 1

    def per_key(self, kind: str) -> float:
        return self.key_us.get(kind, KINDS[kind].key_us)

    def keys(self, batch: int) -> int:
        return batch or self.batch


@dataclass
class Result:
    shards: int
    touched: float           # shards per fan-out, mean
    calls_per_s: float
    keys_per_s: float
    busy: float              # the shards' busy share, mean over shards
    lat: Latency
    mean_s: float
    bound: str

    def row(self) -> list[str]:
        return [str(self.shards), f"{self.touched:.1f}", fmt_rate(self.calls_per_s),
                fmt_rate(self.keys_per_s), f"{self.busy * 100:.0f}%",
                fmt_seconds(self.lat.p50), fmt_seconds(self.lat.p99), self.bound]


HEADERS = ["shards", "shards/call", "calls/s", "keys/s", "shard busy", "p50", "p99", "bound"]


def split(rng: random.Random, shards: int, batch: int, spread: str) -> list[tuple[int, int]]:
    """The (shard, keys) a batch of `batch` keys sends, in the order the client sends."""
    if spread == "even":
        touched = min(shards, batch)
        first = rng.randrange(shards)
        base, extra = divmod(batch, touched)
        return [((first + i) % shards, base + (1 if i < extra else 0)) for i in range(touched)]
    counts = Counter(rng.choices(range(shards), k=batch))
    return sorted(counts.items())


class _Call:
    __slots__ = ("batch", "client", "kind", "pending", "phase", "read_until", "seen", "start")

    def __init__(self, kind: str, batch: int, start: float, client: int) -> None:
        self.kind = kind
        self.batch = batch
        self.start = start
        self.phase = 0
        self.pending = 0
        self.seen = 0
        self.read_until = 0.0
        self.client = client   # -1: an open-loop arrival, nobody calls again after it


class _Sim:
    """The event loop: a heap of (time, seq, handler, argument)."""

    def __init__(self, m: Model) -> None:
        if m.shards < 1 or m.batch < 1 or m.calls < 10:
            raise ValueError("shards and batch must be 1 or more, calls 10 or more")
        self.m = m
        self.rng = random.Random(m.seed)
        self.half_rtt = m.rtt_us * 1e-6 / 2
        self.send = m.send_us * 1e-6
        self.read = m.read_us * 1e-6
        self.choices = [(k, m.keys(b)) for k, _, b in m.kinds]
        self.weights = [w for _, w, _ in m.kinds]
        self.shape = 1.0 / m.service_cv ** 2 if m.service_cv > 0 else 0.0
        self.events: list[tuple[float, int, Callable[[float, Any], None], Any]] = []
        self.seq = 0
        self.queues: list[deque[tuple[_Call, int]]] = [deque() for _ in range(m.shards)]
        self.idle = [True] * m.shards
        self.busy_total = [0.0] * m.shards   # service handed out so far
        self.busy_until = [0.0] * m.shards   # when the message in service ends
        self.warm = m.calls // 10
        self.done = 0
        self.t_warm = 0.0
        self.busy_at_warm = 0.0
        self.fanouts = 0
        self.touched = 0
        self.lat: list[float] = []
        self.keys_done = 0

    def push(self, t: float, fn: Callable[[float, Any], None], arg: Any) -> None:
        self.seq += 1
        heapq.heappush(self.events, (t, self.seq, fn, arg))

    def pause(self) -> float:
        m = self.m
        return self.rng.expovariate(1e6 / m.think_us) if m.think_us else 0.0

    def service(self, kind: str, keys: int) -> float:
        m = self.m
        mean = (m.call_us + keys * m.per_key(kind) / KINDS[kind].phases) * 1e-6
        return self.rng.gammavariate(self.shape, mean / self.shape) if self.shape else mean

    def busy(self, t: float) -> float:
        """The shards' busy seconds up to `t`: what they were given, less the part of
        the messages in service still to come."""
        return sum(total - max(0.0, until - t)
                   for total, until in zip(self.busy_total, self.busy_until, strict=True))

    # -- the handlers

    def issue(self, t: float, client: int) -> None:
        kind, batch = (self.choices[0] if len(self.choices) == 1
                       else self.rng.choices(self.choices, self.weights)[0])
        self.fan_out(t, _Call(kind, batch, t, client))
        if client < 0:
            self.push(t + self.rng.expovariate(self.m.rate), self.issue, -1)

    def fan_out(self, t: float, call: _Call) -> None:
        parts = split(self.rng, self.m.shards, call.batch, self.m.spread)
        self.fanouts += 1
        self.touched += len(parts)
        # The client reads no reply before its last request is out: one thread does both.
        call.pending, call.seen = len(parts), 0
        call.read_until = t + (len(parts) - 1) * self.send
        for i, (shard, keys) in enumerate(parts):
            self.push(t + i * self.send + self.half_rtt, self.arrive, (shard, call, keys))

    def arrive(self, t: float, arg: tuple[int, _Call, int]) -> None:
        shard, call, keys = arg
        self.queues[shard].append((call, keys))
        if self.idle[shard]:
            self.begin(t, shard)

    def begin(self, t: float, shard: int) -> None:
        call, keys = self.queues[shard].popleft()
        s = self.service(call.kind, keys)
        self.idle[shard] = False
        self.busy_until[shard] = t + s
        self.busy_total[shard] += s
        self.push(t + s, self.served, (shard, call))

    def served(self, t: float, arg: tuple[int, _Call]) -> None:
        shard, call = arg
        self.push(t + self.half_rtt, self.reply, call)
        if self.queues[shard]:
            self.begin(t, shard)
        else:
            self.idle[shard] = True

    def reply(self, t: float, call: _Call) -> None:
        # The first reply's reading is inside the round trip; each further one costs
        # the client `read` more, after the one before it was read.
        call.read_until = max(call.read_until, t) + (self.read if call.seen else 0.0)
        call.seen += 1
        if call.seen == call.pending:
            self.push(call.read_until, self.phase_done, call)

    def phase_done(self, t: float, call: _Call) -> None:
        call.phase += 1
        if call.phase < KINDS[call.kind].phases:
            self.fan_out(t, call)
            return
        self.done += 1
        if self.done == self.warm:
            self.t_warm, self.busy_at_warm = t, self.busy(t)
        elif self.done > self.warm:
            self.lat.append(t - call.start)
            self.keys_done += call.batch
        if call.client >= 0:
            self.push(t + self.pause(), self.issue, call.client)

    def run(self) -> Result:
        m = self.m
        if m.rate > 0:
            self.push(self.rng.expovariate(m.rate), self.issue, -1)
        else:
            for c in range(m.clients):
                self.push(self.pause(), self.issue, c)
        t = 0.0
        while self.events and self.done < m.calls:
            t, _, fn, arg = heapq.heappop(self.events)
            fn(t, arg)
        span = t - self.t_warm
        busy = (self.busy(t) - self.busy_at_warm) / (span * m.shards) if span > 0 else 0.0
        rate = len(self.lat) / span if span > 0 else 0.0
        bound = "shards" if busy >= 0.9 else "arrivals" if m.rate > 0 else "clients"
        return Result(m.shards, self.touched / self.fanouts if self.fanouts else 0.0, rate,
                      self.keys_done / span if span > 0 else 0.0, busy, Latency.of(self.lat),
                      sum(self.lat) / len(self.lat) if self.lat else 0.0, bound)


def simulate(m: Model) -> Result:
    """One model's projection (the same model and seed: the same result)."""
    return _Sim(m).run()


def parse_kinds(text: str) -> list[tuple[str, float, int]]:
    """'lookup' or 'lookup=0.5,put=0.2:64,...' -> [(kind, share, keys a call; 0: --batch)]."""
    out = []
    for part in text.split(","):
        name, _, rest = part.partition("=")
        share, _, batch = rest.partition(":")
        name = name.strip()
        if name not in KINDS:
            raise ValueError(f"unknown kind {name!r}: one of {', '.join(KINDS)}")
        try:
            out.append((name, float(share) if share else 1.0, int(batch) if batch else 0))
        except ValueError:
            raise ValueError(f"--kind {part!r}: expected KIND=SHARE[:KEYS], like put=0.2:64") \
                from None
        if out[-1][1] <= 0 or out[-1][2] < 0:
            raise ValueError(f"--kind {part!r}: the share must be above 0, the keys 1 or more")
    return out


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=f"python -m {MODULE}",
                                description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--shards", default="1,2,4,8,16,32,64", help="shard counts, comma-separated")
    p.add_argument("--kind", default="lookup",
                   help=f"one of {', '.join(KINDS)}, or a mix like lookup=0.5,put=0.2")
    p.add_argument("--batch", type=int, default=128, help="keys per call")
    p.add_argument("--clients", type=int, default=64, help="closed-loop clients")
    p.add_argument("--rate", type=float, default=0.0,
                   help="open loop instead: calls per second, Poisson arrivals")
    p.add_argument("--think-us", type=float, default=0.0,
                   help="closed loop: a client's mean pause between calls, µs")
    p.add_argument("--call-us", type=float, default=DEFAULT_CALL_US,
                   help="a shard's CPU per message, µs (default %(default)s)")
    for name, kind in KINDS.items():
        p.add_argument(f"--{name}-key-us", type=float, default=kind.key_us,
                       help=f"a shard's CPU per key of a {name}, µs (default %(default)s)")
    p.add_argument("--rtt-us", type=float, default=DEFAULT_RTT_US,
                   help="the round trip of the cheapest call, µs (default %(default)s)")
    p.add_argument("--send-us", type=float, default=DEFAULT_SEND_US,
                   help="the client's time to send each further shard's request, µs "
                        "(default %(default)s)")
    p.add_argument("--read-us", type=float, default=DEFAULT_READ_US,
                   help="the client's time to read each further shard's reply, µs "
                        "(default %(default)s)")
    p.add_argument("--spread", choices=["hash", "even"], default="hash",
                   help="hash: each key to a random shard; even: min(N, batch) shards")
    p.add_argument("--service-cv", type=float, default=1.0,
                   help="coefficient of variation of a shard's service time (0: fixed)")
    p.add_argument("--calls", type=int, default=10000, help="calls simulated per shard count")
    p.add_argument("--seed", type=int, default=1)
    return p


def models(args: argparse.Namespace) -> list[Model]:
    kinds = parse_kinds(args.kind)
    key_us = {name: getattr(args, f"{name}_key_us") for name in KINDS}
    return [Model(shards=int(n), batch=args.batch, kinds=kinds, call_us=args.call_us,
                  key_us=key_us, rtt_us=args.rtt_us, send_us=args.send_us,
                  read_us=args.read_us, clients=args.clients,
                  rate=args.rate, think_us=args.think_us, spread=args.spread,
                  service_cv=args.service_cv, calls=args.calls, seed=args.seed)
            for n in args.shards.split(",")]


def render(ms: Sequence[Model], results: Sequence[Result]) -> str:
    m = ms[0]
    load = (f"open loop, {fmt_rate(m.rate)} calls" if m.rate > 0 else
            f"{m.clients} closed-loop clients, think {m.think_us:g} µs")
    kinds = ", ".join(f"{k} {w:g} x {m.keys(b)} keys" for k, w, b in m.kinds)
    costs = ", ".join(f"{k} {m.per_key(k):g}" for k, _, _ in m.kinds)
    head = (f"{kinds} a call ({m.spread}); {load}\n"
            f"shard service: {m.call_us:g} µs per message + per key ({costs}) µs, cv "
            f"{m.service_cv:g}; round trip {m.rtt_us:g} µs; client {m.send_us:g} µs to send "
            f"and {m.read_us:g} µs to read each further message\n")
    return head + "\n" + format_table(HEADERS, [r.row() for r in results])


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        ms = models(args)
    except ValueError as exc:
        parser.error(str(exc))
    results = [simulate(m) for m in ms]
    print(render(ms, results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
