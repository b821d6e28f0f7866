"""takes_two's generate against TWO real embedded servers serving two DIFFERENT tiny models
(Qwen2 doctor, Llama patient): each agent's sample holds only its own sampled tokens in its
loss mask, the hidden case stays hidden from the doctor, episodes end at a diagnosis or at
max_turns, an exhausted context ends the episode cleanly; and the judge failing against the
embedded engine's /v1/chat/completions (a tiny model's reply never parses) masks the patient."""

from __future__ import annotations

import asyncio
from dataclasses import replace

import pytest

from kernel.engine.client import EngineClient
from kernel.engine.launch import free_port, launch_server
from kernel.engine.settings import ServerConfig
from kernel.hooks import RolloutContext
from kernel.models import load_tokenizer
from kernel.run.agents import AgentHandle
from kernel.sample import Sample, Status
from recipes.takes_two import prompts
from recipes.takes_two.config import RecipeConfig
from recipes.takes_two.generate import episode_metrics, generate
from recipes.takes_two.reward import reward

FACTS = ["The headache is on one side of my head.", "Bright light makes it worse."]
LABEL = {"diagnosis": "migraine", "recommendation": "Rest in a dark quiet room."}
COMPLAINT = "I am a 40-year-old woman. I keep getting bad headaches."


@pytest.fixture(scope="module")
def engines(tiny_model_dir, tiny_llama_dir, tmp_path_factory):
    """(doctor URL, patient URL, doctor tokenizer, patient tokenizer): two servers, started
    together."""
    logs = tmp_path_factory.mktemp("takes_two_logs")
    procs = []
    try:
        for name, model in (("doctor", tiny_model_dir), ("patient", tiny_llama_dir)):
            config = ServerConfig(model=str(model), port=free_port(), num_threads=1)
            procs.append(launch_server(config, logs / f"{name}.log"))
        for p in procs:
            p.wait_healthy(deadline_s=180)
        yield (
            procs[0].url,
            procs[1].url,
            load_tokenizer(str(tiny_model_dir)),
            load_tokenizer(str(tiny_llama_dir)),
        )
    finally:
        for p in procs:
            p.stop()


def _handle(name, url, tok, max_context_len=768, max_response_len=16) -> AgentHandle:
    return AgentHandle(
        name, [EngineClient(url)], tok, {"temperature": 1.0}, max_response_len, max_context_len
    )


def _seed() -> Sample:
    meta = {"row": 2, "facts": FACTS}
    return Sample(prompt=COMPLAINT, label=dict(LABEL), group_id=5, index=1, metadata=meta)


def _run(ctx: RolloutContext, seed: Sample | None = None) -> list[Sample]:
    async def go():
        try:
            return await generate(ctx, seed or _seed())
        finally:
            for agent in ctx.agents.values():
                for c in agent.clients:
                    if isinstance(c, EngineClient):  # a scripted doctor has none
                        await c.aclose()

    return asyncio.run(go())


def test_episode_metrics_golden():
    turns = ["Where? When?", "Any fever?", "Diagnosis: flu"]
    m = episode_metrics(turns, ["Here.", "No."], 4, False)
    assert m == {
        "turns": 3.0,
        "questions": 2.0,
        "questions_asked": 2.0,
        "answered": 2.0,
        "ended_with_diagnosis": 1.0,
        "final_well_formed": 0.0,  # no recommendation
        "multi_question_turns": 1.0,
        "hit_max_turns": 0.0,
        "context_exhausted": 0.0,
    }
    assert episode_metrics(["A?", "B?"], ["a"], 2, True)["hit_max_turns"] == 1.0
    # sympathy asks nothing: a turn before the diagnosis, but no question
    m = episode_metrics(["I'm so sorry to hear that.", "Diagnosis: flu"], ["Yes."], 2, False)
    assert (m["questions"], m["questions_asked"]) == (1.0, 0.0)


def test_two_models_each_train_only_on_their_own_tokens(engines, loss_spans):
    d_url, p_url, d_tok, p_tok = engines
    ctx = RolloutContext(
        agents={
            "doctor": _handle("doctor", d_url, d_tok),
            "patient": _handle("patient", p_url, p_tok),
        },
        config=RecipeConfig(max_turns=3, min_questions=1).validate(),
    )
    samples = _run(ctx)
    assert [s.agent for s in samples] == ["doctor", "patient"]
    doctor, patient = samples
    turns, answers = doctor.metadata["doctor_turns"], doctor.metadata["answers"]
    # random tiny models never write "Diagnosis:": the episode runs to max_turns; the doctor's
    # last question goes unanswered
    assert len(turns) == 3 and len(answers) == 2
    assert doctor.metadata["metrics"] == episode_metrics(turns, answers, 3, False)
    assert doctor.metadata["metrics"]["hit_max_turns"] == 1.0
    for s, tok, own in ((doctor, d_tok, turns), (patient, p_tok, answers)):
        s.validate()
        assert s.status in (Status.COMPLETED, Status.TRUNCATED)
        assert (s.group_id, s.index, s.metadata["row"], s.metadata["role"]) == (5, 1, 2, s.agent)
        # one run of mask-1 tokens per own turn, decoding to exactly that turn's text
        spans = loss_spans(s)
        assert [tok.decode(span, skip_special_tokens=True) for span in spans] == own
        assert sum(s.loss_mask) == sum(map(len, spans))
        assert len(s.rollout_logprobs) == s.response_length
        assert all(lp < 0 for lp, m in zip(s.rollout_logprobs, s.loss_mask, strict=True) if m)
        assert all(lp == 0 for lp, m in zip(s.rollout_logprobs, s.loss_mask, strict=True) if not m)
    # the partner's words are in each dialogue, masked out
    doctor_dialogue = d_tok.decode(doctor.prompt_ids + doctor.response_ids)
    patient_dialogue = p_tok.decode(patient.prompt_ids + patient.response_ids)
    assert all(prompts.to_patient(q, 400) in patient_dialogue for q in turns[:2])
    assert all(a.strip() in doctor_dialogue for a in answers if a.strip())
    # the hidden case: the patient sees its facts, the doctor only the complaint
    assert all(f in patient_dialogue for f in FACTS) and COMPLAINT in doctor_dialogue
    assert not any(f in doctor_dialogue for f in FACTS)
    # ... and both samples carry it for a centralized critic (critic.centralized)
    for s in samples:
        assert all(f in s.metadata["global_state"] for f in FACTS)
    assert LABEL["diagnosis"] not in patient_dialogue + doctor_dialogue
    # the last-turn notice reached the doctor with the patient's second answer
    assert "This is your last turn" in doctor_dialogue
    # min_questions reaches the doctor's system prompt
    assert "Ask at least 1 question first." in doctor_dialogue


def test_final_turn_prefix_opens_the_last_turn_out_of_the_loss(engines, loss_spans):
    """A random tiny doctor never writes 'Diagnosis:' itself; with final_turn_prefix its last
    allowed turn opens with it (given, masked), so the episode ends with a diagnosis, and only
    the sampled rest of that turn is trained on. Earlier turns get no prefix."""
    d_url, p_url, d_tok, p_tok = engines
    ctx = RolloutContext(
        agents={
            "doctor": _handle("doctor", d_url, d_tok),
            "patient": _handle("patient", p_url, p_tok),
        },
        config=RecipeConfig(
            max_turns=2, min_questions=1, final_turn_prefix="Diagnosis:"
        ).validate(),
    )
    doctor = _run(ctx)[0]
    turns = doctor.metadata["doctor_turns"]
    assert len(turns) == 2 and turns[-1].startswith("Diagnosis:")
    assert doctor.metadata["metrics"]["ended_with_diagnosis"] == 1.0
    sampled = [d_tok.decode(span, skip_special_tokens=True) for span in loss_spans(doctor)]
    assert sampled == [turns[0], turns[1].removeprefix("Diagnosis:")]
    prefix_ids = d_tok("Diagnosis:", add_special_tokens=False)["input_ids"]
    dialogue = doctor.prompt_ids + doctor.response_ids
    assert any(dialogue[i : i + len(prefix_ids)] == prefix_ids for i in range(len(dialogue)))
    with pytest.raises(ValueError, match="final_turn_prefix"):
        RecipeConfig(final_turn_prefix="  ").validate()


def test_episode_ends_at_the_diagnosis_and_is_rewarded(engines, scripted_agent, loss_spans):
    """Random tiny models never diagnose: the doctor's turns are scripted (real tokenizer and
    dialogue), the patient stays a real engine."""
    _, p_url, d_tok, p_tok = engines
    final = "Diagnosis: migraine\nRecommendation: rest in a dark quiet room"
    script = ["Which side of your head hurts?", final, "never asked"]
    doctor = scripted_agent("doctor", d_tok, script, version="3")
    ctx = RolloutContext(
        agents={"doctor": doctor, "patient": _handle("patient", p_url, p_tok)},
        config=RecipeConfig(max_turns=4).validate(),
    )
    samples = _run(ctx)
    d, p = samples
    assert d.metadata["doctor_turns"] == ["Which side of your head hurts?", final]
    assert len(d.metadata["answers"]) == 1 and doctor.script == ["never asked"]
    m = d.metadata["metrics"]
    assert (m["turns"], m["questions"], m["answered"]) == (2.0, 1.0, 1.0)
    assert m["ended_with_diagnosis"] == 1.0 and m["final_well_formed"] == 1.0
    assert m["hit_max_turns"] == 0.0 and d.status is Status.COMPLETED
    assert [d_tok.decode(s, skip_special_tokens=True) for s in loss_spans(d)] == d.metadata[
        "doctor_turns"
    ]
    assert d.weight_versions == [3, 3]
    result = asyncio.run(reward(ctx, samples))
    # diagnosis and recommendation match exactly: 1.0 + 0.5*1.0; whatever the random patient
    # said, information is >= 0 and compliance 0
    assert result["doctor"] >= 1.5 and m["compliance"] == 0.0
    assert result["patient"] is not None and d.metadata["correct"] is True
    assert p.metadata["correct"] is True


def test_the_doctor_is_told_the_candidate_conditions_when_asked(engines, scripted_agent):
    """show_candidates: the row's candidates are in the doctor's opening (context, not trained
    on); without the row's candidates the episode fails naming the sample and the setting."""
    _, p_url, d_tok, p_tok = engines
    final = "Diagnosis: migraine\nRecommendation: rest"
    seed = _seed()
    seed.metadata["candidates"] = ["migraine", "gout", "lumbar muscle strain"]

    def ctx(show: bool) -> RolloutContext:
        doctor = scripted_agent("doctor", d_tok, ["Which side hurts?", final])
        return RolloutContext(
            agents={"doctor": doctor, "patient": _handle("patient", p_url, p_tok)},
            config=RecipeConfig(max_turns=2, show_candidates=show).validate(),
        )

    told = "(The condition is one of: migraine, gout, lumbar muscle strain.)"
    d = _run(ctx(True), seed)[0]
    assert told in d_tok.decode(d.prompt_ids)
    d = _run(ctx(False), seed)[0]
    assert told not in d_tok.decode(d.prompt_ids)
    with pytest.raises(ValueError, match=r"g5/e1/default/t0: recipe_args.show_candidates needs"):
        _run(ctx(True))  # a seed without candidates


def test_a_scripted_patient_answers_with_every_fact_and_has_no_sample(engines, scripted_agent):
    """recipe_args.scripted_patient: the doctor's question is answered with the whole
    self-report word for word (a rule; the tiny random patient could not have said it), so
    every fact is revealed; the patient has no sample (it trains nothing), the doctor is
    rewarded as usual."""
    _, p_url, d_tok, p_tok = engines
    final = "Diagnosis: migraine\nRecommendation: rest in a dark quiet room"
    doctor = scripted_agent("doctor", d_tok, ["How are you?", final])
    patient = _handle("patient", p_url, p_tok)
    ctx = RolloutContext(
        agents={"doctor": doctor, "patient": patient},
        config=RecipeConfig(max_turns=2, scripted_patient=True).validate(),
    )
    samples = _run(ctx)
    d, p = samples
    assert p is None and d.metadata["answers"] == [" ".join(FACTS)]
    assert " ".join(FACTS) in d_tok.decode(d.prompt_ids + d.response_ids)
    result = asyncio.run(reward(ctx, [d]))  # the kernel passes the samples that exist
    assert d.metadata["metrics"]["facts_revealed"] == 1.0 and d.metadata["correct"] is True
    assert result["doctor"] >= 1.5


def test_exhausted_context_ends_the_episode_cleanly(engines):
    d_url, p_url, d_tok, p_tok = engines
    system = prompts.patient_system(COMPLAINT, FACTS, RecipeConfig().unknown_reply)
    patient = _handle("patient", p_url, p_tok)
    budget = len(patient.conversation(system=system).ids) + 40  # about one exchange
    ctx = RolloutContext(
        agents={
            "doctor": _handle("doctor", d_url, d_tok),
            "patient": replace(patient, max_context_len=budget),
        },
        config=RecipeConfig(max_turns=6, max_quote_chars=60).validate(),
    )
    samples = _run(ctx)
    d = samples[0]
    assert d.metadata["metrics"]["context_exhausted"] == 1.0
    assert len(d.metadata["doctor_turns"]) < 6  # stopped early, not at max_turns
    for s in samples:
        s.validate()
    if len(samples) == 2:  # the patient answered before its budget ran out
        assert samples[1].status is Status.TRUNCATED
        assert len(samples[1].prompt_ids) + samples[1].response_length <= budget


def test_a_doctor_prompt_that_does_not_fit_fails_naming_the_sample(engines):
    d_url, p_url, d_tok, p_tok = engines
    ctx = RolloutContext(
        agents={
            "doctor": _handle("doctor", d_url, d_tok, max_context_len=20),
            "patient": _handle("patient", p_url, p_tok),
        },
        config=RecipeConfig().validate(),
    )
    with pytest.raises(ValueError, match=r"g5/e1/default/t0.*max_context_len=20"):
        _run(ctx)


def test_judge_reply_that_does_not_parse_masks_the_patient(engines, monkeypatch):
    d_url, _, _, _ = engines
    # the embedded engine's OpenAI endpoint is real; its tiny model answers noise, no "Score: N"
    monkeypatch.setenv("TANDEM_JUDGE_URL", f"{d_url}/v1")
    cfg = RecipeConfig(judge={"retries": 1, "backoff_s": 0.0, "max_tokens": 8}).validate()
    samples = [
        Sample(
            prompt=COMPLAINT,
            label=dict(LABEL),
            agent=agent,
            metadata={
                "facts": FACTS,
                "doctor_turns": ["Which side?", "Diagnosis: migraine\nRecommendation: rest"],
                "answers": ["One side of my head."],
                **({"metrics": {}} if agent == "doctor" else {}),
            },
        )
        for agent in ("doctor", "patient")
    ]
    result = asyncio.run(reward(RolloutContext(config=cfg), samples))
    assert result["patient"] is None and result["doctor"] is not None
    assert samples[0].metadata["metrics"]["judge_failed"] == 1.0
    assert "JudgeError" in samples[0].metadata["judge_error"]


@pytest.mark.slow
def test_the_mappo_preset_trains_a_centralized_critic_per_agent(tmp_path):
    """recipes/takes_two/presets/mappo.yaml for one step, on the tiny models of two families
    instead of SmolLM2: each agent's model gets its own critic, which reads the hidden case."""
    from pathlib import Path

    from kernel.cli import train_config
    from kernel.run.loop import train

    preset = Path(__file__).resolve().parents[2] / "recipes/takes_two/presets/mappo.yaml"
    agents = '[{"name": "doctor"}, {"name": "patient", "model": "tiny-smollm2-llama"}]'
    flags = [f"--output_dir={tmp_path}", "--model=tiny-smollm2", f"--agents={agents}"]
    flags += ["--num_steps=1", "--eval.every=0", "--engine.num_threads=1"]
    cfg = train_config([f"--config={preset}", *flags])
    assert cfg.critic.centralized and cfg.advantage.estimator == "gae"
    (row,) = train(cfg)
    for agent in ("doctor", "patient"):
        assert row[f"train/{agent}/critic/n_updates"] == 1.0
        assert row[f"train/{agent}/critic/value_mean"] == 0.0  # the zero-initialised head
