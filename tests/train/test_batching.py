"""Tests for kernel/train/batching.py: micro-batch plans, the tensors of padded and packed
micro-batches, and the balanced split of a batch over data-parallel ranks.

Every expected value is worked out by hand in the test.
"""

from __future__ import annotations

import pytest
import torch

from kernel.sample import Sample
from kernel.train.batching import (
    collate,
    collate_shared,
    plan_microbatches,
    plan_shared,
    shard_samples,
)

LENGTHS = [5, 3, 8, 2, 4]


def test_padded_plan_fills_rows_times_longest_up_to_the_budget():
    # Longest first: 8 (i2), 5 (i0), 4 (i4), 3 (i1), 2 (i3); budget 10.
    # [8] + 5 would pad to 2 x 8 = 16 > 10: new group. [5, 4]: 2 x 5 = 10 <= 10; + 3: 3 x 5 = 15.
    # [3, 2]: 2 x 3 = 6 <= 10.
    assert plan_microbatches(LENGTHS, 10, pack=False) == [[2], [0, 4], [1, 3]]


def test_packed_plan_is_first_fit_decreasing():
    # Rows of 10: 8 -> row0 (2 left); 5 -> row1 (5 left); 4 -> row1 (1 left); 3 -> row2 (7 left);
    # 2 -> row0 (0 left).
    assert plan_microbatches(LENGTHS, 10, pack=True) == [[2, 3], [0, 4], [1]]


@pytest.mark.parametrize("pack", [False, True])
def test_a_sequence_longer_than_the_budget_runs_alone(pack):
    assert plan_microbatches([12, 3], 10, pack) == [[0], [1]]


def test_bad_budget_names_the_field():
    with pytest.raises(ValueError, match="max_tokens_per_microbatch"):
        plan_microbatches([3], 0, pack=True)


A = Sample(prompt_ids=[1, 2, 3], response_ids=[4, 5], loss_mask=[1, 0])
B = Sample(prompt_ids=[6], response_ids=[7, 8, 9], loss_mask=[1, 1, 1])


def test_padded_collate():
    mb = collate([A, B], [10, 11], pack=False)
    assert mb.input_ids.tolist() == [[1, 2, 3, 4, 5], [6, 7, 8, 9, 0]]
    assert mb.attention_mask.tolist() == [[1, 1, 1, 1, 1], [1, 1, 1, 1, 0]]
    # A's response (4, 5) is predicted at positions 2, 3; B's (7, 8, 9) at 0, 1, 2.
    assert mb.keep.tolist() == [[False, False, True, True, False], [True, True, True, False, False]]
    assert mb.targets.tolist() == [4, 5, 7, 8, 9]
    assert mb.seq.tolist() == [0, 0, 1, 1, 1]
    assert mb.pos.tolist() == [0, 1, 0, 1, 2]
    assert mb.loss_mask.tolist() == [[1, 0, 0], [1, 1, 1]]
    assert (mb.indices, mb.n_tokens, mb.n_slots) == ([10, 11], 5 + 4, 2 * 5)


def test_packed_collate_restarts_positions_and_needs_no_mask():
    mb = collate([A, B], [0, 1], pack=True)
    assert mb.input_ids.tolist() == [[1, 2, 3, 4, 5, 6, 7, 8, 9]]
    assert mb.position_ids.tolist() == [[0, 1, 2, 3, 4, 0, 1, 2, 3]]
    assert mb.attention_mask is None
    # A's response at 2, 3; B starts at offset 5, its response predicted at 5, 6, 7.
    assert torch.nonzero(mb.keep[0]).flatten().tolist() == [2, 3, 5, 6, 7]
    # The kept positions predict exactly the next input token.
    assert mb.targets.tolist() == mb.input_ids[0, torch.tensor([3, 4, 6, 7, 8])].tolist()
    assert (mb.n_tokens, mb.n_slots) == (9, 9)


def test_shared_plan_keeps_a_prompts_samples_together_within_the_budget():
    p, q = [1, 2, 3, 4], [5, 6]
    batch = [
        Sample(prompt_ids=q, response_ids=[7] * 3, loss_mask=[1] * 3),  # 0
        Sample(prompt_ids=p, response_ids=[7] * 2, loss_mask=[1] * 2),  # 1
        Sample(prompt_ids=p, response_ids=[7] * 5, loss_mask=[1] * 5),  # 2
        Sample(prompt_ids=q, response_ids=[7] * 1, loss_mask=[1] * 1),  # 3
    ]
    # Longest prompt first (p: samples 2 then 1, longest response first), then q. Slots are
    # prompts x longest prompt + samples x longest response: [2] 4 + 5 = 9; [2, 1] 4 + 10 = 14;
    # + 0 (new prompt q): 2 x 4 + 3 x 5 = 23 > 20, so q starts a micro-batch: [0] 2 + 3 = 5;
    # [0, 3] 2 + 2 x 3 = 8.
    assert plan_shared(batch, 20) == [[2, 1], [0, 3]]
    assert plan_shared(batch, 100) == [[2, 1, 0, 3]]


def test_shared_collate():
    a = Sample(prompt_ids=[1, 2, 3], response_ids=[4, 5, 6], loss_mask=[1, 0, 1])
    b = Sample(prompt_ids=[1, 2, 3], response_ids=[7], loss_mask=[1])
    c = Sample(prompt_ids=[8], response_ids=[9, 10], loss_mask=[1, 1])
    mb = collate_shared([a, b, c], [4, 5, 6])
    p = mb.prompts
    assert p.input_ids.tolist() == [[1, 2, 3], [0, 0, 8]]  # distinct prompts, left padded
    assert p.attention_mask.tolist() == [[1, 1, 1], [0, 0, 1]]
    assert p.position_ids.tolist() == [[0, 1, 2], [0, 0, 0]]
    assert p.rows.tolist() == [0, 0, 1]
    # responses minus their last token continue the prompt, at positions after it
    assert mb.input_ids.tolist() == [[4, 5], [0, 0], [9, 0]]
    assert mb.position_ids.tolist() == [[3, 4], [3, 4], [1, 2]]
    assert mb.attention_mask.tolist() == [[1, 1, 1, 1, 1], [1, 1, 1, 0, 0], [0, 0, 1, 1, 0]]
    assert mb.keep.tolist() == [[True, True], [False, False], [True, False]]
    # first tokens (predicted by each prompt's last position), then the rest row-major
    assert mb.targets.tolist() == [4, 7, 9, 5, 6, 10]
    assert mb.seq.tolist() == [0, 1, 2, 0, 0, 2]
    assert mb.pos.tolist() == [0, 0, 0, 1, 2, 1]
    assert (mb.n_tokens, mb.n_slots) == (3 + 1 + 2 + 0 + 1, 6 + 6)


def test_collate_rejects_an_empty_prompt():
    with pytest.raises(ValueError, match="prompt_ids is empty"):
        collate([Sample(prompt_ids=[], response_ids=[1], loss_mask=[1])], [0], pack=False)


def test_shard_samples_balances_tokens_and_covers_the_batch():
    # Token lengths 10, 7, 6, 5, 2, longest first to the least-loaded rank:
    # 10 -> r0 (10, 0); 7 -> r1 (10, 7); 6 -> r1 (10, 13); 5 -> r0 (15, 13); 2 -> r1 (15, 15).
    batch = [
        Sample(prompt_ids=[1] * (n - 1), response_ids=[2], loss_mask=[1], index=i)
        for i, n in enumerate([10, 7, 6, 5, 2])
    ]
    assert [s.index for s in shard_samples(batch, 0, 2)] == [0, 3]
    assert [s.index for s in shard_samples(batch, 1, 2)] == [1, 2, 4]
    with pytest.raises(ValueError, match="rank"):
        shard_samples(batch, 2, 2)
