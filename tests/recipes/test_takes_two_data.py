"""takes_two's data: the MTMedDialog converter on small files shaped like DoctorAgent-RL's (and
MrlX's converted JSONL) written here, with the errors bad rows give; the seeded synthetic cases;
what makes two cases the same (canonical_key) and the synonym table; the prepare_data CLI; the
shipped files as the kernel's DataBuffer reads them, regenerated from their commands, with no
held-out case in training and a quarter of held-out cases on conditions training lacks."""

from __future__ import annotations

import json
from pathlib import Path

import datasets
import pytest
import yaml

from kernel.buffer import DataBuffer, DataConfig, DataError
from kernel.sample import Sample
from recipes.takes_two import data
from recipes.takes_two.prepare_data import main

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "recipes" / "takes_two" / "data"

DOCTOR_PROMPT = (
    "You are an experienced doctor who needs to provide professional diagnosis and advice to "
    "patients through consultation.\n\nPatient's description: I have had a headache for two "
    "weeks.\n\n\nDecide next action:\nAlways output: <think> [Your thoughts] </think> <answer> "
    "[your response] </answer>"
)
MTMED_ROW = {  # DoctorAgent-RL's MTMedDialog_RL rows, the content wrapped in ChatML markers
    "data_source": "MTMedDialog",
    "prompt": [{"role": "user", "content": f"<|im_start|>user\n{DOCTOR_PROMPT}<|im_end|>\n"}],
    "ability": "medical_consultation",
    "reward_model": {
        "ground_truth": {"diagnosis": "Tension headache", "recommendation": "Rest and ibuprofen."},
        "patient_information": [{"doctor_question": ["Where?"], "patient_response": ["Here."]}],
        "enhanced_description": "The pain is like a tight band. It is worse in the evening!\n"
        "I sleep badly.",
    },
    "extra_info": {"index": 17, "split": "train"},
}
MRLX_ROW = {  # MrlX's converted JSONL: messages + extra_info.{chief_complaint, self_report, ...}
    "messages": [{"role": "user", "content": "(MrlX's doctor instructions)"}],
    "extra_info": {
        "index": 3,
        "chief_complaint": "My knee is swollen.",
        "self_report": "It swelled after football. It hurts to bend it.",
        "solution": {"diagnosis": "Meniscus tear", "recommendation": "An MRI scan."},
    },
}


def _jsonl(path: Path, rows: list) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def test_split_facts():
    assert data.split_facts("It hurts. Worse at night!\nWhy now?  No fever") == [
        "It hurts.",
        "Worse at night!",
        "Why now?",
        "No fever",
    ]


def test_convert_mtmeddialog_jsonl_and_mrlx_rows(tmp_path):
    rows = data.load_mtmeddialog(str(_jsonl(tmp_path / "mt.jsonl", [MTMED_ROW, MRLX_ROW])))
    assert rows[0] == {
        "prompt": "I have had a headache for two weeks.",
        "label": {  # no synonym table for MTMedDialog: the label alone, matched exactly
            "diagnosis": "Tension headache",
            "recommendation": "Rest and ibuprofen.",
            "synonyms": ["Tension headache"],
        },
        "facts": [
            "The pain is like a tight band.",
            "It is worse in the evening!",
            "I sleep badly.",
        ],
        "self_report": "The pain is like a tight band. It is worse in the evening! I sleep badly.",
        "source": "mtmeddialog",
        "index": "17",
    }
    assert rows[1]["prompt"] == "My knee is swollen."
    assert rows[1]["label"] == {
        "diagnosis": "Meniscus tear",
        "recommendation": "An MRI scan.",
        "synonyms": ["Meniscus tear"],
    }
    assert rows[1]["facts"] == ["It swelled after football.", "It hurts to bend it."]


def test_convert_mtmeddialog_parquet(tmp_path):
    path = tmp_path / "MTMedDialog_RL.parquet"
    datasets.Dataset.from_list([MTMED_ROW, MTMED_ROW]).to_parquet(str(path))
    rows = data.load_mtmeddialog(str(path))
    assert len(rows) == 2 and rows[1]["prompt"] == "I have had a headache for two weeks."


def _broken(path: str, value) -> dict:
    """MTMED_ROW with the field at dotted ``path`` set to ``value`` (None deletes it)."""
    row = json.loads(json.dumps(MTMED_ROW))
    *parents, last = path.split(".")
    node = row
    for p in parents:
        node = node[p]
    if value is None:
        del node[last]
    else:
        node[last] = value
    return row


@pytest.mark.parametrize(
    ("path", "value", "message"),
    [
        ("reward_model.ground_truth.diagnosis", None, "'reward_model.ground_truth.diagnosis'"),
        ("reward_model.ground_truth.recommendation", "  ", "recommendation' must be a non-empty"),
        ("reward_model.enhanced_description", None, "'reward_model.enhanced_description'"),
        ("prompt", [{"role": "user", "content": "Hello"}], "Patient's description"),
        ("prompt", 5, "field 'prompt' must be"),
    ],
)
def test_bad_rows_name_file_row_and_field(tmp_path, path, value, message):
    file = _jsonl(tmp_path / "bad.jsonl", [MTMED_ROW, _broken(path, value)])
    with pytest.raises(DataError, match="row 2") as e:
        data.load_mtmeddialog(str(file))
    assert str(file) in str(e.value) and message in str(e.value)


def test_bad_files(tmp_path):
    broken = tmp_path / "broken.jsonl"
    broken.write_text(json.dumps(MTMED_ROW) + "\n\n{not json\n", encoding="utf-8")
    with pytest.raises(DataError, match=r"row 3: not valid JSON"):  # the file's line number
        data.load_mtmeddialog(str(broken))
    with pytest.raises(DataError, match="row 1: not a JSON object"):
        data.load_mtmeddialog(str(_jsonl(tmp_path / "list.jsonl", [[1, 2]])))
    with pytest.raises(DataError, match="no such file"):
        data.load_mtmeddialog(str(tmp_path / "missing.parquet"))
    with pytest.raises(DataError, match=r"expected a \.jsonl"):
        data.load_mtmeddialog(str(_jsonl(tmp_path / "rows.csv", [])))
    with pytest.raises(DataError, match="has no rows"):
        data.load_mtmeddialog(str(_jsonl(tmp_path / "empty.jsonl", [])))


def test_synthetic_cases_are_seeded_distinct_and_never_state_the_diagnosis():
    a, b = data.generate_synthetic(44, seed=3), data.generate_synthetic(44, seed=3)
    assert a == b and a != data.generate_synthetic(44, seed=4)
    assert len({data.canonical_key(r) for r in a}) == 44  # no case twice
    names = [c.diagnosis for c in data.CONDITIONS]
    assert [r["label"]["diagnosis"] for r in a] == names + names  # in turn
    for r in a:
        assert len(r["facts"]) == 4 and r["self_report"] == " ".join(r["facts"])
        assert "unseen_condition" not in r  # only rows made against a training set have it
        told = f" {data.normalise_text(r['prompt'] + ' ' + r['self_report'])} "
        for name in data.synonyms_for(r["label"]["diagnosis"]):  # no name of it is told
            assert f" {name} " not in told, (name, r)
    others = data.generate_synthetic(22, seed=3, exclude=a)
    assert not {data.canonical_key(r) for r in others} & {data.canonical_key(r) for r in a}
    assert all(r["unseen_condition"] is False for r in others)
    # 22 conditions x C(7, 4) = 35 fact sets each
    with pytest.raises(ValueError, match=r"n: only 770 distinct new cases .* 'migraine'"):
        data.generate_synthetic(771, seed=0)
    with pytest.raises(ValueError, match="conditions: unknown"):
        data.generate_synthetic(2, conditions=["scurvy"])


def test_canonical_key_ignores_age_sex_duration_and_fact_order_only():
    row = data.generate_synthetic(1, seed=0)[0]  # migraine
    key = data.canonical_key(row)
    assert key.startswith("migraine | ")
    other = json.loads(json.dumps(row))
    other["prompt"] = "I am a 33-year-old man. I am in a lot of pain."  # age, sex, complaint
    other["facts"] = list(reversed(row["facts"]))
    other["self_report"] = "(ignored when facts are given)"
    other["label"]["diagnosis"] = " Migraine."
    assert data.canonical_key(other) == key
    # the seeded duration is a detail, like the age
    dated = "The attacks started {d} ago."
    rows = [
        {"label": {"diagnosis": "migraine"}, "facts": [dated.format(d=d)]} for d in data.DURATIONS
    ]
    assert len({data.canonical_key(r) for r in rows}) == 1
    # another fact set, or another condition, is another case
    assert data.canonical_key({**row, "facts": row["facts"][:3]}) != key
    assert data.canonical_key({**row, "label": {"diagnosis": "gout"}}) != key
    # a row with a self-report only, and a bare-string label
    assert (
        data.canonical_key({"label": "Migraine", "self_report": " ".join(reversed(row["facts"]))})
        == key
    )


def test_synonym_table_covers_every_condition_and_names_each_once():
    owner: dict[str, str] = {}
    for c in data.CONDITIONS:
        assert c.synonyms[0] == c.diagnosis and len(c.facts) == 7, c.diagnosis
        for name in c.synonyms:
            assert data.normalise_diagnosis(name) == name, name  # stored in normal form
            assert name not in owner, f"{name!r}: {owner.get(name)} and {c.diagnosis}"
            owner[name] = c.diagnosis
    assert set(data.DIAGNOSIS_SYNONYMS) == {c.diagnosis for c in data.CONDITIONS}
    # the names the table leaves out on purpose: broader or neighbouring conditions
    for broad in ("anemia", "anaemia", "conjunctivitis", "back pain", "diabetes", "headache"):
        assert broad not in owner, broad
    assert set(data.HELD_OUT_CONDITIONS) | set(data.TRAIN_CONDITIONS) == set(owner.values())
    assert not set(data.HELD_OUT_CONDITIONS) & set(data.TRAIN_CONDITIONS)
    # a label with no entry is refused by name, unless the row gives synonyms
    with pytest.raises(ValueError, match=r"'scurvy' has no entry.*label\.synonyms"):
        data.synonyms_for("scurvy")
    assert data.synonyms_for("Scurvy", ["vitamin C deficiency"]) == {
        "scurvy",
        "vitamin c deficiency",
    }


def test_shared_complaints_leave_the_diagnosis_to_the_facts():
    rows = data.generate_synthetic(88, seed=5, complaints="shared")
    groups = data.SHARED_COMPLAINTS
    assert sorted(d for g in groups.values() for d in g) == sorted(c[0] for c in data.CONDITIONS)
    by_complaint: dict[str, set[str]] = {}
    for r in rows:
        complaint = r["prompt"].split(". ", 1)[1]  # after "I am a 26-year-old man."
        assert r["label"]["diagnosis"] in groups[complaint]
        assert r["label"]["diagnosis"].lower() not in r["prompt"].lower()
        by_complaint.setdefault(complaint, set()).add(r["label"]["diagnosis"])
    assert by_complaint == {c: set(g) for c, g in groups.items()}  # every opening is ambiguous
    # the facts tell a group's conditions apart: every case has 3+ facts no other condition
    # of its group has (a generic one, e.g. "It started {d} ago.", may be shared)
    pools = {c[0]: {f.format(d=d) for f in c[3] for d in data.DURATIONS} for c in data.CONDITIONS}
    for r in rows:
        complaint = r["prompt"].split(". ", 1)[1]
        others = set().union(*(pools[d] for d in groups[complaint] if d != r["label"]["diagnosis"]))
        assert len(set(r["facts"]) - others) >= 3, r
    with pytest.raises(ValueError, match="complaints must be one of"):
        data.generate_synthetic(4, complaints="vague")


def _read(name: str) -> list[dict]:
    return [json.loads(x) for x in (DATA / name).read_text().splitlines()]


@pytest.mark.parametrize("complaints", data.COMPLAINTS)
def test_shipped_cases_regenerate_from_their_commands(complaints, tmp_path):
    """The README's commands (prepare_data, seeds 0 and 1) give the shipped files, byte for
    byte, from the condition table in data/conditions.yaml."""
    suffix = "_shared" if complaints == "shared" else ""
    train, test = _read(f"train{suffix}.jsonl"), _read(f"test{suffix}.jsonl")
    conditions = data.TRAIN_CONDITIONS
    assert train == data.generate_synthetic(60, 0, conditions=conditions, complaints=complaints)
    assert test == data.generate_synthetic(128, 1, exclude=train, complaints=complaints)
    flags = ["--source", "synthetic", "--complaints", complaints]
    made_train, made_test = tmp_path / "train.jsonl", tmp_path / "test.jsonl"
    train_flags = [*flags, "--conditions", "train", "--n", "60", "--seed", "0"]
    test_flags = [*flags, "--n", "128", "--seed", "1", "--exclude", str(made_train)]
    assert main([*train_flags, "--out", str(made_train)]) == 0
    assert main([*test_flags, "--out", str(made_test)]) == 0
    assert made_train.read_bytes() == (DATA / f"train{suffix}.jsonl").read_bytes()
    assert made_test.read_bytes() == (DATA / f"test{suffix}.jsonl").read_bytes()


def test_the_condition_table_is_read_from_its_file_and_checked(tmp_path):
    """data.py reads the synthetic conditions from data/conditions.yaml once; a table file
    that is not as it expects fails naming the file and the entry."""
    assert data.CONDITIONS_FILE == DATA / "conditions.yaml"
    table = data.load_conditions()
    assert table == (
        data.CONDITIONS,
        data.DURATIONS,
        data.HELD_OUT_CONDITIONS,
        data.SHARED_COMPLAINTS,
    )
    assert len(data.CONDITIONS) == 22 and data.DURATIONS[0] == "two days"
    assert all(isinstance(c.facts, tuple) and isinstance(c.synonyms, tuple) for c in table[0])
    raw = yaml.safe_load(data.CONDITIONS_FILE.read_text(encoding="utf-8"))
    path = tmp_path / "conditions.yaml"

    def refused(edit, message):
        broken = json.loads(json.dumps(raw))
        edit(broken)
        path.write_text(yaml.safe_dump(broken), encoding="utf-8")
        with pytest.raises(ValueError, match=message):
            data.load_conditions(path)

    refused(lambda t: t["conditions"][1].pop("synonyms"), r"conditions\[1\] must have the keys")
    refused(lambda t: t["conditions"][0].update(facts="one"), r"conditions\[0\]\.facts must be")
    refused(lambda t: t["conditions"][2].update(complaint=True), r"conditions\[2\]\.complaint")
    refused(lambda t: t["held_out_conditions"].append("scurvy"), r"missing \['scurvy'\]")
    refused(lambda t: t.pop("durations"), "conditions.yaml: the table must have exactly the keys")


@pytest.mark.parametrize("suffix", ["", "_shared"])
def test_shipped_held_out_cases_are_not_trained_on(suffix):
    """No held-out case's condition and fact set occurs in training (age, sex, duration and
    fact order aside); a quarter of held-out cases are on conditions training lacks, and each
    held-out row says whether it is."""
    train, test = _read(f"train{suffix}.jsonl"), _read(f"test{suffix}.jsonl")
    assert (len(train), len(test)) == (60, 128)
    trained = {data.canonical_key(r) for r in train}
    assert not [r for r in test if data.canonical_key(r) in trained]
    assert len({data.canonical_key(r) for r in test}) == 128  # and none twice
    train_conditions = {r["label"]["diagnosis"] for r in train}
    assert train_conditions == set(data.TRAIN_CONDITIONS)
    for r in test:
        assert r["unseen_condition"] is (r["label"]["diagnosis"] not in train_conditions), r
    unseen = [r for r in test if r["unseen_condition"]]
    assert len(unseen) == 34 >= 128 / 4
    assert {r["label"]["diagnosis"] for r in unseen} == set(data.HELD_OUT_CONDITIONS)
    for r in train + test:  # every shipped label is in the synonym table
        assert data.synonyms_for(r["label"]["diagnosis"]), r


def test_prepare_data_cli(tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        main(["--help"])
    assert e.value.code == 0 and "--source" in capsys.readouterr().out
    out = tmp_path / "cases" / "train.jsonl"
    assert main(["--source", "synthetic", "--n", "5", "--seed", "2", "--out", str(out)]) == 0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert rows == data.generate_synthetic(5, seed=2)
    flags = ["--source", "synthetic", "--complaints", "shared", "--conditions", "train"]
    assert main([*flags, "--n", "20", "--out", str(out)]) == 0
    train = [json.loads(line) for line in out.read_text().splitlines()]
    assert train == data.generate_synthetic(
        20, seed=0, complaints="shared", conditions=data.TRAIN_CONDITIONS
    )
    test_out = tmp_path / "cases" / "test.jsonl"
    flags = ["--source", "synthetic", "--complaints", "shared", "--exclude", str(out)]
    assert main([*flags, "--n", "22", "--seed", "1", "--out", str(test_out)]) == 0
    test = [json.loads(line) for line in test_out.read_text().splitlines()]
    assert test == data.generate_synthetic(22, seed=1, exclude=train, complaints="shared")
    assert sum(r["unseen_condition"] for r in test) == 6  # one case per held-out condition
    src = _jsonl(tmp_path / "mt.jsonl", [MTMED_ROW, MRLX_ROW])
    mt_out = tmp_path / "mt_out.jsonl"
    assert main(["--source", "mtmeddialog", "--path", str(src), "--out", str(mt_out)]) == 0
    assert len(mt_out.read_text().splitlines()) == 2
    # held out against a file holding the first row's case: it is left out, the other marked
    first = _jsonl(tmp_path / "first.jsonl", [data.map_mtmeddialog(MTMED_ROW)])
    flags = ["--source", "mtmeddialog", "--path", str(src), "--exclude", str(first)]
    assert main([*flags, "--out", str(mt_out)]) == 0
    (kept,) = [json.loads(line) for line in mt_out.read_text().splitlines()]
    assert kept["prompt"] == "My knee is swollen." and kept["unseen_condition"] is True
    assert main(["--source", "mtmeddialog", "--out", str(mt_out)]) == 2  # no --path
    assert "--path" in capsys.readouterr().err
    bad = _jsonl(tmp_path / "bad.jsonl", [_broken("reward_model", "x")])
    assert main(["--source", "mtmeddialog", "--path", str(bad), "--out", str(mt_out)]) == 2


def test_shipped_cases_load_into_the_buffer():
    train = _read("train.jsonl")
    cfg = DataConfig(path=str(DATA / "train.jsonl"), metadata_keys=["facts", "self_report"])
    buffer = DataBuffer(cfg)
    assert len(buffer) == 60
    seed = buffer.next_groups(1)[0][0]
    case = data.Case.from_sample(seed)
    row = train[seed.metadata["row"]]
    assert case == data.Case(
        row["prompt"], row["facts"], row["label"]["diagnosis"], row["label"]["recommendation"]
    )


def test_case_from_sample_variants_and_errors():
    s = Sample(prompt=[{"role": "user", "content": "My knee hurts."}], label="Meniscus tear")
    s.metadata = {"recommendation": "MRI", "self_report": "It swelled. It clicks."}
    assert data.Case.from_sample(s) == data.Case(
        "My knee hurts.", ["It swelled.", "It clicks."], "Meniscus tear", "MRI"
    )
    s.label = {"diagnosis": "Meniscus tear", "recommendation": "MRI", "synonyms": ["torn meniscus"]}
    assert data.Case.from_sample(s).synonyms == ("torn meniscus",)
    s.label["synonyms"] = "torn meniscus"
    with pytest.raises(ValueError, match=r"label\.synonyms must be a list"):
        data.Case.from_sample(s)
    with pytest.raises(ValueError, match=r"label\.diagnosis"):
        data.Case.from_sample(Sample(prompt="x", label={"recommendation": "r"}))
    with pytest.raises(ValueError, match="metadata_keys"):
        data.Case.from_sample(Sample(prompt="x", label={"diagnosis": "d", "recommendation": "r"}))
    with pytest.raises(ValueError, match="chief complaint"):
        data.Case.from_sample(Sample(prompt=" ", label="d"))
