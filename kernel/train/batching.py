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

- shared prompts (``plan_shared`` / ``collate_shared``): the samples of a prompt group share
  their prompt ids (the n samples of a prompt, and the first turn of each of its dialogues), so
  a micro-batch runs each distinct prompt ONCE (left padded, with gradients) and each sample's
  response as a continuation of that prompt's KV cache (right padded). The logits, the loss and
  the gradient are those of running every sample whole -- the same attention over the same
  keys -- but a prompt of P tokens shared by n samples costs P tokens instead of n x P.

Either way the model only projects the hidden states of positions that predict a response
token onto the vocabulary (``logits_to_keep`` as a boolean (B, L) mask), and their logprobs
come back as one flat (N,) vector; ``seq``/``pos`` scatter it into the (S, R) per-sample layout
the policy loss aggregates over.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from kernel.sample import Sample


@dataclass
class SharedPrompts:
    """The distinct prompts of a shared-prompt micro-batch, run once each."""

    input_ids: Tensor  # (U, P) left padded
    attention_mask: Tensor  # (U, P) 1 on real tokens
    position_ids: Tensor  # (U, P) counting real tokens only
    rows: Tensor  # (S,) the prompt row of each sample


@dataclass
class MicroBatch:
    """The model inputs of one micro-batch and where its response logprobs go.

    With ``prompts`` set (shared prompts), ``input_ids`` are each sample's response minus its
    last token (the continuation of its prompt's KV cache; the attention mask spans prompt and
    response), and the first S entries of ``targets``/``seq``/``pos`` are each sample's first
    response token, predicted by the last position of its prompt; the rest follow row-major.
    """

    input_ids: Tensor  # (B, L)
    position_ids: Tensor  # (B, L)
    attention_mask: Tensor | None  # (B, L) 1 on real tokens; None for a packed row
    keep: Tensor  # (B, L) bool: positions whose logits predict a response token
    targets: Tensor  # (N,) the response token predicted at each kept position
    seq: Tensor  # (N,) the sample (0..S-1) each kept position belongs to
    pos: Tensor  # (N,) its index within that sample's response
    loss_mask: Tensor  # (S, R) float, 1 on tokens the loss trains on
    indices: list[int]  # the caller's index of each of the S samples; empty for a dummy
    n_tokens: int  # real (non-padding) tokens the model runs
    n_slots: int  # the token slots the model runs, padding included
    prompts: SharedPrompts | None = None

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


def plan_shared(samples: list[Sample], max_tokens: int) -> list[list[int]]:
    """Group sample indices into shared-prompt micro-batches of at most ``max_tokens`` slots
    (distinct prompts x longest prompt + samples x longest response). Samples with equal
    prompt ids go together (longest prompt first, each prompt's samples longest response
    first); a prompt whose samples do not all fit continues in the next micro-batch, and a
    sample over the budget on its own runs alone."""
    if max_tokens < 1:
        raise ValueError(f"max_tokens_per_microbatch must be >= 1, got {max_tokens}")
    families: dict[tuple[int, ...], list[int]] = {}
    for i, s in enumerate(samples):
        families.setdefault(tuple(s.prompt_ids), []).append(i)
    order = sorted(families.items(), key=lambda kv: (-len(kv[0]), kv[1][0]))
    groups: list[list[int]] = []
    prompts: set[tuple[int, ...]] = set()
    longest_p = longest_r = 0
    for prompt, members in order:
        for i in sorted(members, key=lambda i: (-samples[i].response_length, i)):
            r = samples[i].response_length
            u = len(prompts | {prompt})
            p, rr = max(longest_p, len(prompt)), max(longest_r, r)
            if groups and u * p + (len(groups[-1]) + 1) * rr <= max_tokens:
                groups[-1].append(i)
            else:
                groups.append([i])
                prompts, p, rr = set(), len(prompt), r
            prompts.add(prompt)
            longest_p, longest_r = p, rr
    return groups


def collate_shared(samples: list[Sample], indices: list[int]) -> MicroBatch:
    """Build a shared-prompt micro-batch (see the module docstring) from ``samples``."""
    distinct: dict[tuple[int, ...], int] = {}
    for s in samples:
        if not s.prompt_ids:
            raise ValueError(
                f"sample {s.key}: prompt_ids is empty, so no position predicts the first "
                "response token"
            )
        if not s.response_ids:
            raise ValueError(f"sample {s.key}: a shared-prompt micro-batch needs a response")
        distinct.setdefault(tuple(s.prompt_ids), len(distinct))
    rows = [distinct[tuple(s.prompt_ids)] for s in samples]
    width_p = max(len(p) for p in distinct)
    p_ids = torch.tensor([[0] * (width_p - len(p)) + list(p) for p in distinct])  # (U, P)
    p_mask = torch.tensor([[0] * (width_p - len(p)) + [1] * len(p) for p in distinct])  # (U, P)
    p_pos = (p_mask.cumsum(-1) - 1).clamp(min=0)  # (U, P)
    # Each sample's response but its last token continues its prompt: position t predicts t+1.
    chunks = [list(s.response_ids[:-1]) for s in samples]
    width = max(len(c) for c in chunks)
    n = len(samples)
    input_ids = torch.tensor([c + [0] * (width - len(c)) for c in chunks]).reshape(n, width)
    r_mask = torch.tensor([[1] * len(c) + [0] * (width - len(c)) for c in chunks]).reshape(
        n, width
    )  # (S, L)
    lengths = torch.tensor([len(s.prompt_ids) for s in samples])  # (S,)
    positions = lengths[:, None] + torch.arange(width)[None]  # (S, L)
    keep = r_mask.bool()  # every response input predicts the next response token
    firsts = [s.response_ids[0] for s in samples]
    rest = [t for s in samples for t in s.response_ids[1:]]
    targets = torch.tensor(firsts + rest, dtype=torch.long)  # (N,)
    seq = torch.tensor(
        list(range(len(samples))) + [j for j, s in enumerate(samples) for _ in s.response_ids[1:]]
    )
    pos = torch.tensor(
        [0] * len(samples) + [p for s in samples for p in range(1, s.response_length)]
    )
    width_r = max(s.response_length for s in samples)
    loss_mask = torch.tensor(
        [list(s.loss_mask) + [0] * (width_r - s.response_length) for s in samples],
        dtype=torch.float32,
    )  # (S, R)
    return MicroBatch(
        input_ids=input_ids,
        position_ids=positions,
        attention_mask=torch.cat([p_mask[torch.tensor(rows)], r_mask], dim=1),  # (S, P + L)
        keep=keep,
        targets=targets,
        seq=seq,
        pos=pos,
        loss_mask=loss_mask,
        indices=list(indices),
        n_tokens=sum(len(p) for p in distinct) + sum(len(c) for c in chunks),
        n_slots=p_ids.numel() + input_ids.numel(),
        prompts=SharedPrompts(p_ids, p_mask, p_pos, torch.tensor(rows)),
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
