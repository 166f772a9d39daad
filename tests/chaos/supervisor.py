"""A small process supervisor with systemd's Restart=always semantics, for the chaos suite.

Each `Daemon` is one command line with one log; whenever its process ends, for whatever
reason (a crash, our kill -9, a clean exit after SIGTERM, exit 3 of a deposed leader),
the supervisor starts the very same command again, with the same data directories,
after `restart_sec` (systemd's RestartSec, default 100 ms) or after a longer delay the
operator event asks for (`signal(..., restart_after=...)`). `hold()` keeps a daemon down
until `release()` (etcd "down for 10 s"). Exits that no event caused are recorded: the
checks count them (a daemon must not exit because etcd was away).

Only processes this supervisor started are ever signalled, by pid; `stop_all` ends them
in reverse start order (SIGCONT first: a stopped process does not act on SIGTERM).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

RESTART_SEC = 0.1  # systemd's default RestartSec
STOP_TIMEOUT = 15.0  # s a daemon gets to stop on SIGTERM before SIGKILL (TimeoutStopSec)


@dataclass
class Exit:
    at: float  # time.monotonic() the supervisor saw it
    code: int
    planned: bool  # an event signalled this incarnation


@dataclass
class Daemon:
    name: str
    cmd: list[str]
    log: Path
    restart_sec: float = RESTART_SEC
    popen: subprocess.Popen[bytes] | None = None
    incarnation: int = 0
    started_at: float = 0.0
    log_offset: int = 0  # where this incarnation's output starts in `log`
    signalled: bool = False  # an event signalled this incarnation (its exit is planned)
    restart_at: float = 0.0  # earliest time.monotonic() of the next start
    held: bool = False
    exits: list[Exit] = field(default_factory=list)

    @property
    def pid(self) -> int:
        return self.popen.pid if self.popen is not None else 0

    def alive(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def output(self) -> str:
        """This incarnation's log so far."""
        try:
            with open(self.log, "rb") as f:
                f.seek(self.log_offset)
                return f.read().decode(errors="replace")
        except OSError:
            return ""

    def unplanned_exits(self) -> list[Exit]:
        return [e for e in self.exits if not e.planned]


class Supervisor:
    def __init__(self) -> None:
        self.daemons: list[Daemon] = []
        self._lock = threading.Lock()
        self._running = threading.Event()
        self._thread: threading.Thread | None = None

    # -- starting ------------------------------------------------------------------

    def add(self, name: str, cmd: list[str], log: Path) -> Daemon:
        d = Daemon(name, cmd, log)
        with self._lock:
            self.daemons.append(d)
            self._spawn(d)
        if self._thread is None:
            self._running.set()
            self._thread = threading.Thread(target=self._loop, name="supervisor", daemon=True)
            self._thread.start()
        return d

    def _spawn(self, d: Daemon) -> None:
        d.log.parent.mkdir(parents=True, exist_ok=True)
        with open(d.log, "ab") as fh:
            d.log_offset = fh.tell()
            fh.write(f"--- supervisor: start #{d.incarnation + 1} at {time.monotonic():.3f}\n"
                     .encode())
            fh.flush()
            d.log_offset = fh.tell()
            d.popen = subprocess.Popen(d.cmd, stdout=fh, stderr=subprocess.STDOUT)
        d.incarnation += 1
        d.started_at = time.monotonic()
        d.signalled = False

    def _loop(self) -> None:
        while self._running.is_set():
            now = time.monotonic()
            with self._lock:
                for d in self.daemons:
                    if d.popen is None or d.popen.poll() is None:
                        continue
                    if not d.exits or d.exits[-1].at < d.started_at:
                        d.exits.append(Exit(now, d.popen.returncode, d.signalled))
                        d.restart_at = max(d.restart_at, now + d.restart_sec)
                    if not d.held and now >= d.restart_at and self._running.is_set():
                        self._spawn(d)
            time.sleep(0.05)

    # -- operator actions ------------------------------------------------------------

    def signal(self, d: Daemon, sig: int, restart_after: float = 0.0) -> int:
        """Send `sig` to the daemon's current process; if that ends it, the next start
        comes `restart_after` s from now at the earliest (0: RestartSec). The pid."""
        with self._lock:
            if sig in (signal.SIGKILL, signal.SIGTERM):
                d.signalled = True
                d.restart_at = time.monotonic() + restart_after
            pid = d.pid
            if d.alive():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, sig)
        return pid

    def hold(self, d: Daemon) -> None:
        with self._lock:
            d.held = True

    def release(self, d: Daemon) -> None:
        with self._lock:
            d.held = False
            d.restart_at = min(d.restart_at, time.monotonic())

    def wait_exit(self, d: Daemon, pid: int, timeout: float = STOP_TIMEOUT) -> bool:
        """Until the process `pid` of `d` has ended (bounded); whether it did."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if d.pid != pid or not d.alive():
                return True
            time.sleep(0.02)
        return False

    def wait_started(self, d: Daemon, after_pid: int, timeout: float) -> bool:
        """Until a process other than `after_pid` runs for `d` (bounded)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if d.pid != after_pid and d.alive():
                return True
            time.sleep(0.05)
        return False

    # -- stopping ----------------------------------------------------------------------

    def stop_all(self) -> None:
        """No more restarts; SIGCONT + SIGTERM every live process, newest daemon first,
        SIGKILL past STOP_TIMEOUT."""
        self._running.clear()
        if self._thread is not None:
            self._thread.join(timeout=5)
        for d in reversed(self.daemons):
            p = d.popen
            if p is None or p.poll() is not None:
                continue
            with contextlib.suppress(ProcessLookupError):
                os.kill(p.pid, signal.SIGCONT)
                os.kill(p.pid, signal.SIGTERM)
            try:
                p.wait(timeout=STOP_TIMEOUT)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(p.pid, signal.SIGKILL)
                p.wait(timeout=5)
