"""Data of the recipe: Search-R1-style QA sets as buffer rows, and a wiki-style corpus as the
retriever's JSONL.

QA rows are ``{"prompt": question, "label": [gold answers], "source": ...}``: every set's answer
column (a string, a list of strings, or nested like Search-R1's ``golden_answers``) becomes a
list, so reward.py scores against any of them. Known sets (read through ``datasets``: a hub name
needs network or a warm cache; a local .jsonl/.json/.parquet copy of the same columns works
offline):

- Natural Questions, open (``google-research-datasets/nq_open``): ``question``, ``answer`` (list);
- HotpotQA (``hotpotqa/hotpot_qa``, config ``distractor``): ``question``, ``answer`` (string);
- Search-R1's NQ + HotpotQA mix (``PeterJinGo/nq_hotpotqa_train``): ``question``,
  ``golden_answers`` (list);
- any file with ``--question-key`` / ``--answer-key`` (dotted keys reach into nested columns:
  ``reward_model.ground_truth.target``).

Corpus rows are ``{"id", "title", "text"}``. A wiki-style corpus either has those columns (named
by ``title_key`` / ``text_key``) or, like Search-R1's wiki-18 dump, one ``contents`` column whose
first line is the (quoted) title and the rest the text.

Errors name the file (or set), the 1-based row and the field.

``canonical_key`` names what a question is about -- its source documents -- so that a held-out
set can be checked (and built, make_data.py) to share none with its training set: two questions
about the same document ("In which town was X born?", "What was the profession of X?") answer
each other, whatever their wording.
"""

from __future__ import annotations

import string
from collections.abc import Mapping
from typing import Any

from kernel.buffer import DataError, is_data_file, open_dataset

Row = dict[str, Any]

KNOWN_QA = {
    "nq": ("google-research-datasets/nq_open", None, "question", "answer"),
    "hotpotqa": ("hotpotqa/hotpot_qa", "distractor", "question", "answer"),
    "search_r1": ("PeterJinGo/nq_hotpotqa_train", None, "question", "golden_answers"),
}
"""source name -> (hub name, config, question key, answer key)"""


def _get(row: Mapping[str, Any], key: str, where: str) -> Any:
    """``row[key]``, following dots into nested dicts; DataError naming the key if absent."""
    value: Any = row
    for part in key.split("."):
        if not isinstance(value, Mapping) or value.get(part) is None:
            raise DataError(f"{where}: missing field {key!r}")
        value = value[part]
    return value


def map_qa(row: Mapping[str, Any], question_key: str, answer_key: str, where: str) -> Row:
    """One QA row -> ``{"prompt", "label": [answers]}``."""
    question = _get(row, question_key, where)
    if not isinstance(question, str) or not question.strip():
        raise DataError(f"{where}: field {question_key!r} must be a non-empty string")
    answers = _get(row, answer_key, where)
    if isinstance(answers, (str, int, float)):
        answers = [answers]
    if not isinstance(answers, list):
        raise DataError(
            f"{where}: field {answer_key!r} must be a string or a list of strings, "
            f"got {type(answers).__name__}"
        )
    golds = [str(a).strip() for a in answers if a is not None and str(a).strip()]
    if not golds:
        raise DataError(f"{where}: field {answer_key!r} has no non-empty answer")
    return {"prompt": question.strip(), "label": list(dict.fromkeys(golds))}


def load_qa(
    path: str,
    question_key: str = "question",
    answer_key: str = "answer",
    split: str = "train",
    config: str | None = None,
    source: str = "file",
) -> list[Row]:
    """QA rows of a file or hub set (see the module docstring)."""
    name = path if is_data_file(path) else f"{path} [{split}]"
    rows = []
    for i, row in enumerate(open_dataset(path, split, config), start=1):
        rows.append({**map_qa(row, question_key, answer_key, f"{name}: row {i}"), "source": source})
    if not rows:
        raise DataError(f"{name}: no rows")
    return rows


def load_known_qa(source: str, path: str | None = None, split: str = "train") -> list[Row]:
    """A set of ``KNOWN_QA`` from the hub, or from ``path`` (a local copy of its columns)."""
    if source not in KNOWN_QA:
        raise ValueError(f"source must be one of {sorted(KNOWN_QA)}, got {source!r}")
    hub, config, question_key, answer_key = KNOWN_QA[source]
    return load_qa(path or hub, question_key, answer_key, split, config, source)


def split_contents(contents: str) -> tuple[str, str]:
    """Search-R1 / DPR wiki ``contents``: '"Title"\\ntext' -> (title, text)."""
    title, _, text = contents.partition("\n")
    return title.strip().strip('"').strip(), text.strip()


def map_document(
    row: Mapping[str, Any],
    where: str,
    id_key: str = "id",
    title_key: str = "title",
    text_key: str = "text",
    contents_key: str | None = None,
) -> Row:
    """One corpus row -> ``{"id", "title", "text"}`` (ids as strings)."""
    doc_id = _get(row, id_key, where)
    if isinstance(doc_id, bool) or not isinstance(doc_id, (str, int)) or not str(doc_id).strip():
        raise DataError(f"{where}: field {id_key!r} must be a non-empty string or an integer")
    if contents_key is not None:
        contents = _get(row, contents_key, where)
        if not isinstance(contents, str):
            raise DataError(f"{where}: field {contents_key!r} must be a string")
        title, text = split_contents(contents)
    else:
        text, title = _get(row, text_key, where), row.get(title_key) or ""
        for key, value in ((text_key, text), (title_key, title)):
            if not isinstance(value, str):
                raise DataError(f"{where}: field {key!r} must be a string")
    if not text.strip():
        raise DataError(f"{where}: the document text is empty")
    return {"id": str(doc_id).strip(), "title": title.strip(), "text": text.strip()}


def load_corpus(
    path: str,
    id_key: str = "id",
    title_key: str = "title",
    text_key: str = "text",
    contents_key: str | None = None,
    split: str = "train",
) -> list[Row]:
    """Corpus rows of a file or hub set; duplicate ids are an error naming both rows."""
    name = path if is_data_file(path) else f"{path} [{split}]"
    docs: list[Row] = []
    first: dict[str, int] = {}
    for i, row in enumerate(open_dataset(path, split), start=1):
        doc = map_document(row, f"{name}: row {i}", id_key, title_key, text_key, contents_key)
        if doc["id"] in first:
            earlier = first[doc["id"]]
            raise DataError(f"{name}: row {i}: id {doc['id']!r} already used by row {earlier}")
        first[doc["id"]] = i
        docs.append(doc)
    if not docs:
        raise DataError(f"{name}: no documents")
    return docs


_PUNCTUATION = str.maketrans("", "", string.punctuation)


def canonical_key(row: Mapping[str, Any]) -> str:
    """What one QA row is about, for leak checks between a training and a held-out file: its
    source documents (``support`` ids, deduplicated, sorted, joined with ``+``), or, for a row
    that names none, its prompt normalised (lower case, punctuation dropped, whitespace
    collapsed). Held-out rows whose key occurs in the training file leak."""
    support = row.get("support")
    if isinstance(support, (str, int)):
        support = [support]
    ids = sorted({str(i).strip() for i in support or () if str(i).strip()})
    if ids:
        return "support:" + "+".join(ids)
    prompt = str(row.get("prompt") or "").lower().translate(_PUNCTUATION)
    return "prompt:" + " ".join(prompt.split())
