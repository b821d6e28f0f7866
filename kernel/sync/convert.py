"""HF <-> Megatron-core weight conversion for the Qwen2, Qwen3 and Llama families.

A trainer running Megatron-core holds its weights under Megatron's names and layouts; the
inference engines (SGLang, the embedded server) load HF names. This module converts between
the two, table-driven (``LAYER_TABLE``: one row per Megatron parameter of a decoder layer),
with plain torch only (Megatron itself is not imported: converting is tensor bookkeeping).

Layouts (Megatron local spec, ``get_gpt_layer_local_spec``; the layer norms are separate
modules there, ``input_layernorm`` / ``pre_mlp_layernorm``, not fused into the next linear as
``linear_qkv.layer_norm_weight`` in the Transformer-Engine spec):

- ``self_attention.linear_qkv``: q, k and v fused along dim 0, interleaved per query group:
  for each of the G key/value heads, the rows of its H/G query heads, then its k head, then its
  v head: ``(G, (H/G + 2) * D, hidden)``. The bias (Qwen2) follows the same layout.
- ``mlp.linear_fc1``: SwiGLU's gate and up projections stacked along dim 0, ``[gate; up]``.
- ``embedding.word_embeddings`` / ``output_layer``: vocab rows padded to ``padded_vocab_size``
  (Megatron pads the vocab to a multiple for even tensor-parallel shards); the padding is
  stripped on the way back. Tied models have no ``output_layer.weight``.

Tensor parallelism: a column-parallel weight is split along dim 0, a row-parallel one along
dim 1; ``linear_qkv`` splits whole query groups (so G must divide by TP), and ``linear_fc1``
splits gate and up separately (each rank holds ``[gate_r; up_r]``). ``shard_tp`` and
``gather_tp`` implement both directions.

Pipeline parallelism: each stage numbers its layers from 0; ``shard_pp`` / ``gather_pp`` move
layers between global and per-stage names (embedding on the first stage, final norm and output
layer on the last).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass(frozen=True)
class ArchSpec:
    """The shape facts of one decoder-only model that conversion needs."""

    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    ffn_hidden_size: int
    vocab_size: int
    padded_vocab_size: int
    tied_embeddings: bool
    qkv_bias: bool
    qk_norm: bool

    def validate(self) -> ArchSpec:
        """Raise ValueError naming the first inconsistent field."""
        for name in ("num_layers", "hidden_size", "num_heads", "num_kv_heads", "head_dim"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(
                f"num_heads ({self.num_heads}) must be a multiple of num_kv_heads "
                f"({self.num_kv_heads})"
            )
        if self.padded_vocab_size < self.vocab_size:
            raise ValueError(
                f"padded_vocab_size ({self.padded_vocab_size}) < vocab_size ({self.vocab_size})"
            )
        return self


SUPPORTED_MODEL_TYPES = ("qwen2", "qwen3", "llama")


def pad_vocab(vocab_size: int, multiple: int, tp_size: int = 1) -> int:
    """Megatron's padded vocab: the next multiple of ``multiple * tp_size``."""
    step = multiple * tp_size
    return -(-vocab_size // step) * step


def arch_from_hf_config(config, vocab_multiple: int = 128, tp_size: int = 1) -> ArchSpec:
    """The ArchSpec of an HF ``PretrainedConfig`` (qwen2, qwen3 or llama)."""
    model_type = getattr(config, "model_type", None)
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise ValueError(f"model_type must be one of {SUPPORTED_MODEL_TYPES}, got {model_type!r}")
    heads = config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    if model_type == "llama" and getattr(config, "mlp_bias", False):
        raise ValueError("mlp_bias=True is not supported (Megatron's SwiGLU MLP has no bias here)")
    return ArchSpec(
        num_layers=config.num_hidden_layers,
        hidden_size=config.hidden_size,
        num_heads=heads,
        num_kv_heads=getattr(config, "num_key_value_heads", None) or heads,
        head_dim=head_dim,
        ffn_hidden_size=config.intermediate_size,
        vocab_size=config.vocab_size,
        padded_vocab_size=pad_vocab(config.vocab_size, vocab_multiple, tp_size),
        tied_embeddings=bool(config.tie_word_embeddings),
        qkv_bias=model_type == "qwen2" or bool(getattr(config, "attention_bias", False)),
        qk_norm=model_type == "qwen3",
    ).validate()


# One row per Megatron parameter of decoder layer i: (megatron suffix, HF suffixes, how the HF
# tensors combine, tensor-parallel kind). "when" names the ArchSpec flag the row depends on.
# kinds: copy (one tensor as is), qkv (fuse q,k,v per group), gate_up (stack gate, up).
# tp: col (split dim 0), row (split dim 1), rep (replicated), qkv / gate_up (see module doc).
LAYER_TABLE: list[tuple[str, tuple[str, ...], str, str, str | None]] = [
    ("input_layernorm.weight", ("input_layernorm.weight",), "copy", "rep", None),
    (
        "self_attention.linear_qkv.weight",
        ("self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight"),
        "qkv",
        "qkv",
        None,
    ),
    (
        "self_attention.linear_qkv.bias",
        ("self_attn.q_proj.bias", "self_attn.k_proj.bias", "self_attn.v_proj.bias"),
        "qkv",
        "qkv",
        "qkv_bias",
    ),
    ("self_attention.q_layernorm.weight", ("self_attn.q_norm.weight",), "copy", "rep", "qk_norm"),
    ("self_attention.k_layernorm.weight", ("self_attn.k_norm.weight",), "copy", "rep", "qk_norm"),
    ("self_attention.linear_proj.weight", ("self_attn.o_proj.weight",), "copy", "row", None),
    ("pre_mlp_layernorm.weight", ("post_attention_layernorm.weight",), "copy", "rep", None),
    (
        "mlp.linear_fc1.weight",
        ("mlp.gate_proj.weight", "mlp.up_proj.weight"),
        "gate_up",
        "gate_up",
        None,
    ),
    ("mlp.linear_fc2.weight", ("mlp.down_proj.weight",), "copy", "row", None),
]

# Rows outside the decoder layers: (megatron name, HF name, tp kind, when).
GLOBAL_TABLE: list[tuple[str, str, str, str | None]] = [
    ("embedding.word_embeddings.weight", "model.embed_tokens.weight", "vocab", None),
    ("decoder.final_layernorm.weight", "model.norm.weight", "rep", None),
    ("output_layer.weight", "lm_head.weight", "vocab", "untied"),
]


def _active(arch: ArchSpec, when: str | None) -> bool:
    if when is None:
        return True
    if when == "untied":
        return not arch.tied_embeddings
    return bool(getattr(arch, when))


def _expect(name: str, t: Tensor, shape: tuple[int, ...]) -> Tensor:
    if tuple(t.shape) != shape:
        raise ValueError(f"{name}: expected shape {shape}, got {tuple(t.shape)}")
    return t


def _hf_shape(arch: ArchSpec, hf_suffix: str) -> tuple[int, ...]:
    a = arch
    shapes = {
        "input_layernorm.weight": (a.hidden_size,),
        "post_attention_layernorm.weight": (a.hidden_size,),
        "self_attn.q_proj.weight": (a.num_heads * a.head_dim, a.hidden_size),
        "self_attn.k_proj.weight": (a.num_kv_heads * a.head_dim, a.hidden_size),
        "self_attn.v_proj.weight": (a.num_kv_heads * a.head_dim, a.hidden_size),
        "self_attn.q_proj.bias": (a.num_heads * a.head_dim,),
        "self_attn.k_proj.bias": (a.num_kv_heads * a.head_dim,),
        "self_attn.v_proj.bias": (a.num_kv_heads * a.head_dim,),
        "self_attn.q_norm.weight": (a.head_dim,),
        "self_attn.k_norm.weight": (a.head_dim,),
        "self_attn.o_proj.weight": (a.hidden_size, a.num_heads * a.head_dim),
        "mlp.gate_proj.weight": (a.ffn_hidden_size, a.hidden_size),
        "mlp.up_proj.weight": (a.ffn_hidden_size, a.hidden_size),
        "mlp.down_proj.weight": (a.hidden_size, a.ffn_hidden_size),
    }
    return shapes[hf_suffix]


def fuse_qkv(q: Tensor, k: Tensor, v: Tensor, arch: ArchSpec) -> Tensor:
    """HF q (H*D, ...), k (G*D, ...), v (G*D, ...) -> Megatron's per-group ((H/G+2)*G*D, ...)."""
    g, d = arch.num_kv_heads, arch.head_dim
    per = arch.num_heads // g
    rest = q.shape[1:]
    q = q.reshape(g, per * d, *rest)  # (G, H/G*D, ...)
    k = k.reshape(g, d, *rest)  # (G, D, ...)
    v = v.reshape(g, d, *rest)  # (G, D, ...)
    return torch.cat([q, k, v], dim=1).reshape(g * (per + 2) * d, *rest)


def split_qkv(qkv: Tensor, arch: ArchSpec, num_groups: int | None = None):
    """Inverse of ``fuse_qkv``; ``num_groups`` < G for one tensor-parallel shard."""
    g = num_groups or arch.num_kv_heads
    d, per = arch.head_dim, arch.num_heads // arch.num_kv_heads
    rest = qkv.shape[1:]
    grouped = qkv.reshape(g, (per + 2) * d, *rest)  # (G, (H/G+2)*D, ...)
    q, k, v = grouped.split([per * d, d, d], dim=1)
    return (
        q.reshape(g * per * d, *rest),
        k.reshape(g * d, *rest),
        v.reshape(g * d, *rest),
    )


def _pad_rows(t: Tensor, rows: int) -> Tensor:
    if t.shape[0] == rows:
        return t
    return torch.cat([t, t.new_zeros(rows - t.shape[0], *t.shape[1:])])


def hf_to_megatron(hf: dict[str, Tensor], arch: ArchSpec) -> dict[str, Tensor]:
    """HF state dict -> full (unsharded) Megatron GPTModel state dict. Every expected HF
    tensor must be present with its expected shape; unknown or extra HF tensors are errors
    (``rotary_emb.inv_freq`` buffers excepted), so a silently unused weight cannot slip by."""
    arch.validate()
    used: set[str] = set()

    def take(name: str, shape: tuple[int, ...]) -> Tensor:
        if name not in hf:
            raise KeyError(f"HF state dict is missing {name!r}")
        used.add(name)
        return _expect(name, hf[name], shape)

    out: dict[str, Tensor] = {}
    for mg, hf_name, tp, when in GLOBAL_TABLE:
        if not _active(arch, when):
            continue
        shape = (arch.vocab_size, arch.hidden_size) if tp == "vocab" else (arch.hidden_size,)
        t = take(hf_name, shape)
        out[mg] = _pad_rows(t, arch.padded_vocab_size) if tp == "vocab" else t.clone()
    for i in range(arch.num_layers):
        for mg, hf_suffixes, kind, _tp, when in LAYER_TABLE:
            if not _active(arch, when):
                continue
            ts = [take(f"model.layers.{i}.{s}", _hf_shape(arch, s)) for s in hf_suffixes]
            name = f"decoder.layers.{i}.{mg}"
            if kind == "qkv":
                out[name] = fuse_qkv(*ts, arch)
            elif kind == "gate_up":
                out[name] = torch.cat(ts, dim=0)
            else:
                out[name] = ts[0].clone()
    # A tied HF state dict still lists lm_head.weight: the embedding under a second name.
    tied_head = {"lm_head.weight"} if arch.tied_embeddings else set()
    extra = sorted(k for k in hf if k not in used | tied_head and "rotary_emb" not in k)
    if extra:
        raise ValueError(f"HF state dict has tensors the conversion does not use: {extra}")
    return out


def megatron_to_hf(mg: dict[str, Tensor], arch: ArchSpec) -> dict[str, Tensor]:
    """Full (unsharded, or gathered with ``gather_tp``) Megatron state dict -> HF state dict
    (vocab padding stripped; no ``lm_head.weight`` when the embeddings are tied). Megatron's
    ``_extra_state`` entries are ignored; any other missing or extra tensor is an error."""
    arch.validate()
    used: set[str] = set()
    a = arch
    qkv_rows = (a.num_heads + 2 * a.num_kv_heads) * a.head_dim

    def take(name: str, shape: tuple[int, ...]) -> Tensor:
        if name not in mg:
            raise KeyError(f"Megatron state dict is missing {name!r}")
        used.add(name)
        return _expect(name, mg[name], shape)

    out: dict[str, Tensor] = {}
    for mg_name, hf_name, tp, when in GLOBAL_TABLE:
        if not _active(arch, when):
            continue
        if tp == "vocab":
            out[hf_name] = take(mg_name, (a.padded_vocab_size, a.hidden_size))[: a.vocab_size]
        else:
            out[hf_name] = take(mg_name, (a.hidden_size,)).clone()
    for i in range(a.num_layers):
        for mg_suffix, hf_suffixes, kind, _tp, when in LAYER_TABLE:
            if not _active(arch, when):
                continue
            name = f"decoder.layers.{i}.{mg_suffix}"
            hf_names = [f"model.layers.{i}.{s}" for s in hf_suffixes]
            if kind == "qkv":
                rest = (a.hidden_size,) if mg_suffix.endswith("weight") else ()
                parts = split_qkv(take(name, (qkv_rows, *rest)), arch)
            elif kind == "gate_up":
                parts = take(name, (2 * a.ffn_hidden_size, a.hidden_size)).chunk(2, dim=0)
            else:
                parts = (take(name, _hf_shape(arch, hf_suffixes[0])),)
            for hf_name, t in zip(hf_names, parts, strict=True):
                out[hf_name] = t.clone()
    extra = sorted(k for k in mg if k not in used and not k.endswith("_extra_state"))
    if extra:
        raise ValueError(f"Megatron state dict has tensors the conversion does not use: {extra}")
    return out


def _tp_kind(name: str) -> str:
    for mg, _hf, tp, _when in GLOBAL_TABLE:
        if name == mg:
            return "col" if tp == "vocab" else tp
    for mg, _hf, _kind, tp, _when in LAYER_TABLE:
        if name.endswith("." + mg):
            return tp
    raise ValueError(f"no tensor-parallel rule for Megatron tensor {name!r}")


def shard_tp(mg: dict[str, Tensor], arch: ArchSpec, tp_size: int, tp_rank: int):
    """Rank ``tp_rank``'s share of a full Megatron state dict under tensor parallelism."""
    if arch.num_kv_heads % tp_size or arch.ffn_hidden_size % tp_size:
        raise ValueError(
            f"tp_size {tp_size} must divide num_kv_heads ({arch.num_kv_heads}) and "
            f"ffn_hidden_size ({arch.ffn_hidden_size})"
        )
    out = {}
    for name, t in mg.items():
        if name.endswith("_extra_state"):
            continue
        kind = _tp_kind(name)
        if kind == "rep":
            out[name] = t.clone()
        elif kind in ("col", "qkv"):  # qkv rows are whole groups, in group order
            out[name] = t.chunk(tp_size, dim=0)[tp_rank].clone()
        elif kind == "row":
            out[name] = t.chunk(tp_size, dim=1)[tp_rank].clone()
        else:  # gate_up: [gate_r; up_r] on rank r
            gate, up = t.chunk(2, dim=0)
            r = tp_rank
            out[name] = torch.cat([gate.chunk(tp_size)[r], up.chunk(tp_size)[r]]).clone()
    return out


def gather_tp(shards: list[dict[str, Tensor]], arch: ArchSpec) -> dict[str, Tensor]:
    """Inverse of ``shard_tp``: the full Megatron state dict from every rank's share (in rank
    order), e.g. the result of an all_gather_object over the tensor-parallel group."""
    out = {}
    for name in shards[0]:
        if name.endswith("_extra_state"):
            continue
        ts = [s[name] for s in shards]
        kind = _tp_kind(name)
        if kind == "rep":
            out[name] = ts[0].clone()
        elif kind in ("col", "qkv"):
            out[name] = torch.cat(ts, dim=0)
        elif kind == "row":
            out[name] = torch.cat(ts, dim=1)
        else:
            gates, ups = zip(*(t.chunk(2, dim=0) for t in ts), strict=True)
            out[name] = torch.cat([*gates, *ups], dim=0)
    return out


def _layer_index(name: str) -> int | None:
    parts = name.split(".")
    if name.startswith("decoder.layers."):
        return int(parts[2])
    return None


def shard_pp(mg: dict[str, Tensor], arch: ArchSpec, pp_size: int, pp_rank: int):
    """Stage ``pp_rank``'s share of a full Megatron state dict under pipeline parallelism
    (even split): its layers renumbered from 0 (Megatron numbers layers per stage), the
    embedding on the first stage, the final norm and output layer on the last. With tied
    embeddings and pp_size > 1 the last stage holds its own copy of the embedding as
    ``output_layer.weight`` (Megatron keeps the two in step with an all-reduce)."""
    if arch.num_layers % pp_size:
        raise ValueError(f"pp_size {pp_size} must divide num_layers ({arch.num_layers})")
    per = arch.num_layers // pp_size
    first, last = pp_rank == 0, pp_rank == pp_size - 1
    out = {}
    for name, t in mg.items():
        i = _layer_index(name)
        if i is not None:
            if pp_rank * per <= i < (pp_rank + 1) * per:
                rest = name.split(".", 3)[3]
                out[f"decoder.layers.{i - pp_rank * per}.{rest}"] = t
        elif name == "embedding.word_embeddings.weight":
            if first:
                out[name] = t
            if last and arch.tied_embeddings and pp_size > 1:
                out["output_layer.weight"] = t.clone()
        elif last:
            out[name] = t
    return out


def gather_pp(stages: list[dict[str, Tensor]], arch: ArchSpec) -> dict[str, Tensor]:
    """Inverse of ``shard_pp``: the full Megatron state dict from every stage's share (in stage
    order). The last stage's copy of a tied embedding is dropped (the first stage's wins)."""
    per = arch.num_layers // len(stages)
    out = {}
    for rank, stage in enumerate(stages):
        last = rank == len(stages) - 1
        for name, t in stage.items():
            i = _layer_index(name)
            if i is not None:
                rest = name.split(".", 3)[3]
                out[f"decoder.layers.{i + rank * per}.{rest}"] = t
            elif not (last and name == "output_layer.weight" and arch.tied_embeddings):
                out[name] = t
    return out
