"""Read a code_pair run's held-out replies before believing its score.

``python -m recipes.code_pair.read_replies RUN [RUN ...]`` takes ``scripts/bench_learning.py``
run folders (``runs/learning/code_pair``, ``docs/results/code_pair``), read through the
kernel's ``SeedRun`` (``kernel.run.results``), and prints, per seed and held-out
evaluation (the first and the last), from the replies themselves:

- main (or the single coder): ``passed``, problems with every check passing (the headline, as
  logged); ``checks``, the mean share of checks passed; the program's status (passed, failed,
  missing: no entry point, syntax_error, timeout, ...); ``calls aux``, replies whose entry point
  calls ``aux``, ``of passes`` the same among the passing ones, and ``wrapper``, entry points
  that only ``return aux(...)``; the rows that pass;
- helper: ``defines aux``, replies defining an ``aux`` that returns a value, and ``writes the
  entry point``, replies that define main's function instead;
- per role the mean reply length in characters and its most common first line.

A pair whose passing programs never call ``aux`` is main solving alone: the helper adds
nothing, whatever the team reward says.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from kernel.run.results import each_seed, read_jsonl, replies_parser
from recipes.code_pair import code
from recipes.code_pair.config import HELPER
from recipes.code_pair.reward import STATUS_NAMES

AUX = "aux"


def read(path: Path, entry_points: list[str]) -> dict[str, dict]:
    """The figures of one held-out evaluation file, per role."""
    acc: dict[str, Counter] = {}
    openings: dict[str, Counter] = {}
    solved: dict[str, set[int]] = {}
    for item in read_jsonl(path):
        role, row = item["agent"], item["row"]
        entry_point = entry_points[row]
        c = acc.setdefault(role, Counter())
        for text, passed, logged in zip(
            item["texts"], item["passed"], item["metrics"], strict=True
        ):
            c["n"] += 1
            c["chars"] += len(text)
            written = code.extract_code(text)
            openings.setdefault(role, Counter())[written.strip().split("\n", 1)[0][:60]] += 1
            entry = code.find_function(written, entry_point)
            if role == HELPER:
                aux = code.find_function(written, AUX)
                c["defines_aux"] += aux is not None and code.returns_something(aux)
                c["writes_entry"] += entry is not None
                continue
            function = entry or ""
            uses = code.calls(function, AUX)
            c["passed"] += passed
            c["checks"] += logged.get("checks_passed", 0.0)
            c["calls_aux"] += uses
            c["passes_calling_aux"] += passed and uses
            c["wrapper"] += code.is_wrapper(function, AUX)
            for status in STATUS_NAMES:
                c["status:" + status] += logged.get(f"status_{status}", 0.0)
            if passed:
                solved.setdefault(role, set()).add(row)
    out = {}
    for role, c in acc.items():
        n = c["n"]
        figures: dict = {"n": n, "chars": c["chars"] / n}
        if role == HELPER:
            figures |= {k: c[k] / n for k in ("defines_aux", "writes_entry")}
        else:
            figures |= {k: c[k] / n for k in ("passed", "checks", "calls_aux", "wrapper")}
            figures["of_passes"] = c["passes_calling_aux"] / c["passed"] if c["passed"] else None
            figures["status"] = {
                k.split(":", 1)[1]: v / n for k, v in c.items() if k.startswith("status:") and v
            }
            figures["solved"] = sorted(solved.get(role, ()))
        figures["opening"] = openings[role].most_common(1)[0]
        out[role] = figures
    return out


def _line(where: str, role: str, f: dict) -> str:
    parts = [f"{where} {role:<7} {f['n']:>4}"]
    if "defines_aux" in f:
        parts.append(
            f"defines aux {f['defines_aux']:.3f}, writes the entry point {f['writes_entry']:.3f}"
        )
    else:
        of_passes = "-" if f["of_passes"] is None else f"{f['of_passes']:.3f}"
        parts += [
            f"passed {f['passed']:.3f} checks {f['checks']:.3f}",
            f"calls aux {f['calls_aux']:.3f} (of passes {of_passes}) wrapper {f['wrapper']:.3f}",
            " ".join(f"{k} {v:.3f}" for k, v in sorted(f["status"].items())),
            f"solved rows {f['solved']}",
        ]
    text, count = f["opening"]
    return "; ".join([*parts, f"{f['chars']:.0f} chars, opening {text[:48]!r} x{count}"])


def main(argv: list[str] | None = None) -> None:
    args = replies_parser(__doc__).parse_args(argv)
    print(f"{'run':<16} {'seed':<6} {'eval':<9} {'role':<7} {'n':>4}; the figures")
    for seed, evaluations in each_seed(args.runs, 16):
        entry_points = [sample.metadata["entry_point"] for sample in seed.held_out()]
        for where, path in evaluations:
            for role, figures in sorted(read(path, entry_points).items()):
                print(_line(where, role, figures))


if __name__ == "__main__":
    main()
