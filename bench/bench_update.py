"""Speed of the trainer's update (`ppo_update`) against the CPU's matmul peak.

    python bench/bench_update.py [--repeats 3] [--dtype fp32|bf16|both] [--recompute]
                                 [--cases demo,trl,sokoban,ppo] [--profile]
                                 [--set KEY=VALUE ...] [--compare KEY=VALUE ...]
                                 [--compare-critic]

`--set` overrides every case's config (e.g. rollout.format_every_turn=false);
`--compare` runs each case a second time with these overrides added, side by side in the
same run, and prints the ratio of the two update times. `--compare-critic` runs each case
again with the critic as it ran before 2026-12-05 (every padded row through its backbone
whole, values at every token) and prints the same ratio (cases with a critic: ppo).

Three cases on the real default model (SmolLM2-135M-Instruct), built from trajectories with
the project's own helpers (the rollout engine with a scripted backend, `build_batch`):

- demo: the `cpu-bandit-starpo-s` update: GRPO on the groups its filter keeps (2 groups x
  8 bandit trajectories since 2026-12-04; 4 x 8 before: the real bandit prompt, 6 to 12
  response tokens), as the preset's mini- and micro-batches;
- trl:  1 group of 8 with a ~110-token prompt and 64 response tokens each (the size of
  the TRL comparison), one mini-batch, one micro-batch;
- sokoban: the `cpu-sokoban-sft-starpo-s` update: GRPO, the 2 groups x 8 dialogues the
  StarPO-S filter keeps, one mini-batch of 16, micro-batches of 8 (one group each), up to
  10 turns of one action, no think block, replayed solver and random moves (see
  bench/update_cases.py); it also prints a "where the time goes" table;
- ppo: the vanilla PPO arm of `experiments/echo_trap.py` on the bandit: all 8 groups x 8
  trajectories, a critic (GAE), KL 0.001 to a reference, one mini-batch of 64, the
  preset's micro-batches of 16 (2 groups each).

FLOPs are counted exactly from the shapes the update computes (not 6 x parameters x
tokens) by the trainer's own rule, `starpo.compute.flops` (the figure `starpo train` logs
as perf/update_peak_share and `starpo sft` prints): the matmuls of the linear layers for
every token processed, attention over the (query, key) pairs a causal model needs, and
the LM head at the rows it runs on, x3 for forward and backward (a backward pass does two
matmuls of its forward's size per matmul). Tokens processed are those the forward passes
run: the shared prompt once per micro-batch, then each row's own tokens (padding included
where it is computed). 6 x N x tokens is printed beside it. The peak is the best square
matmul (`flops.measure_matmul_peak`: 2048^3 where the dtype is fast) at the start and at
the end of the run, the higher of the two, in the dtype the
update computes in (fp32, and bf16 when it runs): each fraction divides by its own dtype's
peak. The dtype defaults to the project's rule (`compute_dtype("auto", "cpu")`: bf16 only
on a CPU with native bf16). Trained tokens/s counts the tokens processed by the forward
passes (padding included), agent tokens/s the loss-masked ones.
"""

from __future__ import annotations

import argparse
import contextlib
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch

from starpo.compute import flops
from starpo.compute.batch import TrainBatch, build_batch
from starpo.config import load_config
from starpo.models import load_model
from starpo.models.precision import (
    Precision,
    compute_dtype,
    cpu_has_native_bf16,
)
from starpo.rollout import RolloutEngine
from starpo.rollout.backends.base import Generation
from starpo.rollout.chat import ChatTokens
from starpo.rollout.prompts import SYSTEM_PROMPT
from starpo.trainer import prepare, update
from starpo.trainer.optim import build_optimizers
from starpo.trainer.train_models import ValueModel, build_models
from starpo.trainer.update_settings import UpdateSettings
from starpo.types import Trajectory, Turn
from update_cases import (
    SOKOBAN_PRESET,
    print_breakdown,
    recompute_seconds,
    sokoban_trajectories,
)

PRESET = "cpu-bandit-starpo-s"
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
# The demo's answers, 6 to 12 tokens: both arms, some with extra words or broken format.
DEMO_REPLIES = (
    "<answer> Dragon </answer>",
    "<answer> Phoenix </answer>",
    " Dragon </answer>",
    "<answer> I pick Dragon </answer>",
    "<answer> Phoenix, the safe one </answer>",
    "<answer> Dragon || Phoenix </answer>",
    "Phoenix </answer>",
    "<answer> The Dragon arm </answer>",
)
LONG_TEXT = (
    "I weigh the two arms. Phoenix sounds like a steady, modest payout every time, while "
    "Dragon suggests a risky arm that pays a lot but rarely. The expected value decides: "
    "a large reward with a small chance can still beat a small sure reward on average, so "
    "I should compare probabilities and payouts before I choose which arm to pull now."
)


# --------------------------------------------------------------------- batches


class ScriptedBackend:
    """Replies with DEMO_REPLIES in turn (a real backend's interface, no model)."""

    def __init__(self, tokenizer) -> None:
        self.tokenizer, self.calls = tokenizer, 0

    def generate(self, requests, params):
        out = []
        for _ in requests:
            text = DEMO_REPLIES[self.calls % len(DEMO_REPLIES)]
            self.calls += 1
            ids = self.tokenizer.encode(text, add_special_tokens=False)[: params.max_new_tokens]
            out.append(Generation(ids, [-0.5] * len(ids), "stop", []))
        return out

    def release(self, sessions) -> None:
        list(sessions)

    def reset(self) -> None:
        pass


def demo_trajectories(cfg, tokenizer, groups: int) -> list[Trajectory]:
    """`groups` x group_size bandit episodes with the real prompt and scripted answers."""
    engine = RolloutEngine(ScriptedBackend(tokenizer), tokenizer, cfg.rollout.settings())
    seeds = list(range(10_000, 10_000 + groups))
    return engine.run(cfg.env.id, seeds, cfg.rollout.group_size)


def long_trajectories(tokenizer, rows: int, prompt_tokens: int, response_tokens: int):
    """One group of `rows` trajectories: a chat prompt of about `prompt_tokens`, then
    `response_tokens` agent tokens each (all the same length: no padding)."""
    chat = ChatTokens(tokenizer, "")
    words = (LONG_TEXT + " " + LONG_TEXT).split()
    prompt = chat.first_prompt(SYSTEM_PROMPT, " ".join(words))
    while len(prompt) > prompt_tokens and words:  # trim the user message to size
        words = words[:-1]
        prompt = chat.first_prompt(SYSTEM_PROMPT, " ".join(words))
    text_ids = tokenizer.encode(LONG_TEXT * 4, add_special_tokens=False)
    out = []
    for row in range(rows):
        response = text_ids[row : row + response_tokens]  # each row its own tokens
        reward = float(row % 3 == 0)
        turn = Turn("", "", "", [], [], True, reward, reward, response_tokens=len(response))
        out.append(
            Trajectory(
                env_id="bandit",
                seed=0,
                group=0,
                turns=[turn],
                token_ids=prompt + response,
                loss_mask=[0] * len(prompt) + [1] * len(response),
                logprobs=[0.0] * len(prompt) + [-1.0] * len(response),
                turn_ends=[len(prompt) + len(response) - 1],
            )
        )
    return out


@dataclass
class Case:
    name: str
    overrides: dict[str, str]
    trajectories: Callable[..., list[Trajectory]]
    preset: str = PRESET


CASES = {
    "demo": Case(
        "demo", {}, lambda cfg, tok: demo_trajectories(cfg, tok, cfg.groups_kept_per_step)
    ),
    "trl": Case(
        "trl",
        {"optim.mini_batch_size": "8", "optim.micro_batch_size": "8"},
        lambda cfg, tok: long_trajectories(tok, rows=8, prompt_tokens=110, response_tokens=64),
    ),
    "sokoban": Case("sokoban", {}, sokoban_trajectories, SOKOBAN_PRESET),
    "ppo": Case(
        "ppo",
        {
            "filter.enabled": "false",
            "algorithm.adv_estimator": "gae",
            "algorithm.kl_coef": "0.001",
            "algorithm.clip_high": "0.2",
            "optim.mini_batch_size": "64",
        },
        lambda cfg, tok: demo_trajectories(cfg, tok, cfg.groups_kept_per_step),
    ),
}


def whole_row_values(critic: ValueModel, batch: TrainBatch) -> torch.Tensor:
    """The critic's forward before 2026-12-05, for `--compare-critic`: every padded row
    through the backbone whole, the head at every token, shifted one to the right."""
    out = critic.backbone(
        input_ids=batch.input_ids, attention_mask=batch.attention_mask, use_cache=False
    )
    with torch.autocast(out.last_hidden_state.device.type, enabled=False):
        values = critic.value_head(out.last_hidden_state.float()).squeeze(-1)
    return torch.cat([values[:, :1] * 0, values[:, :-1]], dim=1)


@contextlib.contextmanager
def critic_forward(whole_rows: bool):
    """`ValueModel.forward` as it is, or (`whole_rows`) as `whole_row_values` ran it."""
    if not whole_rows:
        yield
        return
    original = ValueModel.forward
    ValueModel.forward = whole_row_values
    try:
        yield
    finally:
        ValueModel.forward = original


# --------------------------------------------------------------------- FLOPs


@dataclass
class FlopCounter:
    """Adds up `flops.training_pass` over the training forward passes (`policy_logprobs`)
    that run with gradients (the old-log-prob recompute is not counted: its time is)."""

    total: flops.PassSize = field(default_factory=flops.PassSize)

    def record(self, model, batch: TrainBatch) -> None:
        if torch.is_grad_enabled():  # only passes with gradients count
            self.total = self.total + flops.training_pass(model, batch)

    def reset(self) -> None:
        self.total = flops.PassSize()


def counting(counter: FlopCounter, policy_logprobs: Callable) -> Callable:
    """`policy_logprobs` that first counts the forward it runs (positions as it picks)."""

    def wrapped(model, batch, *args, **kwargs):
        counter.record(model, batch)
        return policy_logprobs(model, batch, *args, **kwargs)

    return wrapped


# --------------------------------------------------------------------- timing


class Stopwatch:
    """Wraps functions so that the seconds spent in them add up under a name."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}

    def wrap(self, name: str, fn: Callable) -> Callable:
        def timed(*args, **kwargs):
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - start

        return timed


def fresh_batch(batch: TrainBatch) -> TrainBatch:
    """A copy with the rollout's fields only (prepare fills the rest in place)."""
    return TrainBatch(
        batch.input_ids,
        batch.attention_mask,
        batch.loss_mask,
        batch.rollout_logprobs.clone(),
        batch.token_rewards.clone(),
        batch.turn_rewards,
        batch.turn_ends,
        batch.scores,
        batch.group_ids,
    )


def build_case(case: Case, model, tokenizer, dtype: str, extra: Sequence[str] = ()):
    """(config, models, optimizers, batch template, trajectories) as the trainer builds
    them; `extra`: more KEY=VALUE overrides (`--set`, `--compare`)."""
    overrides = {"model.dtype": dtype, **case.overrides}
    cfg = load_config(case.preset, [*(f"{k}={v}" for k, v in overrides.items()), *extra])
    models = build_models(cfg, model, tokenizer, Precision(DTYPES[dtype], "cpu"))
    optimizers = build_optimizers(cfg, models.actor, models.critic)
    trajectories = case.trajectories(cfg, tokenizer)
    template = build_batch(trajectories, tokenizer.pad_token_id, False)
    return cfg, models, optimizers, template, trajectories


def run_case(case: Case, model, tokenizer, dtype: str, args, extra: Sequence[str] = ()) -> dict:
    """Median seconds of `ppo_update` (after a warm-up), with its breakdown and FLOPs."""
    built = build_case(case, model, tokenizer, dtype, extra)
    cfg, models, optimizers, template, trajectories = built
    counter, watch = FlopCounter(), Stopwatch()
    originals = (update.policy_logprobs, update.accumulate_gradients, optimizers.step)
    update.policy_logprobs = prepare.policy_logprobs = counting(counter, originals[0])
    update.accumulate_gradients = watch.wrap("forward+backward", originals[1])
    optimizers.step = watch.wrap("optimizer step", originals[2])
    runs = []
    try:
        for repeat in range(args.repeats + 1):  # the first is a warm-up
            batch = fresh_batch(template)
            start = time.perf_counter()
            prepare.prepare(
                batch, models, UpdateSettings.of(cfg), recompute_old_logprobs=args.recompute
            )
            prepared = time.perf_counter()
            counter.reset()
            watch.seconds.clear()
            update.ppo_update(
                batch, models, optimizers, UpdateSettings.of(cfg), torch.Generator().manual_seed(0)
            )
            done = time.perf_counter()
            if repeat:
                runs.append((done - prepared, prepared - start, dict(watch.seconds)))
    finally:
        update.policy_logprobs, update.accumulate_gradients = originals[:2]
        prepare.policy_logprobs = originals[0]
        del optimizers.step  # the instance attribute: the class's method again
    seconds, prepare_s, parts = sorted(runs, key=lambda r: r[0])[len(runs) // 2]
    params = sum(p.numel() for p in model.parameters())
    return {
        "cfg": cfg,
        "batch": template,
        "trajectories": trajectories,
        "recompute": recompute_seconds(template, models, cfg),
        "seconds": seconds,
        "prepare": prepare_s,
        "parts": parts,
        "flops": counter.total.flops,
        "tokens": counter.total.tokens,
        "real_tokens": counter.total.real_tokens,
        "head_rows": counter.total.head_rows,
        "six_nd": 6 * params * counter.total.tokens,
        "all_seconds": sorted(r[0] for r in runs),
    }


def report(name: str, dtype: str, result: dict, peak: float, recompute: bool) -> None:
    """The case's numbers; `peak`: the matmul peak in the dtype the update ran in."""
    batch, seconds = result["batch"], result["seconds"]
    rows, width = batch.input_ids.shape
    agent = int(batch.loss_mask.sum())
    achieved = result["flops"] / seconds / 1e9
    fb = result["parts"].get("forward+backward", 0.0)
    step = result["parts"].get("optimizer step", 0.0)
    other = seconds - fb - step
    old = "recomputed" if recompute else "the rollout's"
    print(f"\n[{name}, {dtype}] {rows} trajectories, widest {width} tokens, {agent} agent tokens")
    print(
        f"  update {seconds:.3f} s (median of {len(result['all_seconds'])}: "
        + ", ".join(f"{s:.3f}" for s in result["all_seconds"])
        + f"); prepare {result['prepare']:.3f} s (old log-probs: {old})"
    )
    print(
        f"  tokens processed {result['tokens']} ({result['real_tokens']} without padding), "
        f"LM head rows {result['head_rows']}; trained {result['tokens'] / seconds:.0f} "
        f"tokens/s, agent {agent / seconds:.0f} tokens/s"
    )
    print(
        f"  FLOPs (exact) {result['flops'] / 1e9:.1f} G -> {achieved:.1f} GFLOP/s = "
        f"{achieved / peak:.1%} of the {dtype} peak ({peak:.1f});  6ND "
        f"{result['six_nd'] / 1e9:.1f} G -> {result['six_nd'] / seconds / 1e9 / peak:.1%}"
    )
    print(
        f"  breakdown: forward+backward {fb:.3f} s ({fb / seconds:.0%}), optimizer step "
        f"{step:.3f} s ({step / seconds:.0%}), other {other:.3f} s ({other / seconds:.0%})"
    )


def profile_case(case: Case, model, tokenizer, dtype: str, args) -> None:
    """torch.profiler's top operators (self CPU time) over one update after a warm-up."""
    from torch.profiler import ProfilerActivity, profile

    cfg, models, optimizers, template, _ = build_case(case, model, tokenizer, dtype, args.set)
    for warm in (True, False):
        batch = fresh_batch(template)
        prepare.prepare(
            batch, models, UpdateSettings.of(cfg), recompute_old_logprobs=args.recompute
        )
        generator = torch.Generator().manual_seed(0)
        if warm:
            update.ppo_update(batch, models, optimizers, UpdateSettings.of(cfg), generator)
            continue
        with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
            update.ppo_update(batch, models, optimizers, UpdateSettings.of(cfg), generator)
    print(f"\n[{case.name}, {dtype}] profile of one update (self CPU time, by input shapes)")
    table = prof.key_averages(group_by_input_shape=True).table(
        sort_by="self_cpu_time_total",
        row_limit=args.profile_rows,
        max_name_column_width=40,
        max_shapes_column_width=60,
    )
    print(table)


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    auto = "bf16" if compute_dtype("auto", "cpu") == torch.bfloat16 else "fp32"
    parser.add_argument("--repeats", type=int, default=3, help="timed updates (median)")
    parser.add_argument(
        "--dtype",
        choices=("fp32", "bf16", "both"),
        default=auto,
        help=f"the update's compute dtype (default: the 'auto' rule here, {auto})",
    )
    parser.add_argument("--cases", default="demo,trl", help="comma-separated: " + ", ".join(CASES))
    parser.add_argument("--threads", type=int, default=2, help="torch threads (0: default)")
    parser.add_argument(
        "--recompute", action="store_true", help="recompute old log-probs (bf16's default)"
    )
    parser.add_argument("--profile", action="store_true", help="print torch.profiler's table")
    parser.add_argument(
        "--set", nargs="*", default=[], metavar="KEY=VALUE", help="config overrides, every case"
    )
    parser.add_argument(
        "--compare",
        nargs="*",
        default=[],
        metavar="KEY=VALUE",
        help="run each case again with these overrides too, side by side",
    )
    parser.add_argument(
        "--compare-critic",
        action="store_true",
        help="run each case again with the critic's old forward (each row whole), side by side",
    )
    parser.add_argument("--profile-rows", type=int, default=25)
    return parser.parse_args()


def peaks(dtypes: tuple[str, ...]) -> dict[str, float]:
    """Matmul peak (GFLOP/s) of each dtype, measured now."""
    return {dtype: flops.measure_matmul_peak(DTYPES[dtype]) for dtype in dtypes}


def main() -> None:
    args = parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    print(
        f"CPU capability {torch.backends.cpu.get_cpu_capability()}, native bf16: "
        f"{cpu_has_native_bf16()}; {torch.get_num_threads()} threads"
    )
    model, tokenizer = load_model("smollm2-135m-instruct", dtype="fp32")
    dtypes = ("fp32", "bf16") if args.dtype == "both" else (args.dtype,)
    names = [n.strip() for n in args.cases.split(",") if n.strip()]
    start_peaks = {} if args.profile else peaks(dtypes)
    results = []
    for dtype in dtypes:
        for name in names:
            if args.profile:
                profile_case(CASES[name], model, tokenizer, dtype, args)
                continue
            variants = [("", args.set, False)]
            if args.compare:
                variants.append((" + " + " ".join(args.compare), [*args.set, *args.compare], False))
            if args.compare_critic:
                variants.append((" + whole-row critic", args.set, True))
            for label, extra, whole_rows in variants:
                with critic_forward(whole_rows):
                    result = run_case(CASES[name], model, tokenizer, dtype, args, extra)
                results.append((name + label, dtype, result))
    if not results:
        return
    end_peaks = peaks(dtypes)
    best = {d: max(start_peaks[d], end_peaks[d]) for d in dtypes}  # a noisy start must not flatter
    for dtype in dtypes:
        print(
            f"smollm2-135m-instruct; {dtype} matmul peak (best square matmul of 5) "
            f"{start_peaks[dtype]:.1f} GFLOP/s at the start, {end_peaks[dtype]:.1f} at the "
            f"end: {dtype} fractions below use {best[dtype]:.1f}"
        )
    if args.set:
        print("every case with " + " ".join(args.set))
    for name, dtype, result in results:
        report(name, dtype, result, best[dtype], args.recompute)
        if name.startswith("sokoban"):
            print_breakdown(result["cfg"], tokenizer, model.config, result)
    by_name = {(name, dtype): result for name, dtype, result in results}
    for name, dtype, result in results:
        if " + " in name:  # the --compare variant: against the same case without it
            base = by_name[(name.split(" + ")[0], dtype)]
            if name.endswith(" + whole-row critic"):  # the old way: the ratio the other way
                new = base["seconds"] + base["prepare"]
                old = result["seconds"] + result["prepare"]
                print(
                    f"\n[{name.split(' + ')[0]}, {dtype}] update + prepare with the critic as the "
                    f"actor runs: {new:.3f} s against {old:.3f} s with each row whole: "
                    f"{old / new:.2f}x faster"
                )
                continue
            print(
                f"\n[{name}, {dtype}] update {result['seconds']:.3f} s against "
                f"{base['seconds']:.3f} s: {base['seconds'] / result['seconds']:.2f}x faster; "
                f"tokens processed {result['tokens']} against {base['tokens']}"
            )


if __name__ == "__main__":
    main()
