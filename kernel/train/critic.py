"""PPO's critic (``advantage.estimator: gae``): a value model per trained model, GAE over each
agent's own tokens, and the clipped value loss.

One critic per trained model, each seeing only the dialogues of the agents that model plays,
as those agents saw them: with one model per agent that is IPPO (independent critics, each on
its own view). With ``critic.centralized`` (MAPPO) each critic also reads the episode's global
state, ``sample.metadata["global_state"]``, set by the recipe (takes_two: the patient's hidden
case, which the doctor never sees), before the dialogue. With ``critic.scope: run`` (MAAC) one
critic serves every trained model: the run builds it once (``kernel.run.runtime.run_critic``)
and each step values and trains it on all agents' samples before the trainers, which get the
per-token advantages it set.

The critic is a separate model by default: the body of an HF causal LM (every layer but the LM
head; ``critic.model``, by default the trained model's starting weights) and a new scalar head,
zero-initialised so that the first advantages are the plain returns. With ``critic.shared``
the head sits on the actor itself (CoMLRL's ``use_separate_critic: false``): it reads the
trained model's own hidden states, and the value loss, times ``critic.value_coef``, joins the
policy loss (see step 4). Its value ``V_t`` of response token ``t`` is read at the position
that predicts ``t`` (the state before it).

Per training step (``kernel.train.update.train_step``):

1. the critic's values of every own token of the step's samples (no gradient);
2. GAE over the agent's OWN tokens (``gae_tokens``): the tokens the loss mask excludes (the
   other agents' words, tool outputs) are not steps of this agent, so the step after the last
   token of a turn is the first token of the agent's next turn; the reward comes at the last
   own token, and the value after it is 0. ``A_t = sum_k (gamma lam)^k delta_(t+k)``,
   ``delta_t = r_t + gamma V_(t+1) - V_t``, returns ``A_t + V_t``;
3. the advantages are whitened over the step's own tokens (``advantage.std_normalize``, as in
   PPO implementations) and given to the policy loss per token;
4. the critic trains on the same mini-batches and epochs as the policy (``trainer.ppo_epochs``
   x ``trainer.num_minibatches``) with the clipped value loss (``value_loss``) against the
   returns and its values of step 1; the policy trains after ``critic.num_critic_only_steps``
   steps of the critic alone (slime's warm-up). A shared head's value loss is back-propagated
   into the actor's body before the policy's own backward of the same mini-batch, so the
   actor's optimizer steps on the gradient of ``policy loss + value_coef x value loss`` (one
   joint loss, run as two forwards); the head has its own AdamW at ``critic.lr``. During the
   warm-up a shared critic trains its head alone (the actor does not move).

Supported on the torch backend with one rank; the Megatron backend and data-parallel ranks
refuse it when the trainer is built (``kernel.train.trainer.build_trainer``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from kernel.advantages import AdvantageConfig
from kernel.models import load_causal_lm, load_tokenizer
from kernel.sample import Sample
from kernel.train.batching import MicroBatch, collate, plan_microbatches, to_rows
from kernel.train.settings import CriticConfig

# ---------------------------------------------------------------- pure functions


def gae(rewards: Tensor, values: Tensor, gamma: float, lam: float) -> tuple[Tensor, Tensor]:
    """GAE of one trajectory: (T,) rewards and values of its steps in order -> (advantages,
    returns), each (T,). The value after the last step is 0 (the episode ends)."""
    adv = torch.zeros_like(values)
    running = values.new_zeros(())
    for t in reversed(range(values.shape[0])):
        next_value = values[t + 1] if t + 1 < values.shape[0] else 0.0
        delta = rewards[t] + gamma * next_value - values[t]
        running = delta + gamma * lam * running
        adv[t] = running
    return adv, adv + values


def gae_tokens(
    loss_mask: list[int], values: list[float], reward: float, gamma: float, lam: float
) -> tuple[list[float], list[float]]:
    """GAE over a sample's own tokens (``loss_mask`` 1; the others are not this agent's
    steps): the episode reward at the last own token. Returns per-response-token advantages
    and returns, 0 on the masked tokens."""
    own = [t for t, m in enumerate(loss_mask) if m]
    rewards = torch.zeros(len(own), dtype=torch.float64)
    if own:
        rewards[-1] = reward
    adv, ret = gae(rewards, torch.tensor([values[t] for t in own], dtype=torch.float64), gamma, lam)
    out_adv, out_ret = [0.0] * len(loss_mask), [0.0] * len(loss_mask)
    for j, t in enumerate(own):
        out_adv[t], out_ret[t] = float(adv[j]), float(ret[j])
    return out_adv, out_ret


def whiten(advantages: list[list[float]], masks: list[list[int]], eps: float) -> list[list[float]]:
    """Per-token advantages shifted and scaled to mean 0, std 1 over the masked tokens of all
    samples (population std; a batch of one token, or a constant one, gives 0)."""
    pairs = zip(advantages, masks, strict=True)
    flat = torch.tensor(
        [a for adv, m in pairs for a, k in zip(adv, m, strict=True) if k], dtype=torch.float64
    )
    if flat.numel() == 0:
        return advantages
    mean = flat.mean()
    std = flat.std(unbiased=False)
    if flat.numel() < 2 or float(std) == 0.0:
        return [[0.0] * len(a) for a in advantages]
    scale = 1.0 / (float(std) + eps)
    return [
        [(a - float(mean)) * scale if k else 0.0 for a, k in zip(adv, m, strict=True)]
        for adv, m in zip(advantages, masks, strict=True)
    ]


def value_loss(
    values: Tensor, old_values: Tensor, returns: Tensor, mask: Tensor, clip: float
) -> tuple[Tensor, dict[str, float]]:
    """The clipped value loss, a mean over the masked tokens (all (S, R)):
    ``0.5 * max((V - R)^2, (V_old + clamp(V - V_old, -clip, clip) - R)^2)``; ``clip`` 0: the
    unclipped ``0.5 * (V - R)^2``. Metrics: ``vf_clipfrac``, the share of tokens where the
    clipped error is the larger one."""
    n = mask.sum().clamp(min=1.0)
    unclipped = (values - returns) ** 2
    if clip > 0:
        clipped = (old_values + (values - old_values).clamp(-clip, clip) - returns) ** 2
        per_token = 0.5 * torch.maximum(unclipped, clipped)
        clipfrac = float(((clipped > unclipped).float() * mask).sum() / n)
    else:
        per_token = 0.5 * unclipped
        clipfrac = 0.0
    return (per_token * mask).sum() / n, {"vf_clipfrac": clipfrac}


def explained_variance(values: Tensor, returns: Tensor) -> float:
    """1 - Var(returns - values) / Var(returns) over (N,) tokens; NaN when the returns are
    constant."""
    var = returns.var(unbiased=False)
    if float(var) == 0.0:
        return math.nan
    return float(1 - (returns - values).var(unbiased=False) / var)


# ---------------------------------------------------------------- the model


class ValueModel(nn.Module):
    """An HF causal LM's body (its own, or the actor's when shared) and a scalar head
    (zero-initialised: values start at 0)."""

    def __init__(self, lm: nn.Module, device: torch.device):
        super().__init__()
        self.body = lm.get_decoder()
        self.head = nn.Linear(lm.config.hidden_size, 1, device=device)
        nn.init.zeros_(self.head.weight)
        nn.init.zeros_(self.head.bias)

    def forward(self, mb: MicroBatch, device: torch.device, body_grad: bool = True) -> Tensor:
        """Values (S, R) of ``mb``'s response tokens (0 past each response); ``body_grad``
        False: the gradient stops at the body's output (only the head learns)."""
        with torch.set_grad_enabled(body_grad and torch.is_grad_enabled()):
            out = self.body(
                input_ids=mb.input_ids.to(device),
                attention_mask=None if mb.attention_mask is None else mb.attention_mask.to(device),
                position_ids=mb.position_ids.to(device),
                use_cache=False,
            )
        flat = self.head(out.last_hidden_state[mb.keep.to(device)]).squeeze(-1)  # (N,)
        index = (mb.seq.to(device), mb.pos.to(device))
        return flat.new_zeros(tuple(mb.loss_mask.shape)).index_put(index, flat)


@dataclass
class CriticStep:
    """One training step's critic inputs: the samples it trains on, their values before the
    step (the old values of the clip) and their GAE returns, per response token."""

    samples: list[Sample]
    old: list[list[float]]
    returns: list[list[float]]

    def flat(self, rows: list[list[float]]) -> Tensor:
        """The own-token entries of per-sample ``rows``, concatenated: (N,) float64."""
        pairs = zip(rows, (s.loss_mask for s in self.samples), strict=True)
        own = [v for row, m in pairs for v, k in zip(row, m, strict=True) if k]
        return torch.tensor(own, dtype=torch.float64)


class Critic:
    """A trained model's critic: values, GAE and the clipped value-loss update."""

    def __init__(
        self,
        cfg: CriticConfig,
        advantage: AdvantageConfig,
        model_path: str,
        device: torch.device,
        trainer: Any,
        actor: nn.Module | None = None,
    ):
        """``advantage``: gamma, lam, eps and std_normalize of the GAE; ``trainer``: the
        policy trainer's settings (its micro-batch token budget and packing apply here too, and
        the run's one critic takes its epochs from them); ``actor``: the trained model, whose
        body a ``shared`` critic's head reads."""
        self.cfg = cfg.validate()
        self.settings = trainer
        self.adv = advantage.validate()
        self.device = device
        self.max_tokens, self.pack = trainer.max_tokens_per_microbatch, trainer.pack_sequences
        path = cfg.model or model_path
        if (
            cfg.model
            and load_tokenizer(cfg.model).get_vocab() != load_tokenizer(model_path).get_vocab()
        ):
            raise ValueError(
                f"critic.model {cfg.model!r} has another tokenizer than the trained model "
                f"{model_path!r}; the critic reads the trained model's token ids"
            )
        if cfg.shared:
            if actor is None:
                raise ValueError("critic.shared needs the actor (the trained model) to sit on")
            self.model = ValueModel(actor, device)
            own = list(self.model.head.parameters())  # the body is the actor's to step
        else:
            self.model = ValueModel(
                load_causal_lm(path, dtype="float32", device=str(device)), device
            )
            own = list(self.model.parameters())
        self.tokenizer = load_tokenizer(path) if cfg.centralized else None
        self.params = own
        self.optimizer = torch.optim.AdamW(own, lr=cfg.lr)
        self.steps = 0  # training steps (batches) the critic has trained on

    @property
    def shared(self) -> bool:
        """Whether the value head sits on the actor (its loss then joins the policy's)."""
        return self.cfg.shared

    @property
    def policy_waits(self) -> bool:
        """Whether this step trains the critic alone (num_critic_only_steps)."""
        return self.steps < self.cfg.num_critic_only_steps

    def _view(self, s: Sample) -> Sample:
        """What the critic reads of ``s``: its dialogue, after the global state when
        centralized (the response tokens, hence the values' positions, are unchanged)."""
        if self.tokenizer is None:
            return s
        state = s.metadata.get("global_state")
        if not isinstance(state, str):
            raise ValueError(
                f"sample {s.key}: critic.centralized needs metadata['global_state'] (text the "
                f"recipe's generate sets), got {type(state).__name__}"
            )
        ids = self.tokenizer(state + "\n\n", add_special_tokens=False)["input_ids"]
        return replace(s, prompt_ids=list(ids) + list(s.prompt_ids))

    def _microbatches(self, samples: list[Sample]) -> list[MicroBatch]:
        samples = [self._view(s) for s in samples]
        lengths = [len(s.prompt_ids) + s.response_length for s in samples]
        groups = plan_microbatches(lengths, self.max_tokens, self.pack)
        return [collate([samples[i] for i in g], g, self.pack) for g in groups]

    @torch.no_grad()
    def values(self, samples: list[Sample]) -> list[list[float]]:
        """Each sample's value of every response token under the current critic."""
        out: list[list[float]] = [[] for _ in samples]
        if not self.shared:  # a shared body stays in the mode its actor trains in
            self.model.eval()
        for mb in self._microbatches(samples):
            v = self.model(mb, self.device)
            for row, j in enumerate(mb.indices):
                out[j] = v[row, : samples[j].response_length].float().cpu().tolist()
        return out

    def advantages(self, samples: list[Sample]) -> tuple[CriticStep, dict[str, float]]:
        """Values, GAE and (whitened) per-token advantages of the samples that have a reward,
        a trainable status and an own token (``sample.advantage`` a list; None for the
        others). Returns what ``train`` needs, and the raw GAE mean."""
        for s in samples:
            s.advantage = None
        batch = [
            s for s in samples if s.reward is not None and s.status.trainable and any(s.loss_mask)
        ]
        step = CriticStep(batch, self.values(batch), [])
        advs = []
        for s, v in zip(batch, step.old, strict=True):
            a, r = gae_tokens(s.loss_mask, v, s.reward, self.adv.gamma, self.adv.lam)
            advs.append(a)
            step.returns.append(r)
        raw = step.flat(advs)
        if self.adv.std_normalize:
            advs = whiten(advs, [s.loss_mask for s in batch], self.adv.eps)
        for s, a in zip(batch, advs, strict=True):
            s.advantage = a
        return step, ({"critic/gae_mean": float(raw.mean())} if raw.numel() else {})

    def accumulate(
        self, step: CriticStep, part: list[int], scale: float = 1.0, body_grad: bool = True
    ) -> dict[str, float]:
        """Back-propagate ``scale`` x the clipped value loss of ``step.samples[part]`` (a mean
        over their own tokens) into the critic's gradients, without an optimizer step; a
        shared critic's reach the actor's body too unless ``body_grad`` is False. Returns the
        part's value_loss and vf_clipfrac (unscaled)."""
        if not self.shared:  # a shared body stays in the mode its actor trains in
            self.model.train()
        samples = [step.samples[i] for i in part]
        sums = {"value_loss": 0.0, "vf_clipfrac": 0.0}
        n_tok = float(sum(sum(s.loss_mask) for s in samples))
        for mb in self._microbatches(samples) if n_tok else []:
            idx = [part[j] for j in mb.indices]
            width = mb.max_response
            old = to_rows([step.old[i] for i in idx], width).to(self.device)
            ret = to_rows([step.returns[i] for i in idx], width).to(self.device)
            mask = mb.loss_mask.to(self.device)
            values = self.model(mb, self.device, body_grad)
            loss, m = value_loss(values, old, ret, mask, self.cfg.value_clip)
            share = float(mask.sum()) / n_tok
            (loss * (share * scale)).backward()
            sums["value_loss"] += float(loss.detach()) * share
            sums["vf_clipfrac"] += m["vf_clipfrac"] * share
        return sums

    def optimizer_step(self) -> float:
        """Clip (``grad_clip``) and step the critic's own parameters (a shared critic's: the
        head), zero their gradients; returns the gradient norm (a non-finite one skips the
        step, as the policy's does)."""
        max_norm = self.cfg.grad_clip if self.cfg.grad_clip > 0 else math.inf
        norm = float(torch.nn.utils.clip_grad_norm_(self.params, max_norm))
        if math.isfinite(norm):
            self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return norm

    def train(self, step: CriticStep, minibatches: list[list[int]]) -> dict[str, float]:
        """The critic alone: one update of the clipped value loss per mini-batch (indices into
        ``step.samples``); a shared critic trains its head only (the policy's warm-up)."""
        updates = []
        for part in minibatches:
            if part:
                m = self.accumulate(step, part, body_grad=not self.shared)
                updates.append(m | {"grad_norm": self.optimizer_step()})
        return self.summary(step, updates)

    def summary(self, step: CriticStep, updates: list[dict[str, float]]) -> dict[str, float]:
        """Close a training step: its updates' metrics averaged, and the explained variance,
        mean value and mean return of the step's old values."""
        self.steps += 1
        keys = ("value_loss", "vf_clipfrac", "grad_norm")
        n = max(len(updates), 1)
        out = {f"critic/{k}": sum(u[k] for u in updates) / n for k in keys if updates}
        old, ret = step.flat(step.old), step.flat(step.returns)
        if old.numel():
            out["critic/explained_var"] = explained_variance(old, ret)
            out["critic/value_mean"] = float(old.mean())
            out["critic/return_mean"] = float(ret.mean())
        return out | {"critic/n_updates": float(len(updates))}

    # ---------------------------------------------------------------- checkpoints

    def save(self, out_dir: Path) -> None:
        # a shared critic's body is the actor, saved with it: only the head here
        model = self.model.head if self.shared else self.model
        state = {"optimizer": self.optimizer.state_dict(), "steps": self.steps}
        key = "head" if self.shared else "model"
        torch.save(state | {key: model.state_dict()}, Path(out_dir) / "critic.pt")

    def load(self, ckpt_dir: Path) -> None:
        path = Path(ckpt_dir) / "critic.pt"
        if not path.exists():
            raise FileNotFoundError(
                f"{path}: the checkpoint has no critic (it was saved by a run without "
                "advantage.estimator gae)"
            )
        state = torch.load(path, map_location=self.device, weights_only=True)
        key = "head" if self.shared else "model"
        if key not in state:
            raise ValueError(
                f"{path}: the checkpoint's critic is {'shared' if 'head' in state else 'separate'}"
                f" and this run's critic.shared is {self.shared}: resume with the same setting"
            )
        (self.model.head if self.shared else self.model).load_state_dict(state[key])
        self.optimizer.load_state_dict(state["optimizer"])
        self.steps = int(state["steps"])
