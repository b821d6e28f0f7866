"""World-model SFT (MRLM): ``kernel collect --collect.keep transitions`` writes every step an
environment took as a chat row -- the observation and the agent's action in, the environment's
next observation out -- and ``kernel sft`` trains a model to predict it, held-out NLL falling."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

import pytest

from kernel.env.spec import env_specs
from kernel.hooks import RolloutContext
from kernel.run.collect import WORLD_MODEL_PROMPT, transitions
from kernel.sample import Sample
from recipes.gym.generate import generate

ROOT = Path(__file__).resolve().parents[1]


def test_an_episode_becomes_one_row_per_step_that_shows_something_next(
    scripted_agent, smollm2_tokenizer
):
    script = ["<calculator>12 * 34</calculator>", "hmm", "<answer>408</answer>"]
    agent = scripted_agent("default", smollm2_tokenizer, script)
    envs = env_specs({"tools": {"args": {"tools": ["calculator"]}}})
    ctx = RolloutContext(agents={"default": agent}, config={"env": "tools"}, envs=envs)
    seed = Sample(prompt="What is 12 * 34?", label="408", metadata={"row": 5})
    (sample,) = asyncio.run(generate(ctx, seed))
    rows = transitions(sample)
    assert len(rows) == 2  # the answer ended the episode: nothing next to predict
    first, second = rows
    assert first["row"] == 5 and first["env"] == "tools" and first["agent"] == "default"
    user, assistant = first["messages"]
    assert user["content"].startswith("You are the environment. It showed:\nWhat is 12 * 34?")
    assert "The agent did:\n<calculator>12 * 34</calculator>" in user["content"]
    assert assistant == {"role": "assistant", "content": "408"}
    assert second["messages"][0]["content"].split("It showed:\n")[1].startswith("408")
    assert second["messages"][1]["content"].startswith("Use one tag per turn")
    assert WORLD_MODEL_PROMPT.count("{") == 2


def kernel(*args: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "kernel", *args]
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)


@pytest.mark.slow
def test_collect_transitions_then_sft_lowers_held_out_next_observation_nll(tmp_path):
    col = tmp_path / "col"
    r = kernel(
        "collect", "--recipe", "gym", "--preset", "tiny_mix", f"--output_dir={col}",
        "--collect.keep=transitions", "--collect.max_prompts=12", "--collect.n_samples=2",
    )  # fmt: skip
    assert r.returncode == 0, r.stderr[-3000:]
    rows = [json.loads(x) for x in (col / "transitions.jsonl").read_text().splitlines()]
    # tools rows alternate with math rows; a math answer ends its episode, so rows are tools'
    assert rows and {r["env"] for r in rows} == {"tools"}
    train = [r for r in rows if r["row"] < 8]
    held = [r for r in rows if r["row"] >= 8]
    (tmp_path / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in train))
    (tmp_path / "test.jsonl").write_text("".join(json.dumps(r) + "\n" for r in held))
    out = tmp_path / "sft"
    r = kernel(
        "sft", "--recipe", "gym", "--preset", "tiny_mix", f"--output_dir={out}",
        f"--sft.path={tmp_path / 'train.jsonl'}", f"--sft.eval_path={tmp_path / 'test.jsonl'}",
        "--sft.epochs=3", "--sft.batch_size=4", "--optim.lr=3e-3",
    )  # fmt: skip
    assert r.returncode == 0, r.stderr[-3000:]
    logged = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    # measured: 10.78 -> 6.87 nats a token (a tiny 49k-vocab model, 3 epochs of 16 rows)
    assert logged[-1]["eval/nll"] < 0.75 * logged[0]["eval/nll"]
