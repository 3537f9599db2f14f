"""The `sokoban` case of bench_update.py and its "where the time goes" breakdown.

The batch is the update batch of `cpu-sokoban-sft-starpo-s`: the 2 groups x 8 dialogues
the StarPO-S filter keeps, played by the project's rollout engine with the SFT replay
backend. Each session replays a seeded mix of the env's solver moves and random moves
(the share of random moves rises across a group's rows), so episodes end at different
turns (solved early, or after the 10-action budget) and micro-batches carry real padding.
Turns are the solver replay's no-think text, " Up </answer>" after the prompt's
"<answer>" prefix (`starpo.sft.responses`), one action a turn.
"""

from __future__ import annotations

import random
import time

import torch

from starpo.compute import forward
from starpo.compute.batch import TrainBatch
from starpo.envs import make
from starpo.rollout import RolloutEngine, prompts
from starpo.sft.replay import ReplayBackend
from starpo.sft.responses import end_of_turn_id, response_tokens, solver_turn_text
from starpo.trainer import prepare
from starpo.trainer.update_settings import UpdateSettings
from starpo.types import Trajectory

SOKOBAN_PRESET = "cpu-sokoban-sft-starpo-s"
SOKOBAN_SEEDS = (0, 6)  # 2 levels the solver solves in 5 and 6 moves (1-10 on all seeds)


def played_actions(env, seed: int, turns: int, random_share: float, rng) -> list[str]:
    """One episode's actions: the solver's move, or a random one with `random_share`
    probability (or when the solver has no plan left), until the env ends or `turns`."""
    env.reset(seed=seed)
    actions = []
    while not env.done and len(actions) < turns:
        move = env.optimal_action()
        if move is None or rng.random() < random_share:
            move = rng.choice(env.action_names)
        env.step(move)
        actions.append(move)
    return actions


def sokoban_trajectories(cfg, tokenizer, seeds=SOKOBAN_SEEDS) -> list[Trajectory]:
    """len(seeds) x group_size Sokoban dialogues, replayed through the rollout engine."""
    settings = cfg.rollout.settings()
    engine = RolloutEngine(None, tokenizer, settings)  # backend set below (needs engine)
    rng, group = random.Random(0), cfg.rollout.group_size
    scripts = []
    for seed in seeds:
        for row in range(group):
            env = make(cfg.env.id, **cfg.env.kwargs)
            share = 0.25 + 0.75 * row / max(group - 1, 1)  # mostly solver .. all random
            actions = played_actions(env, seed, settings.max_turns, share, rng)
            texts = [solver_turn_text([a], None, think=False) for a in actions]
            scripts.append([response_tokens(engine, text) for text in texts])
    backend = ReplayBackend(scripts, end_of_turn_id(engine))
    engine.backend = backend
    trajectories = engine.run(cfg.env.id, list(seeds), group, env_kwargs=cfg.env.kwargs)
    if backend.problems:
        raise RuntimeError(f"replay differs from the script: {backend.problems}")
    return trajectories


# ----------------------------------------------------------------- breakdown


def group_prefixes(batch: TrainBatch) -> list[tuple[int, int]]:
    """(rows, shared prefix tokens) of each group: what the update's micro-batches (one
    group each, see `ppo_update`) encode once."""
    out = []
    for group in torch.unique(batch.group_ids):
        part = batch.select(torch.nonzero(batch.group_ids == group)[:, 0])
        out.append((len(part), forward.cached_prefix_length(part)))
    return out


def repeated_turn_tokens(cfg, tokenizer, trajectories: list[Trajectory]) -> tuple[int, int]:
    """(format-reminder tokens, user-message tokens minus the grid) over the turns after
    the first (those are in each row's own tokens; turn 1 is in the shared prefix), the
    message rebuilt by the prompt builder with one valid action a turn ("K actions left")."""
    r = cfg.rollout
    words, think = r.max_response_words, r.think
    reminder = len(
        tokenizer.encode(prompts.format_instruction(think=think, max_response_words=words))
    )
    reminder *= r.format_every_turn  # rollout.format_every_turn=false: turn 1's only
    reminders = block = 0
    budget = r.max_actions_per_traj
    for traj in trajectories:
        for index, turn in enumerate(traj.turns[1:], start=2):
            text = prompts.next_user_message(
                index,
                turn.reward,
                turn.state,
                actions_left=budget - index + 1,
                think=think,
                max_response_words=words,
                remind=r.format_every_turn,
            )
            block += len(tokenizer.encode(text)) - len(tokenizer.encode(turn.state))
            reminders += reminder
    return reminders, block


def recompute_seconds(template: TrainBatch, models, cfg) -> float:
    """One old-log-prob recompute over the whole batch (no gradients), as `prepare` would
    run it when it cannot be left to the update's own forward."""
    start = time.perf_counter()
    with torch.no_grad():
        prepare.recomputed_logprobs(template, models, UpdateSettings.of(cfg))
    return time.perf_counter() - start


def head_shares(config, result: dict) -> tuple[float, float]:
    """LM-head share of the exact FLOPs: at the positions it runs on, and as if it ran on
    every token processed."""
    per_row = 3 * 2 * config.hidden_size * config.vocab_size  # forward + backward
    head, total = per_row * result["head_rows"], result["flops"]
    everywhere = per_row * result["tokens"]
    return head / total, everywhere / (total - head + everywhere)


def print_breakdown(cfg, tokenizer, model_config, result: dict) -> None:
    """The compact "where the time goes" table of the sokoban batch (counts and shares)."""
    batch, tokens, seconds = result["batch"], result["tokens"], result["seconds"]
    agent = int(batch.loss_mask.sum())
    padding = tokens - result["real_tokens"]
    groups = group_prefixes(batch)
    shared = sum(prefix for _, prefix in groups)
    unshared = sum((rows - 1) * prefix for rows, prefix in groups)
    reminders, block = repeated_turn_tokens(cfg, tokenizer, result["trajectories"])
    head_now, head_all = head_shares(model_config, result)
    fb = result["parts"].get("forward+backward", 0.0)
    rec = result["recompute"]
    # `fill_old_logprobs`: only rows outside the first mini-batch are recomputed up front
    extra = max(len(batch) - cfg.optim.mini_batch_size, 0)
    prefixes = ", ".join(f"{p} ({rows} rows)" for rows, p in groups)
    lines = [
        ("tokens processed / agent tokens", f"{tokens} / {agent} ({agent / tokens:.1%} agent)"),
        ("padding processed (trimmed micro-batches)", f"{padding} ({padding / tokens:.1%})"),
        ("shared first message per group", f"{prefixes}: {shared} tokens encoded"),
        ("  if not shared", f"+{unshared} tokens (+{unshared / tokens:.0%} of processed)"),
        ("per-turn text minus grid (turns 2+)", f"{block} ({block / tokens:.1%})"),
        ("  of it the format reminder", f"{reminders} ({reminders / tokens:.1%})"),
        ("old-log-prob recompute fwd (all rows)", f"{rec:.3f} s = {rec / fb:.0%} of fwd+bwd"),
        (
            "  rows --recompute runs it on, up front",
            f"{extra} of {len(batch)} (others: in the update)",
        ),
        ("update forward+backward", f"{fb:.3f} s ({fb / seconds:.0%} of the update)"),
        ("LM-head FLOPs share", f"{head_now:.1%} (all positions: {head_all:.1%})"),
    ]
    print("  where the time goes:")
    for label, value in lines:
        print(f"    {label:<42} {value}")
