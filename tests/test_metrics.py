"""Metrics destinations: JSONL always (a resumed run keeps each step once), TensorBoard event
files and an offline Weights & Biases run when enabled; the unbiased pass@k estimator."""

import itertools
import json

import pytest

from kernel.metrics import LogConfig, MetricsLogger, pass_at_k


def test_jsonl_resume_keeps_each_step_once(tmp_path):
    log = MetricsLogger(tmp_path, LogConfig())
    for step in range(4):  # the crashed run logged step 3 but checkpointed after step 2
        log.log({"step": step, "reward": step / 10, "data/rows": [step]})
    log.close()
    log = MetricsLogger(tmp_path, LogConfig(), start_step=3)
    log.log({"step": 3, "reward": 0.9})
    log.close()
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1, 2, 3]
    assert rows[-1]["reward"] == 0.9


def test_tensorboard_and_offline_wandb(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    log = MetricsLogger(tmp_path, LogConfig(tensorboard=True, wandb=True), {"lr": 1e-3})
    for step in range(3):
        log.log({"step": step, "default/reward": step / 2, "data/rows": [1, 2]})
    log.close()
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(tmp_path / "tensorboard"))
    events.Reload()
    assert [e.value for e in events.Scalars("default/reward")] == [0.0, 0.5, 1.0]
    assert list((tmp_path / "wandb").glob("offline-run-*/run-*.wandb"))


def test_tensorboard_after_a_resume_holds_each_step_once(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    log = MetricsLogger(tmp_path, LogConfig(tensorboard=True))
    for step in range(5):  # crashed after step 4; its last checkpoint was at step 3
        log.log({"step": step, "reward": float(step)})
    log.close()
    log = MetricsLogger(tmp_path, LogConfig(tensorboard=True), start_step=3)
    for step in range(3, 6):  # the resumed run redoes 3 and 4, then goes on
        log.log({"step": step, "reward": 10.0 + step})
    log.close()
    events = EventAccumulator(str(tmp_path / "tensorboard"))
    events.Reload()
    got = [(e.step, e.value) for e in events.Scalars("reward")]
    assert got == [(0, 0.0), (1, 1.0), (2, 2.0), (3, 13.0), (4, 14.0), (5, 15.0)]


@pytest.mark.parametrize(
    ("n", "c", "k", "expected"),
    [
        (5, 2, 2, 1 - 3 / 10),  # 1 - C(3,2)/C(5,2)
        (5, 0, 3, 0.0),
        (5, 5, 1, 1.0),
        (4, 1, 1, 0.25),  # pass@1 is the share correct
        (4, 1, 4, 1.0),  # k = n: whether any passed
        (10, 3, 5, 1 - 21 / 252),  # 1 - C(7,5)/C(10,5)
    ],
)
def test_pass_at_k_is_the_codex_estimator(n, c, k, expected):
    assert pass_at_k(n, c, k) == pytest.approx(expected)
    # the same as the chance over every k-subset of n episodes, c of them correct
    subsets = list(itertools.combinations([True] * c + [False] * (n - c), k))
    assert pass_at_k(n, c, k) == pytest.approx(sum(any(s) for s in subsets) / len(subsets))


@pytest.mark.parametrize(("n", "c", "k"), [(3, 4, 1), (3, 1, 0), (3, 1, 4)])
def test_pass_at_k_refuses_impossible_counts(n, c, k):
    with pytest.raises(ValueError, match="pass@k needs"):
        pass_at_k(n, c, k)
