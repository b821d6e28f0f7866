"""Tandem's command line: ``python -m kernel <command>`` (also installed as ``tandem``).

Commands:
  info   versions, devices, recipes, advantage estimators and loss modes available here
  demo   the kernel's pieces learning a toy task in one process (the main CPU job until the
         training loop with engines lands)
  config validate a training config (YAML file and flags) and print it resolved
  plot   learning curves of a run's metrics.jsonl to PNG

Every command validates its flags before it starts work and exits with status 2 and a message
naming the flag on bad input.
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
import os
import platform
import sys
from pathlib import Path

from jsonargparse import ArgumentParser

from kernel.config import make_parser

RECIPES_DIR = Path(__file__).resolve().parent.parent / "recipes"
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
    """Recipe folder -> whether it already has its generate hook."""
    return {
        d.name: (d / "generate.py").exists()
        for d in sorted(RECIPES_DIR.iterdir())
        if d.is_dir() and not d.name.startswith(("_", "."))
    }


def cmd_info() -> None:
    import torch
    from rich.console import Console
    from rich.table import Table

    from kernel.advantages import ESTIMATORS
    from kernel.loss import AGG_MODES

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
    table.add_row("advantage estimators", ", ".join(ESTIMATORS))
    table.add_row("loss aggregations", ", ".join(AGG_MODES))
    Console().print(table)


def cmd_demo(cfg) -> None:
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    from kernel.plot import plot_metrics
    from kernel.toy import run_demo

    print(
        "Tandem demo: a tiny model (built from a config) learns a toy task in-process through\n"
        "the kernel's DataBuffer -> reward -> GRPO advantages -> PPO loss -> AdamW.\n"
        "This stands in for the main job until the training loop with engines and weight sync\n"
        "lands; the reward (share of digits in the answer) should rise from ~0.1 towards 1."
    )
    with Progress(
        TextColumn("[bold]demo"),
        BarColumn(),
        TextColumn("{task.completed}/{task.total}"),
        TextColumn("{task.fields[status]}"),
        TimeElapsedColumn(),
    ) as progress:
        task = progress.add_task("demo", total=cfg.steps, status="")

        def log(line: str) -> None:
            progress.update(task, advance=1, status=line.split("  ", 1)[1])

        rows = run_demo(cfg, log=log)
    first = sum(r["reward"] for r in rows[:5]) / min(5, len(rows))
    last = sum(r["reward"] for r in rows[-5:]) / min(5, len(rows))
    png = plot_metrics(Path(cfg.output_dir) / "metrics.jsonl", keys=["reward", "pg_loss"])
    print(f"mean reward: first 5 steps {first:.3f} -> last 5 steps {last:.3f}")
    print(f"metrics: {Path(cfg.output_dir) / 'metrics.jsonl'}   curves: {png}")


def cmd_config(cfg) -> None:
    import yaml

    print(yaml.safe_dump(dataclasses.asdict(cfg), sort_keys=False), end="")
    print("# valid: every section passed its checks", file=sys.stderr)


def _dataclass_parser(cls, description: str) -> ArgumentParser:
    """A subcommand parser with ``--config FILE.yaml`` and one flag per field of ``cls``."""
    parser = make_parser(ArgumentParser, description=description)
    parser.add_argument("--config", action="config", help="YAML file of values.")
    parser.add_class_arguments(cls, None)
    return parser


def _build(cls, ns):
    """Instantiate dataclass ``cls`` from a subcommand namespace (nested sections included)."""
    return cls(**{f.name: ns[f.name] for f in dataclasses.fields(cls) if f.name in ns})


def build_parser() -> ArgumentParser:
    from kernel.config import TrainConfig
    from kernel.toy import DemoConfig

    parser = make_parser(
        ArgumentParser,
        prog="python -m kernel",
        description="Tandem: train several LLM agents together with reinforcement learning.",
    )
    sub = parser.add_subcommands(dest="command")
    sub.add_subcommand("info", ArgumentParser(), help="Versions, devices, recipes, estimators.")
    sub.add_subcommand(
        "demo",
        _dataclass_parser(DemoConfig, "A tiny model learns a toy task in-process on CPU."),
        help="A tiny model learns a toy task in-process (CPU).",
    )
    sub.add_subcommand(
        "config",
        _dataclass_parser(
            TrainConfig, "Validate a training config (YAML and flags) and print it resolved."
        ),
        help="Validate a training config and print it as YAML.",
    )
    plot = ArgumentParser(description="Render learning curves of a metrics.jsonl to PNG.")
    plot.add_argument("metrics", type=str, help="Path to a run's metrics.jsonl.")
    plot.add_argument("--out", type=str | None, default=None, help="PNG path (default beside).")
    plot.add_argument("--keys", type=list[str] | None, default=None, help="Metrics to plot.")
    sub.add_subcommand("plot", plot, help="Learning curves of a run to PNG.")
    return parser


def main(argv: list[str] | None = None) -> None:
    from kernel.config import TrainConfig
    from kernel.plot import plot_metrics
    from kernel.toy import DemoConfig

    parser = build_parser()
    ns = parser.parse_args(sys.argv[1:] if argv is None else argv)
    try:
        args = parser.instantiate(ns)[ns.command]
        if ns.command == "info":
            cmd_info()
        elif ns.command == "demo":
            cmd_demo(_build(DemoConfig, args))
        elif ns.command == "config":
            cmd_config(_build(TrainConfig, args).validate())
        elif ns.command == "plot":
            print(plot_metrics(args.metrics, args.out, args.keys))
    except ValueError as e:
        parser.error(f"{ns.command}: {e}")
