"""Whether a CPU job's torch threads will find free cores.

torch's CPU kernels split each matmul across `torch.get_num_threads()` threads and wait for
the slowest; when other processes hold the cores, a thread waits for the scheduler and the
whole matmul waits with it. On a 2-core machine a 2-thread Bandit run beside a 2-thread SFT
took 60-200 s a step instead of 15 s (4-13x), far worse than sharing the cores would
suggest.

The check samples the machine's CPU time for half a second and takes this process's own
share out of it (a demo's RL stage starts right after its SFT, in the same process), so
what is left is the cores other processes keep busy. It reads Linux's /proc and answers
only where /proc/stat counts the same CPUs this process may use (a container on a larger
host sees the host's CPUs there: no answer rather than a wrong one). `STARPO_CPU_CHECK=0`
in the environment skips it (a shared node where the sharing is known; the test suite,
whose other worker's load must not add lines to the output it checks). Stdlib-only.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path

#: The environment variable that turns the check off when set to 0.
SWITCH = "STARPO_CPU_CHECK"

#: How long the sample lasts (seconds): a few scheduler periods, unnoticed at start-up.
SAMPLE_SECONDS = 0.5


def usable_cores() -> int:
    """The cores this process may run on (its CPU affinity where the OS says)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def machine_ticks(stat_text: str) -> tuple[int, int, int]:
    """(busy ticks, all ticks, CPU count) of /proc/stat's text: busy is every column but
    idle and iowait, summed over the machine's CPUs (guest time is already in user time:
    only the first 8 columns count)."""
    lines = stat_text.splitlines()
    columns = [int(x) for x in lines[0].split()[1:9]]
    idle = columns[3] + (columns[4] if len(columns) > 4 else 0)
    cpus = sum(1 for line in lines if line.startswith("cpu") and line[3:4].isdigit())
    return sum(columns) - idle, sum(columns), cpus


def process_ticks(self_stat_text: str) -> int:
    """This process's user + system ticks (all its threads) of /proc/self/stat's text."""
    after_name = self_stat_text.rsplit(")", 1)[1].split()  # the name may hold spaces
    return int(after_name[11]) + int(after_name[12])  # fields 14 and 15: utime, stime


def read_proc() -> tuple[str, str]:
    """The texts of /proc/stat and /proc/self/stat, read back to back."""
    return Path("/proc/stat").read_text(), Path("/proc/self/stat").read_text()


def others_busy_cores(
    seconds: float = SAMPLE_SECONDS, read: Callable[[], tuple[str, str]] = read_proc
) -> float | None:
    """The cores other processes kept busy over `seconds`, or None where this cannot be
    read (no /proc, or /proc/stat counts other CPUs than this process may use)."""
    try:
        before = read()
        time.sleep(seconds)
        after = read()
        (busy0, total0, cpus), own0 = machine_ticks(before[0]), process_ticks(before[1])
        (busy1, total1, _), own1 = machine_ticks(after[0]), process_ticks(after[1])
    except (OSError, ValueError, IndexError):
        return None
    if cpus != usable_cores() or total1 <= total0:
        return None
    others = (busy1 - busy0) - (own1 - own0)
    return max(0.0, others / (total1 - total0) * cpus)


def oversubscription(
    threads: int, cores: int, others_busy: float | None, setting: str | None = "trainer.num_threads"
) -> str | None:
    """A warning when `threads` more threads would not fit the cores that other processes
    (`others_busy` cores) leave free; None when they fit or the load is unknown. `setting`:
    the option that sets the job's threads, advised when fewer would fit.

    Busy cores are rounded (a tenth of a core is background noise, not a core taken)."""
    if others_busy is None:
        return None
    busy = round(others_busy)
    if busy + threads <= cores:
        return None
    free = cores - busy
    advice = (
        f"set {setting}={free}"
        if setting and 0 < free < threads
        else "pause the other jobs (kill -STOP PID, later kill -CONT PID) or let them finish"
    )
    plural = "s" if threads > 1 else ""
    return (
        f"the CPU is shared: other processes keep {others_busy:.1f} of {cores} cores busy and "
        f"this job runs {threads} torch thread{plural}; a thread that waits for a core stalls "
        f"every matmul (2 threads beside a 2-thread job ran 4-13x slower on 2 cores): {advice}"
    )


def check_cpu_sharing(threads: int, setting: str | None = "trainer.num_threads") -> str | None:
    """`oversubscription` of this machine now (a `SAMPLE_SECONDS` sample); None when
    `STARPO_CPU_CHECK=0`."""
    if os.environ.get(SWITCH, "1").strip() == "0":
        return None
    return oversubscription(threads, usable_cores(), others_busy_cores(), setting)
