"""The debaters' and the judge's prompts (rendered through each agent's chat template); edit
freely when you copy the recipe. The reward reads an answer from ``Answer: X`` (the last one,
one number, not hedged), else from the one number of a marker-less turn's last sentence."""

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


# ---- PRO/CON debate (style: procon) ---------------------------------------------------------


def procon_system(name: str, side: str, rounds: int) -> str:
    stance = "FOR" if side == "PRO" else "AGAINST"
    rebuttals = (
        " After your opening you will read your opponent's speech: answer its arguments."
        if rounds > 1
        else ""
    )
    return (
        f"You are {name}, in a debate. You argue {stance} the motion ({side}), whatever you "
        "believe. Give clear reasons and evidence (facts, numbers, examples) in a short speech "
        f"of a few sentences.{rebuttals} End with the line 'Position: {side}'."
    )


def procon_rebut(speech: str, max_chars: int) -> str:
    return (
        f"Your opponent said:\n\n{speech[:max_chars].strip()}\n\n"
        "Answer their arguments and strengthen your case."
    )


def procon_judge_system() -> str:
    return (
        "You judge a debate. Score each side from 0 to 10 on argument quality, on evidence, and "
        "on consistency with the side it was assigned. Reply with exactly two lines:\n"
        "PRO: quality=Q, evidence=E, consistency=C\nCON: quality=Q, evidence=E, consistency=C"
    )


def procon_judge_view(motion: str, speeches: Mapping[str, str], max_chars: int) -> str:
    said = "\n\n".join(f"{side}: {text[:max_chars].strip()}" for side, text in speeches.items())
    return f"Motion: {motion}\n\nLast speeches:\n\n{said}"
