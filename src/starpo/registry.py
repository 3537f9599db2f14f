"""The extension points of starpo, by name: one place to add an advantage estimator, a loss
aggregation, a KL estimator, a filter mode or a generation backend.

Each entry names its implementation as "module:attribute" and is imported only when used,
so this module (and the config, whose choices and checks read it) never imports torch:

    from starpo.registry import ADVANTAGE_ESTIMATORS
    ADVANTAGE_ESTIMATORS.register("my_adv", "my_package.adv:my_estimator", critic=False)
    ADVANTAGE_ESTIMATORS["gae"]         # the function itself (imports its module)
    "gae" in ADVANTAGE_ESTIMATORS       # a name check, no import

Adding one to starpo is one edit: its function, plus its line below. Adding one from
your own package is one line of its pyproject.toml: each registry reads the entry-point
group `starpo.<registry>` (e.g. `starpo.advantage_estimators`, `starpo.generation_backends`,
`starpo.metric_sinks`; envs use `starpo.envs`, see `starpo.envs.registry`), the entry-point
name being the name to select and its value the "module:attribute" to import:

    [project.entry-points."starpo.advantage_estimators"]
    my_adv = "my_package.adv:my_estimator"

Facts the config needs (`info`, e.g. critic=True) come from the object's `registry_info`
dict attribute for an entry point (importing it), or from `register`'s keywords.
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Callable, Iterator, Mapping
from importlib.metadata import distributions
from typing import Any

from starpo.errors import UnknownName, UserError, unknown_name_message


class Registry(Mapping[str, Any]):
    """Names -> implementations ("module:attribute" strings, or objects), imported lazily.

    A read-only mapping for the code that uses it (`registry[name]`, iteration, `in`), plus
    `register` for extensions and `info(name)`: facts the config needs without importing
    the implementation (e.g. whether an advantage estimator needs a critic). An unknown
    name raises `UnknownName`: a UserError naming the valid names, and a KeyError.
    """

    def __init__(
        self,
        kind: str,
        group: str | None = None,
        from_entry_point: Callable[[str, str], Any] | None = None,
    ) -> None:
        self.kind = kind  # e.g. "advantage estimator", used in messages
        self.group = group  # the entry-point group plugins register under
        # What an entry point's "module:attribute" becomes (the string itself by default,
        # imported on first use; the env registry wraps it in an EnvSpec).
        self._from_entry_point = from_entry_point
        self._targets: dict[str, str | Any] = {}
        self._info: dict[str, dict[str, Any] | None] = {}  # None: read registry_info
        self._loaded: dict[str, Any] = {}
        self._scanned = group is None

    def _scan(self) -> None:
        """Add the entry points of `group` once, on first use (names not taken already:
        starpo's own entries and `register` calls win)."""
        if self._scanned:
            return
        self._scanned = True
        for point in installed_entry_points().get(self.group, ()):
            if point.name not in self._targets:
                wrap = self._from_entry_point
                self._targets[point.name] = wrap(point.name, point.value) if wrap else point.value
                self._info[point.name] = None

    def register(
        self, name: str, target: str | Any, *, overwrite: bool = False, **info: Any
    ) -> None:
        """Add `name` (a "module:attribute" string or the object itself) with its facts;
        replacing a name already there needs overwrite=True."""
        self._scan()
        if name in self._targets and not overwrite:
            raise UserError(
                f"{self.kind} {name!r} is already registered; pass overwrite=True to replace it"
            )
        self._targets[name] = target
        self._info[name] = info
        self._loaded.pop(name, None)

    def unregister(self, name: str) -> None:
        """Remove `name` (a plugin's registration, e.g. at the end of a test)."""
        self._check(name)
        for table in (self._targets, self._info, self._loaded):
            table.pop(name, None)

    def info(self, name: str) -> dict[str, Any]:
        self._check(name)
        info = self._info[name]
        return dict(getattr(self[name], "registry_info", {}) if info is None else info)

    def _check(self, name: str) -> None:
        self._scan()
        if name not in self._targets:
            raise UnknownName(unknown_name_message(self.kind, name, list(self._targets)))

    def __getitem__(self, name: str) -> Any:
        self._check(name)
        if name not in self._loaded:
            target = self._targets[name]
            if isinstance(target, str):
                module, _, attribute = target.partition(":")
                target = getattr(importlib.import_module(module), attribute)
            self._loaded[name] = target
        return self._loaded[name]

    def __contains__(self, name: object) -> bool:
        self._scan()
        return name in self._targets  # no import

    def __iter__(self) -> Iterator[str]:
        self._scan()
        return iter(self._targets)

    def __len__(self) -> int:
        self._scan()
        return len(self._targets)

    def names(self) -> tuple[str, ...]:
        self._scan()
        return tuple(self._targets)


@functools.cache
def installed_entry_points() -> dict[str, tuple[Any, ...]]:
    """The installed packages' entry points in starpo's groups ("starpo.envs",
    "starpo.advantage_estimators", ...), by group: the distributions are read once per
    process (~13 ms a scan), not once per registry."""
    found: dict[str, list[Any]] = {}
    for dist in distributions():
        for point in dist.entry_points:
            if point.group.startswith("starpo."):
                found.setdefault(point.group, []).append(point)
    return {group: tuple(points) for group, points in found.items()}


def _registry(kind: str, entries: dict[str, tuple[str, dict[str, Any]]]) -> Registry:
    registry = Registry(kind, "starpo." + kind.lower().replace(" ", "_") + "s")
    for name, (target, info) in entries.items():
        registry.register(name, target, **info)
    return registry


_ADV = "starpo.algorithms.estimators"
_LOSS = "starpo.algorithms.losses"

#: (inputs, params) -> (advantages, returns). info: critic = needs a value model; groups =
#: normalises within env groups (needs rollout.group_size >= 2); rewards = what it reads:
#: "placement" (token rewards as algorithm.reward_placement puts them), "per_turn" (each
#: turn's reward on its own turn), absent = the trajectory's total only.
ADVANTAGE_ESTIMATORS = _registry(
    "advantage estimator",
    {
        "gae": (f"{_ADV}:gae_estimator", {"critic": True, "rewards": "placement"}),
        "grpo": (f"{_ADV}:grpo_estimator", {"critic": False, "groups": True}),
        "bi_level_gae": (f"{_ADV}:bi_level_estimator", {"critic": True, "rewards": "per_turn"}),
        "gigpo": (
            f"{_ADV}:gigpo_estimator",
            {"critic": False, "groups": True, "rewards": "per_turn"},
        ),
    },
)

#: (numerator(loss_mat, mask), count(mask)): see starpo.algorithms.losses.aggregate.
LOSS_AGGREGATIONS = _registry(
    "loss aggregation",
    {
        "token_mean": (f"{_LOSS}:TOKEN_MEAN", {}),
        "seq_mean_token_mean": (f"{_LOSS}:SEQ_MEAN_TOKEN_MEAN", {}),
        "seq_mean_token_sum": (f"{_LOSS}:SEQ_MEAN_TOKEN_SUM", {}),
    },
)

#: (logprobs, ref_logprobs) -> per-token KL estimate.
KL_ESTIMATORS = _registry(
    "KL estimator",
    {
        "k1": (f"{_LOSS}:kl_k1", {}),
        "k2": (f"{_LOSS}:kl_k2", {}),
        "k3": (f"{_LOSS}:kl_k3", {}),
    },
)

#: group stds -> group indices, most wanted first.
FILTER_MODES = _registry(
    "filter mode",
    {
        "top_std": ("starpo.algorithms.filtering:highest_std_first", {}),
        "bottom_std": ("starpo.algorithms.filtering:lowest_std_first", {}),
    },
)

#: (model, tokenizer, *, compute_dtype, seed) -> a GenerationBackend.
GENERATION_BACKENDS = _registry(
    "generation backend",
    {
        "auto": ("starpo.rollout.backends.lean:build_auto_backend", {}),
        "hf": ("starpo.rollout.backends.hf:build_hf_backend", {}),
        "lean": ("starpo.rollout.backends.lean:build_lean_backend", {}),
    },
)

#: (run_dir, *, config, resume) -> a metrics sink (`starpo.trainer.sinks.Sink`: log,
#: truncate_after, close). metrics.jsonl is always written; these are mirrors, chosen
#: with trainer.sinks (trainer.tensorboard / trainer.wandb select the first two).
METRIC_SINKS = _registry(
    "metric sink",
    {
        "tensorboard": ("starpo.trainer.sinks:tensorboard_sink", {}),
        "wandb": ("starpo.trainer.sinks:wandb_sink", {}),
    },
)
