"""`bench replay --ssd SIZE --mooncake`: the Mooncake run with its SSD offload on is
planned beside ours, its settings follow SIZE, and a wheel without offload gets a
sentence in the report instead of a crash (no processes started here)."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from bench import replay
from bench.clusters import (
    MooncakeSSDUnavailable,
    check_mooncake_offload,
    dir_bytes,
    mooncake_offload_env,
)
from bench.lru_sim import Request, Sizing

TRACE_LINE = '{"timestamp": %d, "input_length": 1024, "output_length": 1, "hash_ids": [%d, %d]}\n'


def parse(*argv: str) -> argparse.Namespace:
    return replay.build_parser().parse_args(list(argv))


def sizing(args: argparse.Namespace) -> Sizing:
    return Sizing(args.capacity_blocks, args.block_bytes, args.nodes)


def test_ssd_with_mooncake_plans_a_mooncake_run_with_offload_of_that_size() -> None:
    args = parse("--ssd", "256MiB", "--mooncake")
    runs = replay.plan_runs(args, sizing(args))
    mc = [r for r in runs if r.system == replay.MC]
    assert [r.ssd_per_node for r in mc] == [0, 256 << 20]
    assert mc[0].dram_per_node == mc[1].dram_per_node == sizing(args).pool_bytes
    assert mc[1].label == "mooncake 1n c1 +SSD 256.0 MiB"
    ours_ssd = [r for r in runs if r.system == replay.OURS and r.ssd_per_node]
    assert len(ours_ssd) == 1


@pytest.mark.parametrize("argv", [["--ssd", "64MiB"], ["--mooncake"], []])
def test_no_mooncake_ssd_run_without_both_options(argv: list[str]) -> None:
    args = parse(*argv)
    assert not [r for r in replay.plan_runs(args, sizing(args))
                if r.system == replay.MC and r.ssd_per_node]


def test_offload_settings_carry_the_path_and_the_capacity(tmp_path: Path) -> None:
    env = mooncake_offload_env(tmp_path, 256 << 20)
    assert env["MOONCAKE_OFFLOAD_FILE_STORAGE_PATH"] == str(tmp_path)
    assert env["MOONCAKE_OFFLOAD_TOTAL_SIZE_LIMIT_BYTES"] == str(256 << 20)
    # Small buckets: with the defaults, small objects never fill one and stay off disk.
    assert int(env["MOONCAKE_OFFLOAD_BUCKET_KEYS_LIMIT"]) <= 64


def test_a_wheel_without_offload_is_refused_with_a_sentence() -> None:
    with pytest.raises(MooncakeSSDUnavailable, match="no --enable_offload flag"):
        check_mooncake_offload("  -eviction_ratio (Ratio ...)", "enable_ssd_offload: ...")
    with pytest.raises(MooncakeSSDUnavailable, match="takes no enable_ssd_offload"):
        check_mooncake_offload("  -enable_offload (Enable offload availability)", "setup(...)")
    check_mooncake_offload("  -enable_offload (Enable offload availability)",
                           "enable_ssd_offload: Enable SSD offload")


def test_dir_bytes_counts_files_below(tmp_path: Path) -> None:
    (tmp_path / "a").write_bytes(b"x" * 10)
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "b").write_bytes(b"y" * 5)
    assert dir_bytes(tmp_path) == (2, 15)


def test_the_report_says_why_the_mooncake_ssd_run_is_missing(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    trace = tmp_path / "t.jsonl"
    trace.write_text("".join(TRACE_LINE % (i, i % 3, 10 + i) for i in range(6)))
    args = parse("--trace", str(trace), "--ssd", "1MiB", "--mooncake", "--block-bytes", "4KiB",
                 "--capacity-blocks", "8")
    args.trace = trace

    def fake_run(a: argparse.Namespace, spec: replay.RunSpec, requests: list[Request],
                 tmp: Path) -> replay.RunResult:
        if spec.system == replay.MC and spec.ssd_per_node:
            raise MooncakeSSDUnavailable("Mooncake's SSD offload cannot be turned on here: "
                                         "because\nlog tail")
        recs = [replay.Rec(i, i * 0.1, i * 0.1 + 0.05, 0, 0, 0.001, 0.0, 0.002, 0.0, 0, 0, 0)
                for i in range(len(requests))]
        return replay.RunResult(spec, recs, 1.0, [spec.dram_per_node])

    monkeypatch.setattr(replay, "run_ours", fake_run)
    monkeypatch.setattr(replay, "run_mooncake", fake_run)
    assert replay.orchestrate(args, tmp_path) == 0
    out = capsys.readouterr()
    sentence = ("mooncake 1n c1 +SSD 1.0 MiB: not run. Mooncake's SSD offload cannot be turned "
                "on here: because")
    assert sentence in out.out
    assert "log tail" not in out.out
    assert sentence in out.err
    assert "mooncake 1n c1 (replayed)" in out.out
    assert "kvstore 1n c1 +SSD 1.0 MiB (replayed)" in out.out
