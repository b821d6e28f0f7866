"""Tandem's command line: ``python -m kernel <command>`` (also installed as ``tandem``).

Commands:
  info   versions, devices, recipes, advantage estimators and loss modes available here
  train  run a training job: a recipe (or the toy task) on engines, with a preset or flags
  eval   evaluate models, or a run's checkpoint, on a held-out set: avg@n and pass@k
  collect roll a recipe out with fixed models (or a checkpoint) and write the trajectories as
         JSONL: all, rejection-sampled (min reward), best-of-n, or preference pairs
  sft    supervised fine-tuning of one agent's model on chat messages, prompt/response pairs
         or collect's trajectories (the RL trainer, either backend); held-out NLL
  dpo    preference optimisation (DPO or IPO) of one agent's model on preference pairs
         (collect's pairs.jsonl, or prompt/chosen/rejected rows), frozen reference
  config validate a training config (YAML file and flags) and print it resolved
  plot   learning curves of a run's metrics.jsonl to PNG
  launch place a training job on a Ray cluster and run it there (--dry-run: print where it goes)
  export one agent's model out of a checkpoint as a folder any engine loads (a LoRA adapter
         merged into its base, or the adapter alone)

Every command validates its flags before it starts work and exits with status 2 and a message
naming the flag on bad input. The commands are one table, ``COMMANDS`` (name -> parser, handler,
help): ``build_parser`` makes the subcommands from it and ``main`` dispatches through it.
``train_config(argv)`` is the TrainConfig ``train`` would run with, for in-process callers.
"""

from __future__ import annotations

import dataclasses
import faulthandler
import importlib.metadata
import os
import platform
import signal
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from jsonargparse import ArgumentParser, Namespace

from kernel.advantages import estimators
from kernel.auth import refuse_key_flag
from kernel.hooks import recipes_root
from kernel.loss import AGG_MODES
from kernel.run.agents import with_settings
from kernel.run.config import (
    RunPlan,
    TrainConfig,
    check_yaml_file,
    config_files,
    read_help_text,
)

if TYPE_CHECKING:
    from kernel.run.collect import CollectConfig
    from kernel.run.dpo import DPOConfig
    from kernel.run.sft import SFTConfig

# A command's own modules (the training loop, the environment server, Ray placement, plots,
# SFT/DPO) are imported by its parser or handler, not here: `kernel train --help` imports only
# what train's flags are made of.

OPTIONAL = {
    "megatron-core": "production trainer",
    "sglang": "production engine (GPU)",
    "sglang-router": "router in front of engines",
    "ray": "placement across GPUs and nodes",
    "faiss-cpu": "retriever index",
    "math-verify": "math answer checking",
    "reasoning-gym": "offline task data",
}


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def recipes() -> dict[str, bool]:
    """Recipe folder of the importable ``recipes`` package -> whether it has its generate
    hook."""
    root = recipes_root()
    return {
        d.name: (d / "generate.py").exists()
        for d in sorted(root.iterdir() if root else [])
        if d.is_dir() and not d.name.startswith(("_", "."))
    }


def cmd_info() -> None:
    import torch
    from rich.console import Console
    from rich.table import Table

    from kernel.models import MODEL_FORMS

    table = Table(title="Tandem", show_header=False)
    table.add_row("tandem", importlib.metadata.version("tandem"))
    table.add_row("python", platform.python_version())
    for dist in ("torch", "transformers", "datasets", "fastapi"):
        table.add_row(dist, _version(dist) or "missing")
    for dist, role in OPTIONAL.items():
        table.add_row(dist, f"{_version(dist) or 'not installed'}  ({role})")
    gpus = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    table.add_row("devices", f"{os.cpu_count()} CPU cores; GPUs: {', '.join(gpus) or 'none'}")
    table.add_row(
        "recipes",
        ", ".join(f"{n}{'' if ready else ' (not yet runnable)'}" for n, ready in recipes().items()),
    )
    table.add_row("models", MODEL_FORMS)
    table.add_row("advantage estimators", ", ".join(estimators()))
    table.add_row("loss aggregations", ", ".join(AGG_MODES))
    Console().print(table)


def cmd_train(plan: RunPlan) -> None:
    """``kernel train``: the run (resolved once, ``plan``) under a progress display, then its
    summary (where it stopped early, the mean reward of the first and last steps, the metrics
    file and its curves)."""
    from rich.console import Console

    from kernel.plot import plot_metrics
    from kernel.run.engines import early_pools

    cfg = plan.cfg
    console = Console()
    console.print(
        f"[bold]Tandem[/] training {cfg.recipe} "
        f"({', '.join(a.name for a in plan.agents)}) on {cfg.model}: "
        f"{cfg.num_steps} steps -> {cfg.output_dir}",
        soft_wrap=True,
    )
    pools = early_pools(plan)  # the engines load while the training stack imports
    try:
        rows = _train_with_progress(plan, console, pools)
    finally:
        for pool in pools:  # the run stops them; this is for a failure before it opened
            pool.__exit__()
    if rows and rows[-1]["step"] + 1 < cfg.num_steps:
        console.print(
            f"stopped after step {rows[-1]['step'] + 1} of {cfg.num_steps}: "
            f"--max_minutes {cfg.max_minutes} reached (checkpointed; --resume true goes on)"
        )
    metrics = Path(cfg.output_dir) / "metrics.jsonl"
    png = plot_metrics(metrics)
    rewards = [r["reward"] for r in rows if "reward" in r]
    if rewards:
        n = min(5, len(rewards))
        first, last = sum(rewards[:n]) / n, sum(rewards[-n:]) / n
        console.print(f"mean reward: first {n} steps {first:.3f} -> last {n} steps {last:.3f}")
    console.print(f"metrics: {metrics}   curves: {png}")


def _train_with_progress(plan: RunPlan, console, pools=()) -> list[dict]:
    """Train ``plan`` under a live progress bar (a line a step when the console is not a
    terminal) and return its metric rows; an interrupt or a run that stops exits the process."""
    from rich.console import Console
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    from kernel.run.checkpoint import checkpoints
    from kernel.run.loop import train

    cfg = plan.cfg
    # Written to a log file (a background run), a live bar shows only its last frame: print a
    # line a step there instead, and say what the wait before the first step is.
    plain = not console.is_terminal
    resuming = cfg.resume and checkpoints(Path(cfg.output_dir))  # its start was evaluated
    if plain and cfg.eval.at_start and cfg.eval.path and not resuming:
        console.print(
            f"evaluating the starting weights on {cfg.eval.path} "
            f"({cfg.eval.n_samples} episodes per prompt) first",
            soft_wrap=True,
        )
    columns = [
        TextColumn("[bold]step"),
        BarColumn(),
        TextColumn("{task.completed}/{task.total}"),
        TextColumn("{task.fields[status]}"),
        TimeElapsedColumn(),
    ]
    with Progress(*columns, console=console, disable=plain) as progress:
        task = progress.add_task("train", total=cfg.num_steps, status="starting engines")

        def on_step(row: dict) -> None:
            status = _step_status(row)
            progress.update(task, completed=row["step"] + 1, status=status)
            if plain:
                scores = "  ".join(
                    f"{k.removeprefix('eval/')} {v:.3f}"
                    for k, v in row.items()
                    if k.startswith("eval/") and "/avg@" in k
                )
                console.print(
                    f"step {row['step'] + 1}/{cfg.num_steps} in {row['time/step_s']:.0f}s  "
                    f"{status}" + (f"  held-out {scores}" if scores else ""),
                    soft_wrap=True,
                )

        try:
            return train(plan, on_step=on_step, pools=pools)
        except KeyboardInterrupt:
            progress.stop()
            Console(stderr=True).print(
                "[red]interrupted[/]: every process this run started has been stopped; "
                "continue from the last checkpoint with --resume true --output_dir "
                f"{cfg.output_dir}"
            )
            sys.exit(130)
        except RuntimeError as e:  # a trainer rank or an engine that cannot come back
            progress.stop()
            Console(stderr=True).print(f"[red]run stopped[/]: {e}")
            sys.exit(1)


def _step_status(row: dict) -> str:
    """One step's metric row as the progress bar's status: each agent's reward, throughput and
    the time of its rollout, training and weight sync."""
    rewards = "  ".join(
        f"{k.split('/')[0]} {v:.3f}" for k, v in row.items() if k.endswith("/reward")
    )
    return (
        f"reward {rewards}  {row['tokens_per_s']:.0f} tok/s  rollout "
        f"{row['time/rollout_s']:.1f}s train {row['time/train_s']:.1f}s sync "
        f"{row['time/sync_s']:.2f}s"
    )


def cmd_eval(cfg, checkpoint: str | None) -> None:
    from rich.console import Console
    from rich.table import Table

    from kernel.run.loop import evaluate

    console = Console()
    what = checkpoint or ", ".join(f"{s.name}: {s.model or cfg.model}" for s in cfg.agent_specs())
    console.print(
        f"[bold]Tandem[/] evaluating {cfg.recipe} ({what}) on {cfg.eval.path}: "
        f"{cfg.eval.n_samples} episodes per prompt -> {cfg.output_dir}"
    )
    row = evaluate(cfg, checkpoint)
    table = Table("agent", "metric", "value")
    for key, value in row.items():
        if key.startswith("eval/"):
            _, agent, metric = key.split("/")
            table.add_row(agent, metric, f"{value:.4f}")
    console.print(table)
    console.print(f"{Path(cfg.output_dir) / 'eval.json'}   per item: {cfg.output_dir}/eval/")


def cmd_collect(cfg, ccfg: CollectConfig, checkpoint: str | None) -> None:
    from rich.console import Console

    from kernel.run.collect import collect

    console = Console()
    what = checkpoint or ", ".join(f"{s.name}: {s.model or cfg.model}" for s in cfg.agent_specs())
    console.print(
        f"[bold]Tandem[/] collecting {cfg.recipe} ({what}) on {ccfg.path or cfg.data.path}, "
        f"keep={ccfg.keep} -> {cfg.output_dir}"
    )
    summary = collect(cfg, ccfg, checkpoint)
    console.print(
        f"{summary['rows']} rows done ({summary['samples']} samples rolled out this time), "
        f"{summary['kept']} lines kept this time: {summary['file']}"
    )
    if summary["episodes"]:
        console.print(
            f"{summary['episodes']} episodes in {summary['rollout_s']:.1f} s of rollout "
            f"({summary['episodes'] / summary['rollout_s']:.2f} episodes/s)"
        )


def cmd_sft(plan: RunPlan, scfg: SFTConfig) -> None:
    from rich.console import Console

    from kernel.run.sft import sft

    cfg = plan.cfg
    console = Console()
    agent = scfg.agent or plan.agents[0].name
    console.print(
        f"[bold]Tandem[/] SFT of agent {agent} on {scfg.path}: {scfg.epochs} epoch(s), "
        f"{scfg.batch_size} examples per update -> {cfg.output_dir}"
    )
    row = sft(plan, scfg)
    figures = ", ".join(f"{k} {v:.4f}" for k, v in row.items() if k.endswith("nll"))
    console.print(f"{figures}; saved: {_tuned(cfg, agent)}")


def cmd_dpo(plan: RunPlan, dcfg: DPOConfig) -> None:
    from rich.console import Console

    from kernel.run.dpo import dpo

    cfg = plan.cfg
    console = Console()
    agent = dcfg.agent or plan.agents[0].name
    console.print(
        f"[bold]Tandem[/] {dcfg.loss.upper()} of agent {agent} on {dcfg.path}: beta "
        f"{dcfg.beta}, {dcfg.epochs} epoch(s), {dcfg.batch_size} pairs per update -> "
        f"{cfg.output_dir}"
    )
    row = dpo(plan, dcfg)
    figures = ", ".join(f"{k} {v:.4f}" for k, v in row.items() if "/" in k and "time" not in k)
    console.print(f"{figures}; saved: {_tuned(cfg, agent)}")


def _tuned(cfg, agent: str) -> Path:
    """Where kernel sft / dpo saved ``agent``'s model: its LoRA adapter, or the whole model."""
    adapter = Path(cfg.output_dir) / "adapters" / agent
    return adapter if adapter.is_dir() else Path(cfg.output_dir) / "model"


def cmd_config(cfg) -> None:
    import yaml

    print(yaml.safe_dump(dataclasses.asdict(cfg), sort_keys=False), end="")
    print("# valid: every section passed its checks", file=sys.stderr)


def _dataclass_parser(cls, description: str) -> ArgumentParser:
    """A subcommand parser with ``--config FILE.yaml`` and one flag per field of ``cls``."""
    parser = ArgumentParser(description=description)
    parser.add_argument("--config", action="config", help="YAML file of values.")
    parser.add_class_arguments(cls, None)
    return parser


def _build(cls, ns):
    """Instantiate dataclass ``cls`` from a subcommand namespace (nested sections included)."""
    return cls(**{f.name: ns[f.name] for f in dataclasses.fields(cls) if f.name in ns})


PRESETS_DIR = Path(__file__).resolve().parent / "presets"


def preset_path(name: str, recipe: str | None) -> Path:
    """``--preset NAME``: recipes/<recipe>/presets/NAME.yaml, else kernel/presets/NAME.yaml."""
    candidates = [PRESETS_DIR / f"{name}.yaml"]
    if recipe and (root := recipes_root()) is not None:
        candidates.insert(0, root / recipe / "presets" / f"{name}.yaml")
    for path in candidates:
        if path.exists():
            return path
    raise ValueError(f"--preset {name}: none of {[str(c) for c in candidates]} exists")


def expand_preset(argv: list[str]) -> list[str]:
    """Turn ``--preset NAME`` into ``--config FILE`` placed first, so flags override it."""
    if "--preset" not in argv and not any(a.startswith("--preset=") for a in argv):
        return argv
    rest, name, recipe, i = [], None, None, 0
    while i < len(argv):
        a = argv[i]
        if a == "--preset" or a.startswith("--preset="):
            name = a.split("=", 1)[1] if "=" in a else argv[i + 1]
            i += 1 if "=" in a else 2
            continue
        if a == "--recipe" and i + 1 < len(argv):
            recipe = argv[i + 1]
        elif a.startswith("--recipe="):
            recipe = a.split("=", 1)[1]
        rest.append(a)
        i += 1
    cmd, *flags = rest
    return [cmd, f"--config={preset_path(name, recipe)}", *flags]


def _run_parser(
    description: str,
    preset: str | None = "Preset name.",
    checkpoint: bool = False,
    section: tuple[type, str] | None = None,
) -> ArgumentParser:
    """A parser of a command that takes a training config (train, eval, collect, sft, dpo,
    config, launch): ``--config``, TrainConfig's flags, then ``--preset`` (its help text;
    None: no flag), ``--checkpoint`` and the flags of a section of the command's own."""
    parser = _dataclass_parser(TrainConfig, description)
    # the field is a str checked against the registry at validation: show what it takes
    for action in parser._actions:
        if action.dest == "advantage.estimator":
            action.metavar = "{" + ",".join(estimators()) + "}"
    parser.add_argument(
        "--agent",
        type=str,
        action="append",
        default=[],
        metavar="NAME.FIELD=VALUE",
        help="Set one field of an agent's spec over the preset's (repeatable; VALUE is YAML): "
        "alice.backend=megatron, alice.resources.train_gpus=4, bob.rollout.max_response_len=64. A "
        "bare name in agents becomes its spec first. See kernel.run.agents.AgentSpec.",
    )
    if preset:
        parser.add_argument("--preset", type=str | None, default=None, help=preset)
    if checkpoint:
        parser.add_argument(
            "--checkpoint", type=str | None, default=None, help="A run's checkpoints/step_N folder."
        )
    if section:
        parser.add_class_arguments(*section)
    return parser


def _train_parser() -> ArgumentParser:
    return _run_parser(
        "Run a training job. --preset NAME loads recipes/<recipe>/presets/NAME.yaml (or "
        "kernel/presets/NAME.yaml, e.g. toy); later flags override it.",
        preset="Preset name (see above).",
    )


def _eval_parser() -> ArgumentParser:
    return _run_parser(
        "Evaluate models on eval.path without training: avg@n (eval.n_samples episodes per "
        "prompt) and unbiased pass@k (eval.pass_k) per agent. --checkpoint serves a run's "
        "checkpoints/step_N instead of the models. The same flags and presets as train.",
        checkpoint=True,
    )


def _collect_parser() -> ArgumentParser:
    from kernel.run.collect import CollectConfig

    return _run_parser(
        "Roll a recipe's workflow out with fixed models over a data set (collect.path, default "
        "data.path) and write every kept sample to <output_dir>/trajectories.jsonl (exact ids, "
        "loss masks, rewards, agent, turn, weight versions, decoded text), or preference pairs "
        "to pairs.jsonl. Filters: collect.min_reward (rejection sampling), collect.keep=best "
        "(best-of-n per row, agent and turn), collect.keep=pairs (best vs worst), "
        "collect.keep=transitions (world-model data: observation and action -> next "
        "observation, as chat rows kernel sft reads, to transitions.jsonl), "
        "collect.agents. Run the same command again to resume: finished rows are skipped. "
        "--checkpoint serves a run's checkpoints/step_N. The same flags and presets as train.",
        checkpoint=True,
        section=(CollectConfig, "collect"),
    )


def _sft_parser() -> ArgumentParser:
    from kernel.run.sft import SFTConfig

    return _run_parser(
        "Supervised fine-tuning of one agent's model (sft.agent, default the first) on "
        "sft.path: rows of chat 'messages' (every assistant message trained on), 'prompt' and "
        "'response', or kernel collect's trajectories (their exact ids and loss masks). The "
        "agent's own trainer (backend, optimiser, micro-batching) minimises the mean NLL of the "
        "trained tokens; held-out NLL on sft.eval_path before, every sft.eval_every updates and "
        "after. Saves <output_dir>/model, an HF folder to start RL from (--model); with "
        "lora.rank > 0 the agent's LoRA adapter alone, <output_dir>/adapters/<agent> (start RL "
        "from it with lora.path). The same "
        "flags and presets as train (model, agents, optim, trainer).",
        section=(SFTConfig, "sft"),
    )


def _dpo_parser() -> ArgumentParser:
    from kernel.run.dpo import DPOConfig

    return _run_parser(
        "Preference optimisation of one agent's model (dpo.agent, default the first) on pairs "
        "in dpo.path: kernel collect's pairs.jsonl (exact ids and loss masks) or rows of "
        "'prompt', 'chosen' and 'rejected' text. dpo.loss=dpo: -log sigmoid(beta * margin); "
        "ipo: (margin - 1/(2 beta))^2, margin = the chosen reply's summed logprob gain over "
        "the reference (the starting weights, frozen) minus the rejected one's. The agent's "
        "own trainer runs it (either backend). Loss, accuracy and margin per update, and on "
        "dpo.eval_path before and after; saves <output_dir>/model (with LoRA, "
        "<output_dir>/adapters/<agent>). The same flags and presets "
        "as train.",
        section=(DPOConfig, "dpo"),
    )


def _config_parser() -> ArgumentParser:
    return _run_parser(
        "Validate a training config (YAML and flags) and print it resolved.", preset=None
    )


def _plot_parser() -> ArgumentParser:
    plot = ArgumentParser(
        description="Render learning curves of a metrics.jsonl to PNG; with --compare, overlay "
        "other runs' metrics.jsonl on it (a panel per --keys metric, a line per run)."
    )
    plot.add_argument("metrics", type=str, help="Path to a run's metrics.jsonl.")
    plot.add_argument("--out", type=str | None, default=None, help="PNG path (default beside).")
    plot.add_argument("--keys", type=str, nargs="*", default=None, help="Metrics to plot.")
    plot.add_argument(
        "--compare",
        type=str,
        nargs="*",
        default=[],
        help="Other runs' metrics.jsonl to overlay (needs --keys and --out).",
    )
    return plot


def _export_parser() -> ArgumentParser:
    export = ArgumentParser(
        description="Write one agent's model, as a run's checkpoint saved it, to a folder any "
        "engine or HF loader takes: a fully trained model's weights; a LoRA agent's adapter "
        "merged into its base (--merge true, the default), or its PEFT adapter folder alone "
        "(--merge false: serve it on the base, e.g. SGLang --lora-paths NAME=FOLDER)."
    )
    export.add_argument("--checkpoint", type=str, required=True, help="A run's checkpoints/step_N.")
    export.add_argument("--agent", type=str, required=True, help="The agent whose model to write.")
    export.add_argument("--out", type=str, required=True, help="The folder to write.")
    export.add_argument(
        "--merge", type=bool, default=True, help="Merge a LoRA adapter (false: the adapter alone)."
    )
    return export


def _launch_parser() -> ArgumentParser:
    from jsonargparse import ActionYesNo

    from kernel.cluster.plan import ClusterConfig

    launch = _run_parser(
        "Place a training job on a cluster: which GPU of which node trains or serves which agent, "
        "engine and router ports, parallel sizes. Per model, placement comes from the agent "
        "spec's resources (kernel.run.resources.ResourceConfig). --dry-run prints and validates "
        "the placement without Ray or a GPU. Without it the run starts on Ray as placed "
        "(cluster.address, or a "
        "local Ray): per model, engines start on the planned node, GPUs and ports "
        "(cluster.engine_server: real SGLang, or the embedded server on CPU) behind the model's "
        "sglang-router, and a trainer of Ray actors (one torch.distributed rank per planned GPU) "
        "trains; colocated models release and resume their engines' memory around each step. "
        "Everything it started is stopped at the end, on error or Ctrl-C.",
        preset="Preset name (as train).",
        section=(ClusterConfig, "cluster"),
    )
    flag = ActionYesNo(no_prefix="--no-")
    launch.add_argument(
        "--dry-run", action=flag, default=False, help="Print the placement and stop."
    )
    launch.add_argument("--json", action=flag, default=False, help="Print the placement as JSON.")
    return launch


def _env_serve_parser() -> ArgumentParser:
    from kernel.env.server import EnvServerConfig

    return _dataclass_parser(
        EnvServerConfig,
        "Host environments over HTTP, one session per episode (kernel.env.server): a run "
        "plays them remotely with environments.NAME.url = http://HOST:PORT. Bounded "
        "sessions and concurrency, resets and steps in worker processes killed at "
        "--step_timeout_s, Bearer-key auth (the key from TANDEM_API_KEY or --api_key_file, "
        "never on the command line).",
    )


def cmd_launch(plan: RunPlan, cluster, dry_run: bool, as_json: bool) -> None:
    from rich.console import Console

    from kernel.cluster.plan import make_placement
    from kernel.cluster.run import run_placement

    cfg = plan.cfg
    placement = make_placement(plan, cluster)
    if as_json:
        print(placement.to_json())
    else:
        console = Console(width=160)
        for table in placement.tables():
            console.print(table)
    if dry_run:
        print("# valid: the placement fits the cluster", file=sys.stderr)
        return

    try:
        rows = run_placement(plan, placement)
    except KeyboardInterrupt:
        Console(stderr=True).print(
            "[red]interrupted[/]: every engine, router and trainer actor this launch started has "
            f"been stopped; continue with --resume true --output_dir {cfg.output_dir}"
        )
        sys.exit(130)
    except RuntimeError as e:  # a trainer rank, engine or router that died or never came up
        Console(stderr=True).print(f"[red]run stopped[/]: {e}")
        sys.exit(1)
    print(f"{len(rows)} steps done; metrics: {Path(cfg.output_dir) / 'metrics.jsonl'}")


# ---- the handlers: a command's parsed arguments -> its cmd_* function ------------------------


def _run_config(args: Namespace) -> TrainConfig:
    """The TrainConfig the arguments describe: its flags over the preset, then each ``--agent``
    setting over its agents."""
    cfg = _build(TrainConfig, args)
    return dataclasses.replace(cfg, agents=with_settings(cfg.agents, args["agent"]))


def _train_config(args: Namespace) -> TrainConfig:
    return _run_config(args).validate()


def _run_plan(args: Namespace) -> RunPlan:
    """The run the arguments describe, resolved: the one resolution of train, sft and dpo
    (eval and collect resolve theirs once its models are frozen)."""
    return _run_config(args).plan()


def train_config(argv: list[str]) -> TrainConfig:
    """The validated TrainConfig ``python -m kernel train ARGV`` runs with, for code that starts
    a run in-process (a test, a notebook): ``train(train_config(["--preset", "toy"]))``. The
    same steps as ``main`` (``--preset`` expanded, config files checked), train's own parser and
    its handler's validation; a ValueError names the flag or file."""
    parser = COMMANDS["train"].parser()
    argv = _expanded(["train", *argv])[1:]
    return _train_config(parser.instantiate(parser.parse_args(argv)))


def _expanded(argv: list[str]) -> list[str]:
    """``argv`` with ``--preset NAME`` turned into its ``--config FILE``, every config file
    checked to be YAML (a ValueError names the file, line and column)."""
    argv = expand_preset(argv)
    for path in config_files(argv):  # a preset is a --config file by now
        check_yaml_file(path)
    return argv


def _collect(args: Namespace, argv: list[str]) -> None:
    from kernel.run.collect import CollectConfig

    ccfg = CollectConfig(**vars(args["collect"]))
    cmd_collect(_run_config(args), ccfg.validate(), args["checkpoint"])


def _sft(args: Namespace, argv: list[str]) -> None:
    from kernel.run.sft import SFTConfig

    scfg = SFTConfig(**vars(args["sft"]))
    cmd_sft(_run_plan(args), scfg.validate())


def _dpo(args: Namespace, argv: list[str]) -> None:
    from kernel.run.dpo import DPOConfig

    dcfg = DPOConfig(**vars(args["dpo"]))
    cmd_dpo(_run_plan(args), dcfg.validate())


def _plot(args: Namespace, argv: list[str]) -> None:
    from kernel.plot import compare_runs, plot_metrics

    if not args["compare"]:
        print(plot_metrics(args["metrics"], args["out"], args["keys"]))
        return
    if not args["out"]:
        raise ValueError("plot --compare: give the PNG path with --out")
    paths = [args["metrics"], *args["compare"]]
    print(compare_runs(paths, args["keys"] or [], args["out"]))


def _export(args: Namespace, argv: list[str]) -> None:
    from kernel.run.checkpoint import export

    what = "merged" if args["merge"] else "as it is"
    out = export(Path(args["checkpoint"]), args["agent"], Path(args["out"]), args["merge"])
    print(f"{args['agent']} of {args['checkpoint']} ({what}): {out}")


def _env_serve(args: Namespace, argv: list[str]) -> None:
    from kernel.env.server import EnvServerConfig, serve

    refuse_key_flag(argv)  # a key on the command line is readable by every local user
    serve(_build(EnvServerConfig, args))


def _launch(args: Namespace, argv: list[str]) -> None:
    from kernel.cluster.plan import ClusterConfig

    cluster = ClusterConfig(**vars(args["cluster"]))
    train_cfg = _run_config(args)
    # a launched run trains on Ray: resolve it as one (each model its own processes)
    train_cfg.ray = dataclasses.replace(train_cfg.ray, enabled=True)
    cmd_launch(train_cfg.plan(), cluster, args["dry_run"], args["json"])


@dataclass(frozen=True)
class Command:
    """A subcommand: ``parser()`` builds its flags; ``run(args, argv)`` does its work from the
    parsed, instantiated arguments (``argv``: the command line as given); ``help`` is its line
    in the parent's ``--help``. A ValueError it raises exits with status 2, naming the command.
    A command with ``subcommands`` (``env serve``) runs the one named after it instead."""

    parser: Callable[[], ArgumentParser]
    run: Callable[[Namespace, list[str]], None] | None
    help: str
    subcommands: dict[str, Command] = field(default_factory=dict)


COMMANDS: dict[str, Command] = {
    "info": Command(
        ArgumentParser, lambda args, argv: cmd_info(), "Versions, devices, recipes, estimators."
    ),
    "train": Command(
        _train_parser,
        lambda args, argv: cmd_train(_run_plan(args)),
        "Run a training job (e.g. --preset toy).",
    ),
    "eval": Command(
        _eval_parser,
        lambda args, argv: cmd_eval(_run_config(args), args["checkpoint"]),
        "Evaluate models or a checkpoint (avg@n, pass@k).",
    ),
    "collect": Command(_collect_parser, _collect, "Write a recipe's rollouts as JSONL (SFT, DPO)."),
    "sft": Command(_sft_parser, _sft, "Supervised fine-tuning of an agent's model."),
    "dpo": Command(_dpo_parser, _dpo, "DPO or IPO on preference pairs."),
    "config": Command(
        _config_parser,
        lambda args, argv: cmd_config(_train_config(args)),
        "Validate a training config and print it as YAML.",
    ),
    "plot": Command(_plot_parser, _plot, "Learning curves of a run to PNG."),
    "launch": Command(_launch_parser, _launch, "Place a run on a Ray cluster and run it."),
    "export": Command(_export_parser, _export, "An agent's model out of a checkpoint."),
    "env": Command(
        lambda: ArgumentParser(description="Environments as a service (kernel.env)."),
        None,
        "Environments as a service: env serve --environments ...",
        {
            "serve": Command(
                _env_serve_parser,
                _env_serve,
                "Host environments (math, code, NAME=dotted.path) over HTTP.",
            )
        },
    ),
}


def build_parser(argv: list[str] | None = None) -> ArgumentParser:
    """The ``python -m kernel`` parser: a subcommand per row of ``COMMANDS``. Given the command
    line, only the command it names gets its flags (building train's, eval's, ... each takes a
    TrainConfig's worth of flags, and their help reads every section's docstrings): the others
    are listed by their help line alone."""
    parser = ArgumentParser(
        prog="python -m kernel",
        description="Tandem: train several LLM agents together with reinforcement learning.",
    )
    _add_subcommands(parser, COMMANDS, "command", None if argv is None else list(argv))
    return parser


def _add_subcommands(
    parser: ArgumentParser, commands: dict[str, Command], dest: str, argv: list[str] | None
) -> None:
    # jsonargparse takes a level's subcommands only once their parent is attached: parents first
    sub = parser.add_subcommands(dest=dest)
    named = next((a for a in argv if not a.startswith("-")), None) if argv is not None else None
    for name, command in commands.items():
        built = argv is None or name == named
        child = command.parser() if built else ArgumentParser(description=command.help)
        sub.add_subcommand(name, child, help=command.help)
        if command.subcommands and built:
            rest = None if argv is None else argv[argv.index(name) + 1 :]
            _add_subcommands(child, command.subcommands, "action", rest)


def main(argv: list[str] | None = None) -> None:
    # `kill -USR1 PID` prints every thread's stack to stderr: where a run that hangs is stuck
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    argv = list(sys.argv[1:] if argv is None else argv)
    read_help_text(argv)
    parser = build_parser(argv)
    try:
        argv = _expanded(argv)
    except ValueError as e:
        parser.error(str(e))
    ns = parser.parse_args(argv)
    try:
        command, args = COMMANDS[ns.command], parser.instantiate(ns)[ns.command]
        while command.subcommands:  # env serve: the subcommand's own arguments and handler
            command, args = command.subcommands[args["action"]], args[args["action"]]
        command.run(args, argv)
    except ValueError as e:
        parser.error(f"{ns.command}: {e}")
