"""What each context-window mode (`rollout.context_window`) costs on Sokoban, side by side.

    python bench/bench_context_window.py [--repeats 3] [--kept 2] [--turns 10]

The `sokoban` case of bench/bench_update.py (the `cpu-sokoban-sft-starpo-s` update on the
real default model: 2 groups x 8 dialogues, one action a turn, replayed solver and random
moves through the rollout engine) played in each mode: full (the whole dialogue), last_k
(the task plus the last `--kept` turns) and single_turn. The same moves in every mode,
so only the prompts differ. Per mode it prints, per episode: the tokens the trajectory
holds (what the update trains on), the prompt tokens the rollout feeds the policy (its
encode work: a rebuilt prompt is fed whole), the longest sequence (the rollout's KV cache
length) and the agent's tokens; then the median `ppo_update` seconds (after a warm-up)
and its ratio to full, measured in one run. fp32 or bf16 by the project's rule.
Micro-batches of 2 by default (4 and the preset's 8 ran out of 24 GiB in last_k, which trains on
about 3x the tokens of full).
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402

from bench_update import CASES, run_case  # noqa: E402
from starpo.models import load_model  # noqa: E402
from starpo.models.precision import compute_dtype, cpu_has_native_bf16  # noqa: E402
from starpo.types import Trajectory  # noqa: E402

MODES = ("full", "last_k", "single_turn")


def parts(traj: Trajectory) -> list[tuple[int, int]]:
    """[start, end) of each sequence the trajectory holds (one per rebuilt prompt)."""
    bounds = [0, *traj.context_resets, len(traj.token_ids)]
    return list(zip(bounds, bounds[1:], strict=False))


def episode_tokens(trajectories: list[Trajectory]) -> dict[str, float]:
    """Means per episode: tokens held, prompt tokens fed, longest sequence, agent tokens."""
    return {
        "tokens": statistics.mean(len(t.token_ids) for t in trajectories),
        "fed": statistics.mean(len(t.loss_mask) - sum(t.loss_mask) for t in trajectories),
        "longest": statistics.mean(max(b - a for a, b in parts(t)) for t in trajectories),
        "agent": statistics.mean(sum(t.loss_mask) for t in trajectories),
        "turns": statistics.mean(len(t.turns) for t in trajectories),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3, help="timed updates per mode")
    parser.add_argument("--kept", type=int, default=2, help="last_k: earlier turns kept")
    parser.add_argument("--turns", type=int, default=10, help="rollout.max_turns")
    parser.add_argument(
        "--micro", type=int, default=2, help="optim.micro_batch_size (memory: see below)"
    )
    args = parser.parse_args()
    args.recompute = False  # run_case's option: the rollout's old log-probs, as trained
    dtype = "bf16" if compute_dtype("auto", "cpu") == torch.bfloat16 else "fp32"
    print(
        f"CPU capability {torch.backends.cpu.get_cpu_capability()}, native bf16: "
        f"{cpu_has_native_bf16()}; {torch.get_num_threads()} threads; update in {dtype}"
    )
    model, tokenizer = load_model("smollm2-135m-instruct", dtype="fp32")
    results = {}
    for mode in MODES:
        extra = [
            f"rollout.context_window={mode}",
            f"rollout.context_turns={args.kept}",
            f"rollout.max_turns={args.turns}",
            f"rollout.max_actions_per_traj={args.turns}",
            f"optim.micro_batch_size={args.micro}",
        ]
        results[mode] = run_case(CASES["sokoban"], model, tokenizer, dtype, args, extra)
    full = results["full"]
    print(
        f"\nsokoban, {len(full['trajectories'])} episodes, up to {args.turns} turns of one "
        f"action; last_k keeps {args.kept} earlier turns. Per episode (mean):"
    )
    print(
        f"{'mode':<13}{'turns':>7}{'tokens':>9}{'fed':>8}{'longest':>9}{'agent':>7}"
        f"{'update s':>10}{'vs full':>9}"
    )
    for mode, result in results.items():
        e = episode_tokens(result["trajectories"])
        print(
            f"{mode:<13}{e['turns']:>7.1f}{e['tokens']:>9.0f}{e['fed']:>8.0f}"
            f"{e['longest']:>9.0f}{e['agent']:>7.1f}{result['seconds']:>10.3f}"
            f"{result['seconds'] / full['seconds']:>8.2f}x"
        )
    print(
        "tokens: what the update trains on; fed: prompt tokens the rollout encodes (a "
        "rebuilt prompt whole); longest: the longest sequence (KV cache length)"
    )


if __name__ == "__main__":
    main()
