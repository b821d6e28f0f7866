"""Micro-batches for the torch trainer: which samples run together, and the tensors they need.

A batch of RL samples has very uneven lengths, so a fixed number of rows per micro-batch either
wastes most of its tokens on padding or runs out of memory on the long ones. Here a micro-batch
is filled up to a token budget instead (dynamic batch size), in one of two ways:

- padded: samples sorted longest first, rows right-padded to the micro-batch's longest, as many
  rows as fit ``rows x longest <= budget``. Sorting keeps rows of similar length together.
- packed: samples concatenated into one row of at most ``budget`` tokens (first-fit
  decreasing), position ids restarting at 0 for each sequence and no attention mask.
  transformers (>= 4.56, masking_utils) reads the restarts as sequence boundaries and builds a
  block-diagonal causal mask for sdpa/eager/flex, or varlen flash attention, so sequences never
  attend to each other. No padding at all; but sdpa and eager still compute attention over the
  whole row (masked), so packing pays off with varlen flash attention on GPUs.

Either way the model only projects the hidden states of positions that predict a response
token onto the vocabulary (``logits_to_keep`` as a boolean (B, L) mask), and their logprobs
come back as one flat (N,) vector in row-major order; ``seq``/``pos`` scatter it into the
(S, R) per-sample layout the policy loss aggregates over.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from kernel.sample import Sample


@dataclass
class MicroBatch:
    """The model inputs of one micro-batch and where its response logprobs go."""

    input_ids: Tensor  # (B, L)
    position_ids: Tensor  # (B, L)
    attention_mask: Tensor | None  # (B, L) 1 on real tokens; None for a packed row
    keep: Tensor  # (B, L) bool: positions whose logits predict a response token
    targets: Tensor  # (N,) the response token predicted at each kept position, row-major
    seq: Tensor  # (N,) the sample (0..S-1) each kept position belongs to
    pos: Tensor  # (N,) its index within that sample's response
    loss_mask: Tensor  # (S, R) float, 1 on tokens the loss trains on
    indices: list[int]  # the caller's index of each of the S samples; empty for a dummy
    n_tokens: int  # real (non-padding) tokens in the micro-batch
    n_slots: int  # B * L: the tokens the model actually runs

    @property
    def max_response(self) -> int:
        return self.loss_mask.shape[1]


def plan_microbatches(lengths: list[int], max_tokens: int, pack: bool) -> list[list[int]]:
    """Group indices of sequences with these token ``lengths`` into micro-batches.

    Padded (pack=False): longest first, greedily, while ``rows x longest <= max_tokens``.
    Packed (pack=True): first-fit decreasing into rows of ``max_tokens``. A sequence longer than
    the budget gets a micro-batch of its own in both modes.
    """
    if max_tokens < 1:
        raise ValueError(f"max_tokens_per_microbatch must be >= 1, got {max_tokens}")
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    groups: list[list[int]] = []
    if pack:
        room: list[int] = []
        for i in order:
            for g, free in enumerate(room):
                if lengths[i] <= free:
                    groups[g].append(i)
                    room[g] -= lengths[i]
                    break
            else:
                groups.append([i])
                room.append(max_tokens - lengths[i])
        return groups
    for i in order:
        # Sorted longest first, so a group's first sequence sets its padded length.
        if groups and (len(groups[-1]) + 1) * lengths[groups[-1][0]] <= max_tokens:
            groups[-1].append(i)
        else:
            groups.append([i])
    return groups


def collate(samples: list[Sample], indices: list[int], pack: bool) -> MicroBatch:
    """Build the tensors of one micro-batch from ``samples`` (one packed row if ``pack``)."""
    seqs, keep_spans = [], []
    for s in samples:
        if not s.prompt_ids:
            raise ValueError(
                f"sample {s.key}: prompt_ids is empty, so no position predicts the first "
                "response token"
            )
        seqs.append(list(s.prompt_ids) + list(s.response_ids))
        # Position t predicts token t + 1: the response is predicted from P - 1 to P + R - 2.
        keep_spans.append((len(s.prompt_ids) - 1, s.response_length))
    lengths = [len(x) for x in seqs]
    if pack:
        rows = [[t for x in seqs for t in x]]
        positions = [[p for n in lengths for p in range(n)]]
        offsets = [0]
        for n in lengths[:-1]:
            offsets.append(offsets[-1] + n)
        spans = [[(o + start, r) for o, (start, r) in zip(offsets, keep_spans, strict=True)]]
        attention_mask = None
    else:
        width = max(lengths)
        rows = [x + [0] * (width - len(x)) for x in seqs]
        positions = [list(range(width)) for _ in seqs]
        spans = [[span] for span in keep_spans]
        attention_mask = torch.tensor([[1] * n + [0] * (width - n) for n in lengths])  # (B, L)
    input_ids = torch.tensor(rows)  # (B, L)
    keep = torch.zeros(input_ids.shape, dtype=torch.bool)  # (B, L)
    for b, row_spans in enumerate(spans):
        for start, r in row_spans:
            keep[b, start : start + r] = True
    targets = torch.tensor([t for s in samples for t in s.response_ids], dtype=torch.long)  # (N,)
    seq = torch.tensor([j for j, s in enumerate(samples) for _ in s.response_ids])  # (N,)
    pos = torch.tensor([p for s in samples for p in range(s.response_length)])  # (N,)
    width_r = max((s.response_length for s in samples), default=0)
    loss_mask = torch.tensor(
        [list(s.loss_mask) + [0] * (width_r - s.response_length) for s in samples],
        dtype=torch.float32,
    ).reshape(len(samples), width_r)  # (S, R)
    return MicroBatch(
        input_ids=input_ids,
        position_ids=torch.tensor(positions),
        attention_mask=attention_mask,
        keep=keep,
        targets=targets,
        seq=seq,
        pos=pos,
        loss_mask=loss_mask,
        indices=list(indices),
        n_tokens=sum(lengths),
        n_slots=input_ids.numel(),
    )


def dummy_microbatch() -> MicroBatch:
    """A two-token micro-batch with nothing to train on.

    Under data parallelism every rank must run the same number of forward/backward passes
    (FSDP gathers parameters collectively in each); a rank with fewer micro-batches runs these.
    """
    mb = collate([Sample(prompt_ids=[0], response_ids=[0], loss_mask=[0])], [], pack=False)
    mb.n_tokens = 0
    return mb


def to_rows(values: list[list[float]], width: int) -> Tensor:
    """Right-pad per-sample lists to ``width`` with zeros: (S, width) float32."""
    return torch.tensor(
        [list(v) + [0.0] * (width - len(v)) for v in values], dtype=torch.float32
    ).reshape(len(values), width)


def shard_samples(samples: list[Sample], rank: int, world_size: int) -> list[Sample]:
    """This rank's share of a global batch, balanced by tokens and the same on every rank.

    Longest first, each sample goes to the rank holding the fewest tokens so far (ties to the
    lowest rank), so every rank gets close to the same amount of work.
    """
    if not 0 <= rank < world_size:
        raise ValueError(f"rank must be in [0, world_size={world_size}), got {rank}")
    load = [0] * world_size
    mine = []
    lengths = [len(s.prompt_ids) + s.response_length for s in samples]
    for i in sorted(range(len(samples)), key=lambda i: (-lengths[i], i)):
        r = min(range(world_size), key=lambda r: (load[r], r))
        load[r] += lengths[i]
        if r == rank:
            mine.append(i)
    return [samples[i] for i in sorted(mine)]
