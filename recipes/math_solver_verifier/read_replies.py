"""Read a math_solver_verifier run's held-out replies before believing its score.

``python -m recipes.math_solver_verifier.read_replies RUN [RUN ...]`` takes
``scripts/bench_learning.py`` run folders (``runs/learning/math_verifier``,
``docs/results/math_solver``), read through the kernel's ``SeedRun`` (``kernel.run.results``),
and prints, per seed, held-out evaluation (the first and the last) and role, from the replies
themselves:

- ``right``: the role's own final answers that are right, rescored with ``reward.score`` (for
  the verifier and the selector, the episodes' outcomes as logged); ``answered``: final answers
  that are a number at all;
- ``first``: where a role speaks more than once (the solver of ``solver_verifier``), its first
  answers that are right, and ``revised``, the share of dialogues with a second turn;
- ``decisions``: the verifier's verdicts (approve, reject, none: a reply opening with neither
  Yes nor No) and the selector's picks (``picks N``: the rewrite it chose, or the solution
  under ``solver_selector``; none: no valid pick; two: different picks stated), per turn;
- ``approved right``: of the episodes the verifier approved, the share whose answer was right;
- the mean length of a dialogue in characters and its most common opening.

A solver whose ``right`` rises while ``first`` falls learned to lean on the revisions; a
verifier that mostly rejects is right as often as wrong answers are common, and decides
nothing; a selector that picks one position whatever the solutions say does not select; a
reply's opening that repeats across problems is a template, not a computation.
"""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

from kernel.run.results import each_seed, read_jsonl, replies_parser
from recipes.math_solver_verifier.config import RecipeConfig, as_config
from recipes.math_solver_verifier.generate import JUDGMENT, parse_judgment, parse_verdict
from recipes.math_solver_verifier.reward import final_answer, score

# a role's dialogue as decoded (ChatML, SmolLM2's template): its turns end with <|im_end|>,
# and another speaker's message sits between two of them
_NEXT_TURN = re.compile(r"<\|im_start\|>assistant\n")
_TURN_END = "<|im_end|>"


def turns(text: str) -> list[str]:
    """The role's own turns in a decoded dialogue, first to last."""
    return [part.split(_TURN_END, 1)[0] for part in _NEXT_TURN.split(text)]


def decision(role: str, turn: str, n: int) -> str:
    """The verifier's verdict (approve, reject, none) or the selector's pick among ``n``
    solutions (``picks N``; none: no valid pick; two: different picks stated) in one of its
    turns."""
    if role == "verifier":
        return {True: "approve", False: "reject", None: "none"}[parse_verdict(turn)]
    if len(set(map(int, JUDGMENT.findall(turn)))) > 1:
        return "two"
    pick = parse_judgment(turn, n)
    return "none" if pick is None else f"picks {pick + 1}"


def read(path: Path, labels: list[str], recipe: RecipeConfig) -> dict[str, dict]:
    """The figures of one held-out evaluation file, per role, scored and parsed by the run's
    recipe config."""
    cfg = recipe.answer
    acc: dict[str, Counter] = {}
    openings: dict[str, Counter] = {}
    for item in read_jsonl(path):
        role, label = item["agent"], labels[item["row"]]
        c = acc.setdefault(role, Counter())
        for text, passed, logged in zip(
            item["texts"], item["passed"], item["metrics"], strict=True
        ):
            said = turns(text)
            c["n"] += 1
            c["chars"] += len(text)
            openings.setdefault(role, Counter())[" ".join(said[0].split()[:6])] += 1
            if role in ("solver", "rewriter"):
                right = score(said[-1], label, cfg) == 1.0
                c["right"] += right
                c["answered"] += final_answer(said[-1], label, cfg) is not None
                c["first"] += right if len(said) == 1 else score(said[0], label, cfg) == 1.0
                c["revised"] += len(said) > 1
                if "approved_correct" in logged:
                    c["approved"] += 1
                    c["approved_right"] += logged["approved_correct"]
            else:
                c["right"] += passed
                for turn in said:
                    c["turns"] += 1
                    c["decision:" + decision(role, turn, recipe.num_parallel)] += 1
    out = {}
    for role, c in acc.items():
        n = c["n"]
        figures = {"n": n, "right": c["right"] / n, "chars": c["chars"] / n}
        if role in ("solver", "rewriter"):
            figures |= {k: c[k] / n for k in ("answered", "first", "revised")}
            if c["approved"]:
                figures["approved_right"] = c["approved_right"] / c["approved"]
        else:
            figures["decisions"] = {
                k.split(":", 1)[1]: v / c["turns"]
                for k, v in c.items()
                if k.startswith("decision:")
            }
        figures["opening"] = openings[role].most_common(1)[0]
        out[role] = figures
    return out


def _line(where: str, role: str, f: dict) -> str:
    multi = f.get("revised", 0) > 0
    parts = [f"{where} {role:<9} {f['n']:>4} {f['right']:>6.3f}"]
    if "answered" in f:
        parts.append(f"answered {f['answered']:.3f}")
    if multi:
        parts.append(f"first {f['first']:.3f} revised {f['revised']:.3f}")
    if "approved_right" in f:
        parts.append(f"approved right {f['approved_right']:.3f}")
    if "decisions" in f:
        parts.append(" ".join(f"{k} {v:.3f}" for k, v in sorted(f["decisions"].items())))
    text, count = f["opening"]
    parts.append(f"{f['chars']:.0f} chars, opening {text[:48]!r} x{count}")
    return "; ".join(parts)


def main(argv: list[str] | None = None) -> None:
    args = replies_parser(__doc__).parse_args(argv)
    print(f"{'run':<20} {'seed':<6} {'eval':<9} {'role':<9} {'n':>4} {'right':>6}; the rest")
    for seed, evaluations in each_seed(args.runs, 20):
        labels = [str(sample.label) for sample in seed.held_out()]
        recipe = as_config(seed.config.get("recipe_args", {}))
        for where, path in evaluations:
            for role, figures in sorted(read(path, labels, recipe).items()):
                print(_line(where, role, figures))


if __name__ == "__main__":
    main()
