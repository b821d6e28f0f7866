"""Tests for kernel.buffer.DataBuffer: loading and validating data, prompt groups and epochs,
requeueing aborted groups, per-agent queues, and exact save/restore (a hypothesis property test
checks that a resumed run neither repeats nor skips a prompt).
"""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kernel import buffer as kb
from kernel.buffer import DataBuffer, DataConfig, DataError
from kernel.sample import Sample, Status

DATA = Path(__file__).parent / "data"
PROMPTS = DATA / "buffer_prompts.jsonl"  # 5 rows on lines 1, 2, 4, 5, 6 (line 3 is blank)


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def buffer(path: Path, **kw) -> DataBuffer:
    return DataBuffer(DataConfig(path=str(path), **kw))


def rows_of(groups: list[list[Sample]]) -> list[int]:
    return [g[0].metadata["row"] for g in groups]


# ---- loading ---------------------------------------------------------------------------------


def test_jsonl_prompts_labels_and_metadata():
    buf = buffer(PROMPTS, metadata_keys=["source", "level"], shuffle=False, n_samples_per_prompt=2)
    assert len(buf) == 5
    groups = buf.next_groups(3)
    assert [g[0].prompt for g in groups] == [
        "What is 2 + 3?",
        "What is 7 * 6?",
        "Name the capital of France.",
    ]
    assert [g[0].label for g in groups] == ["5", "42", "Paris"]
    assert groups[2][1].metadata == {"source": "geo", "level": 1, "row": 2}


def test_label_key_none_and_max_prompts():
    buf = buffer(PROMPTS, label_key=None, max_prompts=2, shuffle=False)
    assert len(buf) == 2
    # 2 prompts: the third group starts epoch 1, which (unshuffled) begins at row 0 again.
    assert rows_of(buf.next_groups(3)) == [0, 1, 0]
    assert buf.epoch == 1


def test_parquet_chat_messages():
    buf = buffer(DATA / "buffer_chat.parquet", input_key="messages", label_key="answer")
    groups = sorted(buf.next_groups(3), key=lambda g: g[0].metadata["row"])
    assert groups[0][0].prompt == [
        {"role": "system", "content": "You are a doctor."},
        {"role": "user", "content": "I have a headache."},
    ]
    # Arrow pads every message with name=None; only the message that had a name keeps it.
    assert groups[1][0].prompt == [{"role": "user", "content": "My knee hurts.", "name": "patient"}]
    assert [g[0].label for g in groups] == ["migraine", "sprain", "asthma"]


def test_parquet_string_prompts(tmp_path):
    path = tmp_path / "p.parquet"
    pq.write_table(pa.Table.from_pylist([{"prompt": "a", "label": 1}, {"prompt": "b"}]), path)
    with pytest.raises(DataError, match=r"p\.parquet: row 2: missing key 'label'"):
        buffer(path)
    assert rows_of(buffer(path, label_key=None, shuffle=False).next_groups(2)) == [0, 1]


def test_malformed_row_names_file_row_and_key():
    # Row 4 of the data lacks "label"; in the file it is line 5, after a blank line 3.
    with pytest.raises(DataError) as e:
        buffer(DATA / "buffer_malformed.jsonl")
    msg = str(e.value)
    assert "buffer_malformed.jsonl" in msg
    assert "row 5" in msg
    assert "'label'" in msg


@pytest.mark.parametrize(
    ("rows", "kw", "expected"),
    [
        ([{"prompt": "a"}, {"prompt": "  "}], {"label_key": None}, "row 2: key 'prompt': empty"),
        ([{"prompt": "a"}, {"prompt": []}], {"label_key": None}, "row 2: key 'prompt': empty"),
        ([{"q": "a", "label": 1}], {}, "row 1: missing key 'prompt'"),
        (
            [{"prompt": "a", "label": 1, "src": "x"}, {"prompt": "b", "label": 2}],
            {"metadata_keys": ["src"]},
            "row 2: missing key 'src'",
        ),
        (
            [{"prompt": [{"role": "user", "content": "hi"}, {"role": "assistant"}]}],
            {"label_key": None},
            "row 1: key 'prompt': message 2 has no 'content'",
        ),
        ([{"prompt": 3}], {"label_key": None}, "row 1: key 'prompt': prompt must be a string"),
    ],
)
def test_bad_rows(tmp_path, rows, kw, expected):
    path = write_jsonl(tmp_path / "d.jsonl", rows)
    with pytest.raises(DataError, match=f"d.jsonl: {expected}"):
        buffer(path, **kw)


def test_unreadable_jsonl_names_the_line(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"prompt": "a"}\n{"prompt": oops}\n')
    with pytest.raises(DataError, match=r"bad\.jsonl: row 2: not valid JSON"):
        buffer(path, label_key=None)
    path.write_text('{"prompt": "a"}\n["b"]\n')
    with pytest.raises(DataError, match=r"bad\.jsonl: row 2: not a JSON object"):
        buffer(path, label_key=None)


def test_missing_file():
    with pytest.raises(DataError, match=r"nope\.jsonl: no such file"):
        buffer(Path("nope.jsonl"))


@pytest.mark.parametrize(
    ("kw", "field"),
    [
        ({"path": ""}, "path"),
        ({"n_samples_per_prompt": 0}, "n_samples_per_prompt"),
        ({"prompts_per_step": 0}, "prompts_per_step"),
        ({"max_prompts": 0}, "max_prompts"),
        ({"metadata_keys": ["row"]}, "metadata_keys"),
    ],
)
def test_config_validate_names_field(kw, field):
    with pytest.raises(ValueError, match=field):
        DataConfig(**{"path": "x.jsonl", **kw}).validate()


# ---- groups, shuffling, epochs ---------------------------------------------------------------


def test_groups_have_n_samples_with_ids():
    buf = buffer(PROMPTS, n_samples_per_prompt=3, prompts_per_step=2)
    groups = buf.next_groups() + buf.next_groups()
    assert [len(g) for g in groups] == [3, 3, 3, 3]
    assert [[s.group_id for s in g] for g in groups] == [[0] * 3, [1] * 3, [2] * 3, [3] * 3]
    assert all([s.index for s in g] == [0, 1, 2] for g in groups)
    assert all(s.status is Status.PENDING for g in groups for s in g)
    # Samples of a group are independent copies: editing one prompt leaves its siblings alone.
    groups[0][0].metadata["x"] = 1
    assert "x" not in groups[0][1].metadata


def test_same_seed_same_order_and_each_prompt_once_per_epoch():
    a = rows_of(buffer(PROMPTS, seed=7).next_groups(15))
    b = rows_of(buffer(PROMPTS, seed=7).next_groups(15))
    c = rows_of(buffer(PROMPTS, seed=8).next_groups(15))
    assert a == b
    assert a != c
    epochs = [a[0:5], a[5:10], a[10:15]]
    assert all(sorted(e) == [0, 1, 2, 3, 4] for e in epochs)
    # 5 prompts have 5! = 120 orders; seeds 7, 8, 9 happen to give three different ones.
    assert len({tuple(e) for e in epochs}) == 3


def test_epoch_boundary_is_seamless():
    buf = buffer(PROMPTS, seed=3)
    whole = rows_of(buffer(PROMPTS, seed=3).next_groups(10))
    # 3 + 4 + 3 groups: the middle call crosses from epoch 0 into epoch 1.
    parts = rows_of(buf.next_groups(3)) + rows_of(buf.next_groups(4))
    assert buf.epoch == 1
    assert parts + rows_of(buf.next_groups(3)) == whole
    assert buf.epoch == 2


# ---- requeue ---------------------------------------------------------------------------------


def test_requeue_goes_first_with_original_id_once():
    buf = buffer(PROMPTS, seed=1, n_samples_per_prompt=2)
    g0, g1, g2 = buf.next_groups(3)
    buf.requeue(g2[:1])  # one surviving sample identifies the group; it comes back whole
    buf.requeue(g0)
    buf.requeue(g0)  # a second requeue of a waiting group does not double it
    again = buf.next_groups(3)
    assert [g[0].group_id for g in again] == [0, 2, 3]  # requeued in id order, then new ones
    assert rows_of(again)[:2] == [g0[0].metadata["row"], g2[0].metadata["row"]]
    assert [s.index for s in again[1]] == [0, 1]
    with pytest.raises(ValueError, match="several groups"):
        buf.requeue([g0[0], g1[0]])
    with pytest.raises(ValueError, match="never handed out"):
        buf.requeue([Sample(group_id=99, metadata={"row": 0})])


# ---- per-agent queues ------------------------------------------------------------------------


def test_put_routes_by_agent():
    buf = buffer(PROMPTS)
    done = [
        Sample(agent=agent, group_id=g, status=Status.COMPLETED)
        for g, agent in enumerate(["doctor", "patient", "doctor", "doctor"])
    ]
    buf.put(done)
    assert (buf.pending("doctor"), buf.pending("patient"), buf.pending("judge")) == (3, 1, 0)
    assert [s.group_id for s in buf.take("doctor", 2)] == [0, 2]
    assert [s.group_id for s in buf.take("doctor")] == [3]
    assert [s.group_id for s in buf.take("patient", 5)] == [1]
    assert buf.take("judge") == []
    with pytest.raises(ValueError, match="is aborted"):
        buf.put([Sample(status=Status.ABORTED)])


# ---- save / restore --------------------------------------------------------------------------


def test_queued_samples_survive_a_save_and_restore():
    buf = buffer(PROMPTS)
    kept = Sample(
        prompt_ids=[1, 2],
        response_ids=[3, 4],
        loss_mask=[1, 0],
        rollout_logprobs=[-0.5, 0.0],
        agent="patient",
        group_id=7,
        index=3,
        status=Status.TRUNCATED,
        raw_reward=0.25,
        reward=0.2,
        advantage=-1.5,
        weight_versions=[4],
        metadata={"row": 7, "text": "12", "odd": {1, 2}},  # a set: JSON keeps it as text
    )
    buf.put([kept])
    state = json.loads(json.dumps(buf.state_dict()))  # what a checkpoint's state.json holds
    fresh = buffer(PROMPTS)
    fresh.load_state_dict(state)
    (back,) = fresh.take("patient")
    assert back.status is Status.TRUNCATED and back.metadata["odd"] == "{1, 2}"
    back.metadata["odd"] = kept.metadata["odd"]
    assert back == kept
    assert fresh.pending("patient") == 0


def test_state_mismatch_is_refused():
    state = buffer(PROMPTS, seed=1).state_dict()
    with pytest.raises(ValueError, match="seed is 2 but the saved run had 1"):
        buffer(PROMPTS, seed=2).load_state_dict(state)
    with pytest.raises(ValueError, match="num_prompts is 3 but the saved run had 5"):
        buffer(PROMPTS, seed=1, max_prompts=3).load_state_dict(state)


@pytest.fixture(scope="module")
def dataset_of_size(tmp_path_factory):
    """JSONL files of n distinct prompts, written once per size."""
    root = tmp_path_factory.mktemp("sizes")

    def make(n: int) -> Path:
        path = root / f"{n}.jsonl"
        if not path.exists():
            write_jsonl(path, [{"prompt": f"p{i}", "label": i} for i in range(n)])
        return path

    return make


# An op is ("next", k) or ("requeue", j): requeue the j-th (mod len) group of the last call,
# as the rollout does when a weight update aborts it.
OPS = st.lists(
    st.one_of(
        st.tuples(st.just("next"), st.integers(0, 7)),
        st.tuples(st.just("requeue"), st.integers(0, 7)),
    ),
    min_size=1,
    max_size=12,
)


@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    size=st.integers(1, 6),
    group=st.integers(1, 3),
    seed=st.integers(0, 3),
    ops=OPS,
    cut=st.integers(0, 12),
)
def test_resume_neither_repeats_nor_skips(dataset_of_size, size, group, seed, ops, cut):
    path = dataset_of_size(size)
    cfg = DataConfig(path=str(path), n_samples_per_prompt=group, seed=seed)

    def run(restore_at: int | None) -> list[tuple[int, int]]:
        buf = DataBuffer(cfg)
        stream: list[tuple[int, int]] = []  # (group_id, row) in hand-out order
        last: list[list[Sample]] = []
        for i, (op, k) in enumerate(ops):
            if i == restore_at:
                state = json.loads(json.dumps(buf.state_dict()))
                buf = DataBuffer(cfg)
                buf.load_state_dict(state)
            if op == "next":
                last = buf.next_groups(k)
                for g in last:
                    assert [s.index for s in g] == list(range(group))
                    assert {(s.group_id, s.metadata["row"]) for s in g} == {
                        (g[0].group_id, g[0].metadata["row"])
                    }
                stream += [(g[0].group_id, g[0].metadata["row"]) for g in last]
            elif last:
                buf.requeue(last[k % len(last)])
        return stream

    resumed = run(restore_at=min(cut, len(ops) - 1))
    assert resumed == run(restore_at=None)

    # No prompt repeated or skipped: first issues of group ids 0, 1, 2, ... in order, read in
    # chunks of `size`, are each one whole epoch; every re-issue has its original row.
    first: dict[int, int] = {}
    for gid, row in resumed:
        assert first.setdefault(gid, row) == row
    assert sorted(first) == list(range(len(first)))
    rows = [first[gid] for gid in range(len(first))]
    for start in range(0, len(rows), size):
        epoch = rows[start : start + size]
        assert len(set(epoch)) == len(epoch)
        assert len(epoch) < size or sorted(epoch) == list(range(size))


# ---- the helpers recipes' data scripts share ------------------------------------------------


def test_write_jsonl_is_atomic_and_reads_back(tmp_path, monkeypatch):
    out = tmp_path / "new" / "rows.jsonl"
    rows = [{"prompt": "é 1", "label": 1}, {"prompt": "2", "label": [2]}]
    kb.write_jsonl(rows, out)  # the folder is made
    assert [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()] == rows
    assert "é" in out.read_text(encoding="utf-8")  # not escaped
    assert not (tmp_path / "new" / "rows.jsonl.tmp").exists()

    def broken():  # a crash halfway through: the old file stays whole
        yield {"prompt": "3"}
        raise RuntimeError("killed")

    with pytest.raises(RuntimeError):
        kb.write_jsonl(broken(), out)
    assert [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()] == rows


def test_dedup_keeps_the_first_row_of_each_key():
    rows = [{"prompt": "a", "i": 0}, {"prompt": "b", "i": 1}, {"prompt": "a", "i": 2}]
    assert [r["i"] for r in kb.dedup(rows)] == [0, 1]
    assert [r["i"] for r in kb.dedup(rows, key="i")] == [0, 1, 2]


def test_open_dataset_reads_files_and_names_what_is_missing(tmp_path):
    path = write_jsonl(tmp_path / "d.jsonl", [{"q": "x"}])
    assert kb.is_data_file(str(path)) and not kb.is_data_file("org/name")
    assert kb.open_dataset(str(path))["q"] == ["x"]
    with pytest.raises(DataError, match=r"nope.parquet: no such file"):
        kb.open_dataset(str(tmp_path / "nope.parquet"))
    # tests/conftest.py sets HF_HUB_OFFLINE=1: the hub refuses at once, and the error says
    # what to do instead, with the caller's own alternative
    with pytest.raises(DataError, match=r"cannot load 'org/name'.*local .parquet.*or use X"):
        kb.open_dataset("org/name", config="c", offline=", or use X")
