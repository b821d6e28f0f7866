"""scripts/results_table.py: the results tables in the docs are what the files under
docs/results/ say, and every published run holds the files its figures were computed from."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PUBLISHED = sorted(p.parent for p in (ROOT / "docs" / "results").glob("*/learning.json"))


def module(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


def test_the_docs_tables_match_the_result_files():
    p = subprocess.run(
        [sys.executable, "scripts/results_table.py", "--check"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert p.returncode == 0, p.stdout + p.stderr


@pytest.mark.parametrize("run", PUBLISHED, ids=[p.name for p in PUBLISHED])
def test_a_published_run_recomputes_from_its_own_files(run):
    """The report's figures come out again from the evaluation files published beside it, and
    the run is small enough to keep (< 2 MB), names its commit and machine, and is 3 seeds of
    a fixed number of steps."""
    bench = module("bench_learning")
    first = json.loads((run / "learning.json").read_text())
    runs = [bench.SeedRun.read(d) for d in bench.seed_dirs(run)]
    again = bench.report(runs, first["recipe"], first["preset"], 10000, first["command"])
    for key in ("n_eval", "before", "after", "diff", "ci_low", "ci_high", "seeds", "steps"):
        assert again[key] == first[key], key
    assert sum(f.stat().st_size for f in run.rglob("*") if f.is_file()) < 2_000_000
    assert first["commit"] and "+dirty" not in first["commit"] and first["machine"]
    assert len(first["seeds"]) >= 3 and not first["capped"] and isinstance(first["steps"], int)


def test_report_only_recomputes_a_published_or_partial_run_from_its_folder(tmp_path):
    """bench_learning --report-only on a copy of a published folder (gzipped metrics, curves
    kept) and on a partial one: the same headline figures."""
    import shutil

    partial = sorted(p.parent for p in (ROOT / "docs/results/partial").glob("*/learning.json"))
    for run in [*PUBLISHED[:1], *partial[:1]]:
        first = json.loads((run / "learning.json").read_text())
        out = tmp_path / run.name
        shutil.copytree(run, out)
        cmd = [sys.executable, "scripts/bench_learning.py", "--recipe", first["recipe"]]
        cmd += ["--preset", first["preset"], "--report-only", "--out", str(out)]
        p = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
        assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
        again = json.loads((out / "learning.json").read_text())
        assert [again[k] for k in ("before", "after", "diff")] == [
            first[k] for k in ("before", "after", "diff")
        ], run.name


def test_a_table_is_filled_in_between_its_markers_and_unknown_ones_are_named(tmp_path):
    rt = module("results_table")
    text = "x\n<!-- results:seeds nope -->\nold\n<!-- /results -->\ny\n"
    out = rt.render(text, Path("doc.md"))  # a run named before it is published
    assert "| nope | not published yet |" in out and "old" not in out
    with pytest.raises(SystemExit, match="unknown table 'results:bogus'"):
        rt.render("<!-- results:bogus -->\n<!-- /results -->", Path("doc.md"))
    if PUBLISHED:
        name = PUBLISHED[0].name
        out = rt.render(f"a\n<!-- results:seeds {name} -->\nold\n<!-- /results -->\nb\n", Path("d"))
        assert out.startswith("a\n<!-- results:seeds") and out.endswith("<!-- /results -->\nb\n")
        assert "old" not in out and f"| {name} | " in out


def test_the_bench_table_shows_the_newest_measurement_and_flags_a_drop(tmp_path, monkeypatch):
    rt = module("results_table")
    prov = module("provenance")
    monkeypatch.setattr(rt, "BENCH", tmp_path / "bench")
    monkeypatch.setattr(prov, "ROOT", tmp_path / "root")
    head = {"machine": "test box", "headline": {"peer ÷ tandem": 2.0, "cache on ÷ off": 1.5}}
    old = head | {"commit": "aaaa", "date": "2026-11-01T00:00:00Z"}
    new = head | {"commit": "bbbb", "date": "2026-11-02T00:00:00Z"}
    new["headline"] = {"peer ÷ tandem": 1.7, "cache on ÷ off": 1.6}  # -15% and +7%
    for record in (new, old):
        path = prov.publish("vs_peers", record)
        assert (
            path
            == tmp_path
            / "root/docs/results/bench/vs_peers"
            / f"{record['date'][:10]}-{record['commit']}.json"
        )
        (tmp_path / "bench/vs_peers").mkdir(parents=True, exist_ok=True)
        path.rename(tmp_path / "bench/vs_peers" / path.name)
    assert rt.drops(rt.bench_files("vs_peers")) == ["peer ÷ tandem"]
    # A newer file from another machine is shown on its own rows, never compared with this one.
    other = head | {"commit": "cccc", "date": "2026-11-03T00:00:00Z", "machine": "big box"}
    (tmp_path / "bench/vs_peers/2026-11-03-cccc.json").write_text(json.dumps(other))
    groups = rt.by_machine(rt.bench_files("vs_peers"))
    assert [[f["commit"] for f in g] for g in groups] == [["cccc"], ["aaaa", "bbbb"]]
    assert [rt.drops(g) for g in groups] == [[], ["peer ÷ tandem"]]
    out = rt.render("<!-- results:bench -->\n<!-- /results -->\n", Path("docs/x.md"))
    rows = [line for line in out.splitlines() if line.startswith("| [vs_peers]")]
    assert len(rows) == 4 and all("big box" in r and "| — | — |" in r for r in rows[:2])
    assert "`bbbb`" in rows[2] and "test box" in rows[2]
    assert "| 1.7 | 2 | **-15% ⚠ dropped** |" in rows[2]
    assert "| 1.6 | 1.5 | +7% |" in rows[3]
    with pytest.raises(ValueError, match="lacks"):
        prov.publish("x", {"commit": "c"})


def test_publish_keeps_a_seed_trained_with_uncommitted_changes_out_of_the_tables(
    tmp_path, monkeypatch
):
    """--publish NAME refuses a run with a seed whose commit is "+dirty", naming the seed;
    --publish partial/NAME keeps it."""
    from tests.recipes.conftest import write_learning_run

    bench = module("bench_learning")
    monkeypatch.setattr(bench, "RESULTS", tmp_path / "results")
    run = write_learning_run(tmp_path, {"data": {}, "eval": {}}, [], steps=2)
    (run / "seed0" / "commit.txt").write_text("abc123+dirty\n")
    (run / "learning.json").write_text("{}")
    runs = [bench.SeedRun.read(run / "seed0")]
    with pytest.raises(SystemExit, match=r"seed 0 \(abc123\+dirty\)"):
        bench.publish(run, runs, "arm")
    assert not (tmp_path / "results" / "arm").exists()
    assert (bench.publish(run, runs, "partial/arm") / "seed0" / "commit.txt").exists()
