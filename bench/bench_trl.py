"""One GRPO step of starpo versus TRL's `GRPOTrainer` on identical work, side by side.

What is measured: the wall time of one training step (generate 8 rollouts, score them, one
optimizer step) for each framework, in one process, one after the other:

- the same model files: the embedded SmolLM2-135M-Instruct, read by TRL from the Hugging
  Face folder starpo converts it into (`starpo.models.embedded.ensure_default_model`);
- the same prompt: the bandit's first prompt with think on, as starpo's rollout engine
  builds it (the same seed for both at each step), handed to TRL as plain text, so both see
  the same prompt tokens (both lengths are printed);
- one group of 8 rollouts, at most 64 new tokens, sampling at temperature 1, stopping only at
  end-of-turn tokens (starpo's stop at `</answer>` is off: TRL has no such stop);
- full fine-tuning in fp32 on the CPU, no KL term (beta 0, no reference model), the same
  clip range (0.2 / 0.28), entropy bonus (0.001), AdamW settings and gradient clipping, one
  optimizer step over the whole group, no gradient checkpointing;
- no validation, no checkpoints, no logging services in the timed part.

starpo runs its real `Trainer` (`train()` with per-step timings from its metrics); TRL runs
`GRPOTrainer.train()`, timed by a callback from the start to the end of each optimizer step.
The first step of each is a warm-up; the median of the following steps is reported, with the
tokens each step generated (sampling differs, so the lengths do too) and the ratio TRL/starpo.

Not equalised, as it is how each framework works: starpo encodes the prompt the group shares
once (in generation and in the training forward pass); TRL encodes it once per rollout.

    make bench-trl                       # installs the bench extra (TRL), then runs this
    python bench/bench_trl.py [--steps 3] [--warmup 1] [--max-new-tokens 64]
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import tempfile
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from common import MAX_RESPONSE_WORDS, bandit_prompt_ids

MODEL = "smollm2-135m-instruct"
ENV = "bandit"
FIRST_SEED = 10000  # starpo's default rollout.train_seed_start: step k plays seed 10000 + k - 1
INSTALL_HINT = "TRL is not installed; run `make bench-trl` (it installs the bench extra, trl)"

# The optimisation settings both sides share (starpo's defaults, given to TRL explicitly).
LEARNING_RATE = 1e-6
WEIGHT_DECAY = 0.01
GRAD_CLIP = 1.0
CLIP_LOW, CLIP_HIGH = 0.2, 0.28
ENTROPY_COEF = 0.001
FORMAT_PENALTY = -0.1


@dataclass
class SideResult:
    """Per-step measurements of one framework (warm-up step included, first)."""

    name: str
    step_s: list[float] = field(default_factory=list)
    rollout_s: list[float] = field(default_factory=list)  # generation and scoring
    new_tokens: list[int] = field(default_factory=list)  # summed over the group's rollouts
    longest: list[int] = field(default_factory=list)  # the longest rollout of the group
    prompt_tokens: list[int] = field(default_factory=list)
    threads: list[int] = field(default_factory=list)  # torch threads seen during the steps

    def timed(self, values: list[Any], warmup: int) -> list[Any]:
        return values[warmup:]


# ------------------------------------------------------------------------ the prompt


def bandit_reward(completion: str, seed: int) -> float:
    """starpo's training reward of a one-turn bandit answer: the arm's payout, or the format
    penalty when the answer does not parse or names no arm."""
    from starpo.envs import make
    from starpo.rollout import prompts
    from starpo.rollout.parser import parse_turn

    # TRL's completion starts after the prompt's `<think>`; starpo parses it with the prefix.
    text = prompts.generation_prefix(True) + completion
    parsed = parse_turn(text, think=True, max_actions=1)
    if not parsed.format_ok:
        return FORMAT_PENALTY
    env = make(ENV)
    env.reset(seed=seed)
    _, reward, _, _, info = env.step(parsed.actions[0])
    return reward if info["action_is_valid"] else FORMAT_PENALTY


# ---------------------------------------------------------------------------- starpo


def starpo_overrides(args: argparse.Namespace) -> list[str]:
    """The config of one GRPO step on one bandit group, matching the TRL side."""
    total = args.warmup + args.steps
    return [
        f"model.name={MODEL}",
        "model.device=cpu",
        "model.dtype=fp32",
        f"env.id={ENV}",
        "rollout.num_groups=1",
        f"rollout.group_size={args.group_size}",
        f"rollout.train_seed_start={FIRST_SEED}",
        "rollout.max_turns=1",
        "rollout.max_actions_per_turn=1",
        "rollout.max_actions_per_traj=1",
        f"rollout.max_new_tokens={args.max_new_tokens}",
        "rollout.think=true",
        "rollout.temperature=1.0",
        "rollout.top_p=1.0",
        # TRL stops only at end-of-turn tokens; stopping at </answer> would be less work.
        f"rollout.stop_at_answer={'true' if args.stop_at_answer else 'false'}",
        f"rollout.format_penalty={FORMAT_PENALTY}",
        f"rollout.max_response_words={MAX_RESPONSE_WORDS}",
        "filter.enabled=false",
        "algorithm.adv_estimator=grpo",
        "algorithm.kl_coef=0",
        f"algorithm.clip_low={CLIP_LOW}",
        f"algorithm.clip_high={CLIP_HIGH}",
        f"algorithm.entropy_coef={ENTROPY_COEF}",
        "algorithm.loss_agg=token_mean",
        f"optim.actor_lr={LEARNING_RATE}",
        f"optim.weight_decay={WEIGHT_DECAY}",
        f"optim.grad_clip={GRAD_CLIP}",
        "optim.ppo_epochs=1",
        # The whole group in one optimizer step and one forward/backward, as TRL does it.
        f"optim.mini_batch_size={args.group_size}",
        f"optim.micro_batch_size={args.group_size}",
        # One step more than is run: the loop validates on its very last step.
        f"trainer.total_steps={total + 1}",
        "trainer.val_every=0",
        "trainer.val_before_train=false",
        "trainer.save_every=0",
        "trainer.log_trajectories=0",
        "trainer.tensorboard=false",
        "trainer.wandb=false",
    ]


def run_starpo(args: argparse.Namespace) -> SideResult:
    """starpo's `Trainer.train()` for warm-up + timed steps; times from its metrics."""
    import torch

    from starpo.config import load_config
    from starpo.trainer import Trainer

    result = SideResult("starpo")

    class MeasuredTrainer(Trainer):
        """The real trainer, recording what each rollout generated and saving nothing:
        checkpoints (about 2 GB with the optimizer state) are no part of the comparison."""

        def rollout(self, step: int):
            trajectories, metrics = super().rollout(step)
            lengths = [sum(turn.response_tokens for turn in t.turns) for t in trajectories]
            result.new_tokens.append(sum(lengths))
            result.longest.append(max(lengths))
            result.prompt_tokens.append(trajectories[0].loss_mask.index(1))
            result.threads.append(torch.get_num_threads())
            return trajectories, metrics

        def save(self, step: int, healthy: bool = True) -> Path:
            return self.run_dir

    cfg = load_config(None, starpo_overrides(args))
    with tempfile.TemporaryDirectory(prefix="bench-trl-starpo-") as run_dir:
        # Not quiet: starpo's own step lines are the progress display (they count to
        # trainer.total_steps, one more than is run).
        trainer = MeasuredTrainer(cfg, Path(run_dir))
        history = trainer.train(until_step=args.warmup + args.steps)
        del trainer
    for metrics in history:
        result.step_s.append(metrics["timing_s/step"])
        result.rollout_s.append(metrics["timing_s/rollout"])
    gc.collect()
    return result


# ------------------------------------------------------------------------------- TRL


def require_trl() -> Any:
    """The `trl` module, or exit with one line saying how to install it."""
    try:
        import trl
    except ImportError:
        sys.exit(f"bench_trl: {INSTALL_HINT}")
    return trl


def trl_config(args: argparse.Namespace, output_dir: str) -> Any:
    """GRPOConfig of one optimizer step per group of rollouts, settings as starpo's."""
    from trl import GRPOConfig

    return GRPOConfig(
        output_dir=output_dir,
        use_cpu=True,
        bf16=False,  # TRL defaults to bf16; fp32 as starpo on a CPU
        fp16=False,
        gradient_checkpointing=False,  # TRL defaults to on; starpo's default is off
        model_init_kwargs={"dtype": "float32"},
        num_generations=args.group_size,
        per_device_train_batch_size=args.group_size,  # one group per step ...
        gradient_accumulation_steps=1,  # ... in one forward/backward and one optimizer step
        max_steps=args.warmup + args.steps,
        max_completion_length=args.max_new_tokens,
        temperature=1.0,
        top_p=1.0,
        beta=0.0,
        num_iterations=1,
        epsilon=CLIP_LOW,
        epsilon_high=CLIP_HIGH,
        loss_type="dapo",  # token mean over the step's tokens: starpo's token_mean
        entropy_coef=ENTROPY_COEF,
        learning_rate=LEARNING_RATE,
        lr_scheduler_type="constant",
        weight_decay=WEIGHT_DECAY,
        max_grad_norm=GRAD_CLIP,
        optim="adamw_torch",  # torch.optim.AdamW, as starpo (TRL's default is the fused one)
        shuffle_dataset=False,  # step k gets row k: the prompt of starpo's step k
        seed=0,
        logging_strategy="no",
        save_strategy="no",
        eval_strategy="no",
        report_to=[],
        disable_tqdm=True,
        dataloader_pin_memory=False,
    )


def trl_dataset(tokenizer: Any, args: argparse.Namespace) -> Any:
    """One row per step: starpo's prompt of that step, as plain text (TRL tokenises it back
    to the same ids; no chat template is applied to a plain-text prompt)."""
    from datasets import Dataset

    seeds = [FIRST_SEED + i for i in range(args.warmup + args.steps)]
    texts = [tokenizer.decode(bandit_prompt_ids(tokenizer, seed)) for seed in seeds]
    return Dataset.from_dict({"prompt": texts, "seed": seeds})


def run_trl(args: argparse.Namespace) -> SideResult:
    """TRL's `GRPOTrainer.train()`; each step timed by a callback."""
    import torch
    from transformers import PrinterCallback, TrainerCallback
    from trl import GRPOTrainer

    from starpo.models import load_tokenizer
    from starpo.models.embedded import ensure_default_model

    result = SideResult("TRL")
    model_dir = str(ensure_default_model())
    dataset = trl_dataset(load_tokenizer(MODEL), args)

    def reward(completions: list[str], completion_ids: list[list[int]], seed: list[int], **_):
        lengths = [len(ids) for ids in completion_ids]
        result.new_tokens.append(sum(lengths))
        result.longest.append(max(lengths))
        return [bandit_reward(text, s) for text, s in zip(completions, seed, strict=True)]

    class StepClock(TrainerCallback):
        def on_step_begin(self, *_, **__):
            self.started = time.perf_counter()

        def on_step_end(self, *_, **__):
            result.step_s.append(time.perf_counter() - self.started)
            result.threads.append(torch.get_num_threads())
            progress(result, len(result.step_s), args)

    class MeasuredGRPOTrainer(GRPOTrainer):
        """Also times the rollout part: generation, rewards and advantages."""

        def _generate_and_score_completions(self, inputs):
            started = time.perf_counter()
            out = super()._generate_and_score_completions(inputs)
            result.rollout_s.append(time.perf_counter() - started)
            result.prompt_tokens.append(int(out["prompt_mask"][0].sum()))
            return out

    # transformers warns about names TRL still uses (gradient_checkpointing): not ours to fix.
    warnings.filterwarnings("ignore", category=FutureWarning)
    with tempfile.TemporaryDirectory(prefix="bench-trl-trl-") as output_dir:
        trainer = MeasuredGRPOTrainer(
            model=model_dir,
            reward_funcs=reward,
            args=trl_config(args, output_dir),
            train_dataset=dataset,
            callbacks=[StepClock()],
        )
        # With tqdm off it would print the end-of-training metrics dict: noise here.
        trainer.remove_callback(PrinterCallback)
        trainer.train()
        del trainer
    gc.collect()
    return result


# ---------------------------------------------------------------------------- report


def progress(result: SideResult, step: int, args: argparse.Namespace) -> None:
    kind = "warm-up" if step <= args.warmup else "timed"
    print(
        f"  {result.name} step {step}/{args.warmup + args.steps} ({kind}): "
        f"{result.step_s[-1]:.2f} s",
        file=sys.stderr,
        flush=True,
    )


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def report(sides: list[SideResult], args: argparse.Namespace, trl_version: str) -> None:
    w = args.warmup
    print(
        f"one GRPO step: {MODEL}, 1 {ENV} prompt (think on) x {args.group_size} rollouts, "
        f"<= {args.max_new_tokens} new tokens, full fine-tuning, fp32, no KL, CPU "
        f"({args.threads} threads); median of {args.steps} steps after {w} warm-up"
    )
    print(f"TRL {trl_version}; starpo stops at </answer>: {args.stop_at_answer}")
    both = len(sides) == 2
    header = f"{'':<26}" + "".join(f"{s.name:>10}" for s in sides)
    print(header + (f"{'TRL/starpo':>12}" if both else ""))
    # (label, per-side values, decimals, whether the TRL/starpo ratio is shown)
    rows = [
        ("prompt tokens", lambda s: s.prompt_tokens, 0, False),
        ("step s", lambda s: s.timed(s.step_s, w), 2, True),
        ("  rollout s", lambda s: s.timed(s.rollout_s, w), 2, True),
        ("  rest of step s", lambda s: rest(s, w), 2, True),
        ("new tokens/step", lambda s: s.timed(s.new_tokens, w), 0, False),
        ("longest rollout", lambda s: s.timed(s.longest, w), 0, False),
    ]
    for label, values, decimals, with_ratio in rows:
        medians = [median(values(s)) for s in sides]
        line = f"{label:<26}" + "".join(f"{m:>10.{decimals}f}" for m in medians)
        if both and with_ratio:
            line += f"{medians[1] / medians[0]:>11.2f}x"
        print(line)
    print("(medians; rollout: generation, scoring; rest: advantages, forward/backward, optimizer)")
    for s in sides:
        print(f"{s.name} torch threads: {sorted(set(s.threads))}")
        print(f"{s.name} per step (s, warm-up first): {', '.join(f'{t:.2f}' for t in s.step_s)}")
        print(f"{s.name} new tokens per step (warm-up first): {s.new_tokens}")
    if both:
        starpo, trl = (median(s.timed(s.step_s, w)) for s in sides)
        print(f"TRL / starpo step time: {trl / starpo:.2f}x")


def rest(side: SideResult, warmup: int) -> list[float]:
    """Step time outside the rollout: batching, advantages, forward/backward, optimizer."""
    pairs = zip(side.timed(side.step_s, warmup), side.timed(side.rollout_s, warmup), strict=True)
    return [step - rollout for step, rollout in pairs]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=3, help="timed steps per side")
    parser.add_argument("--warmup", type=int, default=1, help="untimed first steps per side")
    parser.add_argument("--group-size", type=int, default=8, help="rollouts of the one prompt")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: all)")
    parser.add_argument(
        "--stop-at-answer",
        action="store_true",
        help="let starpo stop at </answer> (its default; TRL cannot, so the work differs)",
    )
    parser.add_argument("--only", choices=("starpo", "trl"), help="run one side (debugging)")
    args = parser.parse_args()
    trl = require_trl()  # fail fast, before minutes of starpo work

    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    args.threads = torch.get_num_threads()
    sides = []
    if args.only in (None, "starpo"):
        sides.append(run_starpo(args))
    if args.only in (None, "trl"):
        sides.append(run_trl(args))
    report(sides, args, trl.__version__)


if __name__ == "__main__":
    main()
