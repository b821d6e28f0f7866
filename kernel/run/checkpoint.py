"""Checkpoints: saving a run whole and resuming from the newest one that is.

A checkpoint (``<output_dir>/checkpoints/step_N``) holds each model's trainer
(``trainers/<owner agent>``: weights, optimiser, schedule, RNG), the buffer position with
every prompt group handed out but not yet trained (so a crash mid-step neither skips nor
repeats a prompt) and the samples queued for a later update, the step and each model's weight
version.

``export`` writes one agent's model out of a checkpoint as a folder any engine loads (a LoRA
adapter merged into its base, or the adapter alone).

A save writes ``step_N.tmp`` (state.json last), fsyncs it and renames it to ``step_N``, so a
``step_N`` folder is whole unless something damaged it later; a leftover ``.tmp`` (a crash
mid-save) is ignored and removed by the next save, which keeps only itself and the checkpoint
before it (the one this run wrote or resumed from, both known good). A resume takes the newest
checkpoint whose files pass ``read_checkpoint`` and whose trainers load; a damaged one is passed
over for the one before it with a warning naming the file and why (``resume_from``).
"""

from __future__ import annotations

import json
import logging
import random
import shutil
import zipfile
from pathlib import Path

from safetensors import SafetensorError, safe_open

from kernel.metrics import fsync_path
from kernel.models import check_model, load_causal_lm, load_tokenizer, materialize_model
from kernel.run.agents import agent_specs

log = logging.getLogger(__name__)

# ``models`` below are the run's ``kernel.run.runtime.RunningModel`` objects: what is read of
# each is its ``owner`` (the folder name), ``trainer`` (None when it does not train) and
# ``thread`` (the trainer's own thread, where its save and load run).


async def save(
    root: Path, step: int, models: list, state: dict, keep: Path | None, critic=None
) -> Path:
    """Save ``models``' trainers (and the run's one ``critic``, critic.scope run, in
    ``critic/``) and the run's ``state`` (step, weight versions, buffer, RNG) into
    ``root/step_<step>.tmp`` (state.json last), fsync it and rename it to ``root/step_<step>``;
    then remove every other checkpoint folder but ``keep`` (the one this
    run saved or resumed from before). Returns the new folder."""
    path, tmp = root / f"step_{step}", root / f"step_{step}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)  # a save that crashed
    tmp.mkdir(parents=True)
    for m in models:
        if m.trainer is not None:
            await m.thread.run(m.trainer.save, tmp / "trainers" / m.owner)
    if critic is not None:
        (tmp / "critic").mkdir()
        critic.save(tmp / "critic")
    (tmp / "state.json").write_text(json.dumps(state))
    for f in sorted(tmp.rglob("*"), key=lambda f: -len(f.parts)):  # files before folders
        fsync_path(f)
    fsync_path(tmp)
    if path.exists():  # a damaged one the resume passed over
        shutil.rmtree(path)
    tmp.rename(path)
    fsync_path(root)
    for old in root.glob("step_*"):  # older ones, damaged ones, unfinished saves
        if old not in (path, keep):
            shutil.rmtree(old, ignore_errors=True)
    return path


def checkpoints(out_dir: Path) -> list[Path]:
    """The checkpoint folders (``step_N``) of the run in ``out_dir``, oldest first; an
    unfinished save (``step_N.tmp``) is none."""
    found = (out_dir / "checkpoints").glob("step_*")
    steps = [p for p in found if p.name[5:].isdigit() and p.is_dir()]
    return sorted(steps, key=lambda p: int(p.name[5:]))


def resume_from(found: list[Path], models: list, critic=None) -> tuple[Path, dict]:
    """Load the newest of the checkpoints ``found`` that is whole into the models' trainers
    (and the run's one ``critic``);
    returns it and its state. A damaged one (``read_checkpoint`` fails, or a trainer cannot
    load its files) is passed over for the one before with a warning naming the file; if none
    is usable, a ValueError names each and the way out. Every trainer loads whole from the
    checkpoint taken, so one that loaded part of a damaged checkpoint first is overwritten."""
    problems = []
    for ckpt in reversed(found):
        try:
            state = read_checkpoint(ckpt, [m.owner for m in models])
            for m in models:
                if m.trainer is not None:
                    _load_trainer(m, ckpt / "trainers" / m.owner)
            if critic is not None:
                critic.load(ckpt / "critic")
            return ckpt, state
        except (ValueError, OSError) as e:
            log.warning("checkpoint passed over, it is damaged: %s", e)
            problems.append(str(e))
    raise ValueError(
        f"{found[-1].parent}: no usable checkpoint to resume from ({'; '.join(problems)}): "
        "delete the damaged ones named (or the whole folder to start over), or pass another "
        "--output_dir"
    )


def _load_trainer(m, path: Path) -> None:
    """``m``'s trainer restored from ``path``; whatever fails names the folder."""
    try:
        m.thread.call(m.trainer.load, path)
    except Exception as e:  # torch, safetensors, json, Ray: the reason, with the folder's name
        reason = " ".join(str(e).split())
        reason = reason if len(reason) < 500 else reason[:500] + " ..."
        raise ValueError(
            f"{path}: the trainer cannot load it ({type(e).__name__}: {reason})"
        ) from e


def read_checkpoint(path: Path, owners: list[str]) -> dict:
    """The state of checkpoint ``path`` (state.json), once its files pass the checks a damaged
    one fails: state.json present and whole, every JSON file parses, every safetensors file is
    as long as its header says, every .pt file is a whole zip archive (torch.save), and
    state.json holds the state of a run of the models of ``owners``. Raises ValueError naming
    the file. What only a trainer can tell (a missing file of its own, tensors of the wrong
    shape) its ``load`` finds."""
    state_file = path / "state.json"
    if not state_file.is_file():
        raise ValueError(f"{state_file}: missing (the save never finished, or it was removed)")
    for f in sorted(path.rglob("*")):
        if f.suffix == ".json":
            _read_json(f)
        elif f.suffix == ".safetensors":
            _check_safetensors(f)
        elif f.suffix == ".pt" and not zipfile.is_zipfile(f):
            raise ValueError(f"{f}: truncated or overwritten (not a whole torch.save archive)")
    state = _read_json(state_file)
    try:
        versions = state["weight_versions"]
        missing = [o for o in owners if o not in versions]
        if missing or not isinstance(state["step"], int) or not isinstance(state["buffer"], dict):
            raise ValueError
        random.Random().setstate(rng_state(state["python_rng"]))
    except (KeyError, TypeError, ValueError):
        raise ValueError(
            f"{state_file}: not the state of this run (step, weight_versions of "
            f"{owners}, buffer and python_rng expected)"
        ) from None
    return state


def _read_json(path: Path):
    try:
        return json.loads(path.read_bytes())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"{path}: not JSON ({e}): truncated or overwritten") from None


def _check_safetensors(path: Path) -> None:
    """safetensors' own reader checks that the header covers the file exactly."""
    try:
        with safe_open(str(path), "pt"):
            pass
    except SafetensorError as e:
        raise ValueError(f"{path}: truncated or not a safetensors file ({e})") from None


def rng_state(state):
    """random.getstate() after a JSON round trip: lists back to tuples."""
    return tuple(tuple(x) if isinstance(x, list) else x for x in state)


def export(checkpoint: Path, agent: str, out: Path, merge: bool = True) -> Path:
    """Agent ``agent``'s model as ``checkpoint`` (a run's ``checkpoints/step_N``) saved it, as a
    folder ``out`` that any engine or HF loader takes: a fully trained model's weights as they
    are; a LoRA agent's adapter merged into its base (``merge``: one HF folder), or its PEFT
    adapter folder alone (not ``merge``: serve it on the base with SGLang's --lora-paths).
    The run's ``config.json`` says which model the agent plays."""
    run = checkpoint.parent.parent
    config = _read_json(run / "config.json")
    specs = {s.name: s for s in agent_specs(config["agents"])}
    if agent not in specs:
        raise ValueError(f"--agent {agent!r}: the run's agents are {sorted(specs)}")
    spec = specs[agent]
    owner = spec.share_model_with or agent
    saved = checkpoint / "trainers" / owner
    if not saved.is_dir():
        raise ValueError(f"{saved}: missing (agent {agent!r}'s model did not train in this run)")
    out.mkdir(parents=True, exist_ok=True)
    adapter = saved / "adapters" / agent
    if not (saved / "adapters").is_dir():  # a fully trained model: its HF files
        for f in saved.iterdir():
            if f.suffix in (".json", ".safetensors", ".jinja", ".txt", ".model"):
                shutil.copy2(f, out / f.name)
        return out
    if not adapter.is_dir():
        raise ValueError(f"{adapter}: missing (agent {agent!r} trained no adapter)")
    if not merge:
        shutil.copytree(adapter, out, dirs_exist_ok=True)
        return out
    from peft import PeftModel

    base = materialize_model(check_model(specs[owner].model or config["model"]), run / "models")
    merged = PeftModel.from_pretrained(load_causal_lm(base, dtype="float32"), adapter)
    merged.merge_and_unload().save_pretrained(out)
    load_tokenizer(base).save_pretrained(out)
    return out
