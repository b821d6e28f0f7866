"""deep_research reward goldens (arithmetic written out), the episode metrics of the final answer
(exact_match, f1, gold_in_answer) on SQuAD-style goldens, the masking of an episode whose
retriever failed, the tag parsers on golden strings, and the recipe config's validation."""

from __future__ import annotations

import math

import pytest

from kernel.hooks import RolloutContext
from kernel.sample import Sample
from recipes.deep_research.config import RecipeConfig
from recipes.deep_research.reward import (
    answer_in,
    answer_metrics,
    exact_match,
    f1_score,
    gold_answers,
    normalize,
    reward,
)
from recipes.deep_research.tools import (
    Action,
    FormatError,
    SearcherTurn,
    parse_action,
    parse_searcher_turn,
)

# ---- normalisation, EM, F1 -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("The  Eiffel-Tower!", "eiffeltower"),  # lower, punctuation dropped (joins), article
        ("A Tale of Two Cities", "tale of two cities"),
        ("an apple, the pear and a plum.", "apple pear and plum"),
        ("  Theatre  ", "theatre"),  # 'the' only as a whole word
        ("1,842", "1842"),
    ],
)
def test_normalize_is_squad(text, expected):
    assert normalize(text) == expected


def test_gold_answers_accepts_one_or_several():
    assert gold_answers("Ostmark") == ["Ostmark"]
    assert gold_answers(["Ostmark", "the Ostmark"]) == ["Ostmark", "the Ostmark"]
    assert gold_answers([1842]) == ["1842"]
    assert gold_answers(None) == []


def test_exact_match():
    assert exact_match("the Ostmark.", ["Ostmark"]) == 1.0
    assert exact_match("Ostmark region", ["Ostmark"]) == 0.0
    assert exact_match("JFK", ["John F. Kennedy", "JFK"]) == 1.0  # any gold answer counts
    assert exact_match(None, ["Ostmark"]) == 0.0


def test_f1_goldens():
    # pred [blue, cheese, from, lobriby] (4), gold [blue, cheese] (2): common 2
    # P = 2/4 = 0.5, R = 2/2 = 1, F1 = 2 * 0.5 * 1 / (0.5 + 1) = 2/3
    assert math.isclose(f1_score("Blue cheese from Lobriby", ["blue cheese"]), 2 / 3)
    # several golds: the best one counts. vs "cheese": P = 1/2, R = 1/1 -> 2/3; vs "blue
    # cheese": P = R = 1 -> 1
    assert f1_score("blue cheese", ["cheese", "blue cheese"]) == 1.0
    # multiplicity: pred [tea, tea], gold [tea]: common min(2, 1) = 1, P = 1/2, R = 1 -> 2/3
    assert math.isclose(f1_score("tea tea", ["tea"]), 2 / 3)
    # pred [herb, tea], gold [green, tea, leaves]: common 1, P = 1/2, R = 1/3
    # F1 = 2 * (1/2) * (1/3) / (1/2 + 1/3) = (1/3) / (5/6) = 2/5
    assert math.isclose(f1_score("herb tea", ["green tea leaves"]), 0.4)
    assert f1_score("salt", ["herb tea"]) == 0.0
    assert f1_score(None, ["herb tea"]) == 0.0
    # an answer that normalises to nothing never scores, even against a gold that does too
    assert f1_score("the", ["a"]) == 0.0 and exact_match("the", ["a"]) == 0.0


def test_answer_in_summary_is_token_aligned():
    summary = "Calfen Rhotumtor was born in Pelbekmere [p000]."
    assert answer_in(summary, ["pelbekmere"]) == 1.0
    assert answer_in(summary, ["Pelbek"]) == 0.0  # part of a word is not the answer
    assert answer_in(summary, ["Ostmark", "Calfen Rhotumtor"]) == 1.0
    assert answer_in(None, ["Pelbekmere"]) == 0.0


# (answer, golds) -> (exact_match, f1, gold_in_answer), F1 worked out by hand
ANSWER_METRICS = [
    # SQuAD normalisation: case and the article go, so the answer equals the gold
    ("the Eiffel Tower", ["Eiffel Tower"], (1.0, 1.0, 1.0)),
    ("Denver Broncos", ["Broncos", "Denver Broncos"], (1.0, 1.0, 1.0)),  # any gold counts
    # pred [eiffel, tower, in, paris] (4), gold [eiffel, tower] (2): common 2, P = 2/4, R = 1,
    # F1 = 2 * 1/2 * 1 / (3/2) = 2/3; the gold is in the answer
    ("Eiffel Tower in Paris", ["the Eiffel Tower"], (0.0, 2 / 3, 1.0)),
    # pred [tower] (1), gold [eiffel, tower]: common 1, P = 1, R = 1/2, F1 = 1 / (3/2) = 2/3;
    # the gold is not in the answer
    ("Tower", ["Eiffel Tower"], (0.0, 2 / 3, 0.0)),
    # best gold: vs [santa, clara] common 2 of pred 3, P = 2/3, R = 1, F1 = (4/3) / (5/3) = 4/5;
    # vs [levis, stadium] 0
    ("Santa Clara, California", ["Levi's Stadium", "Santa Clara"], (0.0, 0.8, 1.0)),
    # whole words only: "towers" is not "tower"; common [eiffel], P = R = 1/2, F1 = 1/2
    ("Eiffel Towers", ["Eiffel Tower"], (0.0, 0.5, 0.0)),
    ("1,842", ["1842"], (1.0, 1.0, 1.0)),  # punctuation dropped before comparing
    ("Paris", ["Eiffel Tower"], (0.0, 0.0, 0.0)),
    # no answer: never answered, empty, blank, or nothing left after normalisation
    (None, ["Eiffel Tower"], (0.0, 0.0, 0.0)),
    ("", ["Eiffel Tower"], (0.0, 0.0, 0.0)),
    ("   ", ["Eiffel Tower"], (0.0, 0.0, 0.0)),
    ("the.", ["the"], (0.0, 0.0, 0.0)),
]


@pytest.mark.parametrize(("answer", "golds", "expected"), ANSWER_METRICS)
def test_answer_metrics_goldens(answer, golds, expected):
    m = answer_metrics(answer, golds)
    assert list(m) == ["exact_match", "f1", "gold_in_answer"]
    assert (m["exact_match"], m["f1"], m["gold_in_answer"]) == pytest.approx(expected)


def test_answer_metrics_take_the_label_as_a_string_or_none():
    assert answer_metrics("the Eiffel Tower", "Eiffel Tower")["exact_match"] == 1.0
    assert answer_metrics("Eiffel Tower", None) == {
        "exact_match": 0.0,
        "f1": 0.0,
        "gold_in_answer": 0.0,
    }


# ---- the hook ---------------------------------------------------------------------------------


def _episode(final_answer, agent_format_ok=True, summaries=("x",), searcher_format_ok=True):
    label = ["blue cheese"]
    samples = [
        Sample(
            label=label,
            agent="agent",
            metadata={"final_answer": final_answer, "format_ok": agent_format_ok},
        )
    ]
    for i, summary in enumerate(summaries):
        meta = {"final_answer": final_answer, "summary": summary, "format_ok": searcher_format_ok}
        samples.append(Sample(label=label, agent="searcher", turn=i, metadata=meta))
    return samples


def _reward(samples, **cfg):
    config = RecipeConfig(em_weight=1.0, f1_weight=0.5, format_weight=0.1, **cfg).validate()
    return reward(RolloutContext(config=config), samples)


def test_agent_reward_em_f1_and_format():
    # right: 1.0 * EM 1 + 0.5 * F1 1 + 0.1 * format 1 = 1.6
    assert _reward(_episode("Blue cheese"))[0] == pytest.approx(1.6)
    # partly right, F1 2/3 (see test_f1_goldens): 1.0 * 0 + 0.5 * 2/3 + 0.1 * 1 = 0.4333...
    assert _reward(_episode("blue cheese from Lobriby"))[0] == pytest.approx(1 / 3 + 0.1)
    # right but a malformed turn on the way: 1.0 + 0.5 + 0.1 * 0 = 1.5
    assert _reward(_episode("blue cheese", agent_format_ok=False))[0] == pytest.approx(1.5)
    # never answered: 0 + 0 + 0.1 * 0 = 0
    assert _reward(_episode(None, agent_format_ok=False))[0] == 0.0


def test_searcher_modes():
    ep = _episode("blue cheese from Lobriby", summaries=("Lobriby: blue cheese [t001]", "none"))
    # outcome: the main agent's answer score, 1.0 * 0 + 0.5 * 2/3 = 1/3, for every call
    out = _reward(ep, searcher_reward="outcome")
    assert out[1:] == [pytest.approx(1 / 3), pytest.approx(1 / 3)]
    # outcome_format: 1/3 + 0.1 * 1 (a summary, no malformed turn)
    out = _reward(ep, searcher_reward="outcome_format")
    assert out[1:] == [pytest.approx(1 / 3 + 0.1)] * 2
    bad = _episode("blue cheese", summaries=(None,), searcher_format_ok=False)
    assert _reward(bad, searcher_reward="outcome_format")[1] == pytest.approx(1.5)  # 1 + .5 + 0
    # answer_in_summary: the first summary holds "blue cheese", the second does not
    assert _reward(ep, searcher_reward="answer_in_summary")[1:] == [1.0, 0.0]
    # none: not rewarded, the main agent still is
    out = _reward(ep, searcher_reward="none")
    assert out[1:] == [None, None] and out[0] == pytest.approx(1 / 3 + 0.1)


def test_evidence_term_is_the_share_of_supporting_documents_retrieved():
    ep = _episode(None, agent_format_ok=False, summaries=("x", "y"))
    for s, retrieved in zip(
        ep, (["t001", "p002", "c003"], ["t001"], ["c003", "p009"]), strict=True
    ):
        s.metadata.update(support=["t001", "p002"], retrieved=retrieved)
    # agent: both supporting documents among all its searches' -> 0.5 x 2/2; searcher 0:
    # t001 of 2 -> 0.5 x 1/2; searcher 1: none -> 0 (plus an answer score of 0 each)
    assert _reward(ep, evidence_weight=0.5) == pytest.approx([0.5, 0.25, 0.0])
    assert _reward(ep) == [0.0, 0.0, 0.0]  # off by default
    for s in ep:
        s.metadata.pop("support")  # a row without support ids: the term is 0
    assert _reward(ep, evidence_weight=0.5) == [0.0, 0.0, 0.0]


@pytest.mark.parametrize("searcher_reward", ["outcome", "answer_in_summary", "none"])
def test_retriever_failure_masks_the_whole_episode(searcher_reward):
    """An episode in which a retriever call failed gets None for every sample, however right
    its answer, and the kernel then gives it no advantage and trains nothing of it, as it does
    with takes_two's patient when the judge failed."""
    from kernel.advantages import AdvantageConfig, compute_advantages
    from kernel.rewards import RewardConfig, apply_weighting, assign_rewards
    from kernel.sample import Status
    from kernel.train.update import trainable

    failed = _episode("blue cheese")
    for s in failed:
        s.metadata["retriever_failed"] = True
    cfg = {"searcher_reward": searcher_reward, "evidence_weight": 0.5}
    assert _reward(failed, **cfg) == [None, None]
    clean = _episode("blue cheese from Lobriby")  # another episode of the same group

    episodes = []
    for index, ep in enumerate((failed, clean, _episode("blue cheese"))):
        for s in ep:
            s.index, s.status = index, Status.COMPLETED
            s.prompt_ids, s.response_ids, s.loss_mask = [1, 2], [3, 4], [1, 1]
            s.metadata["correct"] = False
        assign_rewards(ep, _reward(ep, **cfg))
        apply_weighting(ep, RewardConfig(), correct=False)
        episodes.append(ep)
    compute_advantages([s for ep in episodes for s in ep], AdvantageConfig(estimator="grpo"))
    assert all(s.reward is None and s.advantage is None for s in failed)
    assert not any(trainable(s) for s in failed)
    # the other two agent samples form the group alone: rewards 1/3 + 0.1 and 1.6
    agents = [ep[0] for ep in episodes[1:]]
    assert all(trainable(s) for s in agents)
    assert agents[0].advantage < 0 < agents[1].advantage


def test_reward_takes_the_recipe_args_dict_too():
    # no config class: ctx.config is the recipe_args dict; defaults em 1, f1 0, format 0.1
    out = reward(RolloutContext(config={"f1_weight": 0.0}), _episode("blue cheese"))
    assert out == [pytest.approx(1.1), pytest.approx(1.0)]


def test_unknown_agent_is_an_error_naming_the_sample():
    s = Sample(agent="judge", group_id=2, metadata={"final_answer": None})
    with pytest.raises(ValueError, match=r"g2/e0/judge/t0.*unknown agent 'judge'"):
        _reward([s])


# ---- tag parsers -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("<think>who founded it?</think><search>founder of Kaadad Works</search>",
         Action("search", "founder of Kaadad Works")),
        ("<think>\nok\n</think>\n\n<answer> Ostmark </answer>", Action("answer", "Ostmark")),
        ("<read>[p017]</read>", Action("read", "p017")),
        ("I know it. <answer>1842</answer>\n", Action("answer", "1842")),
        # tags inside <think> are thoughts, not calls
        ("<think>maybe <answer>x</answer></think><search>y</search>", Action("search", "y")),
        ("The answer is Ostmark.", FormatError("no complete action tag")),
        ("<search>unclosed", FormatError("no complete action tag")),
        ("<think>hmm <answer>x</answer>", FormatError("<think> is never closed")),
        ("<search>a</search><answer>b</answer>", FormatError("2 action tags in one turn")),
        ("<answer>  </answer>", FormatError("empty <answer>")),
        ("<read>[]</read>", FormatError("empty <read>")),
        ("<search>a</read>", FormatError("no complete action tag")),  # mismatched tags
        # a turn of thousands of unclosed tags (the regular expression's quadratic case) is
        # read like any other, at once: its one closed tag is the action
        ("<search>" * 16000 + "<answer>42</answer>", Action("answer", "42")),
        ("<think>" * 16000 + "<answer>42</answer>", FormatError("<think> is never closed")),
    ],
)  # fmt: skip
def test_parse_action(text, expected):
    assert parse_action(text) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("<query>Kaadad Works</query>", SearcherTurn(queries=("Kaadad Works",))),
        ("<query>a</query> <query>b</query><query>a</query><query>c</query>",
         SearcherTurn(queries=("a", "b"))),  # duplicate dropped, then the first 2 kept
        ("<query>a</query><summary>Founded by X [c000].</summary>",
         SearcherTurn(summary="Founded by X [c000].")),  # a summary ends the search
        ("<think><query>a</query></think>nothing", FormatError("no <query> and no <summary>")),
        ("<query> </query>", FormatError("no <query> and no <summary>")),
        ("<summary></summary>", FormatError("empty <summary>")),
        # the first of many unclosed openings takes the rest as its query, as the pattern did
        ("<query>" * 16000 + "<query>x</query>",
         SearcherTurn(queries=("<query>" * 16000 + "x",))),
    ],
)  # fmt: skip
def test_parse_searcher_turn(text, expected):
    assert parse_searcher_turn(text, max_queries=2) == expected


# ---- config ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "field"),
    [
        ({"retriever_url": "127.0.0.1:8000"}, "retriever_url"),
        ({"topk": 0}, "topk"),
        ({"max_turns": 0}, "max_turns"),
        ({"searcher_max_turns": 0}, "searcher_max_turns"),
        ({"tool_role": "assistant"}, "tool_role"),
        ({"request_timeout_s": 0}, "request_timeout_s"),
        ({"retries": -1}, "retries"),
        ({"f1_weight": float("nan")}, "f1_weight"),
        ({"searcher_reward": "summary"}, "searcher_reward"),
    ],
)
def test_config_validate_names_the_field(args, field):
    with pytest.raises(ValueError, match=rf"recipe_args\.{field}"):
        RecipeConfig(**args).validate()
