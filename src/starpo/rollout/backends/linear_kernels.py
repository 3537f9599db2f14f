"""The matmul kernel behind the lean decoder's weight projections.

A decode step multiplies every weight matrix by a few rows (the batch), so its speed is the
speed of small-M fp32 GEMMs. PyTorch routes `F.linear` in fp32 to MKL's sgemm; on an AMD
EPYC with AVX2 only, oneDNN's fp32 inner-product kernel (the one PyTorch's own mkldnn ops
use) on packed weights ran the SmolLM2 decode step's projections 2.4x faster at batch 8
(209 -> 86 ms a step, `bench/profile_decode.py`; `bench/bench_decode.py` prints both
kernels side by side). Both compute in fp32 and differ only in the order of their sums.

- `"torch"`: `F.linear` as is (any device, any dtype).
- `"onednn"`: `torch.ops.mkldnn._linear_pointwise` on weights reordered once into
  oneDNN's blocked layout (`pack_weight`; re-packed after every optimizer step): fp32 on a CPU
  only. Packed, not dense: the kernel otherwise reorders each weight on every call.
- `"auto"`: `"onednn"` where it applies (fp32 weights on a CPU whose PyTorch has
  oneDNN), `"torch"` elsewhere.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

LINEAR_KERNELS = ("auto", "torch", "onednn")

Linear = Callable[[torch.Tensor, torch.Tensor, torch.Tensor | None], torch.Tensor]


def onednn_applies(dtype: torch.dtype, device: torch.device) -> str | None:
    """Why the oneDNN kernel cannot run weights of `dtype` on `device`, or None."""
    if device.type != "cpu":
        return f"the oneDNN kernel runs on a CPU, not {device.type}"
    if dtype != torch.float32:
        return f"the oneDNN kernel here is for fp32 weights, not {dtype}"
    if not torch.backends.mkldnn.is_available():
        return "this PyTorch build has no oneDNN (mkldnn)"
    return None


def _onednn_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None):
    return torch.ops.mkldnn._linear_pointwise(x, weight, bias, "none", [], "")


#: The batch size oneDNN's weight layout is chosen for: a decode step's rows (any other
#: row count still computes correctly).
PACK_ROWS_HINT = 8


def pack_weight(kernel: str, weight: torch.Tensor) -> torch.Tensor:
    """`weight` (out, in) in the layout `kernel`'s linear reads: itself for "torch", a
    reordered copy for "onednn"."""
    if kernel == "onednn":
        return torch.ops.mkldnn._reorder_linear_weight(weight.detach(), PACK_ROWS_HINT)
    return weight


def pick_linear(kernel: str, dtype: torch.dtype, device: torch.device) -> tuple[str, Linear]:
    """(name, function) of the kernel `kernel` resolves to for weights of `dtype` on
    `device`; the function takes weights from `pack_weight(name, ...)`. An explicit
    "onednn" that cannot run raises with the reason."""
    if kernel not in LINEAR_KERNELS:
        raise ValueError(f"unknown linear kernel {kernel!r}; use one of {LINEAR_KERNELS}")
    reason = onednn_applies(dtype, device)
    if kernel == "onednn" and reason is not None:
        raise ValueError(f"linear kernel 'onednn': {reason}; use 'auto' or 'torch'")
    if kernel == "torch" or reason is not None:
        return "torch", F.linear
    return "onednn", _onednn_linear
