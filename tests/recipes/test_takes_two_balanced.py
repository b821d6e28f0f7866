"""takes_two's balanced case set (data/train_balanced.jsonl, data/test_balanced.jsonl): what the
generator makes, each condition of a group equally often, the true condition at each place of
the candidate list equally often, openings that say nothing of the condition, facts that tell
each condition apart from the rest of its group, and no held-out case trained on. The published
shared-complaint files fail the place check: the checks can fail. The files' controls (a random
candidate, the first listed one, each group's most common training condition: 1/k; the facts
oracle: 1.0) are tests/scripts/test_controls.py's (scripts/controls.py)."""

from __future__ import annotations

import itertools
import json
import re
from collections import Counter, defaultdict
from pathlib import Path

import pytest
import yaml

from kernel.buffer import DataBuffer, DataConfig
from recipes.takes_two import data
from recipes.takes_two.prepare_data import main

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "recipes" / "takes_two" / "data"
PRESETS = ROOT / "recipes" / "takes_two" / "presets"
SIZES = {"train": 88, "test": 132}  # 4 and 6 cases of each of the 22 conditions
GROUP_OF = {d: c for c, group in data.SHARED_COMPLAINTS.items() for d in group}
# words that make no fact another: compared without them, two facts of one group may share
# at most a third of their words (more: a near-duplicate, e.g. "I have a dry cough." and
# "I have no cough.")
_STOP = "a an the i my me it is am of to and in on at for when with have has had was be been that "
STOP_WORDS = frozenset(
    (_STOP + "this up out so very all as but by or from do does not no than").split()
)


def _read(name: str) -> list[dict]:
    return [json.loads(x) for x in (DATA / name).read_text().splitlines()]


def _label(row: dict) -> str:
    return row["label"]["diagnosis"]


def _balanced(n: int, seed: int, **kwargs) -> list[dict]:
    return data.generate_synthetic(n, seed, complaints="shared", balanced=True, **kwargs)


def place_spread(rows: list[dict]) -> tuple[int, int]:
    """(the largest spread within a group, the largest within a condition) of how often the
    true condition takes each place of the candidate list: the most often taken place's count
    less the least often taken's (0 where every place is taken equally often)."""
    groups: dict[frozenset, Counter] = defaultdict(Counter)
    conditions: dict[str, Counter] = defaultdict(Counter)
    size: dict[str, int] = {}
    for r in rows:
        place = r["candidates"].index(_label(r))
        groups[frozenset(r["candidates"])][place] += 1
        conditions[_label(r)][place] += 1
        size[_label(r)] = len(r["candidates"])

    def spread(counts: Counter, k: int) -> int:
        return max(counts[p] for p in range(k)) - min(counts[p] for p in range(k))

    return (
        max(spread(c, len(g)) for g, c in groups.items()),
        max(spread(c, size[d]) for d, c in conditions.items()),
    )


def _words(fact: str) -> set[str]:
    return set(data._fact_key(fact.format(d=data.DURATIONS[0])).split()) - STOP_WORDS


def clashes(facts: dict[str, tuple[str, ...]], others: dict[str, tuple[str, ...]]) -> list:
    """(condition, fact, other condition, its fact) for each fact of ``facts`` that is, or
    nearly is (more than a third of their words alike, ``STOP_WORDS`` aside), a fact of
    ``others`` on another condition of its group."""
    found = []
    for group in data.SHARED_COMPLAINTS.values():
        for a, b in itertools.permutations(group, 2):
            for fa, fb in itertools.product(facts[a], others[b]):
                same = data._fact_key(fa.format(d="a week")) == data._fact_key(
                    fb.format(d="a week")
                )
                wa, wb = _words(fa), _words(fb)
                if same or len(wa & wb) / len(wa | wb) > 1 / 3:
                    found.append((a, fa, b, fb))
    return found


def test_the_balanced_files_regenerate_from_their_commands(tmp_path):
    """The README's commands (prepare_data --balanced, seeds 0 and 1) give the shipped files,
    byte for byte."""
    train, test = _read("train_balanced.jsonl"), _read("test_balanced.jsonl")
    assert train == _balanced(88, 0)
    assert test == _balanced(132, 1, exclude=train)
    made_train, made_test = tmp_path / "train.jsonl", tmp_path / "test.jsonl"
    flags = ["--source", "synthetic", "--balanced"]
    assert main([*flags, "--n", "88", "--seed", "0", "--out", str(made_train)]) == 0
    test_flags = ["--n", "132", "--seed", "1", "--exclude", str(made_train)]
    assert main([*flags, *test_flags, "--out", str(made_test)]) == 0
    assert made_train.read_bytes() == (DATA / "train_balanced.jsonl").read_bytes()
    assert made_test.read_bytes() == (DATA / "test_balanced.jsonl").read_bytes()


@pytest.mark.parametrize("split", SIZES)
def test_each_condition_of_a_group_occurs_equally_often(split):
    rows = _read(f"{split}_balanced.jsonl")
    assert len(rows) == SIZES[split]
    counts = Counter(_label(r) for r in rows)
    assert set(counts) == {c.diagnosis for c in data.CONDITIONS}
    assert set(counts.values()) == {SIZES[split] // 22}
    for r in rows:  # the candidates: the case's group, each condition once
        assert sorted(r["candidates"]) == sorted(data.SHARED_COMPLAINTS[GROUP_OF[_label(r)]])


def test_held_out_cases_are_on_trained_conditions_and_not_trained_on():
    train, test = _read("train_balanced.jsonl"), _read("test_balanced.jsonl")
    assert {_label(r) for r in test} <= {_label(r) for r in train}
    assert all(r["unseen_condition"] is False for r in test)
    trained = {data.canonical_key(r) for r in train}
    assert not [r for r in test if data.canonical_key(r) in trained]
    for rows in (train, test):
        assert len({data.canonical_key(r) for r in rows}) == len(rows)  # none twice


@pytest.mark.parametrize("split", SIZES)
def test_the_true_condition_takes_each_place_equally_often(split):
    """Within a group exactly, within a condition within one; the first listed candidate is
    right one time in k."""
    rows = _read(f"{split}_balanced.jsonl")
    assert place_spread(rows) in ((0, 0), (0, 1))
    # the other candidates' order is the case's own: not the table's, and not one order
    orders = Counter(tuple(r["candidates"]) for r in rows)
    assert len(orders) > len(data.SHARED_COMPLAINTS) * 4


def test_the_place_check_catches_a_leaky_file():
    """Candidates in table order (the published files' way) leak the answer by its place: the
    balanced file reordered so, and test_shared.jsonl, fail the check."""
    rows = _read("test_balanced.jsonl")
    table_order = [
        {**r, "candidates": list(data.SHARED_COMPLAINTS[GROUP_OF[_label(r)]])} for r in rows
    ]
    assert place_spread(table_order)[1] == 6  # each condition always at its table place
    assert place_spread(_read("test_shared.jsonl"))[1] > 1


def test_the_opening_is_the_groups_complaint_drawn_apart_from_the_condition():
    rows = _read("train_balanced.jsonl") + _read("test_balanced.jsonl")
    for r in rows:
        m = re.fullmatch(r"I am a (\d+)-year-old (man|woman)\. (.+)", r["prompt"])
        assert m and 18 <= int(m[1]) <= 80, r["prompt"]
        assert m[3] == GROUP_OF[_label(r)]  # the group's complaint, word for word
        told = f" {data.normalise_text(r['prompt'])} "
        for d in r["candidates"]:  # names no candidate
            assert not [n for n in data.synonyms_for(d) if f" {n} " in told], r["prompt"]
    # the opening is drawn before anything of the condition: swapping two conditions of a
    # group (so each case of one is on the other) leaves every opening as it was
    names = [c.diagnosis for c in data.CONDITIONS]
    i, j = names.index("influenza"), names.index("pneumonia")
    swapped = names.copy()
    swapped[i], swapped[j] = names[j], names[i]
    a, b = _balanced(44, 3, conditions=names), _balanced(44, 3, conditions=swapped)
    assert [r["prompt"] for r in a] == [r["prompt"] for r in b]
    assert _label(a[i]) == "influenza" and _label(b[i]) == "pneumonia"


def test_every_fact_tells_its_condition_apart_from_the_rest_of_its_group():
    """No balanced fact is, or nearly is, a fact of another condition of its group (the
    table's own facts had such: "It started {d} ago." for pneumonia and acute
    pyelonephritis, "I have a dry cough." beside "I have no cough."); each condition keeps six
    or more; every case's facts are its condition's alone (four, so two or more)."""
    pools = data.BALANCED_FACTS
    table = {d: data.facts_of(d) for d in pools}
    assert not clashes(pools, pools)
    # the oracle matches facts by key: no balanced fact is a fact, dropped or not, of another
    # condition of its group ("I have a dry cough." may stand beside a dropped "I have no
    # cough.": the case never says the second)
    exact = [c for c in clashes(pools, table) if data._fact_key(c[1]) == data._fact_key(c[3])]
    assert not exact
    original = {c.diagnosis: c.facts for c in data.CONDITIONS}
    found = clashes(original, original)  # the check sees the table's own clashes
    assert (
        "pneumonia",
        "It started {d} ago.",
        "acute pyelonephritis",
        "It started {d} ago.",
    ) in found
    assert ("influenza", "I have a dry cough.", "strep throat", "I have no cough.") in found
    assert min(len(p) for p in pools.values()) >= 6
    assert not [f for p in pools.values() for f in p if "{d}" in f]
    for r in _read("train_balanced.jsonl") + _read("test_balanced.jsonl"):
        own = [f for f in r["facts"] if f in pools[_label(r)]]
        elsewhere = [
            f
            for f in r["facts"]
            for d in r["candidates"]
            if d != _label(r) and data._fact_key(f) in {data._fact_key(x) for x in table[d]}
        ]
        assert len(own) == len(r["facts"]) == 4 and not elsewhere, r
        told = f" {data.normalise_text(r['self_report'])} "
        assert not [n for n in data.synonyms_for(_label(r)) if f" {n} " in told], r


def test_balanced_mode_refuses_what_it_cannot_balance():
    with pytest.raises(ValueError, match="n must be a multiple of 22"):
        _balanced(100, 0)
    with pytest.raises(ValueError, match="complaints must be 'shared'"):
        data.generate_synthetic(22, balanced=True)
    with pytest.raises(ValueError, match="facts_per_case"):
        _balanced(22, 0, facts_per_case=1)
    # C(6, 4) = 15 fact sets for most conditions
    with pytest.raises(ValueError, match=r"n: only 330 distinct new cases .* 'migraine'"):
        _balanced(22 * 16, 0)
    # the training conditions only: the candidates are the group's among them
    rows = _balanced(96, 0, conditions=data.TRAIN_CONDITIONS)  # 6 of each: 2 and 3 divide it
    assert {len(r["candidates"]) for r in rows} == {2, 3}
    assert not {d for r in rows for d in r["candidates"]} & set(data.HELD_OUT_CONDITIONS)
    assert place_spread(rows) == (0, 0)


def test_the_balanced_facts_are_read_from_the_table_and_checked(tmp_path):
    raw = yaml.safe_load(data.CONDITIONS_FILE.read_text(encoding="utf-8"))
    assert data.load_balanced_facts() == (data.BALANCED_FACTS, data.ADDED_FACTS)
    strep, entry = data.BALANCED_FACTS["strep throat"], raw["balanced_facts"]["strep throat"]
    assert "I have a fever." in entry["drop"] and "I have a fever." not in strep
    assert strep[-len(entry["add"]) :] == tuple(entry["add"]) == data.ADDED_FACTS["strep throat"]
    assert data.facts_of("migraine")[:7] == data.CONDITIONS[0].facts
    with pytest.raises(ValueError, match=r"'scurvy' is not in conditions\.yaml"):
        data.facts_of("scurvy")
    path = tmp_path / "conditions.yaml"

    def refused(edit, message):
        broken = json.loads(json.dumps(raw))
        edit(broken["balanced_facts"])
        path.write_text(yaml.safe_dump(broken), encoding="utf-8")
        with pytest.raises(ValueError, match=message):
            data.load_balanced_facts(path)

    refused(lambda b: b.update(scurvy={"add": ["x"]}), r"conditions the table lacks: \['scurvy'\]")
    refused(lambda b: b["stye"]["drop"].append("I sneeze."), r"\['stye'\]\.drop: not facts of")
    refused(lambda b: b["stye"].update(keep=[]), "may have the keys 'drop' and 'add' only")
    refused(lambda b: b["stye"].update(add="x"), r"\['stye'\]\.add must be a list")


def test_the_balanced_files_load_into_the_buffer_with_their_candidates():
    cfg = DataConfig(
        path=str(DATA / "test_balanced.jsonl"),
        metadata_keys=["facts", "self_report", "candidates"],
    )
    buffer = DataBuffer(cfg)
    assert len(buffer) == 132
    sample = buffer.next_groups(1)[0][0]
    case = data.Case.from_sample(sample)
    row = _read("test_balanced.jsonl")[sample.metadata["row"]]
    assert case.candidates == tuple(row["candidates"]) and case.facts == row["facts"]


def test_the_balanced_preset_is_learn_on_the_balanced_files():
    learn = yaml.safe_load((PRESETS / "learn.yaml").read_text())
    balanced = yaml.safe_load((PRESETS / "learn_balanced.yaml").read_text())
    assert balanced["data"]["path"] == "recipes/takes_two/data/train_balanced.jsonl"
    assert balanced["eval"]["path"] == "recipes/takes_two/data/test_balanced.jsonl"
    assert balanced["eval"]["max_prompts"] == 132  # the whole file: its balance kept
    for part in ("data", "eval"):
        own = ("path", "max_prompts")
        assert {k: v for k, v in balanced[part].items() if k not in own} == {
            k: v for k, v in learn[part].items() if k not in own
        }, part
    for key in set(learn) - {"data", "eval", "output_dir"}:
        assert balanced[key] == learn[key], key


def test_demonstrations_are_the_training_cases_as_each_role_sees_them(tmp_path):
    """recipes.takes_two.demos: per case N turns in the recipe's own prompts. The doctor's:
    the candidates reshuffled (the true one at every place of the list over the file, so order
    says nothing), one to four of the case's facts, the final turn naming its condition. The
    patient's: its hidden case, an answer of two of its facts, never the diagnosis. Nothing of
    the held-out file."""
    from recipes.takes_two import demos, prompts

    train = "recipes/takes_two/data/train_balanced.jsonl"
    cases = [json.loads(line) for line in Path(train).read_text().splitlines()]
    out = {}
    for role in ("doctor", "patient"):
        out[role] = tmp_path / f"{role}.jsonl"
        args = ["--role", role, "--train", train, "--per_case", "4", "--out", str(out[role])]
        assert demos.main(args) == 0
    rows = [json.loads(line) for line in out["doctor"].read_text().splitlines()]
    assert len(rows) == 4 * len(cases)
    places, told = set(), set()
    for row, case in zip(rows, [c for c in cases for _ in range(4)], strict=True):
        system, opening, question, answer, final = row["messages"]
        assert system["content"] == prompts.doctor_system(2, 1)
        assert opening["content"].startswith(f"The patient says: {case['prompt']}")
        listed = opening["content"].split("one of: ")[1].rstrip(".)").split(", ")
        assert sorted(listed) == sorted(case["candidates"])
        places.add(listed.index(case["label"]["diagnosis"]))
        assert question["content"] in demos.QUESTIONS
        said = [f for f in case["facts"] if f in answer["content"]]
        told.add(len(said))
        assert said and len(answer["content"]) < sum(len(f) + 1 for f in said) + 80
        assert final["content"].startswith(f"Diagnosis: {case['label']['diagnosis']}\n")
    assert places == {0, 1, 2, 3} and told == {1, 2, 3, 4}
    rows = [json.loads(line) for line in out["patient"].read_text().splitlines()]
    for row, case in zip(rows, [c for c in cases for _ in range(4)], strict=True):
        system, question, answer = row["messages"]
        assert all(f in system["content"] for f in case["facts"])
        assert question["content"] in demos.QUESTIONS
        assert len([f for f in case["facts"] if f in answer["content"]]) == 2
        assert case["label"]["diagnosis"] not in (system["content"] + answer["content"]).lower()
    test = train.replace("train_", "test_")
    held_out = {frozenset(json.loads(x)["facts"]) for x in Path(test).read_text().splitlines()}
    assert held_out and not held_out & {frozenset(c["facts"]) for c in cases}


def test_demonstrations_refuse_a_row_without_its_case_naming_file_and_row(tmp_path, capsys):
    from recipes.takes_two import demos

    bad = tmp_path / "cases.jsonl"
    bad.write_text(json.dumps({"prompt": "I hurt.", "label": {"diagnosis": "gout"}}) + "\n")
    with pytest.raises(SystemExit):
        demos.main(["--train", str(bad), "--out", str(tmp_path / "o.jsonl")])
    err = capsys.readouterr().err
    assert f"{bad}:1:" in err and "facts" in err and "candidates" in err
