"""Patches that let Megatron-core (0.19) build, train (its pipeline schedules, its optimizers)
and run a GPTModel on a machine without a GPU.

Megatron-core assumes CUDA in a handful of places that have nothing to do with the math: it
asks for "the current CUDA device" to place buffers, it keeps its dropout RNG streams as CUDA
generator states, its schedules and optimizers allocate small bookkeeping tensors (token
counters, norms, scales) with ``device="cuda"``, and its optimizers check parameter type names
("torch.cuda.FloatTensor"). On a CPU-only torch build each of those calls raises "Torch not
compiled with CUDA enabled" (or a TypeError). The embedded default (DESIGN.md: "Megatron-core
on CPU over gloo for conversion/sync tests") needs the real Megatron model on CPU, so
``apply_cpu_patches()`` redirects exactly those calls to their CPU meaning. Each patch below
says what Megatron calls, why it fails on CPU, and what we do instead.

The patches are global (torch.cuda attributes, functions and the ``torch`` name of a few
Megatron modules), so they are applied only when CUDA is absent: there every patched call
would raise anyway, so no working code path changes. With a GPU, ``apply_cpu_patches()`` does
nothing. It is idempotent.

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


def _current_stream(device=None):
    # CPU work runs in order on one stream; torch.cpu's stand-in has the same (no-op) waits.
    return torch.cpu.current_stream()


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


class _TorchAllocatingOnCpu:
    """``torch`` as a few Megatron modules see it: the same module, except that ``tensor``,
    ``zeros`` and ``empty`` called with ``device="cuda"`` allocate on the CPU."""

    def __getattr__(self, name: str):
        return getattr(torch, name)

    @staticmethod
    def _on_cpu(kwargs: dict) -> dict:
        if str(kwargs.get("device", "")).startswith("cuda"):
            kwargs["device"] = "cpu"
        return kwargs

    def tensor(self, *args, **kwargs) -> torch.Tensor:
        return torch.tensor(*args, **self._on_cpu(kwargs))

    def zeros(self, *args, **kwargs) -> torch.Tensor:
        return torch.zeros(*args, **self._on_cpu(kwargs))

    def empty(self, *args, **kwargs) -> torch.Tensor:
        return torch.empty(*args, **self._on_cpu(kwargs))


def _cuda_type_names(method):
    # Runs ``method`` with ``Tensor.type()`` (no arguments) naming a CPU tensor as its CUDA
    # counterpart ("torch.FloatTensor" -> "torch.cuda.FloatTensor"), for this call only.
    @functools.wraps(method)
    def wrapper(*args, **kwargs):
        type_ = torch.Tensor.type

        def cuda_type(t, *a, **k):
            name = type_(t, *a, **k)
            if a or k or t.device.type != "cpu":
                return name
            return name.replace("torch.", "torch.cuda.", 1)

        torch.Tensor.type = cuda_type
        try:
            return method(*args, **kwargs)
        finally:
            torch.Tensor.type = type_

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
       ``torch.cuda.current_stream``: 0.19's data-parallel gradient buckets take the current
       stream before reducing, to wait on CUDA-graph replay events (none on CPU); returns
       ``torch.cpu.current_stream()``, whose waits are no-ops.
    6. ``LanguageModule.setup_embeddings_and_output_layer``: with tied embeddings and pipeline
       parallelism the last stage holds a copy of the embedding, which Megatron moves with
       ``weight.data.cuda()`` before all-reducing it from the first stage. Wrapped so that,
       during this one method only, ``Tensor.cuda()`` returns the tensor itself (gloo
       all-reduces CPU tensors). ``Tensor.cuda`` stays untouched everywhere else.
    7. ``torch.tensor / zeros / empty(..., device="cuda")`` in the pipeline schedules and in
       Megatron's optimizer: every schedule allocates its token counter with a hard-coded
       ``device="cuda"`` (``pipeline_parallel/schedules.py``: ``total_num_tokens``); so do
       ``optimizer/optimizer.py`` (``FP32Optimizer._scale``, ``_dummy_overflow_buf``,
       ``_scale_one``), ``optimizer/clip_grads.py`` (the grad norm and its overflow buffer) and
       ``utils.py`` (``local_multi_tensor_l2_norm``, the fallback without Apex). In those five
       modules the global name ``torch`` is replaced by a stand-in that forwards every
       attribute to torch but allocates such tensors on the CPU; torch itself and every other
       module are untouched.
    8. ``Tensor.type() == "torch.cuda.FloatTensor"``: ``DistributedOptimizer.
       _build_model_and_main_param_groups`` raises TypeError for any other parameter type, and
       ``clip_grad_by_total_norm_fp32`` asserts it of every gradient. Both are wrapped so that,
       during these calls only, ``Tensor.type()`` names a CPU tensor by its CUDA name.
    """
    global _APPLIED
    if _APPLIED:
        return True
    if torch.cuda.is_available():
        return False
    from megatron.core import utils
    from megatron.core.fusions import fused_softmax
    from megatron.core.models.common.language_module.language_module import LanguageModule
    from megatron.core.optimizer import clip_grads, distrib_optimizer
    from megatron.core.optimizer import optimizer as moptimizer
    from megatron.core.pipeline_parallel import schedules
    from megatron.core.tensor_parallel import random as mrandom

    torch.cuda.current_device = _current_device
    torch.cuda.get_rng_state = _get_rng_state
    torch.cuda.set_rng_state = _set_rng_state
    torch.cuda.manual_seed = _manual_seed
    torch.cuda.synchronize = _synchronize
    torch.cuda.current_stream = _current_stream
    fused_softmax.get_default_causal_mask = _causal_mask
    mrandom._get_cuda_rng_state = _get_rng_state
    mrandom._set_cuda_rng_state = _set_rng_state
    setup = LanguageModule.setup_embeddings_and_output_layer
    LanguageModule.setup_embeddings_and_output_layer = _stay_on_cpu(setup)
    for module in (schedules, moptimizer, clip_grads, distrib_optimizer, utils):
        module.torch = _TorchAllocatingOnCpu()
    dopt = distrib_optimizer.DistributedOptimizer
    build_groups = dopt._build_model_and_main_param_groups  # a staticmethod
    dopt._build_model_and_main_param_groups = staticmethod(_cuda_type_names(build_groups))
    clip = _cuda_type_names(clip_grads.clip_grad_by_total_norm_fp32)
    clip_grads.clip_grad_by_total_norm_fp32 = clip
    moptimizer.clip_grad_by_total_norm_fp32 = clip  # imported there by name
    _APPLIED = True
    return True
