"""Multi-LoRA runs end to end: one base model, one adapter per agent, trained and served together.

The tiny three-role math preset (recipes/math_solver_verifier/presets/tiny_multi_lora.yaml)
trains three adapters on one base with one engine serving each under its role's name: the
engine's logprobs of every rollout equal the trainer's under the same adapter, each push is
checked at 1e-4, checkpoints hold adapters only and a resumed run continues from them, and
kernel eval / export serve and write a checkpoint's adapters.

No toy learning run here: on the tiny models built from a random config, LoRA stops early
whatever its rank, alpha or learning rate (maximising three tokens' logprob with plain peft
and AdamW: -4.67 -> -3.46 nats, where full fine-tuning keeps going), since the frozen random
projections bound what the adapters can move. Whether LoRA learns is measured on SmolLM2.
"""

from __future__ import annotations

from pathlib import Path

from kernel.cli import train_config
from kernel.run.loop import train

ROOT = Path(__file__).resolve().parent.parent
TINY = ROOT / "recipes" / "math_solver_verifier" / "presets" / "tiny_multi_lora.yaml"
ROLES = ("solver", "rewriter", "selector")
CHECKED = ["--sync.check_tolerance=1e-4", "--sync.check_every=1"]


def test_three_adapters_on_one_base_train_and_serve_and_resume(tmp_path):
    flags = [f"--output_dir={tmp_path}", "--save_every=1", *CHECKED]
    rows = train(train_config([f"--config={TINY}", *flags]))
    assert [r["step"] for r in rows] == [0, 1]
    for row in rows:
        for role in ROLES:
            assert row[f"train/{role}/n_samples"] > 0
            # the engine sampled each role's tokens with that role's adapter, as trained
            assert row[f"train/{role}/logprob_diff"] < 1e-4, role
    assert rows[-1]["sync/check_logprob_diff"] < 1e-4
    assert [r["weight_version"] for r in rows] == [1, 2]

    trainer = tmp_path / "checkpoints" / "step_2" / "trainers" / "solver"
    files = {p.relative_to(trainer).as_posix() for p in trainer.rglob("*.safetensors")}
    assert files == {f"adapters/{r}/adapter_model.safetensors" for r in ROLES}  # no base weights
    assert sum((trainer / f).stat().st_size for f in files) < 2**20

    resumed = train(train_config([f"--config={TINY}", *flags, "--num_steps=3", "--resume=true"]))
    assert [r["step"] for r in resumed] == [2]
    assert resumed[0]["weight_version"] == 3
    for role in ROLES:  # the engines got the checkpoint's adapters back before step 2
        assert resumed[0][f"train/{role}/logprob_diff"] < 1e-4


def test_a_lora_checkpoint_evaluates_and_exports_merged(tmp_path):
    """kernel eval --checkpoint serves each role with its adapter from the checkpoint (a request
    naming an adapter the engine lacks would fail); kernel export --merge writes the base with
    the solver's adapter merged in: the same logits as base + adapter."""
    import torch
    from peft import PeftModel

    from kernel.cli import main
    from kernel.models import load_causal_lm, materialize_model
    from kernel.run.loop import evaluate

    cfg = train_config([f"--config={TINY}", f"--output_dir={tmp_path / 'run'}", "--num_steps=1"])
    train(cfg)
    ckpt = tmp_path / "run" / "checkpoints" / "step_1"
    flags = [f"--output_dir={tmp_path / 'eval'}"]
    row = evaluate(train_config([f"--config={TINY}", *flags]), str(ckpt))
    assert any(k.startswith("eval/selector/") for k in row)

    main(["export", f"--checkpoint={ckpt}", "--agent=solver", f"--out={tmp_path / 'merged'}"])
    main(
        [
            "export",
            f"--checkpoint={ckpt}",
            "--agent=rewriter",
            f"--out={tmp_path / 'adapter'}",
            "--merge=false",
        ]
    )
    assert (tmp_path / "adapter" / "adapter_model.safetensors").exists()
    ids = torch.tensor([[1, 5, 9, 42, 7]])
    merged = load_causal_lm(str(tmp_path / "merged"))(input_ids=ids).logits
    base = load_causal_lm(materialize_model("tiny-smollm2", tmp_path))
    adapter = ckpt / "trainers" / "solver" / "adapters" / "solver"
    ref = PeftModel.from_pretrained(base, adapter)(input_ids=ids).logits
    assert torch.allclose(merged, ref, atol=1e-4)


def test_adapters_sync_from_disk_as_real_sglang_loads_them(tmp_path):
    """sync.transport disk: each stepped adapter is written as a PEFT folder and loaded with
    /load_lora_adapter (real SGLang's way); the engine then serves what the trainer trained."""
    flags = [f"--output_dir={tmp_path}", "--num_steps=2", "--sync.transport=disk", *CHECKED]
    rows = train(train_config([f"--config={TINY}", *flags]))
    assert rows[-1]["sync/check_logprob_diff"] < 1e-4
    for role in ROLES:
        assert rows[-1][f"train/{role}/logprob_diff"] < 1e-4, role
        assert (
            tmp_path / "sync" / "solver" / "sync_adapters" / role / "adapter_config.json"
        ).exists()
