"""The CPU-sharing check: the sample of other processes' busy cores, the warning, and the
trainer printing it before its model loads."""

from __future__ import annotations

from pathlib import Path

import pytest

from starpo.compute import cpu_sharing
from starpo.compute.cpu_sharing import (
    machine_ticks,
    oversubscription,
    process_ticks,
)
from starpo.trainer.loop import Trainer

#: user nice system idle iowait irq softirq steal guest guest_nice, then two CPUs.
STAT = (
    "cpu  {busy} 0 0 {idle} 5 0 0 0 70 0\n"
    "cpu0 1 0 0 1 0 0 0 0 0 0\ncpu1 1 0 0 1 0 0 0 0 0 0\nintr 9\n"
)
#: pid (comm) state ppid ... utime is field 14, stime 15; the name holds ") (".
SELF = "42 (a) (b) R 1 1 1 0 -1 4194560 100 0 0 0 {utime} {stime} 0 0 20 0 3 0 7\n"


def test_machine_ticks_leave_out_idle_iowait_and_guest():
    busy, total, cpus = machine_ticks(STAT.format(busy=300, idle=600))
    assert (busy, total, cpus) == (300, 905, 2)  # guest (70) is inside user already


def test_process_ticks_read_past_a_name_with_parentheses_and_spaces():
    assert process_ticks(SELF.format(utime=12, stime=3)) == 15


def test_other_processes_busy_cores_leave_this_process_out(monkeypatch):
    """Over the sample the machine's two CPUs spent 150 of 200 ticks busy, 100 of them in
    this process: the others kept half a core busy."""
    readings = iter(
        [
            (STAT.format(busy=1000, idle=1000), SELF.format(utime=500, stime=0)),
            (STAT.format(busy=1150, idle=1050), SELF.format(utime=580, stime=20)),
        ]
    )
    monkeypatch.setattr(cpu_sharing, "usable_cores", lambda: 2)
    busy = cpu_sharing.others_busy_cores(0.0, read=lambda: next(readings))
    assert busy == pytest.approx(0.5)


def test_no_answer_where_proc_stat_counts_other_cpus_or_cannot_be_read(monkeypatch):
    """A container on a 64-core host sees the host's CPUs in /proc/stat."""
    same = (STAT.format(busy=1, idle=1), SELF.format(utime=1, stime=1))
    monkeypatch.setattr(cpu_sharing, "usable_cores", lambda: 64)
    assert cpu_sharing.others_busy_cores(0.0, read=lambda: same) is None

    def unreadable():
        raise OSError("no /proc here")

    assert cpu_sharing.others_busy_cores(0.0, read=unreadable) is None


def test_this_machine_gives_a_busy_share_within_its_cores_or_none():
    busy = cpu_sharing.others_busy_cores(0.05)
    assert busy is None or 0.0 <= busy <= cpu_sharing.usable_cores() + 0.5


@pytest.mark.parametrize(
    ("threads", "cores", "busy", "advice"),
    [
        (2, 2, 0.4, None),  # background noise: the cores are free
        (1, 2, 1.0, None),  # one job on each core
        (4, 8, None, None),  # unknown load: no warning
        (2, 2, 1.0, "set trainer.num_threads=1"),
        (2, 2, 2.0, "pause the other jobs"),  # no core free: fewer threads do not help
        (1, 2, 1.6, "pause the other jobs"),
    ],
)
def test_the_warning_says_how_many_threads_fit(threads, cores, busy, advice):
    said = oversubscription(threads, cores, busy)
    if advice is None:
        assert said is None
    else:
        assert advice in said and f"{busy:.1f} of {cores} cores" in said
        assert "\n" not in said


def test_jobs_without_a_thread_setting_are_told_to_pause_the_others():
    said = oversubscription(2, 2, 1.0, setting=None)
    assert "pause the other jobs" in said and "num_threads" not in said


def test_the_trainer_warns_before_its_model_loads_unless_switched_off(
    tmp_path: Path, monkeypatch, capsys
):
    from tests.trainer.conftest import bandit_config, bigram_bandit_model

    monkeypatch.setattr(cpu_sharing, "others_busy_cores", lambda: 2.0)
    monkeypatch.setattr(cpu_sharing, "usable_cores", lambda: 2)
    cfg = bandit_config("grpo", total_steps=1, **{"trainer.num_threads": "1"})
    model, tokenizer = bigram_bandit_model()

    monkeypatch.setenv(cpu_sharing.SWITCH, "1")
    Trainer(cfg, tmp_path / "on", model=model, tokenizer=tokenizer, quiet=True)
    err = capsys.readouterr().err
    assert err.count("warning: the CPU is shared") == 1 and "2.0 of 2 cores" in err

    monkeypatch.setenv(cpu_sharing.SWITCH, "0")
    Trainer(cfg, tmp_path / "off", model=model, tokenizer=tokenizer, quiet=True)
    assert "CPU is shared" not in capsys.readouterr().err
