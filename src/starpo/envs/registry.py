"""Env registry: ids -> constructors, `make(id, **kwargs)`, and third-party entry points.

Third-party packages register envs through the entry-point group `starpo.envs`; the
entry-point name is the env id and its value the env class (or any factory), e.g. in
pyproject.toml:

    [project.entry-points."starpo.envs"]
    my-maze = "my_package.maze:MazeEnv"
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from starpo.envs.base import TextEnv
from starpo.errors import UserError, closest_match
from starpo.registry import Registry

ENTRY_POINT_GROUP = "starpo.envs"


@dataclass
class EnvSpec:
    """How to build one env id: a constructor plus default keyword arguments."""

    id: str
    entry_point: str | Callable[..., TextEnv]  # "module:attr" or a callable
    kwargs: dict[str, Any] = field(default_factory=dict)
    description: str = ""
    #: Arguments every `make` must give (an OpenEnv server's url), with an example value.
    requires: dict[str, str] = field(default_factory=dict)

    def load(self) -> Callable[..., TextEnv]:
        """The constructor, importing its module on first use."""
        if callable(self.entry_point):
            return self.entry_point
        module_name, _, attr = self.entry_point.partition(":")
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            if exc.name is None or not module_name.startswith(exc.name):
                raise  # a module that exists failed its own imports: a bug, not a user error
            raise UserError(
                f"env {self.id!r}: cannot load {self.entry_point!r} (no module {exc.name!r}); "
                "install the package that provides it"
            ) from exc
        if not hasattr(module, attr):
            raise UserError(
                f"env {self.id!r}: module {module_name!r} has no {attr!r}; fix the entry point"
            )
        return getattr(module, attr)

    def summary(self) -> str:
        """The one-line description: the spec's own, else the class's."""
        if self.description:
            return self.description
        constructor = self.load()
        return getattr(constructor, "description", "") or (constructor.__doc__ or "").strip()


#: Env ids -> EnvSpec. The same `Registry` as starpo's other extension points: one lazy
#: import rule, one scan of the `starpo.envs` entry points, one wording for unknown names.
ENVS = Registry(
    "env id", ENTRY_POINT_GROUP, from_entry_point=lambda id, target: EnvSpec(id, target)
)


def register(
    id: str,
    entry_point: str | Callable[..., TextEnv],
    *,
    kwargs: dict[str, Any] | None = None,
    description: str = "",
    requires: dict[str, str] | None = None,
    overwrite: bool = False,
) -> EnvSpec:
    """Register an env id. Re-registering an id needs `overwrite=True`. `requires` names
    the arguments every `make` must give, each with an example value for the error."""
    if not id or not isinstance(id, str):
        raise UserError(f"env id must be a non-empty string, got {id!r}")
    env_spec = EnvSpec(
        id=id,
        entry_point=entry_point,
        kwargs=dict(kwargs or {}),
        description=description,
        requires=dict(requires or {}),
    )
    ENVS.register(id, env_spec, overwrite=overwrite)
    return env_spec


def registered_ids() -> list[str]:
    """All known env ids, sorted."""
    return sorted(ENVS)


def standalone_ids() -> list[str]:
    """The ids `make(id)` builds with no arguments, sorted: all but those that need one
    (an OpenEnv server's url)."""
    return [id for id in registered_ids() if not spec(id).requires]


def spec(id: str) -> EnvSpec:
    """The spec of `id`; an unknown id is a UserError naming the known ids and the closest."""
    return ENVS[id]


def make(id: str, **kwargs: Any) -> TextEnv:
    """Build the env registered as `id`; keyword arguments override the spec's defaults."""
    env_spec = spec(id)
    for name, example in env_spec.requires.items():
        if name not in kwargs:
            raise UserError(
                f"env {id!r} needs {name}: e.g. --env-arg {name}={example} "
                f"(or env.kwargs.{name}={example} in a training config)"
            )
    constructor = env_spec.load()
    _check_kwargs(id, constructor, kwargs)
    try:
        env = constructor(**{**env_spec.kwargs, **kwargs})
    except TypeError as exc:
        if not kwargs:
            raise  # the env's own defaults fail: a bug in the env, not the user's input
        given = ", ".join(f"{k}={v!r}" for k, v in kwargs.items())
        raise UserError(f"env {id!r} cannot be built with {given}: {exc}") from exc
    env.spec = env_spec  # type: ignore[attr-defined]
    return env


def accepted_kwargs(constructor: Callable[..., Any]) -> list[str] | None:
    """Keyword arguments the constructor accepts, or None when it takes **kwargs."""
    params = inspect.signature(constructor).parameters.values()
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
        return None
    return [p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]


def _check_kwargs(id: str, constructor: Callable[..., Any], kwargs: dict[str, Any]) -> None:
    accepted = accepted_kwargs(constructor)
    if accepted is None:
        return
    for name in kwargs:
        if name not in accepted:
            suggestion = closest_match(name, accepted)
            hint = f" (did you mean {suggestion!r}?)" if suggestion else ""
            raise UserError(
                f"env {id!r} has no argument {name!r}{hint}; accepted: {', '.join(accepted)}"
            )
