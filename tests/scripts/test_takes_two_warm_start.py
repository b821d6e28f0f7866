"""scripts/takes_two_warm_start.py: the stages' commands, and the report on evaluation files
written here (a doctor that always diagnoses right with the pair, names the first listed
candidate alone, and votes over samples of that)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from scripts import takes_two_warm_start as ws

ROWS = [json.loads(line) for line in Path(ws.HELD_OUT).read_text().splitlines()]


def test_each_seed_trains_on_its_own_demos_and_evaluates_every_arm_on_the_held_out_file(tmp_path):
    got = dict(ws.stages(2, tmp_path, vote=4))
    demos = got[tmp_path / "doctor.jsonl"]
    assert demos[demos.index("--train") + 1] == ws.TRAIN and demos[demos.index("--seed") + 1] == "2"
    for role in ("doctor", "patient"):
        sft = got[tmp_path / f"sft_{role}"]
        assert sft[sft.index("--seed") + 1] == "44" and sft[sft.index("--sft.agent") + 1] == role
        assert sft[sft.index("--sft.path") + 1] == str(tmp_path / f"{role}.jsonl")
    for arm in ws.ARMS:
        cmd = got[tmp_path / arm]
        assert cmd[cmd.index("--output_dir") + 1] == str(tmp_path / arm)
        assert cmd[2:4] == ["kernel", "eval"] and "learn_balanced" in cmd
        played = json.loads(cmd[cmd.index("--agents") + 1])
        assert played[0] == {"name": "doctor", "model": str(tmp_path / "sft_doctor" / "model")}
    assert "--recipe_args.scripted_patient" in got[tmp_path / "informant"]
    for arm in ("alone", "alone_vote"):
        cmd = got[tmp_path / arm]
        assert cmd[cmd.index("--recipe_args.max_turns") + 1] == "1"
    vote = got[tmp_path / "alone_vote"]
    assert vote[vote.index("--eval.n_samples") + 1] == "4"


def _reply(diagnosis: str) -> str:
    return f"Diagnosis: {diagnosis}\nRecommendation: rest<|im_end|>\n"


def _write(path: Path, texts_of) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = []
    for i, row in enumerate(ROWS):
        texts = texts_of(row)
        right = [float(t.split("\n")[0].split(": ")[1] == row["label"]["diagnosis"]) for t in texts]
        metrics = [{"diagnosis_correct": r} for r in right]
        lines.append({
            "row": i, "agent": "doctor", "texts": texts, "rewards": right,
            "passed": [bool(r) for r in right], "metrics": metrics,
        })  # fmt: skip
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))


def test_the_report_scores_each_arm_against_the_pair_and_the_controls(tmp_path):
    right = lambda row: [_reply(row["label"]["diagnosis"])]  # noqa: E731
    first = lambda row: [_reply(row["candidates"][0])]  # noqa: E731

    def votes(row):  # the first listed twice, the right one once, a third one once: first wins
        first, truth = row["candidates"][0], row["label"]["diagnosis"]
        other = next(c for c in row["candidates"] if c not in (first, truth))
        return [_reply(c) for c in (first, first, truth, other)]

    for seed in (0, 1):
        for arm in ws.ARMS:
            how = {"alone": first, "alone_vote": votes}.get(arm, right)
            _write(tmp_path / f"seed{seed}" / arm / "eval" / "step_0.jsonl", how)
    r = ws.report(tmp_path, [0, 1], vote=4, resamples=200)
    first_right = sum(row["candidates"][0] == row["label"]["diagnosis"] for row in ROWS) / len(ROWS)
    assert r["pair"]["correct"] == 1.0 and r["pair"]["first_if_named"] == pytest.approx(first_right)
    assert r["alone"]["correct"] == pytest.approx(first_right)
    assert r["alone"]["first_if_named"] == 1.0
    assert r["alone_vote"]["correct"] == pytest.approx(first_right)
    d = r["alone"]["pair_minus"]
    assert (
        d["diff"] == pytest.approx(1 - first_right) and 0 < d["ci_low"] <= d["diff"] <= d["ci_high"]
    )
    assert r["best_control"] in r["controls"] and 0.2 < r["controls"][r["best_control"]] < 0.35
    c = r["pair_minus_best_control"]
    assert c["ci_low"] > 0.5
    # a case's vote is 4 episodes of replies as long as the alone arm's one (other candidates)
    assert 3 * r["alone"]["tokens_per_case"] < r["alone_vote"]["tokens_per_case"]
    assert r["alone_vote"]["tokens_per_case"] < 5 * r["alone"]["tokens_per_case"]


def test_the_summary_names_every_arm_and_the_vote(tmp_path):
    arm = {"correct": 0.5, "ci_low": 0.4, "ci_high": 0.6, "named": 1.0, "correct_if_named": 0.5,
           "first_if_named": 0.25, "facts": 0.5, "tokens_per_case": 30.0}  # fmt: skip
    r = {a: dict(arm, pair_minus={"diff": 0.1, "ci_low": 0.05, "ci_high": 0.15}) for a in ws.ARMS}
    del r["pair"]["pair_minus"]
    r |= {"seeds": [0, 1, 2], "n_eval": 132, "controls": {"most common answer": 0.273},
          "best_control": "most common answer", "commit": "abc", "machine": "here", "vote": 4,
          "pair_minus_best_control": {"diff": 0.2, "ci_low": 0.1, "ci_high": 0.3}}  # fmt: skip
    text = ws.markdown(r)
    assert "plurality of 4 samples" in text and text.count("\n| ") == len(ws.ARMS) + 1
    assert "**+0.200 [+0.100, +0.300]**" in text


PUBLISHED = sorted(p.parent for p in (ws.ROOT / "docs" / "results").rglob("warm_start.json"))


@pytest.mark.parametrize("run", PUBLISHED, ids=[p.name for p in PUBLISHED])
def test_a_published_warm_start_recomputes_from_its_own_files(run):
    """Its figures come out again from the evaluation files published beside it; 3 seeds, a
    commit without local changes, under 2 MB."""
    first = json.loads((run / "warm_start.json").read_text())
    again = ws.report(run, first["seeds"], first["vote"], 10000)
    for arm in ws.ARMS:
        assert again[arm] == first[arm], arm
    assert again["pair_minus_best_control"] == first["pair_minus_best_control"]
    assert len(first["seeds"]) >= 3 and first["commit"] and "+dirty" not in first["commit"]
    assert sum(f.stat().st_size for f in run.rglob("*") if f.is_file()) < 2_000_000
