"""A run's held-out replies scored again by today's scorers, so that a published figure follows
a scorer that was made stricter (the math and debate answer rules, code_pair's checks) without
training again: the evaluation files keep every reply's text.

``rescorer(config, held_out)`` gives, for a seed's config and a function that reads its
held-out items (``SeedRun.held_out``), a function that rewrites the ``passed`` of an
evaluation file's lines in place (the value as logged kept as ``passed_as_run``), or None
when the recipe's workflow has no rescorer (its scorer did not change what it credits:
takes_two). What is rescored:

- math (``solver``, ``solver_verifier``): the solver's last turn, by ``reward.score``;
- math (``solver_rewriter_selector``, ``solver_selector``): the selector's pick
  (``parse_judgment``) of the texts it was offered -- the episode's rewrites (or solutions), in
  the order the rewriter's (solver's) line holds them -- scored as above, and the share of the
  offered that are right (``rewrite_accuracy`` / ``solver_accuracy``: a random pick's score);
- debate (answer style): each debater's last turn, the verdict by today's rule (a tie between
  different answers is no verdict), or the single agent's own last turn; and the share of the
  debaters whose final answer is right (``final_accuracy``);
- deep_research: the agent's (or answerer's) last ``<answer>``, exact match by today's
  ``reward.exact_match`` (an answer that negates, hedges or names several is no match);
- gym, its ``tools`` tasks: the last action's ``<answer>`` by today's checker (alone, undoubted,
  ``same_answer``; kernel/env/tools.py); other environments' rows as logged;
- code_pair (pair): the helper's and main's replies run again through today's checks
  (``reward.score_pair``: parent-side comparison of plain results).

Episodes are matched across agents' lines by their order: the evaluation writes each agent's
samples of a held-out item in episode order (a rewriter's ``num_parallel`` per episode).
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable

Lines = list[dict]
Rescore = Callable[[Lines], None]

# ChatML (SmolLM2's template): an agent's turns in its decoded dialogue end with <|im_end|>,
# and the other speakers' messages sit between them
_NEXT_TURN = re.compile(r"<\|im_start\|>assistant\n")


def turns(text: str) -> list[str]:
    """An agent's own turns in its decoded dialogue, first to last."""
    return [part.split("<|im_end|>", 1)[0] for part in _NEXT_TURN.split(text)]


def _by_agent(lines: Lines) -> dict[tuple[int, str], dict]:
    return {(item["row"], item["agent"]): item for item in lines}


def _set(item: dict, passed: list[bool]) -> None:
    item.setdefault("passed_as_run", list(item["passed"]))
    item["passed"] = passed


def _math(config: dict, held_out: list) -> Rescore:
    from recipes.math_solver_verifier.config import as_config
    from recipes.math_solver_verifier.generate import parse_judgment
    from recipes.math_solver_verifier.reward import score

    recipe = as_config(config.get("recipe_args") or {})
    labels = [str(s.label) for s in held_out]

    def right(text: str, row: int) -> bool:
        return score(turns(text)[-1], labels[row], recipe.answer) == 1.0

    def rescore(lines: Lines) -> None:
        by = _by_agent(lines)
        for (row, agent), item in by.items():
            if agent == "solver" and recipe.workflow in ("solver", "solver_verifier"):
                _set(item, [right(t, row) for t in item["texts"]])
            elif agent == "selector":
                offered = by.get((row, "rewriter")) or by[(row, "solver")]
                n = recipe.num_parallel
                rights = [right(t, row) for t in offered["texts"]]
                picks = [parse_judgment(turns(t)[-1], n) for t in item["texts"]]
                _set(item, [p is not None and rights[e * n + p] for e, p in enumerate(picks)])
                share = "rewrite_accuracy" if offered["agent"] == "rewriter" else "solver_accuracy"
                for e, metrics in enumerate(item.get("metrics") or []):
                    if metrics.get(share) is not None:  # what a random pick would score
                        metrics[share] = sum(rights[e * n : e * n + n]) / n

    return rescore


def _debate(config: dict, held_out: list) -> Rescore:
    from recipes.debate.config import as_config
    from recipes.debate.reward import extract_answer, same, verdict_of

    recipe = as_config(config.get("recipe_args") or {})
    labels = [str(s.label) for s in held_out]

    def rescore(lines: Lines) -> None:
        by = _by_agent(lines)
        for row in sorted({r for r, _ in by}):
            debaters = [by[(row, d)] for d in recipe.debaters if (row, d) in by]
            if len(debaters) != len(recipe.debaters):
                continue
            episodes = len(debaters[0]["texts"])
            passed = []
            for e in range(episodes):
                finals = {d: turns(by[(row, d)]["texts"][e])[-1] for d in recipe.debaters}
                if len(recipe.debaters) == 1:
                    answer = extract_answer(finals[recipe.debaters[0]])
                else:
                    answer = verdict_of(finals, recipe.debaters)
                passed.append(same(answer, labels[row]))
                metrics = (debaters[0].get("metrics") or [{}] * episodes)[e]
                if metrics.get("final_accuracy") is not None:  # a random debater's answer
                    rights = [same(extract_answer(f), labels[row]) for f in finals.values()]
                    metrics["final_accuracy"] = sum(rights) / len(rights)
            for item in debaters:
                _set(item, passed)

    return rescore


_ANSWER_TAG = re.compile(r"<answer>(.*?)(?:</answer>|$)", re.S)


def research_answer(text: str) -> str | None:
    """A deep_research agent's final answer in its decoded dialogue: the last ``<answer>`` of
    its own turns (a scaffolded turn cut at its line break has no closing tag)."""
    found = [m.group(1) for turn in turns(text) for m in _ANSWER_TAG.finditer(turn)]
    return found[-1].strip() if found else None


def _deep_research(config: dict, held_out: list) -> Rescore:
    from recipes.deep_research.reward import exact_match, gold_answers

    golds = [gold_answers(s.label) for s in held_out]

    def rescore(lines: Lines) -> None:
        for item in lines:
            if item["agent"] in ("agent", "answerer"):
                answers = [research_answer(t) for t in item["texts"]]
                _set(item, [exact_match(a, golds[item["row"]]) == 1.0 for a in answers])

    return rescore


def _gym(config: dict, held_out: list) -> Rescore:
    from kernel.env.tools import answer_stands, parse_action, same_answer

    default = (config.get("recipe_args") or {}).get("env")

    def right(text: str, label: str) -> bool:
        last = turns(text)[-1]
        action = parse_action(last)
        return (
            action is not None
            and action.tag == "answer"
            and answer_stands(last)
            and same_answer(action.body, label)
        )

    def rescore(lines: Lines) -> None:
        for item in lines:
            sample = held_out[item["row"]]
            if (sample.metadata.get("env") or default) == "tools":
                _set(item, [right(t, str(sample.label)) for t in item["texts"]])

    return rescore


def _code_pair(config: dict, held_out: list) -> Rescore:
    from recipes.code_pair.config import as_config
    from recipes.code_pair.reward import problem_of, score_pair

    recipe = as_config(config.get("recipe_args") or {})

    async def judge(lines: Lines) -> None:
        by = _by_agent(lines)
        for (row, agent), item in by.items():
            if agent != "main" or (row, "helper") not in by:
                continue
            problem, tests, entry = problem_of(held_out[row])
            helpers = by[(row, "helper")]["texts"]
            passed = []
            for helper, main in zip(helpers, item["texts"], strict=True):
                outcome = await score_pair(recipe, problem, tests, entry, helper, main)
                passed.append(outcome.total > 0 and outcome.passed == outcome.total)
            _set(item, passed)
            _set(by[(row, "helper")], passed)

    return lambda lines: asyncio.run(judge(lines))


def rescorer(config: dict, held_out: Callable[[], list]) -> Rescore | None:
    """The function that rescores an evaluation file's lines of a run with ``config`` (module
    docstring); None for a workflow whose scorer did not change, or a config that names no
    recipe. ``held_out`` gives the run's held-out items, read only when there is a rescorer."""
    recipe, args = config.get("recipe"), config.get("recipe_args") or {}
    answers = (
        args.get("style", "answer") == "answer" and args.get("judge", "majority") == "majority"
    )
    build = {
        "math_solver_verifier": _math,
        "debate": _debate if answers else None,
        "deep_research": _deep_research,
        "gym": _gym,
        "code_pair": _code_pair if args.get("workflow", "pair") == "pair" else None,
    }.get(recipe)
    return None if build is None else build(config, held_out())
