"""debate: answer extraction, the majority verdict and the per-debater rewards against goldens;
a debate on a real embedded server where each debater hears the others' answers (masked out
of its loss) between rounds; a model judge; the tiny preset through the loop."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from kernel.cli import train_config
from kernel.engine.client import EngineClient
from kernel.hooks import RolloutContext
from kernel.run.agents import AgentHandle
from kernel.run.loop import train
from kernel.sample import Sample
from recipes.debate.config import RecipeConfig
from recipes.debate.generate import generate
from recipes.debate.reward import extract_answer, majority, reward, same

TINY = Path(__file__).resolve().parents[2] / "recipes" / "debate" / "presets" / "tiny.yaml"
CFG = RecipeConfig().validate()


@pytest.mark.parametrize(
    ("text", "answer"),
    [
        ("5 - 3 = 2. Answer: 2", "2"),
        ("First 7, then the answer is -4.", "-4"),
        ("Answer: 3, no wait. Answer: **12**", "12"),
        ("It is 1,250 in total", "1250"),
        ("half: 1/2", "1/2"),
        ("I do not know.", None),
    ],
)
def test_extract_answer(text, answer):
    assert extract_answer(text) == answer


def test_same_compares_numbers_then_text():
    assert same("2.0", "2") and same("1/2", "0.5") and not same("3", "2")
    assert same("x ", "x") and not same(None, "2")


def test_majority_and_its_ties():
    order = ["a", "b", "c"]
    assert majority({"a": "1", "b": "2", "c": "2.0"}, order) == "2"
    # a tie between different answers: no verdict (it went to the earliest debater before,
    # so with two debaters the verdict was always the first one's answer)
    assert majority({"a": "1", "b": "2", "c": None}, order) is None
    assert majority({"a": "1", "b": "2"}, ["a", "b"]) is None
    assert majority({"a": "2", "b": "2.0", "c": "1"}, order) == "2"  # the first stated form
    assert majority({"a": None, "b": "7", "c": "1"}, order) is None  # one each: a tie ("7" before)
    assert majority({"a": None, "b": "7", "c": "7"}, order) == "7"
    assert majority({"a": None, "b": None}, ["a", "b"]) is None


def _debate(turns: dict[str, list[str]], verdict: str | None = None, label: str = "2"):
    meta = {"debate": turns, "verdict": verdict}
    return [
        Sample(prompt="Calculate 5 - 3.", label=label, agent=name, metadata=dict(meta))
        for name in turns
    ]


def test_rewards_per_debater_golden():
    # alice right from the start; bob wrong, then convinced: majority 2, right
    samples = _debate({"alice": ["Answer: 2", "Answer: 2"], "bob": ["Answer: 8", "Answer: 2"]})
    assert reward(RolloutContext(config=CFG), samples) == {"alice": 1.5, "bob": 1.5}
    m = samples[0].metadata["metrics"]
    assert m["first_round_accuracy"] == 0.5 and m["final_accuracy"] == 1.0
    assert m["agreement"] == 1.0 and m["changed_answer"] == 0.5 and m["verdict_correct"] == 1.0
    assert all(s.metadata["correct"] is True for s in samples)
    # a split: a tie, so no verdict (it went to alice's wrong answer before: the same
    # rewards, as bob's right answer won no verdict either way); carol states nothing
    three = RecipeConfig(debaters=["alice", "bob", "carol"]).validate()
    samples = _debate({"alice": ["Answer: 8"], "bob": ["Answer: 2"], "carol": ["hmm"]})
    assert reward(RolloutContext(config=three), samples) == {
        "alice": 0.0,
        "bob": 1.0,
        "carol": -0.5,
    }
    assert samples[0].metadata["correct"] is False
    assert samples[0].metadata["metrics"]["no_verdict"] == 1.0


def test_per_turn_credit_pays_each_round_for_its_own_answer():
    """credit: turn: one sample per debater and round; round 1 is paid for its own answer, the
    last round as the episode credit pays the debater."""
    cfg = RecipeConfig(credit="turn").validate()
    turns = {"alice": ["Answer: 2", "Answer: 8"], "bob": ["I think so", "Answer: 2"]}
    samples = [
        Sample(prompt="Calculate 5 - 3.", label="2", agent=name, turn=t, metadata={"debate": turns})
        for name in turns
        for t in range(2)
    ]
    # the tie (8 against 2) gives no verdict (alice's wrong answer before): no bonus for bob
    assert reward(RolloutContext(config=cfg), samples) == [1.0, 0.0, -0.5, 1.0]
    assert samples[0].metadata["metrics"]["first_round_accuracy"] == 0.5
    assert all(s.metadata["correct"] is False for s in samples)
    assert samples[0].metadata["metrics"]["no_verdict"] == 1.0
    with pytest.raises(ValueError, match="credit"):
        RecipeConfig(credit="round").validate()
    with pytest.raises(ValueError, match="credit"):
        RecipeConfig(style="procon", judge="rules", credit="turn").validate()


def test_model_judge_rewards_itself_on_its_verdict():
    cfg = RecipeConfig(judge="model").validate()
    turns = {"alice": ["Answer: 2"], "bob": ["Answer: 8"]}
    samples = _debate(turns, verdict="bob is wrong. Answer: 2")
    assert reward(RolloutContext(config=cfg), samples) == {"alice": 1.5, "bob": 0.0, "judge": 1.0}
    samples = _debate(turns, verdict="I cannot decide")
    assert reward(RolloutContext(config=cfg), samples) == {"alice": 1.0, "bob": 0.0, "judge": -0.5}


@pytest.mark.parametrize(
    ("args", "field"),
    [
        ({"debaters": []}, "debaters"),
        ({"debaters": ["alice", "alice"]}, "debaters"),
        ({"debaters": ["alice", "judge"]}, "debaters"),
        ({"rounds": 0}, "rounds"),
        ({"judge": "vote"}, "judge"),
        ({"format_penalty": -1}, "format_penalty"),
    ],
)
def test_config_errors_name_the_field(args, field):
    with pytest.raises(ValueError, match=field):
        RecipeConfig(**args).validate()


# ---- on real engines -------------------------------------------------------------------------


def _seed() -> Sample:
    return Sample(prompt="Calculate 5 - 3.", label="2", group_id=1, index=0)


def _episode(ctx: RolloutContext) -> list:
    """One debate's samples as the rollout keeps them: None (an agent that never spoke, here
    the judge of a run without one) dropped."""
    return [s for s in asyncio.run(generate(ctx, _seed())) if s is not None]


def test_a_debate_on_a_real_engine_each_debater_hears_the_others_masked(tiny_engine, loss_spans):
    url, tok = tiny_engine
    agents = {
        n: AgentHandle(n, [EngineClient(url)], tok, {"temperature": 1.0}, 12, 768)
        for n in ("alice", "bob")
    }
    cfg = RecipeConfig(rounds=3).validate()
    samples = _episode(RolloutContext(agents=agents, config=cfg))
    assert [s.agent for s in samples] == ["alice", "bob"]
    turns = samples[0].metadata["debate"]
    for s in samples:
        s.validate()
        own = turns[s.agent]
        assert len(own) == 3
        assert [tok.decode(x, skip_special_tokens=True) for x in loss_spans(s)] == own
        other = "bob" if s.agent == "alice" else "alice"
        dialogue = tok.decode(s.prompt_ids + s.response_ids)
        # rounds 1 and 2 of the other debater reached it, round 3 (the last) did not
        assert dialogue.count("The others answered") == 2
        assert turns[other][0][:300].strip() in dialogue
    rewards = reward(RolloutContext(agents=agents, config=cfg), samples)
    assert set(rewards) == {"alice", "bob"}


def test_a_model_judge_reads_the_final_answers(tiny_engine, scripted_agent):
    _, tok = tiny_engine
    agents = {
        "alice": scripted_agent("alice", tok, ["Answer: 2", "Still 2. Answer: 2"]),
        "bob": scripted_agent("bob", tok, ["Answer: 9", "Answer: 8"]),
        "judge": scripted_agent("judge", tok, ["Answer: 2"]),
    }
    cfg = RecipeConfig(judge="model").validate()
    ctx = RolloutContext(agents=agents, config=cfg)
    samples = _episode(ctx)
    assert [s.agent for s in samples] == ["alice", "bob", "judge"]
    view = tok.decode(samples[2].prompt_ids)
    assert "alice: Still 2. Answer: 2" in view and "bob: Answer: 8" in view
    assert "bob: Answer: 9" not in view  # the judge reads the final answers only
    assert reward(ctx, samples) == {"alice": 1.5, "bob": 0.0, "judge": 1.0}


def test_per_turn_credit_trains_each_round_in_a_sample_of_its_own(
    tiny_engine, scripted_agent, loss_spans
):
    """credit: turn: debater by debater in round order, each sample's loss covers that round's
    turn only, the earlier rounds and the other's answers its context; the rewards follow."""
    _, tok = tiny_engine
    agents = {
        "alice": scripted_agent("alice", tok, ["Answer: 2", "I keep it. Answer: 2"]),
        "bob": scripted_agent("bob", tok, ["Answer: 9", "Alice is right. Answer: 2"]),
    }
    cfg = RecipeConfig(credit="turn").validate()
    ctx = RolloutContext(agents=agents, config=cfg)
    samples = _episode(ctx)
    assert [(s.agent, s.turn) for s in samples] == [
        ("alice", 0),
        ("alice", 1),
        ("bob", 0),
        ("bob", 1),
    ]
    turns = samples[0].metadata["debate"]
    for s in samples:
        s.validate()
        trained = [tok.decode(x, skip_special_tokens=True) for x in loss_spans(s)]
        assert trained == [turns[s.agent][s.turn]]
        assert s.metadata["text"] == turns[s.agent][s.turn]
    late = tok.decode(samples[3].prompt_ids + samples[3].response_ids)
    assert "Answer: 9" in late and "The others answered" in late  # its context: all before it
    assert "The others answered" not in tok.decode(samples[2].prompt_ids + samples[2].response_ids)
    assert reward(ctx, samples) == [1.0, 1.5, 0.0, 1.5]


def test_one_agent_alone_is_the_single_agent_baseline(tiny_engine, scripted_agent):
    """learn_single: one debater, one round: no partner in its prompt, its answer the verdict."""
    _, tok = tiny_engine
    agents = {"alice": scripted_agent("alice", tok, ["5 - 3 = 2. Answer: 2"])}
    cfg = RecipeConfig(debaters=["alice"], rounds=1).validate()
    ctx = RolloutContext(agents=agents, config=cfg)
    (alone,) = _episode(ctx)
    prompt = tok.decode(alone.prompt_ids)
    assert "together with" not in prompt and "others" not in prompt
    assert alone.metadata["debate"] == {"alice": ["5 - 3 = 2. Answer: 2"]}
    assert reward(ctx, [alone]) == {"alice": 1.5} and alone.metadata["correct"] is True


@pytest.mark.slow
def test_tiny_preset_runs_end_to_end(tmp_path):
    rows = train(train_config([f"--config={TINY}", f"--output_dir={tmp_path}"]))
    assert [r["step"] for r in rows] == [0, 1]
    assert all("episode/verdict_correct" in r and "alice/reward" in r for r in rows)
    assert "eval/alice/avg@2" in rows[-1]


@pytest.mark.slow
def test_a_tiny_char_model_learns_to_state_answers_in_the_debate(tmp_path):
    """Learning on the debate's own reward with a tiny model built from a config (100-token
    character vocabulary, one model for both debaters): a random model often states no number
    (-0.5) and is rarely right. The strict reader states an answer only for one number in the
    last sentence (two digit runs, "3 4", state none), so replies are kept to 4 characters,
    where one number is in reach; within 30 steps the debaters' mean reward rises (measured
    at seeds 0, 1, 2: -0.32 -> -0.19, -0.35 -> -0.21, -0.30 -> -0.18; at 8 characters it
    barely moves, -0.29 -> -0.25). The signal a tiny model can follow is mostly the format
    term (stating one number), so this pins that the recipe trains end to end on its reward,
    not that a tiny model learns arithmetic."""
    flags = [
        f"--output_dir={tmp_path}",
        "--model=tiny-char",
        "--num_steps=30",
        "--rollout.max_response_len=4",
        "--rollout.max_context_len=1024",
        "--data.n_samples_per_prompt=8",
        "--data.prompts_per_step=4",
        "--optim.lr=0.002",
        "--eval.every=0",
    ]
    rows = train(train_config([f"--config={TINY}", *flags]))
    first = sum(r["alice/reward"] + r["bob/reward"] for r in rows[:5]) / 10
    last = sum(r["alice/reward"] + r["bob/reward"] for r in rows[-5:]) / 10
    assert last >= first + 0.08, (first, last)
