"""Placement on a cluster: which GPU trains or serves which agent (``plan``), and trainer groups of
Ray actors (``ray_group``). Ray is imported lazily, inside ``ray_group``'s functions, so planning
and ``kernel launch --dry-run`` need neither Ray nor a GPU."""

from kernel.cluster.plan import (
    ClusterConfig,
    Engine,
    GroupPlan,
    Plan,
    ResourceConfig,
    TrainerRank,
    make_plan,
)

__all__ = [
    "ClusterConfig",
    "Engine",
    "GroupPlan",
    "Plan",
    "ResourceConfig",
    "TrainerRank",
    "make_plan",
]
