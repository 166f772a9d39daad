"""What the admin CLI prints: escaped keys, tables, bars, progress; and its parser."""

from __future__ import annotations

import io

import pytest

from kvstore.admin.output import ProgressBar, bar, escape_key, parse_key, table
from kvstore.cli import build_parser
from kvstore.errors import InvalidArgument


@pytest.mark.parametrize("key", [
    b"plain-key", b"bin\x00\xff", b"back\\slash", b"tab\tnl\nret\r", bytes(range(256)),
    b"quote'\"", "ünï".encode(),
])
def test_escaped_keys_read_back_as_the_same_bytes(key: bytes) -> None:
    text = escape_key(key)
    assert text.isprintable() and text.isascii()
    assert parse_key(text) == key
    assert parse_key(key.hex(), hex_input=True) == key


def test_key_input_errors_are_sentences() -> None:
    assert parse_key("ünï") == "ünï".encode()  # typed non-ASCII: its UTF-8
    with pytest.raises(InvalidArgument, match="bad escape"):
        parse_key("a\\q")
    with pytest.raises(InvalidArgument, match="bad escape"):
        parse_key("trailing\\")
    with pytest.raises(InvalidArgument, match="not hex"):
        parse_key("xyz", hex_input=True)


def test_table_aligns_columns() -> None:
    out = table([["NAME", "N"], ["a", "10"], ["long-name", "2"]], right=[1])
    assert out.splitlines() == ["NAME        N", "a          10", "long-name   2"]


def test_bar_shows_pinned_used_and_free() -> None:
    assert bar(50, 20, 100, width=10) == "[##===.....]"
    assert bar(0, 0, 100, width=10) == "[..........]"
    assert bar(1, 0, 1000, width=10) == "[=.........]"  # a little use still shows
    assert bar(100, 100, 100, width=10) == "[##########]"
    assert bar(5, 0, 0, width=4) == "[    ]"


def test_progress_on_a_pipe_prints_quarters_only() -> None:
    out = io.StringIO()
    p = ProgressBar("moving", 100, stream=out)
    for i in range(101):
        p.update(i)
    p.finish("done")
    lines = out.getvalue().splitlines()
    assert [ln.split("]")[1].split("%")[0].strip() for ln in lines] == ["0", "25", "50", "75", "100"]
    assert lines[-1].endswith("100/100  done")
    silent = io.StringIO()
    q = ProgressBar("x", 10, stream=silent, enabled=False)
    q.update(5)
    q.finish()
    assert silent.getvalue() == ""


@pytest.mark.parametrize("argv", [
    ["status"], ["nodes", "--json"], ["capacity", "--master", "h:1"], ["evictions"],
    ["keys", "--prefix", "a", "--limit", "5"], ["inspect", "k1", "k2", "--hex"],
    ["evict", "--to", "0.5"], ["drain", "node-1", "--no-move", "--wait", "3"],
    ["drain", "node-1", "--cancel"], ["config", "get"], ["config", "set", "evict_high", "0.8"],
    ["config", "unset", "evict_high"],
])
def test_every_admin_subcommand_parses(argv: list[str]) -> None:
    args = build_parser().parse_args(["--log-format", "json", *argv])
    assert args.etcd == "127.0.0.1:2379" and callable(args.func) and args.log_format == "json"
