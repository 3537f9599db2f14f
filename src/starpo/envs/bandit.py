"""Two-armed bandit with symbolic arm names (RAGEN's Bandit / BanditRev).

One turn, one action. The low-risk arm pays a fixed reward; the high-risk arm pays
`high_risk_reward` with probability `high_risk_prob`, else 0. With the defaults the risky arm
has the higher expected value (0.25 vs 0.1), so success means picking it: the agent has to
reason from the names alone, since it gets a single pull.
"""

from __future__ import annotations

from typing import Any, ClassVar

from starpo.envs.base import TextEnv
from starpo.errors import UserError


class BanditEnv(TextEnv):
    """Pick one of two arms; success = the arm with the higher expected reward."""

    description: ClassVar[str] = "Two-armed bandit with symbolic arm names; 1 turn."

    def __init__(
        self,
        low_risk_name: str = "Phoenix",
        high_risk_name: str = "Dragon",
        low_risk_reward: float = 0.1,
        high_risk_reward: float = 1.0,
        high_risk_prob: float = 0.25,
    ) -> None:
        super().__init__(max_steps=1)
        _check_names(low_risk_name, high_risk_name)
        for name, value in (
            ("low_risk_reward", low_risk_reward),
            ("high_risk_reward", high_risk_reward),
            ("high_risk_prob", high_risk_prob),
        ):
            _check_number(name, value)
        if not 0.0 <= high_risk_prob <= 1.0:
            raise UserError(f"high_risk_prob must lie in [0, 1], got {high_risk_prob}")
        self.low_risk_name = low_risk_name
        self.high_risk_name = high_risk_name
        self.low_risk_reward = float(low_risk_reward)
        self.high_risk_reward = float(high_risk_reward)
        self.high_risk_prob = float(high_risk_prob)
        self.action_names = (low_risk_name, high_risk_name)
        self._example_order = self.action_names
        rewards = (0.0, self.low_risk_reward, self.high_risk_reward)
        self.reward_range = (min(rewards), max(rewards))
        self.legend = {}
        self._pulled: str | None = None
        self._last_reward = 0.0

    # ------------------------------------------------------------------ reward laws
    def expected_reward(self, arm: str) -> float:
        """Expected payout of one pull of `arm`."""
        if arm == self.low_risk_name:
            return self.low_risk_reward
        return self.high_risk_prob * self.high_risk_reward

    @property
    def best_arm(self) -> str:
        """The arm with the higher expected reward (the risky one on ties)."""
        low, high = self.low_risk_name, self.high_risk_name
        return low if self.expected_reward(low) > self.expected_reward(high) else high

    def _pull(self, arm: str) -> float:
        if arm == self.low_risk_name:
            return self.low_risk_reward
        win = self.np_random.random() < self.high_risk_prob
        return self.high_risk_reward if win else 0.0

    # ------------------------------------------------------------------------ hooks
    @property
    def instruction(self) -> str:  # type: ignore[override]
        first, second = self.action_names
        one, other = self._example_order
        return (
            "You are playing a bandit game. Goal: get as much reward as you can with a single "
            f"pull. There are two arms, named {first} and {second}. Each arm pays rewards from "
            "its own distribution, and the name hints at how risky that distribution is. "
            "Reason about what each name suggests, then pull the arm you expect to pay more "
            f"on average. Answer with the arm's name: <answer> {one} </answer> or "
            f"<answer> {other} </answer>."
        )

    def _reset(self, options: dict[str, Any]) -> dict[str, Any]:
        order = [self.low_risk_name, self.high_risk_name]
        self.np_random.shuffle(order)  # the agent must not learn "always the first arm"
        self.action_names = tuple(order)
        # The answer examples get an order of their own: copying "the first example" must not
        # be a shortcut that tracks the shown order.
        self._example_order = tuple(self.np_random.permutation(order).tolist())
        self._pulled = None
        self._last_reward = 0.0
        return {}

    def _step(self, action_index: int) -> tuple[float, bool, bool, dict[str, Any]]:
        arm = self.action_names[action_index]
        self._pulled = arm
        self._last_reward = self._pull(arm)
        return self._last_reward, True, True, {"arm": arm}

    def render(self) -> str:
        arms = " | ".join(self.action_names)
        if self._pulled is None:
            return f"Arms: {arms}"
        return f"Arms: {arms}\nYou pulled {self._pulled} and got reward {self._last_reward:g}."

    def snapshot(self) -> Any:
        return (self.action_names, self._pulled, self._last_reward)

    def is_success(self) -> bool:
        return self._pulled == self.best_arm

    def optimal_action(self) -> str | None:
        return self.best_arm if self._pulled is None else None

    def optimal_success_probability(self) -> float:
        return 1.0 if self._pulled is None else float(self.is_success())

    def good_actions(self) -> frozenset[str] | None:
        """The arm with the higher expected reward, until an arm is pulled."""
        return None if self._pulled is not None else frozenset({self.best_arm})

    def explain(self, action: str) -> str | None:
        """Why the solver's arm: which arm is the risky one, and which pays more on average
        (the same expected rewards `best_arm` compares). None for the other arm."""
        index = self.action_index(action)
        if index is None or self.action_names[index] != self.optimal_action():
            return None
        arm = self.best_arm
        other = self.high_risk_name if arm == self.low_risk_name else self.low_risk_name
        # "risky, but pays more" is the lesson of the default arms; "safe, and pays more"
        # only holds for custom rewards that favour the safe arm.
        kind = "risky arm, but" if arm == self.high_risk_name else "safe arm, and"
        more = self.expected_reward(arm) > self.expected_reward(other)
        pays = "pays more on average than" if more else "pays on average as much as"
        return f"{arm} is the {kind} it {pays} {other}, so I pull {arm}."


def _check_number(name: str, value: Any) -> None:
    """A reward or probability argument: a finite real number (from YAML: `nan` and `1e`
    arrive as strings)."""
    is_number = isinstance(value, int | float) and not isinstance(value, bool)
    if not is_number or value != value or value in (float("inf"), float("-inf")):
        raise UserError(f"{name} must be a finite number, got {value!r}")


def _check_names(low: Any, high: Any) -> None:
    for name in (low, high):
        if not isinstance(name, str) or not name.strip() or name.strip() != name or "||" in name:
            raise UserError(
                f"arm name {name!r} must be a non-empty string without surrounding spaces or '||'"
            )
    if low.casefold() == high.casefold():
        raise UserError(f"the two arms need different names, got {low!r} twice")
