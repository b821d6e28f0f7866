"""takes_two's rewards: golden values of every term (arithmetic written out), the diagnosis
scorer against the synonym table (the lists and broader names the old fuzzy scorer paid in full,
hedges, every synonym, and real replies of a trained doctor), the required question, the two
tests that would have caught MrlX's reward bugs, the reward hook's bilateral result, the
config's checks and the learn preset's weights, and the optional judge against a real
OpenAI-compatible app served on 127.0.0.1 (and an unreachable port). The judge's failure against
the embedded engine is in test_takes_two_generate.py, next to the engines it needs."""

from __future__ import annotations

import asyncio
import base64
import logging
import threading
import time
from dataclasses import replace
from pathlib import Path
from urllib.parse import quote

import pytest
import uvicorn
import yaml
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from kernel.engine.launch import free_port
from kernel.hooks import RolloutContext
from kernel.rewards import assign_rewards
from kernel.sample import Sample
from recipes.takes_two import data
from recipes.takes_two.config import JudgeConfig, RecipeConfig, as_config
from recipes.takes_two.data import Case
from recipes.takes_two.reward import (
    Final,
    JudgeEndpoint,
    JudgeError,
    asks_question,
    asks_several,
    candidate_named,
    case_vocab,
    compliance_penalty,
    content_words,
    coverage,
    diagnosis_correct,
    diagnosis_score,
    doctor_reward,
    faithfulness,
    information_gains,
    information_score,
    judge_patient,
    leaks,
    parse_final,
    parse_judge_score,
    patient_rule_score,
    questions_asked,
    recommendation_score,
    revealed,
    reward,
    similarity,
    team_score,
)

CFG = RecipeConfig().validate()  # the defaults the goldens below use
CASE = Case(
    chief_complaint="I keep getting bad headaches.",
    facts=[
        "The headache is on one side of my head.",  # headache one side head
        "Bright light makes it worse.",  # bright light makes worse
        "I see flashing zigzag lines before it starts.",  # see flashing zigzag lines starts
        "The attacks started a week ago.",  # attacks started week ago
    ],
    diagnosis="migraine",
    recommendation="Rest in a dark quiet room and keep a diary.",
)
A1 = "It is on one side of my head."  # one side head: reveals fact 0 (3 of its 4 words)
A3 = "Bright light makes it worse and I see zigzag lines."  # fact 1 (4/4) and fact 2 (3/5)
FINAL = "Diagnosis: migraine\nRecommendation: rest in a dark quiet room, keep a diary"


# ---- text helpers ----------------------------------------------------------------------------


def test_content_words_drop_stop_words_punctuation_and_contraction_stubs():
    assert content_words("I've had a FEVER for three days, doctor!") == ["fever", "three", "days"]
    assert content_words("I'm not sure about that.") == []


def test_coverage_matches_words_fuzzily():
    # day~days: fuzz.ratio = 2*3/(3+4) = 85.7 >= 80; cough~coughing: 2*5/(5+8) = 76.9 < 80
    assert coverage(["day", "cough"], ["days", "coughing"], 80) == 1 / 2
    assert coverage([], ["days"], 80) is None


def test_similarity_uses_the_configured_rapidfuzz_metric():
    assert similarity("Migraine!", "migraine") == 1.0
    # token_set_ratio: one side's words a subset of the other's -> 100
    assert similarity("rest", CASE.recommendation, "token_set_ratio") == 1.0
    # token_sort_ratio: "rest" vs sorted "dark diary keep quiet rest room" (31 chars),
    # longest common subsequence 4: 2*4/(4+31)
    assert similarity("rest", CASE.recommendation, "token_sort_ratio") == pytest.approx(
        2 * 4 / (4 + 31)
    )
    # ratio: "asthmas" vs "asthma", common subsequence 6: 2*6/(7+6)
    assert similarity("asthmas", "asthma", "ratio") == pytest.approx(2 * 6 / (7 + 6))
    assert similarity("", "asthma") == 0.0


# ---- the doctor's final turn -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (FINAL, Final("migraine", "rest in a dark quiet room, keep a diary")),
        ("diagnosis：flu recommendation: rest", Final("flu", "rest")),  # full-width colon too
        ("Diagnosis: flu", Final("flu", "")),  # no recommendation: malformed
        ("Recommendation: rest. Diagnosis: flu", Final("flu", "")),  # misplaced: malformed
        ("Diagnosis: maybe flu? Diagnosis: cold\nRecommendation: tea", Final("cold", "tea")),
        ("Where does it hurt?", None),  # a question
    ],
)
def test_parse_final(text, expected):
    assert parse_final(text) == expected
    if expected is not None:
        assert expected.well_formed == bool(expected.diagnosis and expected.recommendation)


# ---- doctor terms ----------------------------------------------------------------------------


def test_diagnosis_and_recommendation_scores():
    final = parse_final(FINAL)
    assert diagnosis_correct(final, CASE) == 1.0
    assert diagnosis_correct(None, CASE) == 0.0  # never diagnosed
    assert diagnosis_correct(Final("", "rest"), CASE) == 0.0
    assert diagnosis_score(final, CASE.diagnosis, "token_set_ratio") == 1.0
    # "rest dark quiet room keep diary" == the truth's content words: 1.0
    assert recommendation_score(final, CASE.recommendation, "token_set_ratio") == 1.0
    assert diagnosis_score(None, CASE.diagnosis, "token_set_ratio") == 0.0  # never diagnosed
    assert recommendation_score(Final("migraine", ""), CASE.recommendation, "ratio") == 0.0


def _case(diagnosis: str, synonyms: tuple[str, ...] = ()) -> Case:
    return Case(CASE.chief_complaint, CASE.facts, diagnosis, CASE.recommendation, synonyms)


@pytest.mark.parametrize(
    ("stated", "truth"),
    [
        ("migraine, influenza, strep throat, asthma, gout", "migraine"),  # a list
        ("anemia", "iron deficiency anemia"),  # a broader name the table leaves out
        ("Diabetes", "type 2 diabetes"),
        ("conjunctivitis", "bacterial conjunctivitis"),
    ],
)
def test_gaming_diagnoses_the_fuzzy_scorer_paid_in_full_score_0(stated, truth):
    """The reviewer's cases: rapidfuzz's token_set_ratio (the old diagnosis term) gives a list
    of diagnoses, or a broader name, 1.0 against the truth; the synonym table gives 0."""
    final = parse_final(f"Diagnosis: {stated}\nRecommendation: rest")
    assert diagnosis_score(final, truth, "token_set_ratio") == 1.0  # the old scorer: gamed
    assert diagnosis_correct(final, _case(truth)) == 0.0


@pytest.mark.parametrize(
    "stated",
    [
        "possibly migraine",
        "Maybe a migraine.",
        "It could be migraine",
        "either migraine or tension headache",
        "migraine or influenza",
        "migraine / cluster headache",
        "not sure, migraine",
        "Differential: migraine",
        "likely migraine",
        "migraine?",
        "migraine (rule out a brain tumour)",
        "migraine migraine",
    ],
)
def test_a_hedged_or_listed_diagnosis_scores_0(stated):
    assert diagnosis_correct(parse_final(f"Diagnosis: {stated}"), CASE) == 0.0


@pytest.mark.parametrize("condition", data.CONDITIONS, ids=lambda c: c.diagnosis)
def test_a_single_correct_diagnosis_scores_1_by_every_synonym(condition):
    case = _case(condition.diagnosis)
    for name in condition.synonyms:
        for stated in (name, name.upper(), f"The {name}.", f" a {name}!", f"**{name}**"):
            final = parse_final(f"Diagnosis: {stated}\nRecommendation: rest")
            assert diagnosis_correct(final, case) == 1.0, stated
    # ... and no other condition's name
    for other in data.CONDITIONS:
        if other is not condition:
            final = parse_final(f"Diagnosis: {other.diagnosis}\nRecommendation: rest")
            assert diagnosis_correct(final, case) == 0.0, other.diagnosis


def test_the_table_decides_and_a_label_without_synonyms_is_refused():
    assert diagnosis_correct(Final("the flu", "rest"), _case("influenza")) == 1.0
    assert diagnosis_correct(Final("Type-2 diabetes", ""), _case("type 2 diabetes")) == 1.0
    assert diagnosis_correct(Final("kidney infection", ""), _case("acute pyelonephritis")) == 1.0
    assert diagnosis_correct(Final("kidney infection", ""), _case("kidney stone")) == 0.0
    assert diagnosis_correct(Final("UTI", ""), _case("acute pyelonephritis")) == 0.0
    # an MTMedDialog row gives its own label as its synonyms: an exact normalised match
    mt = _case("Tension headache", ("Tension headache",))
    assert diagnosis_correct(Final("tension headache.", ""), mt) == 1.0
    assert diagnosis_correct(Final("headache", ""), mt) == 0.0
    with pytest.raises(ValueError, match="'Tension headache' has no entry"):
        diagnosis_correct(Final("tension headache", ""), _case("Tension headache"))
    with pytest.raises(ValueError, match="'Tension headache' has no entry"):
        diagnosis_correct(None, _case("Tension headache"))  # refused, diagnosed or not


# Replies of a trained doctor, quoted in the main README's learning section (the learn preset,
# SmolLM2-135M co-trained 30 and 40 minutes; greedy on the held-out cases): its first turn was
# sympathy in all 128 cases, and its diagnoses "read like '75-year-old woman'".
TRAINED_FIRST_TURN = "I'm so sorry to hear about your personal experience..."
TRAINED_CLOSING = "Diagnosis: 75-year-old woman\nRecommendation: rest"


def test_real_replies_of_a_trained_doctor():
    assert not asks_question(TRAINED_FIRST_TURN)
    assert questions_asked([TRAINED_FIRST_TURN, TRAINED_CLOSING]) == 0
    assert diagnosis_correct(parse_final(TRAINED_CLOSING), CASE) == 0.0
    # under the learn preset: no question, so no diagnosis accepted, and the early penalty
    learn = _learn_config()
    total, terms = doctor_reward(CASE, [TRAINED_FIRST_TURN, TRAINED_CLOSING], [A1], learn)
    assert terms["compliance"] == -learn.early_diagnosis_penalty
    assert total == pytest.approx(learn.information_weight * 0.25 - learn.early_diagnosis_penalty)


def test_questions_are_turns_with_a_question_mark_that_are_not_the_diagnosis():
    assert asks_question("Which side of your head hurts?")
    assert not asks_question("Do you feel sick")  # the '?' is what counts
    assert not asks_question("Tell me more about it.")
    assert not asks_question("Diagnosis: migraine?\nRecommendation: rest")
    turns = ["Where?", "I'm sorry.", "Since when? And how bad?", FINAL]
    assert questions_asked(turns) == 2


def test_revealed_facts_need_half_of_their_words():
    # fact 0 "headache one side head": one, side, head found (headache~head: 2*4/12 = 66.7 < 80)
    # -> 3/4 >= 0.5; the chief complaint finds only headache~headaches (2*8/17 = 94): 1/4
    assert revealed(CASE.facts, A1, 80, 0.5) == {0}
    assert revealed(CASE.facts, CASE.chief_complaint, 80, 0.5) == set()
    # fact 1: 4/4; fact 2 "see flashing zigzag lines starts": see, zigzag, lines = 3/5
    assert revealed(CASE.facts, A3, 80, 0.5) == {1, 2}


def test_information_gain_counts_only_new_facts_per_answered_question():
    gains = information_gains(CASE.facts, CASE.chief_complaint, [A1, A1, A3], 80, 0.5)
    # A1 reveals fact 0 (1 of 4 facts), the repeat nothing new, A3 facts 1 and 2 (2 of 4)
    assert gains == [1 / 4, 0 / 4, 2 / 4]
    assert information_score(gains) == pytest.approx((0.25 + 0.0 + 0.5) / 3)
    assert information_score([]) == 0.0  # no question answered
    # a fact the chief complaint already states is known: repeating it gains nothing
    told = Case("It is on one side of my head.", CASE.facts, "migraine", "rest")
    assert information_gains(told.facts, told.chief_complaint, [A1], 80, 0.5) == [0.0]


def test_compliance_penalties():
    assert asks_several("Where? And since when?") and not asks_several("Where does it hurt?")
    ok = ["Where does it hurt?", FINAL]
    assert compliance_penalty(ok, CFG) == 0.0
    # two double-question turns (0.5 each) and no diagnosis (1.0)
    assert compliance_penalty(["Where? When?", "How? Why?"], CFG) == -(2 * 0.5 + 1.0)
    # a final turn without a recommendation: malformed (0.5)
    assert compliance_penalty(["Where?", "Diagnosis: migraine"], CFG) == -0.5
    assert compliance_penalty([], CFG) == -1.0  # never spoke: no diagnosis


def test_early_diagnosis_costs_only_below_min_questions():
    two = RecipeConfig(max_turns=4, min_questions=2, early_diagnosis_penalty=0.75).validate()
    assert compliance_penalty([FINAL], two) == -0.75  # no question asked
    assert compliance_penalty(["Where?", FINAL], two) == -0.75  # one of two
    assert compliance_penalty(["Where?", "Since when?", FINAL], two) == 0.0
    # a turn without a '?' asks nothing: it is not a question
    assert compliance_penalty(["Where?", "I am so sorry.", FINAL], two) == -0.75
    # a malformed early diagnosis pays both; running out of turns is the no-diagnosis penalty
    assert compliance_penalty(["Diagnosis: migraine"], two) == -(0.5 + 0.75)
    assert compliance_penalty(["Where?"], two) == -1.0
    assert compliance_penalty([FINAL], CFG) == 0.0  # the default (0) never charges it


def test_a_diagnosis_before_the_required_questions_is_not_accepted():
    one = RecipeConfig(max_turns=2, min_questions=1, early_diagnosis_penalty=2.0).validate()
    # asked: 1.0 (diagnosis) + 0.5 * 1.0 (recommendation) + 1.0 * 1/4 (information)
    total, terms = doctor_reward(CASE, ["Which side hurts?", FINAL], [A1], one)
    assert terms["diagnosis_correct"] == 1.0 and total == pytest.approx(1.0 + 0.5 + 0.25)
    # the same answer after sympathy: the closing turn earns nothing, the penalty is charged,
    # and the information the patient volunteered is still paid
    total, terms = doctor_reward(CASE, ["I'm so sorry to hear that.", FINAL], [A1], one)
    assert terms["diagnosis_correct"] == 1.0  # the skill metric, whatever the format
    assert total == pytest.approx(0.0 + 0.0 + 0.25 - 2.0)


def test_mrlx_precedence_bug_catcher_well_formed_final_is_not_penalised():
    """MrlX bug-catcher (operator precedence): MrlX's compliance reward tested
    ``if not diagnosis or recommendation`` -- i.e. ``(not diagnosis) or recommendation`` -- so a
    final turn WITH a recommendation took the -5 "no diagnosis" penalty, and one with a
    diagnosis but no recommendation took none. Here the well-formed final costs nothing, and
    only the missing part is penalised."""
    assert compliance_penalty(["Any fever?", FINAL], CFG) == 0.0
    assert compliance_penalty(["Any fever?", "Diagnosis: migraine"], CFG) == -CFG.malformed_penalty
    assert compliance_penalty(["Recommendation: rest"], CFG) == -CFG.no_diagnosis_penalty


def test_doctor_reward_golden():
    turns = ["Where?", "Which side?", "Anything else?", FINAL]
    total, terms = doctor_reward(CASE, turns, [A1, A1, A3], CFG)
    assert terms == {
        "diagnosis_correct": 1.0,
        "diagnosis_similarity": 1.0,
        "recommendation_similarity": 1.0,
        "information_gain": pytest.approx(0.75 / 3),
        "facts_revealed": pytest.approx(0.75),
        "compliance": 0.0,
    }
    # 1.0*1.0 (diagnosis) + 0.5*1.0 (recommendation) + 1.0*0.25 (information) - 0
    assert total == pytest.approx(1.0 * 1.0 + 0.5 * 1.0 + 1.0 * 0.25 - 0.0)
    # no diagnosis after two double questions: 0 + 0 + 1.0*(0.25+0)/2 - (2*0.5 + 1.0)
    total, _ = doctor_reward(CASE, ["Where? Why?", "Which side? When?"], [A1, A1], CFG)
    assert total == pytest.approx(0.25 / 2 - (2 * 0.5 + 1.0))


def test_candidate_named_tells_picking_from_the_list_apart_from_being_right():
    """Reported beside diagnosis_correct where the doctor is shown the candidates: naming one
    of them, right or wrong, is 1; none, several or no final turn 0; no candidates: None."""
    shown = replace(CASE, candidates=("migraine", "gout", "lumbar muscle strain"))
    named = lambda text: candidate_named(parse_final(text), shown)  # noqa: E731
    assert named(FINAL) == 1.0 and named("Diagnosis: Gout\nRecommendation: rest") == 1.0
    assert named("Diagnosis: migraine or gout\nRecommendation: rest") == 0.0  # several
    assert named("Diagnosis: influenza\nRecommendation: rest") == 0.0  # not a candidate
    assert named("Diagnosis: \nRecommendation: rest") == 0.0
    assert candidate_named(None, shown) == 0.0
    assert candidate_named(parse_final(FINAL), CASE) is None
    turns = ["Where?", "Diagnosis: gout\nRecommendation: rest"]
    _, terms = doctor_reward(shown, turns, [A1], CFG)
    assert terms["named_candidate"] == 1.0 and terms["diagnosis_correct"] == 0.0
    assert "named_candidate" not in doctor_reward(CASE, turns, [A1], CFG)[1]


# ---- patient terms ---------------------------------------------------------------------------


def test_faithfulness_is_the_share_of_words_grounded_in_the_case():
    vocab = case_vocab(CASE, CFG.unknown_reply)
    assert "migraine" not in vocab  # the case never contains its diagnosis
    # one side head (in fact 0) + rash arm (nowhere): 3/5
    assert faithfulness([A1, "I also have a rash on my arm."], vocab, 80) == 3 / 5
    assert faithfulness([A1, "I'm not sure about that."], vocab, 80) == 1.0  # the allowed reply
    assert faithfulness(["", "Yes."], vocab, 80) == 0.0  # nothing checkable earns nothing


def test_leaks_flag_the_hidden_diagnosis_but_not_the_patients_own_complaint():
    vocab = case_vocab(CASE, CFG.unknown_reply)
    assert leaks("Maybe it is a migraine?", CASE.diagnosis, vocab, 80, 0.5)
    assert not leaks(A1, CASE.diagnosis, vocab, 80, 0.5)
    own = Case("My migraines are back.", CASE.facts, "migraine", "rest")
    assert not leaks("My migraines hurt.", own.diagnosis, case_vocab(own, ""), 80, 0.5)
    # "acute appendicitis": half of its unseen words (appendicitis) named -> 1/2 >= 0.5
    assert leaks("Is it appendicitis?", "acute appendicitis", vocab, 80, 0.5)


def test_patient_rule_score_golden():
    total, terms = patient_rule_score(CASE, [A1, "I think it is a migraine."], CFG)
    # words one side head think migraine: 3 of 5 grounded; the second answer leaks
    assert terms == {"faithfulness": 3 / 5, "leaked": 1.0}
    assert total == pytest.approx(1.0 * 3 / 5 - 1.0 * 1.0)


def test_team_score_pays_the_facts_given_and_the_doctors_accepted_outcome():
    team = RecipeConfig(helpfulness_weight=1.0, outcome_weight=2.0, min_questions=1).validate()
    _, terms = doctor_reward(CASE, ["Where?", FINAL], [A3], team)  # facts 1 and 2 of 4, correct
    assert team_score(terms, accepted=1.0, cfg=team) == pytest.approx(1.0 * 2 / 4 + 2.0 * 1.0)
    # a diagnosis before the required question is not accepted: no outcome to share
    assert team_score(terms, accepted=0.0, cfg=team) == pytest.approx(1.0 * 2 / 4)
    _, wrong = doctor_reward(CASE, ["Where?", "Diagnosis: gout\nRecommendation: x"], [A3], team)
    assert team_score(wrong, accepted=1.0, cfg=team) == pytest.approx(1.0 * 2 / 4)
    assert team_score(terms, accepted=1.0, cfg=CFG) == 0.0  # off by default


# ---- the reward hook -------------------------------------------------------------------------


def _episode(doctor_turns: list[str], answers: list[str]) -> list[Sample]:
    meta = {
        "facts": CASE.facts,
        "doctor_turns": doctor_turns,
        "answers": answers,
    }
    label = {"diagnosis": CASE.diagnosis, "recommendation": CASE.recommendation}
    return [
        Sample(
            prompt=CASE.chief_complaint,
            label=label,
            agent=agent,
            group_id=1,
            metadata={**meta, **({"metrics": {}} if agent == "doctor" else {})},
        )
        for agent in ("doctor", "patient")
    ]


def test_mrlx_role_mixup_bug_catcher_rewards_go_to_the_right_agent():
    """MrlX bug-catcher (role mix-up): MrlX's doctor compliance reward counted '?' in the
    'user' messages of the doctor's dialogue -- the PATIENT's answers -- so a patient asking
    back was charged to the doctor, and a doctor asking several questions went free. Here the
    patient's questions cost the doctor nothing, the doctor's double question does, and the
    bilateral result lands on each agent's own sample."""
    chatty_patient = ["One side? Or both? It is on one side of my head.", A3]
    samples = _episode(["Where?", "Anything else?", FINAL], chatty_patient)
    result = asyncio.run(reward(RolloutContext(config=CFG), samples))
    assert samples[0].metadata["metrics"]["compliance"] == 0.0  # patient's '?' not counted
    assign_rewards(samples, result)
    doctor, patient = samples
    assert doctor.raw_reward == result["doctor"] and patient.raw_reward == result["patient"]
    # doctor: 1.0 + 0.5*1.0 + (1/4 + 2/4)/2. patient: answer 1 says one side both one side
    # head ("both" is not in the case: 5 of 6), answer 2 bright light makes worse see zigzag
    # lines (7 of 7): 12 of 13 grounded, no leak
    assert doctor.raw_reward == pytest.approx(1.0 + 0.5 + 0.75 / 2)
    assert patient.raw_reward == pytest.approx(12 / 13)

    samples = _episode(["Where? Since when?", "Anything else?", FINAL], [A1, A3])
    result = asyncio.run(reward(RolloutContext(config=CFG), samples))
    assert samples[0].metadata["metrics"]["compliance"] == -0.5  # the doctor's double question
    assert result["doctor"] == pytest.approx(1.0 + 0.5 + 0.75 / 2 - 0.5)


def test_reward_hook_metrics_correct_flag_and_no_patient_reward_without_answers():
    samples = _episode([FINAL], [])[:1]  # diagnosed at once: the patient never spoke
    result = asyncio.run(reward(RolloutContext(config=CFG), samples))
    assert result == {"doctor": pytest.approx(1.0 + 0.5), "patient": None}
    assert samples[0].metadata["correct"] is True  # migraine, by the synonym table
    assert samples[0].metadata["metrics"]["diagnosis_correct"] == 1.0
    # a list the fuzzy similarity scores 1.0: not correct, and not paid
    listed = "Diagnosis: migraine, influenza, gout\nRecommendation: rest in a dark quiet room"
    samples = _episode([listed], [])[:1]
    result = asyncio.run(reward(RolloutContext(config=CFG), samples))
    metrics = samples[0].metadata["metrics"]
    assert samples[0].metadata["correct"] is False and metrics["diagnosis_correct"] == 0.0
    assert metrics["diagnosis_similarity"] == 1.0  # reported only
    assert result["doctor"] == pytest.approx(0.0 + 0.5 * metrics["recommendation_similarity"])
    samples = _episode(["Diagnosis: tension headache\nRecommendation: rest"], [])[:1]
    asyncio.run(reward(RolloutContext(config=CFG), samples))
    assert samples[0].metadata["correct"] is False


def test_reward_hook_adds_the_team_terms_to_the_patient_only():
    team = RecipeConfig(helpfulness_weight=1.0, outcome_weight=2.0).validate()
    plain = asyncio.run(reward(RolloutContext(config=CFG), _episode(["Where?", FINAL], [A3])))
    shared = asyncio.run(reward(RolloutContext(config=team), _episode(["Where?", FINAL], [A3])))
    assert shared["doctor"] == pytest.approx(plain["doctor"])
    # A3 reveals facts 1 and 2 of 4; migraine is correct and no question was required
    assert shared["patient"] == pytest.approx(plain["patient"] + 1.0 * 2 / 4 + 2.0 * 1.0)


def test_reward_hook_refuses_a_label_without_synonyms_and_reads_a_rows_own():
    samples = _episode([FINAL], [])[:1]
    samples[0].label = {"diagnosis": "Tension headache", "recommendation": "Rest."}
    with pytest.raises(ValueError, match="'Tension headache' has no entry"):
        asyncio.run(reward(RolloutContext(config=CFG), samples))
    samples[0].label["synonyms"] = ["Tension headache", "tension-type headache"]
    samples[0].metadata["doctor_turns"] = ["Diagnosis: tension type headache\nRecommendation: x"]
    asyncio.run(reward(RolloutContext(config=CFG), samples))
    assert samples[0].metadata["correct"] is True


# ---- config ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "field"),
    [
        ({"max_turns": 0}, "max_turns"),
        ({"max_turns": 3, "min_questions": 3}, "min_questions"),
        ({"min_questions": -1}, "min_questions"),
        ({"similarity": "cosine"}, "similarity"),
        ({"reveal_threshold": 0}, "reveal_threshold"),
        ({"leak_penalty": -1}, "leak_penalty"),
        ({"diagnosis_weight": float("nan")}, "diagnosis_weight"),
        ({"judge": {"retries": -1}}, "judge.retries"),
        ({"judge": {"timeout_s": 0}}, "judge.timeout_s"),
    ],
)
def test_config_errors_name_the_field(args, field):
    with pytest.raises(ValueError, match=field.replace(".", r"\.")):
        RecipeConfig(**args).validate()


def _learn_config() -> RecipeConfig:
    preset = Path(__file__).resolve().parents[2] / "recipes/takes_two/presets/learn.yaml"
    return RecipeConfig(**yaml.safe_load(preset.read_text())["recipe_args"]).validate()


def test_learn_preset_requires_a_question_and_pays_mostly_for_the_diagnosis():
    learn = _learn_config()
    assert learn.min_questions >= 1 and learn.early_diagnosis_penalty > 0
    # the diagnosis outweighs everything else the doctor can earn
    assert learn.diagnosis_weight > learn.recommendation_weight + learn.information_weight
    question, wrong = "Which side hurts?", "Diagnosis: tension headache\nRecommendation: rest"
    asked_right, _ = doctor_reward(CASE, [question, FINAL], [A1], learn)
    asked_wrong, _ = doctor_reward(CASE, [question, wrong], [A1], learn)
    unasked_right, _ = doctor_reward(CASE, [TRAINED_FIRST_TURN, FINAL], [A1], learn)
    # 3.0 (diagnosis) + 0.25 * 1.0 (recommendation) + 0.5 * 1/4 (information)
    assert asked_right == pytest.approx(3.0 + 0.25 + 0.125)
    # "rest" is a subset of the true recommendation's words: token_set_ratio 1.0
    assert asked_wrong == pytest.approx(0.0 + 0.25 + 0.125)
    assert unasked_right == pytest.approx(0.125 - 2.0)
    assert asked_right > asked_wrong > unasked_right
    # the patient shares the team's result: the facts it gave and the accepted diagnosis
    assert learn.helpfulness_weight > 0 and learn.outcome_weight > 0


def test_config_from_recipe_args_dict():
    cfg = RecipeConfig(max_turns=3, judge={"retries": 0, "weight": 0.5}).validate()
    assert cfg.judge == JudgeConfig(retries=0, weight=0.5)
    # a run without a recipe_config path hands the hooks the recipe_args dict
    assert as_config({"max_turns": 3}) == RecipeConfig(max_turns=3)
    assert as_config(None) == RecipeConfig() and as_config(cfg) is cfg
    with pytest.raises(ValueError, match="max_turns"):
        as_config({"max_turns": -1})


# ---- the judge -------------------------------------------------------------------------------


def test_parse_judge_score():
    assert parse_judge_score("Faithful overall. Score: 7") == 0.7
    assert parse_judge_score("score = 10") == 1.0
    assert parse_judge_score("Score: 3 ... on reflection, Score: **4**") == 0.4  # the last
    for bad in ("Score: 11", "a faithful patient", "", None):
        with pytest.raises(JudgeError):
            parse_judge_score(bad)


def test_judge_endpoint_from_env():
    assert JudgeEndpoint.from_env({}) is None
    env = {"TANDEM_JUDGE_URL": "http://127.0.0.1:9/v1/", "TANDEM_JUDGE_MODEL": "m"}
    assert JudgeEndpoint.from_env(env) == JudgeEndpoint("http://127.0.0.1:9/v1", "m", None)


class _Judge:
    """A small OpenAI-compatible app on 127.0.0.1 that answers 'Score: 8', after failing the
    first ``fail_first`` requests with HTTP 500; it records what it was sent."""

    def __init__(self, fail_first: int = 0):
        self.requests: list[tuple[dict, str | None]] = []
        self.fail_first = fail_first
        app = FastAPI()

        @app.post("/v1/chat/completions")
        async def chat(request: Request):
            self.requests.append((await request.json(), request.headers.get("authorization")))
            if len(self.requests) <= self.fail_first:
                return JSONResponse({"error": {"message": "overloaded"}}, status_code=500)
            return {
                "id": "chatcmpl-1",
                "object": "chat.completion",
                "choices": [
                    {
                        "index": 0,
                        "message": {"role": "assistant", "content": "Score: 8"},
                        "finish_reason": "stop",
                    }
                ],
            }

        self.port = free_port()
        config = uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning")
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self) -> _Judge:
        self.thread.start()
        deadline = time.monotonic() + 20
        while not self.server.started:
            assert time.monotonic() < deadline, "judge app did not start"
            time.sleep(0.02)
        return self

    def __exit__(self, *exc) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"


def test_judge_success_after_a_retry_adds_its_weighted_score(monkeypatch):
    cfg = RecipeConfig(judge={"retries": 1, "backoff_s": 0.0, "weight": 0.5}).validate()
    with _Judge(fail_first=1) as judge:
        monkeypatch.setenv("TANDEM_JUDGE_URL", judge.url)
        monkeypatch.setenv("TANDEM_JUDGE_MODEL", "grader")
        monkeypatch.setenv("TANDEM_JUDGE_API_KEY", "secret")
        samples = _episode(["Where?", FINAL], [A1])
        result = asyncio.run(reward(RolloutContext(config=cfg), samples))
    assert len(judge.requests) == 2  # one HTTP 500, then the answer
    body, auth = judge.requests[-1]
    assert body["model"] == "grader" and auth == "Bearer secret"
    assert "Patient: It is on one side of my head." in body["messages"][1]["content"]
    metrics = samples[0].metadata["metrics"]
    assert metrics["judge_failed"] == 0.0 and metrics["judge_score"] == 0.8
    # rule: one side head all grounded (3/3), no leak -> 1.0; plus 0.5 * 8/10
    assert result["patient"] == pytest.approx(1.0 * 3 / 3 + 0.5 * 0.8)


def test_judge_direct_call_gives_up_after_its_retries():
    with _Judge(fail_first=5) as judge:
        endpoint = JudgeEndpoint(judge.url)
        cfg = JudgeConfig(retries=2, backoff_s=0.0)
        with pytest.raises(Exception, match="500"):
            asyncio.run(judge_patient(endpoint, cfg, [{"role": "user", "content": "hi"}]))
    assert len(judge.requests) == 3  # 1 + retries


def test_judge_unreachable_masks_the_patient_and_counts_it(monkeypatch):
    cfg = RecipeConfig(judge={"retries": 1, "backoff_s": 0.0, "timeout_s": 5}).validate()
    monkeypatch.setenv("TANDEM_JUDGE_URL", f"http://127.0.0.1:{free_port()}/v1")  # nobody there
    samples = _episode(["Where?", FINAL], [A1])
    result = asyncio.run(reward(RolloutContext(config=cfg), samples))
    assert result["patient"] is None  # masked, not a crash
    assert result["doctor"] == pytest.approx(1.0 + 0.5 + 0.25)  # the doctor is still scored
    assert samples[0].metadata["metrics"]["judge_failed"] == 1.0
    assert "ConnectError" in samples[0].metadata["judge_error"]
    assign_rewards(samples, result)
    assert samples[1].raw_reward is None


def _with_password(url: str, user: str = "ann", password: str = "pa ss@1") -> str:
    """``url`` with ``user:password@`` (percent-encoded) before its host."""
    return url.replace("http://", f"http://{user}:{quote(password, safe='')}@")


def test_judge_sends_the_api_key_even_when_the_url_has_a_password(monkeypatch):
    cfg = RecipeConfig(judge={"retries": 0}).validate()
    with _Judge() as judge:
        monkeypatch.setenv("TANDEM_JUDGE_URL", _with_password(judge.url))
        monkeypatch.setenv("TANDEM_JUDGE_API_KEY", "sk-key")
        result = asyncio.run(reward(RolloutContext(config=cfg), _episode(["Where?", FINAL], [A1])))
    assert [auth for _, auth in judge.requests] == ["Bearer sk-key"]  # not the URL's basic auth
    assert result["patient"] == pytest.approx(1.0 + 0.8)


def test_judge_url_password_is_basic_auth_without_an_api_key():
    with _Judge() as judge:
        endpoint = JudgeEndpoint(_with_password(judge.url))
        asyncio.run(
            judge_patient(endpoint, JudgeConfig(retries=0), [{"role": "user", "content": "hi"}])
        )
    token = base64.b64encode(b"ann:pa ss@1").decode()
    assert [auth for _, auth in judge.requests] == [f"Basic {token}"]


def test_judge_failure_log_and_error_hide_the_url_password(monkeypatch, caplog):
    cfg = RecipeConfig(judge={"retries": 0}).validate()
    with _Judge(fail_first=1) as judge:
        monkeypatch.setenv("TANDEM_JUDGE_URL", _with_password(judge.url, password="hunter2"))
        samples = _episode(["Where?", FINAL], [A1])
        with caplog.at_level(logging.WARNING, logger="recipes.takes_two.reward"):
            result = asyncio.run(reward(RolloutContext(config=cfg), samples))
    assert result["patient"] is None and len(judge.requests) == 1
    assert f"http://ann:***@127.0.0.1:{judge.port}/v1" in caplog.text
    assert "500" in samples[0].metadata["judge_error"]
    assert "hunter2" not in caplog.text + samples[0].metadata["judge_error"]
