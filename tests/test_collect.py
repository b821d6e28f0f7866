"""``python -m kernel collect``: a recipe's rollouts with frozen models, written as JSONL.

The filters (rejection sampling, best-of-n, preference pairs) on hand-made samples; the resume
rule (a row without its done record is dropped, a torn line too, nothing is written twice); and
the command end to end on the toy task's tiny model: every line's ids, masks and reward are a
real episode's, a second run resumes with nothing left to do, and pairs differ in reward."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from kernel.run.collect import CollectConfig, Output, select, trajectory
from kernel.sample import Sample, Status

ROOT = Path(__file__).resolve().parent.parent


def sample(agent: str, reward: float | None, turn: int = 0, index: int = 0) -> Sample:
    return Sample(
        prompt="p",
        prompt_ids=[1, 2],
        response_ids=[3, 4],
        loss_mask=[1, 1],
        agent=agent,
        turn=turn,
        index=index,
        status=Status.COMPLETED if reward is not None else Status.FAILED,
        raw_reward=reward,
        metadata={"row": 7},
    )


ROW = [
    sample("a", 0.2, index=0),
    sample("a", 0.9, index=1),
    sample("a", None, index=2),  # failed: never kept
    sample("a", 0.9, index=3),
    sample("b", 0.5, index=0),
    sample("b", 0.5, index=1),
    sample("b", 0.1, turn=1, index=0),
]


def test_select_all_with_min_reward_and_agents():
    assert select(ROW, CollectConfig()) == [s for s in ROW if s.raw_reward is not None]
    kept = select(ROW, CollectConfig(min_reward=0.5))
    assert [(s.agent, s.index, s.turn) for s in kept] == [
        ("a", 1, 0),
        ("a", 3, 0),
        ("b", 0, 0),
        ("b", 1, 0),
    ]
    assert all(s.agent == "b" for s in select(ROW, CollectConfig(agents=["b"])))


def test_select_best_of_n_per_agent_and_turn():
    best = select(ROW, CollectConfig(keep="best"))
    assert [(s.agent, s.turn, s.index, s.raw_reward) for s in best] == [
        ("a", 0, 1, 0.9),  # ties: the first best
        ("b", 0, 0, 0.5),
        ("b", 1, 0, 0.1),
    ]
    assert [s.agent for s in select(ROW, CollectConfig(keep="best", min_reward=0.3))] == ["a", "b"]


def test_select_pairs_need_a_reward_gap():
    pairs = select(ROW, CollectConfig(keep="pairs"))
    assert [(c.raw_reward, r.raw_reward, c.agent) for c, r in pairs] == [(0.9, 0.2, "a")]
    assert select(ROW, CollectConfig(keep="pairs", min_margin=0.8)) == []
    assert select(ROW, CollectConfig(keep="pairs", min_reward=0.95)) == []


def test_config_errors_name_the_flag():
    for bad, flag in [
        (CollectConfig(keep="some"), "collect.keep"),
        (CollectConfig(keep="pairs", n_samples=1), "collect.n_samples"),
        (CollectConfig(chunk=0), "collect.chunk"),
        (CollectConfig(min_margin=-1), "collect.min_margin"),
    ]:
        with pytest.raises(ValueError, match=flag):
            bad.validate()


def test_output_resume_drops_a_half_written_row_and_a_torn_line(tmp_path):
    out = Output(tmp_path, "all")
    line = trajectory(sample("a", 1.0), "x")  # row 7
    out.write(line["row"], [line])
    out.write(1, [])  # a row that kept nothing is done too
    with out.data.open("a") as f:  # row 2 was being written when the process died
        f.write(json.dumps({"row": 2, "agent": "a"}) + "\n")
        f.write('{"row": 2, "ag')
    again = Output(tmp_path, "all")
    assert again.done == {7, 1}
    assert [json.loads(x) for x in again.data.read_text().splitlines()] == [line]
    again.write(2, [{"row": 2}])
    assert len(again.data.read_text().splitlines()) == 2


def kernel(*args: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "kernel", *args]
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)


def read(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.mark.slow
def test_collect_end_to_end_resumes_and_pairs(tmp_path):
    out = tmp_path / "all"
    flags = ["collect", "--preset", "toy", "--collect.max_prompts=3", "--collect.n_samples=4"]
    r = kernel(*flags, f"--output_dir={out}")
    assert r.returncode == 0, r.stderr[-3000:]
    lines = read(out / "trajectories.jsonl")
    assert len(lines) == 12 and sorted({x["row"] for x in lines}) == [0, 1, 2]
    for x in lines:
        assert len(x["response_ids"]) == len(x["loss_mask"]) == len(x["rollout_logprobs"]) > 0
        assert x["prompt_ids"] and isinstance(x["reward"], float) and x["text"]
        assert x["status"] in ("completed", "truncated") and x["weight_versions"]
    assert [x["row"] for x in read(out / "done.jsonl")] == [0, 1, 2]
    summary = json.loads((out / "collect.json").read_text())  # what a benchmark reads
    assert summary["episodes"] == 12 and summary["rows"] == 3 and summary["rollout_s"] > 0
    engines = summary["engines"]
    assert engines["num_prefill_tokens"] > 0 and engines["num_cached_tokens"] >= 0
    assert "12 episodes in" in r.stdout and "episodes/s" in r.stdout

    shutil.rmtree(out / "logs")  # the engines' logs: a rerun that starts an engine makes them
    again = kernel(*flags, f"--output_dir={out}")  # resumed: every row is done
    assert again.returncode == 0, again.stderr[-3000:]
    assert "0 samples rolled out this time" in again.stdout
    assert not (out / "logs").exists()  # nothing left to roll out: no engine, no model loaded
    assert read(out / "trajectories.jsonl") == lines

    more = kernel(
        *flags[:3], "--collect.max_prompts=4", "--collect.n_samples=4", f"--output_dir={out}"
    )
    assert more.returncode == 0, more.stderr[-3000:]
    assert sorted({x["row"] for x in read(out / "trajectories.jsonl")}) == [0, 1, 2, 3]

    pairs_out = tmp_path / "pairs"
    p = kernel(*flags, "--collect.keep=pairs", f"--output_dir={pairs_out}")
    assert p.returncode == 0, p.stderr[-3000:]
    pairs = read(pairs_out / "pairs.jsonl")
    assert all(x["chosen"]["reward"] > x["rejected"]["reward"] for x in pairs)
    assert all(x["chosen"]["row"] == x["rejected"]["row"] for x in pairs)
    assert not (pairs_out / "trajectories.jsonl").exists()


def test_collect_bad_flag_exits_2_naming_it(tmp_path):
    r = kernel("collect", "--preset", "toy", "--collect.keep=worst", f"--output_dir={tmp_path}")
    assert r.returncode == 2 and "collect.keep" in r.stderr
