"""Tests for kernel/train/megatron_model.py and kernel/train/megatron_cpu.py: a real
Megatron-core GPTModel on CPU over gloo computes the same logits as the HF model whose weights
it loaded, and hands the weights back bit for bit (float32).

The tensor-parallel test launches this file twice as a script (ranks 0 and 1 of a gloo group
on 127.0.0.1); rank 0 saves the gathered logits and weights for the test to check."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

pytest.importorskip("megatron.core")

from transformers import AutoConfig, AutoModelForCausalLM

from kernel.train.megatron_model import (
    MegatronModelConfig,
    build_gpt_model,
    export_hf_weights,
    forward_logits,
    load_hf_weights,
    megatron_parallel,
    transformer_config_from_hf,
)
from tests.megatron.conftest import run_ranks

VOCAB = 100  # the char tokenizer's size: not a multiple of 128, so padding is exercised


def hf_model(family: str, **overrides):
    """A tiny HF model of ``family`` with every weight (biases and norms too) randomised, so a
    mis-mapped tensor cannot hide behind a zero bias or a unit norm."""
    kw = dict(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
        rms_norm_eps=1e-5,
        tie_word_embeddings=True,
    )
    config = AutoConfig.for_model(family, **(kw | overrides))
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(torch.randn_like(p) * (0.2 if "norm" in name else 0.1) + ("norm" in name))
    return model


CASES = {
    # GQA 4/2, QKV bias, tied embeddings, rope theta not the default
    "qwen2": ("qwen2", {"rope_theta": 50000.0}),
    # q/k RMSNorm, head_dim 32 != hidden/heads (16), untied output layer
    "qwen3": ("qwen3", {"head_dim": 32, "tie_word_embeddings": False}),
    # no bias, multi-head (4 kv heads), untied
    "llama": ("llama", {"num_key_value_heads": 4, "tie_word_embeddings": False}),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_logits_match_hf_and_weights_round_trip(case):
    family, overrides = CASES[case]
    hf = hf_model(family, **overrides)
    ids = torch.randint(0, VOCAB, (2, 13), generator=torch.Generator().manual_seed(1))  # (B, T)
    with torch.no_grad():
        want = hf(ids).logits  # (B, T, V)
    with megatron_parallel():
        model, arch = build_gpt_model(hf.config, MegatronModelConfig())
        assert arch.padded_vocab_size == 128
        load_hf_weights(model, hf.state_dict(), arch)
        model.eval()
        with torch.no_grad():
            got = forward_logits(model, ids, arch)  # (B, T, V)
        back = export_hf_weights(model, arch)
    assert got.shape == want.shape
    torch.testing.assert_close(got, want, rtol=0, atol=1e-4)
    hf_sd = hf.state_dict()
    if hf.config.tie_word_embeddings:
        hf_sd.pop("lm_head.weight")  # the embedding under a second name
    assert sorted(back) == sorted(hf_sd)
    for k in hf_sd:
        assert torch.equal(back[k], hf_sd[k]), k


def test_backward_gives_hf_gradients():
    """Training runs through the same graph: the gradient of a next-token cross-entropy w.r.t.
    every Megatron parameter, converted to HF layout like a weight, is HF's gradient."""
    from kernel.sync.convert import megatron_to_hf

    hf = hf_model("qwen3", tie_word_embeddings=True)
    ids = torch.randint(0, VOCAB, (2, 13), generator=torch.Generator().manual_seed(1))  # (B, T)

    def loss_of(logits):  # (B, T, V) -> next-token cross-entropy over B * (T - 1) tokens
        return F.cross_entropy(logits[:, :-1].reshape(-1, VOCAB), ids[:, 1:].reshape(-1))

    loss_of(hf(ids).logits).backward()
    with megatron_parallel():
        model, arch = build_gpt_model(hf.config, MegatronModelConfig())
        load_hf_weights(model, hf.state_dict(), arch)
        loss_of(forward_logits(model, ids, arch)).backward()
        # vocab padding rows get zero gradient and are stripped like the weight's padding
        grads = megatron_to_hf({n: p.grad for n, p in model.named_parameters()}, arch)
    for name, p in hf.named_parameters():
        torch.testing.assert_close(grads[name], p.grad, rtol=1e-4, atol=1e-6, msg=name)


def test_config_mapping_fields():
    hf = hf_model("qwen3", head_dim=32, rope_theta=1e6, rms_norm_eps=1e-6)
    with megatron_parallel():
        tcfg = transformer_config_from_hf(hf.config, MegatronModelConfig())
    assert (tcfg.num_attention_heads, tcfg.num_query_groups, tcfg.kv_channels) == (4, 2, 32)
    assert (tcfg.ffn_hidden_size, tcfg.layernorm_epsilon) == (96, 1e-6)
    assert tcfg.qk_layernorm and tcfg.gated_linear_unit and not tcfg.add_qkv_bias
    assert tcfg.normalization == "RMSNorm"


def test_unsupported_configs_fail_clearly():
    hf = hf_model("llama", hidden_act="gelu")
    with pytest.raises(ValueError, match="hidden_act must be silu"):
        transformer_config_from_hf(hf.config, MegatronModelConfig())
    with pytest.raises(ValueError, match="dtype must be one of"):
        MegatronModelConfig(dtype="float16").validate()
    with pytest.raises(ValueError, match=r"pipeline_parallel \(3\) must divide"):
        transformer_config_from_hf(
            hf_model("qwen2").config, MegatronModelConfig(pipeline_parallel=3)
        )


def test_load_rejects_weights_of_another_shape():
    small, big = hf_model("qwen2"), hf_model("qwen2", intermediate_size=128)
    with megatron_parallel():
        model, arch = build_gpt_model(small.config, MegatronModelConfig())
        with pytest.raises(ValueError, match=r"mlp.gate_proj.weight: expected shape \(96, 64\)"):
            load_hf_weights(model, big.state_dict(), arch)


def test_parallel_state_is_torn_down():
    import torch.distributed as dist
    from megatron.core import parallel_state

    with megatron_parallel():
        assert parallel_state.model_parallel_is_initialized()
    assert not parallel_state.model_parallel_is_initialized()
    assert not dist.is_initialized()


# Tied embeddings: with PP=2 the last stage holds its own copy of the embedding as its output
# layer, the case conversion must get right.
TP_CASE = ("qwen2", {"num_key_value_heads": 2, "tie_word_embeddings": True})


def run_tp_rank(rank: int, world: int, port: int, out: Path) -> None:
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    family, overrides = TP_CASE
    hf = hf_model(family, **overrides)
    ids = torch.randint(0, VOCAB, (2, 13), generator=torch.Generator().manual_seed(1))  # (B, T)
    with megatron_parallel(tensor_parallel=world):
        model, arch = build_gpt_model(hf.config, MegatronModelConfig(tensor_parallel=world))
        load_hf_weights(model, hf.state_dict(), arch)
        model.eval()
        shapes = {n: tuple(p.shape) for n, p in model.named_parameters()}
        with torch.no_grad():
            logits = forward_logits(model, ids, arch)  # (B, T, V), gathered over TP
        back = export_hf_weights(model, arch)
    # then pipeline parallel on the same two processes: two stages of one layer each
    with megatron_parallel(pipeline_parallel=world):
        model, arch = build_gpt_model(hf.config, MegatronModelConfig(pipeline_parallel=world))
        load_hf_weights(model, hf.state_dict(), arch)
        stage_names = sorted(n for n, _ in model.named_parameters())
        pp_back = export_hf_weights(model, arch)
    if rank == 0:
        torch.save({"logits": logits, "back": back, "shapes": shapes}, out / "tp.pt")
    torch.save({"names": stage_names, "back": pp_back}, out / f"pp{rank}.pt")
    dist.destroy_process_group()


@pytest.mark.slow
def test_tensor_and_pipeline_parallel_two_ranks_match_hf(tmp_path):
    world = 2
    run_ranks(__file__, lambda r, port: [str(r), str(world), str(port), str(tmp_path)], world)
    got = torch.load(tmp_path / "tp.pt")
    family, overrides = TP_CASE
    hf = hf_model(family, **overrides)
    ids = torch.randint(0, VOCAB, (2, 13), generator=torch.Generator().manual_seed(1))  # (B, T)
    with torch.no_grad():
        want = hf(ids).logits  # (B, T, V)
    # Rank 0 holds half of each column-parallel weight: 2 of the 4 query heads (one group,
    # (2 + 2) * 16 qkv rows), half of gate and of up (2 * 48 rows), and 256 / 2 vocab rows
    # (vocab 100 padded to a multiple of 128 * TP = 256).
    layer = "decoder.layers.0."
    assert got["shapes"][layer + "self_attention.linear_qkv.weight"] == (64, 64)
    assert got["shapes"][layer + "mlp.linear_fc1.weight"] == (96, 64)
    assert got["shapes"][layer + "mlp.linear_fc2.weight"] == (64, 48)
    assert got["shapes"]["embedding.word_embeddings.weight"] == (128, 64)
    torch.testing.assert_close(got["logits"], want, rtol=0, atol=1e-4)
    hf_sd = hf.state_dict()
    hf_sd.pop("lm_head.weight")  # tied: the embedding under a second name
    assert sorted(got["back"]) == sorted(hf_sd)
    for k in hf_sd:
        assert torch.equal(got["back"][k], hf_sd[k]), k
    # PP=2: stage 0 holds layer 0 and the embedding, stage 1 layer 1 (numbered 0 there), the
    # final norm and the output layer (the tied embedding's copy); both ranks export the
    # whole HF model bit for bit.
    stages = [torch.load(tmp_path / f"pp{r}.pt") for r in range(world)]
    layer0 = {n for n in got["shapes"] if n.startswith("decoder.layers.0.")}
    assert stages[0]["names"] == sorted(layer0 | {"embedding.word_embeddings.weight"})
    assert stages[1]["names"] == sorted(
        layer0 | {"decoder.final_layernorm.weight", "output_layer.weight"}
    )
    for stage in stages:
        assert sorted(stage["back"]) == sorted(hf_sd)
        for k in hf_sd:
            assert torch.equal(stage["back"][k], hf_sd[k]), k


if __name__ == "__main__":
    run_tp_rank(int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), Path(sys.argv[4]))
