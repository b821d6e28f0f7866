"""The docs' results tables, written from the files under docs/results/ and nowhere else.

Every published run (``scripts/bench_learning.py --publish NAME``) is a folder
``docs/results/NAME/`` holding its ``learning.json`` and, per seed, the config, metrics and
first and last held-out evaluation files the report was computed from. A Markdown file asks for
a table with a pair of markers, and this script fills in what lies between them::

    <!-- results:learning -->            every published run, one row each
    <!-- results:learning NAME NAME -->  only these runs, in this order
    <!-- results:against -->             each run published with --against (a workflow
                                         against its single-agent baseline, LoRA against full
                                         fine-tuning): final scores by item
    <!-- results:seeds NAME -->          one run's per-seed rows
    <!-- results:bench -->               every benchmark's headline figures (below)
    <!-- results:algorithms [ROWS] -->   the toy runs of scripts/bench_algorithms.py: each
                                         algorithm's training reward, first -> last steps
    <!-- results:warm_start NAME -->     scripts/takes_two_warm_start.py's report in NAME
    ...                                  (generated: do not edit)
    <!-- /results -->

    python scripts/results_table.py           # rewrite the tables in README.md, docs/, recipes/
    python scripts/results_table.py --check   # exit 1 naming each file whose table is stale

A benchmark keeps each measurement as a file ``docs/results/bench/NAME/DATE-COMMIT.json``
(written by its ``--publish NAME``; it names the commit, the machine, the date and a ``headline`` of
figures where higher is better: ratios against a baseline, fractions of a limit). The bench
table shows, for each machine a benchmark ran on, its newest file beside the one before it on
that machine (an H100 is never the "previous" of an H200), and flags every headline figure that
dropped by more than 10%, so a regression is seen in the commit that lands it (the script
prints the flags too).

tests/scripts/test_results_table.py runs ``--check``, so a table in the docs that differs from
its files fails CI.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "docs" / "results"
DOCS = ("README.md", "docs/*.md", "recipes/*/README.md")
BLOCK = re.compile(
    r"(<!-- results:(?P<kind>[a-z_]+)(?P<names>(?: [\w.-]+)*) -->\n)"
    r"(?P<body>.*?)(<!-- /results -->)",
    re.S,
)


def load(name: str) -> dict | None:
    """A published run's report; None when a table names a run not published yet."""
    if not re.fullmatch(r"[\w.-]+", name):
        raise SystemExit(f"results_table.py: {name!r} is not a run name")
    path = RESULTS / name / "learning.json"
    return json.loads(path.read_text()) if path.exists() else None


def published() -> list[str]:
    return sorted(p.parent.name for p in RESULTS.glob("*/learning.json"))


def _ci(r: dict) -> str:
    return f"{r['diff']:+.3f} [{r['ci_low']:+.3f}, {r['ci_high']:+.3f}]"


def _change(r: dict | None) -> str:
    return "—" if r is None else f"{r['before']:.3f} → {r['after']:.3f}"


def _steps(r: dict) -> str:
    steps = r["steps"] if isinstance(r["steps"], int) else "/".join(map(str, r["steps"]))
    return f"{steps}" + (" (capped)" if r.get("capped") else "")


def _setup(r: dict) -> str:
    """A run's recipe, preset and the settings its command changed (the flags after --)."""
    argv = shlex.split(r["command"])
    flags = " ".join(argv[argv.index("--") + 1 :]) if "--" in argv else ""
    return f"{r['recipe']} ({r['preset']}{'; ' + flags if flags else ''})"


def _link(name: str, where: Path) -> str:
    """A run's folder as a link relative to the Markdown file ``where`` (repository-relative)."""
    return f"[{name}]({os.path.relpath(RESULTS / name, (ROOT / where).parent)})"


def _table(header: list[str], names: list[str], rows) -> str:
    """A Markdown table: ``header``, then the rows (lists of cells) ``rows(name, report)``
    gives for each named run; a run not published yet gets a row saying so."""
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for name in names:
        r = load(name)
        pending = [[name, "not published yet"] + [""] * (len(header) - 2)]
        lines += [
            "| " + " | ".join(cells) + " |" for cells in (pending if r is None else rows(name, r))
        ]
    return "\n".join(lines)


def learning_table(names: list[str], where: Path) -> str:
    """One row per run: the skill headline, before → after, difference and interval over
    seeds and items; the scores beside it (composite reward, format) as before → after."""
    header = ["run", "recipe (preset)", "skill metric", "seeds × steps", "held-out n", "before"]
    header += ["after", "difference [95% interval]", "best control (no skill)"]
    header += ["above the best control [95% interval]", "beside it (before → after)"]
    header += ["tokens / step", "commit"]

    def rows(name: str, r: dict) -> list[list[str]]:
        beside = "; ".join(f"{k} {_change(v)}" for k, v in r["beside"].items()) or "—"
        best = r.get("above_control")
        clean = r.get("subsets", {}).get("leak-free")
        held = str(r["n_eval"])
        if clean is not None:  # the items no training problem is (canonical_key), beside
            held += f" (leak-free {clean['n_eval']}: {_change(clean)}, {_ci(clean)})"
        return [
            [
                _link(name, where),
                _setup(r),
                r["metric"],
                f"{len(r['seeds'])} × {_steps(r)}",
                held,
                f"{r['before']:.3f}",
                f"{r['after']:.3f}",
                f"**{_ci(r)}**",
                "—" if best is None else f"{best['control']}: {best['before']:.3f}",
                "—" if best is None else f"**{_ci(best)}**",
                beside,
                f"{r['tokens_per_step']:.0f}",
                f"`{r['commit']}`",
            ]
        ]

    return _table(header, names, rows)


def against_table(names: list[str], where: Path) -> str:
    """Each run published with --against (a workflow against its single-agent baseline, LoRA
    against full fine-tuning): its final headline score against the baseline's, by item, with
    the two-level interval, and both runs' generated tokens per step."""
    header = ["run", "baseline (run)", "skill metric", "seeds", "held-out n"]
    header += ["baseline", "run", "difference [95% interval]"]
    header += ["baseline's vote of k (tokens / item: run, vote)", "run − vote [95% interval]"]
    header += ["best control (no skill)", "run − best control [95% interval]"]
    header += ["tokens / step (run, baseline)"]

    def rows(name: str, r: dict) -> list[list[str]]:
        vs = r.get("against")
        if vs is None:
            return []
        s, base, vote = vs["headline"], vs["base_headline"], vs.get("vote")
        best = r.get("above_control")
        return [
            [
                f"{_setup(r)}: {r['agent']} ({_link(name, where)})",
                f"{Path(vs['run']).name}: {base['agent']}",
                r["metric"],
                f"{len(r['seeds'])}, {len(vs['seeds'])}",
                str(s["n_eval"]),
                f"{s['before']:.3f}",
                f"{s['after']:.3f}",
                f"**{_ci(s)}**",
                "not run"
                if vote is None
                else f"k={vote['k']}: {vote['before']:.3f} "
                f"({vote['tokens_per_item']:.0f}, {vote['base_tokens_per_item']:.0f})",
                "—" if vote is None else f"**{_ci(vote)}**",
                "—" if best is None else f"{best['control']}: {best['before']:.3f}",
                "—" if best is None else f"**{_ci(best)}**",
                f"{r['tokens_per_step']:.0f}, {vs['tokens_per_step']:.0f}",
            ]
        ]

    return _table(header, names, rows)


def seeds_table(names: list[str], where: Path) -> str:
    """One run's per-seed rows."""
    header = ["run", "seed", "steps", "before", "after", "difference [95% item interval]"]
    header += ["minutes"]

    def rows(name: str, r: dict) -> list[list[str]]:
        return [
            [
                name,
                str(s["seed"]),
                str(s["steps"]),
                f"{s['before']:.3f}",
                f"{s['after']:.3f}",
                _ci(s),
                f"{s['minutes']:.0f}",
            ]
            for s in r["per_seed"]
        ]

    return _table(header, names, rows)


BENCH = RESULTS / "bench"
DROP = 0.10  # a headline figure this much below the previous measurement is flagged


def bench_files(name: str) -> list[dict]:
    """A benchmark's measurements (docs/results/bench/NAME/*.json), oldest first."""
    files = [json.loads(f.read_text()) | {"file": f} for f in (BENCH / name).glob("*.json")]
    return sorted(files, key=lambda r: (r["date"], r["file"].name))


def benchmarks() -> list[str]:
    return sorted(p.name for p in BENCH.glob("*") if p.is_dir() and any(p.glob("*.json")))


def by_machine(files: list[dict]) -> list[list[dict]]:
    """A benchmark's files (of ``bench_files``) split by machine, oldest first in each; the
    machine measured most recently first."""
    groups: dict[str, list[dict]] = {}
    for f in files:
        groups.setdefault(f["machine"], []).append(f)
    return sorted(groups.values(), key=lambda g: (g[-1]["date"], g[-1]["file"].name), reverse=True)


def drops(files: list[dict]) -> list[str]:
    """The headline figures of the newest of ``files`` (one machine's, oldest first) more than
    DROP below the file before."""
    if len(files) < 2:
        return []
    new, old = files[-1]["headline"], files[-2]["headline"]
    return [k for k, v in new.items() if k in old and v < (1 - DROP) * old[k]]


def bench_table(names: list[str], where: Path) -> str:
    """Each benchmark's newest headline figures on each machine, the previous measurement on
    that machine and the change; a drop of more than 10% is flagged."""
    header = ["benchmark", "figure (higher is better)", "value", "previous", "change"]
    header += ["commit", "machine", "date"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for name in names:
        groups = by_machine(bench_files(name))
        if not groups:
            lines.append(f"| {name} | not measured yet |" + " |" * (len(header) - 2))
        for files in groups:
            new, old = files[-1], (files[-2] if len(files) > 1 else None)
            link = f"[{name}]({os.path.relpath(new['file'], (ROOT / where).parent)})"
            flagged = set(drops(files))
            for key, value in new["headline"].items():
                prev = None if old is None else old["headline"].get(key)
                change = "—" if prev is None else f"{value / prev - 1:+.0%}"
                if key in flagged:
                    change = f"**{change} ⚠ dropped**"
                cells = [link, key, f"{value:.3g}", "—" if prev is None else f"{prev:.3g}"]
                cells += [change, f"`{new['commit']}`", new["machine"], new["date"]]
                lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def algorithms() -> dict:
    """scripts/bench_algorithms.py's published figures (rows by name); empty when none."""
    path = RESULTS / "algorithms" / "algorithms.json"
    return json.loads(path.read_text()) if path.exists() else {"rows": []}


def _per_agent(figures: dict, fmt) -> str:
    """``fmt(value)`` per agent, named when there are several."""
    if len(figures) == 1:
        return fmt(next(iter(figures.values())))
    return "; ".join(f"{agent} {fmt(v)}" for agent, v in figures.items())


def algorithms_table(names: list[str], where: Path) -> str:
    """Each algorithm's toy run (scripts/bench_algorithms.py): the sampled training reward of
    the first and last steps, the mean over seeds and each seed's, and the figures beside it."""
    record = algorithms()
    by_name = {r["name"]: r for r in record["rows"]}
    window = record.get("window", 5)
    header = ["row", "`python -m kernel train` flags", "seeds"]
    header += [f"reward, first {window} → last {window} steps (mean of seeds)"]
    header += [f"last {window}, each seed", "beside it"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for name in names:
        r = by_name.get(name)
        if r is None:
            lines.append(f"| {name} | not measured yet |" + " |" * (len(header) - 2))
            continue
        beside = []
        if "length" in r:
            beside.append(
                "reply length "
                + _per_agent(r["length"], lambda v: f"{v['first']:.1f} → {v['last']:.1f}")
            )
        if "clipfrac_max" in r:
            beside.append(
                "largest clipfrac " + _per_agent(r["clipfrac_max"], lambda v: f"{v['max']:.3f}")
            )
        cells = [name, f"`{r['command']}`", str(len(r["seeds"]))]
        cells.append(_per_agent(r["reward"], lambda v: f"{v['first']:.2f} → {v['last']:.2f}"))
        cells.append(
            _per_agent(r["reward"], lambda v: ", ".join(f"{x:.2f}" for x in v["last_per_seed"]))
        )
        cells.append("; ".join(beside) or "—")
        lines.append("| " + " | ".join(cells) + " |")
    if record["rows"]:
        source = os.path.relpath(RESULTS / "algorithms" / "algorithms.json", (ROOT / where).parent)
        lines.append(
            f"\n[algorithms.json]({source}) · commit `{record['commit']}` · "
            f"{record['machine']} · {record['date']}"
        )
    return "\n".join(lines)


def warm_start_table(names: list[str], where: Path) -> str:
    """scripts/takes_two_warm_start.py's report of each named folder (its warm_start.json)."""
    sys.path.insert(0, str(ROOT))
    from scripts.takes_two_warm_start import markdown

    out = []
    for name in names:
        path = RESULTS / name / "warm_start.json"
        if not path.exists():
            raise SystemExit(f"results_table.py: {where}: no {path.relative_to(ROOT)}")
        out.append(markdown(json.loads(path.read_text())).rstrip("\n"))
    return "\n\n".join(out)


TABLES = {"learning": learning_table, "against": against_table, "seeds": seeds_table}
TABLES["warm_start"] = warm_start_table
TABLES["bench"] = bench_table
TABLES["algorithms"] = algorithms_table
DEFAULT_NAMES = {
    "bench": benchmarks,
    "algorithms": lambda: [r["name"] for r in algorithms()["rows"]],
}


def render(text: str, where: Path) -> str:
    """``text`` with every results block filled in from docs/results/."""

    def fill(m: re.Match) -> str:
        kind = m.group("kind")
        if kind not in TABLES:
            raise SystemExit(f"results_table.py: {where}: unknown table 'results:{kind}'")
        names = m.group("names").split() or DEFAULT_NAMES.get(kind, published)()
        return m.group(1) + TABLES[kind](names, where) + "\n" + m.group(5)

    return BLOCK.sub(fill, text)


def doc_files() -> list[Path]:
    return sorted({p for pattern in DOCS for p in ROOT.glob(pattern)})


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--check", action="store_true", help="change nothing; exit 1 if stale")
    args = p.parse_args(argv)
    stale = []
    for path in doc_files():
        text = path.read_text()
        new = render(text, path.relative_to(ROOT))
        if new != text:
            stale.append(str(path.relative_to(ROOT)))
            if not args.check:
                path.write_text(new)
    for name in benchmarks():
        for files in by_machine(bench_files(name)):
            for key in drops(files):
                where = files[-1]["machine"]
                print(
                    f"WARNING: benchmark {name} on {where}: {key} dropped more than {DROP:.0%}",
                    file=sys.stderr,
                )
    if args.check and stale:
        print("stale results tables (run python scripts/results_table.py): " + ", ".join(stale))
        return 1
    print(("rewrote " + ", ".join(stale)) if stale else "results tables are up to date")
    return 0


if __name__ == "__main__":
    sys.exit(main())
