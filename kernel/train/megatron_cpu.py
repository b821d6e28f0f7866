"""Patches that let Megatron-core 0.16 build and run a GPTModel on a machine without a GPU.

Megatron-core assumes CUDA in a handful of places that have nothing to do with the math: it
asks for "the current CUDA device" to place buffers, and it keeps its dropout RNG streams as
CUDA generator states. On a CPU-only torch build each of those calls raises "Torch not compiled
with CUDA enabled". The embedded default (DESIGN.md: "Megatron-core on CPU over gloo for
conversion/sync tests") needs the real Megatron model on CPU, so ``apply_cpu_patches()``
redirects exactly those calls to their CPU meaning. Each patch below says what Megatron calls,
why it fails on CPU, and what we do instead.

The patches are global (torch.cuda attributes and two functions of Megatron's RNG module), so
they are applied only when CUDA is absent: there every patched call would raise anyway, so no
working code path changes. With a GPU, ``apply_cpu_patches()`` does nothing. It is idempotent.

Megatron is imported here only inside ``apply_cpu_patches`` (house rule 6).
"""

from __future__ import annotations

import functools

import torch

_APPLIED = False


def _current_device() -> torch.device:
    # Megatron places new tensors with ``device=torch.cuda.current_device()``; on CPU the
    # only device there is is the CPU.
    return torch.device("cpu")


def _get_rng_state(device=None, clone: bool = False, graph_safe: bool = False) -> torch.Tensor:
    # The CPU generator plays the role of "the current GPU's generator".
    return torch.get_rng_state()


def _set_rng_state(new_state: torch.Tensor, device=None, graph_safe: bool = False) -> None:
    torch.set_rng_state(new_state)


def _manual_seed(seed: int) -> None:
    torch.manual_seed(seed)


def _synchronize(device=None) -> None:
    # CPU ops run synchronously: there is nothing to wait for.
    return None


def _causal_mask(sq: int) -> torch.Tensor:
    # Megatron's version builds the mask with device="cuda" (hard-coded).
    return torch.triu(torch.ones(sq, sq), diagonal=1).bool()  # (sq, sq), True = masked


def _stay_on_cpu(method):
    # Runs ``method`` with Tensor.cuda() returning the tensor itself, for this call only.
    @functools.wraps(method)
    def wrapper(*args, **kwargs):
        cuda = torch.Tensor.cuda
        torch.Tensor.cuda = lambda t, *a, **k: t
        try:
            return method(*args, **kwargs)
        finally:
            torch.Tensor.cuda = cuda

    return wrapper


def cpu_patches_applied() -> bool:
    """Whether ``apply_cpu_patches`` has patched this process."""
    return _APPLIED


def apply_cpu_patches() -> bool:
    """Make Megatron-core usable on CPU; a no-op when CUDA is available. Returns whether the
    patches are (now) applied. Safe to call any number of times.

    Patches, each for a call that raises on a CPU-only torch:

    1. ``torch.cuda.current_device``: RotaryEmbedding.get_emb moves ``inv_freq`` to it on the
       first forward; other Megatron code allocates with ``device=torch.cuda.current_device()``
       (DDP grad buffers, tensor-parallel weights without ``use_cpu_initialization``).
       Returns ``torch.device("cpu")`` so those tensors stay on the CPU.
    2. ``torch.cuda.get_rng_state`` / ``torch.cuda.manual_seed`` / ``torch.cuda.set_rng_state``:
       ``model_parallel_cuda_manual_seed`` and ``CudaRNGStatesTracker.add`` seed and snapshot
       the "CUDA" generator to build the data-/tensor-/expert-parallel RNG streams. Redirected
       to the CPU generator, so each stream is a CPU generator state.
    3. ``megatron.core.tensor_parallel.random._get_cuda_rng_state`` / ``_set_cuda_rng_state``:
       the tracker's ``fork()`` (used around dropout and weight init in tensor-parallel
       regions) swaps generator states through these two helpers, which index
       ``torch.cuda.default_generators``. Replaced by CPU get/set. (Megatron logs a warning
       "CPU RNG state changed within GPU RNG context" when a forked region draws random
       numbers, since both streams are now the CPU one; harmless with dropout 0.)
    4. ``megatron.core.fusions.fused_softmax.get_default_causal_mask``: the local (non-TE)
       attention's softmax builds its causal mask with a hard-coded ``device="cuda"``. Replaced
       (in the module that imported it by name) by the same upper-triangular mask on CPU.
       (Sliding-window attention has the same problem and is not patched: no family here uses
       it.)
    5. ``torch.cuda.synchronize``: called around barriers and timers; a no-op on CPU.
    6. ``LanguageModule.setup_embeddings_and_output_layer``: with tied embeddings and pipeline
       parallelism the last stage holds a copy of the embedding, which Megatron moves with
       ``weight.data.cuda()`` before all-reducing it from the first stage. Wrapped so that,
       during this one method only, ``Tensor.cuda()`` returns the tensor itself (gloo
       all-reduces CPU tensors). ``Tensor.cuda`` stays untouched everywhere else.
    """
    global _APPLIED
    if _APPLIED:
        return True
    if torch.cuda.is_available():
        return False
    from megatron.core.fusions import fused_softmax
    from megatron.core.models.common.language_module.language_module import LanguageModule
    from megatron.core.tensor_parallel import random as mrandom

    torch.cuda.current_device = _current_device
    torch.cuda.get_rng_state = _get_rng_state
    torch.cuda.set_rng_state = _set_rng_state
    torch.cuda.manual_seed = _manual_seed
    torch.cuda.synchronize = _synchronize
    fused_softmax.get_default_causal_mask = _causal_mask
    mrandom._get_cuda_rng_state = _get_rng_state
    mrandom._set_cuda_rng_state = _set_rng_state
    setup = LanguageModule.setup_embeddings_and_output_layer
    LanguageModule.setup_embeddings_and_output_layer = _stay_on_cpu(setup)
    _APPLIED = True
    return True
