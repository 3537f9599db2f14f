"""The text-environment base class: Gymnasium's reset/step contract with string actions.

Subclasses implement four small hooks (`_reset`, `_step`, `render`, `snapshot`) and declare
their action names; the base class owns everything every env must do the same way: seeding,
case-insensitive action matching, invalid actions that never raise and change nothing, the
episode action budget, and the `info` keys the rollout engine relies on.

Free-text envs (an expression, a number, a placement) declare no action names; they describe
their answers in `answer_format` and judge answers themselves in `parse_action` (with
`action_label` and `sample_action`): the same budget, info keys and checker apply.
"""

from __future__ import annotations

import hashlib
from abc import ABC, abstractmethod
from typing import Any, ClassVar

import numpy as np

from starpo.errors import UserError


def check_cell_sep(cell_sep: str) -> str:
    """A grid env's separator between the cells of a rendered row: "" (RAGEN's "#_P__#")
    or spaces ("# _ P _ _ #"). With spaces every cell is a token of its own; without, the
    tokenizer merges runs ("__", "####"), so a cell's column is not a token's position."""
    if not isinstance(cell_sep, str) or cell_sep.strip(" ") or len(cell_sep) > 3:
        raise UserError(f"cell_sep must be empty or up to 3 spaces (e.g. ' '), got {cell_sep!r}")
    return cell_sep


def grid_cell(value: Any) -> tuple[int, int] | None:
    """A start state's [row, column] (a list or tuple of two ints, bools refused) as a
    cell, or None when it is not one (a grid env's `_start_at` then names the problem)."""
    if (
        isinstance(value, (list, tuple))
        and len(value) == 2
        and all(isinstance(v, int) and not isinstance(v, bool) for v in value)
    ):
        return (value[0], value[1])
    return None


_KEY_ATOMS = (str, int, float, bool, type(None))

#: `TextEnv.answer()`'s label for an episode that ended without the agent's decision.
NO_ANSWER = "no_answer"


def is_stable_key(key: Any) -> bool:
    """Whether `key` is a str, number, bool, None, or a tuple of such keys: values whose
    repr() is the same in every process (a set's order, an object's address are not)."""
    if isinstance(key, tuple):
        return all(is_stable_key(part) for part in key)
    return isinstance(key, _KEY_ATOMS)


def state_digest(key: Any) -> str:
    """A short digest of a state key (see `TextEnv.state_key`) for trajectory records:
    16 hex digits of BLAKE2b over its repr(). A key of any other type is a UserError."""
    if not is_stable_key(key):
        raise UserError(
            f"state_key() returned a {type(key).__name__}; return a str, an int or a tuple "
            "of them (its repr() must be the same in every process)"
        )
    return hashlib.blake2b(repr(key).encode("utf-8"), digest_size=8).hexdigest()


class TextEnv(ABC):
    """A Gymnasium-shaped environment whose observations and actions are text.

    `reset(*, seed=None, options=None) -> (obs, info)` and
    `step(action) -> (obs, reward, terminated, truncated, info)`; `info` always carries
    `success`, `action_is_valid`, `action_is_effective`, `action` (the canonical action name,
    or None when the action was invalid) and `steps_left`; a valid action's info adds
    `action_is_optimal` (None when the env does not judge moves, see `good_actions`).
    """

    #: One line shown by `starpo envs`.
    description: ClassVar[str] = ""
    #: Action names, matched case-insensitively by `step`; empty for a free-text env.
    action_names: tuple[str, ...] = ()
    #: A free-text env's answer, described for the prompt (it completes "Answer with ..."),
    #: e.g. "an arithmetic expression such as (3+5)*2".
    answer_format: str = ""
    #: Task text for the prompt.
    instruction: str = ""
    #: Grid symbol -> meaning, shown in the prompt.
    legend: dict[str, str] = {}
    #: Bounds of one step's reward (checked by `check_env`).
    reward_range: tuple[float, float] = (-float("inf"), float("inf"))

    def __init__(self, max_steps: int) -> None:
        if not isinstance(max_steps, int) or max_steps < 1:
            from starpo.errors import UserError

            raise UserError(f"max_steps must be a positive integer, got {max_steps!r}")
        #: Episode action budget: valid actions allowed before the episode is truncated.
        self.max_steps = max_steps
        self.np_random = np.random.default_rng()
        self.num_steps = 0
        self._done = True  # step() before reset() is a programming error

    # ----------------------------------------------------------------- subclass hooks
    @abstractmethod
    def _reset(self, options: dict[str, Any]) -> dict[str, Any]:
        """Build a new initial state from `self.np_random` and `options`; return extra info."""

    @abstractmethod
    def _step(self, action: Any) -> tuple[float, bool, bool, dict[str, Any]]:
        """Apply a valid action (its index in `action_names`, or what a free-text env's
        `parse_action` returned); return (reward, terminated, effective, extra info)."""

    # ------------------------------------------------------------ free-text answer hooks
    def parse_action(self, action: Any) -> Any | None:
        """The action `action` names, in the form `_step` takes, or None when it is invalid.
        Never raises, whatever `action` is (any type). The default reads action names (or an
        index); a free-text env overrides it, with `action_label` and `sample_action`."""
        return self.action_index(action)

    def action_label(self, action: Any) -> str:
        """The canonical text of a parsed action, reported as `info["action"]`."""
        return self.action_names[action]

    def sample_action(self, rng: np.random.Generator) -> str:
        """A random well-formed answer from `rng` (the random baseline, the checker): a
        uniformly drawn action name here; a free-text env draws a valid, usually wrong one."""
        return str(rng.choice(self.action_names))

    @abstractmethod
    def render(self) -> str:
        """The current state as text (this is the observation)."""

    @abstractmethod
    def snapshot(self) -> Any:
        """A comparable copy of the full env state (used by the checker and solvers)."""

    @abstractmethod
    def is_success(self) -> bool:
        """Whether the episode so far counts as a success."""

    def state_key(self) -> Any:
        """A key of the current env state: equal keys = the same state, as far as the agent's
        next decision goes. GiGPO (algorithm.adv_estimator=gigpo) credits the turns of a
        group that start from an equal key against each other. The default is the rendered
        observation; override it when the text omits state that matters, or shows state
        that does not. Return a str, an int or a tuple of them: the rollout engine records
        a digest of its repr(), which must not change between processes."""
        return self.render()

    # ------------------------------------------------------------- optional solver hooks
    def optimal_action(self) -> str | None:
        """The action an optimal policy takes now (None when no action helps)."""
        raise NotImplementedError(f"{type(self).__name__} has no solver")

    def optimal_success_probability(self) -> float:
        """Success probability of the optimal policy from the current state and budget."""
        raise NotImplementedError(f"{type(self).__name__} has no solver")

    def good_actions(self) -> frozenset[str] | None:
        """Every action an optimal policy could take now, ties included (on dry-ice
        FrozenLake: each move a cell closer to the goal), or None when the env does not
        judge moves (the default) or no action helps any more. `step` reports whether the
        action taken was one of them (`info["action_is_optimal"]`), and summaries turn that
        into `optimal_action_rate`: whether a policy plays well move by move, long before
        its successes say so."""
        return None

    def explain(self, action: str) -> str | None:
        """One or two short sentences, in the agent's voice, saying why `action` is a good
        move from the current state (call before the action is applied); None when the env
        offers no rationale, e.g. for a move its solver would not make."""
        return None

    def answer(self) -> tuple[str, str] | None:
        """For a task that ends in one decision from a fixed set of labels (invoice's
        reason, support's outcome): (the label the agent gave, or NO_ANSWER; the label the
        rules call for). None (the default) for tasks without one. Summaries turn these
        into each label's share, success per gold label and `answer_overuse`, which the
        collapse detector reads: a policy that gives cases of every kind the same answer
        collapsed in a way its reward, entropy and repetition may not show."""
        return None

    # ------------------------------------------------------- optional start-state hooks
    # An env that implements both may start an episode part-way through its task: the
    # pass-rate curriculum (`curriculum.*`) starts episodes k moves before a solution's end.
    def start_state(self) -> Any:
        """The current position as a JSON value (lists, dicts, numbers) that
        `reset(seed=..., options={"start": value})` starts from on the same seed's task,
        shown as a fresh first observation."""
        raise NotImplementedError(f"{type(self).__name__} cannot start part-way")

    def _start_at(self, state: Any) -> None:
        """Move the freshly reset task to `state` (a `start_state()` value); a UserError
        naming the problem when `state` is not a legal position of this task."""
        raise UserError(
            f"{type(self).__name__} cannot start part-way (reset option 'start'); "
            "turn curriculum.enabled off for this env"
        )

    # ------------------------------------------------------------------- public API
    @property
    def free_text(self) -> bool:
        """Whether answers are free text judged by the env (no fixed action names)."""
        return not self.action_names

    @property
    def done(self) -> bool:
        """Whether the episode has ended (or not started): step() needs a reset() first."""
        return self._done

    @property
    def steps_left(self) -> int:
        return self.max_steps - self.num_steps

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[str, dict[str, Any]]:
        """Start an episode. A seed re-creates the env's generator, as in Gymnasium.
        `options={"start": state}` (envs with start states) plays the seed's task from
        `state`, a value `start_state()` returned, instead of its own start."""
        if seed is not None:
            self.np_random = np.random.default_rng(seed)
        self.num_steps = 0
        self._done = False
        options = dict(options or {})
        start = options.pop("start", None)
        extra = self._reset(options)
        if start is not None:  # after _reset: the seed's task is drawn exactly as without it
            self._start_at(start)
        info = {"success": self.is_success(), "steps_left": self.steps_left, **extra}
        return self.render(), info

    def step(self, action: Any) -> tuple[str, float, bool, bool, dict[str, Any]]:
        """Apply one action (a name, matched case-insensitively, or an index; for a free-text
        env, an answer its `parse_action` accepts).

        An invalid action never raises: it changes nothing, does not use the budget, and
        reports `action_is_valid=False`.
        """
        if self._done:
            raise RuntimeError("the episode is over: call reset() before step()")
        parsed = self.parse_action(action)
        if parsed is None:
            info = self._info(valid=False, effective=False, action=None)
            return self.render(), 0.0, False, False, info
        label = self.action_label(parsed)  # before _step: a label may read the state
        good = self.good_actions()  # judged on the state the action was chosen in
        reward, terminated, effective, extra = self._step(parsed)
        self.num_steps += 1
        truncated = not terminated and self.num_steps >= self.max_steps
        self._done = terminated or truncated
        info = self._info(valid=True, effective=effective, action=label)
        info["action_is_optimal"] = None if good is None else label in good
        info.update(extra)
        return self.render(), float(reward), bool(terminated), bool(truncated), info

    def action_index(self, action: Any) -> int | None:
        """Index of `action` in `action_names`, or None when it is not a valid action."""
        if isinstance(action, (int, np.integer)) and not isinstance(action, bool):
            return int(action) if 0 <= action < len(self.action_names) else None
        if not isinstance(action, str):
            return None
        wanted = action.strip().casefold()
        for i, name in enumerate(self.action_names):
            if name.casefold() == wanted:
                return i
        return None

    def close(self) -> None:  # noqa: B027 - optional hook, like Gymnasium's Env.close
        """Release resources (text envs hold none)."""

    # ------------------------------------------------------------------ prompt text
    def legend_text(self) -> str:
        """The symbol legend as one line, e.g. `# wall, _ empty, P player`."""
        return ", ".join(f"{symbol} {meaning}" for symbol, meaning in self.legend.items())

    def _info(self, *, valid: bool, effective: bool, action: str | None) -> dict[str, Any]:
        return {
            "success": self.is_success(),
            "action_is_valid": valid,
            "action_is_effective": effective,
            "action": action,
            "steps_left": self.steps_left,
        }

    def __repr__(self) -> str:
        return f"<{type(self).__name__} max_steps={self.max_steps}>"
