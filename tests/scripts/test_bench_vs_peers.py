"""scripts/bench_vs_peers.py end to end at size tiny for 2 steps: all three systems train the
same model folder, and the printed table and the JSON carry every figure the issue names
(no timing is asserted: the figures are measured, not judged, here)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytest.importorskip("trl", reason="the peers extra: pip install -e '.[peers]'")
pytest.importorskip("comlrl", reason="the peers extra: pip install -e '.[peers]'")


@pytest.mark.slow
def test_bench_vs_peers_two_steps(tmp_path):
    out = tmp_path / "bench.json"
    cmd = [sys.executable, str(ROOT / "scripts" / "bench_vs_peers.py"), "--size", "tiny"]
    cmd += ["--steps", "2", "--work-dir", str(tmp_path / "work"), "--json", str(out)]
    cmd += ["--plot", str(tmp_path / "curves.png"), "--ablations", "no_share"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "ratio trl@2 ÷ tandem: " in proc.stdout and "ratio comlrl@2 ÷ tandem: " in proc.stdout
    assert "start-up of tandem@2, seconds: engines_spawn " in proc.stdout  # spawned first
    assert (
        "python -m kernel train --preset toy --model"
        in (tmp_path / "work").joinpath("trl-tandem-t2-seed0.log").read_text()
    )

    record = json.loads(out.read_text())
    assert record["size"] == "tiny" and record["steps"] == 2 and record["commit"]
    assert {"torch", "transformers", "trl", "comlrl"} <= set(record["versions"])
    for peer in ("trl", "comlrl"):
        rec = record["results"][peer]
        assert set(rec["runs"]) == {f"{peer}@2", "tandem@2", "tandem-no_share@2"}
        for fig in rec["runs"].values():
            assert isinstance(fig["step_s"], float) and len(fig["curve"]) == 2
            assert 0.0 <= fig["reward_first"] <= 1.0 and fig["tokens_run"] > 0
        tandem = rec["runs"]["tandem@2"]
        assert rec["ratios"][f"{peer}@2"] == pytest.approx(
            rec["runs"][f"{peer}@2"]["step_s"] / tandem["step_s"]
        )
        assert tandem["phases"]["sync_s"] > 0  # Tandem syncs weights every step
        # where its start-up went: the run's own profile, printed and kept
        assert set(tandem["startup_phases"]) >= {"imports", "trainers", "engines_wait"}
        assert sum(tandem["startup_phases"].values()) <= tandem["startup_s"]
        assert rec["reward_vs_tandem"][f"{peer}@2"] == "one seed"
        # Prompt sharing runs each prompt once per group: without it the update runs more.
        assert rec["runs"]["tandem-no_share@2"]["tokens_run"] > tandem["tokens_run"]
    assert (tmp_path / "curves.png").stat().st_size > 0
    # one model folder, built once, loaded by every system
    assert [p.name for p in (tmp_path / "work").glob("model-*")] == ["model-tiny"]


def test_bench_vs_peers_names_a_missing_peer_and_bad_flags():
    cmd = [sys.executable, str(ROOT / "scripts" / "bench_vs_peers.py"), "--peers", "verl"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert proc.returncode == 2 and "--peers: unknown ['verl']" in proc.stderr


def test_the_smollm2_folder_is_smollm2_with_its_own_pad_token(tmp_path):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    sys.path.insert(0, str(ROOT / "scripts"))
    from bench_vs_peers import build_model

    from kernel.models import load_causal_lm

    out = build_model("smollm2", tmp_path)
    tok = AutoTokenizer.from_pretrained(out)
    assert tok.pad_token == "<|endoftext|>" and tok.eos_token != tok.pad_token
    model, ref = AutoModelForCausalLM.from_pretrained(out), load_causal_lm("smollm2")
    for name, p in ref.state_dict().items():
        assert torch.equal(model.state_dict()[name], p), name
