"""The toy task every system of ``scripts/bench_vs_peers.py`` trains on, and the command line
and output every runner shares, each defined once.

Prompts come from a JSONL file (a ``prompt`` per row), sent as one user chat message rendered
with the model's own chat template. Rewards are plain functions of the sampled text: the share
of digits (the single-agent task, as Tandem's ``toy`` preset), and for two agents the share of
letters in the doctor's answer and of digits in the patient's (the ``toy_duo`` idea, with both
agents answering the prompt side by side, the joint action CoMLRL's MAGRPO trains on).

A runner writes JSON lines: ``{"event": "start", "system", "t0", "versions"}`` (``t0``: wall
time before its heavy imports), one ``{"event": "step", "step", "step_s", "rollout_s",
"reward_s", "train_s", "sync_s", "reward"[, "reward_<agent>"]}`` per optimizer step (the first
also carries ``first_rollout_t``, the wall time its first rollout began or, for Tandem, was
ready), and ``{"event": "end", "wall_s"}``.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
from pathlib import Path

AGENTS = ("doctor", "patient")  # the two-agent task's roles, in CoMLRL's agent order


def load_prompts(path: str | Path) -> list[str]:
    """The ``prompt`` of every row of a JSONL file, in order."""
    rows = [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]
    return [str(r["prompt"]) for r in rows]


def digit_share(text: str) -> float:
    """Share of the characters of ``text`` that are digits (0.0 for empty text)."""
    return sum(c.isdigit() for c in text) / len(text) if text else 0.0


def alpha_share(text: str) -> float:
    """Share of the characters of ``text`` that are letters (0.0 for empty text)."""
    return sum(c.isalpha() for c in text) / len(text) if text else 0.0


def team_reward(doctor_text: str, patient_text: str) -> float:
    """The two-agent joint reward: mean of the doctor's letter share and the patient's digit
    share."""
    return (alpha_share(doctor_text) + digit_share(patient_text)) / 2


def parse_args(system: str, doc: str, extra: bool = False) -> argparse.Namespace:
    """The command line every runner takes (``bench_vs_peers.py`` passes the same values to
    all of them); ``extra``: also ``--extra`` (more flags for Tandem's command)."""
    p = argparse.ArgumentParser(prog=f"run_{system}.py", description=doc.splitlines()[0])
    p.add_argument("--model", required=True, help="HF model folder (with its tokenizer)")
    p.add_argument("--prompts", required=True, help="JSONL file with a 'prompt' per row")
    p.add_argument("--steps", type=int, default=20, help="optimizer steps")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--group", type=int, default=8, help="samples per prompt")
    p.add_argument("--prompts-per-step", type=int, default=4)
    p.add_argument("--max-new-tokens", type=int, default=8)
    p.add_argument("--threads", type=int, default=2, help="torch threads")
    p.add_argument(
        "--agents", type=int, choices=(1, 2), default=1, help="1: the digit task; 2: the duo"
    )
    p.add_argument("--out", required=True, help="JSON lines written here")
    if extra:
        p.add_argument("--extra", default="", help="more flags for `kernel train` (one string)")
    return p.parse_args()


def peer_args(system: str, doc: str, agents: int) -> argparse.Namespace:
    """``parse_args`` for a peer's runner (its package is named ``system``) that trains
    ``agents`` agents: another count is refused, W&B stays off, and a peer that is not installed
    exits with status 2 and the command that installs it."""
    args = parse_args(system, doc)
    if args.agents != agents:
        sys.exit(f"run_{system}.py: the {system} comparison trains {agents} agent(s) (--agents)")
    os.environ.setdefault("WANDB_MODE", "disabled")
    if importlib.util.find_spec(system) is None:
        print(
            f"{system} is not installed: pip install -e '.[peers]' (from the repository root)",
            file=sys.stderr,
        )
        sys.exit(2)
    return args


class Emitter:
    """Appends one JSON object per line to the output file, flushed each time."""

    def __init__(self, path: str) -> None:
        self.path = Path(path)
        self.path.write_text("")

    def __call__(self, row: dict) -> None:
        with self.path.open("a") as f:
            f.write(json.dumps(row) + "\n")


class TrainTokens:
    """Counts the tokens of every forward pass ``model`` runs with gradients on (the training
    forwards; generation runs without): the attention mask's ones, else every position. A
    step's count is what its update ran, comparable with Tandem's ``tokens_run``."""

    def __init__(self, *models) -> None:
        self.count = 0
        for m in models:
            m.register_forward_pre_hook(self._hook, with_kwargs=True)

    def _hook(self, _module, args, kwargs) -> None:
        import torch

        if not torch.is_grad_enabled():
            return
        mask, ids = kwargs.get("attention_mask"), kwargs.get("input_ids", args[0] if args else None)
        if mask is not None:
            self.count += int(mask.sum())
        elif ids is not None:
            self.count += ids.numel()

    def take(self) -> int:
        """The count since the last take."""
        n, self.count = self.count, 0
        return n
