"""The episode of one math problem, played by roles that share one model.

``solver_rewriter_selector`` (Miles' multi-agent example, done right): ``num_parallel`` solvers
answer independently; ``num_parallel`` rewriters each see all the solutions and write an
improved one; one selector reads the rewritten solutions and answers ``Judgment: N`` (its reply
may open with a given ``selector_prefix``, out of its loss). The
selected rewrite's answer is the episode's answer: ``metadata["correct"]`` on every sample
says whether it was right, which drives the kernel's asymmetric outcome weighting.

``solver_selector`` (best of ``num_parallel`` with a trained selector): the solvers answer
independently and the selector reads their solutions, not rewrites, and picks one the same
way; its pick's answer is the episode's answer.

``solver_verifier`` (Dr.MAS math): the solver proposes; the verifier's reply opens with its
verdict, Yes (approve) or No (reject), and explains; on reject the solver revises in the same
dialogue, reading the verifier's reply, until approval or ``max_loops``. A reply that opens
otherwise is a format failure, never an approval; a selector's judgment naming two rewrites is
no pick. The final solution's answer is the episode's answer.

``solver`` (the single-agent baseline, and what a learning run on a small budget trains):
``num_parallel`` solvers answer independently; each is the episode's answer for its own sample
(``metadata["correct"]``), the episode is solved if any is right.

Every role keeps its own token-exact dialogue (``ctx.agents[role].conversation()``): the
solutions quoted to other roles enter their prompts as text, masked out of their loss, and each
role trains only on the tokens it sampled. The per-sample rewards are computed by reward.py
from what this function records in ``metadata``.
"""

from __future__ import annotations

import asyncio
import re

from kernel.dialogue import Dialogue
from kernel.hooks import RolloutContext
from kernel.sample import Sample
from recipes.math_solver_verifier import prompts
from recipes.math_solver_verifier.config import as_config
from recipes.math_solver_verifier.reward import final_answer, is_equivalent

JUDGMENT = re.compile(r"judgment\s*:\s*\**\s*(\d+)", re.IGNORECASE)
VERDICT = re.compile(r"\W*(yes|no)\b", re.IGNORECASE)  # the reply's first word


def parse_judgment(text: str, n: int) -> int | None:
    """0-based index of the 'Judgment: N' stated, 1 <= N <= n (repeating it is allowed); None
    if there is none, or two different picks: a list would pass for a pick."""
    picks = {int(k) for k in JUDGMENT.findall(text)}
    k = picks.pop() if len(picks) == 1 else 0
    return k - 1 if 1 <= k <= n else None


def parse_verdict(text: str) -> bool | None:
    """True (approve) if the reply's first word is Yes, False (reject) if No, None if it opens
    otherwise. Only the first word counts, so no reply states both: a verifier paid on its
    last stated 'Verdict: approve|reject' learned to write both (347 of 448 held-out turns)."""
    first = VERDICT.match(text)
    return None if first is None else first.group(1).lower() == "yes"


def srs_metrics(
    n: int, pick: int | None, offered: list[bool], solver_correct: list[bool], rewritten: bool
) -> dict[str, float | None]:
    """Episode metrics of solver_rewriter_selector (``rewritten``) and solver_selector: the
    selector was offered ``n`` solutions, right or not as ``offered`` says (None: not
    applicable, not averaged)."""
    solved = pick is not None and offered[pick]
    metrics = {
        "turns": float(2 * n + 1 if rewritten else n + 1),
        "selector_format_ok": float(pick is not None),
        # picked a correct answer when one existed; undefined when none did
        "selector_accuracy": float(solved) if any(offered) else None,
        "solver_pass@k": float(any(solver_correct)),
        # each solver's (and each rewriter's) own answer: the workflow against its parts
        "solver_accuracy": sum(solver_correct) / len(solver_correct),
        "solved": float(solved),
    }
    if rewritten:
        metrics["rewrite_accuracy"] = sum(offered) / len(offered)
    return metrics


def verifier_metrics(
    verdicts: list[bool | None], correct: bool, max_loops: int
) -> dict[str, float | None]:
    """Episode metrics of solver_verifier."""
    approved = bool(verdicts) and verdicts[-1] is True
    return {
        "turns": float(2 * len(verdicts)),
        "early_termination": float(approved and len(verdicts) < max_loops),
        "verifier_format_ok": (
            sum(v is not None for v in verdicts) / len(verdicts) if verdicts else None
        ),
        "approved_correct": float(correct) if approved else None,
        "solved": float(correct),
    }


def _solver(ctx: RolloutContext, problem: str) -> Dialogue:
    return Dialogue(ctx.agents["solver"], prompts.SOLVER_SYSTEM, prompts.solver(problem))


async def _speak_all(dialogues: list[Dialogue]) -> list[str]:
    """Each dialogue's next turn, sampled together; its text ("" if it never had room)."""
    await asyncio.gather(*(d.speak() for d in dialogues))
    return [d.text for d in dialogues]


def _answer(text: str, label, cfg) -> str | None:
    return final_answer(text, str(label), cfg.answer)


def _correct(answer: str | None, label, cfg) -> bool:
    a = cfg.answer
    return is_equivalent(answer, str(label), timeout_s=a.timeout_s, max_chars=a.max_answer_chars)


async def solver_rewriter_selector(ctx: RolloutContext, seed: Sample) -> list[Sample | None]:
    return await _selected(ctx, seed, rewrite=True)


async def solver_selector(ctx: RolloutContext, seed: Sample) -> list[Sample | None]:
    return await _selected(ctx, seed, rewrite=False)


async def _selected(ctx: RolloutContext, seed: Sample, rewrite: bool) -> list[Sample | None]:
    """num_parallel solvers, num_parallel rewriters if ``rewrite``, and the selector picking
    one of the last solutions written."""
    cfg = as_config(ctx.config)
    problem, n = str(seed.prompt), cfg.num_parallel

    solvers = [_solver(ctx, problem) for _ in range(n)]
    candidates = await _speak_all(solvers)
    rewriters = []
    if rewrite:
        listing = prompts.rewriter(problem, candidates, cfg.max_solution_chars)
        rewriters = [Dialogue(ctx.agents["rewriter"], first=listing) for _ in range(n)]
        candidates = await _speak_all(rewriters)
    selection = prompts.selector(problem, candidates, cfg.max_solution_chars)
    selector = Dialogue(ctx.agents["selector"], first=selection)
    await selector.speak(prefix=cfg.selector_prefix)
    pick = parse_judgment(selector.text, n)

    answers = [_answer(t.text, seed.label, cfg) for t in solvers + rewriters]
    graded = [_correct(a, seed.label, cfg) for a in answers]
    solver_correct, offered_correct = graded[:n], graded[-n:]
    correct = pick is not None and offered_correct[pick]
    metrics = srs_metrics(n, pick, offered_correct, solver_correct, rewritten=rewrite)
    # the parallel attempts of a role are numbered as its turns (0..n-1)
    samples = [
        t.sample(seed, i % n, answer=a, correct=correct)
        for i, (t, a) in enumerate(zip(solvers + rewriters, answers, strict=True))
    ]
    samples.append(selector.sample(seed, 0, picked=pick, correct=correct, metrics=metrics))
    return samples


async def solver_verifier(ctx: RolloutContext, seed: Sample) -> list[Sample | None]:
    cfg, problem = as_config(ctx.config), str(seed.prompt)
    solver = _solver(ctx, problem)
    verifier: Dialogue | None = None
    verdicts: list[bool | None] = []
    for loop in range(cfg.max_loops):
        if loop == 0 or solver.say("user", prompts.revise(verifier.text, cfg.max_solution_chars)):
            await solver.speak()
        if solver.conv.truncated:
            break
        check = prompts.verifier(problem, solver.text, cfg.max_solution_chars)
        if verifier is None:
            verifier = Dialogue(ctx.agents["verifier"], first=check)
        elif not verifier.say("user", check):
            break
        await verifier.speak()
        verdicts.append(parse_verdict(verifier.text))
        if verdicts[-1] is True:
            break
    answer = _answer(solver.text, seed.label, cfg)
    correct = _correct(answer, seed.label, cfg)
    metrics = verifier_metrics(verdicts, correct, cfg.max_loops)
    samples = [solver.sample(seed, 0, answer=answer, correct=correct, metrics=metrics)]
    if verifier is not None:
        samples.append(verifier.sample(seed, 0, verdicts=verdicts, correct=correct))
    return samples


async def solver_only(ctx: RolloutContext, seed: Sample) -> list[Sample | None]:
    cfg = as_config(ctx.config)
    problem, n = str(seed.prompt), cfg.num_parallel
    solvers = [_solver(ctx, problem) for _ in range(n)]
    await _speak_all(solvers)
    answers = [_answer(t.text, seed.label, cfg) for t in solvers]
    graded = [_correct(a, seed.label, cfg) for a in answers]
    metrics = {
        "turns": float(n),
        "answered": sum(a is not None for a in answers) / n,  # format: a number was given
        "solver_pass@k": float(any(graded)),
        "solved": float(any(graded)),
    }
    samples = [
        t.sample(seed, i, answer=a, correct=ok, **({"metrics": metrics} if i == 0 else {}))
        for i, (t, a, ok) in enumerate(zip(solvers, answers, graded, strict=True))
    ]
    return samples


WORKFLOW_FNS = {
    "solver_rewriter_selector": solver_rewriter_selector,
    "solver_selector": solver_selector,
    "solver_verifier": solver_verifier,
    "solver": solver_only,
}


async def generate(ctx: RolloutContext, sample: Sample) -> list[Sample | None]:
    """The recipe's generate hook: one episode of the configured workflow."""
    return await WORKFLOW_FNS[as_config(ctx.config).workflow](ctx, sample)
