"""Closed-loop pass-rate control (`curriculum.*`): start states, the controller, its plan,
the engine's starts, and the trainer's use of them (validation untouched, resume exact)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from scripted_backend import ScriptedBackend
from starpo.config import load_config
from starpo.config.curriculum import CurriculumConfig
from starpo.config.episode import EpisodeSettings
from starpo.envs import make
from starpo.envs.start_states import (
    replay_states,
    solution_states,
    start_before_end,
    supports_start_states,
)
from starpo.errors import UserError
from starpo.models import load_tokenizer
from starpo.rollout.engine import RolloutEngine
from starpo.trainer.curriculum import Curriculum, GroupStart, draw_moves, next_moves
from starpo.types import Trajectory, Turn

DRY = {"is_slippery": False}


# ----------------------------------------------------------------- start states
@pytest.mark.parametrize("env_id, kwargs", [("frozenlake", DRY), ("sokoban", {})])
def test_a_start_before_the_end_leaves_exactly_that_many_solver_moves(env_id, kwargs):
    env = make(env_id, **kwargs)
    assert supports_start_states(env)
    for seed in range(10000, 10010):
        states = solution_states(env, seed)
        assert states, f"the solver solves seed {seed}"
        for moves in range(1, len(states)):
            start = start_before_end(states, moves)
            env.reset(seed=seed, options={"start": start})
            assert env.start_state() == start
            played = 0
            while not env.done:  # the solver finishes in exactly `moves` moves from there
                env.step(env.optimal_action())
                played += 1
            assert env.is_success() and played == moves
        assert start_before_end(states, len(states)) is None  # the whole task
        assert start_before_end(states, 99) is None


@pytest.mark.parametrize("env_id, kwargs", [("frozenlake", DRY), ("sokoban", {})])
def test_a_start_changes_only_the_position_not_the_seeds_task(env_id, kwargs):
    env = make(env_id, **kwargs)
    states = solution_states(env, 10003)
    own, _ = env.reset(seed=10003)
    env.reset(seed=10003, options={"start": states[0]})  # the seed's own start, given
    assert env.render() == own
    later, _ = env.reset(seed=10003, options={"start": states[-1]})
    assert later != own and env.steps_left == env.max_steps


def test_replaying_a_success_gives_its_states_and_a_failure_none():
    env = make("frozenlake", is_slippery=True)  # slips: replay must reproduce them
    seed, actions = None, None
    for candidate in range(10000, 10100):
        env.reset(seed=candidate)
        taken = []
        while not env.done and env.optimal_action() is not None:
            taken.append(env.optimal_action())
            env.step(taken[-1])
        if env.is_success():
            seed, actions = candidate, taken
            break
    assert seed is not None
    states = replay_states(env, seed, None, actions)
    assert len(states) == len(actions)
    assert replay_states(env, seed, None, actions[:-1]) == []  # stops short of the goal


@pytest.mark.parametrize(
    "env_id, kwargs, bad",
    [
        ("frozenlake", DRY, [9, 9]),
        ("frozenlake", DRY, "a1"),
        ("sokoban", {}, {"player": [0, 0], "boxes": [[2, 2]]}),  # a wall
        ("sokoban", {}, {"player": [1, 1]}),
    ],
)
def test_a_bad_start_is_a_one_line_error(env_id, kwargs, bad):
    env = make(env_id, **kwargs)
    with pytest.raises(UserError, match="start"):
        env.reset(seed=10000, options={"start": bad})


def test_an_env_without_start_states_refuses_the_option():
    env = make("bandit")
    assert not supports_start_states(env)
    with pytest.raises(UserError, match="cannot start part-way"):
        env.reset(seed=1, options={"start": 0})
    with pytest.raises(UserError, match="bandit cannot: use frozenlake or sokoban"):
        Curriculum(CurriculumConfig(enabled=True), "bandit", {}, 10)


# ------------------------------------------------------------------- controller
def test_the_controller_moves_k_by_the_pass_rate_error_within_its_bounds():
    cfg = CurriculumConfig(gain=2.0, target=0.5)
    assert next_moves(3.0, 1.0, cfg, top=10) == 4.0  # passing: harder
    assert next_moves(3.0, 0.0, cfg, top=10) == 2.0  # failing: easier
    assert next_moves(3.0, 0.5, cfg, top=10) == 3.0
    assert next_moves(1.2, 0.0, cfg, top=10) == 1.0
    assert next_moves(9.8, 1.0, cfg, top=10) == 10.0


def test_drawn_moves_average_k():
    rng = np.random.default_rng(0)
    draws = [draw_moves(2.3, rng) for _ in range(20_000)]
    assert set(draws) == {2, 3}
    assert np.mean(draws) == pytest.approx(2.3, abs=0.02)
    assert {draw_moves(4.0, rng) for _ in range(100)} == {4}


def simulate(skill: float, steps: int, cfg: CurriculumConfig, groups: int = 8, size: int = 8):
    """A scripted policy of known skill on Sokoban: each move it makes is right with
    probability `skill`, so a group k moves from the end passes with probability skill^k.
    The curriculum plans the groups; returns the pass rates and k of every step."""
    curriculum = Curriculum(cfg, "sokoban", {}, max_actions=10)
    sample = np.random.default_rng(1)
    rates, ks = [], []
    for step in range(1, steps + 1):
        seeds = list(range(10000 + step * groups, 10000 + (step + 1) * groups))
        plans = curriculum.plan(seeds, np.random.default_rng(step))
        wins = []
        for plan in plans:
            left = plan.moves or len(solution_states(curriculum.env, plan.seed))
            wins.append(np.mean(sample.random(size) < skill**left))
        ks.append(curriculum.moves)
        rates.append(float(np.mean(wins)))
        curriculum.observe(plans, [], rates[-1])
    return rates, ks


def test_the_controller_settles_at_the_target_pass_rate():
    cfg = CurriculumConfig(enabled=True, target=0.5, gain=2.0, initial_moves=1.0)
    rates, ks = simulate(skill=0.8, steps=100, cfg=cfg)
    settled = slice(40, None)
    assert np.mean(rates[settled]) == pytest.approx(0.5, abs=0.06)
    # 0.8^k = 1/2 at k = 3.1 (the mean of 0.8^k over drawn k is a little above 0.8^mean k).
    assert 2.5 < np.mean(ks[settled]) < 4.0
    assert rates[0] > 0.7  # k = 1 at the start: easy
    # A stronger policy is pushed towards the full task, a weaker one held near the end.
    strong, strong_k = simulate(skill=0.97, steps=60, cfg=cfg)
    assert np.mean(strong_k[-10:]) > 8
    weak, weak_k = simulate(skill=0.5, steps=60, cfg=cfg)
    assert np.mean(weak_k[-20:]) < 2.0


def test_full_task_groups_come_first_and_play_the_seed_as_it_is():
    cfg = CurriculumConfig(enabled=True, full_task_share=0.5, initial_moves=2.0)
    curriculum = Curriculum(cfg, "frozenlake", DRY, max_actions=10)
    plans = curriculum.plan([10000, 10001, 10002, 10003], np.random.default_rng(0))
    assert plans[:2] == [GroupStart(10000), GroupStart(10001)]
    assert all(p.moves == 2 and p.start is not None for p in plans[2:] if p.moves)
    metrics = curriculum.observe(plans, [], pass_rate=0.5)
    assert metrics["curriculum/full_task_groups"] >= 0.5


def _solved_episode(env_id: str, seed: int) -> Trajectory:
    """A successful trajectory of the solver's moves, as the engine would record it."""
    env = make(env_id, **DRY)
    env.reset(seed=seed)
    actions = []
    while not env.done:
        actions.append(env.optimal_action())
        env.step(actions[-1])
    turn = Turn(state="", response="", think="", actions=actions, executed=actions,
                format_ok=True, env_reward=1.0, reward=1.0)  # fmt: skip
    return Trajectory(env_id=env_id, seed=seed, group=0, turns=[turn], success=True)


def test_the_buffer_keeps_successes_and_replays_them_as_starts():
    cfg = CurriculumConfig(enabled=True, source="buffer", buffer_size=2, initial_moves=1.0)
    curriculum = Curriculum(cfg, "frozenlake", DRY, max_actions=10)
    seeds = [20000, 20001]
    empty = curriculum.plan(seeds, np.random.default_rng(0))
    assert empty == [GroupStart(20000), GroupStart(20001)]  # nothing kept yet: full task
    solved = [_solved_episode("frozenlake", s) for s in (10000, 10001, 10002)]
    failed = Trajectory(env_id="frozenlake", seed=10005, group=1, success=False)
    curriculum.observe(empty, [*solved, failed], pass_rate=0.5)
    assert [s.seed for s in curriculum.buffer] == [10001, 10002]  # the oldest left
    plans = curriculum.plan(seeds, np.random.default_rng(0))
    assert {p.seed for p in plans} <= {10001, 10002}
    for plan in plans:  # one move before the end of the kept success
        env = make("frozenlake", **DRY)
        env.reset(seed=plan.seed, options={"start": plan.start})
        assert plan.moves == 1 and env.optimal_action() is not None
        env.step(env.optimal_action())
        assert env.is_success()
    # The state round-trips exactly (a checkpoint holds it as plain JSON-like values).
    again = Curriculum(cfg, "frozenlake", DRY, max_actions=10)
    again.load_state_dict(curriculum.state_dict())
    assert again.state_dict() == curriculum.state_dict()
    assert again.plan(seeds, np.random.default_rng(7)) == curriculum.plan(
        seeds, np.random.default_rng(7)
    )


# ---------------------------------------------------------------------- engine
def test_the_engine_starts_each_group_where_it_is_told():
    tokenizer = load_tokenizer()
    env = make("frozenlake", **DRY)
    states = solution_states(env, 10000)
    start = start_before_end(states, 1)
    settings = EpisodeSettings(max_actions_per_turn=1, max_turns=2, max_actions_per_traj=2)

    def script(session: int, turn: int) -> str:
        return " go </think><answer>Up</answer><|im_end|>"

    engine = RolloutEngine(ScriptedBackend(tokenizer, script), tokenizer, settings)
    plain, moved = engine.run("frozenlake", [10000, 10000], 1, env_kwargs=DRY, starts=[None, start])
    assert plain.start is None and moved.start == start
    env.reset(seed=10000, options={"start": start})
    assert moved.turns[0].state == env.render()
    assert plain.turns[0].state == env.reset(seed=10000)[0]
    assert Trajectory.from_json(moved.to_json()).start == start  # logged and read back


# --------------------------------------------------------------------- trainer
def frozenlake_config(*extra: str):
    return load_config(
        None,
        [
            "env.id=frozenlake",
            "env.kwargs={is_slippery: false}",
            "rollout.num_groups=2",
            "rollout.group_size=2",
            "rollout.max_turns=2",
            "rollout.max_new_tokens=6",
            "algorithm.adv_estimator=grpo",
            "algorithm.kl_coef=0.0",
            "optim.mini_batch_size=4",
            "optim.micro_batch_size=2",
            "trainer.val_seeds=4",
            "trainer.val_every=1",
            "trainer.save_every=1",
            "trainer.tensorboard=false",
            "trainer.log_trajectories=4",
            *extra,
        ],
    )


def _train(run: Path, *extra: str, steps: int = 2, resume: bool = False):
    from starpo.models import tiny_random_model
    from starpo.trainer.loop import Trainer

    model, tokenizer = tiny_random_model(seed=0)
    cfg = frozenlake_config(f"trainer.total_steps={steps}", *extra)
    trainer = Trainer(cfg, run, quiet=True, model=model, tokenizer=tokenizer, resume=resume)
    return trainer, trainer.train()


def _validation_episodes(run: Path) -> list[str]:
    """Every validation trajectory the run logged, by step file."""
    from starpo.runs import RunFolder

    folder = RunFolder(run).val_trajectories
    return [path.read_text() for path in sorted(folder.glob("*.jsonl"))]


CURRICULUM = ("curriculum.enabled=true", "curriculum.initial_moves=5")


@pytest.mark.slow
def test_a_curriculum_run_validates_exactly_as_the_plain_run(tmp_path: Path):
    """With the weights held (lr 1e-30) both runs see the same policy: their validation
    episodes must be token for token the same, while training starts part-way."""
    frozen = ("optim.actor_lr=1e-30",)  # below every weight's last bit: nothing moves
    _, plain = _train(tmp_path / "plain", *frozen)
    near_the_end = ("curriculum.enabled=true", "curriculum.initial_moves=3")
    _, curric = _train(tmp_path / "curriculum", *frozen, *near_the_end)
    episodes = _validation_episodes(tmp_path / "plain")
    assert len(episodes) == 3 and all(episodes)  # steps 0, 1 and 2
    assert _validation_episodes(tmp_path / "curriculum") == episodes
    # ... while some training groups started part-way.
    assert any(h["curriculum/full_task_groups"] < 1.0 for h in curric[1:])
    for a, b in zip(plain, curric, strict=True):
        val = [k for k in a if k.startswith("val/") and not k.endswith("tokens_per_s")]
        assert val and all(a[k] == b[k] for k in val)
    assert [h["curriculum/moves"] for h in curric[1:]] == [3.0, 2.0]  # nothing passes: easier
    assert all("curriculum/moves" not in h for h in plain)


@pytest.mark.slow
def test_resume_restores_the_controller_exactly(tmp_path: Path):
    """3 steps straight against 1 step, stop, resume: k must carry on (not restart at 5),
    and steps 2-3 must play and log exactly what the unbroken run did."""
    from starpo.models import tiny_random_model
    from starpo.trainer.loop import Trainer

    _, straight = _train(tmp_path / "straight", *CURRICULUM, steps=3)
    cfg = frozenlake_config("trainer.total_steps=3", *CURRICULUM)
    model, tokenizer = tiny_random_model(seed=0)
    Trainer(cfg, tmp_path / "part", quiet=True, model=model, tokenizer=tokenizer).train(
        until_step=1
    )
    model, tokenizer = tiny_random_model(seed=0)
    resumed = Trainer(
        cfg, tmp_path / "part", quiet=True, model=model, tokenizer=tokenizer, resume=True
    )
    assert resumed.curriculum.moves == straight[1]["curriculum/moves"] - 1.0 == 4.0
    rest = resumed.train()
    keys = ("curriculum/moves", "curriculum/mean_start_moves", "signal/pass_rate")
    for want, got in zip(straight[2:], rest, strict=True):
        assert [want[k] for k in keys] == [got[k] for k in keys]
    assert rest[-1]["curriculum/moves"] == 3.0 and resumed.curriculum.moves == 2.0
