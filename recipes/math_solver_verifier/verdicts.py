"""How often a model, asked to verify solutions, states a verdict, and how often a right one:
the recipe's verifier protocol against the one it replaced.

Solutions are a learning run's first held-out evaluation (the base model's own solver replies,
``docs/results/math_solver`` by default), ``--n`` graded right and ``--n`` wrong by the
recipe's scorer, each shown to the model ``--samples`` times at ``--temperature`` as the
verifier sees it. Protocols:

- ``yes_no`` (the recipe's): ``prompts.verifier``, the reply's first word Yes or No
  (``generate.parse_verdict``);
- ``verdict_tag`` (before 1002836): "End with 'Verdict: approve' or 'Verdict: reject'", the
  reply opening with a given "Verdict: ", one verdict stated (two different ones are none).

    python -m recipes.math_solver_verifier.verdicts --n 24 --samples 2

prints a Markdown table: replies, the share that state a verdict, the share of those that
approve, and the share of those that are right (approve exactly the right solutions; the
solutions are half right, so 0.5 is a coin).
"""

from __future__ import annotations

import argparse
import random
import re
import time
from pathlib import Path

from kernel.run.results import read_jsonl, read_seeds
from recipes.math_solver_verifier import prompts
from recipes.math_solver_verifier.generate import parse_verdict
from recipes.math_solver_verifier.read_replies import turns
from recipes.math_solver_verifier.reward import MathRewardConfig, score
from recipes.math_solver_verifier.tiers import reply

_TAG = re.compile(r"verdict\s*:\s*\**\s*(approve|reject)", re.IGNORECASE)


def tag_verdict(text: str) -> bool | None:
    """The earlier protocol's verdict: the one 'Verdict: approve|reject' stated, else None."""
    stated = {v.lower() for v in _TAG.findall(text)}
    return stated.pop() == "approve" if len(stated) == 1 else None


def tag_prompt(problem: str, solution: str, max_chars: int) -> str:
    return prompts.verifier(problem, solution, max_chars).replace(
        "Start your reply with Yes or No.", "End with 'Verdict: approve' or 'Verdict: reject'."
    )


PROTOCOLS = {  # name: (verifier prompt, given reply opening, verdict parser)
    "yes_no": (prompts.verifier, "", parse_verdict),
    "verdict_tag": (tag_prompt, "Verdict: ", tag_verdict),
}


def solutions(run: Path, n: int, seed: int) -> list[tuple[str, str, bool]]:
    """(problem, solution, right) from ``run``'s first evaluations: ``n`` right, ``n`` wrong."""
    right, wrong, cfg = [], [], MathRewardConfig()
    for s in read_seeds(run, "verdicts"):
        problems = s.held_out()
        for item in read_jsonl(s.first):
            if item["agent"] != "solver":
                continue
            problem = problems[item["row"]]
            for text in item["texts"]:
                first = turns(text)[0]
                ok = score(first, str(problem.label), cfg) == 1.0
                (right if ok else wrong).append((str(problem.prompt), first, ok))
    if len(right) < n or len(wrong) < n:
        raise SystemExit(f"verdicts: {run} has {len(right)} right, {len(wrong)} wrong solutions")
    rng = random.Random(seed)
    return rng.sample(right, n) + rng.sample(wrong, n)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--model", default="smollm2", help="HF folder, or smollm2 (the default)")
    p.add_argument(
        "--solutions",
        default="docs/results/math_solver",
        type=Path,
        help="a bench_learning run whose first evaluation holds the solutions",
    )
    p.add_argument("--n", type=int, default=24, help="right and as many wrong solutions")
    p.add_argument("--samples", type=int, default=2, help="replies per solution")
    p.add_argument("--temperature", type=float, default=0.7)
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--max-chars", type=int, default=400, help="a solution as the verifier reads it")
    p.add_argument("--batch", type=int, default=48)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    if args.n < 1 or args.samples < 1:
        p.error("--n and --samples must be >= 1")

    import torch

    from kernel.models import load_causal_lm, load_tokenizer

    items = solutions(args.solutions, args.n, args.seed)
    torch.manual_seed(args.seed)
    tokenizer, model = load_tokenizer(args.model), load_causal_lm(args.model).eval()
    print("| protocol | replies | states a verdict | approves | right | s |")
    print("|---|---|---|---|---|---|")
    for name, (ask, prefix, parse) in PROTOCOLS.items():
        chats = [[{"role": "user", "content": ask(q, a, args.max_chars)}] for q, a, _ in items]
        t0 = time.perf_counter()
        texts = [
            prefix + text
            for _ in range(args.samples)
            for text in reply(
                model, tokenizer, chats, args.max_new_tokens, args.batch, prefix, args.temperature
            )
        ]
        truth = [ok for _ in range(args.samples) for _, _, ok in items]
        stated = [(v, ok) for v, ok in zip(map(parse, texts), truth, strict=True) if v is not None]
        k = max(len(stated), 1)
        print(
            f"| {name} | {len(texts)} | {len(stated) / len(texts):.3f} | "
            f"{sum(v for v, _ in stated) / k:.3f} | {sum(v == ok for v, ok in stated) / k:.3f} | "
            f"{time.perf_counter() - t0:.0f} |",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
