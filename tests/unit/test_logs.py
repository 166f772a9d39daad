"""Structured logging: one line per event, JSON or text, extra fields kept."""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterator

import pytest

from kvstore.logs import default_format, setup_logging


@pytest.fixture
def restore_root() -> Iterator[None]:
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    for h in list(root.handlers):
        root.removeHandler(h)
    for h in handlers:
        root.addHandler(h)
    root.setLevel(level)


def test_json_lines_carry_ts_level_logger_msg_and_extras(restore_root: None) -> None:
    out = io.StringIO()
    setup_logging("info", "json", out)
    log = logging.getLogger("kvstore.test")
    log.info("node %s is gone", "n1", extra={"node": "n1", "objects_lost": 3})
    log.debug("not shown at info")
    try:
        raise ValueError("boom\nsecond line")
    except ValueError:
        log.exception("tick failed")
    lines = out.getvalue().splitlines()
    assert len(lines) == 2  # the traceback stays inside its event
    first, second = (json.loads(line) for line in lines)
    assert first["msg"] == "node n1 is gone" and first["level"] == "info"
    assert first["logger"] == "kvstore.test"
    assert (first["node"], first["objects_lost"]) == ("n1", 3)
    assert first["ts"].endswith("Z") and "T" in first["ts"]
    assert second["level"] == "error" and "ValueError: boom" in second["exc"]


def test_text_lines_are_one_per_event_with_key_values(restore_root: None) -> None:
    out = io.StringIO()
    setup_logging("debug", "text", out)
    log = logging.getLogger("kvstore.test")
    log.debug("two\nlines", extra={"changed": {"evict_high": 0.5}, "who": "a b", "n": 2})
    try:
        raise RuntimeError("x")
    except RuntimeError:
        log.warning("failed", exc_info=True)
    lines = out.getvalue().splitlines()
    assert len(lines) == 2
    assert " DEBUG kvstore.test two\\nlines " in lines[0]
    assert 'changed="{\\"evict_high\\": 0.5}"' in lines[0]  # a JSON value, quoted
    assert 'who="a b"' in lines[0] and "n=2" in lines[0]
    assert "WARNING" in lines[1] and "exc=" in lines[1] and "RuntimeError" in lines[1]


def test_the_default_format_comes_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KVSTORE_LOG_FORMAT", "JSON")
    assert default_format() == "json"
    monkeypatch.setenv("KVSTORE_LOG_FORMAT", "xml")
    assert default_format() == "text"
    monkeypatch.delenv("KVSTORE_LOG_FORMAT")
    assert default_format() == "text"


def test_grpc_records_are_rate_limited() -> None:
    """A flood of grpc errors (one per malformed request) stops after a burst; the next
    period's first record says how many were dropped; our own records always pass."""
    import logging

    from kvstore.logs import RateLimit

    now = [0.0]
    f = RateLimit(burst=3, period=60.0, clock=lambda: now[0])

    def rec(name: str, msg: str = "boom") -> logging.LogRecord:
        return logging.LogRecord(name, logging.ERROR, __file__, 1, msg, None, None)

    passed = [f.filter(rec("grpc._cython.cygrpc")) for _ in range(10)]
    assert passed == [True] * 3 + [False] * 7
    assert all(f.filter(rec("kvstore.master.daemon")) for _ in range(10))
    now[0] = 61.0
    r = rec("grpc._cython.cygrpc", "again")
    assert f.filter(r)
    assert r.getMessage() == "[7 more grpc log records dropped in the last 60 s] again"
