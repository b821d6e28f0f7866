"""Inference engines for rollouts, all speaking SGLang's native HTTP protocol.

- ``client``: the async client every rollout uses (generate, abort, pause, weight updates,
  router worker admin);
- ``server``: the embedded SGLang-compatible server (HF transformers, CPU or GPU), started by
  ``python -m kernel.engine`` (``__main__``) or ``launch.launch_server``; its ``settings``
  (``ServerConfig``), its ``state`` (``ServerState``), and its ``routes`` (generation, status,
  control) and ``weight_routes`` (weight and LoRA updates);
- ``scheduler``: its continuous-batching decode loop; ``weights``: its weight-update paths;
- ``router``: starting the real sglang-router in front of engines;
- ``protocol``: the pydantic request and response models.

Nothing is imported here: the server (``python -m kernel.engine``) starts without the client's
aiohttp, and the client without the server's fastapi and transformers.
"""
