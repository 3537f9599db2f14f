"""The extension registry: lazy, torch-free names; the config's choices read it; adding an
estimator is one registration."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from starpo import registry
from starpo.algorithms import AdvantageInputs, compute_advantages, kl_penalty


def test_registry_and_config_import_without_torch():
    code = (
        "import sys; import starpo.registry, starpo.config; "
        "assert 'torch' not in sys.modules, 'torch imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_names_resolve_to_the_implementations():
    from starpo.algorithms import estimators as advantages
    from starpo.algorithms import losses

    assert registry.ADVANTAGE_ESTIMATORS["grpo"] is advantages.grpo_estimator
    assert registry.KL_ESTIMATORS["k3"] is losses.kl_k3
    assert registry.ADVANTAGE_ESTIMATORS.info("gae") == {"critic": True, "rewards": "placement"}
    for reg in (
        registry.ADVANTAGE_ESTIMATORS,
        registry.LOSS_AGGREGATIONS,
        registry.KL_ESTIMATORS,
        registry.FILTER_MODES,
        registry.GENERATION_BACKENDS,
    ):
        for name in reg:
            assert reg[name] is not None, name


def test_unknown_names_say_what_is_valid():
    with pytest.raises(ValueError, match="unknown KL estimator 'k4'; valid: k1, k2, k3"):
        kl_penalty(torch.zeros(1, 2), torch.zeros(1, 2), "k4")
    with pytest.raises(KeyError, match="did you mean 'grpo'"):
        registry.ADVANTAGE_ESTIMATORS.info("grp")
    with pytest.raises(ValueError, match="already registered"):
        registry.KL_ESTIMATORS.register("k1", "x:y")


def test_an_extension_is_one_registration(monkeypatch):
    def constant_estimator(inputs, params):
        return inputs.mask * 2.0, None

    adv = registry.Registry("advantage estimator")
    for name in registry.ADVANTAGE_ESTIMATORS:
        adv.register(name, registry.ADVANTAGE_ESTIMATORS[name])
    adv.register("constant", constant_estimator, critic=False)
    monkeypatch.setattr("starpo.algorithms.estimators.ADVANTAGE_ESTIMATORS", adv)
    mask = torch.ones(2, 3)
    advantages, returns = compute_advantages("constant", AdvantageInputs(mask=mask))
    assert torch.equal(advantages, mask * 2.0) and returns is None
