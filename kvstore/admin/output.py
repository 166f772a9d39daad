"""How admin commands print: aligned tables, text bars, progress, keys as escaped text.

Everything here is pure (strings in, strings out) except `ProgressBar` and `emit_json`,
which write to a stream they are given.
"""

from __future__ import annotations

import json
import re
import sys
import time
from collections.abc import Sequence
from typing import Any, TextIO

from kvstore.errors import InvalidArgument
from kvstore.units import format_size

# ------------------------------------------------------------------ keys

_PLAIN = frozenset(range(0x20, 0x7F)) - {ord("\\")}
_NAMED = {ord("\\"): "\\\\", ord("\t"): "\\t", ord("\n"): "\\n", ord("\r"): "\\r"}
_ESCAPE = re.compile(rb"\\(x[0-9a-fA-F]{2}|[\\tnr0'\"]|.|$)", re.DOTALL)
_UNESCAPE = {b"\\": b"\\", b"t": b"\t", b"n": b"\n", b"r": b"\r", b"0": b"\0", b"'": b"'",
             b'"': b'"'}


def escape_key(key: bytes) -> str:
    """Keys are bytes: printable ASCII as is, the rest as \\xNN (\\t \\n \\r \\\\), so
    every key prints on one line and `parse_key` turns the text back into the key."""
    return "".join(chr(b) if b in _PLAIN else _NAMED.get(b, f"\\x{b:02x}") for b in key)


def parse_key(text: str, hex_input: bool = False) -> bytes:
    """A key from the command line: escaped text as `escape_key` prints it (other
    characters as UTF-8), or hex digits with `hex_input`."""
    if hex_input:
        try:
            return bytes.fromhex(text)
        except ValueError:
            raise InvalidArgument(f"{text!r} is not hex; write the key as hex digits, e.g. 6b6579") from None
    raw = text.encode()

    def one(m: re.Match[bytes]) -> bytes:
        code = m.group(1)
        if code.startswith(b"x") and len(code) == 3:
            return bytes([int(code[1:], 16)])
        if code in _UNESCAPE:
            return _UNESCAPE[code]
        raise InvalidArgument(
            f"bad escape \\{code.decode(errors='replace')} in key {text!r}; use \\xNN, \\\\, "
            "\\t, \\n, \\r, or pass --hex")

    return _ESCAPE.sub(one, raw)


def key_json(key: bytes) -> dict[str, str]:
    return {"key": escape_key(key), "key_hex": key.hex()}


# ------------------------------------------------------------------ tables and numbers


def table(rows: Sequence[Sequence[str]], right: Sequence[int] = ()) -> str:
    """Columns padded to their widest cell; columns in `right` aligned right."""
    if not rows:
        return ""
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    out = []
    for r in rows:
        cells = [c.rjust(w) if i in right else c.ljust(w)
                 for i, (c, w) in enumerate(zip(r, widths, strict=True))]
        out.append("  ".join(cells).rstrip())
    return "\n".join(out)


def size(n: float) -> str:
    return format_size(n)


def pct(part: float, whole: float) -> str:
    return f"{100.0 * part / whole:.1f}%" if whole else "-"


def ratio_text(part: int, whole: int) -> str:
    return f"{100.0 * part / whole:.1f}%" if whole else "n/a (no lookups)"


def seconds(s: float) -> str:
    if s < 60:
        return f"{s:.1f}s"
    if s < 3600:
        return f"{s / 60:.1f}m"
    return f"{s / 3600:.1f}h"


def bar(used: int, pinned: int, capacity: int, width: int = 30) -> str:
    """`[###=====.........]`: # pinned, = used but evictable, . free."""
    if capacity <= 0:
        return "[" + " " * width + "]"
    pinned = min(pinned, used)
    p = round(width * pinned / capacity)
    u = max(round(width * used / capacity) - p, 0)
    if used > pinned and u == 0 and p < width:
        u = 1  # some use, however small, shows
    u = min(u, width - p)
    return "[" + "#" * p + "=" * u + "." * (width - p - u) + "]"


BAR_LEGEND = "# pinned  = used  . free"


def emit_json(data: Any, stream: TextIO | None = None) -> None:
    print(json.dumps(data, indent=2, sort_keys=False), file=stream or sys.stdout)


# ------------------------------------------------------------------ progress


class ProgressBar:
    """`label [########..........]  40%  400/1000 note` on stderr.

    On a terminal it redraws in place (at most 10 times a second); otherwise (a log, a
    pipe) it prints a line at each quarter and at the end, so logs stay short.
    """

    def __init__(self, label: str, total: int, *, stream: TextIO | None = None,
                 enabled: bool = True, width: int = 30, in_bytes: bool = False) -> None:
        self.label = label
        self.in_bytes = in_bytes
        self.total = max(total, 0)
        self.stream = stream or sys.stderr
        self.enabled = enabled
        self.width = width
        self._tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self._last_draw = 0.0
        self._last_quarter = -1
        self._done = 0
        self._note = ""
        self._last_line = ""

    def render(self) -> str:
        total = max(self.total, self._done)
        frac = self._done / total if total else 1.0
        filled = round(frac * self.width)
        amount = (f"{size(self._done)} / {size(total)}" if self.in_bytes
                  else f"{self._done}/{total}")
        line = f"{self.label} [{'#' * filled}{'.' * (self.width - filled)}] {100 * frac:3.0f}%  {amount}"
        return f"{line}  {self._note}" if self._note else line

    def update(self, done: int, note: str = "", *, total: int | None = None) -> None:
        if total is not None:
            self.total = total
        self._done = done
        self._note = note
        if not self.enabled:
            return
        if self._tty:
            now = time.monotonic()
            if now - self._last_draw >= 0.1:
                self._last_draw = now
                self.stream.write("\r\x1b[K" + self.render())
                self.stream.flush()
            return
        total_ = max(self.total, self._done)
        quarter = int(4 * self._done / total_) if total_ else 4
        if quarter > self._last_quarter and quarter < 4:
            self._last_quarter = quarter
            self._print(self.render())

    def finish(self, note: str = "") -> None:
        if note:
            self._note = note
        if not self.enabled:
            return
        if self._tty:
            self.stream.write("\r\x1b[K" + self.render() + "\n")
        else:
            self._print(self.render())
        self.stream.flush()

    def _print(self, line: str) -> None:
        """One line of a log or pipe; the same line twice in a row (nothing moved since,
        or the end reached at a quarter) is printed once."""
        if line != self._last_line:
            self._last_line = line
            print(line, file=self.stream)
