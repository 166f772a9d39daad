"""A dependency-free progress bar on stderr: redrawn in place with \\r on a terminal,
one line per tenth of the way elsewhere (logs, CI)."""

from __future__ import annotations

import sys
import time
from typing import TextIO


def render_bar(label: str, done: int, total: int, elapsed: float, width: int = 30) -> str:
    """`label [#######.......]  700/2000  35%  120 req/s  ETA 11 s` (pure, for tests)."""
    frac = min(1.0, done / total) if total else 1.0
    filled = round(frac * width)
    rate = done / elapsed if elapsed > 0 else 0.0
    eta = (total - done) / rate if rate > 0 else None
    tail = f"ETA {eta:.0f} s" if eta is not None and done < total else f"{elapsed:.0f} s"
    return (f"{label} [{'#' * filled}{'.' * (width - filled)}] {done:>{len(str(total))}}/{total} "
            f"{frac * 100:3.0f}%  {rate:.0f} req/s  {tail}")


class ProgressBar:
    def __init__(self, total: int, label: str, stream: TextIO | None = None,
                 min_interval: float = 0.2) -> None:
        self.total = total
        self.label = label
        self.stream = stream if stream is not None else sys.stderr
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self.min_interval = min_interval
        self.t0 = time.monotonic()
        self._last_draw = 0.0
        self._last_decile = -1
        self.done = 0

    def update(self, done: int, force: bool = False) -> None:
        self.done = done
        now = time.monotonic()
        if self.tty:
            if force or now - self._last_draw >= self.min_interval:
                self._last_draw = now
                self.stream.write("\r" + render_bar(self.label, done, self.total, now - self.t0))
                self.stream.flush()
            return
        decile = int(10 * done / self.total) if self.total else 10
        if decile > self._last_decile:
            self._last_decile = decile
            self.stream.write(render_bar(self.label, done, self.total, now - self.t0) + "\n")
            self.stream.flush()

    def close(self) -> None:
        self.update(self.done, force=True)
        if self.tty:
            self.stream.write("\n")
            self.stream.flush()
