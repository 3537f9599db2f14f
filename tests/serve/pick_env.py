"""An OpenEnv environment as its own authors write one, with openenv-core's classes: pick
Dragon (reward 1) or Phoenix (reward 0), one step. A module of its own so that test files
import openenv-core (seconds) only when a test uses it, not at collection."""

from __future__ import annotations

from openenv.core.env_server.http_server import create_fastapi_app
from openenv.core.env_server.interfaces import Environment
from openenv.core.env_server.types import Action, Observation, State


class PickAction(Action):
    choice: str


class PickObservation(Observation):
    prompt: str


class PickEnvironment(Environment):
    """Counts the sessions (environments) it served and closed."""

    SUPPORTS_CONCURRENT_SESSIONS = True
    opened = 0
    closed = 0

    def __init__(self) -> None:
        super().__init__()
        type(self).opened += 1
        self._state = State()

    def reset(self, seed=None, episode_id=None, **kwargs) -> PickObservation:
        self._state = State(episode_id=episode_id, step_count=0)
        return PickObservation(prompt="Two doors: Dragon and Phoenix.", done=False, reward=0.0)

    def step(self, action: PickAction, timeout_s=None, **kwargs) -> PickObservation:
        self._state.step_count += 1
        won = action.choice == "Dragon"
        return PickObservation(
            prompt=f"You opened {action.choice}.", done=True, reward=1.0 if won else 0.0
        )

    @property
    def state(self) -> State:
        return self._state

    def close(self) -> None:
        type(self).closed += 1


def pick_app(max_sessions: int = 64):
    """openenv-core's own server for PickEnvironment, its session counts reset."""
    PickEnvironment.opened = PickEnvironment.closed = 0
    return create_fastapi_app(
        PickEnvironment, PickAction, PickObservation, max_concurrent_envs=max_sessions
    )
