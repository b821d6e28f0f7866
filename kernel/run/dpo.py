"""``python -m kernel dpo``: preference optimisation of one agent's model, DPO or IPO.

Data (``dpo.path``, read like ``data.path``), one preference pair a row, either:

- ``kernel collect --collect.keep pairs`` output: ``chosen`` and ``rejected`` trajectories,
  trained on with their exact ids and loss masks;
- ``prompt`` (a string or chat messages) with ``chosen`` and ``rejected`` replies as text.

With s(y) the sum of the policy's logprobs of a reply's trained tokens, s_ref(y) the same under
the reference (the starting weights, frozen: computed once before the first update, so no
second model is held), and the implicit reward margin
``m = (s(chosen) - s_ref(chosen)) - (s(rejected) - s_ref(rejected))``, the loss of a pair is

    dpo: -log sigmoid(beta * m)                      (Rafailov et al. 2023)
    ipo: (m - 1 / (2 * beta)) ** 2                   (Azar et al. 2023)

averaged over the pairs of a batch. It is optimised by the agent's RL trainer itself (either
backend): the loss depends on each reply only through s(y), so its gradient is
``sum_y dL/ds(y) * grad s(y)``; a no-grad forward gives the margins, every reply gets the
advantage ``-2 * dL/ds(y)`` and one update of the policy loss with ratio 1 and ``agg =
seq_mean_token_sum`` (the mean over the 2P replies of each one's token sum) has exactly that
gradient. Metrics per update: loss, accuracy (share of pairs with m > 0) and mean margin; on
``dpo.eval_path`` the same, before and after. The model is saved to ``<output_dir>/model``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

import torch
import torch.nn.functional as F

from kernel.buffer import DataConfig, DataError, load_rows
from kernel.hooks import package_file
from kernel.loss import LossConfig
from kernel.run.config import RunPlan, TrainConfig, resolve
from kernel.run.sft import SFTConfig, TuneLoop, Tuning, example, trained_sums
from kernel.sample import Sample

LOSSES = ("dpo", "ipo")


@dataclass
class DPOConfig:
    """What ``kernel dpo`` trains on, with which loss, and how long."""

    path: str = ""
    """Preference pairs: collect's pairs.jsonl, or rows of prompt, chosen and rejected."""
    eval_path: str = ""
    """Held-out pairs, same shapes; empty: none."""
    agent: str = ""
    """The agent whose model is trained; default: the config's first agent."""
    loss: str = "dpo"
    """dpo (sigmoid loss) or ipo (squared loss)."""
    beta: float = 0.1
    """Strength of the pull toward the reference (DPO's beta; IPO's tau)."""
    epochs: int = 1
    """Passes over the pairs."""
    batch_size: int = 4
    """Pairs per optimizer update."""
    max_len: int = 1024
    """Longest reply with its prompt, in tokens; longer ones are refused, by row."""
    system: str | None = None
    """System message put before text ``prompt`` rows."""

    def validate(self) -> DPOConfig:
        if not self.path:
            raise ValueError("dpo.path: kernel dpo needs the preference pairs")
        if self.loss not in LOSSES:
            raise ValueError(f"dpo.loss must be one of {LOSSES}, got {self.loss!r}")
        if not 0 < self.beta < math.inf:
            raise ValueError(f"dpo.beta must be > 0, got {self.beta}")
        if self.epochs < 1 or self.batch_size < 1 or self.max_len < 2:
            raise ValueError("dpo.epochs and dpo.batch_size must be >= 1, dpo.max_len >= 2")
        return self


def preference_loss(margin: torch.Tensor, beta: float, loss: str) -> torch.Tensor:
    """Per-pair loss of the implicit reward margins ``margin`` (P,)."""
    if loss == "dpo":
        return -F.logsigmoid(beta * margin)
    return (margin - 1 / (2 * beta)) ** 2


def pair_advantages(margin: torch.Tensor, beta: float, loss: str) -> torch.Tensor:
    """(P,) margins -> (P,) advantage of each chosen reply (its rejected one gets the
    negative): -2 dL/ds(chosen) with L the batch's mean loss times P (see module docstring)."""
    m = margin.detach().double().requires_grad_()
    (grad,) = torch.autograd.grad(preference_loss(m, beta, loss).sum(), m)
    return (-2 * grad).float()


def load_pairs(path: str, tokenizer: Any, cfg: DPOConfig) -> list[tuple[Sample, Sample]]:
    """Every row of ``path`` as (chosen, rejected) samples; errors name file, row and field."""
    rows = load_rows(DataConfig(path=package_file(path)))
    scfg = SFTConfig(path=path, agent=cfg.agent, max_len=cfg.max_len, system=cfg.system)
    pairs = []
    for i, row in enumerate(rows):
        where = f"{path}: row {i + 1}"
        sides = []
        for side in ("chosen", "rejected"):
            value = row.get(side)
            if isinstance(value, dict):  # a collect trajectory
                sides.append(example(value, tokenizer, scfg, f"{where}, {side}"))
            elif isinstance(value, str):
                reply = {"prompt": row.get("prompt"), "response": value}
                sides.append(example(reply, tokenizer, scfg, f"{where}, {side}"))
            else:
                raise DataError(f"{where}: field {side!r} must be a reply (text) or a trajectory")
        chosen, rejected = sides
        if chosen is None or rejected is None:
            continue  # another agent's pair
        if (chosen.prompt_ids, chosen.response_ids) == (rejected.prompt_ids, rejected.response_ids):
            raise DataError(f"{where}: 'chosen' and 'rejected' are the same reply")
        pairs.append((chosen, rejected))
    if not pairs:
        raise DataError(f"{path}: no preference pair for agent {cfg.agent!r}")
    return pairs


def sums(trainer, samples: list[Sample]) -> torch.Tensor:
    """(N,) each sample's summed logprob of its trained tokens, current weights, no grad."""
    return torch.tensor(trained_sums(trainer, samples), dtype=torch.float64)


def dpo(run: TrainConfig | RunPlan, dcfg: DPOConfig) -> dict[str, float]:
    """Train ``dcfg.agent``'s model of ``run`` (a config or its plan) on ``dcfg.path``'s pairs;
    returns the last metrics row."""
    dcfg.validate()
    plan = resolve(run)
    cfg = plan.cfg
    tuning = Tuning.of(plan, dcfg.agent, "dpo.agent")
    dcfg = replace(dcfg, agent=tuning.agent)
    train = load_pairs(dcfg.path, tuning.tokenizer, dcfg)
    held_out = load_pairs(dcfg.eval_path, tuning.tokenizer, dcfg) if dcfg.eval_path else []
    # batches of pair indices, which look up the pairs' reference sums too; held-out metrics
    # before and after only (eval_every 0)
    indices = list(range(len(train)))
    loop = TuneLoop(cfg, tuning, indices, dcfg.batch_size, dcfg.epochs, 0, dcfg.loss)
    trainer = tuning.trainer(LossConfig(agg="seq_mean_token_sum"), loop.steps, cfg.seed)

    def flat(pairs):
        return [s for pair in pairs for s in pair]

    ref_train = sums(trainer, flat(train)).view(-1, 2)  # (P, 2): the frozen reference
    ref_held = sums(trainer, flat(held_out)).view(-1, 2) if held_out else None

    def margins(pairs, ref: torch.Tensor) -> torch.Tensor:
        s = sums(trainer, flat(pairs)).view(-1, 2) - ref
        return s[:, 0] - s[:, 1]

    def scores(prefix: str, m: torch.Tensor) -> dict[str, float]:
        return {
            f"{prefix}/loss": float(preference_loss(m, dcfg.beta, dcfg.loss).mean()),
            f"{prefix}/accuracy": float((m > 0).double().mean()),
            f"{prefix}/margin": float(m.mean()),
        }

    def update(idx: list[int]) -> dict[str, float]:
        pairs = [train[j] for j in idx]
        m = margins(pairs, ref_train[idx])
        adv = pair_advantages(m, dcfg.beta, dcfg.loss)
        batch = []
        for (c, r), a in zip(pairs, adv.tolist(), strict=True):
            batch += [replace(c, advantage=a), replace(r, advantage=-a)]
        metrics = trainer.train_step(batch)
        return {**scores("train", m), "train/grad_norm": metrics.get("grad_norm", float("nan"))}

    def evaluate() -> dict[str, float]:
        return scores("eval", margins(held_out, ref_held))

    return loop.run(trainer, update, evaluate if held_out else None)
