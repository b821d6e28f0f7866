"""The model side of the embedded server: one worker thread, continuous batching, exact logprobs.

The HTTP event loop never touches the model. It hands ``Request`` objects to a ``Scheduler``,
whose worker thread runs this loop, one step at a time:

1. run queued commands (weight updates, pause) -- between steps, so no forward pass sees a
   half-written weight;
2. finish requests marked aborted, with their partial output;
3. admit waiting requests (up to ``max_batch_size`` running): one prefill forward over their
   DISTINCT prompts, left padded (the n samples of a prompt -- ``sampling_params.n``, or equal
   prompts sent apart -- are one prefill row whose KV cache is then copied to each of them, as
   SGLang shares a prompt's cache), samples each one's first token, and their KV cache joins the
   running batch (both caches are left padded to the same length and concatenated). A prompt
   that starts with a sequence of the prefix cache (``kernel.engine.prefix_cache``: earlier
   prompts and finished replies, e.g. the previous turn of a conversation) prefills only the
   rest: the row's cache opens with the stored KV, left padded to the batch's longest hit;
4. one decode forward for the whole running batch; sample; finish rows that hit a stop token,
   stop string, ``max_new_tokens`` or the context length, store their KV in the prefix cache
   and drop them from the batch.

The KV tensors of a batch may hold padding in the middle of a row (after a cached prefix shorter
than the longest); the attention mask marks it, and positions count real tokens only.

LoRA: each request names its adapter (``lora_path``; None: the base model). The model stays the
plain HF model until an adapter is loaded (``load_adapter``, on this thread between steps); then
it is a ``peft.PeftModel`` around that same HF model (``base``), and every forward passes each
row's adapter (peft's mixed-adapter batches, ``__base__`` for base rows, whose numbers are those
of the bare model). Equal prompts share a prefill row, and a prefix-cache entry serves a request,
only under the same adapter. ``max_loras_per_batch`` bounds the distinct adapters in the running
batch: a request that would pass it waits, and later ones that fit go first (``_take``). An
adapter is unloaded between steps too; a row still using it then ends as an abort at its next
step (after ``/pause_generation``, unless it is loaded again before ``/continue_generation``).
An unloaded adapter's layers are kept for the next load of the same config (a weight sync
unloads and loads): that load only copies the tensors in.

So a new request joins at the next step rather than waiting for the batch to drain. When the
engine is idle, a request that came alone waits up to ``gather_window_s`` for others (until
``max_batch_size`` are waiting), so requests sent close together share one prefill forward; a
batch sent as one request (``kernel.engine.batcher``) starts at once.

Reported logprobs (SGLang's default): ``log_softmax(logits / temperature)`` of the sampled
token, with raw logits for greedy (temperature 0); top-p, top-k and min-p shape what is sampled
but not the reported value. A training forward over prompt + output with the same temperature
(``kernel.train.logprobs.token_logprobs``) gives the same numbers up to float error, because
position ids count only real tokens and the attention mask hides the left padding.
"""

from __future__ import annotations

import json
import logging
import math
import threading
import time
import types
from collections import deque
from collections.abc import Callable, Iterable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from kernel.engine.prefix_cache import BLOCK, PrefixCache
from kernel.engine.protocol import SamplingParams
from kernel.engine.weights import (
    NamedTensors,
    add_adapter,
    mixed_forward,
    refill_adapter,
    remove_adapter,
)
from kernel.models import cache_kwargs

log = logging.getLogger(__name__)


@dataclass
class Request:
    """One sequence to generate (a batch or ``n > 1`` becomes several)."""

    rid: str
    input_ids: list[int]
    params: SamplingParams
    return_logprob: bool = False
    output_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    abort_message: str | None = None
    """Set from any thread; the worker finishes the request at its next step."""
    created: float = field(default_factory=time.perf_counter)
    alone: bool = True
    """Submitted on its own (a request of one sequence): an idle engine waits for company."""
    future: Future = field(default_factory=Future)
    """Resolves to the SGLang-shaped reply dict."""
    cached_tokens: int = 0
    """Prompt tokens served from the prefix cache (``meta_info.cached_tokens``)."""
    finish_reason: dict | None = None
    """Set when the request finishes (``meta_info.finish_reason``)."""
    lora_path: str | None = None
    """The LoRA adapter that serves it, by name (None: the base model)."""


def next_version(current: str) -> str:
    """The weight version after an update that names none: an integer counts up."""
    return str(int(current) + 1) if current.isdigit() else f"{current}+1"


NON_FINITE = "the model gave non-finite logits (are its weights finite?)"
"""Abort message of a row whose sampled logprob is NaN or infinite: no reply carries one."""

GREEDY_BELOW = 1e-5
"""Temperatures below this sample greedily (SGLang's rule): dividing by them overflows."""

BASE_ADAPTER = "__base__"
"""peft's name for "no adapter" in a mixed batch's ``adapter_names``."""


def sample_tokens(
    logits: Tensor,
    temperature: Tensor,
    top_p: Tensor,
    top_k: Tensor,
    min_p: Tensor,
    generator: torch.Generator | None = None,
) -> tuple[Tensor, Tensor]:
    """logits (B, V) and per-row params (B,) -> sampled ids (B,), reported logprobs (B,).

    Rows with temperature below GREEDY_BELOW take the argmax; top_k <= 0 and top_p == 1 and
    min_p == 0 disable their filter. The reported logprob is taken before filtering (see module
    docstring).
    """
    logits = logits.float()
    greedy = temperature < GREEDY_BELOW  # (B,)
    scale = torch.where(greedy, torch.ones_like(temperature), temperature)
    if bool((scale != 1).any()):  # the usual temperature 1 skips a (B, V) pass
        logits = logits / scale[:, None]
    logp = torch.log_softmax(logits, dim=-1)  # (B, V)
    any_greedy = bool(greedy.any())
    if any_greedy and bool(greedy.all()):
        tokens = logits.argmax(-1)  # (B,)
    else:
        filtered = bool((top_p < 1).any() or (top_k > 0).any() or (min_p > 0).any())
        # Unfiltered, the sampling distribution is exp(logp) itself: no second softmax.
        probs = _filter(logp, top_p, top_k, min_p).softmax(-1) if filtered else logp.exp()
        tokens = _draw(probs, generator)  # (B,)
        if any_greedy:
            tokens = torch.where(greedy, logits.argmax(-1), tokens)
    return tokens, logp.gather(-1, tokens[:, None]).squeeze(-1)


def _draw(probs: Tensor, generator: torch.Generator | None) -> Tensor:
    """One draw per row of probs (B, V) -> ids (B,), by inverting the CDF.

    Same distribution as torch.multinomial, ~30x faster on CPU for a 49k vocabulary (which
    spends its time drawing B x V random numbers). The fp64 cumsum keeps the CDF exact enough;
    searching with right=True never lands on a zero-probability token.
    """
    cdf = probs.cumsum(-1, dtype=torch.float64)  # (B, V)
    u = torch.rand(
        (probs.shape[0], 1), generator=generator, dtype=torch.float64, device=probs.device
    )
    ids = torch.searchsorted(cdf, u * cdf[:, -1:], right=True)  # (B, 1)
    return ids.squeeze(-1).clamp(max=probs.shape[-1] - 1)


def _filter(logp: Tensor, top_p: Tensor, top_k: Tensor, min_p: Tensor) -> Tensor:
    """logp (B, V) -> logp with tokens outside each row's top-k / top-p / min-p set at -inf."""
    drop = torch.zeros_like(logp, dtype=torch.bool)  # (B, V)
    if bool((min_p > 0).any()):
        # p >= min_p * p_max  <=>  logp >= logp_max + log(min_p)
        floor = logp.max(-1, keepdim=True).values + torch.log(min_p.clamp(min=1e-30))[:, None]
        drop |= (min_p > 0)[:, None] & (logp < floor)
    if bool((top_p < 1).any() or (top_k > 0).any()):
        sorted_lp, order = logp.sort(-1, descending=True)  # (B, V)
        probs = sorted_lp.exp()
        mass_before = probs.cumsum(-1) - probs  # (B, V) mass of the strictly better tokens
        ranks = torch.arange(logp.shape[-1], device=logp.device)[None]  # (1, V)
        drop_sorted = (top_p < 1)[:, None] & (mass_before > top_p[:, None])
        drop_sorted |= (top_k > 0)[:, None] & (ranks >= top_k[:, None])
        drop |= torch.zeros_like(drop).scatter(-1, order, drop_sorted)
    return logp.masked_fill(drop, float("-inf"))


def left_pad(seqs: list[list[int]], pad_id: int, device) -> tuple[Tensor, Tensor]:
    """Token lists -> ids (B, T) and attention mask (B, T), padded on the left."""
    width = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(seqs), width), dtype=torch.long)
    for i, s in enumerate(seqs):
        ids[i, width - len(s) :] = torch.tensor(s, dtype=torch.long)
        mask[i, width - len(s) :] = 1
    return ids.to(device), mask.to(device)


class Scheduler:
    """Owns the model on one worker thread; every public method is safe from any thread."""

    def __init__(
        self,
        model,
        tokenizer,
        *,
        max_batch_size: int,
        context_length: int,
        weight_version: str = "0",
        seed: int = 0,
        gather_window_s: float = 0.0,
        prefix_cache_bytes: int = 0,
        max_loras_per_batch: int = 8,
        onednn: bool = False,
    ) -> None:
        _check_cache_layers(model)
        self.base = model
        """The HF model; with LoRA adapters loaded, peft's layers are inside it."""
        self.model = model
        """What the forward runs: ``base``, or the ``peft.PeftModel`` around it while it holds
        LoRA adapters."""
        self.tokenizer = tokenizer
        self.max_batch_size = max_batch_size
        self.max_loras_per_batch = max_loras_per_batch
        self._peft_names: dict[str, str] = {}  # served LoRA adapter name -> peft's name of it
        self._configs: dict[str, str] = {}  # peft's name of a served adapter -> its config (JSON)
        self._parked: dict[str, str] = {}  # ... of an unloaded one whose layers stay, for a reload
        self._loads = 0  # adapters loaded so far (each gets a new peft name)
        self.onednn = onednn  # the server switched the Linear layers to oneDNN: adapters' too
        self.gather_window_s = gather_window_s
        self.context_length = context_length
        self.weight_version = weight_version
        self.device = next(model.parameters()).device
        self.eos_ids = _eos_ids(model, tokenizer)
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
        self.generator = torch.Generator(device=self.device).manual_seed(seed)
        self.paused = False
        self.stats = {"num_finished_reqs": 0, "num_aborted_reqs": 0, "peak_running_reqs": 0}
        self.stats |= {"num_prefills": 0, "num_prefill_rows": 0, "num_decode_steps": 0}
        self.stats |= {"num_prefill_tokens": 0, "num_cached_tokens": 0}
        self.prefix_cache = PrefixCache(prefix_cache_bytes)
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._waiting: deque[Request] = deque()
        self._live: dict[int, Request] = {}  # id(request) -> request, for abort and load
        self._commands: deque[tuple[Callable[[], Any], Future]] = deque()
        self._stopping = False
        # The running batch: requests, their KV cache, attention mask (B, T) over the cached
        # tokens, the pending token (B,) of each row (sampled, not yet fed), and sampling params.
        self._running: list[Request] = []
        self._cache = None
        self._mask: Tensor | None = None
        self._last: Tensor | None = None
        self._params: tuple[Tensor, ...] = ()
        self._thread = threading.Thread(target=self._loop, name="engine-scheduler", daemon=True)

    # ---- public, any thread -------------------------------------------------------------

    def start(self) -> None:
        self._thread.start()

    def shutdown(self, timeout: float = 10.0) -> None:
        self._stopping = True
        self._wake.set()
        if self._thread.ident is not None:  # a scheduler never started has nothing to join
            self._thread.join(timeout)

    def submit(self, requests: Iterable[Request]) -> None:
        requests = list(requests)
        with self._lock:
            for r in requests:
                r.alone = len(requests) == 1
                self._live[id(r)] = r
                self._waiting.append(r)
        self._wake.set()

    def abort(self, rid_prefix: str = "", abort_all: bool = False, message: str = "") -> int:
        """Mark matching requests (waiting or running) aborted; returns how many matched."""
        with self._lock:
            hits = [r for r in self._live.values() if abort_all or r.rid.startswith(rid_prefix)]
        for r in hits:
            r.abort_message = message or "aborted by /abort_request"
        self._wake.set()
        return len(hits)

    def call(self, fn: Callable[[], Any]) -> Future:
        """Run ``fn()`` on the worker thread between two steps; the future gets its result."""
        fut: Future = Future()
        with self._lock:
            self._commands.append((fn, fut))
        self._wake.set()
        return fut

    def pause(self, mode: str) -> Future:
        """Stop stepping. ``abort``: finish every live request now with its partial output.
        ``retract``: running requests go back to the queue and are prefilled again, under the
        weights of that time, after ``resume``. ``in_place``: they keep their KV cache and
        continue where they stopped. New requests wait in the queue in every mode."""

        def do() -> int:
            self.paused = True
            if mode == "abort":
                n = self.abort(abort_all=True, message="aborted by /pause_generation")
                self._reap_aborted()
                return n
            if mode == "retract":
                n = len(self._running)
                with self._lock:
                    self._waiting.extendleft(reversed(self._running))
                self._reset_batch()
                return n
            return len(self._running)

        return self.call(do)

    def resume(self) -> None:
        self.paused = False
        self._wake.set()

    def uses(self, adapter: str) -> bool:
        """Whether a live request (waiting or running) is served by LoRA adapter ``adapter``."""
        with self._lock:
            return any(r.lora_path == adapter for r in self._live.values())

    @property
    def adapters(self) -> set[str]:
        """The LoRA adapters the model holds, by name."""
        return set(self._peft_names)

    def load_adapter(self, name: str, config: dict, tensors: NamedTensors) -> None:
        """(Worker thread, or before ``start``.) Load LoRA adapter ``name`` (see
        ``kernel.engine.weights.add_adapter``; ValueError if it is loaded already); the prefix
        cache is flushed. An unloaded adapter of the same config (a weight sync unloads, then
        loads) lends its layers: only the tensors are copied in (``refill_adapter``), ~8x
        faster than making peft's layers anew for SmolLM2's 210 projections."""
        if name in self._peft_names:
            raise ValueError(f"lora_name {name!r} is already loaded")
        key = json.dumps(config, sort_keys=True, default=str)
        inner = next((i for i, k in self._parked.items() if k == key), None)
        if inner is not None:
            refill_adapter(self.model, inner, tensors)
            del self._parked[inner]
        else:
            self._drop_parked()
            # Inside the model peft names it lora<n>: a served name may hold dots (a bare path
            # names itself), which peft's module names cannot.
            inner = f"lora{self._loads}"
            self.model = add_adapter(self.model, inner, config, tensors)
            self._loads += 1
            if self.onednn:  # its A and B through oneDNN too, as the base's layers
                use_onednn_linears(self.model)
        self._peft_names[name] = inner
        self._configs[inner] = key
        self.prefix_cache.clear()  # a name loaded again must not find its old KV

    def unload_adapter(self, name: str) -> None:
        """(Worker thread.) Stop serving LoRA adapter ``name``. Its layers stay, parked out of
        every forward, for the next load of its config; a load of another config frees them."""
        if name not in self._peft_names:
            raise ValueError(f"lora_name {name!r} is not loaded (loaded: {sorted(self.adapters)})")
        inner = self._peft_names.pop(name)
        self._parked[inner] = self._configs.pop(inner)
        self.prefix_cache.clear()

    def _drop_parked(self) -> None:
        """Free the layers of unloaded adapters; back to the bare model when none is served."""
        for inner in list(self._parked):
            self.model = remove_adapter(self.model, inner)
            del self._parked[inner]

    def load(self) -> dict[str, int]:
        with self._lock:
            live = list(self._live.values())
            waiting = len(self._waiting)
        return {
            "num_running_reqs": len(live) - waiting,
            "num_waiting_reqs": waiting,
            "num_used_tokens": sum(len(r.input_ids) + len(r.output_ids) for r in live),
        }

    # ---- worker thread --------------------------------------------------------------------

    def _loop(self) -> None:
        while True:
            self._run_commands()
            if self._stopping:
                self._fail_all(RuntimeError("the engine is shutting down"))
                return
            self._reap_aborted()
            worked = False
            if not self.paused:
                self._drop_orphans()
                try:
                    with torch.inference_mode():
                        worked = self._admit()
                        if self._running:
                            self._decode_step()
                            worked = True
                except Exception as exc:  # a bad step fails its requests, not the server
                    log.exception("engine step failed")
                    self._fail_running(exc)
                    worked = True
            if not worked:
                self._wake.wait()
                self._wake.clear()

    def _run_commands(self) -> None:
        while True:
            with self._lock:
                if not self._commands:
                    return
                fn, fut = self._commands.popleft()
            try:
                with torch.no_grad():
                    fut.set_result(fn())
            except BaseException as exc:
                fut.set_exception(exc)

    def _reap_aborted(self) -> None:
        with self._lock:
            dead = [r for r in self._waiting if r.abort_message is not None]
            if dead:
                self._waiting = deque(r for r in self._waiting if r.abort_message is None)
        for r in dead:
            self._finish(r, {"type": "abort", "message": r.abort_message})
        if any(r.abort_message is not None for r in self._running):
            keep = []
            for i, r in enumerate(self._running):
                if r.abort_message is None:
                    keep.append(i)
                else:
                    self._finish(r, {"type": "abort", "message": r.abort_message})
            self._select(keep)

    def _drop_orphans(self) -> None:
        """Running rows whose LoRA adapter is no longer loaded end as aborts (their forward
        cannot run: peft refuses an unknown adapter)."""
        loaded = self.adapters
        gone = [r for r in self._running if r.lora_path is not None and r.lora_path not in loaded]
        for r in gone:
            r.abort_message = f"LoRA adapter {r.lora_path!r} was unloaded"
        if gone:
            self._reap_aborted()

    def _gather(self) -> None:
        """An idle engine's first arrival, if it came alone, waits (at most ``gather_window_s``
        after it came) for more, so that requests sent close together are prefilled in one
        forward; a batch that came in one request is admitted at once."""
        if self._running or self.gather_window_s <= 0:
            return
        while not self._stopping:
            with self._lock:
                if not self._waiting or len(self._waiting) >= self.max_batch_size:
                    return
                if not self._waiting[0].alone:
                    return
                left = self._waiting[0].created + self.gather_window_s - time.perf_counter()
                self._wake.clear()
            if left <= 0 or not self._wake.wait(left):
                return

    def _take(self, room: int) -> list[Request]:
        """Pop up to ``room`` waiting requests, first come first served but for the LoRA limit
        (SGLang's rule): a request whose adapter would make the running batch hold more than
        ``max_loras_per_batch`` adapters stays in the queue, in its place, and the requests
        behind it that fit go first. The batch drains, so it waits for a while, never forever."""
        active = {r.lora_path for r in self._running} - {None}
        taken: list[Request] = []
        held: list[Request] = []
        with self._lock:
            while self._waiting and len(taken) < room:
                r = self._waiting.popleft()
                name = r.lora_path
                if name is None or name in active or len(active) < self.max_loras_per_batch:
                    taken.append(r)
                    if name is not None:  # the base model takes no slot
                        active.add(name)
                else:
                    held.append(r)
            self._waiting.extendleft(reversed(held))
        return taken

    def _admit(self) -> bool:
        self._gather()
        taken = self._take(self.max_batch_size - len(self._running))
        loaded, new = self.adapters, []
        for r in taken:
            if r.lora_path is not None and r.lora_path not in loaded:  # unloaded as it came
                message = f"LoRA adapter {r.lora_path!r} is not loaded"
                self._finish(r, {"type": "abort", "message": message})
            elif r.params.max_new_tokens == 0:
                self._finish(r, {"type": "length", "length": 0})
            else:
                new.append(r)
        if not new:
            return bool(taken)
        # One prefill row per distinct (adapter, sequence); a retracted request resumes from its
        # prompt and the output it already has.
        distinct: dict[tuple[str | None, tuple[int, ...]], int] = {}
        rows = [
            distinct.setdefault((r.lora_path, tuple(r.input_ids + r.output_ids)), len(distinct))
            for r in new
        ]
        adapters = [name for name, _ in distinct]
        seqs = [list(seq) for _, seq in distinct]
        # (cached length, its KV) per row, from the entries of the row's own adapter
        hits = [
            self.prefix_cache.match(seq, name) for name, seq in zip(adapters, seqs, strict=True)
        ]
        for r, u in zip(new, rows, strict=True):
            r.cached_tokens = max(r.cached_tokens, min(hits[u][0], len(r.input_ids)))
        cache, ids, mask, positions = self._prefill_inputs(seqs, hits)
        out = self._forward(
            adapters,
            cache,
            input_ids=ids,
            attention_mask=mask,
            position_ids=positions,
            logits_to_keep=1,
        )
        self.stats["num_prefills"] += 1
        self.stats["num_prefill_rows"] += len(seqs)
        self.stats["num_cached_tokens"] += sum(c for c, _ in hits)
        self.stats["num_prefill_tokens"] += sum(len(seq) for seq in seqs) - sum(c for c, _ in hits)
        for u, seq in enumerate(seqs):  # before rows are copied per request below
            self._store(seq, cache, mask, u, adapters[u])
        expand = torch.tensor(rows, device=self.device)  # (n,) the prefill row of each request
        tokens, logprobs = sample_tokens(
            out.logits[expand, -1], *_params(new, self.device), self.generator
        )
        keep = self._append_and_check(new, tokens, logprobs)
        if keep:
            idx = torch.tensor(keep, device=self.device)
            cache.batch_select_indices(expand[idx])  # copies a shared prompt's cache per row
            self._merge([new[i] for i in keep], cache, mask[expand[idx]], tokens[idx])
        return True

    def _forward(self, adapters: list[str | None], cache, **inputs):
        """One forward of the served model over rows served by ``adapters`` (one per row),
        appending to ``cache``. With LoRA adapters loaded, rows of one adapter (or all of the
        base) run peft's plain path, that adapter active (or none); rows of several, peft's
        mixed-adapter batch, each naming its own (a gather and a scatter per layer: SmolLM2's
        decode is 1.3x slower so). A bare model takes no names."""
        inputs |= cache_kwargs(self.base, cache)
        if self.model is self.base:
            return self.model(**inputs, use_cache=True)
        names = [self._peft_names[name] if name else BASE_ADAPTER for name in adapters]
        if len(set(names)) > 1:
            return mixed_forward(self.model, **inputs, adapter_names=names, use_cache=True)
        if names[0] == BASE_ADAPTER:
            with self.model.disable_adapter():
                return self.model(**inputs, use_cache=True)
        if self.model.active_adapter != names[0]:
            self.model.set_adapter(names[0])
        return self.model(**inputs, use_cache=True)

    def _prefill_inputs(
        self, seqs: list[list[int]], hits: list[tuple[int, Tensor | None]]
    ) -> tuple[Any, Tensor, Tensor, Tensor]:
        """The prefill forward's inputs for rows ``seqs`` with cached prefixes ``hits``: a KV
        cache holding each row's cached prefix (left padded to the longest, P columns), the
        rest of each row's tokens (left padded, S columns), the attention mask over both
        (U, P + S), and the positions of the new tokens (U, S)."""
        from transformers import DynamicCache

        cache = DynamicCache(config=self.base.config)
        cached = [c for c, _ in hits]
        ids, new_mask = left_pad(
            [seq[c:] for seq, c in zip(seqs, cached, strict=True)], self.pad_id, self.device
        )  # (U, S)
        width = max(cached)
        if width == 0:
            return cache, ids, new_mask, (new_mask.cumsum(-1) - 1).clamp(min=0)
        first = next(kv for _, kv in hits if kv is not None)  # (L, 2, H, c, D)
        layers, _, heads, _, dim = first.shape
        past = first.new_zeros((layers, 2, len(seqs), heads, width, dim))
        past_mask = torch.zeros((len(seqs), width), dtype=torch.long, device=self.device)
        for u, (c, kv) in enumerate(hits):
            if c:
                past[:, :, u, :, width - c :] = kv
                past_mask[u, width - c :] = 1
        for layer in range(layers):
            cache.update(past[layer, 0], past[layer, 1], layer)
        offset = torch.tensor(cached, device=self.device)[:, None]  # (U, 1)
        positions = (offset + new_mask.cumsum(-1) - 1).clamp(min=0)  # (U, S)
        return cache, ids, torch.cat([past_mask, new_mask], dim=1), positions

    def _store(self, tokens: list[int], cache, mask: Tensor, row: int, adapter: str | None) -> None:
        """Put row ``row`` of a batch's KV ``cache`` (its columns where ``mask`` is 1, which
        hold ``tokens``; computed by LoRA adapter ``adapter``) in the prefix cache (not one
        shorter than a block: it would never be found, so its KV is not even gathered)."""
        if self.prefix_cache.max_bytes <= 0 or len(tokens) < BLOCK:
            return
        cols = mask[row].bool()  # (T,)
        kv = torch.stack(
            [
                torch.stack([layer.keys[row][:, cols], layer.values[row][:, cols]])
                for layer in cache.layers
            ]
        )  # (L, 2, H, len(tokens), D)
        self.prefix_cache.insert(tokens, kv, adapter)

    def _decode_step(self) -> None:
        mask = F.pad(self._mask, (0, 1), value=1)  # (B, T + 1): the pending token joins
        positions = mask.sum(-1, keepdim=True) - 1  # (B, 1)
        out = self._forward(
            [r.lora_path for r in self._running],
            self._cache,
            input_ids=self._last[:, None],
            attention_mask=mask,
            position_ids=positions,
        )
        self._mask = mask
        self.stats["num_decode_steps"] += 1
        tokens, logprobs = sample_tokens(out.logits[:, -1], *self._params, self.generator)
        self._last = tokens
        keep = self._append_and_check(self._running, tokens, logprobs)
        if len(keep) < len(self._running):
            kept = set(keep)
            for i, r in enumerate(self._running):
                if i not in kept and r.finish_reason["type"] != "abort":
                    # The KV holds the prompt and every output token but the last (not fed).
                    tokens = r.input_ids + r.output_ids[:-1]
                    self._store(tokens, self._cache, self._mask, i, r.lora_path)
            self._select(keep)

    def _append_and_check(self, reqs: list[Request], tokens: Tensor, logprobs: Tensor) -> list[int]:
        """Record each row's new token; finish the rows that are done; return the others."""
        keep = []
        for i, (r, t, lp) in enumerate(zip(reqs, tokens.tolist(), logprobs.tolist(), strict=True)):
            if not math.isfinite(lp):  # never a NaN in a reply: the row fails, its token unsaid
                self._finish(r, {"type": "abort", "message": NON_FINITE})
                continue
            r.output_ids.append(t)
            r.logprobs.append(lp)
            reason = self._finish_reason(r)
            if reason is None:
                keep.append(i)
            else:
                self._finish(r, reason)
        return keep

    def _finish_reason(self, r: Request) -> dict | None:
        p, n, last = r.params, len(r.output_ids), r.output_ids[-1]
        if n >= p.max_new_tokens:  # checked first, as SGLang does
            return {"type": "length", "length": p.max_new_tokens}
        if last in p.stop_token_ids or (not p.ignore_eos and last in self.eos_ids):
            return {"type": "stop", "matched": last}
        stops = p.stop_strings
        if stops:
            # A stop string of L characters lies within the last 4L + 1 tokens (a token is at
            # least one byte, a character at most four).
            width = 4 * max(len(s) for s in stops) + 1
            tail = self.tokenizer.decode(
                r.output_ids[-width:], skip_special_tokens=p.skip_special_tokens
            )
            for s in stops:
                if s and s in tail:
                    return {"type": "stop", "matched": s}
        if len(r.input_ids) + n >= self.context_length:
            return {"type": "length", "length": n}
        return None

    def _finish(self, r: Request, reason: dict) -> None:
        r.finish_reason = reason
        p, ids = r.params, r.output_ids
        trim = reason["type"] == "stop" and not p.no_stop_trim
        text_ids = ids[:-1] if trim and isinstance(reason["matched"], int) else ids
        text = self.tokenizer.decode(text_ids, skip_special_tokens=p.skip_special_tokens)
        if trim and isinstance(reason["matched"], str) and reason["matched"] in text:
            text = text[: text.index(reason["matched"])]
        meta = {
            "id": r.rid,
            "finish_reason": reason,
            "prompt_tokens": len(r.input_ids),
            "completion_tokens": len(ids),
            "cached_tokens": r.cached_tokens,
            "weight_version": self.weight_version,
            "e2e_latency": time.perf_counter() - r.created,
        }
        if r.return_logprob:
            meta["output_token_logprobs"] = [
                [lp, t, None] for lp, t in zip(r.logprobs, ids, strict=True)
            ]
        with self._lock:
            self._live.pop(id(r), None)
        self.stats["num_aborted_reqs" if reason["type"] == "abort" else "num_finished_reqs"] += 1
        if not r.future.done():
            r.future.set_result({"text": text, "output_ids": list(ids), "meta_info": meta})

    # ---- the running batch ----------------------------------------------------------------

    def _merge(self, reqs: list[Request], cache, mask: Tensor, last: Tensor) -> None:
        """Join newly prefilled rows to the running batch (left-pad both to one length)."""
        if not self._running:
            self._running, self._cache, self._mask, self._last = reqs, cache, mask, last
        else:
            old_t, new_t = self._mask.shape[1], mask.shape[1]
            width = max(old_t, new_t)
            for old, new in zip(self._cache.layers, cache.layers, strict=True):
                old.keys = _cat_left_padded(old.keys, new.keys, width)
                old.values = _cat_left_padded(old.values, new.values, width)
            self._mask = torch.cat(
                [F.pad(self._mask, (width - old_t, 0)), F.pad(mask, (width - new_t, 0))]
            )
            self._last = torch.cat([self._last, last])
            self._running = self._running + reqs
        self._params = _params(self._running, self.device)
        self.stats["peak_running_reqs"] = max(self.stats["peak_running_reqs"], len(self._running))

    def _select(self, keep: list[int]) -> None:
        """Keep only these rows; drop cache columns that are padding for every kept row."""
        if not keep:
            self._reset_batch()
            return
        idx = torch.tensor(keep, device=self.device)
        self._cache.batch_select_indices(idx)
        self._mask, self._last = self._mask[idx], self._last[idx]
        self._running = [self._running[i] for i in keep]
        self._params = _params(self._running, self.device)
        first = int(self._mask.any(0).int().argmax())  # first column some row still uses
        if first > 0:
            for layer in self._cache.layers:
                layer.keys = layer.keys[:, :, first:]
                layer.values = layer.values[:, :, first:]
            self._mask = self._mask[:, first:]

    def _reset_batch(self) -> None:
        self._running, self._cache, self._mask, self._last, self._params = [], None, None, None, ()

    def _fail_running(self, exc: Exception) -> None:
        for r in self._running:
            with self._lock:
                self._live.pop(id(r), None)
            if not r.future.done():
                r.future.set_exception(exc)
        self._reset_batch()

    def _fail_all(self, exc: Exception) -> None:
        with self._lock:
            waiting, self._waiting = list(self._waiting), deque()
            commands, self._commands = list(self._commands), deque()
        for r in waiting:
            r.future.set_exception(exc)
        for _, fut in commands:
            fut.set_exception(exc)
        self._fail_running(exc)


def use_onednn_linears(model) -> int:
    """Run the model's ``nn.Linear`` layers through oneDNN (``torch.ops.mkldnn._linear_pointwise``)
    instead of the default MKL GEMM; returns how many were switched (0 where it cannot run).

    On CPU at decode batch sizes this is 1.3-2x faster per matmul (``scripts/bench_engine.py``
    measures the whole engine both ways): MKL's fp32 GEMM is slow with few rows and weights that
    are not in cache. The math is the same up to float rounding, and the forward reads
    ``self.weight`` at each call, so every weight-update path is seen at once. Off the CPU, or
    where the op is missing or refuses the dtype, the model is left as it is.
    """
    param = next(model.parameters(), None)
    if param is None or param.device.type != "cpu" or not torch.backends.mkldnn.is_available():
        return 0
    try:  # a probe: private op, present in CPU builds with oneDNN (all official wheels)
        x = torch.ones(2, 4, dtype=param.dtype)
        _onednn_linear(x, torch.ones(3, 4, dtype=param.dtype), torch.ones(3, dtype=param.dtype))
    except (AttributeError, RuntimeError, NotImplementedError):
        return 0
    linears = [m for m in model.modules() if type(m) is torch.nn.Linear]
    for m in linears:
        m.forward = types.MethodType(_onednn_forward, m)
    return len(linears)


def _onednn_linear(x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
    return torch.ops.mkldnn._linear_pointwise(x, weight, bias, "none", [], "")


def _onednn_forward(self: torch.nn.Linear, x: Tensor) -> Tensor:
    """``Linear.forward`` through oneDNN; with autograd on (the op has none) it is F.linear."""
    if torch.is_grad_enabled() and (x.requires_grad or self.weight.requires_grad):
        return F.linear(x, self.weight, self.bias)
    return _onednn_linear(x, self.weight, self.bias)


def _check_cache_layers(model) -> None:
    """Batches are joined and trimmed by editing full-attention KV tensors directly; refuse
    models whose cache layers are anything else (sliding-window, linear or recurrent)."""
    from transformers import DynamicCache

    kinds = {type(layer).__name__ for layer in DynamicCache(config=model.config).layers}
    if kinds != {"DynamicLayer"}:
        raise ValueError(
            f"the embedded server batches full-attention models only; this model's cache "
            f"layers are {sorted(kinds)}"
        )


def _cat_left_padded(a: Tensor, b: Tensor, width: int) -> Tensor:
    """a (Ba, H, Ta, D), b (Bb, H, Tb, D) -> (Ba + Bb, H, width, D), zeros on the left."""
    pad_a = F.pad(a, (0, 0, width - a.shape[2], 0))
    pad_b = F.pad(b, (0, 0, width - b.shape[2], 0))
    return torch.cat([pad_a, pad_b])


def _params(reqs: list[Request], device) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Per-row sampling params of a batch: temperature, top_p, top_k, min_p, each (B,)."""
    ps = [r.params for r in reqs]
    f32, i64 = torch.float32, torch.long
    return (
        torch.tensor([p.temperature for p in ps], dtype=f32, device=device),
        torch.tensor([p.top_p for p in ps], dtype=f32, device=device),
        torch.tensor([p.top_k for p in ps], dtype=i64, device=device),
        torch.tensor([p.min_p for p in ps], dtype=f32, device=device),
    )


def _eos_ids(model, tokenizer) -> set[int]:
    """End-of-sequence ids: the generation config's (an int or a list) and the tokenizer's."""
    ids: set[int] = set()
    gen = getattr(model, "generation_config", None)
    for source in (getattr(gen, "eos_token_id", None), tokenizer.eos_token_id):
        if isinstance(source, int):
            ids.add(source)
        elif source is not None:
            ids.update(source)
    return ids
