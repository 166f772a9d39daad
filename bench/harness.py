"""What the benchmarks with client processes share (bench.vs_mooncake, bench.replay).

- One line protocol between the orchestrator and each client process (`Worker` on the
  orchestrator's side, `serve` on the client's): the client says READY once set up, then
  answers each request, one JSON line on its stdin, with one RESULT line on its stdout,
  until its stdin closes. Anything else it prints goes to its log. Clients run in
  processes of their own so that each system's client has its own interpreter and
  Transfer Engine, as an inference engine's would.
- `bench_main`: the argument handling every such benchmark repeats: a client process
  runs its part and returns; the orchestrator re-executes itself in a private network
  namespace (bench/netns.py), turns SIGTERM into cleanup, works in a temporary directory
  for logs and reports a RuntimeError as one line, keeping the directory with
  --keep-logs.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

READY, RESULT = "bench worker ready", "bench result "


def serve(handle: Callable[[dict[str, Any]], Any]) -> None:
    """The client's side: READY, then `handle` each request until stdin closes."""
    print(READY, flush=True)
    for line in sys.stdin:
        print(RESULT + json.dumps(handle(json.loads(line))), flush=True)


class Worker:
    """A client process, started now; `ready` waits for it to be set up, `ask` sends one
    request and returns its result. One thread at a time per worker."""

    def __init__(self, name: str, cmd: list[str], log: Path) -> None:
        from bench.clusters import MOONCAKE_ENV

        self.name, self.log = name, log
        self._log = open(log, "ab")  # noqa: SIM115 - closed in close()
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=self._log, env={**os.environ, **MOONCAKE_ENV},
                                     text=True)

    def ready(self, timeout: float = 120.0) -> None:
        """Wait for READY; a client not set up within `timeout` s is killed."""
        timer = threading.Timer(timeout, self.proc.kill)
        timer.start()
        try:
            self._read_until(READY)
        finally:
            timer.cancel()

    def ask(self, request: dict[str, Any]) -> Any:
        assert self.proc.stdin is not None
        try:
            self.proc.stdin.write(json.dumps(request) + "\n")
            self.proc.stdin.flush()
        except OSError:
            pass  # it exited: _read_until says with what
        return json.loads(self._read_until(RESULT))

    def _read_until(self, prefix: str) -> str:
        from bench.clusters import log_tail

        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if line.startswith(prefix):
                return line[len(prefix):]
            self._log.write(line.encode())
        self._log.flush()
        raise RuntimeError(f"benchmark client {self.name} exited with {self.proc.wait()}\n"
                           f"{log_tail(self.log)}")

    def close(self, kill: bool = False) -> None:
        """End the client: with `kill`, at once; else by closing its stdin (it finishes
        and closes its own client), killing it if it takes over a minute."""
        from bench.clusters import uninterrupted

        with uninterrupted():
            try:
                if kill and self.proc.poll() is None:
                    self.proc.kill()
                if self.proc.stdin is not None:
                    self.proc.stdin.close()
                self.proc.wait(timeout=60)
            except (OSError, subprocess.TimeoutExpired):
                self.proc.kill()
                self.proc.wait()
            finally:
                self._log.close()


def bench_main(parser: argparse.ArgumentParser, argv: list[str] | None, module: str,
               worker: Callable[[argparse.Namespace], int] | None,
               run: Callable[[argparse.Namespace, Path], int],
               check: Callable[[argparse.ArgumentParser, argparse.Namespace], None] | None = None,
               ) -> int:
    """Parse, `check` (which may call parser.error), then either the client process's
    part (`worker`, when --worker is given) or the orchestrator's (`run`, given a fresh
    temporary directory) in a private network namespace. `parser` must define
    --keep-logs, and --worker if there is a `worker`."""
    args = parser.parse_args(argv)
    if check is not None:
        check(parser, args)
    if worker is not None and args.worker:
        return worker(args)
    from bench.clusters import raise_on_sigterm
    from bench.netns import ensure_private_netns

    ensure_private_netns(module)
    raise_on_sigterm()
    name = module.rsplit(".", 1)[-1]
    tmp = Path(tempfile.mkdtemp(prefix=f"kvstore-{name.replace('_', '-')}-"))
    try:
        return run(args, tmp)
    except RuntimeError as exc:
        print(f"{name} failed: {exc}", file=sys.stderr)
        return 1
    finally:
        if args.keep_logs:
            print(f"logs kept in {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)
