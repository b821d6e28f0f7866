"""The wire protocol of the embedded server: pydantic models of SGLang 0.5.x's native API.

Field names follow SGLang's ``io_struct.py`` (``GenerateReqInput``, ``AbortReq``,
``UpdateWeightsFromDistributedReqInput``, ...) so that the same client code talks to a real
SGLang server, to sglang-router, and to this embedded server. Unknown fields are ignored (the
router re-serialises requests and adds its own keys), while values that would silently change
what is sampled (a negative temperature, a penalty this server does not implement) are
rejected with HTTP 400 naming the field. So are values no engine could serve: integers beyond
int32 (top_k, max_new_tokens, n, stop ids), floats that are not finite, strings with lone UTF-16
surrogates (no tokenizer encodes them), and weight versions longer than
``MAX_VERSION_CHARS`` (they are echoed into every output). LoRA: ``lora_path`` names a request's
adapter, and the bodies of ``/load_lora_adapter``, ``/load_lora_adapter_from_tensors`` and
``/unload_lora_adapter`` are SGLang's (``LoadLoRAAdapterReqInput``, ...).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

INT32_MAX = 2**31 - 1
MAX_VERSION_CHARS = 256

Int32 = Annotated[int, Field(ge=0, le=INT32_MAX)]
Version = Annotated[str, Field(max_length=MAX_VERSION_CHARS)]


def _surrogate(value: Any, where: str) -> str | None:
    """The path and position of the first lone surrogate in ``value``'s strings, or None. At C
    speed: a weight payload is tens of MiB of base64 (a loop over its characters took 1.6 s
    for 25 MiB), and UTF-8 refuses exactly the surrogates."""
    if isinstance(value, str):
        if value.isascii():
            return None
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as e:
            ch = value[e.start]
            return f"{where}: invalid Unicode: a lone surrogate ({ch!a}) at position {e.start}"
    elif isinstance(value, dict):
        for k, v in value.items():
            found = _surrogate(v, f"{where}.{k}" if where else str(k))
            if found:
                return found
    elif isinstance(value, list):
        for i, v in enumerate(value):
            found = _surrogate(v, f"{where}[{i}]")
            if found:
                return found
    return None


class _Lenient(BaseModel):
    """Unknown keys are ignored and an explicit ``null`` means "use the default", as in SGLang;
    floats must be finite and strings valid Unicode."""

    model_config = ConfigDict(extra="ignore", allow_inf_nan=False)

    @model_validator(mode="before")
    @classmethod
    def _drop_nulls(cls, data: Any) -> Any:
        if isinstance(data, dict):
            bad = _surrogate(data, "")
            if bad:
                raise ValueError(bad)
            return {k: v for k, v in data.items() if v is not None}
        return data


# Sampling options of SGLang that this server does not implement: accepted only at their
# neutral value, so a request never gets a different distribution than it asked for.
UNSUPPORTED_NEUTRAL: dict[str, Any] = {
    "frequency_penalty": 0.0,
    "presence_penalty": 0.0,
    "repetition_penalty": 1.0,
    "min_new_tokens": 0,
    "json_schema": None,
    "regex": None,
    "ebnf": None,
    "structural_tag": None,
    "logit_bias": None,
}


class SamplingParams(_Lenient):
    """Per-request sampling (SGLang's ``sampling_params``)."""

    temperature: float = Field(1.0, ge=0)
    top_p: float = Field(1.0, gt=0, le=1)
    top_k: int = Field(-1, le=INT32_MAX)
    min_p: float = Field(0.0, ge=0, le=1)
    max_new_tokens: Int32 = 128
    stop: str | list[str] = Field(default_factory=list)
    stop_token_ids: list[Int32] = Field(default_factory=list)
    ignore_eos: bool = False
    no_stop_trim: bool = False
    skip_special_tokens: bool = True
    n: int = Field(1, ge=1, le=INT32_MAX)

    @model_validator(mode="before")
    @classmethod
    def _reject_unsupported(cls, data: Any) -> Any:
        if isinstance(data, dict):
            for key, neutral in UNSUPPORTED_NEUTRAL.items():
                if key in data and data[key] is not None and data[key] != neutral:
                    raise ValueError(
                        f"{key}={data[key]!r} is not supported by the embedded server "
                        f"(only {neutral!r})"
                    )
        return data

    @model_validator(mode="after")
    def _check_top_k(self) -> SamplingParams:
        if self.top_k == 0 or self.top_k < -1:
            raise ValueError(f"top_k must be -1 (disabled) or >= 1, got {self.top_k}")
        return self

    @property
    def stop_strings(self) -> list[str]:
        return [self.stop] if isinstance(self.stop, str) else list(self.stop)


class GenerateRequest(_Lenient):
    """POST /generate: one prompt or a batch, as text or token ids (exactly one of the two)."""

    text: str | list[str] | None = None
    input_ids: list[int] | list[list[int]] | None = None
    sampling_params: list[SamplingParams] = Field(default_factory=lambda: [SamplingParams()])
    """One dict for every prompt, or a list with one per prompt (a dict is kept as [dict])."""
    return_logprob: bool | list[bool] = False
    rid: str | list[str] | None = None
    lora_path: str | list[str | None] | None = None
    """The LoRA adapter, by name, of every prompt (a str) or of each (a list; None: the base
    model)."""
    stream: Literal[False] = False

    @model_validator(mode="before")
    @classmethod
    def _wrap_params(cls, data: Any) -> Any:
        if isinstance(data, dict) and isinstance(data.get("sampling_params"), dict):
            return data | {"sampling_params": [data["sampling_params"]]}
        return data

    @model_validator(mode="after")
    def _one_input(self) -> GenerateRequest:
        if (self.text is None) == (self.input_ids is None):
            raise ValueError("give exactly one of text and input_ids")
        return self


class FinishReason(BaseModel):
    """``{"type": "stop", "matched": id|str}``, ``{"type": "length", "length": N}`` or
    ``{"type": "abort", "message": str}``."""

    model_config = ConfigDict(extra="allow")
    type: Literal["stop", "length", "abort"]


class MetaInfo(BaseModel):
    model_config = ConfigDict(extra="allow")
    id: str
    finish_reason: FinishReason
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int = 0
    weight_version: str
    e2e_latency: float
    output_token_logprobs: list[tuple[float, int, None]] | None = None
    """``[logprob, token_id, null]`` per output token (only with ``return_logprob``)."""


class GenerateResponse(BaseModel):
    text: str
    output_ids: list[int]
    meta_info: MetaInfo


class AbortRequest(_Lenient):
    rid: str = ""
    """Aborts every request whose id starts with this (a batch shares its prefix)."""
    abort_all: bool = False


class PauseRequest(_Lenient):
    mode: Literal["abort", "retract", "in_place"] = "abort"


class UpdateWeightsFromDiskRequest(_Lenient):
    model_path: str
    load_format: str | None = None
    weight_version: Version | None = None
    abort_all_requests: bool = False
    flush_cache: bool = True


class UpdateWeightsFromTensorRequest(_Lenient):
    serialized_named_tensors: list[str]
    """Base64 of safetensors bytes of named tensors (never pickle: see server.py)."""
    load_format: str | None = None
    flush_cache: bool = True
    abort_all_requests: bool = False
    weight_version: Version | None = None


class InitWeightsUpdateGroupRequest(_Lenient):
    master_address: str
    master_port: int = Field(gt=0, lt=65536)
    rank_offset: int = Field(ge=0)
    world_size: int = Field(ge=2)
    group_name: str = "weight_update_group"
    backend: str = "nccl"


class UpdateWeightsFromDistributedRequest(_Lenient):
    names: list[str]
    dtypes: list[str]
    shapes: list[list[int]]
    group_name: str = "weight_update_group"
    flush_cache: bool = True
    abort_all_requests: bool = False
    weight_version: Version | None = None
    load_format: str | None = None

    @model_validator(mode="after")
    def _same_lengths(self) -> UpdateWeightsFromDistributedRequest:
        if not len(self.names) == len(self.dtypes) == len(self.shapes):
            raise ValueError(
                f"names, dtypes and shapes must have one entry per tensor, got "
                f"{len(self.names)}, {len(self.dtypes)} and {len(self.shapes)}"
            )
        return self


class UpdateWeightVersionRequest(_Lenient):
    new_version: Version
    abort_all_requests: bool = True  # SGLang's default


class DestroyWeightsUpdateGroupRequest(_Lenient):
    group_name: str = "weight_update_group"


class MemoryOccupationRequest(_Lenient):
    """Body of /release_memory_occupation and /resume_memory_occupation (SGLang's
    ``ReleaseMemoryOccupationReqInput`` / ``ResumeMemoryOccupationReqInput``)."""

    tags: list[str] | None = None
    """Which memory: ``weights``, ``kv_cache``; None: all (resume: all that are released)."""


class LoadLoRAAdapterRequest(_Lenient):
    """POST /load_lora_adapter: a PEFT folder (adapter_config.json, adapter_model.safetensors)
    served as ``lora_name``."""

    lora_name: str = Field(min_length=1)
    lora_path: str = Field(min_length=1)


class LoadLoRAAdapterFromTensorsRequest(_Lenient):
    """POST /load_lora_adapter_from_tensors: an adapter sent in the request."""

    lora_name: str = Field(min_length=1)
    config_dict: dict[str, Any]
    """Its adapter_config.json (peft's ``LoraConfig.to_dict()``, JSON values)."""
    serialized_tensors: str
    """Its tensors, named as in its adapter_model.safetensors, in one payload of
    /update_weights_from_tensor (``load_format``: None or ``safetensors``, or
    ``flattened_bucket``)."""
    load_format: str | None = None


class UnloadLoRAAdapterRequest(_Lenient):
    lora_name: str


class SuccessResponse(BaseModel):
    success: bool
    message: str


class ChatMessage(_Lenient):
    role: str
    content: str


class ChatCompletionRequest(_Lenient):
    """The minimal OpenAI chat request this server answers (no tools, no streaming)."""

    messages: list[ChatMessage] = Field(min_length=1)
    model: str | None = None
    temperature: float = Field(1.0, ge=0)
    top_p: float = Field(1.0, gt=0, le=1)
    max_tokens: Int32 | None = None
    max_completion_tokens: Int32 | None = None
    stop: str | list[str] | None = None
    n: int = Field(1, ge=1, le=INT32_MAX)
    stream: Literal[False] = False
    lora_path: str | None = None
    """The LoRA adapter that answers, by name (None: the base model)."""
