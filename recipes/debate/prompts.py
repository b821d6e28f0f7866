"""The debaters' and the judge's prompts (rendered through each agent's chat template); edit
freely when you copy the recipe. The reward reads an answer from ``Answer: X`` (the last one),
else from the last number of the turn."""

from __future__ import annotations

from collections.abc import Mapping


def debater_system(name: str, others: list[str], rounds: int) -> str:
    if not others:  # one agent answering alone: the single-agent baseline of a debate
        return (
            f"You are {name}, solving a math question. Answer briefly and end with "
            "'Answer: <number>'."
        )
    return (
        f"You are {name}, one of {len(others) + 1} people solving a math question together with "
        f"{', '.join(others)}. Answer briefly and end with 'Answer: <number>'."
        + (
            " After each answer you will see the others' answers: check them and answer again, "
            "changing your answer only if you find your mistake."
            if rounds > 1
            else ""
        )
    )


def others_said(answers: Mapping[str, str], max_chars: int) -> str:
    said = "\n\n".join(f"{name}: {text[:max_chars].strip()}" for name, text in answers.items())
    return f"The others answered:\n\n{said}\n\nCheck their reasoning and give your answer again."


def judge_system() -> str:
    return (
        "You judge a debate about a math question. Read the question and the final answers, "
        "decide which answer is right, and reply with one line: 'Answer: <number>'."
    )


def judge_view(question: str, finals: Mapping[str, str], max_chars: int) -> str:
    said = "\n\n".join(f"{name}: {text[:max_chars].strip()}" for name, text in finals.items())
    return f"Question: {question}\n\nFinal answers:\n\n{said}"
