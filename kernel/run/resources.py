"""An agent's ``resources``: where its model trains and serves on a cluster (``ResourceConfig``:
GPU counts, colocation, engine size, a shared pool), as the run plan resolves it per model.

It lives in the runtime layer, not beside the cluster planner that reads it
(``kernel.cluster.plan``), so that ``TrainConfig.plan()`` can validate it with the rest of the run
and every reader -- the planner, the Ray ranks of a run without a placement -- gets it typed
from the plan, never from the spec's raw dict.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

from kernel.run.agents import AgentSpec


@dataclass
class ResourceConfig:
    """Placement of one model (group of agents) on the cluster: an AgentSpec's ``resources``."""

    train_gpus: int | None = None
    """GPUs (= ranks) of the trainer; None: the group's even share of the free GPUs (half of it
    when disaggregated); 0 only for a frozen model."""
    infer_gpus: int | None = None
    """GPUs of the engines when disaggregated; None: the rest of the group's share. Colocated
    engines run on the training GPUs, so leave it unset then."""
    colocate: bool = False
    """Train and serve on the same GPUs (SGLang releases and resumes its memory around each
    training step; weights go over by tensor); False puts engines on GPUs of their own
    (weights go over by an NCCL broadcast)."""
    engine_tensor_parallel: int = 1
    """GPUs of one SGLang engine (its --tp-size); an engine stays inside one node."""
    mem_fraction_static: float = 0.8
    """SGLang --mem-fraction-static: the share of a GPU's memory an engine takes for weights and
    KV cache (colocated, SGLang releases it during training; keep room for the trainer)."""
    nodes: list[int] | None = None
    """Nodes this model may use (None: any, filled in order)."""
    pool: str | None = None
    """A GPU pool shared with the other models that name it (Dr.MAS): each trains and serves on
    all of its GPUs (colocated), and they take turns -- while one trains, every engine of the
    pool has given its memory up. The first model naming a pool sizes it (train_gpus, or an
    even share); the others leave train_gpus unset or equal."""

    def validate(self) -> ResourceConfig:
        """Raise ValueError naming the first field with a bad value."""
        for name in ("train_gpus", "infer_gpus"):
            value = getattr(self, name)
            if value is not None and value < 0:
                raise ValueError(f"{name} must be >= 0, got {value}")
        if self.engine_tensor_parallel < 1:
            raise ValueError(
                f"engine_tensor_parallel must be >= 1, got {self.engine_tensor_parallel}"
            )
        if not 0.0 < self.mem_fraction_static < 1.0:
            raise ValueError(
                f"mem_fraction_static must be in (0, 1), got {self.mem_fraction_static}"
            )
        if self.colocate and self.infer_gpus is not None:
            raise ValueError(
                f"infer_gpus={self.infer_gpus} but colocate is true: colocated engines run on the "
                "train_gpus; leave infer_gpus unset"
            )
        if self.pool is not None and (not self.pool or self.infer_gpus is not None):
            raise ValueError(
                f"pool {self.pool!r}: a pool's models serve on its training GPUs (colocated): "
                "name it with a non-empty string and leave infer_gpus unset"
            )
        if self.nodes is not None and (not self.nodes or min(self.nodes) < 0):
            raise ValueError(
                f"nodes must be a non-empty list of node indices >= 0, got {self.nodes}"
            )
        return self


def resources_of(spec: AgentSpec) -> ResourceConfig:
    """The spec's ``resources`` dict as a validated ResourceConfig (errors name the agent)."""
    where = f"agents[{spec.name!r}].resources"
    names = {f.name for f in fields(ResourceConfig)}
    unknown = sorted(set(spec.resources) - names)
    if unknown:
        raise ValueError(f"{where}: unknown key(s) {unknown}; valid keys: {sorted(names)}")
    try:
        return ResourceConfig(**spec.resources).validate()
    except (TypeError, ValueError) as e:
        raise ValueError(f"{where}.{e}") from None
