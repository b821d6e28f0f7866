"""Prompts of the doctor, the patient and the judge. Rendered through each agent's own chat
template by the kernel's token builder; edit freely when you copy the recipe (the reward only
relies on the doctor's final ``Diagnosis: ... Recommendation: ...`` lines)."""

from __future__ import annotations

from collections.abc import Sequence


def doctor_system(max_turns: int, min_questions: int = 0) -> str:
    first = ""
    if min_questions:
        first = f"Ask at least {min_questions} question{'s' if min_questions > 1 else ''} first. "
    return (
        "You are a doctor in a consultation. In each turn ask the patient exactly ONE short "
        f"question. {first}When you know enough, and at the latest in turn "
        f"{max_turns}, reply only with two lines:\n"
        "Diagnosis: <the one most likely condition>\n"
        "Recommendation: <the treatment or advice>"
    )


def doctor_opening(chief_complaint: str, candidates: Sequence[str] = ()) -> str:
    """The doctor's first message; with ``candidates``, the conditions the case is one of."""
    told = f"\n\n(The condition is one of: {', '.join(candidates)}.)" if candidates else ""
    return f"The patient says: {chief_complaint}{told}"


def to_doctor(answer: str, max_chars: int, last_turn: bool) -> str:
    """The patient's answer as the doctor's next user message."""
    text = answer[:max_chars].strip() or "(no answer)"
    if last_turn:
        text += "\n\n(This is your last turn: give your Diagnosis and Recommendation now.)"
    return text


def patient_system(chief_complaint: str, facts: Sequence[str], unknown_reply: str) -> str:
    """The hidden case: only the patient sees it. It never contains the diagnosis."""
    report = "\n".join(f"- {f}" for f in facts)
    return (
        "You are a patient talking to a doctor. Stay in character: you are the patient, not a "
        f"doctor.\nYou came in because: {chief_complaint}\n"
        f"What you know about your condition (your self-report):\n{report}\n\n"
        "Answer each question in one or two short sentences, using only the facts of your "
        f'self-report. If asked about anything not in it, say "{unknown_reply}" Never name or '
        "guess a diagnosis, and never give medical advice."
    )


def global_state(chief_complaint: str, facts: Sequence[str]) -> str:
    """The episode's hidden case as a centralized critic reads it (never shown to the doctor)."""
    report = "\n".join(f"- {f}" for f in facts)
    return f"Case. Complaint: {chief_complaint}\nFacts:\n{report}"


def to_patient(question: str, max_chars: int) -> str:
    """The doctor's question as the patient's next user message."""
    return question[:max_chars].strip() or "(silence)"


JUDGE_SYSTEM = (
    "You grade a simulated patient's answers for faithfulness to its hidden case. Faithful "
    "answers state only facts of the self-report (or say they are not sure), invent no symptoms, "
    "and never reveal or guess the diagnosis. Reply with one line: 'Score: N' where N is an "
    "integer from 0 (unfaithful) to 10 (fully faithful)."
)


def judge_user(
    chief_complaint: str,
    facts: Sequence[str],
    diagnosis: str,
    questions: Sequence[str],
    answers: Sequence[str],
) -> str:
    report = "\n".join(f"- {f}" for f in facts)
    dialogue = "\n".join(
        f"Doctor: {q.strip()}\nPatient: {a.strip()}"
        for q, a in zip(questions, answers, strict=False)
    )
    return (
        f"Chief complaint: {chief_complaint}\nSelf-report:\n{report}\n"
        f"Hidden diagnosis (must not be revealed): {diagnosis}\n\nDialogue:\n{dialogue}\n\n"
        "Score the patient's faithfulness."
    )
