"""Prompts of every role. Rendered through each agent's own chat template by the kernel's
token builder; edit freely when you copy the recipe."""

from __future__ import annotations

SOLVER_SYSTEM = "You are a careful mathematician. Think step by step, briefly."
ANSWER_FORMAT = "Put the final answer in \\boxed{}."


def solver(problem: str) -> str:
    return f"{problem}\n\n{ANSWER_FORMAT}"


def _listing(solutions: list[str], max_chars: int) -> str:
    return "\n\n".join(
        f"Solution {i}:\n{text[:max_chars].strip() or '(empty)'}"
        for i, text in enumerate(solutions, 1)
    )


def rewriter(problem: str, solutions: list[str], max_chars: int) -> str:
    return (
        f"Problem: {problem}\n\nCandidate solutions:\n\n{_listing(solutions, max_chars)}\n\n"
        f"Check them and write one correct solution. {ANSWER_FORMAT}"
    )


def selector(problem: str, solutions: list[str], max_chars: int) -> str:
    return (
        f"Problem: {problem}\n\nCandidate solutions:\n\n{_listing(solutions, max_chars)}\n\n"
        f"Which solution is correct? End with 'Judgment: N' where N is its number "
        f"(1 to {len(solutions)})."
    )


def verifier(problem: str, solution: str, max_chars: int) -> str:
    return (
        f"Problem: {problem}\n\nProposed solution:\n{solution[:max_chars].strip() or '(empty)'}"
        "\n\nIs the final answer correct? Start your reply with Yes or No."
    )


def revise(feedback: str, max_chars: int) -> str:
    return (
        f"A verifier rejected your solution:\n{feedback[:max_chars].strip()}\n\n"
        f"Revise it. {ANSWER_FORMAT}"
    )
