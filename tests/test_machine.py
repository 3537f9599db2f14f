"""The one-line machine description results files carry: the CPU's name read from
/proc/cpuinfo's text, and the facts every published figure must name."""

from __future__ import annotations

import torch

from starpo.compute import machine
from starpo.compute.machine import cpu_model, describe_machine

CPUINFO = (
    "processor\t: 0\nvendor_id\t: AuthenticAMD\nmodel name\t: AMD  EPYC 7B13 64-Core Processor\n"
    "flags\t\t: fpu avx2\n\nprocessor\t: 1\nmodel name\t: AMD  EPYC 7B13 64-Core Processor\n"
)


def test_the_cpu_model_is_read_from_cpuinfo_with_its_spaces_collapsed():
    assert cpu_model(CPUINFO) == "AMD EPYC 7B13 64-Core Processor"
    assert cpu_model("processor\t: 0\nflags\t: avx2\n") == ""  # some ARM kernels say nothing


def test_the_description_names_cores_capability_bf16_and_torch(monkeypatch):
    monkeypatch.setattr(machine, "_cpuinfo", lambda: CPUINFO)
    monkeypatch.setattr(machine, "usable_cores", lambda: 2)
    monkeypatch.setattr(machine, "cpu_has_native_bf16", lambda: False)
    text = describe_machine()
    assert text.startswith("2-core AMD EPYC 7B13 64-Core Processor, ")
    assert f"torch capability {torch.backends.cpu.get_cpu_capability()}" in text
    assert "no native bf16" in text and f"torch {torch.__version__}" in text
    monkeypatch.setattr(machine, "cpu_has_native_bf16", lambda: True)
    monkeypatch.setattr(machine, "_cpuinfo", lambda: "")
    assert describe_machine().startswith("2-core CPU, ") and ", native bf16," in describe_machine()
