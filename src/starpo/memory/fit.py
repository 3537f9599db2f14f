"""The machine's memory against a config's plan: what this machine may use, the first
setting that fits when the config does not, the plan as `starpo plan` prints it, and the
check `starpo train` makes before any model loads."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from starpo.errors import UserError
from starpo.logs import warn
from starpo.memory.plan import (
    ConfigPlan,
    GiB,
    MemoryPlan,
    checkpoint_size,
    plan_config,
    plan_memory,
)
from starpo.memory.shapes import EpisodeShape, ModelShape


def machine_memory() -> int:
    """Bytes of memory this process may use: the RAM (MemTotal), or the cgroup's limit
    when a container sets a lower one."""
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    for limit_file in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            text = Path(limit_file).read_text().strip()
        except OSError:
            continue
        if text.isdigit():
            total = min(total, int(text))
    return total


def _with(cfg: Any, overrides: dict[str, Any]) -> Any | None:
    """`cfg` with dotted overrides applied, or None when the result is not a valid config."""
    from starpo.config import config_from_dict, config_to_dict

    data = config_to_dict(cfg)
    for dotted, value in overrides.items():
        section, key = dotted.split(".")
        data[section][key] = value
    try:
        return config_from_dict(data)
    except (UserError, ValueError):
        return None


def _candidates(cfg: Any) -> list[dict[str, Any]]:
    """Settings that lower the peak, the ones that leave results unchanged first:
    smaller micro-batches (same gradients), gradient checkpointing (same gradients),
    fewer validation episodes at once (same episodes), then a smaller rollout."""
    mini, micro = cfg.optim.mini_batch_size, cfg.optim.micro_batch_size
    smaller_micro = [m for m in range(micro - 1, 0, -1) if mini % m == 0]
    steps: list[dict[str, Any]] = [{"optim.micro_batch_size": m} for m in smaller_micro]
    if not cfg.model.gradient_checkpointing:
        steps.append({"model.gradient_checkpointing": True})
        steps += [
            {"optim.micro_batch_size": m, "model.gradient_checkpointing": True}
            for m in smaller_micro
        ]
    least_micro = {"optim.micro_batch_size": smaller_micro[-1]} if smaller_micro else {}
    val = cfg.trainer.val_batch_size
    while val > 1:
        val //= 2
        steps.append(
            {**least_micro, "model.gradient_checkpointing": True, "trainer.val_batch_size": val}
        )
    return steps


def fitting_setting(
    cfg: Any, shape: ModelShape, train: EpisodeShape, val: EpisodeShape, available: int
) -> tuple[dict[str, Any], MemoryPlan] | None:
    """The first of `_candidates` whose estimate fits in `available` bytes (with the plan),
    or None when none does."""
    for overrides in _candidates(cfg):
        changed = _with(cfg, overrides)
        if changed is None:
            continue
        plan = plan_memory(changed, shape, train, val)
        if plan.peak <= available:
            return overrides, plan
    return None


def format_overrides(overrides: dict[str, Any]) -> str:
    return " ".join(
        f"{k}={str(v).lower() if isinstance(v, bool) else v}" for k, v in overrides.items()
    )


def _gb(n: int) -> str:
    return f"{n / GiB:.2f} GiB"


def format_plan(planned: ConfigPlan, available: int) -> str:
    """The estimate part by part, the peak against the machine, and a setting that fits."""
    plan, cfg = planned.plan, planned.cfg
    width = max(len(k) for part in (plan.held, plan.rollout, plan.update) for k in part) + 2
    lines = [
        f"memory plan for {cfg.model.name} on {cfg.env.id} (worst case: every episode "
        f"{planned.train.max_turns} turns of {planned.train.response_tokens} new tokens)"
    ]
    for title, part in (
        ("held all run", plan.held),
        ("rollout phase", plan.rollout),
        ("update phase", plan.update),
    ):
        if part:
            lines.append(f"{title}:")
            lines += [f"  {k:<{width}}{_gb(v):>10}" for k, v in part.items()]
    for name, (count, each) in plan.processes.items():
        lines.append(f"{name} x {count}: {_gb(each)} each")
    lines += [f"note: {note}" for note in plan.notes]
    disk = checkpoint_size(cfg, planned.shape)
    lines.append(f"one checkpoint on disk: {_gb(disk)} ({cfg.trainer.checkpoint_contents})")
    lines.append(
        f"peak (in the {plan.peak_phase} phase): {_gb(plan.peak)}; this machine: {_gb(available)}"
    )
    if plan.peak <= available:
        lines.append("fits")
    else:
        lines.append(f"does not fit: {advice(planned, available)}")
    return "\n".join(lines)


def advice(planned: ConfigPlan, available: int) -> str:
    """A setting that fits, with its estimate, or what to change when none of ours does."""
    found = fitting_setting(planned.cfg, planned.shape, planned.train, planned.val, available)
    if found is None:
        return (
            "no micro-batch, checkpointing or validation batch setting fits; use fewer "
            "rollout.num_groups, a shorter rollout.max_turns or max_new_tokens, "
            "model.lora.enabled=true, or a larger machine"
        )
    overrides, plan = found
    return f"e.g. {format_overrides(overrides)} (estimated {_gb(plan.peak)})"


def check_fits(cfg: Any) -> None:
    """A one-line UserError when the config's estimated peak exceeds this machine's memory
    (`starpo train`, before any model loads)."""
    available = machine_memory()
    try:
        planned = plan_config(cfg)
    except UserError:
        raise  # the model or env cannot be found: training would fail the same way
    except Exception as exc:  # a model shape the estimate does not know: train anyway
        warn(f"memory check skipped: no estimate for this model ({exc})", "starpo.plan")
        return
    if planned.plan.peak > available:
        raise UserError(
            f"this config's estimated peak memory is {_gb(planned.plan.peak)}, more than this "
            f"machine's {_gb(available)}; {advice(planned, available)}. `starpo plan` shows "
            "the parts; trainer.memory_check=false skips this check"
        )
