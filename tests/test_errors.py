"""Bad input on the command line ends in one clear message, not a traceback: a model path that
does not exist, a YAML syntax error in a --config file or a preset, a typo in an --agents key.
Each runs the real CLI in a subprocess and reads its exit status and stderr."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from kernel.cli import train_config

ROOT = Path(__file__).resolve().parent.parent
BROKEN_YAML = "num_steps: 3\nseed: 1\n  top_p: 0.9\n"  # line 3, column 8: a stray indent


def _cli(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "kernel", *args],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=cwd,
    )


def _fails_cleanly(out: subprocess.CompletedProcess, *needles: str) -> None:
    assert out.returncode == 2, (out.returncode, out.stderr[-2000:])
    assert "Traceback" not in out.stderr, out.stderr[-3000:]
    for needle in needles:
        assert needle in out.stderr, (needle, out.stderr[-2000:])


def test_train_with_a_missing_model_path_names_it_and_what_model_takes(tmp_path):
    missing = str(tmp_path / "nonexistent")
    out = _cli(
        "train",
        "--preset=toy",
        f"--model={missing}",
        f"--output_dir={tmp_path / 'run'}",
        "--num_steps=1",
    )
    _fails_cleanly(out, f"model {missing!r}: no such file or directory", "--model", "hub name")


def test_yaml_syntax_error_in_a_config_file_names_the_file_and_line(tmp_path):
    bad = tmp_path / "run.yaml"
    bad.write_text(BROKEN_YAML)
    _fails_cleanly(_cli("config", "--config", str(bad)), f"{bad}, line 3, column 8", "invalid YAML")
    with pytest.raises(ValueError, match=re.escape(f"{bad}, line 3")):  # the Python entry point too
        train_config([f"--config={bad}"])


def test_yaml_syntax_error_in_a_preset_names_the_file_and_line(tmp_path):
    # a `recipes` package of its own, first on the path (the working directory of `-m`)
    presets = tmp_path / "recipes" / "broken" / "presets"
    presets.mkdir(parents=True)
    (tmp_path / "recipes" / "__init__.py").write_text("")
    (presets / "bad.yaml").write_text(BROKEN_YAML)
    out = _cli("config", "--recipe=broken", "--preset=bad", cwd=tmp_path)
    _fails_cleanly(out, f"{presets / 'bad.yaml'}, line 3, column 8", "invalid YAML")


@pytest.mark.parametrize("via", ["flag", "yaml"])
def test_agents_key_typo_is_named_with_the_valid_keys(tmp_path, via):
    agents = [{"name": "doctor", "modle": "smollm2"}, "patient"]
    if via == "flag":
        args = [f"--agents={json.dumps(agents)}"]
    else:
        (tmp_path / "agents.yaml").write_text(json.dumps({"agents": agents}))
        args = ["--config", str(tmp_path / "agents.yaml")]
    out = _cli("config", "--preset=toy", *args)
    _fails_cleanly(out, "agents[0]: unknown key 'modle'", "valid keys: name, model, ")


def test_a_per_agent_override_of_the_wrong_type_is_refused_before_start():
    out = _cli("config", "--preset=toy", '--agents=[{"name": "a", "optim": {"lr": "fast"}}]')
    _fails_cleanly(out, "agents['a'].optim.lr: 'fast' is not a valid float")


def test_trainer_ranks_that_tensor_x_pipeline_parallel_does_not_divide_fail_before_start(tmp_path):
    run = tmp_path / "run"
    agents = '[{"name": "a", "backend": "megatron", "trainer": {"tensor_parallel": 2}}]'
    flags = ("--ray.enabled=true", "--ray.ranks=3", f"--agents={agents}", f"--output_dir={run}")
    out = _cli("train", "--preset=toy", *flags)
    _fails_cleanly(out, "agents['a']: 3 trainer ranks", "not divisible", "2 x 1")
    assert not list(run.rglob("*.log")), "an engine was started"


def test_a_missing_eval_file_fails_before_any_engine_starts(tmp_path):
    run = tmp_path / "run"
    out = _cli("train", "--preset=toy", f"--output_dir={run}", "--eval.path=nowhere.jsonl")
    _fails_cleanly(out, "nowhere.jsonl: no such file")
    assert not list(run.rglob("*.log")), "an engine was started"
