"""`kvstore bench NAME ARGS...` hands everything after NAME to `python -m bench.NAME`."""

from __future__ import annotations

import pytest

from kvstore.cli import build_parser, cmd_bench


def test_bench_subcommand_passes_the_remaining_args() -> None:
    args = build_parser().parse_args(["bench", "replay", "--limit", "2000", "--mooncake"])
    assert args.name == "replay"
    assert args.args == ["--limit", "2000", "--mooncake"]
    assert args.func is cmd_bench
    assert build_parser().parse_args(["bench", "replay"]).args == []


@pytest.mark.parametrize("name", ["no_such_bench", "../kvstore/cli", "replay.py"])
def test_bench_refuses_what_is_not_a_benchmark(name: str, capsys: pytest.CaptureFixture[str]) -> None:
    args = build_parser().parse_args(["bench", name])
    assert cmd_bench(args) == 2
    assert "no benchmark" in capsys.readouterr().err
