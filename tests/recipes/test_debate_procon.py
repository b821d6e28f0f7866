"""PRO/CON debate (debate's style: procon): sides alternate by episode; the rule judge scores
quality, evidence and consistency and gives nothing for stuffing, repeating, quoting or
fragments; the model judge's reply parses or falls back to the rules at the judge's cost; an
episode with scripted debaters hears the other's speech as a rebuttal prompt; the tiny preset
runs end to end."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from kernel.hooks import RolloutContext
from kernel.sample import Sample
from recipes.debate.config import RecipeConfig
from recipes.debate.generate import generate
from recipes.debate.procon import parse_judge, rule_scores, side_of
from recipes.debate.reward import reward

ROOT = Path(__file__).resolve().parents[2]
CFG = RecipeConfig(style="procon", judge="rules", min_words=20, max_words=120).validate()
GOOD = (
    "Cities should ban cars from their centres because traffic fumes harm the people who live "
    "there. According to a city survey, 40 percent of residents say the noise keeps them awake. "
    "For example, pedestrian streets in Oslo brought more visitors to local shops. As a result "
    "shops and cafes gain customers when streets are calm. Since 2019 accidents in car-free "
    "streets fell by a third, which means fewer injuries. Position: PRO"
)
WORDS = len(GOOD.split())


def test_sides_alternate_with_the_episode():
    assert [side_of(CFG, "alice", i) for i in range(3)] == ["PRO", "CON", "PRO"]
    assert [side_of(CFG, "bob", i) for i in range(3)] == ["CON", "PRO", "CON"]


def test_a_reasoned_speech_with_evidence_on_its_side_scores_full():
    assert rule_scores(GOOD, "PRO", [], CFG) == {
        "quality": 1.0,
        "evidence": 1.0,
        "consistency": 1.0,
    }


@pytest.mark.parametrize(
    ("speech", "side", "expected"),
    [
        (GOOD, "CON", {"consistency": -1.0}),  # argues the other side
        (GOOD.replace("Position: PRO", "I agree with my opponent. Position: PRO"), "PRO",
         {"consistency": -1.0}),  # concedes
        (GOOD.replace("Position: PRO", ""), "PRO", {"consistency": 0.0}),  # states no side
        # one marker stuffed into one sentence: one reason, one piece of evidence
        ("Because because because since therefore thus 5 5 5 percent data studies research "
         "according to for example. " * 1 + "Position: PRO", "PRO",
         {"evidence": 1 / 3}),
        # the same sentence three times counts once
        (("Cars should go because the air in the centre is dirty. " * 3) + "Position: PRO",
         "PRO", {"evidence": 0.0}),
        # fragments of fewer than 6 words count for nothing
        ("Because cars. Since 5. Data shows. For example, 3. Thus yes. " * 5 + "Position: PRO",
         "PRO", {"quality": 0.0, "evidence": 0.0}),
    ],
)  # fmt: skip
def test_rule_judge_parts(speech, side, expected):
    scores = rule_scores(speech, side, [], CFG)
    assert {k: scores[k] for k in expected} == pytest.approx(expected)


def test_quoting_the_opponent_and_length_cost_quality():
    assert rule_scores(GOOD, "PRO", [GOOD], CFG)["quality"] == 0.0  # every sentence is theirs
    short = RecipeConfig(style="procon", judge="rules", min_words=120, max_words=200).validate()
    assert rule_scores(GOOD, "PRO", [], short)["quality"] == pytest.approx(2 * WORDS / 120 - 1)
    long_ = RecipeConfig(style="procon", judge="rules", min_words=10, max_words=40).validate()
    assert rule_scores(GOOD, "PRO", [], long_)["quality"] == pytest.approx(2 - WORDS / 40)


def test_the_model_judges_reply_parses_or_is_refused():
    reply = "PRO: quality=7, evidence=5, consistency=10\nCON: quality=2 evidence=0 consistency=4"
    assert parse_judge(reply) == {
        "PRO": {"quality": 0.7, "evidence": 0.5, "consistency": 1.0},
        "CON": {"quality": 0.2, "evidence": 0.0, "consistency": 0.4},
    }
    assert parse_judge("PRO: quality=7, evidence=5, consistency=10") is None  # one side
    assert parse_judge(reply.replace("=10", "=11")) is None and parse_judge(None) is None


def test_config_refusals():
    with pytest.raises(ValueError, match="style procon needs two"):
        RecipeConfig(style="procon", judge="rules", debaters=["a", "b", "c"]).validate()
    with pytest.raises(ValueError, match=r"judge must be one of \('rules', 'model'\)"):
        RecipeConfig(style="procon").validate()  # majority is for answers
    with pytest.raises(ValueError, match="style must be one of"):
        RecipeConfig(style="essay").validate()


def _episode(agents, config, index=0):
    ctx = RolloutContext(agents=agents, config=config)
    seed = Sample(prompt="Cities should ban private cars from their centres.", index=index,
                  metadata={"row": 0})  # fmt: skip
    samples = [s for s in asyncio.run(generate(ctx, seed)) if s is not None]
    return samples, reward(ctx, samples)


def test_an_episode_with_the_rules_judge(scripted_agent, smollm2_tokenizer):
    con = "Cars bring workers and deliveries that the shops need every day. Position: CON"
    agents = {
        "alice": scripted_agent("alice", smollm2_tokenizer, [GOOD, GOOD], max_response_len=128),
        "bob": scripted_agent("bob", smollm2_tokenizer, [con, con], max_response_len=128),
    }
    config = {"style": "procon", "judge": "rules", "min_words": 20}
    samples, rewards = _episode(agents, config)
    alice = samples[0]
    assert alice.metadata["sides"] == {"alice": "PRO", "bob": "CON"}
    assert rewards["alice"] == pytest.approx(1.0 + 0.5 + 1.0)  # both speeches score in full
    assert rewards["bob"] < rewards["alice"] and alice.metadata["metrics"]["con_consistency"] == 1.0
    # alice's second prompt is bob's speech (out of her loss)
    heard = smollm2_tokenizer.decode(
        [t for t, m in zip(alice.response_ids, alice.loss_mask, strict=True) if not m]
    )
    assert "Your opponent said" in heard and "deliveries" in heard


def test_a_model_judge_scores_or_falls_back_to_the_rules(scripted_agent, smollm2_tokenizer):
    verdict = (
        "PRO: quality=8, evidence=6, consistency=10\nCON: quality=3, evidence=1, consistency=9"
    )

    def agents(judge_reply):
        return {
            "alice": scripted_agent("alice", smollm2_tokenizer, ["x Position: CON"] * 2),
            "bob": scripted_agent("bob", smollm2_tokenizer, [GOOD, GOOD], max_response_len=128),
            "judge": scripted_agent("judge", smollm2_tokenizer, [judge_reply]),
        }

    config = {"style": "procon", "judge": "model", "min_words": 20}
    samples, rewards = _episode(agents(verdict), config, index=1)  # odd: alice argues CON
    assert samples[0].metadata["sides"] == {"alice": "CON", "bob": "PRO"}
    assert rewards == pytest.approx(
        {"bob": 0.8 + 0.3 + 1.0, "alice": 0.3 + 0.05 + 0.9, "judge": 0.0}
    )
    samples, rewards = _episode(agents("I liked both."), config, index=1)
    assert rewards["judge"] == -0.5 and rewards["bob"] == pytest.approx(2.5)  # the rules
    assert samples[0].metadata["metrics"]["judge_parsed"] == 0.0


@pytest.mark.slow
def test_the_tiny_procon_preset_runs_end_to_end(tmp_path):
    from kernel.cli import train_config
    from kernel.run.loop import train

    preset = ROOT / "recipes" / "debate" / "presets" / "tiny_procon.yaml"
    rows = train(train_config([f"--config={preset}", f"--output_dir={tmp_path}"]))
    assert len(rows) == 2 and "episode/pro_score" in rows[-1] and "episode/judge_parsed" in rows[-1]
    assert "eval/alice/avg@1" in rows[-1]
