"""A finished run read back from its files: the metrics rows, the config, the held-out
evaluation files (``eval/step_N.jsonl``, plain or gzipped as a published copy keeps them) and
the held-out items they score, one seed folder (``seed<S>``) at a time.

What reads a run's replies -- a recipe's ``read_replies``, ``scripts/bench_learning.py``'s
report -- reads it through ``SeedRun`` and ``read_seeds``, so a recipe that does needs nothing
outside the installed package. The held-out items are the ones the evaluation read
(``eval_data``, shared with ``kernel.run.evaluation``). Only the files: scoring the replies
again, controls and statistics belong to whoever reads them.
"""

from __future__ import annotations

import argparse
import gzip
import json
import sys
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np

from kernel.buffer import DataBuffer, DataConfig
from kernel.hooks import package_file


def eval_data(cfg: Any) -> DataConfig:
    """The held-out prompts' data settings: the run's (``cfg.data``), on ``cfg.eval.path``, in
    order, ``cfg.eval.n_samples`` episodes each, up to ``cfg.eval.max_prompts``. ``cfg``: a
    ``TrainConfig``, or anything with its ``data`` and ``eval`` (a finished run's config.json)."""
    return replace(
        cfg.data,
        path=package_file(cfg.eval.path),
        n_samples_per_prompt=cfg.eval.n_samples,
        shuffle=False,
        max_prompts=cfg.eval.max_prompts,
    )


def read_jsonl(path: Path) -> list[dict]:
    """The JSON lines of ``path`` (gzipped when it ends in ``.gz``), blank lines skipped."""
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as f:
        return [json.loads(line) for line in f if line.strip()]


def plain_or_gzipped(path: Path) -> Path:
    """``path``, or its gzipped copy (``path.gz``, as a published run keeps it)."""
    return path if path.exists() else path.with_name(path.name + ".gz")


def seed_dirs(out: Path) -> list[Path]:
    """The seed folders of a run (``seed<S>`` holding a metrics file, by seed), published or
    not."""
    found = {p.parent for p in out.glob("seed*/metrics.jsonl*")}
    return sorted(found, key=lambda p: int(p.name[4:]))


def last_eval(out: Path, rows: list[dict]) -> tuple[int, Path | None]:
    """(steps done, the held-out evaluation file after the last) of the kernel run in ``out``
    whose metrics rows are ``rows``; the file is None until the run has trained and evaluated."""
    steps = sum(1 for r in rows if r["step"] >= 0)
    for name in (f"step_{steps}.jsonl", f"step_{steps}.jsonl.gz"):
        if steps and (out / "eval" / name).exists():
            return steps, out / "eval" / name
    return steps, None


def final_eval(out: Path, rows: list[dict]) -> tuple[int, Path]:
    """(steps done, the last held-out evaluation's file) of the finished kernel run in ``out``
    whose metrics rows are ``rows``; exits naming the file if the run did not finish."""
    steps, last = last_eval(out, rows)
    if last is None:
        missing = out / "eval" / f"step_{steps}.jsonl"
        sys.exit(f"{missing} is missing: the run in {out} did not finish")
    return steps, last


def first_eval(out: Path) -> Path:
    """The evaluation of the starting weights (``eval/step_0.jsonl``, plain or gzipped)."""
    plain = out / "eval" / "step_0.jsonl"
    return plain if plain.exists() else plain.with_suffix(".jsonl.gz")


@dataclass
class SeedRun:
    """One finished seed: its folder, metrics rows, config, steps and evaluation files."""

    path: Path
    rows: list[dict]
    config: dict
    steps: int
    first: Path
    last: Path

    @classmethod
    def read(cls, path: Path) -> SeedRun:
        """The finished seed in ``path``; exits naming the missing file if it did not finish."""
        rows = read_jsonl(plain_or_gzipped(path / "metrics.jsonl"))
        return cls.of(path, rows, *final_eval(path, rows))

    @classmethod
    def of(cls, path: Path, rows: list[dict], steps: int, last: Path) -> SeedRun:
        """The seed in ``path`` whose metrics rows, steps done and last evaluation are read."""
        config = json.loads((path / "config.json").read_text())
        return cls(path, rows, config, steps, first_eval(path), last)

    @property
    def stamp(self) -> list[str]:
        """commit.txt's lines: the commit the seed started at, then one "resumed at step N:
        <commit>" line per resume ([] for a seed without one)."""
        path = self.path / "commit.txt"
        return path.read_text().splitlines() if path.exists() else []

    @property
    def commits(self) -> list[str]:
        """Every commit the seed trained at: where it started, then where it resumed ([]
        without a commit.txt)."""
        return self.stamp[:1] + [line.rsplit(": ", 1)[1] for line in self.resumed]

    @property
    def resumed(self) -> list[str]:
        """Where an interrupted seed went on, and at which commit ("resumed at step N: sha")."""
        return self.stamp[1:]

    @property
    def seed(self) -> int:
        return int(self.config.get("seed", 0))

    @property
    def votes(self) -> dict[int, Path]:
        """k -> the evaluation of the last checkpoint with k sampled episodes per item
        (``eval/vote_k<K>.jsonl``, written by bench_learning's ``--vote K``)."""
        found = {}
        for p in sorted((self.path / "eval").glob("vote_k*.jsonl*")):
            found[int(p.name.split(".")[0].removeprefix("vote_k"))] = p
        return found

    @property
    def evaluations(self) -> list[Path]:
        """The first and the last held-out evaluation files (one, if they are the same)."""
        return list(dict.fromkeys([self.first, self.last]))

    def held_out(self) -> list:
        """The held-out items, one Sample per row, read as the run's evaluation read them
        (``eval_data``: eval.path in order, up to eval.max_prompts)."""
        data, held = DataConfig(**self.config["data"]), SimpleNamespace(**self.config["eval"])
        buffer = DataBuffer(eval_data(SimpleNamespace(data=data, eval=held)))
        return [group[0] for group in buffer.next_groups(len(buffer))]

    @property
    def train_rows(self) -> list[dict]:
        return [r for r in self.rows if r["step"] >= 0]

    def phases(self) -> dict[str, float]:
        """Wall seconds per phase, summed over the run's metrics rows."""

        def total(key: str) -> float:
            return float(sum(r.get(key, 0.0) for r in self.rows))

        reward = total("rollout/reward_seconds")
        return {
            "startup": total("time/startup_s"),
            "generate": total("time/rollout_s") - reward,
            "reward": reward,
            "train": total("time/train_s"),
            "sync": total("time/sync_s"),
            "eval": total("time/eval_s"),
        }

    def minutes(self) -> float:
        return sum(self.phases().values()) / 60

    def samples(self) -> int:
        return int(sum(v for r in self.rows for k, v in r.items() if k.endswith("/samples")))

    def tokens_per_step(self) -> float:
        """Generated (sampled) tokens per training step, every agent's together."""
        totals = [
            sum(
                r[k] * r.get(k.replace("/response_length", "/samples"), 0.0)
                for k in r
                if k.endswith("/response_length")
            )
            for r in self.train_rows
        ]
        return float(np.mean(totals)) if totals else 0.0


def read_seeds(out: Path, who: str) -> list[SeedRun]:
    """Every finished seed of the run in ``out`` (a seed still training, or cut short before
    its last evaluation, is named on stderr and left out); exits naming ``out`` if it holds
    none. ``who``: the program, as the messages name it."""
    runs = []
    for d in seed_dirs(out):
        rows = read_jsonl(plain_or_gzipped(d / "metrics.jsonl"))
        steps, last = last_eval(d, rows)
        if last is None:
            print(f"{who}: {d} has not finished (no last evaluation): left out", file=sys.stderr)
        else:
            runs.append(SeedRun.of(d, rows, steps, last))
    if not runs:
        raise SystemExit(f"{who}: no finished seed<S> under {out}")
    return runs


def each_seed(runs: list[Path], width: int) -> Iterator[tuple[SeedRun, list[tuple[str, Path]]]]:
    """A read_replies table's rows: every finished seed of every run folder in ``runs``, with
    its first and last held-out evaluation, each labelled "run seed eval" (the run's name
    padded to ``width``)."""
    for run in runs:
        for seed in read_seeds(run, "read_replies"):
            where = f"{run.name:<{width}} {seed.path.name:<6}"
            yield seed, [(f"{where} {p.name.split('.')[0]:<9}", p) for p in seed.evaluations]


def replies_parser(doc: str) -> argparse.ArgumentParser:
    """The command line of a recipe's ``read_replies`` (``doc``: its module docstring): the
    run folders to read."""
    parser = argparse.ArgumentParser(
        description=doc.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("runs", nargs="+", type=Path, help="bench_learning run folders")
    return parser
