"""deep_research data: QA and corpus loaders on small JSONL and Parquet files written here, bad
rows named by file/row/field, the prepare_data CLI, and the shipped generated set."""

from __future__ import annotations

import json
from pathlib import Path

import datasets
import pytest

from kernel.buffer import DataError
from recipes.deep_research import data, make_data, prepare_data

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = ROOT / "recipes" / "deep_research" / "data"


def jsonl(path: Path, rows: list) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def read(path) -> list[dict]:
    return [json.loads(line) for line in Path(path).read_text().splitlines()]


def test_qa_from_jsonl_answers_as_lists(tmp_path):
    path = jsonl(
        tmp_path / "qa.jsonl",
        [
            {"question": " Who wrote Hamlet? ", "answer": "Shakespeare"},
            {"question": "Largest planet?", "answer": "Jupiter "},
        ],
    )
    assert data.load_qa(path) == [
        {"prompt": "Who wrote Hamlet?", "label": ["Shakespeare"], "source": "file"},
        {"prompt": "Largest planet?", "label": ["Jupiter"], "source": "file"},
    ]


def test_search_r1_style_parquet_with_nested_answers(tmp_path):
    # Search-R1's processed rows keep the answers under reward_model.ground_truth.target
    path = str(tmp_path / "train.parquet")
    datasets.Dataset.from_list(
        [
            {"question": "q1", "reward_model": {"ground_truth": {"target": ["a", "b", "a"]}}},
            {"question": "q2", "reward_model": {"ground_truth": {"target": ["c"]}}},
        ]
    ).to_parquet(path)
    rows = data.load_qa(path, answer_key="reward_model.ground_truth.target")
    assert [r["label"] for r in rows] == [["a", "b"], ["c"]]  # duplicates dropped, order kept


def test_known_set_from_a_local_copy(tmp_path):
    # nq_open's columns: question, answer (a list)
    path = jsonl(tmp_path / "nq.jsonl", [{"question": "q", "answer": ["x", "y"]}])
    assert data.load_known_qa("nq", path) == [{"prompt": "q", "label": ["x", "y"], "source": "nq"}]
    with pytest.raises(ValueError, match="source must be one of"):
        data.load_known_qa("triviaqa", path)


@pytest.mark.parametrize(
    ("row", "message"),
    [
        ({"answer": "x"}, "row 2: missing field 'question'"),
        ({"question": "q"}, "row 2: missing field 'answer'"),
        ({"question": "  ", "answer": "x"}, "row 2: field 'question' must be a non-empty string"),
        ({"question": "q", "answer": []}, "row 2: field 'answer' has no non-empty answer"),
        ({"question": "q", "answer": [" "]}, "row 2: field 'answer' has no non-empty answer"),
    ],
)
def test_bad_qa_rows_name_file_row_and_field(tmp_path, row, message):
    path = jsonl(tmp_path / "qa.jsonl", [{"question": "ok", "answer": ["ok"]}, row])
    with pytest.raises(DataError, match=rf"qa\.jsonl: {message}"):
        data.load_qa(path)


def test_qa_error_for_a_missing_file(tmp_path):
    with pytest.raises(DataError, match=r"nope\.jsonl: no such file"):
        data.load_qa(str(tmp_path / "nope.jsonl"))


def test_corpus_with_columns_and_with_contents(tmp_path):
    path = jsonl(
        tmp_path / "c.jsonl",
        [{"doc": 1, "name": "Cats", "body": " Cats purr. "}, {"doc": "b", "body": "No title."}],
    )
    assert data.load_corpus(path, id_key="doc", title_key="name", text_key="body") == [
        {"id": "1", "title": "Cats", "text": "Cats purr."},
        {"id": "b", "title": "", "text": "No title."},
    ]
    wiki = jsonl(tmp_path / "wiki.jsonl", [{"id": "0", "contents": '"Aaron"\nAaron is a prophet.'}])
    assert data.load_corpus(wiki, contents_key="contents") == [
        {"id": "0", "title": "Aaron", "text": "Aaron is a prophet."}
    ]


@pytest.mark.parametrize(
    ("row", "message"),
    [
        ({"title": "t", "text": "x"}, "row 2: missing field 'id'"),
        ({"id": "b", "title": "t"}, "row 2: missing field 'text'"),
        ({"id": True, "text": "x"}, "row 2: field 'id' must be a non-empty string or an integer"),
        ({"id": "b", "text": "   "}, "row 2: the document text is empty"),
        ({"id": "a", "text": "again"}, "row 2: id 'a' already used by row 1"),
    ],
)
def test_bad_corpus_rows_name_file_row_and_field(tmp_path, row, message):
    path = jsonl(tmp_path / "c.jsonl", [{"id": "a", "title": "A", "text": "first"}, row])
    with pytest.raises(DataError, match=rf"c\.jsonl: {message}"):
        data.load_corpus(path)


def test_prepare_data_cli(tmp_path, capsys):
    raw = jsonl(
        tmp_path / "raw.jsonl",
        [{"q": f"question {i}", "a": [f"answer {i}"]} for i in range(5)]
        + [{"q": "question 0", "a": "dup"}],
    )
    out = tmp_path / "out" / "qa.jsonl"
    argv = ["qa", "--source", "file", "--path", raw, "--question-key", "q", "--answer-key", "a"]
    assert prepare_data.main([*argv, "--n", "3", "--out", str(out)]) == 0
    rows = read(out)
    assert len(rows) == 3 and len({r["prompt"] for r in rows}) == 3
    assert all(r["label"] == [r["prompt"].replace("question", "answer")] for r in rows)

    corpus = jsonl(
        tmp_path / "wiki.jsonl", [{"id": i, "contents": f'"T{i}"\nx{i}'} for i in range(4)]
    )
    out = tmp_path / "corpus.jsonl"
    argv = ["corpus", "--path", corpus, "--contents-key", "contents", "--n", "2", "--out", str(out)]
    assert prepare_data.main(argv) == 0
    assert read(out) == [
        {"id": "0", "title": "T0", "text": "x0"},
        {"id": "1", "title": "T1", "text": "x1"},
    ]

    bad = jsonl(tmp_path / "bad.jsonl", [{"q": "x"}])
    argv = ["qa", "--source", "file", "--path", bad, "--question-key", "q", "--out", str(out)]
    assert prepare_data.main(argv) == 2
    assert "bad.jsonl: row 1: missing field 'answer'" in capsys.readouterr().err


def test_prepare_data_help(capsys):
    with pytest.raises(SystemExit) as e:
        prepare_data.main(["qa", "--help"])
    assert e.value.code == 0
    assert "--question-key" in capsys.readouterr().out


def test_shipped_set_is_what_the_generator_writes(tmp_path):
    make_data.main(["--seed", "0", "--out", str(tmp_path)])
    learn = ["--train", "280", "--test", "140", "--prefix", "learn_"]
    make_data.main(["--seed", "0", *learn, "--out", str(tmp_path)])
    names = ("corpus.jsonl", "train.jsonl", "test.jsonl", "learn_train.jsonl", "learn_test.jsonl")
    for name in names:
        assert (tmp_path / name).read_text() == (SHIPPED / name).read_text(), name
    corpus, train, test, learn_train, learn_test = (read(SHIPPED / n) for n in names)
    assert len(corpus) == 200 and len({d["id"] for d in corpus}) == 200
    assert (len(train), len(test)) == (60, 20)
    assert (len(learn_train), len(learn_test)) == (280, 140)
    # round(n * 0.35) two-hop questions: 21 of 60, 7 of 20, 98 of 280, 49 of 140
    for rows, two_hop in ((train, 21), (test, 7), (learn_train, 98), (learn_test, 49)):
        assert sum(r["hops"] == 2 for r in rows) == two_hop
    # held out means no held-out question is about a training question's documents
    for held_in, held_out in ((train, test), (learn_train, learn_test)):
        keys = {data.canonical_key(r) for r in held_in}
        assert not [r["prompt"] for r in held_out if data.canonical_key(r) in keys]
        assert not {r["prompt"] for r in held_in} & {r["prompt"] for r in held_out}
    # every answer is written in one of the documents that support it, and the loaders read it
    docs = {d["id"]: d for d in data.load_corpus(str(SHIPPED / "corpus.jsonl"))}
    for r in train + test + learn_train + learn_test:
        assert r["label"][0] in " ".join(docs[i]["text"] for i in r["support"]), r
    assert (
        data.load_qa(str(SHIPPED / "test.jsonl"), "prompt", "label")[0]["label"] == test[0]["label"]
    )


def test_canonical_key_is_the_source_documents():
    q = {"prompt": "In which town was X born?", "label": ["A"], "hops": 1, "support": ["p001"]}
    same_doc = {**q, "prompt": "What was the profession of X?", "label": ["poet"]}
    assert data.canonical_key(q) == data.canonical_key(same_doc) == "support:p001"
    two_hop = {"prompt": "?", "support": ["p001", "c004"]}
    assert data.canonical_key(two_hop) == "support:c004+p001"  # sorted: order does not matter
    assert data.canonical_key({**two_hop, "support": ["c004", "p001", "c004"]}) == (
        "support:c004+p001"
    )
    assert data.canonical_key(two_hop) != data.canonical_key(q)  # another set of documents
    assert data.canonical_key({"prompt": "?", "support": "p001"}) == "support:p001"
    # no support ids: the prompt, lower case, punctuation dropped, whitespace collapsed
    assert data.canonical_key({"prompt": "  Who wrote\tHAMLET? "}) == "prompt:who wrote hamlet"
    assert data.canonical_key({"prompt": "who wrote Hamlet", "support": []}) == (
        "prompt:who wrote hamlet"
    )


def test_split_shares_no_source_documents_and_fails_when_too_small():
    _, questions = make_data.make_world(seed=3)
    train, test = make_data.split_questions(questions, 3, 280, 140)
    assert (len(train), len(test)) == (280, 140)
    assert not {data.canonical_key(r) for r in train} & {data.canonical_key(r) for r in test}
    with pytest.raises(ValueError, match="not enough 2-hop questions"):
        make_data.split_questions(questions, 3, 400, 100)  # 140 + 35 two-hop of 150
