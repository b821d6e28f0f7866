"""Megatron-core GPTModel from an HF config (Qwen2, Qwen3, Llama), with HF weights in and out.

The Megatron training backend builds its model here: ``transformer_config_from_hf`` maps every
field of the HF config that changes the math (sizes, GQA groups, head dim, RMSNorm eps, rope
theta, QKV bias, q/k norm, SwiGLU, tied embeddings, padded vocab) onto a Megatron
``TransformerConfig``; ``build_gpt_model`` builds a ``GPTModel`` with the local (non
Transformer-Engine) layer spec, so the same model runs on GPUs and, with
``kernel.train.megatron_cpu`` patches, on CPU over gloo. Weights move through
``kernel.sync.convert`` (HF names and layouts <-> Megatron's).

``megatron_parallel`` sets up (and tears down) torch.distributed and Megatron's
``parallel_state`` so tests and single-process tools can run one after another in a process.

Megatron is imported inside the functions (house rule 6): importing this module is cheap.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import Tensor

from kernel.sync.convert import (
    ArchSpec,
    arch_from_hf_config,
    gather_pp,
    gather_tp,
    hf_to_megatron,
    megatron_to_hf,
    shard_pp,
    shard_tp,
)
from kernel.train.megatron_cpu import apply_cpu_patches

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


@dataclass
class MegatronModelConfig:
    """How the Megatron GPTModel is laid out (the architecture itself comes from the HF
    config)."""

    tensor_parallel: int = 1
    """Tensor-parallel size (must divide the number of key/value heads and the ffn size)."""
    pipeline_parallel: int = 1
    """Pipeline-parallel size (must divide the number of layers)."""
    vocab_multiple: int = 128
    """Pad the vocab to a multiple of this times tensor_parallel (Megatron's
    make_vocab_size_divisible_by); the padding is stripped when weights go back to HF."""
    dtype: str = "float32"
    """Parameter dtype: float32 or bfloat16."""
    seed: int = 1234
    """Seed of Megatron's data-/tensor-parallel RNG streams (dropout, initialisation)."""

    def validate(self) -> MegatronModelConfig:
        """Raise ValueError naming the first field with a bad value."""
        for name in ("tensor_parallel", "pipeline_parallel", "vocab_multiple"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {sorted(DTYPES)}, got {self.dtype!r}")
        return self


def _rope_theta(hf_config) -> float:
    # transformers >= 5 keeps rope settings in rope_parameters; older versions in rope_theta.
    params = getattr(hf_config, "rope_parameters", None) or {}
    rope_type = params.get("rope_type", "default")
    scaling = getattr(hf_config, "rope_scaling", None) or {}
    rope_type = scaling.get("rope_type", scaling.get("type", rope_type))
    if rope_type != "default":
        raise ValueError(f"rope_type {rope_type!r} is not supported (only plain RoPE)")
    theta = params.get("rope_theta", getattr(hf_config, "rope_theta", None))
    if theta is None:
        raise ValueError("the HF config has no rope_theta")
    return float(theta)


def transformer_config_from_hf(hf_config, cfg: MegatronModelConfig):
    """Megatron ``TransformerConfig`` of an HF Qwen2 / Qwen3 / Llama config."""
    from megatron.core.transformer import TransformerConfig

    cfg.validate()
    arch = arch_from_hf_config(hf_config, cfg.vocab_multiple, cfg.tensor_parallel)
    if getattr(hf_config, "hidden_act", "silu") != "silu":
        raise ValueError(f"hidden_act must be silu (SwiGLU), got {hf_config.hidden_act!r}")
    if arch.num_layers % cfg.pipeline_parallel:
        raise ValueError(
            f"pipeline_parallel ({cfg.pipeline_parallel}) must divide num_hidden_layers "
            f"({arch.num_layers})"
        )
    dtype = DTYPES[cfg.dtype]
    return TransformerConfig(
        num_layers=arch.num_layers,
        hidden_size=arch.hidden_size,
        num_attention_heads=arch.num_heads,
        num_query_groups=arch.num_kv_heads,
        kv_channels=arch.head_dim,
        ffn_hidden_size=arch.ffn_hidden_size,
        normalization="RMSNorm",
        layernorm_epsilon=hf_config.rms_norm_eps,
        add_bias_linear=False,
        add_qkv_bias=arch.qkv_bias,
        qk_layernorm=arch.qk_norm,
        gated_linear_unit=True,
        activation_func=torch.nn.functional.silu,
        hidden_dropout=0.0,
        attention_dropout=0.0,
        tensor_model_parallel_size=cfg.tensor_parallel,
        pipeline_model_parallel_size=cfg.pipeline_parallel,
        # micro-batches of padded rows differ in shape: the pipeline schedule sends each
        # tensor's shape before the tensor
        variable_seq_lengths=cfg.pipeline_parallel > 1,
        moe_token_dispatcher_type="alltoall",  # no MoE here; the default one refuses the above
        params_dtype=dtype,
        pipeline_dtype=dtype,
        bf16=dtype == torch.bfloat16,
        use_cpu_initialization=not torch.cuda.is_available(),
    )


def build_gpt_model(hf_config, cfg: MegatronModelConfig):
    """A randomly initialised Megatron ``GPTModel`` for this rank's pipeline stage and tensor
    shard, and the model's ArchSpec. Needs ``parallel_state`` initialised (see
    ``megatron_parallel``)."""
    from megatron.core import parallel_state
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec

    apply_cpu_patches()
    tcfg = transformer_config_from_hf(hf_config, cfg)
    arch = arch_from_hf_config(hf_config, cfg.vocab_multiple, cfg.tensor_parallel)
    spec = get_gpt_layer_local_spec(normalization="RMSNorm", qk_layernorm=arch.qk_norm)
    model = GPTModel(
        config=tcfg,
        transformer_layer_spec=spec,
        vocab_size=arch.padded_vocab_size,
        max_sequence_length=hf_config.max_position_embeddings,
        pre_process=parallel_state.is_pipeline_first_stage(),
        post_process=parallel_state.is_pipeline_last_stage(),
        share_embeddings_and_output_weights=arch.tied_embeddings,
        position_embedding_type="rope",
        rotary_base=_rope_theta(hf_config),
    )
    return model, arch


def _params(model) -> dict[str, Tensor]:
    return dict(model.named_parameters())


def load_hf_weights(model, hf_state: dict[str, Tensor], arch: ArchSpec) -> None:
    """Copy an HF state dict into this rank's part of a Megatron model (its pipeline stage and
    tensor shard), through ``kernel.sync.convert``. Every model parameter must receive a tensor
    of its exact shape."""
    from megatron.core import parallel_state as ps

    full = hf_to_megatron(hf_state, arch)
    stage = shard_pp(
        full,
        arch,
        ps.get_pipeline_model_parallel_world_size(),
        ps.get_pipeline_model_parallel_rank(),
    )
    mine = shard_tp(
        stage,
        arch,
        ps.get_tensor_model_parallel_world_size(),
        ps.get_tensor_model_parallel_rank(),
    )
    params = _params(model)
    missing, extra = sorted(set(params) - set(mine)), sorted(set(mine) - set(params))
    if missing or extra:
        raise ValueError(
            f"Megatron model / converted weights differ: missing {missing}, extra {extra}"
        )
    with torch.no_grad():
        for name, p in params.items():
            if p.shape != mine[name].shape:
                raise ValueError(
                    f"{name}: model has shape {tuple(p.shape)}, converted weight "
                    f"{tuple(mine[name].shape)}"
                )
            p.copy_(mine[name])


def export_hf_weights(model, arch: ArchSpec) -> dict[str, Tensor]:
    """The HF state dict of a Megatron model, gathered over the tensor-parallel group, then
    over the pipeline stages; every rank receives it. (Objects travel through
    ``all_gather_object``: simple and fine for tests and small models; a production sync
    streams buckets instead.)"""
    from megatron.core import parallel_state as ps

    mine = {k: v.detach().cpu() for k, v in _params(model).items()}
    tp = ps.get_tensor_model_parallel_world_size()
    if tp > 1:
        shards: list = [None] * tp
        dist.all_gather_object(shards, mine, group=ps.get_tensor_model_parallel_group())
        mine = gather_tp(shards, arch)
    pp = ps.get_pipeline_model_parallel_world_size()
    if pp > 1:
        stages: list = [None] * pp
        dist.all_gather_object(stages, mine, group=ps.get_pipeline_model_parallel_group())
        mine = gather_pp(stages, arch)
    return megatron_to_hf(mine, arch)


def forward_logits(model, input_ids: Tensor, arch: ArchSpec) -> Tensor:
    """Causal-LM logits (B, T, vocab_size) of a PP=1 model, gathered over tensor-parallel
    ranks, vocab padding stripped. (PP > 1 needs Megatron's pipeline schedules.)"""
    b, t = input_ids.shape
    position_ids = torch.arange(t, device=input_ids.device).expand(b, t)  # (B, T)
    logits = model(input_ids, position_ids, attention_mask=None)  # (B, T, V_pad / TP)
    from megatron.core import parallel_state
    from megatron.core.tensor_parallel import gather_from_tensor_model_parallel_region

    if parallel_state.get_tensor_model_parallel_world_size() > 1:
        logits = gather_from_tensor_model_parallel_region(logits)  # (B, T, V_pad)
    return logits[..., : arch.vocab_size]


@contextlib.contextmanager
def megatron_parallel(
    tensor_parallel: int = 1, pipeline_parallel: int = 1, seed: int = 1234
) -> Iterator[None]:
    """Initialise Megatron's ``parallel_state`` (and, if none is running, a one-process gloo
    group) for the body, and tear both down after, so runs can follow each other in one
    process. Multi-process runs initialise torch.distributed themselves first."""
    from megatron.core import parallel_state
    from megatron.core.tensor_parallel import model_parallel_cuda_manual_seed

    apply_cpu_patches()
    own_group = not dist.is_initialized()
    if own_group:
        # A HashStore needs no port: a one-process group cannot collide with anything. Gloo
        # cannot reduce CUDA tensors (Megatron's grad all-reduce): NCCL takes those on a GPU.
        backend = "cpu:gloo,cuda:nccl" if torch.cuda.is_available() else "gloo"
        dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1)
    try:
        parallel_state.initialize_model_parallel(tensor_parallel, pipeline_parallel)
        model_parallel_cuda_manual_seed(seed)
        yield
    finally:
        parallel_state.destroy_model_parallel()
        if own_group:
            dist.destroy_process_group()
