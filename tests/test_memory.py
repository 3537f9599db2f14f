"""The allocator setting that lets a freed rollout KV cache leave resident memory."""

from __future__ import annotations

import platform

import pytest

from starpo.memory import return_large_frees_to_os


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="mallopt is glibc's")
def test_glibc_takes_the_mmap_threshold():
    assert return_large_frees_to_os() is True


def test_it_never_raises():
    assert isinstance(return_large_frees_to_os(1 << 21), bool)
