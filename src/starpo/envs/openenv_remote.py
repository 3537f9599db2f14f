"""An OpenEnv environment server played as a starpo env (env id `openenv`).

    starpo eval --env openenv --env-arg url=http://127.0.0.1:8001 --policy random
    starpo train --config cpu-bandit-starpo-s env.id=openenv env.kwargs.url=http://...

Each env instance is one session of the server (openenv-core's WebSocket protocol, through
its own `GenericEnvClient`): the server keeps one game per session, so every episode of a
rollout plays its own game. The session opens at the first `reset` and ends at `close`,
which the rollout engine calls when the episode is over. A server that is down, refuses
the session (at capacity) or stops answering raises here, and the engine records that as
the episode's env fault (the episode ends; its group is left out of the update).

What the prompt needs and an OpenEnv observation does not name is read from the
observation when it carries it (a starpo env served by `starpo serve-env` sends
`instruction`, `legend`, `action_names`, `answer_format`, `success` and validity), else from
this env's arguments: `actions` (none: free-text answers), `instruction`, `answer_format`,
`action_key` (the action's field, default "action"), `text_key` (the observation's field
shown to the agent; default: `text`, else its only string field, else every field).
Without a `success` field, an episode succeeds when it ends on a positive reward.

A server whose observations list `tools` (OpenAI function schemas; a starpo tool env
served by `starpo serve-env` does) is played as a tool-calling env: actions are calls, each
observation's `tool_result` goes back to the agent as a `tool` message.
"""

from __future__ import annotations

import json
from typing import Any

from starpo.envs.base import TextEnv
from starpo.errors import UserError

MISSING_EXTRA = "env 'openenv' needs openenv-core: pip install 'starpo[openenv]'"

#: Observation fields that describe the game rather than show its state.
_META_FIELDS = frozenset(
    {
        "instruction",
        "legend",
        "action_names",
        "answer_format",
        "success",
        "action_is_valid",
        "action_is_effective",
        "action",
        "steps_left",
        "truncated",
        "tools",
        "tool_result",
    }
)


class RemoteEnvError(RuntimeError):
    """The OpenEnv server failed a call; the rollout engine makes it the episode's env fault."""


class OpenEnvEnv(TextEnv):
    """A remote OpenEnv environment (its server's URL), one session per env instance."""

    description = (
        "An OpenEnv environment server (env.kwargs.url=http://HOST:PORT), one session per "
        "episode; needs starpo[openenv]."
    )

    def __init__(
        self,
        url: str,
        max_steps: int = 100,
        actions: list[str] | tuple[str, ...] | None = None,
        instruction: str = "",
        answer_format: str = "your answer as plain text",
        action_key: str = "action",
        text_key: str = "",
        reset_args: dict[str, Any] | None = None,
        connect_timeout_s: float = 10.0,
        message_timeout_s: float = 60.0,
    ) -> None:
        super().__init__(max_steps)
        if not isinstance(url, str) or not url.startswith(
            ("http://", "https://", "ws://", "wss://")
        ):
            raise UserError(
                f"env 'openenv': url must be the server's address, e.g. http://127.0.0.1:8001, "
                f"got {url!r}"
            )
        if not isinstance(action_key, str) or not action_key:
            raise UserError(f"env 'openenv': action_key must be a field name, got {action_key!r}")
        if actions is not None and (
            isinstance(actions, str) or not all(isinstance(a, str) and a for a in actions)
        ):
            raise UserError(
                f"env 'openenv': actions must be a list of action names, got {actions!r}"
            )
        for name, value in (
            ("connect_timeout_s", connect_timeout_s),
            ("message_timeout_s", message_timeout_s),
        ):
            if not isinstance(value, (int, float)) or not value > 0:
                raise UserError(f"env 'openenv': {name} must be a positive number, got {value!r}")
        self.url = url.rstrip("/")
        self.action_names = tuple(actions or ())
        self._fixed_actions = actions is not None
        self.instruction = instruction or "Play the game: each turn you see its current state."
        self.answer_format = answer_format
        self.action_key, self.text_key = action_key, text_key
        self.reset_args = dict(reset_args or {})
        self.timeouts = (float(connect_timeout_s), float(message_timeout_s))
        self.legend = {}
        # Imported here, not at the first reset: a missing extra fails when the env is made
        # (before any model loads), and the import (seconds) never counts against
        # rollout.env_timeout_s.
        try:
            from openenv.core import GenericEnvClient
        except ImportError:
            raise UserError(MISSING_EXTRA) from None
        self._client_class = GenericEnvClient
        self._client: Any = None
        self._text = ""
        self._success = False
        self._seed: int | None = None
        self._tools: list[dict[str, Any]] = []  # a tool-calling server's, from its observations
        self._good: frozenset[str] | None = None  # the moves the server judges good now

    # ------------------------------------------------------------------ the session
    def _session(self) -> Any:
        """The open session's client, opened on first use."""
        if self._client is None:
            connect_s, message_s = self.timeouts
            client = self._client_class(
                base_url=self.url, connect_timeout_s=connect_s, message_timeout_s=message_s
            ).sync()
            self._client = client.connect()
        return self._client

    def _remote(self, method: str, *args: Any, **kwargs: Any) -> Any:
        """The session's `method(...)`; any failure (server down, session refused, no answer
        within message_timeout_s, an error the server sent) raises RemoteEnvError."""
        try:
            return getattr(self._session(), method)(*args, **kwargs)
        except UserError:
            raise
        except Exception as exc:
            # A session refused at capacity is closed by the server, sometimes before its
            # CAPACITY_REACHED message is read: say what a closed session may mean.
            closed = type(exc).__name__.startswith("ConnectionClosed")
            hint = " (the server ended the session: at its session limit, or stopped?)"
            raise RemoteEnvError(
                f"OpenEnv server {self.url}: {type(exc).__name__}: {exc}{hint if closed else ''}"
            ) from exc

    def close(self) -> None:
        """End the server session (the server then closes its game)."""
        client, self._client = self._client, None
        if client is not None:
            client.close()

    # --------------------------------------------------------------------- the game
    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[str, dict[str, Any]]:
        self._seed = seed  # sent to the server: the episode's seed fixes the remote game
        return super().reset(seed=seed, options=options)

    def _reset(self, options: dict[str, Any]) -> dict[str, Any]:
        args = {**self.reset_args, **options}
        if self._seed is not None:
            args["seed"] = self._seed
        result = self._remote("reset", **args)
        self._read(result.observation, float(result.reward or 0.0), done=bool(result.done))
        budget = result.observation.get("steps_left")
        if isinstance(budget, int) and not isinstance(budget, bool) and budget > 0:
            self.max_steps = budget  # the server's own budget (a starpo env's), when it says
        return {}

    def step(self, action: Any) -> tuple[str, float, bool, bool, dict[str, Any]]:
        """The base class's step, plus what only the server knows: an answer it judged
        invalid (no budget used, as for a local invalid action) and its own truncation."""
        state, reward, terminated, truncated, info = super().step(action)
        if info.pop("remote_invalid", False):
            self.num_steps -= 1
            terminated = truncated = self._done = False
            info.update(action_is_valid=False, action_is_effective=False, action=None)
            info.update(action_is_optimal=None, steps_left=self.steps_left)
        elif info.pop("remote_truncated", False):
            terminated, truncated = False, True
        if isinstance(info.get("remote_optimal"), bool):  # the server's own judgement wins
            info["action_is_optimal"] = info["remote_optimal"]
        info.pop("remote_optimal", None)
        if self._tools and "tool_result" not in info:  # refused here, never sent
            info["tool_result"] = "Error: an empty call"
        return state, reward, terminated, truncated, info

    def tool_schemas(self) -> list[dict[str, Any]]:
        """The server's tools (empty: it takes actions or answers, not calls)."""
        return list(self._tools)

    def _step(self, action: Any) -> tuple[float, bool, bool, dict[str, Any]]:
        result = self._remote("step", {self.action_key: action})
        observation = result.observation
        reward = float(result.reward or 0.0)
        self._read(observation, reward, done=bool(result.done))
        extra = {
            "remote_invalid": observation.get("action_is_valid", True) is False,
            "remote_truncated": bool(result.done) and bool(observation.get("truncated", False)),
        }
        if isinstance(observation.get("tool_result"), str):
            extra["tool_result"] = observation["tool_result"]
        if isinstance(observation.get("action_is_optimal"), bool):
            extra["remote_optimal"] = observation["action_is_optimal"]
        effective = bool(observation.get("action_is_effective", True))
        return reward, bool(result.done), effective, extra

    def _read(self, observation: Any, reward: float, *, done: bool) -> None:
        if not isinstance(observation, dict):
            raise RuntimeError(
                f"the server sent an observation that is not an object: {observation!r}"
            )
        self._text = observation_text(observation, self.text_key)
        if isinstance(observation.get("success"), bool):
            self._success = observation["success"]
        else:  # the server does not say: an episode that ended on a positive reward
            self._success = done and reward > 0
        if not self._fixed_actions and _is_names(observation.get("action_names")):
            self.action_names = tuple(observation["action_names"])
        for name in ("instruction", "answer_format"):
            if isinstance(observation.get(name), str) and observation[name]:
                setattr(self, name, observation[name])
        if isinstance(observation.get("legend"), dict):
            self.legend = {str(k): str(v) for k, v in observation["legend"].items()}
        tools = observation.get("tools")
        if isinstance(tools, list) and tools and all(isinstance(t, dict) for t in tools):
            self._tools = tools
        good = observation.get("good_actions")  # a starpo server's solver, when it judges
        self._good = frozenset(good) if isinstance(good, list) and _is_names(good) else None

    def good_actions(self) -> frozenset[str] | None:
        """The moves the server judged good in its last observation (None: it does not
        judge), so a served env's moves are judged as the local env's."""
        return self._good

    def parse_action(self, action: Any) -> Any | None:
        if self.action_names:
            index = self.action_index(action)
            return None if index is None else self.action_names[index]
        if not isinstance(action, str) or not action.strip():
            return None
        return action.strip()

    def action_label(self, action: Any) -> str:
        return action

    def sample_action(self, rng: Any) -> str:
        if self.action_names:
            return super().sample_action(rng)
        return str(int(rng.integers(0, 10)))  # a well-formed free-text answer, usually wrong

    def render(self) -> str:
        return self._text

    def snapshot(self) -> Any:
        return (self._text, self._success, self.num_steps)

    def is_success(self) -> bool:
        return self._success


def _is_names(value: Any) -> bool:
    return isinstance(value, list) and bool(value) and all(isinstance(v, str) and v for v in value)


def observation_text(observation: dict[str, Any], text_key: str = "") -> str:
    """The text an agent sees for an OpenEnv observation: its `text_key` field when named,
    else a `text` field, else its only string field, else every field that is not a
    description of the game, one `name: value` line each."""
    if text_key:
        if text_key not in observation:
            raise RuntimeError(
                f"the observation has no field {text_key!r} (text_key); it has: "
                f"{', '.join(sorted(observation)) or 'none'}"
            )
        return _as_text(observation[text_key])
    if isinstance(observation.get("text"), str):
        return observation["text"]
    shown = {k: v for k, v in observation.items() if k not in _META_FIELDS}
    strings = [v for v in shown.values() if isinstance(v, str)]
    if len(strings) == 1:
        return strings[0]
    return "\n".join(f"{name}: {_as_text(value)}" for name, value in sorted(shown.items()))


def _as_text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, sort_keys=True, default=str)
