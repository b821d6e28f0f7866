"""Partial rollouts (``rollout.over_sample``): a step trains on the first prompt groups that
finish instead of waiting for a straggler, which either runs on into a later step (``carry``:
trained there, its staleness counted) or is cancelled and requeued (``abort``: what it had
generated counted as discarded); no prompt is lost or trained twice, across a resume too. The
straggler is tests/hook_fixtures/long_tail.py's group 0, on the toy preset's tiny model."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from kernel.cli import train_config
from kernel.run.loop import train
from tests.hook_fixtures import long_tail

ROOT = Path(__file__).resolve().parent.parent
TOY = ROOT / "kernel" / "presets" / "toy.yaml"
HOOK = "--generate_fn=tests.hook_fixtures.long_tail.generate"


@pytest.fixture(autouse=True)
def fresh_straggler():
    long_tail.straggled.clear()


def run(tmp_path, *flags):
    partial = ["--data.prompts_per_step=2", "--rollout.over_sample=1", "--max_staleness=8"]
    cfg = train_config([f"--config={TOY}", f"--output_dir={tmp_path}", HOOK, *partial, *flags])
    return train(cfg)


def first_rows(tmp_path, n):
    """The rows of the first n groups the run's data hands out, in order."""
    from dataclasses import replace

    from kernel.buffer import DataBuffer
    from kernel.hooks import package_file

    cfg = train_config([f"--config={TOY}", f"--output_dir={tmp_path}"])
    buffer = DataBuffer(replace(cfg.data, path=package_file(cfg.data.path)))
    return [g[0].metadata["row"] for g in buffer.next_groups(n)]


def test_carry_trains_the_first_groups_and_the_straggler_later_with_its_staleness(tmp_path):
    rows = run(tmp_path, "--num_steps=6")
    straggler = first_rows(tmp_path, 1)[0]
    assert [r["rollout/groups"] for r in rows] == [2.0] * 6
    trained = [row for r in rows for row in r["data/rows"]]
    assert not [row for row, n in Counter(trained).items() if n > 1], trained  # none twice
    where = [r["step"] for r in rows if straggler in r["data/rows"]]
    # it waited for step 3, so steps 0-2 trained on the groups that finished first
    assert where and where[0] >= long_tail.STRAGGLE_STEPS, where
    late = rows[where[0]]
    assert late["rollout/carried_groups"] >= 1
    assert late["rollout/carried_age"] >= long_tail.STRAGGLE_STEPS
    # its samples were made by the weights of step 0: as stale as the versions since
    assert late["default/staleness"] > 0
    assert all(r["rollout/in_flight_groups"] >= 1 for r in rows[: long_tail.STRAGGLE_STEPS])
    assert all(r["rollout/cancelled_groups"] == 0 for r in rows)
    # 13 groups handed out (2 a step and the one over): 12 trained, one still running
    assert len(trained) == 12 and set(trained) < set(first_rows(tmp_path, 13))


def test_abort_cancels_the_straggler_counts_its_tokens_and_trains_it_again_later(tmp_path):
    rows = run(tmp_path, "--num_steps=3", "--rollout.leftover=abort")
    straggler = first_rows(tmp_path, 1)[0]
    assert [r["rollout/groups"] for r in rows] == [2.0] * 3
    assert rows[0]["rollout/cancelled_groups"] == 1
    assert rows[0]["rollout/discarded_tokens"] > 0  # its 8 answers, generated before it waited
    assert straggler not in rows[0]["data/rows"]
    # requeued ahead of new prompts and rolled out again (quickly): trained in step 1
    assert straggler in rows[1]["data/rows"]
    trained = [row for r in rows for row in r["data/rows"]]
    assert len(set(trained)) == len(trained) == 6


@pytest.mark.slow
def test_a_carried_group_is_in_the_checkpoint_and_trained_after_the_resume(tmp_path):
    straggler = first_rows(tmp_path, 1)[0]
    first = run(tmp_path, "--num_steps=2", "--save_every=1")
    assert first[-1]["rollout/in_flight_groups"] >= 1  # the straggler, still waiting
    assert all(straggler not in r["data/rows"] for r in first)
    state = json.loads((tmp_path / "checkpoints" / "step_2" / "state.json").read_text())
    assert 0 in [q["group_id"] for q in state["buffer"]["requeued"]]
    resumed = run(tmp_path, "--num_steps=4", "--resume=true")
    assert [r["step"] for r in resumed] == [2, 3]
    trained = [row for r in first + resumed for row in r["data/rows"]]
    assert straggler in trained
    assert len(set(trained)) == len(trained) == 8


def test_partial_rollout_settings_are_checked(tmp_path):
    def refused(*flags):
        with pytest.raises((ValueError, SystemExit)) as e:
            train_config([f"--config={TOY}", f"--output_dir={tmp_path}", *flags]).plan()
        return str(e.value)

    assert "over_sample must be >= 0" in refused("--rollout.over_sample=-1")
    assert "choose one" in refused("--rollout.over_sample=2", "--async_mode=true")
    assert "max_staleness >= 1" in refused("--rollout.over_sample=2", "--max_staleness=0")
    agent = '--agents=[{"name": "default", "rollout": {"over_sample": 2}}]'
    assert "over_sample" in refused(agent)
