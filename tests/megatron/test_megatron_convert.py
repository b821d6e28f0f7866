"""Tests for kernel/sync/convert.py: HF <-> Megatron layouts, written out by hand on tensors
small enough to read (plain torch; Megatron itself is not needed)."""

from __future__ import annotations

import pytest
import torch

from kernel.sync.convert import (
    ArchSpec,
    fuse_qkv,
    gather_pp,
    gather_tp,
    hf_to_megatron,
    megatron_to_hf,
    pad_vocab,
    shard_pp,
    shard_tp,
    split_qkv,
)

# 4 query heads in 2 groups, head_dim 1, hidden 1: every row of q/k/v is one readable number.
TINY = ArchSpec(
    num_layers=1,
    hidden_size=1,
    num_heads=4,
    num_kv_heads=2,
    head_dim=1,
    ffn_hidden_size=4,
    vocab_size=3,
    padded_vocab_size=4,
    tied_embeddings=True,
    qkv_bias=True,
    qk_norm=False,
)


def col(*xs: float) -> torch.Tensor:
    return torch.tensor(xs).reshape(-1, 1)  # (rows, hidden=1)


def tiny_hf() -> dict[str, torch.Tensor]:
    p = "model.layers.0."
    return {
        "model.embed_tokens.weight": col(1, 2, 3),
        "model.norm.weight": torch.tensor([7.0]),
        p + "input_layernorm.weight": torch.tensor([5.0]),
        p + "post_attention_layernorm.weight": torch.tensor([6.0]),
        p + "self_attn.q_proj.weight": col(0, 1, 2, 3),
        p + "self_attn.k_proj.weight": col(10, 11),
        p + "self_attn.v_proj.weight": col(20, 21),
        p + "self_attn.q_proj.bias": torch.tensor([0.5, 1.5, 2.5, 3.5]),
        p + "self_attn.k_proj.bias": torch.tensor([10.5, 11.5]),
        p + "self_attn.v_proj.bias": torch.tensor([20.5, 21.5]),
        p + "self_attn.o_proj.weight": torch.tensor([[30.0, 31.0, 32.0, 33.0]]),
        p + "mlp.gate_proj.weight": col(40, 41, 42, 43),
        p + "mlp.up_proj.weight": col(50, 51, 52, 53),
        p + "mlp.down_proj.weight": torch.tensor([[60.0, 61.0, 62.0, 63.0]]),
    }


def test_fuse_qkv_interleaves_per_query_group():
    # group 0 = query heads 0,1 + k0 + v0; group 1 = query heads 2,3 + k1 + v1
    fused = fuse_qkv(col(0, 1, 2, 3), col(10, 11), col(20, 21), TINY)
    assert fused.flatten().tolist() == [0, 1, 10, 20, 2, 3, 11, 21]
    q, k, v = split_qkv(fused, TINY)
    assert (q.flatten().tolist(), k.flatten().tolist(), v.flatten().tolist()) == (
        [0, 1, 2, 3],
        [10, 11],
        [20, 21],
    )


def test_hf_to_megatron_layout_and_vocab_padding():
    mg = hf_to_megatron(tiny_hf(), TINY)
    layer = "decoder.layers.0."
    assert mg[layer + "self_attention.linear_qkv.weight"].flatten().tolist() == [
        0, 1, 10, 20, 2, 3, 11, 21,
    ]  # fmt: skip
    assert mg[layer + "self_attention.linear_qkv.bias"].tolist() == [
        0.5, 1.5, 10.5, 20.5, 2.5, 3.5, 11.5, 21.5,
    ]  # fmt: skip
    # SwiGLU: [gate; up] along dim 0
    assert mg[layer + "mlp.linear_fc1.weight"].flatten().tolist() == [
        40,
        41,
        42,
        43,
        50,
        51,
        52,
        53,
    ]
    assert mg[layer + "input_layernorm.weight"].tolist() == [5.0]
    assert mg[layer + "pre_mlp_layernorm.weight"].tolist() == [6.0]
    # 3 vocab rows padded with one zero row to padded_vocab_size 4
    assert mg["embedding.word_embeddings.weight"].flatten().tolist() == [1, 2, 3, 0]
    assert "output_layer.weight" not in mg  # tied


def test_round_trip_is_bitwise_and_drops_padding():
    hf = tiny_hf()
    back = megatron_to_hf(hf_to_megatron(hf, TINY), TINY)
    assert sorted(back) == sorted(hf)
    for k in hf:
        assert torch.equal(back[k], hf[k]), k


def test_tensor_parallel_shards_by_hand_and_gathers_back():
    mg = hf_to_megatron(tiny_hf(), TINY)
    r0, r1 = (shard_tp(mg, TINY, 2, r) for r in (0, 1))
    layer = "decoder.layers.0."
    # qkv: whole query groups per rank
    assert r0[layer + "self_attention.linear_qkv.weight"].flatten().tolist() == [0, 1, 10, 20]
    assert r1[layer + "self_attention.linear_qkv.weight"].flatten().tolist() == [2, 3, 11, 21]
    # fc1: rank r holds [gate_r; up_r]
    assert r0[layer + "mlp.linear_fc1.weight"].flatten().tolist() == [40, 41, 50, 51]
    assert r1[layer + "mlp.linear_fc1.weight"].flatten().tolist() == [42, 43, 52, 53]
    # row-parallel: split along dim 1
    assert r1[layer + "self_attention.linear_proj.weight"].tolist() == [[32.0, 33.0]]
    assert r0[layer + "mlp.linear_fc2.weight"].tolist() == [[60.0, 61.0]]
    # vocab-parallel embedding: rows 0-1 and 2-3 (the padding row)
    assert r1["embedding.word_embeddings.weight"].flatten().tolist() == [3, 0]
    assert r0[layer + "input_layernorm.weight"].tolist() == [5.0]  # replicated
    full = gather_tp([r0, r1], TINY)
    assert sorted(full) == sorted(mg)
    for k in mg:
        assert torch.equal(full[k], mg[k]), k


def test_pad_vocab():
    # 100 tokens, multiple 128: 128; with TP=2 the step is 256
    assert pad_vocab(100, 128) == 128
    assert pad_vocab(100, 128, tp_size=2) == 256
    assert pad_vocab(256, 128) == 256


def test_wrong_shape_names_the_tensor():
    hf = tiny_hf()
    hf["model.layers.0.self_attn.k_proj.weight"] = col(10, 11, 12)
    with pytest.raises(ValueError, match=r"k_proj.weight: expected shape \(2, 1\), got \(3, 1\)"):
        hf_to_megatron(hf, TINY)


def test_missing_and_unused_tensors_are_errors():
    hf = tiny_hf()
    del hf["model.norm.weight"]
    with pytest.raises(KeyError, match=r"model\.norm\.weight"):
        hf_to_megatron(hf, TINY)
    hf = tiny_hf() | {"model.layers.0.self_attn.q_norm.weight": torch.ones(1)}
    with pytest.raises(ValueError, match="q_norm"):
        hf_to_megatron(hf, TINY)  # TINY has no q/k norm: the tensor would be dropped silently
    mg = hf_to_megatron(tiny_hf(), TINY)
    mg["decoder.layers.0.mlp.linear_fc1.weight"] = torch.zeros(6, 1)
    with pytest.raises(ValueError, match=r"linear_fc1.weight: expected shape \(8, 1\)"):
        megatron_to_hf(mg, TINY)


def test_tp_size_must_divide_groups():
    mg = hf_to_megatron(tiny_hf(), TINY)
    with pytest.raises(ValueError, match="tp_size 4 must divide num_kv_heads"):
        shard_tp(mg, TINY, 4, 0)


def test_arch_validate_names_field():
    bad = ArchSpec(**{**TINY.__dict__, "num_kv_heads": 3})
    with pytest.raises(ValueError, match=r"num_heads \(4\) must be a multiple of num_kv_heads"):
        bad.validate()


def test_pipeline_stages_renumber_layers_and_gather_back():
    arch = ArchSpec(**{**TINY.__dict__, "num_layers": 4})
    mg = {f"decoder.layers.{i}.input_layernorm.weight": torch.tensor([float(i)]) for i in range(4)}
    mg["embedding.word_embeddings.weight"] = col(1, 2, 3, 0)
    mg["decoder.final_layernorm.weight"] = torch.tensor([7.0])
    s0, s1 = (shard_pp(mg, arch, 2, r) for r in (0, 1))
    # stage 0: global layers 0, 1 and the embedding; stage 1: global layers 2, 3 as local 0, 1,
    # the final norm, and (tied, PP > 1) its own copy of the embedding as the output layer
    assert sorted(s0) == [
        "decoder.layers.0.input_layernorm.weight",
        "decoder.layers.1.input_layernorm.weight",
        "embedding.word_embeddings.weight",
    ]
    assert s1["decoder.layers.0.input_layernorm.weight"].tolist() == [2.0]
    assert s1["decoder.layers.1.input_layernorm.weight"].tolist() == [3.0]
    assert s1["output_layer.weight"].flatten().tolist() == [1, 2, 3, 0]
    assert s1["decoder.final_layernorm.weight"].tolist() == [7.0]
    assert "embedding.word_embeddings.weight" not in s1
    full = gather_pp([s0, s1], arch)
    assert sorted(full) == sorted(mg)
    for k in mg:
        assert torch.equal(full[k], mg[k]), k
    with pytest.raises(ValueError, match=r"pp_size 3 must divide num_layers \(4\)"):
        shard_pp(mg, arch, 3, 0)
