"""One whole StarPO-S step of the multi-turn CPU presets, phase by phase, with each speed-up
switched off and on side by side in one run.

    python bench/bench_step.py                       # sokoban and frozenlake
    python bench/bench_step.py --env sokoban --steps 2
    python bench/bench_step.py --env invoice         # a tool env (or support)
    python bench/bench_step.py --env invoice --contenders 0 9 --sft-episodes 8 --sft-epochs 1
                                                     # the preset against the tool
                                                     # step's levers, a weak policy
    STARPO_CPU_BF16=0 ATEN_CPU_CAPABILITY=avx2 python bench/bench_step.py   # as on an
                                                     # AVX2-only laptop CPU (fp32 everywhere)

The policy is the presets' own starting point in miniature: SmolLM2-135M-Instruct after a
short SFT on solver episodes (`--sft-episodes`, made once and kept under `--out`), so turns
are well formed and a group's episodes agree often and differ sometimes, as they do in the
recipe's RL stage. Each contender builds a fresh `Trainer` from the preset (same seeds) and
runs `--steps` steps of `Trainer.train_step`: rollout (64 episodes), filter (top 25% of
groups by reward std), prepare and update (16 dialogues), weight sync.

Printed per contender and phase: seconds, tokens prefilled / decoded (rollout; prefilled
counts only tokens actually fed to the model, so a history shared by several episodes
counts once) and trained (update), the FLOPs of the phase's linear layers and their share
of the fp32 (or the update dtype's) matmul peak measured in the same run; then the share
of duplicate (episode, turn) histories, and whether the contenders played the same
episodes token for token (exact switches must).
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from common import memory_bandwidth_gbs
from starpo.compute import flops
from starpo.config import load_config
from starpo.models.precision import cpu_has_native_bf16
from starpo.rollout.backends.lean_decoder import AttentionTally
from starpo.types import Trajectory

PRESETS = {
    "sokoban": "cpu-sokoban-sft-starpo-s",
    "frozenlake": "cpu-frozenlake-sft-starpo-s",
    # The tool envs: ~1,150 prompt tokens before the first reply (the tools' schemas), few
    # tokens a reply: where sharing a group's identical first prompt should pay most.
    "invoice": "cpu-invoice-sft-starpo-s",
    "support": "cpu-support-sft-starpo-s",
}
TOOL_ENVS = ("invoice", "support")
DEFAULT_ENVS = ["sokoban", "frozenlake"]


@dataclass(frozen=True)
class Contender:
    """A way to run the step: config overrides of the preset."""

    name: str
    overrides: tuple[str, ...] = ()
    tools_only: bool = False  # a lever of the tool envs' prompts: skipped elsewhere
    # The lean cache keeps the padding a rectangular batch accumulates (its path before
    # 2026-12-08; `LeanBackend.drop_padding`), to measure what dropping it saves.
    keep_padding: bool = False

    @property
    def layout(self) -> tuple[str, ...]:
        """The overrides that change what the SFT policy is shown (its own SFT: a policy
        fine-tuned on one tool listing and played with another would play other episodes
        for reasons that are not the step's cost)."""
        return tuple(o for o in self.overrides if o.startswith("rollout.tool_format="))


FIRST_TURN_FORMAT = ("rollout.format_every_turn=false",)
LORA = ("model.lora.enabled=true",)
# Half the episodes per step, one group of 8 trained: the cost side of the batch shape
# (what it costs in learning is issue 35's to measure).
GROUPS_4X8 = ("rollout.num_groups=4", "optim.mini_batch_size=8")
SMALL_BATCH = (*GROUPS_4X8, "optim.micro_batch_size=8")

# Approximate, opt-in: gradient only through the positions that predict agent tokens.
DETACHED_CONTEXT = ("optim.detach_context=true",)
# Prompt-changing, opt-in: a tool env's tools listed one signature line each, not as JSON.
SIGNATURES = ("rollout.tool_format=signatures",)
# Approximate, opt-in: the lean cache's keys and values in bf16 (half the bytes decode
# attention reads).
BF16_CACHE = ("rollout.kv_dtype=bf16",)

#: The first is the preset as it is; the others each switch one lever. Only the exact ones
#: must play the same episodes: a different prompt layout or batch plays different ones.
CONTENDERS = (
    Contender("preset"),
    Contender("shared histories (exact)", ("rollout.share_histories=true",)),
    Contender("format reminder in turn 1 only", FIRST_TURN_FORMAT),
    Contender("LoRA r=64 adapters", LORA),
    Contender("4 groups x 8, train 1 group", SMALL_BATCH),
    Contender("all three above", FIRST_TURN_FORMAT + LORA + SMALL_BATCH),
    Contender("context without gradient (approx.)", DETACHED_CONTEXT),
    Contender(
        "format once + 4x8 + no ctx grad", FIRST_TURN_FORMAT + SMALL_BATCH + DETACHED_CONTEXT
    ),
    Contender("tools as signatures (prompt)", SIGNATURES, tools_only=True),
    # (The format reminder plays no part in tool envs: their turns carry none.)
    Contender(
        "signatures + 4x8 + no ctx grad",
        # The preset's micro-batches of 4 dialogues of ~1,700 tokens: SMALL_BATCH's 8 at
        # once took the bench past 24 GB and the kernel killed it.
        SIGNATURES + GROUPS_4X8 + DETACHED_CONTEXT,
        tools_only=True,
    ),
    Contender("bf16 KV cache (approx.)", BF16_CACHE),
    Contender(
        "signatures + 4x8 + no ctx grad + bf16 KV",
        SIGNATURES + GROUPS_4X8 + DETACHED_CONTEXT + BF16_CACHE,
        tools_only=True,
    ),
    Contender("padding kept (before 2026-12-08)", keep_padding=True),
)


@dataclass
class StepFigures:
    """What one contender's steps measured (summed over its steps)."""

    rollout_s: float = 0.0
    update_s: float = 0.0
    other_s: float = 0.0
    prefilled: int = 0  # real tokens fed to the rollout model (prompts, observations)
    decoded: int = 0  # tokens sampled
    trained: int = 0  # real tokens of the update batch (each PPO epoch)
    rollout_flops: float = 0.0
    update_flops: float = 0.0
    # The rollout's attention (lean decoder only; None on the transformers backend).
    attention: AttentionTally | None = None
    episodes: list[list[Trajectory]] = field(default_factory=list)

    @property
    def total_s(self) -> float:
        return self.rollout_s + self.update_s + self.other_s


def sft_policy(
    env: str, out: Path, episodes: int, epochs: int, layout: tuple[str, ...] = ()
) -> Path:
    """The SFT model the steps start from, trained once into `out/sft-<env>...` (one per
    prompt `layout`: overrides such as the tool listing)."""
    tag = "".join(f"-{o.split('=', 1)[1]}" for o in layout)
    folder = out / f"sft-{env}-{episodes}x{epochs}{tag}"
    if (folder / "sft_summary.json").exists():
        return folder
    from starpo.models import DEFAULT_MODEL
    from starpo.models.precision import compute_dtype
    from starpo.sft import run_sft
    from starpo.sft.train import TrainOptions

    cfg = load_config(PRESETS[env], list(layout))
    mixed = compute_dtype("auto", "cpu") == torch.bfloat16
    print(f"[sft] {episodes} solver episodes x {epochs} epochs into {folder} ...", flush=True)
    started = time.perf_counter()
    run_sft(
        DEFAULT_MODEL,
        (),
        cfg.rollout.settings(),
        folder,
        options=TrainOptions(epochs=epochs, lr=2e-4, dtype="bf16" if mixed else "fp32"),
        from_solver=episodes,
        env_id=env,
        quiet=True,
    )
    print(f"[sft] done in {time.perf_counter() - started:.0f} s", flush=True)
    return folder


def duplicate_share(trajectories: list[Trajectory]) -> tuple[int, int]:
    """(episode-turns whose dialogue up to that turn's reply another episode of the group
    already had, all episode-turns)."""
    duplicates = total = 0
    for group in sorted({t.group for t in trajectories}):
        members = [t for t in trajectories if t.group == group]
        for k in range(max(len(t.turn_ends) for t in members)):
            heads = [tuple(t.token_ids[: t.turn_ends[k] + 1]) for t in members if len(t.turns) > k]
            total += len(heads)
            duplicates += len(heads) - len(set(heads))
    return duplicates, total


def run_contender(cfg_name: str, model_dir: Path, contender: Contender, steps: int):
    """`steps` training steps of a fresh Trainer; its figures."""
    from starpo.trainer import Trainer
    from starpo.trainer.update import UPDATE_FLOPS

    overrides = [f"model.name={model_dir}", "trainer.log_trajectories=0", *contender.overrides]
    cfg = load_config(cfg_name, overrides)
    figures = StepFigures()
    with tempfile.TemporaryDirectory() as run_dir:
        trainer = Trainer(cfg, Path(run_dir), quiet=True)
        backend = trainer.backend
        lean = getattr(backend, "lean", None)
        if lean is not None:
            lean.attention = figures.attention = AttentionTally()  # this contender's alone
            backend.drop_padding = not contender.keep_padding
        shape = flops.model_shape(trainer.models.actor)
        for step in range(steps):
            fed_before = backend.tokens_fed
            started = time.perf_counter()
            captured = capture_rollout(trainer)
            # Steps count from 1, as in training: step 0 would also run the MI probe
            # (diagnostics.mi_every divides it), ~18 s on Sokoban that a real step pays
            # one step in ten.
            metrics = trainer.train_step(step + 1)
            wall = time.perf_counter() - started
            trajectories = captured.pop()
            decoded = sum(sum(t.loss_mask) for t in trajectories)
            fed = backend.tokens_fed - fed_before
            rollout_s = metrics.get("timing_s/rollout", 0.0)
            update_s = metrics.get("timing_s/update", 0.0)
            figures.rollout_s += rollout_s
            figures.update_s += update_s
            figures.other_s += wall - rollout_s - update_s
            figures.decoded += decoded
            figures.prefilled += fed - decoded
            # Linear layers' FLOPs: every token fed goes through the decoder once; the
            # LM head runs once per sampled token.
            figures.rollout_flops += flops.decoder_flops(shape, fed, 0)
            figures.rollout_flops += flops.head_flops(shape, decoded)
            figures.update_flops += metrics.get(UPDATE_FLOPS, 0.0)
            seconds = max(update_s, 1e-9)
            figures.trained += round(metrics.get("perf/tokens_per_s", 0.0) * seconds)
            figures.episodes.append(trajectories)
        del trainer
    return figures


class capture_rollout:
    """Keeps the trajectories `Trainer.rollout` returns (the step does not return them)."""

    def __init__(self, trainer) -> None:
        self.kept: list[list[Trajectory]] = []
        original = trainer.rollout

        def rollout(step: int):
            trajectories, metrics = original(step)
            self.kept.append(trajectories)
            return trajectories, metrics

        trainer.rollout = rollout

    def pop(self) -> list[Trajectory]:
        return self.kept.pop()


def same_episodes(a: StepFigures, b: StepFigures) -> bool:
    pairs = zip(a.episodes, b.episodes, strict=True)
    return all([t.token_ids for t in x] == [t.token_ids for t in y] for x, y in pairs)


HEADER = (
    f"  {'contender':<42}{'rollout s':>10}{'update s':>10}{'other s':>9}{'step s':>9}"
    f"{'speed-up':>9}  {'prefilled':>9}{'decoded':>8}{'trained':>8}"
    f"{'roll %pk':>9}{'upd %pk':>8}  same  episodes"
)


def row(name: str, r: StepFigures, base: StepFigures, peak: float) -> str:
    """One contender's line of the table, against the first contender `base`."""
    roll_share = r.rollout_flops / max(r.rollout_s, 1e-9) / 1e9 / peak
    upd_share = r.update_flops / max(r.update_s, 1e-9) / 1e9 / peak
    return (
        f"  {name:<42}{r.rollout_s:>10.1f}{r.update_s:>10.1f}{r.other_s:>9.1f}"
        f"{r.total_s:>9.1f}{base.total_s / r.total_s:>8.2f}x  {r.prefilled:>9}"
        f"{r.decoded:>8}{r.trained:>8}{roll_share:>9.1%}{upd_share:>8.1%}"
        f"  {'yes' if same_episodes(base, r) else 'no ':<4}  {episode_summary(r)}"
    )


def attention_line(name: str, r: StepFigures, bandwidth: float) -> str:
    """The rollout's attention: its seconds and share of the rollout, for decode steps and
    wider feeds apart, and decode's key/value reads against the memory bandwidth (a decode
    step's attention reads every cached column once: bandwidth is its bound)."""
    a = r.attention
    if a is None:
        return f"  {name:<42}attention: not counted (not the lean decoder)"
    gb = a.decode_bytes / 1e9
    rate = gb / max(a.decode_s, 1e-9)
    return (
        f"  {name:<42}attention: decode {a.decode_s:.1f} s ({a.decode_s / r.rollout_s:.0%} "
        f"of the rollout), {gb:.1f} GB of keys and values read, {rate:.1f} GB/s = "
        f"{rate / bandwidth:.0%} of the read bandwidth; prompts and observations "
        f"{a.feed_s:.1f} s ({a.feed_s / r.rollout_s:.0%})"
    )


def episode_summary(r: StepFigures) -> str:
    """Success and turns of the episodes a contender played."""
    episodes = [t for step in r.episodes for t in step]
    successes = sum(t.success for t in episodes) / max(len(episodes), 1)
    turns = sum(len(t.turns) for t in episodes) / max(len(episodes), 1)
    return f"{len(episodes)}, success {successes:.1%}, {turns:.1f} turns"


def report(
    env: str, steps: int, results: dict[str, StepFigures], peak: float, bandwidth: float
) -> None:
    base = next(iter(results.values()))
    print(f"\n{env}: {PRESETS[env]}, {steps} step(s) from the SFT policy")
    print(HEADER)
    for name, r in results.items():
        print(row(name, r, base, peak))
    for name, r in results.items():
        print(attention_line(name, r, bandwidth))
    duplicates, total = duplicate_share([t for step in base.episodes for t in step])
    print(
        f"  {name_of_first(results)}: duplicate (episode, turn) histories {duplicates} of "
        f"{total} ({duplicates / max(total, 1):.1%})"
    )


def name_of_first(results: dict[str, StepFigures]) -> str:
    return next(iter(results))


def contenders_for(env: str, chosen: list[Contender]) -> list[Contender]:
    """The chosen contenders that apply to `env` (the tool envs' prompt levers only there)."""
    return [c for c in chosen if env in TOOL_ENVS or not c.tools_only]


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--env", nargs="+", default=DEFAULT_ENVS, choices=PRESETS)
    parser.add_argument("--steps", type=int, default=1, help="training steps per contender")
    parser.add_argument("--sft-episodes", type=int, default=64)
    parser.add_argument("--sft-epochs", type=int, default=2)
    parser.add_argument("--out", type=Path, default=Path("out/bench_step"))
    parser.add_argument("--sft-only", action="store_true", help="make the SFT policies, stop")
    parser.add_argument(
        "--contenders", nargs="+", type=int, help="indices into CONTENDERS (default: all)"
    )
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    torch.set_num_threads(2)
    capability = torch.backends.cpu.get_cpu_capability()
    bf16 = cpu_has_native_bf16()
    emulated = os.environ.get("ATEN_CPU_CAPABILITY")
    print(
        f"CPU capability {capability}{' (ATEN_CPU_CAPABILITY set)' if emulated else ''}, "
        f"native bf16 {'yes' if bf16 else 'no'}, torch {torch.__version__}, "
        f"{torch.get_num_threads()} threads"
    )
    chosen = [CONTENDERS[i] for i in args.contenders] if args.contenders else list(CONTENDERS)
    plan = {env: contenders_for(env, chosen) for env in args.env}
    models = {
        (env, c.layout): sft_policy(env, args.out, args.sft_episodes, args.sft_epochs, c.layout)
        for env, contenders in plan.items()
        for c in contenders
    }
    if args.sft_only:
        return
    peak = flops.measure_matmul_peak(torch.float32)
    bandwidth = memory_bandwidth_gbs()
    print(
        f"fp32 matmul peak measured now: {peak:.1f} GFLOP/s; memory read bandwidth "
        f"{bandwidth:.1f} GB/s"
    )
    for env, contenders in plan.items():
        results = {}
        for contender in contenders:
            print(f"[{env}] {contender.name} ...", flush=True)
            model = models[env, contender.layout]
            figures = run_contender(PRESETS[env], model, contender, args.steps)
            results[contender.name] = figures
            first = next(iter(results.values()))
            print(HEADER + "\n" + row(contender.name, figures, first, peak), flush=True)
        report(env, args.steps, results, peak, bandwidth)


if __name__ == "__main__":
    main()
