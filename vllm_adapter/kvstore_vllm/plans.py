"""What the scheduler side tells the workers each step, and what they report back.

Plain dataclasses of ints, bytes and strings: vLLM ships the step's metadata to the
worker processes (pickled) and the workers' reports back to the scheduler.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from kvstore_vllm.timeline import Timeline


@dataclass
class LoadPlan:
    """Read these blocks, under this lease, into these local blocks."""

    req_id: str
    lease_id: int
    lease_ttl_left: float  # seconds left on the lease when the plan was built
    block_hashes: list[bytes]  # one per block to load, in order
    block_ids: list[int]  # local destination block of each (the first full-attention group's)
    first_block: int  # index of the first loaded block in the request
    # Several KV cache groups: per group (vLLM's group id), the local destination of
    # each block, -1 where the group does not load that block (outside its sliding
    # window). Empty: one group, whose destinations are `block_ids`.
    group_block_ids: list[list[int]] = field(default_factory=list)
    # Loaded between steps (vLLM's asynchronous load): the outcome goes back as a
    # finished (or failed) receive of the whole request, never as failed blocks.
    asynchronous: bool = False


@dataclass
class SavePlan:
    """Write these newly computed full blocks (unless the store has them)."""

    req_id: str
    block_hashes: list[bytes]
    block_ids: list[int]
    # As in LoadPlan: per group, the local block of each block to save, -1 where the
    # group saves nothing (a sliding-window block no hit can use). Empty: one group.
    group_block_ids: list[list[int]] = field(default_factory=list)


@dataclass
class StepPlan:
    loads: list[LoadPlan] = field(default_factory=list)
    saves: list[SavePlan] = field(default_factory=list)


@dataclass
class LoadReport:
    """One worker's outcome for one request's load."""

    req_id: str
    lease_id: int
    workers: int = 1  # how many workers' reports are folded in
    failed_block_ids: list[int] = field(default_factory=list)
    corrupt_keys: list[bytes] = field(default_factory=list)
    timeline: Timeline = field(default_factory=Timeline)
    failed: bool = False  # some block failed (asynchronous loads: the whole request)

    def merge(self, other: LoadReport) -> None:
        self.workers += other.workers
        self.failed_block_ids = sorted(set(self.failed_block_ids) | set(other.failed_block_ids))
        self.corrupt_keys = list(dict.fromkeys([*self.corrupt_keys, *other.corrupt_keys]))
        self.failed = self.failed or other.failed
        self.timeline.merge(other.timeline)


def merge_reports(into: dict[str, LoadReport], other: dict[str, LoadReport]) -> dict[str, LoadReport]:
    for req_id, rep in other.items():
        if req_id in into:
            into[req_id].merge(rep)
        else:
            into[req_id] = rep
    return into


def destinations(plan: LoadPlan | SavePlan, group: int) -> list[int]:
    """The local block of each of the plan's blocks in one KV cache group (-1: none)."""
    if plan.group_block_ids:
        return plan.group_block_ids[group]
    if group != 0:
        raise ValueError(f"a single-group plan has no KV cache group {group}")
    return plan.block_ids
