"""The allocator settings: freed tensors stay in the heap for reuse until a rollout's KV
cache is released to the OS in one call."""

from __future__ import annotations

import os
import platform

import pytest
import torch

from starpo.memory.allocator import keep_freed_memory, release_free_memory

glibc_only = pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="mallopt is glibc's")


def resident_mb() -> float:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


@glibc_only
def test_freed_tensors_stay_resident_until_released():
    assert keep_freed_memory() is True
    release_free_memory()
    before = resident_mb()
    tensors = [torch.ones(1 << 20) for _ in range(64)]  # 64 x 4 MiB, below the mmap threshold
    grown = resident_mb() - before
    del tensors
    kept = resident_mb() - before
    assert grown > 200
    assert kept > 0.5 * grown  # freed into the heap: the next stage reuses those pages
    assert release_free_memory() is True
    assert resident_mb() - before < 0.25 * grown  # handed back to the OS


def test_they_never_raise():
    assert isinstance(keep_freed_memory(), bool)
    assert isinstance(release_free_memory(), bool)
