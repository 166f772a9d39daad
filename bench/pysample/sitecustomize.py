"""A stand-in for py-spy where it is not installed (`bench.master_ops --profile-master`).

The bench puts this directory on the PYTHONPATH of the daemons it starts, with
KVSTORE_SAMPLE_CTL naming a directory. Each such Python process then runs a daemon
thread that waits for a file CTL/<its pid>.on; while the file is there, the thread
samples the main thread's stack every 4 ms (skipping samples idle in the event loop,
as py-spy does by default: in the selector, or under uvloop's C loop with no Python frame
above `Runner.run`), and when the file goes it writes the stacks it saw to the path
the file held, as collapsed stacks (py-spy's raw format: `frame;frame;... count`), and
to that path + ".gc" the garbage collector's passes meanwhile (gc.callbacks): per
generation, how many, their total and their longest pause.

It holds the GIL for each sample, so it costs the sampled process a little: compare
profiles taken the same way, not against py-spy's.
"""

from __future__ import annotations

import gc
import os
import sys
import threading
import time

_IDLE = {"select", "poll", "run"}  # innermost frames that mean "waiting for events"


def _stack(frame: object) -> str:
    names = []
    f = frame
    while f is not None:
        code = f.f_code  # type: ignore[attr-defined]
        names.append(f"{code.co_qualname} ({code.co_filename}:{f.f_lineno})")  # type: ignore[attr-defined]
        f = f.f_back  # type: ignore[attr-defined]
    return ";".join(reversed(names))


def _run(ctl: str, main_id: int) -> None:
    on = os.path.join(ctl, f"{os.getpid()}.on")
    while True:
        time.sleep(0.1)
        try:
            with open(on) as fh:
                out = fh.read().strip()
        except OSError:
            continue
        if not out:
            continue
        counts: dict[str, int] = {}
        passes: dict[int, list[float]] = {0: [0, 0.0, 0.0], 1: [0, 0.0, 0.0], 2: [0, 0.0, 0.0]}
        began = [0.0]

        def timed(phase: str, info: dict[str, int], passes: dict[int, list[float]] = passes,
                  began: list[float] = began) -> None:
            if phase == "start":
                began[0] = time.perf_counter()
                return
            took = time.perf_counter() - began[0]
            p = passes[info["generation"]]
            p[0] += 1
            p[1] += took
            p[2] = max(p[2], took)
        gc.callbacks.append(timed)
        while os.path.exists(on):
            frame = sys._current_frames().get(main_id)
            if frame is not None and not (frame.f_code.co_name in _IDLE and (
                    frame.f_code.co_filename.endswith(("selectors.py", "runners.py")))):
                key = _stack(frame)
                counts[key] = counts.get(key, 0) + 1
            del frame
            time.sleep(0.004)
        gc.callbacks.remove(timed)
        with open(out + ".gc", "w") as fh:
            for g, (n, total, longest) in passes.items():
                fh.write(f"gen{g}: {n:.0f} passes, {total * 1e3:.1f} ms, longest "
                         f"{longest * 1e3:.2f} ms\n")
        with open(out + ".tmp", "w") as fh:
            for key, n in counts.items():
                fh.write(f"{key} {n}\n")
        os.replace(out + ".tmp", out)


_ctl = os.environ.get("KVSTORE_SAMPLE_CTL")
if _ctl:
    threading.Thread(target=_run, args=(_ctl, threading.get_ident()), daemon=True,
                     name="sampler").start()
