"""Training backends (torch; Megatron-core imported lazily) and the math they share."""
