"""The agents' prompts (rendered through each agent's chat template); edit freely when you copy
the recipe. The reward reads the functions by name from each reply's code (a fenced block, or
the whole reply)."""

from __future__ import annotations


def helper(problem: str, entry_point: str, helper_name: str) -> str:
    return (
        "You write one helper function in Python for the problem below. Another programmer "
        f"writes `{entry_point}` and can call your helper.\n\n{problem.strip()}\n\n"
        f"Reply with only the code of `def {helper_name}(...)`: no tests, no explanation. "
        "It must return a value."
    )


def main(problem: str, entry_point: str, helper_name: str) -> str:
    return (
        f"Complete the Python function `{entry_point}` below. A helper function "
        f"`{helper_name}` written by a teammate for this problem exists; call it where it "
        f"helps.\n\n{problem.strip()}\n\n"
        f"Reply with only the code of `def {entry_point}(...)`: no tests, no explanation."
    )


def coder(problem: str, entry_point: str) -> str:
    return (
        f"Complete the Python function `{entry_point}` below.\n\n{problem.strip()}\n\n"
        f"Reply with only the code of `def {entry_point}(...)`: no tests, no explanation."
    )


def feedback(status: str, passed: int, total: int, error: str | None) -> str:
    """What the single coder hears after a try that did not pass every check."""
    text = f"Your function did not pass the tests ({status}; {passed} of {total} checks passed)."
    if error:
        text += f"\nFirst error: {error}"
    return text + "\nFix it and reply with the whole corrected function only."
