"""The training loop with its trainer on Ray (``--ray.enabled true``): a trainer group of two
CPU actors (FSDP2 over gloo) learns the toy task through the full path; when one of its actors
dies the run stops naming the agent and rank, and a resumed run trains exactly the prompts an
uninterrupted run would have, none lost or repeated."""

from __future__ import annotations

import os
import signal
from dataclasses import replace
from pathlib import Path

import pytest

from kernel.buffer import DataBuffer
from kernel.cli import train_config
from kernel.hooks import package_file
from kernel.run.loop import train
from kernel.train.ray_trainer import TrainerDied
from tests.procs import descendants_named

ROOT = Path(__file__).resolve().parents[2]
TOY = ROOT / "kernel" / "presets" / "toy.yaml"
RAY = ["--ray.enabled=true", "--ray.ranks=2"]


@pytest.fixture(autouse=True)
def ray_auth_off(monkeypatch):
    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")


def toy(tmp_path, *flags):
    return train_config([f"--config={TOY}", f"--output_dir={tmp_path}", *RAY, *flags])


def mean_reward(rows):
    return sum(r["reward"] for r in rows) / len(rows)


@pytest.mark.slow
def test_a_ray_trainer_group_learns_the_toy_task(tmp_path):
    rows = train(toy(tmp_path, "--num_steps=40"))
    assert mean_reward(rows[:5]) <= 0.3
    assert mean_reward(rows[-5:]) >= 0.8
    assert max(r["train/logprob_diff"] for r in rows) < 1e-4  # engines serve the group's weights
    assert [r["weight_version"] for r in rows] == list(range(1, 41))


@pytest.mark.slow
def test_a_dead_trainer_rank_stops_the_run_by_name_and_resume_loses_no_prompt(tmp_path):
    killed = []

    def kill_a_rank(row):
        if row["step"] == 1:
            ranks = descendants_named("TrainerRankActor")
            assert len(ranks) == 2, ranks
            os.kill(ranks[-1], signal.SIGKILL)
            killed.append(ranks[-1])

    with pytest.raises(TrainerDied, match=r"agent 'default' lost rank [01]"):
        train(toy(tmp_path, "--num_steps=6", "--save_every=1"), on_step=kill_a_rank)
    assert killed
    assert [r["step"] for r in _rows(tmp_path)] == [0, 1]

    # the rank died right after step 1 was logged, so step 1's checkpoint never completed: the
    # run resumes from step 1 (after step 0), and the log keeps each step once
    resumed = train(toy(tmp_path, "--num_steps=6", "--save_every=1", "--resume=true"))
    assert [r["step"] for r in resumed] == [1, 2, 3, 4, 5]
    rows = _rows(tmp_path)
    assert [r["step"] for r in rows] == list(range(6))
    assert [r["weight_version"] for r in rows] == list(range(1, 7))
    cfg = toy(tmp_path)
    buffer = DataBuffer(replace(cfg.data, path=package_file(cfg.data.path)))
    expected = [sorted(g[0].metadata["row"] for g in buffer.next_groups()) for _ in range(6)]
    assert [r["data/rows"] for r in rows] == expected


def _rows(run_dir: Path) -> list[dict]:
    import json

    return [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
