"""Metrics destinations: JSONL always (a resumed run keeps each step once), TensorBoard event
files and an offline Weights & Biases run when enabled."""

import json

from kernel.metrics import LogConfig, MetricsLogger


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
