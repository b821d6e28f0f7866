"""Placement on a cluster: which GPU trains or serves which agent (``plan``), and running a plan
on Ray (``run``: engines, routers, the loop; the trainers on Ray are
``kernel.train.ray_trainer``). Ray is imported lazily, inside their functions, so planning and
``kernel launch --dry-run`` need neither Ray nor a GPU."""

from kernel.cluster.plan import (
    ClusterConfig,
    EnginePlacement,
    ModelPlan,
    Plan,
    ResourceConfig,
    TrainerRank,
    make_plan,
)

__all__ = [
    "ClusterConfig",
    "EnginePlacement",
    "ModelPlan",
    "Plan",
    "ResourceConfig",
    "TrainerRank",
    "make_plan",
]
