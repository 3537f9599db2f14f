"""Any registered starpo env as an OpenEnv environment server (`starpo serve-env`).

openenv-core's own server runs it: `/ws` sessions (one starpo env per session, so two
clients play two games), bounded in number (`max_sessions`; one more is refused with
CAPACITY_REACHED), ended when the client closes or disconnects, and reaped when idle
(`idle_timeout_s`). Its stateless `/reset` builds a fresh env per request, as OpenEnv's
HTTP endpoints do; an episode of several steps needs a session.

An action is `{"action": "Up"}` (an action name, matched case-insensitively, or a free-text
env's answer). An observation carries the rendered state (`text`) and what a prompt needs
(`instruction`, `legend`, `action_names` or `answer_format`) and what the step did
(`success`, `action_is_valid`, `action_is_effective`, `action`, `steps_left`, `truncated`).
An env whose solver judges moves also says whether the move just taken was one an optimal
policy could take (`action_is_optimal`) and which moves are good now (`good_actions`); both
are null where the env does not judge.
A tool-calling env's observation also lists its `tools` (OpenAI function schemas), its
action is a call's JSON (`{"action": "{\"name\": ..., \"arguments\": {...}}"}`), and
`tool_result` is what the call returned ("Error: ..." for a malformed one).
"""

from __future__ import annotations

from functools import partial
from typing import Any

from fastapi import FastAPI
from openenv.core.env_server.http_server import HTTPEnvServer
from openenv.core.env_server.interfaces import Environment
from openenv.core.env_server.types import (
    Action,
    ConcurrencyConfig,
    EnvironmentMetadata,
    Observation,
    State,
)
from pydantic import Field
from starlette.websockets import WebSocketDisconnect

from starpo.envs import make, spec
from starpo.envs.base import TextEnv
from starpo.envs.tools import is_tool_env


class StarpoAction(Action):
    """One action: an action name (case-insensitive) or a free-text env's answer."""

    action: str = Field(description="an action name, e.g. 'Up', or a free-text answer")


class StarpoObservation(Observation):
    """The rendered state, the task for a prompt, and what the last step did."""

    text: str = Field(description="the current state, as the env renders it")
    instruction: str = Field(default="", description="the task, for the prompt")
    legend: dict[str, str] = Field(default_factory=dict, description="grid symbol -> meaning")
    action_names: list[str] = Field(default_factory=list, description="empty: free text")
    answer_format: str = Field(default="", description="a free-text env's answer, described")
    success: bool = False
    action_is_valid: bool = True
    action_is_effective: bool = False
    action: str | None = Field(default=None, description="the action taken, canonical name")
    steps_left: int = 0
    truncated: bool = Field(default=False, description="ended by the action budget")
    action_is_optimal: bool | None = Field(
        default=None, description="the move just taken was an optimal one; null: not judged"
    )
    good_actions: list[str] | None = Field(
        default=None, description="the moves an optimal policy could take now; null: not judged"
    )
    tools: list[dict[str, Any]] = Field(
        default_factory=list, description="a tool-calling env's tools (OpenAI function schemas)"
    )
    tool_result: str | None = Field(default=None, description="what the last tool call returned")


class StarpoEnvironment(Environment):
    """One session's game: a starpo env behind openenv-core's `Environment` interface."""

    SUPPORTS_CONCURRENT_SESSIONS = True  # each session builds its own env

    def __init__(self, env_id: str, env_kwargs: dict[str, Any]) -> None:
        super().__init__()
        self.env_id = env_id
        self.env: TextEnv = make(env_id, **env_kwargs)
        self._state = State()

    def reset(
        self, seed: int | None = None, episode_id: str | None = None, **kwargs: Any
    ) -> StarpoObservation:
        text, info = self.env.reset(seed=seed)
        self._state = State(episode_id=episode_id, step_count=0)
        return self._observation(text, info, reward=0.0, done=False, truncated=False)

    def step(
        self, action: StarpoAction, timeout_s: float | None = None, **kwargs: Any
    ) -> StarpoObservation:
        if self.env.done:
            raise ValueError(
                "no episode in play: reset first (an episode of several steps needs a /ws "
                "session; the stateless /step cannot continue one)"
            )
        text, reward, terminated, truncated, info = self.env.step(action.action)
        self._state.step_count += 1
        return self._observation(
            text, info, reward=reward, done=terminated or truncated, truncated=truncated
        )

    def _observation(
        self, text: str, info: dict[str, Any], *, reward: float, done: bool, truncated: bool
    ) -> StarpoObservation:
        env = self.env
        return StarpoObservation(
            text=text,
            instruction=env.instruction,
            legend=dict(env.legend),
            action_names=list(env.action_names),
            answer_format=env.answer_format,
            success=bool(info["success"]),
            action_is_valid=bool(info.get("action_is_valid", True)),
            action_is_effective=bool(info.get("action_is_effective", False)),
            action=info.get("action"),
            steps_left=int(info["steps_left"]),
            truncated=truncated,
            action_is_optimal=info.get("action_is_optimal"),
            good_actions=_sorted_or_none(None if done else env.good_actions()),
            tools=env.tool_schemas() if is_tool_env(env) else [],
            tool_result=info.get("tool_result"),
            reward=float(reward),
            done=done,
        )

    @property
    def state(self) -> State:
        return self._state

    def get_metadata(self) -> EnvironmentMetadata:
        return EnvironmentMetadata(
            name=self.env_id, description=spec(self.env_id).summary(), version="starpo"
        )

    def close(self) -> None:
        self.env.close()


def _sorted_or_none(actions: frozenset[str] | None) -> list[str] | None:
    return None if actions is None else sorted(actions)


def build_env_app(
    env_id: str,
    env_kwargs: dict[str, Any] | None = None,
    *,
    max_sessions: int = 256,
    idle_timeout_s: float | None = None,
) -> FastAPI:
    """openenv-core's server for `env_id`, plus GET /sessions (active and maximum sessions);
    bad ids and arguments fail here, before anything is served."""
    kwargs = dict(env_kwargs or {})
    make(env_id, **kwargs).close()
    server = HTTPEnvServer(
        partial(StarpoEnvironment, env_id, kwargs),
        StarpoAction,
        StarpoObservation,
        concurrency_config=ConcurrencyConfig(
            max_concurrent_envs=max_sessions, session_timeout=idle_timeout_s
        ),
    )
    app = FastAPI(
        title=f"starpo env {env_id} (OpenEnv)",
        description=f"{spec(env_id).summary()} Sessions on /ws, one game each.",
    )
    server.register_routes(app)
    app.add_middleware(_QuietDisconnects)
    app.state.env_server = server

    @app.get("/sessions")
    def sessions() -> dict[str, int]:
        status = server.get_capacity_status()
        return {"active": status.active_sessions, "max": status.max_sessions}

    return app


class _QuietDisconnects:
    """openenv-core's /ws handler closes a socket the client already closed, and starlette
    raises for that: an ERROR traceback in the log at the end of every normal session.
    This drops that one exception (the session itself is already ended)."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        try:
            await self.app(scope, receive, send)
        except WebSocketDisconnect:
            if scope["type"] != "websocket":
                raise
