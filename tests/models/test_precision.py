"""The compute dtype suits the CPU: bf16 autocast only where the CPU multiplies bf16 in
hardware, and no shipped preset forces bf16 (on an AVX2-only CPU it runs ~75x slower)."""

from __future__ import annotations

import pytest
import torch

from starpo.config import load_config, presets
from starpo.models import precision
from starpo.models.precision import compute_dtype


@pytest.fixture(params=[True, False], ids=["native-bf16", "avx2-only"])
def native(request, monkeypatch) -> bool:
    """Fake the CPU's kind (read from /proc/cpuinfo on a real run)."""
    monkeypatch.setattr(precision, "cpu_has_native_bf16", lambda: request.param)
    return request.param


def test_auto_is_bf16_only_on_a_cpu_with_native_bf16(native):
    expected = torch.bfloat16 if native else torch.float32
    assert compute_dtype("auto", "cpu") == expected
    assert compute_dtype("AUTO ", torch.device("cpu")) == expected
    assert compute_dtype("auto", "cuda") == torch.bfloat16  # no CUDA needed to decide
    assert compute_dtype("fp32", "cpu") == torch.float32  # explicit values are kept
    assert compute_dtype("bf16", "cpu") == torch.bfloat16


@pytest.mark.parametrize("name", presets())
def test_no_preset_forces_bf16(name):
    cfg = load_config(name, ["model.device=cpu"])
    assert cfg.model.dtype in ("auto", "fp32", "float32"), f"{name}: model.dtype={cfg.model.dtype}"


@pytest.mark.parametrize("name", ["cpu-sokoban-sft-starpo-s", "cpu-frozenlake-sft-starpo-s"])
def test_multi_turn_presets_update_in_bf16_only_where_the_cpu_has_it(name, native):
    from starpo.memory.plan import runtime_for

    runtime = runtime_for(load_config(name, []), "llama")
    assert runtime.compute_dtype == (torch.bfloat16 if native else torch.float32)
