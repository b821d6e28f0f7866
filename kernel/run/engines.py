"""The engines of a plain run, started before the training stack is imported.

An embedded engine is a process of its own that imports torch and transformers and loads its
model: about 5 s on this repository's 2-core CPU machine, where the driver then needed about
5.7 s to import the same stack, read the hooks and data, and build its trainers. Spawned after
all that but the trainers, the engines kept the first step waiting another 2 s. ``early_pools``
spawns them as soon as the run is resolved, while the driver still imports: ``kernel train``
does so for a run on this machine (no Ray, no given engine URLs) and hands the pools to
``Runtime.open``, which stops them on every way out, as it stops the ones it starts itself.
A data file that is not there still fails before any engine starts; a bad row in one is found
while they load, and they are stopped.
This module imports neither torch nor the runtime.
"""

from __future__ import annotations

from pathlib import Path

from kernel.buffer import check_file
from kernel.engine.pool import EnginePool
from kernel.hooks import package_file
from kernel.models import check_model, materialize_model
from kernel.run.config import ModelPlan, RunPlan


def model_pool(plan: RunPlan, index: int, mp: ModelPlan, out: Path) -> EnginePool:
    """The engine pool of the plan's ``index``-th model (not launched): its folder made ready
    under ``out/models``, its logs under ``out/logs/<owner>``, its engines seeded apart."""
    path = materialize_model(check_model(mp.settings.model), out / "models")
    logs = out / "logs" / mp.owner
    return EnginePool(mp.settings.engine, path, logs, plan.cfg.seed + 1000 * index, weights_dir=out)


def early_pools(plan: RunPlan) -> list[EnginePool]:
    """Every model's embedded engines, launched now (not waited for), for a run whose models
    this process places itself; [] for a run on Ray or on engines it was given (those start
    where ``Runtime.open`` places them). Stop them with ``pool.__exit__()`` if the run never
    opens."""
    cfg = plan.cfg
    if cfg.ray.enabled or any(mp.settings.engine.urls for mp in plan.models):
        return []
    for path in (cfg.data.path, cfg.eval.path):  # a data file named wrong: no engine started
        if path:
            check_file(package_file(path))
    out = Path(cfg.output_dir)
    pools: list[EnginePool] = []
    try:
        for i, mp in enumerate(plan.models):
            pools.append(model_pool(plan, i, mp, out))
            pools[-1].launch()
    except BaseException:
        for pool in pools:
            pool.__exit__()
        raise
    return pools
