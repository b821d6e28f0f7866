"""Tandem's kernel: training several LLM agents together with RL, in layers (docs/design.md):
a torch-only core, data and rollout, engine / sync / train (torch and Megatron-core backends),
the runtime and loop, and the CLI and cluster launcher on top.

Heavy optional dependencies (Megatron-core, Ray) are imported lazily inside the functions that
use them, so ``import kernel`` is cheap and works on any CPU machine.
"""

from kernel.hooks import RolloutContext, load_function
from kernel.sample import Sample, SampleError, Status

__version__ = "0.1.0"
__all__ = ["RolloutContext", "Sample", "SampleError", "Status", "__version__", "load_function"]
