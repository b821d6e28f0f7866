"""Tandem's kernel: the small torch-only core for training several LLM agents together with RL.

Heavy dependencies (Megatron-core, SGLang, Ray) are imported lazily inside their adapters, so
``import kernel`` is cheap and works on any CPU machine.
"""

from kernel.hooks import RolloutContext, load_function
from kernel.sample import Sample, SampleError, Status

__version__ = "0.1.0"
__all__ = ["RolloutContext", "Sample", "SampleError", "Status", "__version__", "load_function"]
