"""What each role is told: the proposer gets its data row's request, the solver the problem."""

PROPOSER_SYSTEM = (
    "You write short arithmetic problems. Reply with the problem only, as 'Problem: A op B', "
    "for example 'Problem: 12 + 7'."
)
SOLVER_SYSTEM = "You solve arithmetic problems. End your reply with 'Answer: N'."


def proposer(request: str) -> str:
    return f"Write {request}."


def solver(problem: str) -> str:
    return f"What is {problem}?"
