"""LoRA in the torch trainer (kernel/train/lora.py): one adapter per agent over one frozen base.

On the tiny character model: an agent's step moves its own adapter and nothing else (another
agent's logprobs stay bit for bit), a mixed batch trains each adapter exactly as if it trained
alone on its agent's samples, checkpoints hold adapters only and resume exactly, agents without
an adapter (and the KL reference) see the bare base, and the adapters a sync sends are PEFT
files peft itself loads to the same logprobs.
"""

from __future__ import annotations

import asyncio
import dataclasses

import pytest
import torch
from transformers import AutoModelForCausalLM

from kernel.loss import LossConfig
from kernel.sample import Sample
from kernel.train.optim import OptimConfig
from kernel.train.settings import LoraConfig, TorchTrainerConfig
from kernel.train.torch_backend import TorchTrainer

LORA = LoraConfig(rank=4, alpha=8)
OPTIM = OptimConfig(lr=5e-3)


def trainer(model_dir, names=("alice", "bob"), loss=None, seed=0) -> TorchTrainer:
    torch.manual_seed(seed)  # the adapters' A matrices start random, B at zero
    adapters = dict.fromkeys(names, LORA)
    return TorchTrainer(
        model_dir, OPTIM, loss or LossConfig(), TorchTrainerConfig(), 10, adapters=adapters
    )


def of(agent: str, samples: list[Sample]) -> list[Sample]:
    return [dataclasses.replace(s, agent=agent) for s in samples]


def base_weights(t: TorchTrainer) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in t.model.named_parameters() if "lora_" not in n}


def test_one_agents_step_leaves_another_agents_outputs_bit_identical(char_model_dir, make_samples):
    t = trainer(char_model_dir)
    a, b = of("alice", make_samples(8, seed=1)), of("bob", make_samples(8, seed=2))
    before_a, before_b, base = t.compute_logprobs(a), t.compute_logprobs(b), base_weights(t)
    metrics = t.train_step(a)
    assert metrics["alice/n_updates"] == 1 and not any(k.startswith("bob/") for k in metrics)
    assert t.compute_logprobs(b) == before_b  # bit for bit
    assert t.compute_logprobs(a) != before_a
    after = base_weights(t)
    assert all(torch.equal(after[n], w) for n, w in base.items())  # the base is frozen
    assert t.adapters_to_sync() == ["alice"] and t.adapters_to_sync() == []  # only alice stepped


def test_a_mixed_batch_trains_each_adapter_as_if_alone(char_model_dir, make_samples):
    """Two adapters trained on one mixed batch end where each ends trained alone on its own
    agent's samples: separate optimizers, separate loss normalisers, no leakage."""
    a, b = of("alice", make_samples(8, seed=1)), of("bob", make_samples(6, seed=2))
    both = trainer(char_model_dir)
    for _ in range(2):
        metrics = both.train_step(a[:4] + b[:3] + a[4:] + b[3:])
    assert metrics["alice/n_samples"] == 8 and metrics["bob/n_samples"] == 6
    alone = trainer(char_model_dir, names=("alice",))  # the same seed: a's same starting A
    for _ in range(2):
        alone.train_step(a)
    mine, ref = both.adapter("alice")[1], alone.adapter("alice")[1]
    assert [n for n, _ in mine] == [n for n, _ in ref]
    for (name, x), (_, y) in zip(mine, ref, strict=True):
        assert torch.allclose(x, y, atol=1e-6), name


def test_checkpoints_hold_adapters_only_and_resume_exactly(char_model_dir, make_samples, tmp_path):
    a, b = of("alice", make_samples(8, seed=1)), of("bob", make_samples(8, seed=2))
    t = trainer(char_model_dir)
    t.train_step(a + b)
    t.save(tmp_path / "ckpt")
    files = sorted(
        p.relative_to(tmp_path / "ckpt").as_posix() for p in (tmp_path / "ckpt").rglob("*")
    )
    assert not any(f.endswith(".safetensors") and "/" not in f for f in files)  # no base weights
    assert (
        "adapters/alice/adapter_model.safetensors" in files
        and "adapters/bob/adapter_config.json" in files
    )
    resumed = trainer(char_model_dir, seed=1)  # other starting adapters: the checkpoint's win
    resumed.load(tmp_path / "ckpt")
    assert resumed.compute_logprobs(a + b) == t.compute_logprobs(a + b)
    t.train_step(a + b)
    resumed.train_step(a + b)  # the optimizers' moments came back too
    for (n, x), (_, y) in zip(t.adapter("bob")[1], resumed.adapter("bob")[1], strict=True):
        assert torch.equal(x, y), n

    full = TorchTrainer(char_model_dir, OPTIM, LossConfig(), TorchTrainerConfig(), 10)
    with pytest.raises(ValueError, match="holds LoRA adapters"):
        full.load(tmp_path / "ckpt")


def test_agents_without_an_adapter_and_the_kl_reference_see_the_bare_base(
    char_model_dir, make_samples
):
    plain = TorchTrainer(char_model_dir, OPTIM, LossConfig(), TorchTrainerConfig(), 10)
    samples = make_samples(6, seed=3)
    t = trainer(char_model_dir, loss=LossConfig(kl_coef=0.1))
    t.train_step(of("alice", samples))
    frozen = of("judge", samples)  # a frozen agent of the model: no adapter
    flat = [x for lp in t.compute_logprobs(frozen) for x in lp]
    assert flat == pytest.approx(
        [x for lp in plain.compute_logprobs(samples) for x in lp], abs=1e-6
    )
    metrics = t.train_step(of("alice", samples))
    assert metrics["alice/kl"] > 0  # alice moved away from the base, which the KL term sees


def test_synced_adapters_are_peft_files_peft_loads_to_the_same_logprobs(
    char_model_dir, make_samples, tmp_path
):
    from peft import PeftModel

    samples = of("bob", make_samples(4, seed=4))
    t = trainer(char_model_dir)
    t.train_step(samples)
    folder = t.save_adapters(tmp_path, ["bob"])["bob"]
    config, tensors = t.adapter("bob")
    assert config["r"] == 4 and sorted(config["target_modules"]) == sorted(LORA.target_modules)
    assert all(".lora_" in n and ".bob." not in n for n, _ in tensors)  # PEFT's names, no adapter
    base = AutoModelForCausalLM.from_pretrained(char_model_dir, dtype=torch.float32)
    peft_model = PeftModel.from_pretrained(base, folder).eval()
    s = samples[0]
    ids = torch.tensor([s.prompt_ids + s.response_ids])
    logits = peft_model(input_ids=ids).logits[0, len(s.prompt_ids) - 1 : -1]  # (R, V)
    ref = torch.log_softmax(logits.float(), -1).gather(-1, ids[0, len(s.prompt_ids) :, None])
    assert t.compute_logprobs([s])[0] == pytest.approx(ref[:, 0].tolist(), abs=1e-5)


def test_lora_errors_name_what_is_wrong(char_model_dir, make_samples):
    with pytest.raises(ValueError, match=r"no Linear layer named \['qproj'\]"):
        TorchTrainer(
            char_model_dir,
            OPTIM,
            LossConfig(),
            TorchTrainerConfig(),
            10,
            adapters={"alice": LoraConfig(rank=2, target_modules=["qproj"])},
        )
    t = trainer(char_model_dir)
    with pytest.raises(ValueError, match=r"samples of \['carol'\], which have no LoRA adapter"):
        t.train_step(of("carol", make_samples(2)))
    with pytest.raises(ValueError, match="save them with save_adapters"):
        t.save_hf("unused")


def test_a_push_sends_what_stepped_and_every_adapter_to_a_restarted_engine(
    char_model_dir, make_samples, tmp_path
):
    """kernel.sync.push with LoRA over two real engines: the first push loads both adapters on
    both; after alice's step only alice travels; after an engine's restart (WeightSync.reset)
    it gets both again while the other gets only what stepped. After each push every engine
    serves each adapter as the trainer scores it."""
    from kernel.engine.client import EngineClient
    from kernel.engine.launch import free_port, launch_server
    from kernel.engine.settings import ServerConfig
    from kernel.sync.push import WeightSync
    from kernel.sync.settings import SyncConfig

    loads: dict[str, list[str]] = {}

    class Recording(EngineClient):  # the real client, noting which adapters it sends
        async def load_lora_adapter_from_tensors(self, name, *args, **kwargs):
            loads.setdefault(self.base_url, []).append(name)
            return await super().load_lora_adapter_from_tensors(name, *args, **kwargs)

    t = trainer(char_model_dir)
    a, b = of("alice", make_samples(8, seed=1)), of("bob", make_samples(8, seed=2))
    settings = {"model": char_model_dir, "enable_lora": True, "max_batch_size": 8}
    procs = [
        launch_server(
            ServerConfig(port=free_port(), num_threads=1, **settings), tmp_path / f"{i}.log"
        )
        for i in range(2)
    ]

    async def main(urls: list[str]) -> list[list[list[str]]]:
        clients = [Recording(url) for url in urls]
        sync = WeightSync(
            SyncConfig(transport="tensor"), clients, tmp_path, adapters=["alice", "bob"]
        )
        sent = []
        try:
            for version, (batch, restarted) in enumerate(
                [(None, []), (a, []), (b, [urls[1]])], start=1
            ):
                if batch is not None:
                    t.train_step(batch)
                if restarted:  # a restarted engine holds no adapter
                    await clients[1].unload_lora_adapter("alice")
                    await clients[1].unload_lora_adapter("bob")
                    await sync.reset(restarted)
                loads.clear()
                await sync.push(t, version)
                sent.append([sorted(loads.get(url, [])) for url in urls])
                for agent in ("alice", "bob"):
                    assert await sync.check(t, [1, 20, 30, 40, 5], version, agent) < 1e-4
        finally:
            for c in clients:
                await c.aclose()
        return sent

    try:
        for p in procs:
            p.wait_healthy(deadline_s=180)
        sent = asyncio.run(main([p.url for p in procs]))
    finally:
        for p in procs:
            p.stop()
    assert sent == [
        [["alice", "bob"], ["alice", "bob"]],  # start: every engine lacks both
        [["alice"], ["alice"]],  # only alice stepped
        [["bob"], ["alice", "bob"]],  # bob stepped; the restarted engine gets both
    ]
