"""One consultation: the doctor questions the patient, then diagnoses.

The doctor (``ctx.agents["doctor"]``) hears the chief complaint and asks one question per turn;
the patient (``ctx.agents["patient"]``), who alone sees the hidden case (complaint and
self-report facts, never the diagnosis), answers each question; the doctor ends with
``Diagnosis: ... Recommendation: ...`` or runs out of turns (``max_turns`` doctor turns); with
``final_turn_prefix`` its last allowed turn opens with that text (given, out of its loss).

Each agent keeps its OWN token-exact dialogue, built with its own handle (so its own tokenizer
and chat template: the two agents may be different model families). The other party's words
enter a dialogue as text in a user message, masked out of the loss; each agent trains only on
the tokens it sampled. When a dialogue runs out of context budget (``conv.truncated``) the
episode ends there, and the samples report it (status TRUNCATED, ``context_exhausted``).

Returns one sample per agent: the doctor's, and the patient's if it answered at least once
(``scripted_patient``: its answers are its self-report, a rule; it has no sample).
Both carry the dialogue in ``metadata`` (``doctor_turns``, ``answers``) for reward.py and the
hidden case as ``global_state`` (what a centralized critic reads, ``critic.centralized``); the
doctor's carries the episode metrics in ``metadata["metrics"]``.
"""

from __future__ import annotations

from kernel.dialogue import Dialogue
from kernel.hooks import RolloutContext
from kernel.sample import Sample
from recipes.takes_two import prompts
from recipes.takes_two.config import DOCTOR, PATIENT, as_config
from recipes.takes_two.data import Case
from recipes.takes_two.reward import asks_several, parse_final, questions_asked


def episode_metrics(
    doctor_turns: list[str], answers: list[str], max_turns: int, context_exhausted: bool
) -> dict[str, float]:
    """What one consultation looked like (the reward adds its terms later): ``questions`` counts
    the doctor's turns before its diagnosis, ``questions_asked`` those of its turns that ask
    the patient something (a '?', not the diagnosis)."""
    final = parse_final(doctor_turns[-1]) if doctor_turns else None
    questions = doctor_turns if final is None else doctor_turns[:-1]
    return {
        "turns": float(len(doctor_turns)),
        "questions": float(len(questions)),
        "questions_asked": float(questions_asked(doctor_turns)),
        "answered": float(len(answers)),
        "ended_with_diagnosis": float(final is not None),
        "final_well_formed": float(final is not None and final.well_formed),
        "multi_question_turns": float(sum(asks_several(q) for q in questions)),
        "hit_max_turns": float(final is None and len(doctor_turns) >= max_turns),
        "context_exhausted": float(context_exhausted),
    }


async def generate(ctx: RolloutContext, sample: Sample) -> list[Sample | None]:
    """The recipe's generate hook: one consultation seeded by ``sample`` (a case row)."""
    cfg = as_config(ctx.config)
    case = Case.from_sample(sample)
    if cfg.show_candidates and not case.candidates:
        raise ValueError(
            f"sample {sample.key}: recipe_args.show_candidates needs the row's 'candidates' "
            "(in data.metadata_keys)"
        )
    opening = prompts.doctor_opening(
        case.chief_complaint, case.candidates if cfg.show_candidates else ()
    )
    doctor = Dialogue(
        ctx.agents[DOCTOR], prompts.doctor_system(cfg.max_turns, cfg.min_questions), opening
    )
    patient = Dialogue(
        ctx.agents[PATIENT],
        prompts.patient_system(case.chief_complaint, case.facts, cfg.unknown_reply),
    )
    if not doctor.fits:
        raise ValueError(
            f"sample {sample.key}: the doctor's system prompt and chief complaint do not fit "
            f"max_context_len={doctor.conv.max_context_len}"
        )

    doctor_turns: list[str] = []
    answers: list[str] = []
    for turn in range(cfg.max_turns):
        last = turn == cfg.max_turns - 1
        text = await doctor.speak(prefix=cfg.final_turn_prefix if last else "")
        if text is None:
            break
        doctor_turns.append(text)
        if parse_final(text) is not None or last:
            break  # diagnosed, or out of turns: a last question goes unanswered
        if cfg.scripted_patient:  # every fact, whatever was asked (recipe_args)
            answer = " ".join(case.facts)
        else:
            if not patient.say("user", prompts.to_patient(text, cfg.max_quote_chars)):
                break
            answer = await patient.speak()
            if answer is None:
                break
        answers.append(answer)
        notice = cfg.last_turn_notice and turn + 1 == cfg.max_turns - 1
        message = prompts.to_doctor(answer, cfg.max_quote_chars, notice)
        if not doctor.say("user", message):
            break

    if not doctor_turns:
        raise ValueError(
            f"sample {sample.key}: the doctor could not speak within "
            f"max_context_len={doctor.conv.max_context_len}"
        )
    exhausted = doctor.conv.truncated or patient.conv.truncated
    # the hidden case, for a centralized critic (MAPPO: critic.centralized); the patient's own
    # prompt holds it already, the doctor's never does
    state = prompts.global_state(case.chief_complaint, case.facts)
    dialogue = {"doctor_turns": doctor_turns, "answers": answers, "global_state": state}
    metrics = episode_metrics(doctor_turns, answers, cfg.max_turns, exhausted)
    samples = [
        doctor.sample(sample, metrics=metrics, **dialogue),
        patient.sample(sample, **dialogue),
    ]
    return samples
