"""Scaling out on Ray: the cluster a run uses (`cluster`) and rollout workers that play
env groups in parallel actors (`rollout_workers`). Ray is imported only when used."""

from starpo.distributed.cluster import RayCluster, connect, import_ray
from starpo.distributed.rollout_workers import PoolEngine, RolloutPool, split_groups

__all__ = ["PoolEngine", "RayCluster", "RolloutPool", "connect", "import_ray", "split_groups"]
