"""Which blocks each KV cache group needs at a hit and saves (pure, no store)."""

from __future__ import annotations

from kvstore_vllm.groups import (
    FULL,
    SLIDING,
    GroupSpec,
    best_hit,
    checkpoint_boundaries,
    sliding_save_blocks,
)

BS = 32
SW = GroupSpec(0, SLIDING, ("l0",), window=64)
FA = GroupSpec(1, FULL, ("l1",))


def test_a_sliding_group_needs_only_its_window() -> None:
    # The token at 128 attends to 65..128: blocks 2 and 3 hold 65..127.
    assert list(SW.needed(0, 128, BS)) == [2, 3]
    assert list(FA.needed(0, 128, BS)) == [0, 1, 2, 3]
    assert list(SW.needed(3, 128, BS)) == [3]  # block 2 is local
    assert list(SW.needed(0, 40, BS)) == [0, 1]  # the window reaches the start
    # A save for a hit ending at block 4 covers 128 and 127 tokens (a block-aligned
    # prompt sent again stops one short).
    assert set(SW.save_window(4, BS)) >= set(SW.needed(0, 127, BS)) | set(SW.needed(0, 128, BS))


def test_best_hit_is_the_longest_boundary_every_group_serves() -> None:
    present = {FA.index: [True] * 6, SW.index: [False, False, True, True, False, True]}
    # 6: needs SW 4, 5 (4 missing); 5: needs 3, 4; 4: needs 2, 3: the hit.
    assert best_hit([SW, FA], present, first=0, last=6, usable=6 * BS + 3, block_size=BS) == (4, 6)
    present[FA.index][2] = False  # full attention stops at 2; SW lacks 0, 1: no hit
    assert best_hit([SW, FA], present, first=0, last=6, usable=6 * BS + 3, block_size=BS) == (0, 2)
    present[SW.index][:2] = [True, True]
    assert best_hit([SW, FA], present, first=0, last=6, usable=6 * BS + 3, block_size=BS) == (2, 2)
    assert best_hit([SW, FA], {0: [False] * 3, 1: [True] * 3}, first=0, last=3,
                    usable=100, block_size=BS) == (0, 3)


def test_checkpoints_follow_vllms_retention() -> None:
    assert checkpoint_boundaries(num_prompt_tokens=11 * BS + 7, block_size=BS, interval=None) is None
    assert checkpoint_boundaries(num_prompt_tokens=11 * BS + 7, block_size=BS, interval=0,
                                 junctions=[8 * BS]) == {8, 11}
    assert checkpoint_boundaries(num_prompt_tokens=8 * BS, block_size=BS, interval=0) == {7, 8}
    assert checkpoint_boundaries(num_prompt_tokens=9 * BS + 1, block_size=BS,
                                 interval=4 * BS) == {4, 8, 9}
    kept = sliding_save_blocks(SW, {8, 11}, 0, 11, BS)
    assert kept == [6, 7, 9, 10]
    assert sliding_save_blocks(FA, {8}, 0, 11, BS) == list(range(11))
    assert sliding_save_blocks(SW, None, 2, 5, BS) == [2, 3, 4]
