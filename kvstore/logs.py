"""Structured logs: one line per event, as a JSON object or as text with key=value pairs.

Every kvstore process logs through the standard `logging` module; `setup_logging`
(called by `kvstore --log-format json|text --log-level LEVEL ...`) decides the shape:

    json  {"ts": "2025-06-01T12:00:00.123Z", "level": "info", "logger": "kvstore.master.daemon",
           "msg": "live settings changed: evict_high=0.7", "event": "config_applied", ...}
    text  2025-06-01T12:00:00.123Z INFO kvstore.master.daemon live settings changed: ... event=config_applied

Fields passed with `extra={...}` become keys of the JSON object (or key=value pairs),
so a log shipper can filter on them without parsing sentences. A traceback stays on the
same line (a JSON string, or an escaped value in text): one event, one line.

The Transfer Engine's own C++ logging writes to stderr directly and is not shaped here.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time
from datetime import UTC, datetime
from typing import Any, TextIO

FORMATS = ("text", "json")
ENV_FORMAT = "KVSTORE_LOG_FORMAT"

# Attributes every LogRecord has; anything else on a record came from `extra=`.
_RESERVED = frozenset(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {
    "message", "asctime", "taskName"}


def _timestamp(record: logging.LogRecord) -> str:
    t = datetime.fromtimestamp(record.created, tz=UTC)
    return t.strftime("%Y-%m-%dT%H:%M:%S.") + f"{t.microsecond // 1000:03d}Z"


def extra_fields(record: logging.LogRecord) -> dict[str, Any]:
    return {k: v for k, v in record.__dict__.items() if k not in _RESERVED and not k.startswith("_")}


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ts, level, logger, msg, then the extra fields."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "ts": _timestamp(record),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for key, value in extra_fields(record).items():
            out.setdefault(key, value)
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        if record.stack_info:
            out["stack"] = self.formatStack(record.stack_info)
        return json.dumps(out, default=str)


def _text_value(value: Any) -> str:
    text = value if isinstance(value, str) else json.dumps(value, default=str)
    if not text or any(c in text for c in ' "=\n\r\t'):
        return json.dumps(text)
    return text


class TextFormatter(logging.Formatter):
    """`ts LEVEL logger msg key=value ...`, on one line."""

    def format(self, record: logging.LogRecord) -> str:
        msg = record.getMessage().replace("\n", "\\n")
        parts = [_timestamp(record), record.levelname, record.name, msg]
        parts += [f"{k}={_text_value(v)}" for k, v in extra_fields(record).items()]
        if record.exc_info:
            parts.append("exc=" + _text_value(self.formatException(record.exc_info)))
        if record.stack_info:
            parts.append("stack=" + _text_value(self.formatStack(record.stack_info)))
        return " ".join(parts)


def default_format() -> str:
    """The format from $KVSTORE_LOG_FORMAT (so `kvstore up` children share it), or text."""
    value = os.environ.get(ENV_FORMAT, "text").lower()
    return value if value in FORMATS else "text"


class RateLimit(logging.Filter):
    """At most `burst` records per `period` seconds from loggers under `prefix`; then one
    line saying how many were dropped. grpc's server logs an ERROR with a traceback for
    every request that does not deserialize, so anyone who can reach a port could
    otherwise fill the disk with logs."""

    def __init__(self, prefix: str = "grpc", burst: int = 20, period: float = 60.0,
                 clock: Any = None) -> None:
        super().__init__()
        self.prefix = prefix
        self.burst = burst
        self.period = period
        self.clock = clock or time.monotonic
        self._start = -float("inf")
        self._count = 0
        self.dropped = 0

    def filter(self, record: logging.LogRecord) -> bool:
        if not record.name.startswith(self.prefix):
            return True
        now = self.clock()
        if now - self._start >= self.period:
            if self.dropped:
                record.msg = (f"[{self.dropped} more {self.prefix} log records dropped in the last "
                              f"{self.period:.0f} s] {record.msg}")
            self._start, self._count, self.dropped = now, 0, 0
        self._count += 1
        if self._count > self.burst:
            self.dropped += 1
            return False
        return True


def setup_logging(level: str = "info", fmt: str = "text", stream: TextIO | None = None) -> None:
    """Send every logger's records to `stream` (stderr) as `fmt` lines at `level`."""
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    handler.addFilter(RateLimit())
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(getattr(logging, level.upper(), logging.INFO))
