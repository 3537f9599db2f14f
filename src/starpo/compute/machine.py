"""The machine a result was measured on, in one line for results files and reports.

Every figure starpo publishes names its CPU's capability: a bf16 matmul runs ~4x faster
than fp32 on a CPU with AVX512-BF16 or AMX and ~75x slower on one with only AVX2, so a
time (and the dtype a run chose) means little without it. Stdlib and torch only; reads
Linux's /proc/cpuinfo where there is one.
"""

from __future__ import annotations

import datetime
from pathlib import Path

import torch

from starpo.compute.cpu_sharing import usable_cores
from starpo.models.precision import cpu_has_native_bf16


def cpu_model(cpuinfo: str) -> str:
    """The CPU's model name in /proc/cpuinfo's text ("" when it does not say)."""
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "model name" and value.strip():
            return " ".join(value.split())
    return ""


def _cpuinfo() -> str:
    try:
        return Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace")
    except OSError:  # not Linux
        return ""


def describe_machine() -> str:
    """e.g. "2-core Intel(R) Xeon(R) Processor, torch capability AVX512, native bf16, torch
    2.13.0" or, with a GPU, "... ; GPU NVIDIA H100 80GB HBM3"."""
    cores = usable_cores()
    cpu = cpu_model(_cpuinfo()) or "CPU"
    bf16 = "native bf16" if cpu_has_native_bf16() else "no native bf16"
    text = (
        f"{cores}-core {cpu}, torch capability {torch.backends.cpu.get_cpu_capability()}, "
        f"{bf16}, torch {torch.__version__}"
    )
    if torch.cuda.is_available():
        text += f"; GPU {torch.cuda.get_device_name(0)}"
    return text


def today() -> str:
    """The date in ISO form (UTC), as results files record it."""
    return datetime.datetime.now(datetime.UTC).date().isoformat()
