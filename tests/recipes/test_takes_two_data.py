"""takes_two's data: the MTMedDialog converter on small files shaped like DoctorAgent-RL's (and
MrlX's converted JSONL) written here, with the errors bad rows give; the seeded synthetic cases;
the prepare_data CLI; the shipped files as the kernel's DataBuffer reads them."""

from __future__ import annotations

import json
from pathlib import Path

import datasets
import pytest

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
        "label": {"diagnosis": "Tension headache", "recommendation": "Rest and ibuprofen."},
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
    assert rows[1]["label"] == {"diagnosis": "Meniscus tear", "recommendation": "An MRI scan."}
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
    a, b = data.generate_synthetic(30, seed=3), data.generate_synthetic(30, seed=3)
    assert a == b and a != data.generate_synthetic(30, seed=4)
    assert len({r["prompt"] for r in a}) == 30
    assert {r["label"]["diagnosis"] for r in a[:16]} == {c[0] for c in data.CONDITIONS}
    for r in a:
        assert len(r["facts"]) == 4 and r["self_report"] == " ".join(r["facts"])
        hidden = (r["prompt"] + " " + r["self_report"]).lower()
        assert r["label"]["diagnosis"].lower() not in hidden
    others = data.generate_synthetic(5, seed=3, exclude=[r["prompt"] for r in a])
    assert not {r["prompt"] for r in others} & {r["prompt"] for r in a}
    with pytest.raises(ValueError, match="n: only"):
        data.generate_synthetic(2100, seed=0)  # 16 x 63 ages x 2 = 2016 exist


def test_shared_complaints_leave_the_diagnosis_to_the_facts():
    rows = data.generate_synthetic(64, seed=5, complaints="shared")
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


def test_shipped_shared_cases_regenerate_from_their_seeds():
    train = [json.loads(x) for x in (DATA / "train_shared.jsonl").read_text().splitlines()]
    test = [json.loads(x) for x in (DATA / "test_shared.jsonl").read_text().splitlines()]
    assert train == data.generate_synthetic(60, seed=0, complaints="shared")
    exclude = [r["prompt"] for r in train]
    assert test == data.generate_synthetic(128, seed=1, exclude=exclude, complaints="shared")
    assert not {r["prompt"] for r in test} & set(exclude)


def test_prepare_data_cli(tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        main(["--help"])
    assert e.value.code == 0 and "--source" in capsys.readouterr().out
    out = tmp_path / "cases" / "train.jsonl"
    assert main(["--source", "synthetic", "--n", "5", "--seed", "2", "--out", str(out)]) == 0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert rows == data.generate_synthetic(5, seed=2)
    flags = ["--source", "synthetic", "--complaints", "shared", "--n", "5", "--out", str(out)]
    assert main(flags) == 0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert rows == data.generate_synthetic(5, seed=0, complaints="shared")
    src = _jsonl(tmp_path / "mt.jsonl", [MTMED_ROW, MRLX_ROW])
    mt_out = tmp_path / "mt_out.jsonl"
    assert main(["--source", "mtmeddialog", "--path", str(src), "--out", str(mt_out)]) == 0
    assert len(mt_out.read_text().splitlines()) == 2
    assert main(["--source", "mtmeddialog", "--out", str(mt_out)]) == 2  # no --path
    assert "--path" in capsys.readouterr().err
    bad = _jsonl(tmp_path / "bad.jsonl", [_broken("reward_model", "x")])
    assert main(["--source", "mtmeddialog", "--path", str(bad), "--out", str(mt_out)]) == 2


def test_shipped_cases_load_into_the_buffer_and_regenerate_from_their_seeds():
    train = [json.loads(line) for line in (DATA / "train.jsonl").read_text().splitlines()]
    test = [json.loads(line) for line in (DATA / "test.jsonl").read_text().splitlines()]
    assert train == data.generate_synthetic(60, seed=0)
    assert test == data.generate_synthetic(128, seed=1, exclude=[r["prompt"] for r in train])
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
    with pytest.raises(ValueError, match=r"label\.diagnosis"):
        data.Case.from_sample(Sample(prompt="x", label={"recommendation": "r"}))
    with pytest.raises(ValueError, match="metadata_keys"):
        data.Case.from_sample(Sample(prompt="x", label={"diagnosis": "d", "recommendation": "r"}))
    with pytest.raises(ValueError, match="chief complaint"):
        data.Case.from_sample(Sample(prompt=" ", label="d"))
