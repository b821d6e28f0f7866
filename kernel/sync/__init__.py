"""Weight sync from trainers to inference engines.

``group``: a torch.distributed process group outside the default one, joined by the trainer
(rank 0) and every engine, over which new weights are broadcast (``init_custom_process_group``).
``buckets`` and ``push`` build on it and on ``kernel.engine.client`` to push a trainer's weights.
"""

from kernel.sync.group import GroupConfig, destroy_custom_process_group, init_custom_process_group

__all__ = ["GroupConfig", "destroy_custom_process_group", "init_custom_process_group"]
