"""`check_env`: does an env keep the TextEnv contract? Run over every registered env in tests.

Each check is a small function that raises `EnvCheckError` with a message naming the broken
rule; `check_env` runs them all and returns the names of the checks that passed.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import numpy as np

from starpo.envs.base import TextEnv, is_stable_key

STEP_INFO_KEYS = ("success", "action_is_valid", "action_is_effective", "action", "steps_left")

# Inputs that are never an action name: each must be rejected without raising.
INVALID_ACTIONS: tuple[Any, ...] = (
    "",
    "   ",
    "definitely-not-an-action",
    "<answer>x</answer>",
    "\x00\x1b[31m",
    "é" * 3 + "\u202e",
    "a" * 10_000,
    None,
    3.5,
    -1,
    10**9,
    True,
    b"Up",
    ["Up"],
)
# A free-text env judges any text itself (a wrong answer may be a valid action that uses an
# attempt), so only what can never be an answer must be rejected: blanks and non-strings.
FREE_TEXT_INVALID_ACTIONS: tuple[Any, ...] = tuple(
    a for a in INVALID_ACTIONS if not isinstance(a, str) or not a.strip()
)


class EnvCheckError(AssertionError):
    """The env breaks a rule of the TextEnv contract."""


def _require(condition: bool, message: str) -> None:
    if not condition:
        raise EnvCheckError(message)


def _rng_state(env: TextEnv) -> Any:
    return env.np_random.bit_generator.state


def _overrides(env: TextEnv, hook: str) -> bool:
    return getattr(type(env), hook) is not getattr(TextEnv, hook)


def _check_free_text_hooks(env: TextEnv) -> None:
    _require(
        isinstance(env.answer_format, str) and env.answer_format.strip() != "",
        "an env without action_names is free-text: describe its answers in answer_format",
    )
    missing = [
        h for h in ("parse_action", "action_label", "sample_action") if not _overrides(env, h)
    ]
    _require(not missing, f"a free-text env must implement {', '.join(missing)}")


def check_attributes(env: TextEnv, seeds: list[int]) -> None:
    """Action names (or a free-text env's answer hooks), instruction, legend and reward
    range are well formed."""
    names = env.action_names
    _require(isinstance(names, tuple), "action_names must be a tuple (empty for free text)")
    if not names:
        _check_free_text_hooks(env)
    _require(
        all(isinstance(n, str) and n.strip() == n and n for n in names),
        "action names must be non-empty strings without surrounding spaces",
    )
    folded = [n.casefold() for n in names]
    _require(len(set(folded)) == len(folded), "action names must differ case-insensitively")
    _require(
        isinstance(env.instruction, str) and env.instruction.strip() != "",
        "instruction must be a non-empty string",
    )
    _require(isinstance(env.legend, dict), "legend must be a dict of symbol -> meaning")
    low, high = env.reward_range
    _require(low <= high, f"reward_range {env.reward_range} is not ordered")


def check_reset(env: TextEnv, seeds: list[int]) -> None:
    """reset returns (str, dict) and equal seeds give identical initial states."""
    for seed in seeds:
        result = env.reset(seed=seed)
        _require(isinstance(result, tuple) and len(result) == 2, "reset must return (obs, info)")
        obs, info = result
        _require(isinstance(obs, str), f"observation must be str, got {type(obs).__name__}")
        _require(isinstance(info, dict), "reset info must be a dict")
        _require(obs == env.render(), "the observation must equal render()")
        first = env.snapshot()
        obs_again, _ = env.reset(seed=seed)
        _require(
            obs_again == obs and env.snapshot() == first,
            f"reset(seed={seed}) twice gave different initial states",
        )


def check_step_shapes(env: TextEnv, seeds: list[int]) -> None:
    """step returns (str, float, bool, bool, dict) with the required info keys."""
    env.reset(seed=seeds[0])
    action = env.sample_action(np.random.default_rng(0))
    _require(isinstance(action, str), "sample_action must return a str")
    result = env.step(action)
    _require(
        isinstance(result, tuple) and len(result) == 5,
        "step must return (obs, reward, terminated, truncated, info)",
    )
    obs, reward, terminated, truncated, info = result
    _require(isinstance(obs, str), "step observation must be str")
    _require(isinstance(reward, float), f"reward must be float, got {type(reward).__name__}")
    _require(
        isinstance(terminated, bool) and isinstance(truncated, bool),
        "terminated and truncated must be bool",
    )
    _require(isinstance(info, dict), "step info must be a dict")
    missing = [k for k in STEP_INFO_KEYS if k not in info]
    _require(not missing, f"step info lacks keys {missing}")
    _require(
        info["action_is_valid"] is True,
        f"a sampled action ({action!r:.40}) must be valid: a listed name or a well-formed answer",
    )


def check_case_insensitive(env: TextEnv, seeds: list[int]) -> None:
    """Action names are matched case-insensitively and with surrounding spaces; a free-text
    answer is read the same with surrounding spaces."""
    if env.free_text:
        answer = env.sample_action(np.random.default_rng(1))
        labels = []
        for text in (answer, f"  {answer} \n"):
            env.reset(seed=seeds[0])
            *_, info = env.step(text)
            labels.append(info["action"])
        _require(
            labels[0] is not None and labels[0] == labels[1],
            f"{answer!r:.40} with surrounding spaces should read as {labels[0]!r:.40}",
        )
        return
    for variant in (str.upper, str.lower, lambda s: f"  {s.swapcase()} "):
        env.reset(seed=seeds[0])
        *_, info = env.step(variant(env.action_names[0]))
        _require(
            info["action_is_valid"] and info["action"] == env.action_names[0],
            f"{variant(env.action_names[0])!r} should match {env.action_names[0]!r}",
        )


def check_invalid_actions(env: TextEnv, seeds: list[int]) -> None:
    """Invalid actions never raise, change nothing and report action_is_valid=False."""
    env.reset(seed=seeds[0])
    for action in FREE_TEXT_INVALID_ACTIONS if env.free_text else INVALID_ACTIONS:
        before = (env.render(), env.snapshot(), env.steps_left, repr(_rng_state(env)))
        try:
            obs, reward, terminated, truncated, info = env.step(action)
        except Exception as exc:  # noqa: BLE001 - the rule is "never raises"
            raise EnvCheckError(f"step({action!r:.40}) raised {exc!r}") from exc
        after = (obs, env.snapshot(), env.steps_left, repr(_rng_state(env)))
        _require(after == before, f"invalid action {action!r:.40} changed the state")
        _require(
            reward == 0.0 and not terminated and not truncated,
            f"invalid action {action!r:.40} must give reward 0 and not end the episode",
        )
        _require(
            info["action_is_valid"] is False and info["action_is_effective"] is False,
            f"invalid action {action!r:.40} must report action_is_valid=False",
        )


def _play(env: TextEnv, seed: int, actions: list[str]) -> list[tuple[Any, ...]]:
    """Reset with `seed` and play `actions` until the episode ends; record every transition."""
    obs, _ = env.reset(seed=seed)
    record: list[tuple[Any, ...]] = [(obs, env.snapshot())]
    for action in actions:
        obs, reward, terminated, truncated, info = env.step(action)
        record.append((obs, reward, terminated, truncated, sorted(info.items(), key=str)))
        if terminated or truncated:
            break
    return record


def check_determinism(env: TextEnv, seeds: list[int]) -> None:
    """The same seed and actions give the same observations, rewards and infos."""
    chooser = np.random.default_rng(12345)
    for seed in seeds:
        actions = [env.sample_action(chooser) for _ in range(env.max_steps + 5)]
        _require(
            _play(env, seed, actions) == _play(env, seed, actions),
            f"seed {seed}: replaying the same actions gave different transitions",
        )


def check_random_agent(env: TextEnv, seeds: list[int], episodes_per_seed: int = 3) -> None:
    """Random play ends within the budget, rewards stay in range, infos are well typed."""
    chooser = np.random.default_rng(54321)
    low, high = env.reward_range
    for seed in seeds:
        for episode in range(episodes_per_seed):
            env.reset(seed=seed * 1000 + episode)
            for step in range(env.max_steps):
                action = env.sample_action(chooser)
                _, reward, terminated, truncated, info = env.step(action)
                _require(
                    low <= reward <= high,
                    f"reward {reward} outside reward_range {env.reward_range}",
                )
                _require(isinstance(info["success"], bool), "info['success'] must be bool")
                _require(
                    info["steps_left"] == env.max_steps - step - 1,
                    "steps_left must count down by one per valid action",
                )
                if terminated or truncated:
                    break
            _require(terminated or truncated, "the episode must end within max_steps actions")


def check_state_keys(env: TextEnv, seeds: list[int]) -> None:
    """state_key() is a str/int/tuple key, equal for equal states: the same seed, or after
    an invalid action (which changes nothing)."""
    for seed in seeds:
        env.reset(seed=seed)
        key = env.state_key()
        _require(
            is_stable_key(key),
            f"state_key() must return a str, an int or a tuple of them, got {type(key).__name__}",
        )
        env.reset(seed=seed)
        _require(env.state_key() == key, f"reset(seed={seed}) twice gave different state keys")
        env.step(FREE_TEXT_INVALID_ACTIONS[0] if env.free_text else INVALID_ACTIONS[2])
        _require(env.state_key() == key, "an invalid action changed state_key()")


def check_good_actions(env: TextEnv, seeds: list[int]) -> None:
    """Where an env judges moves (`good_actions`), the judged set names valid actions and
    holds the solver's own move, and `step` reports that move as optimal. The solver plays
    each seed (an env that judges without a solver of its own, e.g. a served one, plays the
    first good move); an env without `good_actions` passes as it is."""
    if not _overrides(env, "good_actions"):
        return
    has_solver = _overrides(env, "optimal_action")
    for seed in seeds:
        env.reset(seed=seed)
        for _ in range(env.max_steps):
            good = env.good_actions()
            if good is None:
                break
            _require(
                isinstance(good, frozenset) and all(env.action_index(a) is not None for a in good),
                f"good_actions() must be a frozenset of action names, got {good!r}",
            )
            action = env.optimal_action() if has_solver else min(good, default=None)
            if action is None:
                break
            _require(action in good, f"optimal_action() {action!r} is not in good_actions()")
            *_, terminated, truncated, info = env.step(action)
            _require(
                info.get("action_is_optimal") is True,
                "step() must report the solver's move as action_is_optimal=True",
            )
            if terminated or truncated:
                break


def check_start_states(env: TextEnv, seeds: list[int]) -> None:
    """Where an env can start part-way (`start_state` and the reset option "start"), every
    position random play reaches is a JSON value that starts the same seed's task exactly
    there: the same observation and state, the whole budget left. Other envs pass."""
    from starpo.envs.start_states import supports_start_states

    if not supports_start_states(env):
        return
    chooser = np.random.default_rng(2468)
    for seed in seeds:
        walked: list[str] = []
        for _ in range(4):  # the seed's start, then after each of 3 random actions
            env.reset(seed=seed)
            for action in walked:
                env.step(action)
            if env.done:
                break
            state, seen, snapshot = env.start_state(), env.render(), env.snapshot()
            _require(
                json.loads(json.dumps(state)) == state,
                f"start_state() must be a JSON value (lists, dicts, numbers), got {state!r}",
            )
            obs, _ = env.reset(seed=seed, options={"start": state})
            _require(
                obs == seen and env.snapshot() == snapshot,
                f"seed {seed}: reset(options={{'start': {state!r}}}) did not start there",
            )
            _require(env.steps_left == env.max_steps, "a start part-way keeps the whole budget")
            walked.append(env.sample_action(chooser))


CHECKS: dict[str, Callable[[TextEnv, list[int]], None]] = {
    "attributes": check_attributes,
    "reset": check_reset,
    "step shapes": check_step_shapes,
    "case-insensitive actions": check_case_insensitive,
    "invalid actions": check_invalid_actions,
    "determinism": check_determinism,
    "random agent": check_random_agent,
    "state keys": check_state_keys,
    "judged moves": check_good_actions,
    "start states": check_start_states,
}


def check_env(env: TextEnv, seeds: list[int] | None = None) -> list[str]:
    """Run every check on `env`; raise EnvCheckError on the first broken rule.

    Returns the names of the checks, all passed.
    """
    _require(isinstance(env, TextEnv), f"{type(env).__name__} does not subclass TextEnv")
    seeds = list(seeds) if seeds is not None else [0, 1, 2, 10000]
    for name, check in CHECKS.items():
        try:
            check(env, seeds)
        except EnvCheckError:
            raise
        except Exception as exc:  # noqa: BLE001 - report which check the env crashed in
            raise EnvCheckError(f"check {name!r}: the env raised {exc!r}") from exc
    return list(CHECKS)
