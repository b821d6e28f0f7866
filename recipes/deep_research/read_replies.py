"""Read a deep_research run's held-out replies before believing its score.

``python -m recipes.deep_research.read_replies RUN [RUN ...]`` takes ``scripts/bench_learning.py``
run folders (``runs/learning/deep_research``, ``docs/results/deep_research``), read through the
kernel's ``SeedRun`` (``kernel.run.results``), and prints, per seed and held-out
evaluation (the first and the last), from the episodes themselves:

- the agent: ``em``, ``f1`` and ``gold in answer`` as logged (the headline is ``em``), ``em``
  per hop count; ``seen``, episodes whose information (what the searcher handed back) holds a
  gold answer, and ``em | seen``, exact matches among those: search finding the fact and the
  agent writing only the fact are two skills; ``copies``, answers that repeat the information
  word for word; the answer's mean length in words and its most common text;
- the searcher: ``question``, first queries that are the question itself; ``retrieved``,
  episodes whose retrieved passages hold a gold answer; ``kept``, summaries that hold one.

An ``em`` that rises with ``seen`` flat and ``copies`` falling is the agent trimming the
searcher's summary to the answer, not better search.
"""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

from kernel.run.results import each_seed, read_jsonl, replies_parser
from recipes.deep_research.reward import answer_in, exact_match, gold_answers, normalize


def _tag(name: str) -> re.Pattern:
    """A tag's text up to the next closing tag (its own, or one the model wrote in its place:
    "<summary>... 1842.</information>"), or where its turn ends: a scaffolded turn stops at a
    line break and the recipe closes the tag it left open (generate._closed)."""
    return re.compile(rf"<{name}>(.*?)(?=</|<\|im_end\|>|<\|eot_id\|>|\n|$)", re.S)


_ANSWER, _QUERY, _SUMMARY = _tag("answer"), _tag("query"), _tag("summary")
_INFORMATION = re.compile(r"<information>(.*?)</information>", re.DOTALL)


def _last(pattern: re.Pattern, text: str) -> str | None:
    found = pattern.findall(text)
    return found[-1].strip() if found else None


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def read(path: Path, held_out: list) -> dict[str, dict]:
    """The figures of one held-out evaluation file, per role (``held_out``: the run's held-out
    samples by row, for their gold answers and hop counts)."""
    agent: dict[str, list] = {}
    searcher: dict[str, list] = {}
    answers: Counter = Counter()
    by_hops: dict[int, list[float]] = {}
    for item in read_jsonl(path):
        sample = held_out[item["row"]]
        golds = gold_answers(sample.label)
        question = normalize(sample.prompt)
        for text, logged in zip(item["texts"], item["metrics"], strict=True):
            information = [block.strip() for block in _INFORMATION.findall(text)]
            seen = answer_in(" ".join(information), golds)
            if item["agent"] == "searcher":
                first, summary = _QUERY.findall(text)[:1], _last(_SUMMARY, text)
                searcher.setdefault("question", []).append(
                    float(bool(first) and normalize(first[0]) == question)
                )
                searcher.setdefault("retrieved", []).append(seen)
                searcher.setdefault("kept", []).append(answer_in(summary, golds))
                continue
            answer = _last(_ANSWER, text)
            em = logged["exact_match"] if "exact_match" in logged else exact_match(answer, golds)
            for key, value in (
                ("em", em),
                ("f1", logged.get("f1")),
                ("gold_in_answer", logged.get("gold_in_answer")),
                ("answered", float(answer is not None)),
                ("evidence", logged.get("evidence")),
                ("searches", logged.get("searches")),
                ("seen", seen),
            ):
                if value is not None:
                    agent.setdefault(key, []).append(value)
            if seen:
                agent.setdefault("em_seen", []).append(em)
            if answer is not None:
                agent.setdefault("words", []).append(len(answer.split()))
                copies = bool(information) and normalize(answer) == normalize(information[-1])
                agent.setdefault("copies", []).append(float(copies))
                answers[normalize(answer)] += 1
            by_hops.setdefault(int(sample.metadata.get("hops", 0)), []).append(em)
    out: dict[str, dict] = {}
    if agent:
        out["agent"] = {k: _mean(v) for k, v in agent.items()} | {
            "n": len(agent["em"]),
            "em_by_hops": {h: _mean(v) for h, v in sorted(by_hops.items())},
            "top_answer": answers.most_common(1)[0] if answers else ("", 0),
        }
    if searcher:
        out["searcher"] = {k: _mean(v) for k, v in searcher.items()} | {"n": len(searcher["kept"])}
    return out


def _f(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def _line(where: str, role: str, f: dict) -> str:
    parts = [f"{where} {role:<8} {f['n']:>4}"]
    if role == "searcher":
        parts.append(
            f"question {_f(f['question'])}, retrieved {_f(f['retrieved'])}, kept {_f(f['kept'])}"
        )
        return "; ".join(parts)
    hops = " ".join(f"{h}-hop {_f(v)}" for h, v in f["em_by_hops"].items())
    text, count = f["top_answer"]
    parts += [
        f"em {_f(f['em'])} f1 {_f(f.get('f1'))} gold in answer {_f(f.get('gold_in_answer'))}"
        f" ({hops})",
        f"seen {_f(f['seen'])} em | seen {_f(f.get('em_seen'))} copies {_f(f.get('copies'))}",
        f"answered {_f(f['answered'])} searches {_f(f.get('searches'))}"
        f" evidence {_f(f.get('evidence'))}",
        f"{_f(f.get('words'))} words, most common {text[:40]!r} x{count}",
    ]
    return "; ".join(parts)


def main(argv: list[str] | None = None) -> None:
    args = replies_parser(__doc__).parse_args(argv)
    print(f"{'run':<16} {'seed':<6} {'eval':<9} {'role':<8} {'n':>4}; the figures")
    for seed, evaluations in each_seed(args.runs, 16):
        held_out = seed.held_out()
        for where, path in evaluations:
            for role, figures in sorted(read(path, held_out).items()):
                print(_line(where, role, figures))


if __name__ == "__main__":
    main()
