"""A crash must not cost more than the step it hit: metrics rows are fsynced as they are written
and survive a resume (each step once in metrics.jsonl, the crashed run's later rows moved to
metrics.discarded.jsonl, a torn last line dropped with a warning), and a checkpoint is renamed
into place whole; a damaged one is passed over for the one before it with a warning naming the
file, or, when none is left, refused with an error naming the file and the way out.

The checkpoint tests save and load a tiny TorchTrainer through ``Runtime.checkpoint`` and
``resume_from`` directly; one toy run goes through the whole crash-and-resume path."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from kernel.loss import LossConfig
from kernel.metrics import LogConfig, MetricsLogger
from kernel.run.checkpoint import checkpoints, resume_from
from kernel.run.config import ModelPlan
from kernel.run.runtime import RunningModel, Runtime
from kernel.train.optim import OptimConfig
from kernel.train.settings import TorchTrainerConfig
from kernel.train.torch_backend import TorchTrainer

ROOT = Path(__file__).resolve().parent.parent
TOY = ROOT / "kernel" / "presets" / "toy.yaml"


def _rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def _log(out: Path, steps, start_step: int = 0, value: float = 0.0) -> None:
    log = MetricsLogger(out, LogConfig(), start_step=start_step)
    for step in steps:
        log.log({"step": step, "reward": value + step})
    log.close()


# --- metrics.jsonl -------------------------------------------------------------------------


def test_every_row_is_fsynced_as_it_is_logged(tmp_path, monkeypatch):
    log = MetricsLogger(tmp_path, LogConfig())
    synced = []
    monkeypatch.setattr(os, "fsync", lambda fd: synced.append(fd))
    log.log({"step": 0, "reward": 1.0})
    assert synced == [log._file.fileno()]
    log.close()


def test_a_torn_last_line_is_dropped_with_a_warning_and_the_resume_goes_on(tmp_path, caplog):
    _log(tmp_path, range(3))
    metrics = tmp_path / "metrics.jsonl"
    with metrics.open("a") as f:
        f.write('{"step": 3, "rew')  # the crash came mid-write
    with caplog.at_level(logging.WARNING, logger="kernel.metrics"):
        _log(tmp_path, [3, 4], start_step=3, value=10.0)
    assert [r["step"] for r in _rows(metrics)] == [0, 1, 2, 3, 4]
    assert f"{metrics}: line 4 is torn" in caplog.text


def test_a_resume_keeps_each_step_once_and_moves_the_rows_it_redoes_aside(tmp_path):
    # the crashed run logged the start eval and steps 0-4, its last checkpoint was after step 2
    log = MetricsLogger(tmp_path, LogConfig())
    log.log({"step": -1, "eval/default/avg@1": 0.5})
    for step in range(5):
        log.log({"step": step, "reward": float(step)})
    log.close()
    _log(tmp_path, [3, 4, 5], start_step=3, value=10.0)  # the resumed run redoes 3 and 4

    rows = _rows(tmp_path / "metrics.jsonl")
    assert [r["step"] for r in rows] == [-1, 0, 1, 2, 3, 4, 5]
    assert [r.get("reward") for r in rows[-3:]] == [13.0, 14.0, 15.0]  # the resumed run's
    discarded = _rows(tmp_path / "metrics.discarded.jsonl")
    assert [(r["step"], r["reward"]) for r in discarded] == [(3, 3.0), (4, 4.0)]


def test_a_run_starting_over_moves_the_old_rows_aside_instead_of_deleting_them(tmp_path):
    _log(tmp_path, range(2))  # a run that crashed before its first checkpoint
    _log(tmp_path, range(3), value=10.0)
    assert [r["reward"] for r in _rows(tmp_path / "metrics.jsonl")] == [10.0, 11.0, 12.0]
    assert [r["reward"] for r in _rows(tmp_path / "metrics.discarded.jsonl")] == [0.0, 1.0]


def test_a_broken_line_before_the_last_is_an_error_naming_file_and_line(tmp_path):
    metrics = tmp_path / "metrics.jsonl"
    metrics.write_text('{"step": 0}\nnot json\n{"step": 1}\n')
    with pytest.raises(ValueError, match=f"{metrics}: line 2 is not JSON"):
        MetricsLogger(tmp_path, LogConfig(), start_step=1)


# --- checkpoints ---------------------------------------------------------------------------


class _Buffer:
    def state_dict(self, in_flight):
        return {"position": 0, "in_flight": len(in_flight)}


@pytest.fixture(scope="module")
def trainer(tmp_path_factory):
    from kernel.models import build_tiny_model

    model_dir = build_tiny_model(tmp_path_factory.mktemp("tiny"), "qwen2", tokenizer="char")
    return TorchTrainer(str(model_dir), OptimConfig(), LossConfig(), TorchTrainerConfig(), 10)


@pytest.fixture
def model(trainer):
    m = RunningModel(ModelPlan("default", (), None, {}), None, trainer=trainer)
    yield m
    m.thread.close()


def _runtime(out: Path, model: RunningModel, last: Path | None = None) -> Runtime:
    return Runtime(
        SimpleNamespace(output_dir=str(out), save_every=1),
        [model],
        _Buffer(),
        None,
        None,
        None,
        0,
        last,
    )


def _save(rt: Runtime, step: int) -> Path:
    """A checkpoint at ``step`` whose trainer step is 100 + step (to tell which one loaded)."""
    rt.models[0].trainer.step = 100 + step
    rt.models[0].version = step
    return asyncio.run(rt.checkpoint(step, None))


def _truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def _empty(ckpt: Path) -> None:
    shutil.rmtree(ckpt)
    ckpt.mkdir()


def _wrong_shape(ckpt: Path) -> None:
    from safetensors.torch import load_file, save_file

    path = ckpt / "trainers" / "default" / "model.safetensors"
    weights = load_file(path)
    weights["model.embed_tokens.weight"] = torch.zeros(3, 3)
    save_file(weights, path, metadata={"format": "pt"})


TRAINER = "trainers/default"
DAMAGE = {  # how the newest checkpoint is damaged -> what the message must name
    "truncated weights": (
        lambda c: _truncate(c / TRAINER / "model.safetensors"),
        [f"step_2/{TRAINER}/model.safetensors", "truncated"],
    ),
    "truncated optimizer": (
        lambda c: _truncate(c / TRAINER / "optimizer.pt"),
        [f"step_2/{TRAINER}/optimizer.pt", "truncated"],
    ),
    "missing optimizer": (
        lambda c: (c / TRAINER / "optimizer.pt").unlink(),
        [f"step_2/{TRAINER}: the trainer cannot load it", "optimizer.pt"],
    ),
    "bad state.json": (
        lambda c: (c / "state.json").write_text('{"step": 2, "weigh'),
        ["step_2/state.json: not JSON"],
    ),
    "bad trainer_state.json": (
        lambda c: (c / TRAINER / "trainer_state.json").write_text("{"),
        [f"step_2/{TRAINER}/trainer_state.json: not JSON"],
    ),
    "state.json without a model's version": (
        lambda c: (c / "state.json").write_text('{"step": 2, "weight_versions": {}}'),
        ["step_2/state.json: not the state of this run"],
    ),
    "empty folder": (_empty, ["step_2/state.json: missing"]),
    "wrong-shape weights": (_wrong_shape, [f"step_2/{TRAINER}", "differ in shape"]),
}


@pytest.mark.parametrize("damage", DAMAGE)
def test_a_damaged_checkpoint_falls_back_to_the_one_before(tmp_path, model, caplog, damage):
    rt = _runtime(tmp_path, model)
    _save(rt, 1)
    damage_fn, named = DAMAGE[damage]
    damage_fn(_save(rt, 2))
    with caplog.at_level(logging.WARNING, logger="kernel.run.checkpoint"):
        ckpt, state = resume_from(checkpoints(tmp_path), [model])
    assert (ckpt.name, state["step"], model.trainer.step) == ("step_1", 1, 101)
    warning = caplog.text
    assert all(text in warning for text in named), warning


@pytest.mark.parametrize("damage", DAMAGE)
def test_a_damaged_checkpoint_with_none_before_is_an_error_naming_it(tmp_path, model, damage):
    damage_fn, named = DAMAGE[damage]
    damage_fn(_save(_runtime(tmp_path, model), 2))
    with pytest.raises(ValueError, match="no usable checkpoint") as e:
        resume_from(checkpoints(tmp_path), [model])
    assert all(text in str(e.value) for text in [*named, "delete the damaged ones"]), e.value


def test_an_unfinished_save_is_ignored_and_removed_by_the_next(tmp_path, model):
    rt = _runtime(tmp_path, model)
    _save(rt, 1)
    _save(rt, 2)
    leftover = tmp_path / "checkpoints" / "step_3.tmp" / TRAINER
    leftover.mkdir(parents=True)
    (leftover / "model.safetensors").write_bytes(b"\0" * 10)  # a crash mid-save

    assert [p.name for p in checkpoints(tmp_path)] == ["step_1", "step_2"]
    ckpt, _ = resume_from(checkpoints(tmp_path), [model])
    assert ckpt.name == "step_2"
    _save(_runtime(tmp_path, model, last=ckpt), 3)
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["step_2", "step_3"]


def test_a_save_that_fails_leaves_no_step_folder(tmp_path, model, monkeypatch):
    rt = _runtime(tmp_path, model)
    _save(rt, 1)

    def crash(path):
        Path(path).mkdir(parents=True)
        (Path(path) / "model.safetensors").write_bytes(b"\0" * 10)
        raise OSError("disk full")

    monkeypatch.setattr(model.trainer, "save", crash)
    with pytest.raises(OSError, match="disk full"):
        _save(rt, 2)
    assert [p.name for p in checkpoints(tmp_path)] == ["step_1"]


def test_after_a_fallback_the_next_save_replaces_the_damaged_and_keeps_the_good(tmp_path, model):
    rt = _runtime(tmp_path, model)
    _save(rt, 1)
    _truncate(_save(rt, 2) / TRAINER / "model.safetensors")
    (tmp_path / "checkpoints" / "step_3").mkdir()  # the crashed run's, empty
    ckpt, _ = resume_from(checkpoints(tmp_path), [model])
    assert ckpt.name == "step_1"

    _save(_runtime(tmp_path, model, last=ckpt), 2)  # the resumed run's first save
    assert [p.name for p in checkpoints(tmp_path)] == ["step_1", "step_2"]
    model.trainer.step = 0
    assert resume_from(checkpoints(tmp_path), [model])[0].name == "step_2"
    assert model.trainer.step == 102


# --- end to end ----------------------------------------------------------------------------


@pytest.mark.slow
def test_toy_run_resumes_past_a_damaged_checkpoint_and_a_torn_metrics_line(tmp_path, caplog):
    from kernel.cli import train_config
    from kernel.run.loop import train

    def config(*flags):
        flags = [f"--output_dir={tmp_path}", "--save_every=1", *flags]
        return train_config([f"--config={TOY}", *flags])

    train(config("--num_steps=3"))
    ckpts = tmp_path / "checkpoints"
    assert sorted(p.name for p in ckpts.iterdir()) == ["step_2", "step_3"]
    _truncate(ckpts / "step_3" / TRAINER / "model.safetensors")
    metrics = tmp_path / "metrics.jsonl"
    with metrics.open("a") as f:
        f.write('{"step": 3, "rew')

    with caplog.at_level(logging.WARNING):
        rows = train(config("--num_steps=5", "--resume=true"))
    assert [r["step"] for r in rows] == [2, 3, 4]  # from step_2, the last good checkpoint
    assert f"step_3/{TRAINER}/model.safetensors" in caplog.text
    assert f"{metrics}: line 4 is torn" in caplog.text
    assert [r["step"] for r in _rows(metrics)] == [0, 1, 2, 3, 4]
    assert [r["step"] for r in _rows(tmp_path / "metrics.discarded.jsonl")] == [2]
    assert sorted(p.name for p in ckpts.iterdir()) == ["step_4", "step_5"]
