"""The declared interfaces and the classes that stand in for one another: every member a
`Protocol` declares exists on each implementation, with the same parameter names (a
renamed or missing argument in the Ray stand-ins fails here, not in a cluster run)."""

from __future__ import annotations

import inspect
from typing import Protocol

import pytest

from starpo.distributed.rollout_workers import PoolEngine, RolloutPool
from starpo.rollout.backends.base import GenerationBackend, PolicySampler
from starpo.rollout.backends.hf import HFBackend
from starpo.rollout.backends.lean import LeanBackend
from starpo.rollout.engine import EpisodePlayer, RolloutEngine
from starpo.trainer.learners import GradientSync
from starpo.trainer.sinks import JsonlSink, Sink, TensorBoardSink, WandbSink
from starpo.trainer.update import DataParallel


def protocol_members(protocol: type) -> dict[str, object]:
    """Name -> declared member (a function, or None for an annotated attribute) of
    `protocol` and the protocols it extends."""
    members: dict[str, object] = {}
    for base in reversed(protocol.__mro__):
        if base is Protocol or base is object or Protocol not in getattr(base, "__mro__", ()):
            continue
        members.update(dict.fromkeys(getattr(base, "__annotations__", {})))
        members.update(
            {name: value for name, value in vars(base).items() if inspect.isfunction(value)}
        )
    return {name: value for name, value in members.items() if not name.startswith("_")}


def parameter_names(function: object) -> list[str]:
    return [p for p in inspect.signature(function).parameters if p != "self"]


def mismatches(implementation: type, protocol: type) -> list[str]:
    """What `implementation` lacks of `protocol`, or declares with other parameters.
    Attributes set in __init__ are looked for in its source (they exist per instance)."""
    init_source = inspect.getsource(implementation.__init__)
    problems = []
    for name, declared in protocol_members(protocol).items():
        if declared is None:
            if not hasattr(implementation, name) and f"self.{name}" not in init_source:
                problems.append(f"no attribute {name}")
            continue
        found = getattr(implementation, name, None)
        if found is None:
            problems.append(f"no method {name}")
        elif parameter_names(found) != parameter_names(declared):
            problems.append(f"{name}{parameter_names(found)} != {parameter_names(declared)}")
    return problems


CASES = [
    (RolloutPool, PolicySampler),
    (HFBackend, GenerationBackend),
    (LeanBackend, GenerationBackend),
    (RolloutEngine, EpisodePlayer),
    (PoolEngine, EpisodePlayer),
    (GradientSync, DataParallel),
    (JsonlSink, Sink),
    (TensorBoardSink, Sink),
    (WandbSink, Sink),
]


@pytest.mark.parametrize(
    ("implementation", "protocol"), CASES, ids=[f"{c.__name__}-{p.__name__}" for c, p in CASES]
)
def test_implementation_has_every_member_of_its_protocol(implementation, protocol):
    assert protocol_members(protocol)  # the protocol declares something
    assert mismatches(implementation, protocol) == []


def test_the_check_sees_a_missing_method_and_a_renamed_parameter():
    class Partial:
        def __init__(self) -> None:
            self.numerics = None

        def seed(self, value: int) -> None:  # renamed parameter
            pass

    assert mismatches(Partial, PolicySampler) == [
        "seed['value'] != ['seed']",
        "no method update_weights",
    ]
