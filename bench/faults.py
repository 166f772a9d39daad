"""Fault scenarios under checked traffic: one row per fault (docs/faults.md).

    python -m bench.faults                      # every scenario, then the table
    python -m bench.faults --only kill_store stop_store --json rows.json
    python -m bench.faults --render rows.jsonl  # the table from rows the tests wrote
                                                # (KVSTORE_FAULTS_REPORT=rows.jsonl pytest tests/faults)

Runs the very scenario code the tests in tests/faults/ assert on (tests/faults/scenarios.py):
real etcd, masters and store nodes, client traffic that checks every byte it reads,
one fault each. Needs root: it re-executes itself in a private network namespace, and
the scenarios add a veth pair and a tmpfs of their own. Exit status 1 if any row breaks
a rule (wrong bytes, a call past its deadline, an unexplained lost object, no recovery).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from dataclasses import asdict
from pathlib import Path
from typing import Any

from bench.netns import ensure_private_netns
from bench.stats import format_table

HEADERS = ["fault", "ops", "wrong bytes", "longest call", "lost / tracked", "2-replica lost",
           "why lost", "recovery"]


def table(rows: list[dict[str, Any]]) -> str:
    out = []
    for r in rows:
        out.append([
            r["fault"], f"{r['operations']:,}", str(r["wrong_bytes"]),
            f"{r['max_call_s']:.2f} s / {r['deadline_s']:.1f}",
            f"{r['lost']:,} / {r['tracked']:,}", f"{r['lost_2r']:,} / {r['tracked_2r']:,}",
            r["why_lost"] if r["lost"] else "-",
            f"{r['recovery_s']:.2f} s" if r["recovery_s"] >= 0 else "NO",
        ])
    return format_table(HEADERS, out, align="lrrrrrlr")


def details(rows: list[dict[str, Any]]) -> str:
    lines = []
    for r in rows:
        errors = ", ".join(f"{k} {v}" for k, v in r["errors"].items()) or "none"
        lines.append(f"- {r['fault']}: {r['reads_ok']:,} checked reads, {r['misses']:,} misses, "
                     f"typed errors: {errors}; at risk (every replica on the faulted node): "
                     f"{r['at_risk']:,}; the master counted {r['master_lost']} objects lost"
                     if r["master_lost"] >= 0 else
                     f"- {r['fault']}: {r['reads_ok']:,} checked reads, {r['misses']:,} misses, "
                     f"typed errors: {errors}")
        lines.append(f"  longest call: {r['max_call_op']}; recovery counted from "
                     f"{r['recovered_from']}; {r['failed_probes']} failed probe rounds; "
                     f"{r['seconds']:.0f} s")
        lines += [f"  {note}" for note in r["notes"]]
        if r.get("problems"):
            lines += [f"  PROBLEM: {p}" for p in r["problems"]]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.faults", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--only", nargs="+", default=[], help="scenario names (default: all)")
    p.add_argument("--json", default="", help="write the rows here")
    p.add_argument("--render", default="", help="print the table of the rows in this file "
                   "(JSON lines written by the tests, or a --json file) and run nothing")
    args = p.parse_args(argv)
    if args.render:
        text = Path(args.render).read_text()
        rows = (json.loads(text) if text.lstrip().startswith("[")  # --json's list
                else [json.loads(line) for line in text.splitlines() if line])  # the tests'
        print(table(rows))
        print(details(rows))
        return 0
    ensure_private_netns("bench.faults")
    from tests.faults.scenarios import SCENARIOS  # after the re-exec: it imports the cluster

    names = args.only or list(SCENARIOS)
    unknown = [n for n in names if n not in SCENARIOS]
    if unknown:
        p.error(f"unknown scenario(s) {unknown}; choose from {list(SCENARIOS)}")
    rows = []
    for name in names:
        with tempfile.TemporaryDirectory(prefix=f"kvstore-fault-{name}-") as tmp:
            row = SCENARIOS[name](Path(tmp))
        d = asdict(row)
        d["problems"] = row.problems()
        rows.append(d)
        print(f"{name}: {'ok' if not d['problems'] else d['problems']}", flush=True)
    print(table(rows))
    print(details(rows))
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return 1 if any(r["problems"] for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
