"""Optimizers and learning-rate schedules of a run: AdamW for the actor (and the critic),
each with a warm-up + constant / cosine schedule (`compute.lr_schedule`, the one `starpo
sft` steps by too) stepped once per optimizer update."""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Any

import torch
from torch.optim.lr_scheduler import LambdaLR

from starpo.compute.lr_schedule import lr_multiplier
from starpo.compute.weights import trainable_parameters
from starpo.config import TrainConfig

KEYS = ("optim", "schedule")  # checkpoint keys: actor_optim, actor_schedule, critic_...


def updates_per_run(cfg: TrainConfig) -> int:
    """Optimizer updates in the whole run: steps x epochs x mini-batches per step."""
    minis = math.ceil(cfg.trajectories_per_step / cfg.optim.mini_batch_size)
    return cfg.trainer.total_steps * cfg.optim.ppo_epochs * minis


def _sync_lr(optimizer: torch.optim.Optimizer, schedule: LambdaLR) -> None:
    """Set the rates in effect from the schedule's base rates and place (a loaded optimizer
    state may carry the rates of another point of the run)."""
    for group, base, fn in zip(
        optimizer.param_groups, schedule.base_lrs, schedule.lr_lambdas, strict=True
    ):
        group["initial_lr"], group["lr"] = base, base * fn(schedule.last_epoch)


@dataclass
class Optimizers:
    """The actor's (and the critic's) optimizer with its schedule."""

    actor: torch.optim.Optimizer
    critic: torch.optim.Optimizer | None
    actor_schedule: LambdaLR
    critic_schedule: LambdaLR | None

    def named(self) -> list[tuple[str, torch.optim.Optimizer, LambdaLR]]:
        """("actor", optimizer, schedule), and the critic's when there is one."""
        named = [("actor", self.actor, self.actor_schedule)]
        if self.critic is not None and self.critic_schedule is not None:
            named.append(("critic", self.critic, self.critic_schedule))
        return named

    def pairs(self) -> list[tuple[torch.optim.Optimizer, LambdaLR]]:
        return [(optimizer, schedule) for _, optimizer, schedule in self.named()]

    def step(self) -> None:
        """One update: every optimizer steps, then its schedule advances."""
        for optimizer, schedule in self.pairs():
            optimizer.step()
            schedule.step()

    def zero_grad(self) -> None:
        for optimizer, _ in self.pairs():
            optimizer.zero_grad(set_to_none=True)

    def scale_lr(self, factor: float) -> None:
        """Multiply every base learning rate by `factor` from now on (the current point of
        the schedule is kept; the learning rates in effect are recomputed from it)."""
        for optimizer, schedule in self.pairs():
            schedule.base_lrs = [lr * factor for lr in schedule.base_lrs]
            _sync_lr(optimizer, schedule)

    def state_dict(self) -> dict[str, Any]:
        """`{name}_optim` and `{name}_schedule` for actor and critic (None without one)."""
        state: dict[str, Any] = {f"{n}_{k}": None for n in ("actor", "critic") for k in KEYS}
        for name, optimizer, schedule in self.named():
            state[f"{name}_optim"] = optimizer.state_dict()
            state[f"{name}_schedule"] = schedule.state_dict()
        return state

    def load_state_dict(self, state: dict[str, Any], schedules: bool = True) -> None:
        """Restore the optimizers from `state_dict()`, and with `schedules` their learning-
        rate schedules too; without, the schedules keep their place and set the rates.
        An optimizer state of None (a weights-only checkpoint) empties the optimizer:
        AdamW's moments and step counts start again from zero."""
        for name, optimizer, schedule in self.named():
            saved = state[f"{name}_optim"]
            if saved is None:
                optimizer.state.clear()
            else:
                kernels = [_kernel_choice(group) for group in optimizer.param_groups]
                optimizer.load_state_dict(saved)
                _restore_kernel_choice(optimizer, kernels)
            if schedules and state.get(f"{name}_schedule") is not None:
                schedule.load_state_dict(state[f"{name}_schedule"])
            _sync_lr(optimizer, schedule)


KERNEL_KEYS = ("fused", "foreach")


def _kernel_choice(group: dict[str, Any]) -> dict[str, Any]:
    return {key: group.get(key) for key in KERNEL_KEYS}


def _restore_kernel_choice(optimizer: torch.optim.Optimizer, kernels: list[dict]) -> None:
    """Keep the kernel this optimizer was built with after loading a state saved by one
    built otherwise (an older run, another device): `load_state_dict` takes the saved
    groups' `fused` flag. A fused step wants its step counts on the parameters' device."""
    for group, kernel in zip(optimizer.param_groups, kernels, strict=True):
        group.update(kernel)
        for param in group["params"]:
            step = optimizer.state.get(param, {}).get("step")
            if kernel["fused"] and isinstance(step, torch.Tensor):
                optimizer.state[param]["step"] = step.to(param.device, torch.float32)


#: Devices with a fused AdamW kernel (one pass over each parameter's state).
FUSED_ADAMW_DEVICES = ("cpu", "cuda")


def fused_adamw_supported(params: list[torch.nn.Parameter]) -> bool:
    """Whether torch's fused AdamW can update `params`: floating point, on one device type
    it has a kernel for. The fused step reads and writes each parameter and its state once;
    the default (per-tensor) step on a CPU makes ~10 passes with (vocab x hidden)
    temporaries. Same update up to float rounding (<= 1 ulp per step)."""
    types = {p.device.type for p in params}
    return (
        bool(params)
        and len(types) == 1
        and types <= set(FUSED_ADAMW_DEVICES)
        and all(p.is_floating_point() for p in params)
    )


def build_optimizers(
    cfg: TrainConfig, actor: torch.nn.Module, critic: torch.nn.Module | None
) -> Optimizers:
    """AdamW over the trainable parameters (fused where torch has the kernel); LoRA
    multiplies both learning rates."""
    opt, lora = cfg.optim, cfg.model.lora
    scale = lora.lr_multiplier if lora.enabled else 1.0
    multiplier = functools.partial(
        lr_multiplier,
        warmup=opt.lr_warmup_steps,
        total=updates_per_run(cfg),
        schedule=opt.lr_schedule,
        min_ratio=opt.min_lr_ratio,
    )

    def adamw(module: torch.nn.Module, lr: float) -> tuple[torch.optim.Optimizer, LambdaLR]:
        params = trainable_parameters(module)
        optimizer = torch.optim.AdamW(
            params,
            lr=lr * scale,
            betas=tuple(opt.betas),
            weight_decay=opt.weight_decay,
            fused=fused_adamw_supported(params) or None,
        )
        return optimizer, LambdaLR(optimizer, multiplier)

    actor_opt, actor_schedule = adamw(actor, opt.actor_lr)
    critic_opt = critic_schedule = None
    if critic is not None:
        critic_opt, critic_schedule = adamw(critic, opt.critic_lr)
    return Optimizers(actor_opt, critic_opt, actor_schedule, critic_schedule)
