"""Data-parallel learners: N processes train one policy on one global batch.

Who holds what (`trainer.learners=N`):
- the driver (the `starpo train` process) is learner 0: it plays or gathers the rollouts,
  prepares the batch (advantages), logs and checkpoints, as with one learner;
- N-1 `LearnerReplica` Ray actors each hold a copy of the models and the optimizer state,
  started from the driver's (so a resumed run's replicas start from its checkpoint);
- every update, all N take the same prepared batch and the same shuffling seed; each runs
  only its share of each mini-batch's micro-batches (micro-batch i on learner i mod N),
  then they sum gradients with `torch.distributed` (gloo on CPUs) before the optimizer
  step. The optimizer then applies the same update everywhere, so the replicas never drift.

Because every micro-batch loss is already scaled by its whole mini-batch's token count,
the summed gradient is the one-learner gradient (up to float summation order), and one
step with N learners equals one step with one learner (tested within fp32 tolerance).

A learner that dies mid-update breaks the collective: the driver stops the run with one
line naming the last checkpoint, and `starpo train --resume` continues from it.
"""

from __future__ import annotations

import socket
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from starpo.distributed.cluster import import_ray, require_free_cpus, wait_started

#: How long a collective waits for a silent learner before the run stops.
COLLECTIVE_TIMEOUT = timedelta(seconds=120)


class GradientSync:
    """This learner's share of the work and the collectives that merge the shares: the
    `starpo.trainer.update.DataParallel` interface over torch.distributed (gloo)."""

    def __init__(self, rank: int, world: int) -> None:
        self.rank, self.world = rank, world

    def owns(self, micro_index: int) -> bool:
        """Whether this learner runs micro-batch `micro_index` of a mini-batch."""
        return micro_index % self.world == self.rank

    def sum_(self, tensor: torch.Tensor) -> None:
        dist.all_reduce(tensor, op=dist.ReduceOp.SUM)

    def sum_gradients(self, params: list[torch.nn.Parameter]) -> None:
        """Sum every parameter's gradient over the learners, in one flat buffer."""
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
        flat = torch.cat([g.reshape(-1).float() for g in grads])
        self.sum_(flat)
        offset = 0
        for param, grad in zip(params, grads, strict=True):
            size = grad.numel()
            param.grad = flat[offset : offset + size].view_as(param).to(param.dtype).clone()
            offset += size

    def all_true(self, flag: bool) -> bool:
        value = torch.tensor([int(flag)])
        dist.all_reduce(value, op=dist.ReduceOp.MIN)
        return bool(value.item())

    def gather(self, obj: Any) -> list[Any]:
        """Every learner's `obj`, in rank order."""
        out: list[Any] = [None] * self.world
        dist.all_gather_object(out, obj)
        return out


def free_port(host: str) -> int:
    with socket.socket() as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def join_group(address: str, rank: int, world: int) -> GradientSync:
    """Join the learners' gloo group at tcp://`address` (the driver's host and port)."""
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://{address}",
        rank=rank,
        world_size=world,
        timeout=COLLECTIVE_TIMEOUT,
    )
    return GradientSync(rank, world)


class LearnerReplica:
    """The body of one Ray actor: learner `rank` > 0 (wrapped by `Learners`)."""

    def __init__(self, config: dict[str, Any], models: Any, optimizer_state: dict) -> None:
        from starpo.config import config_from_dict
        from starpo.trainer.optim import build_optimizers

        torch.set_num_threads(1)
        self.cfg = config_from_dict(config)
        self.models = models
        self.optimizers = build_optimizers(self.cfg, models.actor, models.critic)
        self.optimizers.load_state_dict(optimizer_state)
        self.sync: GradientSync | None = None

    def ready(self) -> bool:
        return True

    def join(self, address: str, rank: int, world: int, threads: int) -> int:
        torch.set_num_threads(threads)
        self.sync = join_group(address, rank, world)
        return rank

    def update(self, batch: Any, seed: int) -> None:
        """The same update as the driver's, on this learner's share of the micro-batches."""
        from starpo.trainer.update import ppo_update
        from starpo.trainer.update_settings import UpdateSettings

        generator = torch.Generator().manual_seed(seed)
        settings = UpdateSettings.of(self.cfg)
        ppo_update(batch, self.models, self.optimizers, settings, generator, sync=self.sync)


class Learners:
    """The driver's handle on learners 1..N-1 and its own place (rank 0) in the group."""

    def __init__(
        self, world: int, config: dict[str, Any], models: Any, optimizers: Any, host: str
    ) -> None:
        ray = import_ray()
        require_free_cpus(
            world - 1, f"trainer.learners={world} (the driver + {world - 1} Ray actors)",
            "set fewer trainer.learners or rollout.workers",
        )  # fmt: skip
        actor_class = ray.remote(num_cpus=1)(LearnerReplica)
        state = ray.put(optimizers.state_dict())
        models_ref = ray.put(models)
        self.replicas = [actor_class.remote(config, models_ref, state) for _ in range(world - 1)]
        self._pending: list[Any] = []
        try:
            wait_started([r.ready.remote() for r in self.replicas], "the learners")
            address = f"{host}:{free_port(host)}"
            threads = max(1, torch.get_num_threads() // world)
            joined = [r.join.remote(address, rank, world, threads) for rank, r in
                      enumerate(self.replicas, start=1)]  # fmt: skip
            self.sync = join_group(address, 0, world)  # blocks until every learner joined
            ray.get(joined)
        except BaseException:
            self.close()  # no actor of a failed start outlives it (a joined cluster keeps running)
            raise

    def start_update(self, batch: Any, seed: int) -> None:
        """Send the prepared batch (one object-store copy) and start the replicas' update."""
        ray = import_ray()
        ref = ray.put(batch.to(torch.device("cpu")))
        self._pending = [r.update.remote(ref, seed) for r in self.replicas]

    def finish_update(self) -> None:
        ray = import_ray()
        pending, self._pending = self._pending, []
        ray.get(pending)

    def any_dead(self, timeout_s: float = 5.0) -> bool:
        """Whether a learner's process is gone. A live learner that is busy (waiting in an
        all-reduce the driver left) does not answer in time and counts as alive."""
        ray = import_ray()
        pings = [r.ready.remote() for r in self.replicas]
        answered, _ = ray.wait(pings, num_returns=len(pings), timeout=timeout_s)
        try:
            ray.get(answered)
        except ray.exceptions.RayActorError:
            return True
        return False

    def close(self) -> None:
        ray = import_ray()
        for replica in self.replicas:
            ray.kill(replica)
        self.replicas = []
        if dist.is_initialized():
            dist.destroy_process_group()
