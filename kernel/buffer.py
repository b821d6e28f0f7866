"""DataBuffer: the prompt source of a run, its prompt groups, the per-agent sample queues, and
the state that lets a resumed run continue exactly where it stopped.

Why one object: the three jobs share one invariant, "every prompt is rolled out exactly once per
epoch". Prompts leave the buffer as whole groups (``n_samples_per_prompt`` PENDING samples of one
data row sharing a ``group_id``); a group whose rollout was aborted comes back with
``requeue`` and is handed out again, first, with its original ``group_id``; ``state_dict`` saves
the epoch, the position in it and the requeued groups, so a resumed run neither repeats nor skips
a prompt.

The buffer only ever hands out whole groups, and a requeued group is rolled out again whole, from
its data row. It never trims or pads a partial group to fit a batch: grouped advantages (GRPO and
friends) need every sample of a group, so deciding what to do with a group that lost samples is
the rollout's job (requeue it), not something to normalise silently here.

Every source is read through ``datasets`` (a local ``.jsonl``/``.json``/``.parquet`` file or a
hub dataset name), so one code path serves all. All rows are validated at load time: a bad row
9,000 fails at start-up, not at step 300, with the file, the 1-based row number and the key.
"""

from __future__ import annotations

import copy
import json
import os
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from kernel.benchmarks import is_benchmark, load_benchmark
from kernel.sample import Sample, Status

Dataset = Any
"""A ``datasets.Dataset``. Not imported for the annotation, even under TYPE_CHECKING: the CLI's
parser (jsonargparse) runs TYPE_CHECKING blocks to read annotations, and ``datasets`` takes
over a second to import; it is imported where rows are read."""

_FILE_BUILDERS = {".jsonl": "json", ".json": "json", ".parquet": "parquet"}


class DataError(ValueError):
    """The data cannot be used; the message names the file, the 1-based row and the key."""


@dataclass
class DataConfig:
    """Where the prompts come from and how they are grouped and ordered."""

    path: str = ""
    """a .jsonl/.json/.parquet file, or a Hugging Face dataset name"""
    split: str = "train"
    """split to read from a hub dataset (a local file is a single split)"""
    input_key: str = "prompt"
    """column holding the prompt: a string or a list of chat messages {role, content}"""
    label_key: str | None = "label"
    """column holding the ground truth for the reward; None if the data has none"""
    metadata_keys: list[str] = field(default_factory=list)
    """extra columns copied into every sample's metadata"""
    n_samples_per_prompt: int = 4
    """samples rolled out per prompt (the group size for grouped advantages)"""
    prompts_per_step: int = 8
    """prompt groups drawn per training step"""
    shuffle: bool = True
    """shuffle the prompts, with a different permutation every epoch"""
    seed: int = 42
    """shuffling seed; epoch e uses seed + e"""
    max_prompts: int | None = None
    """use only the first N rows of the data (small runs, smoke tests); None for all"""

    def validate(self) -> DataConfig:
        if not self.path:
            raise ValueError("path: give a .jsonl/.json/.parquet file or a dataset name")
        if not self.input_key:
            raise ValueError("input_key must be a non-empty column name")
        if self.label_key == "":
            raise ValueError("label_key must be a column name or None")
        if self.n_samples_per_prompt < 1:
            raise ValueError(f"n_samples_per_prompt must be >= 1, got {self.n_samples_per_prompt}")
        if self.prompts_per_step < 1:
            raise ValueError(f"prompts_per_step must be >= 1, got {self.prompts_per_step}")
        if self.max_prompts is not None and self.max_prompts < 1:
            raise ValueError(f"max_prompts must be >= 1 or None, got {self.max_prompts}")
        if len(set(self.metadata_keys)) != len(self.metadata_keys):
            raise ValueError(f"metadata_keys has duplicates: {self.metadata_keys}")
        if "row" in self.metadata_keys:
            raise ValueError("metadata_keys: 'row' is reserved for the row index")
        return self


def check_file(path: str) -> None:
    """DataError naming ``path`` when it names a local data file (by its extension) that is not
    there; a hub name or a benchmark passes (read later)."""
    ext = os.path.splitext(path)[1].lower()
    if ext in _FILE_BUILDERS and not is_benchmark(path) and not os.path.isfile(path):
        raise DataError(f"{path}: no such file")


def load_rows(config: DataConfig) -> Dataset:
    """Read ``config.path`` with ``datasets``: a local file by its extension, else a hub name."""
    import datasets

    path = config.path
    if is_benchmark(path):
        try:
            return load_benchmark(path)
        except ValueError as e:
            raise DataError(str(e)) from e
    ext = os.path.splitext(path)[1].lower()
    if ext in _FILE_BUILDERS:
        check_file(path)
        try:
            return datasets.load_dataset(_FILE_BUILDERS[ext], data_files=path, split="train")
        except Exception as e:
            if ext == ".jsonl":
                _raise_bad_json_line(path)  # a precise line number beats arrow's byte offsets
            raise DataError(f"{path}: cannot be read as {ext[1:]}: {e}") from e
    return _load_hub(path, None, config.split)


def _load_hub(name: str, config: str | None, split: str, offline: str = "") -> Dataset:
    """``datasets.load_dataset`` with an error that says what to do without network."""
    import datasets

    try:
        return datasets.load_dataset(name, config, split=split)
    except Exception as e:
        raise DataError(
            f"cannot load {name!r} (config {config!r}, split {split!r}) from the Hugging Face "
            f"Hub: {type(e).__name__}: {e}. Without network, download it elsewhere and pass the "
            f"local .parquet/.jsonl file as the path{offline}."
        ) from e


# ---- for recipes' data scripts: one copy of what each would otherwise write -----------------


class RowError(ValueError):
    """One row cannot be mapped; the loop over rows adds the file and the row number."""


def is_data_file(path: str) -> bool:
    """Whether ``path`` names a local data file (by its extension: .jsonl, .json, .parquet)."""
    return os.path.splitext(path)[1].lower() in _FILE_BUILDERS


def open_dataset(
    path: str, split: str = "train", config: str | None = None, offline: str = ""
) -> Dataset:
    """A local .jsonl/.json/.parquet file (checked as ``load_rows`` checks it) or a hub dataset
    with its ``config``; a hub that cannot be reached says how to go on offline (``offline``:
    an alternative to add, e.g. ", or use the offline source 'reasoning_gym'")."""
    if is_data_file(path) or is_benchmark(path):
        return load_rows(DataConfig(path=path, split=split, label_key=None))
    return _load_hub(path, config, split, offline)


def dedup(rows: Iterable[dict[str, Any]], key: str = "prompt") -> list[dict[str, Any]]:
    """The first row of every distinct ``row[key]``, in order."""
    out: dict[Any, dict[str, Any]] = {}
    for r in rows:
        out.setdefault(r[key], r)
    return list(out.values())


def write_jsonl(rows: Iterable[dict[str, Any]], out: str | os.PathLike) -> None:
    """Write ``rows`` to ``out`` atomically (a crash leaves no half-written file), with a
    progress bar; the folder is made if missing."""
    from tqdm import tqdm

    out = os.fspath(out)
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    tmp = out + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        for row in tqdm(rows, desc=f"writing {os.path.basename(out)}", unit="row", leave=False):
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
    os.replace(tmp, out)


def _raise_bad_json_line(path: str) -> None:
    """Find the line that made arrow fail, if it is not valid JSON or not an object."""
    with open(path, encoding="utf-8") as f:
        for line_no, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise DataError(f"{path}: row {line_no}: not valid JSON: {e.msg}") from e
            if not isinstance(row, dict):
                raise DataError(f"{path}: row {line_no}: not a JSON object")


def _line_numbers(path: str) -> list[int]:
    """1-based file line of each dataset row of a JSONL file (blank lines hold no row)."""
    with open(path, encoding="utf-8") as f:
        return [i for i, line in enumerate(f, start=1) if line.strip()]


class DataBuffer:
    """Prompt groups out, finished samples in (per agent), with exact save/restore.

    ``len(buffer)`` is the number of prompts. ``metadata["row"]`` of a sample is the 0-based index
    of its prompt in the data (after ``max_prompts``).
    """

    def __init__(self, config: DataConfig, dataset: Dataset | None = None):
        """``dataset``: rows already in memory (e.g. generated offline); None reads config.path."""
        self.config = config.validate()
        from_jsonl = dataset is None and config.path.lower().endswith(".jsonl")
        from_jsonl &= not is_benchmark(config.path)
        if dataset is None:
            dataset = load_rows(config)
        if config.max_prompts is not None and len(dataset) > config.max_prompts:
            dataset = dataset.select(range(config.max_prompts))
        self._rows = self._validated_rows(dataset, from_jsonl)
        self.epoch = 0
        """epochs completed; the prompt drawn next belongs to this epoch"""
        self._position = 0  # prompts of the current epoch already handed out
        self._next_group_id = 0
        self._requeued: list[tuple[int, int]] = []  # (group_id, row), ascending group_id
        self._order = self._permutation(0)
        self._queues: dict[str, deque[Sample]] = {}

    def __len__(self) -> int:
        return len(self._rows)

    # ---- loading -------------------------------------------------------------------------

    def _validated_rows(self, dataset: Dataset, from_jsonl: bool) -> list[dict[str, Any]]:
        cfg = self.config
        keys = [cfg.input_key, *([cfg.label_key] if cfg.label_key else []), *cfg.metadata_keys]
        n = len(dataset)

        def row_no(i: int) -> int:
            # Rows are reported as the user sees them: the line of a JSONL file (datasets skips
            # blank lines), else the 1-based record number.
            return _line_numbers(cfg.path)[i] if from_jsonl else i + 1

        def fail(i: int, msg: str) -> None:
            raise DataError(f"{cfg.path}: row {row_no(i)}: {msg}")

        if n == 0:
            raise DataError(f"{cfg.path}: has no rows")
        for key in keys:
            if key not in dataset.column_names:
                fail(0, f"missing key {key!r} (no row has it; columns: {dataset.column_names})")
        rows = []
        for i, row in enumerate(dataset.select_columns(keys)):
            for key in keys:
                if row[key] is None:
                    fail(i, f"missing key {key!r} (absent or null)")
            prompt = row[cfg.input_key]
            if isinstance(prompt, str):
                if not prompt.strip():
                    fail(i, f"key {cfg.input_key!r}: empty prompt")
            elif isinstance(prompt, list):
                if not prompt:
                    fail(i, f"key {cfg.input_key!r}: empty prompt (no messages)")
                for j, msg in enumerate(prompt, start=1):
                    if not isinstance(msg, dict) or msg.get("role") is None:
                        fail(i, f"key {cfg.input_key!r}: message {j} has no 'role'")
                    if msg.get("content") is None:
                        fail(i, f"key {cfg.input_key!r}: message {j} has no 'content'")
                # Arrow gives every message the union of all messages' fields, None where absent;
                # drop those so chat templates see the messages as written.
                prompt = [{k: v for k, v in m.items() if v is not None} for m in prompt]
            else:
                fail(
                    i,
                    f"key {cfg.input_key!r}: prompt must be a string or a list of chat "
                    f"messages, got {type(prompt).__name__}",
                )
            rows.append(
                {
                    "prompt": prompt,
                    "label": row[cfg.label_key] if cfg.label_key else None,
                    "metadata": {k: row[k] for k in cfg.metadata_keys},
                }
            )
        return rows

    # ---- prompt groups -------------------------------------------------------------------

    def _permutation(self, epoch: int) -> list[int]:
        n = len(self._rows)
        if not self.config.shuffle:
            return list(range(n))
        return np.random.default_rng(self.config.seed + epoch).permutation(n).tolist()

    def _next_row(self) -> int:
        row = self._order[self._position]
        self._position += 1
        if self._position == len(self._order):
            # Roll over eagerly so ``epoch`` counts completed epochs and a state saved exactly at
            # an epoch boundary already points into the next one.
            self.epoch += 1
            self._position = 0
            self._order = self._permutation(self.epoch)
        return row

    def _make_group(self, group_id: int, row: int) -> list[Sample]:
        data = self._rows[row]
        # Deep copies: a recipe that edits one sample's prompt must not edit its siblings'.
        return [
            Sample(
                prompt=copy.deepcopy(data["prompt"]),
                label=copy.deepcopy(data["label"]),
                group_id=group_id,
                index=i,
                status=Status.PENDING,
                metadata={**copy.deepcopy(data["metadata"]), "row": row},
            )
            for i in range(self.config.n_samples_per_prompt)
        ]

    def next_groups(self, num_prompts: int | None = None) -> list[list[Sample]]:
        """The next ``num_prompts`` (default ``prompts_per_step``) groups: requeued ones first.

        Each group is ``n_samples_per_prompt`` PENDING samples of one row with one ``group_id``
        and ``index`` 0..n-1. Crossing an epoch boundary continues into the next epoch.
        """
        num_prompts = self.config.prompts_per_step if num_prompts is None else num_prompts
        if num_prompts < 0:
            raise ValueError(f"num_prompts must be >= 0, got {num_prompts}")
        groups = []
        for _ in range(num_prompts):
            if self._requeued:
                group_id, row = self._requeued.pop(0)
            else:
                group_id, row = self._next_group_id, self._next_row()
                self._next_group_id += 1
            groups.append(self._make_group(group_id, row))
        return groups

    def requeue(self, group: list[Sample]) -> None:
        """Put a prompt group back (abort, crash mid-rollout) to be rolled out again next.

        Any samples of the group identify it; it is re-issued whole, from its row, with its
        original ``group_id``. Requeued groups are handed out in ``group_id`` order, ahead of new
        prompts. Requeueing a group that is already waiting is a no-op, so it is never doubled.
        """
        if not group:
            raise ValueError("requeue: empty group")
        ids = {s.group_id for s in group}
        rows = {s.metadata.get("row") for s in group}
        if len(ids) != 1 or len(rows) != 1:
            raise ValueError(f"requeue: samples of several groups (group_ids {sorted(ids)})")
        group_id, row = ids.pop(), rows.pop()
        if not isinstance(row, int) or not 0 <= row < len(self._rows):
            raise ValueError(f"requeue: group {group_id} has no valid metadata['row']: {row!r}")
        if not 0 <= group_id < self._next_group_id:
            raise ValueError(f"requeue: group {group_id} was never handed out by this buffer")
        if any(g == group_id for g, _ in self._requeued):
            return
        self._requeued.append((group_id, row))
        self._requeued.sort()

    # ---- per-agent queues of finished samples --------------------------------------------

    def put(self, samples: Iterable[Sample]) -> None:
        """Queue finished samples, each under its ``agent``."""
        for s in samples:
            if s.status in (Status.PENDING, Status.ABORTED):
                raise ValueError(
                    f"put: sample {s.key} is {s.status.value}; only finished samples are queued "
                    "(requeue an aborted group instead)"
                )
            self._queues.setdefault(s.agent, deque()).append(s)

    def take(self, agent: str, n: int | None = None) -> list[Sample]:
        """Pop up to ``n`` (default: all) queued samples of ``agent``, oldest first."""
        q = self._queues.get(agent, deque())
        n = len(q) if n is None else min(n, len(q))
        return [q.popleft() for _ in range(n)]

    def pending(self, agent: str) -> int:
        """Queued samples of ``agent``."""
        return len(self._queues.get(agent, ()))

    # ---- save / restore ------------------------------------------------------------------

    def state_dict(self, in_flight: Iterable[list[Sample]] = ()) -> dict[str, Any]:
        """JSON-serialisable position of the run.

        ``in_flight`` are groups handed out but not yet trained on (the rollout of the next step
        in asynchronous mode): they are saved as requeued, so a run resumed from this state
        rolls them out again instead of skipping them. The per-agent queues (samples kept for an
        agent's next update) are saved whole, so a resumed run trains on them as it would have.
        """
        requeued = dict(self._requeued)
        for group in in_flight:
            requeued.setdefault(group[0].group_id, group[0].metadata["row"])
        return {
            "epoch": self.epoch,
            "position": self._position,
            "next_group_id": self._next_group_id,
            "requeued": [{"group_id": g, "row": r} for g, r in sorted(requeued.items())],
            "seed": self.config.seed,
            "shuffle": self.config.shuffle,
            "num_prompts": len(self._rows),
            "queued": [s.state() for q in self._queues.values() for s in q],
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from ``state``. The data, seed and shuffle must be those of the saved run."""
        for key, mine in (
            ("num_prompts", len(self._rows)),
            ("seed", self.config.seed),
            ("shuffle", self.config.shuffle),
        ):
            if state[key] != mine:
                raise ValueError(
                    f"load_state_dict: {key} is {mine} but the saved run had {state[key]}; "
                    "resuming would repeat or skip prompts"
                )
        if not 0 <= state["position"] < len(self._rows):
            raise ValueError(f"load_state_dict: position {state['position']} out of range")
        self.epoch = state["epoch"]
        self._position = state["position"]
        self._next_group_id = state["next_group_id"]
        self._requeued = sorted((q["group_id"], q["row"]) for q in state["requeued"])
        self._queues = {}
        self.put(Sample.from_state(q) for q in state.get("queued", []))
        self._order = self._permutation(self.epoch)
