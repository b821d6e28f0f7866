"""Base accuracy of a model per difficulty tier of reasoning-gym problems, to pick the tier a
learning run trains on (where the starting model is right 10-50% of the time: enough reward
signal, room to improve).

Each tier is a reasoning-gym task with a config. The solver's prompt (system + problem + the
answer format) is rendered with the model's chat template, answered greedily by plain HF
``generate`` in batches, and graded by the recipe's reward (``score``: ``\\boxed{}``, "the
answer is", else the last number, with math-verify); the boxed-only accuracy is shown beside it.

    python -m recipes.math_solver_verifier.tiers --n 64 --dump runs/tiers.jsonl

prints a Markdown table (the one in the recipe's README) and, with ``--dump``, writes every
reply as ``{"tier", "prompt", "label", "text", "answer", "correct"}``.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from recipes.math_solver_verifier import prompts
from recipes.math_solver_verifier.data import TIERS, generate_reasoning_gym
from recipes.math_solver_verifier.reward import MathRewardConfig, extract_answer, score


def tier_rows(tier: str, n: int, seed: int) -> list[dict]:
    task, config = TIERS[tier]
    rows = generate_reasoning_gym(
        (task,), n=n, seed=seed, task_configs={task: config}, skip_operand_answers=True
    )
    return [r | {"tier": tier} for r in rows]


def reply(
    model,
    tokenizer,
    chats: list[list[dict]],
    max_new_tokens: int,
    batch: int,
    prefix: str = "",
    temperature: float = 0.0,
) -> list[str]:
    """The model's reply to each chat (messages rendered with its chat template, the reply
    opening with ``prefix``, given), greedy at temperature 0, else sampled; the prefix is not
    part of the returned text."""
    import torch

    tokenizer.padding_side = "left"
    sampling = (
        {"do_sample": True, "temperature": temperature} if temperature else {"do_sample": False}
    )
    replies = []
    for i in range(0, len(chats), batch):
        texts = [
            tokenizer.apply_chat_template(chat, tokenize=False, add_generation_prompt=True) + prefix
            for chat in chats[i : i + batch]
        ]
        enc = tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False)
        with torch.no_grad():
            out = model.generate(
                **enc,
                max_new_tokens=max_new_tokens,
                pad_token_id=tokenizer.pad_token_id,
                **sampling,
            )
        new = out[:, enc["input_ids"].shape[1] :]
        replies += tokenizer.batch_decode(new, skip_special_tokens=True)
    return replies


def solver_chat(problem: str) -> list[dict]:
    """The recipe's solver prompt for ``problem``."""
    return [
        {"role": "system", "content": prompts.SOLVER_SYSTEM},
        {"role": "user", "content": prompts.solver(problem)},
    ]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="smollm2", help="HF folder, or smollm2 (the default)")
    p.add_argument("--n", type=int, default=64, help="problems per tier")
    p.add_argument("--seed", type=int, default=1000, help="reasoning-gym seed of the problems")
    p.add_argument("--tiers", default=",".join(TIERS), help=f"comma-separated, of {list(TIERS)}")
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--dump", default=None, help="write every reply here (JSONL)")
    args = p.parse_args(argv)
    unknown = [t for t in args.tiers.split(",") if t not in TIERS]
    if unknown:
        p.error(f"--tiers: unknown {unknown}; known: {list(TIERS)}")

    import torch

    from kernel.models import load_causal_lm, load_tokenizer

    torch.manual_seed(0)
    tokenizer, model = load_tokenizer(args.model), load_causal_lm(args.model).eval()
    cfg = MathRewardConfig()
    boxed_only = MathRewardConfig(markers=("\\boxed",), last_number=False)
    dump = []
    print("| tier | task | n | accuracy | boxed-only accuracy | s |\n|---|---|---|---|---|---|")
    for tier in args.tiers.split(","):
        rows = tier_rows(tier, args.n, args.seed)
        t0 = time.perf_counter()
        chats = [solver_chat(r["prompt"]) for r in rows]
        texts = reply(model, tokenizer, chats, args.max_new_tokens, args.batch)
        seconds = time.perf_counter() - t0
        right = [score(t, r["label"], cfg) == 1.0 for t, r in zip(texts, rows, strict=True)]
        boxed = [score(t, r["label"], boxed_only) == 1.0 for t, r in zip(texts, rows, strict=True)]
        print(
            f"| {tier} | {TIERS[tier][0]} | {len(rows)} | {sum(right) / len(rows):.2f} | "
            f"{sum(boxed) / len(rows):.2f} | {seconds:.0f} |",
            flush=True,
        )
        for r, text, ok in zip(rows, texts, right, strict=True):
            answer = extract_answer(text, cfg.markers, cfg.after_think, cfg.last_number)
            dump.append({**r, "text": text, "answer": answer, "correct": ok})
    if args.dump:
        Path(args.dump).parent.mkdir(parents=True, exist_ok=True)
        Path(args.dump).write_text("".join(json.dumps(d) + "\n" for d in dump))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
