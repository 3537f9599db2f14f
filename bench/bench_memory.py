"""`starpo plan`'s estimate against the measured peak memory of `starpo train`.

Each config runs as its own `starpo train` process (2 steps, so AdamW's moments exist
during the second step's rollout and update, as in any longer run); the peak is the
child's maximum resident set size (`wait4`'s ru_maxrss). Prints estimate, measured peak
and their ratio side by side.

    python bench/bench_memory.py              # the embedded 135M model on two presets
    python bench/bench_memory.py --quick      # a 50M random model, two small configs
    python bench/bench_memory.py --only demo  # the configs whose label says "demo"
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

from starpo.config import load_config
from starpo.memory.plan import GiB, measured_peak_rss, plan_config

# name: (preset, overrides); the base model plays the SFT preset (worst-case-like lengths).
REAL = {
    "bandit GRPO fp32 (make demo)": ("cpu-bandit-starpo-s", []),
    "sokoban GRPO bf16 autocast": (
        "cpu-sokoban-sft-starpo-s",
        ["model.name=smollm2-135m-instruct"],
    ),
}
STEPS = [
    "trainer.total_steps=2",
    "trainer.val_before_train=false",
    "trainer.val_every=0",
    "trainer.save_every=0",
    "trainer.tensorboard=false",
]


def quick_configs(model_dir: Path) -> dict[str, tuple[str, list[str]]]:
    """Two configs on a 50M random model: one whose peak is the rollout's KV cache, one
    whose peak is the update's activations (critic included)."""
    name = f"model.name={model_dir}"
    return {
        "50M bandit GRPO fp32, 128 episodes": (
            "cpu-bandit-starpo-s",
            [name, "rollout.max_new_tokens=24"],
        ),
        "50M sokoban GAE critic, 5 turns": (
            "cpu-tiny-smoke",
            [
                name,
                "env.id=sokoban",
                "rollout.num_groups=2",
                "rollout.group_size=4",
                "rollout.max_turns=5",
                "rollout.max_actions_per_traj=5",
                "rollout.max_new_tokens=16",
                "optim.mini_batch_size=4",
                "optim.micro_batch_size=4",
                "filter.enabled=false",
                "trainer.val_seeds=4",
            ],
        ),
    }


def save_quick_model(folder: Path) -> Path:
    from starpo.models import tiny_random_model

    model, tokenizer = tiny_random_model(
        seed=0, hidden_size=512, num_layers=8, num_heads=8, num_kv_heads=4, intermediate_size=1536
    )
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def measured_peak(preset: str, overrides: list[str], out: Path) -> int:
    """Peak RSS in bytes of one `starpo train` process."""
    command = [
        sys.executable,
        "-m",
        "starpo",
        "train",
        "--config",
        preset,
        *overrides,
        *STEPS,
        "trainer.num_threads=2",
        "--out",
        str(out),
        "--quiet",
    ]
    return measured_peak_rss(command, out.with_suffix(".stderr"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a 50M random model instead")
    parser.add_argument("--only", default="", help="the configs whose label contains this")
    args = parser.parse_args()
    import torch

    from starpo.models.precision import cpu_has_native_bf16

    native = "yes" if cpu_has_native_bf16() else "no"
    print(f"CPU capability {torch.backends.cpu.get_cpu_capability()}, native bf16: {native}")
    with tempfile.TemporaryDirectory() as tmp:
        configs = quick_configs(save_quick_model(Path(tmp) / "m50")) if args.quick else REAL
        print(f"{'config':<38}{'estimate':>10}{'measured':>10}{'ratio':>8}  phase")
        configs = {label: run for label, run in configs.items() if args.only in label}
        for i, (label, (preset, overrides)) in enumerate(configs.items()):
            cfg = load_config(preset, [*overrides, *STEPS])
            plan = plan_config(cfg).plan
            peak = measured_peak(preset, overrides, Path(tmp) / f"run{i}")
            print(
                f"{label:<38}{plan.peak / GiB:>9.2f}G{peak / GiB:>9.2f}G"
                f"{plan.peak / peak:>8.2f}  {plan.peak_phase}",
                flush=True,
            )


if __name__ == "__main__":
    main()
