"""The sokoban case of bench/bench_update.py: its batch builder and breakdown helpers."""

from __future__ import annotations

import random
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))

import update_cases  # noqa: E402
from starpo.envs import make  # noqa: E402


def test_solver_moves_solve_and_random_moves_vary_the_length():
    env = make("sokoban")
    solved = update_cases.played_actions(env, 0, 10, 0.0, random.Random(0))
    assert env.is_success() and len(solved) == 5  # seed 0: the solver's 5 moves
    lengths = {
        len(update_cases.played_actions(env, 0, 10, 1.0, random.Random(seed))) for seed in range(8)
    }
    assert max(lengths) == 10 and all(n >= 1 for n in lengths)


def test_head_shares_counts_the_head_at_its_positions_and_everywhere():
    config = SimpleNamespace(hidden_size=2, vocab_size=5)  # 60 FLOPs per head row
    result = {"head_rows": 10, "tokens": 100, "flops": 1600.0}  # head 600 of 1600
    now, everywhere = update_cases.head_shares(config, result)
    assert now == pytest.approx(600 / 1600)
    assert everywhere == pytest.approx(6000 / (1000 + 6000))


@pytest.mark.slow
def test_sokoban_batch_is_the_presets_filtered_update_batch():
    from starpo.compute.batch import build_batch
    from starpo.config import load_config
    from starpo.models import load_tokenizer

    tokenizer = load_tokenizer()
    cfg = load_config(update_cases.SOKOBAN_PRESET, [])
    trajectories = update_cases.sokoban_trajectories(cfg, tokenizer)
    assert len(trajectories) == 16
    assert all(1 <= len(t.turns) <= 10 for t in trajectories)
    assert all(t.turns[0].response.endswith(" </answer>") for t in trajectories)
    assert all(len(turn.executed) == 1 for t in trajectories for turn in t.turns)
    for group in (0, 1):  # lengths vary within each group: real padding
        assert len({len(t.token_ids) for t in trajectories if t.group == group}) > 1
    batch = build_batch(trajectories, tokenizer.pad_token_id, False)
    groups = update_cases.group_prefixes(batch)
    assert [rows for rows, _ in groups] == [8, 8]
    assert all(prefix >= 100 for _, prefix in groups)  # the first message, shared


def test_repeated_text_follows_the_format_reminder_setting():
    """With rollout.format_every_turn=false the dialogues carry no reminder after turn 1:
    the breakdown counts none, and its per-turn text shrinks by what the default counts
    as reminders (the same played moves: the script does not depend on the layout)."""
    from starpo.config import load_config
    from starpo.models import load_tokenizer

    tokenizer = load_tokenizer()
    counts, lengths = {}, {}
    for every in (True, False):
        cfg = load_config(update_cases.SOKOBAN_PRESET, [f"rollout.format_every_turn={every}"])
        trajectories = update_cases.sokoban_trajectories(cfg, tokenizer, seeds=[0])
        counts[every] = update_cases.repeated_turn_tokens(cfg, tokenizer, trajectories)
        lengths[every] = sum(len(t.token_ids) for t in trajectories)
    (reminders, block), (none, shorter) = counts[True], counts[False]
    assert none == 0 and reminders > 0
    assert shorter == block - reminders
    assert lengths[False] == lengths[True] - reminders
