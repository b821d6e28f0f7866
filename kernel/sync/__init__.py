"""Weight sync from trainers to inference engines: ``buckets`` cut the weights into pieces of a
size budget, ``push`` (``WeightSync``) sends them to a model's engines over disk, tensor or
distributed transports (the last over ``kernel.engine.process_group``), and ``convert`` maps
Megatron-core weights to HF names on the way.
"""
