"""``python -m kernel collect``: a recipe's rollouts with fixed models, written as JSONL data.

The recipe's workflow runs over a data set exactly as in training (same hooks, engines, chat
templates and rewards), with every model frozen -- the config's models, or the ones a run's
checkpoint saved (``--checkpoint RUN/checkpoints/step_N``) -- and what it makes is kept:

- ``<output_dir>/trajectories.jsonl``, one line per kept sample: ``row`` (its line in the data
  file), ``agent``, ``turn``, ``index`` (the episode within the row's group), ``status``,
  ``reward`` (as the recipe scored it), ``prompt``, ``label``, the exact ``prompt_ids``,
  ``response_ids``, ``loss_mask`` and ``rollout_logprobs``, ``weight_versions``, ``text`` (the
  response decoded, tool messages included) and ``metadata``;
- with ``collect.keep=pairs``, ``<output_dir>/pairs.jsonl`` instead: per row, agent and turn,
  the best sample as ``chosen`` and the worst as ``rejected`` (each a trajectory line as
  above), when their rewards differ by at least ``collect.min_margin``;
- with ``collect.keep=transitions``, ``<output_dir>/transitions.jsonl``: world-model data for
  ``kernel sft``, one ``messages`` row per step an environment took (``row``, ``agent``,
  ``env``; the user message shows the observation and the action, ``WORLD_MODEL_PROMPT``, the
  assistant message is the next observation; steps that ended the episode, which show nothing
  next, are left out), from the samples' ``metadata["transitions"]``;
- ``<output_dir>/collect.json``: this invocation's summary (rows, samples, kept, episodes, the
  seconds spent rolling out, and the prompt tokens the engines prefilled and served from their
  prefix caches).

Filters: ``collect.min_reward`` keeps samples scored at least that (rejection sampling);
``collect.keep=best`` keeps one sample per row, agent and turn, the best (best-of-n);
``collect.agents`` keeps only those agents' samples. Samples that failed (no reward) are never
kept.

Resumable, and a crash loses no finished row: the rows are rolled out ``collect.chunk`` groups
at a time; each row's lines are appended and flushed, then the row is recorded as done in
``<output_dir>/done.jsonl``. Run the same command again and the done rows are skipped (with
every row done, no engine starts and no model loads); lines of a row that was being written
when the process died (no done record) are dropped first, so no row is written twice.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from rich.progress import Progress

from kernel.buffer import DataBuffer
from kernel.hooks import package_file
from kernel.run.config import RunPlan, TrainConfig
from kernel.run.loop import frozen
from kernel.run.runtime import Runtime
from kernel.sample import Sample

KEEP = ("all", "best", "pairs", "transitions")
ENGINE_STATS = ("num_prefill_tokens", "num_cached_tokens")  # summed over the run's engines
WORLD_MODEL_PROMPT = (
    "You are the environment. It showed:\n{observation}\n\nThe agent did:\n{action}\n\n"
    "What does the environment show next?"
)


@dataclass
class CollectConfig:
    """What ``kernel collect`` rolls out and which samples it keeps."""

    path: str = ""
    """Data set to roll out (default: data.path), in the format training reads."""
    n_samples: int | None = None
    """Episodes per row (default: data.n_samples_per_prompt)."""
    max_prompts: int | None = None
    """Roll out at most this many rows (default: all)."""
    keep: str = "all"
    """all: every sample that passes the filters; best: per row, agent and turn, the best one
    (best-of-n); pairs: per row, agent and turn, best and worst as a preference pair;
    transitions: world-model data, one chat row per (observation, action) -> next observation
    of the kept samples' ``metadata["transitions"]`` (recipes/gym records them)."""
    min_reward: float | None = None
    """Keep only samples with a reward at least this (rejection sampling); for pairs, the
    chosen sample's."""
    min_margin: float = 1e-6
    """pairs: the least reward gap between chosen and rejected (equal rewards make no pair)."""
    agents: list[str] = field(default_factory=list)
    """Keep only these agents' samples (default: every agent's)."""
    chunk: int = 8
    """Rows rolled out between two writes (a crash loses at most the chunk in flight)."""
    retries: int = 3
    """Times a row whose rollout was aborted (engine restart) is tried again before the
    collection stops with an error naming it."""

    def validate(self) -> CollectConfig:
        if self.keep not in KEEP:
            raise ValueError(f"collect.keep must be one of {KEEP}, got {self.keep!r}")
        if self.n_samples is not None and self.n_samples < 1:
            raise ValueError(f"collect.n_samples must be >= 1, got {self.n_samples}")
        if self.keep == "pairs" and self.n_samples == 1:
            raise ValueError("collect.keep=pairs needs collect.n_samples >= 2 (a pair per group)")
        if self.max_prompts is not None and self.max_prompts < 1:
            raise ValueError(f"collect.max_prompts must be >= 1, got {self.max_prompts}")
        if self.chunk < 1 or self.retries < 0:
            raise ValueError("collect.chunk must be >= 1 and collect.retries >= 0")
        if not self.min_margin >= 0:
            raise ValueError(f"collect.min_margin must be >= 0, got {self.min_margin}")
        return self


def trajectory(sample: Sample, text: str) -> dict[str, Any]:
    """One sample as a JSON-ready trajectory line."""
    meta = {k: v for k, v in sample.metadata.items() if k != "row"}
    return {
        "row": sample.metadata["row"],
        "agent": sample.agent,
        "turn": sample.turn,
        "index": sample.index,
        "status": sample.status.value,
        "reward": sample.raw_reward,
        "prompt": sample.prompt,
        "label": sample.label,
        "prompt_ids": sample.prompt_ids,
        "response_ids": sample.response_ids,
        "loss_mask": sample.loss_mask,
        "rollout_logprobs": sample.rollout_logprobs,
        "weight_versions": sample.weight_versions,
        "text": text,
        "metadata": meta,
    }


def transitions(sample: Sample) -> list[dict[str, Any]]:
    """A sample's ``metadata["transitions"]`` as world-model chat rows (``kernel sft`` data)."""
    rows = []
    for t in sample.metadata.get("transitions") or []:
        if not t["next_observation"]:  # the episode ended: nothing to predict
            continue
        ask = WORLD_MODEL_PROMPT.format(observation=t["observation"], action=t["action"])
        rows.append(
            {
                "row": sample.metadata["row"],
                "agent": sample.agent,
                "env": sample.metadata.get("env"),
                "messages": [
                    {"role": "user", "content": ask},
                    {"role": "assistant", "content": t["next_observation"]},
                ],
            }
        )
    return rows


def select(samples: Iterable[Sample], cfg: CollectConfig) -> list[Sample] | list[tuple]:
    """The samples of one row that ``cfg`` keeps, in order; for ``keep=pairs``, (chosen,
    rejected) tuples."""
    scored = [
        s for s in samples if s.raw_reward is not None and (not cfg.agents or s.agent in cfg.agents)
    ]
    if cfg.keep in ("all", "transitions"):
        return [s for s in scored if cfg.min_reward is None or s.raw_reward >= cfg.min_reward]
    groups: dict[tuple[str, int], list[Sample]] = {}
    for s in scored:
        groups.setdefault((s.agent, s.turn), []).append(s)
    kept: list = []
    for members in groups.values():
        ranked = sorted(members, key=lambda s: -s.raw_reward)  # stable: the first best wins
        best, worst = ranked[0], ranked[-1]
        if cfg.min_reward is not None and best.raw_reward < cfg.min_reward:
            continue
        if cfg.keep == "best":
            kept.append(best)
        elif best.raw_reward - worst.raw_reward >= max(cfg.min_margin, 1e-12):
            kept.append((best, worst))
    return kept


class Output:
    """The output files, with the done rows read back (and a half-written row dropped)."""

    def __init__(self, out: Path, keep: str) -> None:
        out.mkdir(parents=True, exist_ok=True)
        names = {"pairs": "pairs.jsonl", "transitions": "transitions.jsonl"}
        self.data = out / names.get(keep, "trajectories.jsonl")
        self.done_path = out / "done.jsonl"
        self.done: set[int] = {r["row"] for r in _lines(self.done_path)}
        if self.data.exists():  # keep only finished rows' lines (a crash mid-row, a torn line)
            rows = [r for r in _lines(self.data) if _row_of(r) in self.done]
            tmp = self.data.with_suffix(".tmp")
            tmp.write_text("".join(json.dumps(r) + "\n" for r in rows))
            os.replace(tmp, self.data)

    def write(self, row: int, lines: list[dict]) -> None:
        """Append a row's lines, then record the row done (each flushed to disk)."""
        with self.data.open("a") as f:
            f.writelines(json.dumps(line, default=str) + "\n" for line in lines)
            f.flush()
            os.fsync(f.fileno())
        with self.done_path.open("a") as f:
            f.write(json.dumps({"row": row, "kept": len(lines)}) + "\n")
            f.flush()
            os.fsync(f.fileno())
        self.done.add(row)


def _row_of(line: dict) -> int | None:
    return line["chosen"]["row"] if "chosen" in line else line.get("row")


def _lines(path: Path) -> list[dict]:
    """A JSONL file's records; a torn last line (a crash mid-write) is skipped."""
    if not path.exists():
        return []
    records = []
    lines = path.read_text().splitlines()
    for i, line in enumerate(lines):
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            if i < len(lines) - 1:
                raise ValueError(f"{path}: line {i + 1} is not JSON") from None
    return records


def collect(cfg: TrainConfig, ccfg: CollectConfig, checkpoint: str | None = None) -> dict:
    """Roll out ``ccfg``'s data with ``cfg``'s models (or ``checkpoint``'s), frozen; write the
    kept samples; return a summary (rows, samples, kept, files)."""
    ccfg.validate()
    cfg = frozen(cfg, checkpoint)  # resolved below, once, with its data
    data = replace(
        cfg.data,
        path=ccfg.path or cfg.data.path,
        n_samples_per_prompt=ccfg.n_samples or cfg.data.n_samples_per_prompt,
        shuffle=False,
        max_prompts=ccfg.max_prompts,
    )
    if ccfg.keep == "pairs" and data.n_samples_per_prompt < 2:
        raise ValueError("collect.keep=pairs needs 2 or more episodes per row (collect.n_samples)")
    plan = replace(cfg, data=data).plan()
    out = Output(Path(cfg.output_dir), ccfg.keep)
    return asyncio.run(_collect(plan, ccfg, out))


async def _collect(plan: RunPlan, ccfg: CollectConfig, out: Output) -> dict:
    cfg = plan.cfg
    buffer = DataBuffer(replace(cfg.data, path=package_file(cfg.data.path)))
    todo = [g for g in buffer.next_groups(len(buffer)) if g[0].metadata["row"] not in out.done]
    tries: dict[int, int] = {}
    summary = {"rows": len(out.done), "samples": 0, "kept": 0, "episodes": 0, "rollout_s": 0.0}
    if not todo:  # a rerun with every row done: no engine to start, no model to load
        return _finish(cfg, out, summary | {"engines": dict.fromkeys(ENGINE_STATS, 0)})
    async with Runtime.open(plan, {}) as rt:
        tokenizers = {name: handle.tokenizer for name, handle in rt.ctx.agents.items()}

        def line(s: Sample) -> dict:
            return trajectory(s, tokenizers[s.agent].decode(s.response_ids))

        with Progress() as progress:
            task = progress.add_task("collect (rows)", total=len(todo))
            while todo:
                chunk, todo = todo[: ccfg.chunk], todo[ccfg.chunk :]
                t0 = time.perf_counter()
                kept, aborted, _ = await rt.manager.run(rt.ctx, chunk)
                summary["rollout_s"] += time.perf_counter() - t0
                for r in kept:
                    summary["episodes"] += len(r.group)
                    chosen = select(r.samples, ccfg)
                    if ccfg.keep == "pairs":
                        lines = [{"chosen": line(a), "rejected": line(b)} for a, b in chosen]
                    elif ccfg.keep == "transitions":
                        lines = [t for s in chosen for t in transitions(s)]
                    else:
                        lines = [line(s) for s in chosen]
                    out.write(r.group[0].metadata["row"], lines)
                    summary["rows"] += 1
                    summary["samples"] += len(r.samples)
                    summary["kept"] += len(lines)
                    progress.advance(task)
                for r in aborted:  # an engine restart aborted it: roll the row out again
                    row = r.group[0].metadata["row"]
                    tries[row] = tries.get(row, 0) + 1
                    if tries[row] > ccfg.retries:
                        raise RuntimeError(
                            f"row {row} of {cfg.data.path} was aborted {tries[row]} times; the "
                            f"rows before it are written to {out.data}: run again to continue"
                        )
                    buffer.requeue(r.group)
                    todo += buffer.next_groups(1)
        summary["engines"] = await _engine_stats(rt)
    return _finish(cfg, out, summary)


def _finish(cfg: TrainConfig, out: Output, summary: dict) -> dict:
    """The invocation's summary with its files, also written to ``collect.json``."""
    summary |= {"file": str(out.data), "done": str(out.done_path)}
    (Path(cfg.output_dir) / "collect.json").write_text(json.dumps(summary, indent=1) + "\n")
    return summary


async def _engine_stats(rt: Runtime) -> dict[str, float]:
    """Prompt tokens the engines prefilled and served from their prefix caches, summed over
    every engine of the run (embedded engines report them; others count 0)."""
    totals = dict.fromkeys(ENGINE_STATS, 0)
    for m in rt.models:
        for client in m.clients:
            state = (await client.server_info()).get("internal_states", [{}])[0]
            for k in ENGINE_STATS:
                totals[k] += state.get(k, 0)
    return totals
