"""Push the trainer's weights to its engines: pause -> update (the last bucket sets the version)
-> continue; the pause and continue only where rollouts may run beside the push.

Four transports, one sequence:

- ``disk``: the trainer writes an HF checkpoint (safetensors); each engine loads it with
  ``/update_weights_from_disk``. Simplest; works across machines with a shared filesystem.
- ``tensor``: buckets of named tensors travel as bytes in the HTTP body of
  ``/update_weights_from_tensor`` (base64 safetensors), to an engine anywhere.
- ``shared``: the same endpoint with SGLang's ``flattened_bucket`` payload: each bucket is
  copied once into a buffer shared on this machine (``kernel.engine.weights.FlatBucketWriter``:
  shared memory for CPU weights, CUDA IPC for GPU ones) and the request carries only its handle,
  so the engine copies it once out of the buffer -- no serialise-copy-deserialise of every
  tensor. Engines on this machine only. Every trainer rank writes each bucket into a buffer of
  its own (they all gather it anyway), so an engine can read the copy made on its own GPU:
  ``engine_ranks`` lists, per engine, the trainer rank that shares each of its TP ranks' GPUs
  (colocated placement; SGLang takes one payload per TP rank); without it every engine reads
  rank 0's. The buffers are on the trainer's device, so GPU engines must share its GPUs.
  ``auto`` (the default) picks ``shared`` when every engine URL is on a loopback address,
  ``tensor`` otherwise.
- ``distributed``: the trainer (rank 0) and the engines (ranks 1..N) form a process group
  once (``/init_weights_update_group``); per bucket, each engine is told names, dtypes and
  shapes (``/update_weights_from_distributed``) while the trainer broadcasts the tensors
  (gloo on CPU, NCCL on GPUs). Rank 0 is wherever the trainer's weights are: this process for
  an in-process trainer (``LocalBroadcaster``), trainer rank 0's own process -- on its node and
  GPU -- for a Ray trainer group (``trainer.weight_broadcaster()``), so the weights never pass
  through the driver.

LoRA (``adapters``: a trainer of LoRA adapters, ``kernel.train.lora``): a push sends only the
adapters that stepped since the last one (all of them to an engine that lacks one: at start, or
restarted), each replacing its namesake on every engine as SGLang does it, unload then load:
``/load_lora_adapter`` from a PEFT folder with the disk transport, else the tensors in the
request (``/load_lora_adapter_from_tensors``; adapters are a few MiB). The base never moves.

Every push bumps the engines' ``weight_version`` to the trainer's step (with the update's last
call), so each rollout sample records which weights produced it, and ends with
``/continue_generation`` even when an update fails (the error is raised after generation is
resumed).

Converters break silently (a wrong QKV split still loads), so a push given a probe prompt is
checked end to end: every engine samples a few tokens from it through plain ``/generate`` (real
SGLang answers the same), the trainer scores those tokens, and the mean absolute difference of
the two logprobs must stay within ``check_tolerance`` (``SyncCheckError`` names the engine
otherwise). The check runs in the background, beside the next rollout (it only reads the
weights), and ``checked()`` -- which the loop awaits before the trainer changes the weights
again -- returns ``sync/check_logprob_diff`` or raises. ``check_every`` thins it out.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from kernel.engine.client import EngineError
from kernel.engine.process_group import (
    GroupConfig,
    destroy_custom_process_group,
    init_custom_process_group,
    listen,
)
from kernel.engine.weights import FlatBucketWriter, encode_named_tensors
from kernel.sample import Sample
from kernel.sync.buckets import NamedTensor, iter_buckets
from kernel.sync.settings import SyncConfig

log = logging.getLogger(__name__)


class SyncCheckError(RuntimeError):
    """After a push, an engine's logprobs differ from the trainer's beyond check_tolerance."""


@dataclass
class BucketMeta:
    """What the engines are told of one bucket before it is broadcast."""

    names: list[str]
    dtypes: list[str]
    shapes: list[list[int]]
    nbytes: int
    last: bool = False  # the export's last bucket: its update carries the weight version


class LocalBroadcaster:
    """The trainer's end of the distributed and shared transports, in the trainer's own process.
    It streams the trainer's weights bucket by bucket (every rank of a trainer takes part in
    gathering each bucket), as CUDA tensors for NCCL and CPU tensors for gloo, so at most one
    bucket is held beyond the model; rank 0 broadcasts it (distributed), or each rank copies it
    into a buffer it shares (shared). Each method blocks; WeightSync calls them off the event
    loop."""

    def __init__(self, trainer, host: str = "127.0.0.1"):
        self.trainer, self.host = trainer, host
        self.group = None
        self._store = None  # rank 0's rendezvous store, listening since rendezvous()
        self._buckets = None  # the export in progress: an iterator of buckets
        self._bucket: list[NamedTensor] = []  # the bucket gathered last
        self._ahead: list[NamedTensor] = []  # the one after it (none: that one is the last)
        self._device = "cpu"  # where the export's tensors are
        self._writer: FlatBucketWriter | None = None  # the shared transport's buffer

    def rendezvous(self) -> tuple[str, int]:
        """Where the group meets: this host and a port on it that rank 0's store already
        listens on (``join`` uses that store)."""
        self._store = listen(self.host)
        return self.host, self._store.port

    def backend(self) -> str:
        """nccl for a trainer on a GPU, gloo otherwise (SyncConfig.backend auto)."""
        return "nccl" if self.trainer.device.type == "cuda" else "gloo"

    def join(self, cfg) -> None:
        """Join the weight-sync group as rank 0 (blocks until every engine has joined)."""

        self.group = init_custom_process_group(cfg, 0, self._store)

    def start(self, bucket_bytes: int, backend: str) -> None:
        """Begin an export of the trainer's weights in buckets of ``bucket_bytes``."""
        self._device = "cuda" if backend == "nccl" else "cpu"
        named = ((n, t.to(self._device)) for n, t in self.trainer.named_parameters_for_sync())
        self._buckets = iter_buckets(named, bucket_bytes)
        self._ahead = next(self._buckets, [])

    def next(self) -> BucketMeta | None:
        """Gather the next bucket; its names, dtypes, shapes and bytes, and whether it is the
        last (None: all done). One bucket is gathered ahead, to know which is the last."""
        self._bucket, self._ahead = self._ahead, next(self._buckets, []) if self._ahead else []
        if not self._bucket:
            return None
        return BucketMeta(
            [n for n, _ in self._bucket],
            [str(t.dtype).removeprefix("torch.") for _, t in self._bucket],
            [list(t.shape) for _, t in self._bucket],
            sum(t.numel() * t.element_size() for _, t in self._bucket),
            last=not self._ahead,
        )

    def broadcast(self) -> None:
        """Broadcast the bucket gathered last to the engines, tensor by tensor."""
        import torch.distributed as dist

        for _, t in self._bucket:
            dist.broadcast(t.contiguous(), src=0, group=self.group)

    def share(self) -> list[str]:
        """The bucket gathered last, copied into this process's shared buffer: its
        ``flattened_bucket`` payload (one: this process is one rank). The buffer is reused by
        the next ``share``, of this export or the next one (no new shared memory each step):
        the engines must have read it by then."""
        if self._writer is None:
            self._writer = FlatBucketWriter(self._device)
        return [self._writer.payload(self._bucket)]

    def release(self) -> None:
        """End the export (also an unfinished one) and drop the buckets it holds."""
        self._buckets, self._bucket, self._ahead = None, [], []

    def leave(self) -> None:
        """Leave the group (after the engines have left theirs)."""

        if self.group is not None:
            destroy_custom_process_group(self.group)
            self.group = None
        self._store = None


class WeightSync:
    """Pushes a TorchTrainer's weights to a list of EngineClients. ``temperature`` is the one
    the trainer scores logprobs at (the model's rollout temperature); the check samples at it.
    ``run`` awaits a blocking call on the trainer's thread (default: any pool thread).
    ``engine_ranks`` (shared transport): per client, the trainer ranks on its TP ranks' GPUs,
    whose payloads it receives (None: rank 0's for every client). ``adapters``: the names of a
    LoRA trainer's adapters, which its pushes send instead of the weights."""

    def __init__(
        self,
        cfg: SyncConfig,
        clients: list,
        work_dir: Path,
        temperature: float = 1.0,
        run: Callable[..., Awaitable] | None = None,
        engine_ranks: list[list[int]] | None = None,
        adapters: list[str] | None = None,
    ):
        self.cfg = cfg.validate()
        self.adapters = list(adapters or [])
        self._served: dict[str, set[str]] = {}  # engine URL -> the adapters loaded on it
        self.clients = clients
        if engine_ranks is not None and len(engine_ranks) != len(clients):
            raise ValueError(
                f"engine_ranks lists {len(engine_ranks)} engines for {len(clients)} clients"
            )
        self.engine_ranks = engine_ranks
        # How blocking trainer work (scoring, exporting weights) is awaited: on the trainer's
        # own thread (kernel.train.thread.TrainerThread.run), or on any pool thread.
        self._run = run or asyncio.to_thread
        self.work_dir = Path(work_dir)
        self.temperature = temperature
        self.transport = cfg.transport
        if self.transport == "auto":
            local = all(_is_local(c.base_url) for c in clients)
            self.transport = "shared" if local else "tensor"
        self._broadcaster = None  # rank 0 of the distributed transport, once its group is formed
        self._trainer = None  # ... and the trainer whose weights it sends
        self._backend = self.cfg.backend  # ... and its process group's backend (auto resolved)
        self._pushes = 0  # pushes given a probe so far (for check_every)
        self._check: asyncio.Task | None = None  # the check of the last push, in the background

    @property
    def bucket_bytes(self) -> int:
        return int(self.cfg.bucket_mb * 2**20)

    async def _all(self, make_call) -> list:
        return await asyncio.gather(*(make_call(c) for c in self.clients))

    async def push(
        self,
        trainer,
        version: int,
        probe: list[int] | None = None,
        idle: bool = False,
        agent: str | None = None,
    ) -> dict:
        """Update every engine to the trainer's current weights, labelled ``version``. With a
        ``probe`` prompt (token ids; of ``agent``, whose adapter serves it with LoRA) the
        check of these weights starts in the background: await ``checked()`` before the
        trainer's weights change again. ``idle``: the caller has no request in flight (a
        synchronous loop between rollouts), so the engines are not paused and continued around
        the update (two round trips each; an engine applies an update between two of its steps
        either way)."""
        await self.checked()  # a check still running reads the weights this push replaces
        t0 = time.perf_counter()
        if not idle:
            await self._all(lambda c: c.pause(self.cfg.pause_mode))
        try:
            transport = "adapters" if self.adapters else self.transport
            nbytes = await getattr(self, f"_push_{transport}")(trainer, str(version))
        finally:
            if not idle:
                await self._all(lambda c: c.continue_generation())
        metrics = {"sync/time_s": time.perf_counter() - t0, "sync/mb": nbytes / 2**20}
        if probe and self.cfg.check_tokens:
            self._pushes += 1
            if (self._pushes - 1) % self.cfg.check_every == 0:
                self._check = asyncio.ensure_future(self.check(trainer, probe, version, agent))
        return metrics

    async def checked(self) -> dict[str, float]:
        """Wait for the check of the last push, if one runs: ``{"sync/check_logprob_diff": x}``
        (empty without a check); raises SyncCheckError if the engines failed it."""
        task, self._check = self._check, None
        return {} if task is None else {"sync/check_logprob_diff": await task}

    async def check(
        self, trainer, probe: list[int], version: int, agent: str | None = None
    ) -> float:
        """Every engine samples ``check_tokens`` tokens after ``probe`` (at the trainer's
        temperature, through ``/generate``, with ``agent``'s LoRA adapter if it has one); the
        trainer scores the same tokens. Returns the
        largest mean |engine - trainer| logprob over the engines; raises SyncCheckError naming
        an engine that is not at ``version`` or differs by more than ``check_tolerance``. An
        engine that gives no reply (it died since the push) is skipped with a warning; none
        replying is an error."""
        params = {
            "temperature": self.temperature,
            "top_p": 1.0,
            "max_new_tokens": self.cfg.check_tokens,
        }
        lora = agent if agent in self.adapters else None
        replies = await asyncio.gather(
            *(c.generate(probe, params, lora_path=lora) for c in self.clients),
            return_exceptions=True,
        )
        checked, results = [], []
        for client, reply in zip(self.clients, replies, strict=True):
            if isinstance(reply, EngineError) and reply.status is None:
                # No reply: the engine died after the push (its pool restarts it and pushes the
                # current weights before it serves again); a dead engine serves no rollout.
                log.warning("weight sync check: engine %s did not reply: skipped", client.base_url)
                continue
            if isinstance(reply, BaseException):
                raise reply
            checked.append(client)
            results.append(reply)
        if not checked:
            raise SyncCheckError(
                f"weight sync check: no engine replied after the push of version {version}"
            )
        samples = [
            Sample(
                prompt_ids=list(probe),
                response_ids=r.output_ids,
                loss_mask=[1] * len(r.output_ids),
                agent=agent or "default",
            )
            for r in results
        ]
        scored = await self._run(trainer.compute_logprobs, samples)
        worst = 0.0
        for client, res, ref in zip(checked, results, scored, strict=True):
            if res.weight_version != str(version):
                raise SyncCheckError(
                    f"weight sync check: engine {client.base_url} serves weight version "
                    f"{res.weight_version!r} after the push of version {version}"
                )
            if not ref:  # stopped at once: nothing to compare
                continue
            diff = sum(abs(a - b) for a, b in zip(res.logprobs, ref, strict=True)) / len(ref)
            if diff > self.cfg.check_tolerance:
                raise SyncCheckError(
                    f"weight sync check: after the push of version {version}, engine "
                    f"{client.base_url} gives logprobs {diff:.4f} nats per token away from the "
                    f"trainer's (sync.check_tolerance {self.cfg.check_tolerance}): it does not "
                    "serve the trainer's weights (a wrong conversion or a lost update)"
                )
            worst = max(worst, diff)
        return worst

    async def _push_disk(self, trainer, version: str) -> int:
        path = await self._run(trainer.save_hf, self.work_dir / "sync_weights")
        await self._all(lambda c: c.update_weights_from_disk(str(path), weight_version=version))
        return sum(f.stat().st_size for f in Path(path).glob("*.safetensors"))

    async def _push_adapters(self, trainer, version: str) -> int:
        """A LoRA trainer's adapters that stepped since the last push, each replacing its
        namesake on every engine, and to an engine lacking some (start, restart) those too;
        then the version."""
        stepped = set(await self._run(trainer.adapters_to_sync))
        needs = {
            c.base_url: stepped | (set(self.adapters) - self._served.get(c.base_url, set()))
            for c in self.clients
        }
        names = [n for n in self.adapters if any(n in need for need in needs.values())]

        async def to_each(name: str, load) -> None:  # load(client): its load call
            await asyncio.gather(
                *(
                    self._replace(c, name, functools.partial(load, c))
                    for c in self.clients
                    if name in needs[c.base_url]
                )
            )

        nbytes = 0
        if self.transport == "disk":
            folders = await self._run(trainer.save_adapters, self.work_dir / "sync_adapters", names)
            for name, folder in folders.items():
                await to_each(name, lambda c, n=name, f=folder: c.load_lora_adapter(n, str(f)))
                nbytes += sum(f.stat().st_size for f in folder.glob("*.safetensors"))
        for name in names if self.transport != "disk" else []:
            config, tensors = await self._run(trainer.adapter, name)
            nbytes += sum(t.numel() * t.element_size() for _, t in tensors)
            payload = await self._run(encode_named_tensors, tensors)
            await to_each(
                name,
                lambda c, n=name, cf=config, p=payload: c.load_lora_adapter_from_tensors(n, cf, p),
            )
        await self._all(lambda c: c.update_weight_version(version))
        return nbytes

    async def _replace(self, client, name: str, load: Callable[[], Awaitable]) -> None:
        """Adapter ``name`` on ``client`` replaced by what ``load()`` loads: unloaded first when
        it is there (SGLang loads no name twice)."""
        served = self._served.setdefault(client.base_url, set())
        if name in served:
            await client.unload_lora_adapter(name)
            served.discard(name)
        await load()
        served.add(name)

    async def _push_shared(self, trainer, version: str) -> int:
        """Per bucket, every trainer rank gathers it and copies it into its own shared buffer;
        each engine is sent the payloads of its ranks (``engine_ranks``), which hold handles,
        not weights: the weights never pass through this process. The buffers are on the
        trainer's device: CPU shared memory, or its GPUs (CUDA IPC)."""
        b = trainer.weight_broadcaster()
        ranks = self.engine_ranks or [[0]] * len(self.clients)

        async def send(m: BucketMeta) -> None:
            payloads = await self._run(b.share)  # one per trainer rank
            tag = version if m.last else None
            await asyncio.gather(
                *(
                    c.update_weights_from_serialized(
                        [payloads[r] for r in rs],
                        load_format="flattened_bucket",
                        weight_version=tag,
                    )
                    for c, rs in zip(self.clients, ranks, strict=True)
                )
            )

        return await self._export(b, await self._run(b.backend), version, send)

    async def _push_tensor(self, trainer, version: str) -> int:
        """Per bucket: gather and encode it on the trainer's thread (an FSDP trainer gathers
        each tensor from its shards), send it to every engine; the last carries the version."""
        buckets = iter_buckets(trainer.named_parameters_for_sync(), self.bucket_bytes)
        nbytes, ahead = 0, await self._run(next, buckets, None)
        while ahead is not None:  # one bucket ahead: is this one the last?
            bucket, ahead = ahead, await self._run(next, buckets, None)
            nbytes += sum(t.numel() * t.element_size() for _, t in bucket)
            payload = await self._run(encode_named_tensors, bucket)
            tag = version if ahead is None else None
            await self._all(
                lambda c, p=payload, v=tag: c.update_weights_from_serialized([p], weight_version=v)
            )
        return nbytes

    async def _ensure_group(self, trainer) -> None:
        if self._broadcaster is not None:
            if trainer is not self._trainer:
                raise ValueError(
                    "WeightSync: the distributed transport's group was formed with another "
                    "trainer as rank 0; use one WeightSync per trainer"
                )
            return

        broadcaster = trainer.weight_broadcaster()
        host, port = await self._run(broadcaster.rendezvous)
        backend = self.cfg.backend
        if backend == "auto":
            backend = await self._run(broadcaster.backend)
        cfg = GroupConfig(
            master_address=host, master_port=port, world_size=1 + len(self.clients), backend=backend
        )
        joins = [
            c.init_weights_update_group(
                cfg.master_address,
                cfg.master_port,
                i + 1,
                cfg.world_size,
                backend=cfg.backend,
                group_name=cfg.group_name,
            )
            for i, c in enumerate(self.clients)
        ]
        await asyncio.gather(self._run(broadcaster.join, cfg), *joins)
        self._broadcaster, self._trainer, self._backend = broadcaster, trainer, backend

    async def _push_distributed(self, trainer, version: str) -> int:
        """Per bucket, the engines receive (HTTP call in flight) while rank 0 broadcasts."""
        await self._ensure_group(trainer)
        b = self._broadcaster

        async def send(m: BucketMeta) -> None:
            tag = version if m.last else None
            await asyncio.gather(
                self._all(
                    lambda c: c.update_weights_from_distributed(
                        m.names, m.dtypes, m.shapes, weight_version=tag
                    )
                ),
                self._run(b.broadcast),
            )

        return await self._export(b, self._backend, version, send)

    async def _export(self, b, backend: str, version: str, send) -> int:
        """The export both broadcaster transports run: ``b`` gathers the trainer's weights
        bucket by bucket (every rank takes part) and ``send(meta)`` delivers each, the last with
        the weight version; the export is released even when a bucket fails. Returns the bytes
        sent."""
        await self._run(b.start, self.bucket_bytes, backend)
        nbytes = 0
        try:
            while (m := await self._run(b.next)) is not None:
                await send(m)
                nbytes += m.nbytes
        finally:
            await self._run(b.release)
        if not nbytes:  # nothing to send: the version still moves
            await self._all(lambda c: c.update_weight_version(version))
        return nbytes

    async def reset(self, restarted: list[str]) -> None:
        """Engines at ``restarted`` URLs were restarted: leave the distributed transport's
        process group (the others first) so that the next push forms a new one with every
        engine. A no-op for the other transports. Restarted engines hold no LoRA adapter: the
        next push sends them every one."""
        for url in restarted:
            self._served.pop(url, None)
        if self._broadcaster is None or not restarted:
            return
        live = [c for c in self.clients if c.base_url not in restarted]
        await asyncio.gather(*(c.destroy_weights_update_group() for c in live))
        await self._run(self._broadcaster.leave)
        self._broadcaster = None

    async def aclose(self) -> None:
        """Drop a check still running; leave the weight-sync group: the
        engines first, then the trainer (tearing gloo down on one side while the other still
        holds the pair can abort the other process)."""
        if self._check is not None:
            self._check.cancel()
            self._check = None
        if self._broadcaster is not None:
            await self._all(lambda c: c.destroy_weights_update_group())
            await self._run(self._broadcaster.leave)
            self._broadcaster = None


def _is_local(url: str) -> bool:
    """Whether an engine URL is on a loopback address (this machine)."""
    host = urlsplit(url).hostname or ""
    return host.startswith("127.") or host in ("localhost", "::1")
