"""Placement on a cluster: which GPU trains or serves which agent's model (``plan``, the planner:
a ``Placement`` of ``PlacedModel``s), and running a placement on Ray (``run``: engines, routers,
the loop; the trainers on Ray are ``kernel.train.ray_trainer``). Ray is imported lazily, inside
their functions, so placing and ``kernel launch --dry-run`` need neither Ray nor a GPU."""

from kernel.cluster.plan import (
    ClusterConfig,
    EnginePlacement,
    PlacedModel,
    Placement,
    TrainerRank,
    make_placement,
)

__all__ = [
    "ClusterConfig",
    "EnginePlacement",
    "PlacedModel",
    "Placement",
    "TrainerRank",
    "make_placement",
]
