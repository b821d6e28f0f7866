"""Inference engines for rollouts, all speaking SGLang's native HTTP protocol.

- ``client``: the async client every rollout uses (generate, abort, pause, weight updates,
  router worker admin);
- ``server``: the embedded SGLang-compatible server (HF transformers, CPU or GPU), started by
  ``python -m kernel.engine`` (``__main__``) or ``launch.launch_server``;
- ``scheduler``: its continuous-batching decode loop; ``weights``: its weight-update paths;
- ``router``: starting the real sglang-router in front of engines;
- ``protocol``: the pydantic request and response models.

Only the client is imported here; the server's heavy imports wait until it is used.
"""

from kernel.engine.client import ClientConfig, EngineClient, EngineError, GenerateResult

__all__ = ["ClientConfig", "EngineClient", "EngineError", "GenerateResult"]
