"""Trace parsing for the replay benchmark, and its pure report helpers."""

from __future__ import annotations

import gzip
import hashlib
import itertools
import json
import lzma
import re
from pathlib import Path
from typing import Any

import pytest

from bench.lru_sim import Request, iter_trace, parse_request, read_trace
from bench.progress import ProgressBar, render_bar
from bench.replay import DEFAULT_TRACE, Dispatcher, Rec, pp, prefill_estimate, rolling, summarize

LINE = {"timestamp": 27482, "input_length": 6955, "output_length": 52,
        "hash_ids": [46, 47, 48, 49, 50, 51, 52, 53, 54, 55, 56, 57, 58, 2353]}


def test_parse_a_mooncake_record() -> None:
    r = parse_request(LINE)
    assert r == Request(27482, 6955, 52, (46, 47, 48, 49, 50, 51, 52, 53, 54, 55, 56, 57, 58, 2353))
    assert r.hit_tokens(0) == 0
    assert r.hit_tokens(3) == 1536
    assert r.hit_tokens(14) == 6955      # the last block is partial
    assert parse_request({"timestamp": 0, "input_length": 5, "hash_ids": [1]}).output_length == 0


@pytest.mark.parametrize("bad", [
    {"input_length": 1, "hash_ids": [1]},
    {"timestamp": 0, "hash_ids": [1]},
    {"timestamp": 0, "input_length": 1},
    {"timestamp": 0, "input_length": 1, "hash_ids": "1,2"},
    {"timestamp": 0, "input_length": 1, "hash_ids": [1, "2"]},
    {"timestamp": 0, "input_length": 1, "hash_ids": [True]},
    {"timestamp": -1, "input_length": 1, "hash_ids": [1]},
    {"timestamp": 0, "input_length": "7", "hash_ids": [1]},
    [1, 2],
])
def test_malformed_records_are_refused_with_their_place(bad: object) -> None:
    with pytest.raises(ValueError, match=r"t\.jsonl:3"):
        parse_request(bad, "t.jsonl:3")  # type: ignore[arg-type]


def test_iter_trace_skips_blank_lines_honours_limit_and_names_bad_lines() -> None:
    lines = [json.dumps(LINE), "", "  ", json.dumps({**LINE, "timestamp": 1}),
             json.dumps({**LINE, "timestamp": 2})]
    assert [r.timestamp_ms for r in iter_trace(lines)] == [27482, 1, 2]
    assert [r.timestamp_ms for r in iter_trace(lines, limit=2)] == [27482, 1]
    with pytest.raises(ValueError, match="x:2: not JSON"):
        list(iter_trace([json.dumps(LINE), "{oops"], name="x"))


def test_read_trace_from_a_file(tmp_path: Path) -> None:
    p = tmp_path / "t.jsonl"
    p.write_text("\n".join(json.dumps({**LINE, "timestamp": i}) for i in range(5)) + "\n")
    assert len(read_trace(p)) == 5
    assert [r.timestamp_ms for r in read_trace(p, limit=3)] == [0, 1, 2]


def test_dispatcher_hands_out_trace_order_once_and_counts_finished() -> None:
    q = Dispatcher(5)
    assert [q.take(0), q.take(1), q.take(0)] == [0, 1, 2]
    assert q.finished == 1                 # replayer 0 asked again: its first is done
    assert [q.take(1), q.take(1), q.take(0), q.take(1)] == [3, 4, None, None]
    assert q.finished == 5
    assert Dispatcher(0).take(0) is None


REAL = Path(__file__).resolve().parents[2] / "bench" / "data" / "conversation_trace.jsonl.xz"


def test_the_shipped_conversation_trace_parses_whole() -> None:
    assert REAL == DEFAULT_TRACE                 # what the benchmark replays by default
    reqs = read_trace(REAL)
    assert len(reqs) == 12031
    assert all(len(r.hash_ids) == -(-r.input_length // 512) for r in reqs)
    assert all(a.timestamp_ms <= b.timestamp_ms for a, b in itertools.pairwise(reqs))
    assert read_trace(REAL, limit=500) == reqs[:500]


def test_the_shipped_trace_is_the_one_its_readme_names() -> None:
    """bench/data/README.md gives the source's SHA-256: the file is that trace, unmodified."""
    readme = (REAL.parent / "README.md").read_text()
    (sha,) = re.findall(r"`([0-9a-f]{64})`", readme)
    with lzma.open(REAL) as f:
        assert hashlib.sha256(f.read()).hexdigest() == sha
    assert "Apache License, Version 2.0" in readme and (REAL.parent / "LICENSE-APACHE").is_file()


@pytest.mark.parametrize("compress", [gzip.open, lzma.open, open])
def test_read_trace_opens_compressed_files(tmp_path: Path, compress: Any) -> None:
    suffix = {gzip.open: ".gz", lzma.open: ".xz"}.get(compress, "")
    p = tmp_path / f"t.jsonl{suffix}"
    with compress(p, "wt") as f:
        f.write("\n".join(json.dumps({**LINE, "timestamp": i}) for i in range(4)) + "\n")
    assert [r.timestamp_ms for r in read_trace(p)] == [0, 1, 2, 3]


# -- report helpers -------------------------------------------------------------------------


def test_rolling_rate() -> None:
    assert rolling([1, 0, 1, 1], [2, 2, 2, 2], 2) == [0.5, 0.25, 0.25, 0.5]
    assert rolling([], [], 5) == []
    assert rolling([0.0], [0.0], 3) == [0.0]


def _rec(pos: int, hits: int, lookup: float = 0.001, load: float = 0.002) -> Rec:
    return Rec(pos, 0.0, 0.1, hits, hits, lookup, load, 0.0, 0.0, 0, 0, 0)


def test_summary_and_prefill_estimate() -> None:
    reqs = [Request(0, 1024, 1, (1, 2)), Request(1, 2048, 1, (1, 2, 3, 4))]
    recs = [_rec(0, 0), _rec(1, 2)]
    s = summarize("x", reqs, [r.hits for r in recs])
    assert (s.blocks, s.hit_blocks, s.tokens, s.hit_tokens) == (6, 2, 3072, 1024)
    assert s.block_rate == pytest.approx(2 / 6) and s.token_rate == pytest.approx(1 / 3)
    pf = prefill_estimate(reqs, recs, rate=1000.0)
    # request 0: no hit, pays the lookup and the (empty) load; request 1: 1.024 s saved.
    assert pf.compute_avoided == pytest.approx(1.024)
    assert pf.saved_mean == pytest.approx(((-0.003) + (1.024 - 0.003)) / 2)
    assert pf.saved_p50_hit == pytest.approx(1.021)
    assert pf.share == pytest.approx((1.024 - 0.006) / 3.072)
    assert pp(0.2034, 0.2034) == "+0.00 pp" and pp(0.21, 0.2) == "+1.00 pp"
    assert pp(0.2033, 0.20330001) == "+0.00 pp" and pp(0.2, 0.21) == "-1.00 pp"


def test_progress_bar_text() -> None:
    line = render_bar("run", 50, 200, 2.0, width=10)
    assert line.startswith("run [##........]  50/200  25%  25 req/s  ETA 6 s")
    assert render_bar("run", 200, 200, 4.0, width=4).endswith("100%  50 req/s  4 s")
    assert "0 req/s" in render_bar("run", 0, 0, 0.0)


class _Sink:
    def __init__(self) -> None:
        self.text = ""

    def write(self, s: str) -> None:
        self.text += s

    def flush(self) -> None:
        pass

    def isatty(self) -> bool:
        return False


def test_progress_bar_off_a_terminal_prints_each_tenth_once() -> None:
    sink = _Sink()
    bar = ProgressBar(100, "r", stream=sink)  # type: ignore[arg-type]
    for i in range(101):
        bar.update(i)
    bar.close()
    lines = sink.text.splitlines()
    assert len(lines) == 11 and "100/100" in lines[-1] and "\r" not in sink.text
