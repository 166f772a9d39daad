"""KV cache groups: which blocks each group needs at a hit, and which it saves.

vLLM's hybrid allocator gives a model one KV cache group per attention kind (Gemma 2:
sliding-window layers in one group, full-attention layers in another). Every group
has its own block table, so a block's pages live at a different local block id in
each group, and the groups need different blocks:

- a full-attention group needs every block of the prefix;
- a sliding-window group needs only the blocks inside the window of the first token
  computed after the hit (vLLM frees, and never reads, the others).

A block counts as a hit only when every group that needs it can load it. Which
sliding-window blocks are saved follows vLLM's own prefix-cache retention
(`prefix_cache_retention_interval`): a window is saved where a later request can
resume (the end of the prompt, a prefix shared with stored requests, every
`interval` tokens), not behind every block, since a hit can only end where every
group has its pages.

This module is pure: no vLLM, no I/O.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from kvstore_vllm.keys import KeyPlan

FULL = "full"
SLIDING = "sliding"


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


@dataclass(frozen=True)
class GroupSpec:
    """One KV cache group as the connector sees it."""

    index: int  # vLLM's group id (position in kv_cache_config.kv_cache_groups)
    kind: str  # FULL or SLIDING
    layers: tuple[str, ...]
    # Sliding window in tokens, plus vLLM's extra retained tokens (MTP); 0 for FULL.
    window: int = 0

    def first_needed(self, hit_tokens: int, block_size: int) -> int:
        """The first block this group must hold for computing from token `hit_tokens` on."""
        if self.kind == FULL:
            return 0
        # vLLM skips the tokens before hit_tokens - window + 1 (its get_num_skipped_tokens).
        return max(0, hit_tokens - self.window + 1) // block_size

    def needed(self, first_block: int, hit_tokens: int, block_size: int) -> range:
        """Blocks of [first_block, end of the hit) this group loads for a hit of
        `hit_tokens` tokens (blocks before `first_block` are local)."""
        return range(max(first_block, self.first_needed(hit_tokens, block_size)),
                     cdiv(hit_tokens, block_size))

    def save_window(self, boundary_block: int, block_size: int) -> range:
        """Blocks to save so that a hit can end at `boundary_block` blocks: the window
        for a hit of boundary_block * block_size tokens and for one token less (a
        block-aligned prompt sent again stops one token short of its end)."""
        if self.kind == FULL:
            return range(0, boundary_block)
        lo = max(0, boundary_block * block_size - self.window) // block_size
        return range(lo, boundary_block)


@dataclass(frozen=True)
class GroupKeys:
    """A group and the keys of its objects across every rank that holds it."""

    spec: GroupSpec
    keys: KeyPlan


def checkpoint_boundaries(*, num_prompt_tokens: int, block_size: int, interval: int | None,
                          junctions: Iterable[int] = ()) -> set[int] | None:
    """Block boundaries at which a sliding-window group saves its window.

    `interval` is vLLM's prefix_cache_retention_interval: None saves densely (returns
    None: every block), 0 only where a later request resumes (the prompt's end and the
    given junctions, in tokens), a positive value also every `interval` tokens.
    """
    if interval is None:
        return None
    n = num_prompt_tokens // block_size
    out = {n, (num_prompt_tokens - 1) // block_size}
    out.update(j // block_size for j in junctions if j > 0)
    if interval > 0:
        step = max(1, interval // block_size)
        out.update(range(step, n + 1, step))
    out.discard(0)
    return out


def sliding_save_blocks(spec: GroupSpec, boundaries: set[int] | None, lo: int, hi: int,
                        block_size: int) -> list[int]:
    """The blocks of [lo, hi) a sliding-window group saves for these boundaries."""
    if boundaries is None or spec.kind == FULL:
        return list(range(lo, hi))
    keep: set[int] = set()
    for b in boundaries:
        keep.update(spec.save_window(b, block_size))
    return [i for i in range(lo, hi) if i in keep]


def best_hit(groups: Sequence[GroupSpec], present: Mapping[int, Sequence[bool]], *, first: int,
             last: int, usable: int, block_size: int) -> tuple[int, int]:
    """(hit boundary in blocks, extent of the full-attention prefix in blocks).

    `present[g][i]` says whether group g's objects of block first + i are all stored.
    The hit is the longest boundary k in (first, last] such that every full group has
    blocks [first, k) and every sliding group the blocks of its window at k; `first`
    when there is none. The full extent is where the full groups' stored prefix ends
    (a junction worth saving a window at when it is longer than the hit).
    """
    extent = last
    for g in groups:
        if g.kind == FULL:
            run = 0
            for p in present[g.index]:
                if not p:
                    break
                run += 1
            extent = min(extent, first + run)
    for k in range(extent, first, -1):
        tokens = min(k * block_size, usable)
        if all(all(present[g.index][i - first] for i in g.needed(first, tokens, block_size))
               for g in groups if g.kind != FULL):
            return k, extent
    return first, extent
