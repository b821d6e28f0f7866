"""``python -m kernel dpo``: DPO and IPO through the agent's own RL trainer.

Goldens of both losses and their per-reply advantages, computed by hand; the trainer's gradient
for a batch of pairs equals autograd's gradient of the DPO loss on the same tiny model; bad
pairs are refused naming file, row and field; and end to end, DPO raises the held-out
chosen-minus-rejected margin (from collect's pairs too)."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from kernel.buffer import DataError
from kernel.models import build_tiny_model, char_tokenizer
from kernel.run.dpo import DPOConfig, load_pairs, pair_advantages, preference_loss

ROOT = Path(__file__).resolve().parent.parent


def test_losses_and_advantages_match_hand_computed_goldens():
    m = torch.tensor([0.0, 2.0, -1.0], dtype=torch.float64)
    # dpo, beta 0.5: -log sigmoid(0.5 m)
    want = [math.log(2), -math.log(1 / (1 + math.exp(-1.0))), -math.log(1 / (1 + math.exp(0.5)))]
    assert preference_loss(m, 0.5, "dpo").tolist() == pytest.approx(want)
    # dL/dm = -beta * sigmoid(-beta m); the chosen reply's advantage is -2 dL/dm
    sig = [0.5, 1 / (1 + math.exp(1.0)), 1 / (1 + math.exp(-0.5))]
    assert pair_advantages(m, 0.5, "dpo").tolist() == pytest.approx([2 * 0.5 * s for s in sig])
    # ipo, beta 0.25: (m - 2)^2, dL/dm = 2 (m - 2)
    assert preference_loss(m, 0.25, "ipo").tolist() == pytest.approx([4.0, 0.0, 9.0])
    assert pair_advantages(m, 0.25, "ipo").tolist() == pytest.approx([8.0, 0.0, 12.0])


def test_trainer_gradient_is_the_dpo_loss_gradient(tmp_path):
    """Advantages from pair_advantages + one ratio-1 update with seq_mean_token_sum: the
    accumulated gradient is autograd's gradient of the mean DPO loss (reference: other
    weights, so the margin is not 0)."""
    from kernel.loss import LossConfig
    from kernel.train.optim import OptimConfig
    from kernel.train.settings import TorchTrainerConfig
    from kernel.train.torch_backend import TorchTrainer

    tok = char_tokenizer()
    path = str(build_tiny_model(tmp_path / "m", tokenizer=tok))
    rows = tmp_path / "pairs.jsonl"
    rows.write_text(
        json.dumps({"prompt": "a?", "chosen": "yes", "rejected": "no no"})
        + "\n"
        + json.dumps({"prompt": "b?", "chosen": "fine", "rejected": "bad"})
        + "\n"
    )
    pairs = load_pairs(str(rows), tok, DPOConfig(path=str(rows), max_len=128))
    flat = [s for p in pairs for s in p]
    ref = torch.tensor([-20.0, -25.0, -30.0, -22.0], dtype=torch.float64).view(-1, 2)
    beta = 0.7
    trainer = TorchTrainer(
        path, OptimConfig(), LossConfig(agg="seq_mean_token_sum"), TorchTrainerConfig(), 1
    )
    model = trainer.model

    def seq_sums() -> torch.Tensor:  # plain autograd: summed logprobs of the trained tokens
        out = []
        for s in flat:
            ids = torch.tensor([s.prompt_ids + s.response_ids])
            logp = model(input_ids=ids).logits[0, len(s.prompt_ids) - 1 : -1].log_softmax(-1)
            lp = logp.gather(-1, ids[0, len(s.prompt_ids) :, None]).squeeze(-1)
            out.append((lp * torch.tensor(s.loss_mask)).sum())
        return torch.stack(out).double().view(-1, 2)

    gain = seq_sums() - ref
    margin = gain[:, 0] - gain[:, 1]
    preference_loss(margin, beta, "dpo").mean().backward()
    want = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()

    adv = pair_advantages(margin.detach(), beta, "dpo").tolist()
    batch = []
    for (c, r), a in zip(pairs, adv, strict=True):
        batch += [replace(c, advantage=a), replace(r, advantage=-a)]
    trainer.forward_backward(batch)
    got = [p.grad for p in model.parameters()]
    for w, g in zip(want, got, strict=True):
        assert torch.allclose(w, g, atol=1e-6, rtol=1e-4)
    assert max(float(w.abs().max()) for w in want) > 1e-4  # a real gradient, not zeros


@pytest.mark.parametrize(
    "row, words",
    [
        ({"prompt": "q", "chosen": "a", "rejected": "a"}, "are the same reply"),
        ({"prompt": "q", "chosen": "a"}, "field 'rejected'"),
        ({"prompt": "q", "chosen": "a", "rejected": " "}, "'content' must be a non-empty"),
    ],
)
def test_bad_pairs_name_file_row_and_field(tmp_path, row, words):
    path = tmp_path / "p.jsonl"
    path.write_text(
        json.dumps({"prompt": "q", "chosen": "a", "rejected": "b"}) + "\n" + json.dumps(row) + "\n"
    )
    with pytest.raises(DataError, match=r"p\.jsonl: row 2") as e:
        load_pairs(str(path), char_tokenizer(), DPOConfig(path=str(path)))
    assert words in str(e.value)


def kernel(*args: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "kernel", *args]
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)


def test_dpo_raises_the_held_out_margin(tmp_path):
    rows = [
        {"prompt": f"Is {i} a number?", "chosen": "yes, it is", "rejected": "no idea at all"}
        for i in range(24)
    ]
    (tmp_path / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows[:16]))
    (tmp_path / "test.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows[16:]))
    out = tmp_path / "dpo"
    r = kernel(
        "dpo", "--preset", "toy", f"--output_dir={out}", f"--dpo.path={tmp_path / 'train.jsonl'}",
        f"--dpo.eval_path={tmp_path / 'test.jsonl'}", "--dpo.epochs=3", "--optim.lr=1e-3",
    )  # fmt: skip
    assert r.returncode == 0, r.stderr[-3000:]
    log = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert log[0]["eval/margin"] == pytest.approx(0.0, abs=1e-6)  # the reference itself
    assert log[-1]["eval/margin"] > 1.0 and log[-1]["eval/accuracy"] == 1.0
    assert log[-1]["eval/loss"] < log[0]["eval/loss"]
    assert (out / "model" / "config.json").exists()


@pytest.mark.slow
def test_dpo_on_collected_pairs(tmp_path):
    col = tmp_path / "col"
    r = kernel(
        "collect", "--preset", "toy", "--collect.max_prompts=6", "--collect.n_samples=4",
        "--collect.keep=pairs", f"--output_dir={col}",
    )  # fmt: skip
    assert r.returncode == 0, r.stderr[-3000:]
    pairs = col / "pairs.jsonl"
    assert pairs.read_text().strip()
    out = tmp_path / "dpo"
    r = kernel(
        "dpo", "--preset", "toy", f"--output_dir={out}", f"--dpo.path={pairs}",
        f"--dpo.eval_path={pairs}", "--dpo.epochs=3", "--dpo.batch_size=2", "--optim.lr=1e-3",
    )  # fmt: skip
    assert r.returncode == 0, r.stderr[-3000:]
    log = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert log[-1]["eval/margin"] > log[0]["eval/margin"]
