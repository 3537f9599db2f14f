"""The Ray cluster a run uses: a local instance started for it, or one it joins.

Without `ray.address` starpo starts Ray on this machine, sized to it, with every port on
`ray.host` (127.0.0.1 unless the user asks otherwise) and no dashboard unless asked, and
shuts it down when the run ends. `ray.address=auto` (or HOST:PORT) joins a cluster that
`ray start` runs; starpo leaves that one running.
"""

from __future__ import annotations

import os
import socket
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

from starpo.errors import UserError


def import_ray() -> ModuleType:
    """Ray, or a one-line error saying how to get it (only distributed runs need it)."""
    try:
        import ray
    except ImportError as exc:
        raise UserError(
            "rollout.workers > 0 and trainer.learners > 1 need Ray: pip install 'starpo[ray]' "
            "(or set rollout.workers=0 and trainer.learners=1)"
        ) from exc
    return ray


def first_line(exc: BaseException) -> str:
    """An exception's first message line (its type name when it has no message): what a
    one-line error quotes from Ray, gloo or a dead actor."""
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def ship_with_code(obj: Any) -> None:
    """Make Ray send the code of `obj`'s module along with it (by value) when its workers
    may be unable to import that module: code outside starpo and outside installed
    packages (a script, a notebook, a test, a project that is not pip-installed). A plugin
    env or backend factory defined there then reaches the workers as it is."""
    name = getattr(obj, "__module__", None) or ""
    module = sys.modules.get(name)
    if module is None or name == "__main__" or name.split(".")[0] == "starpo":
        return  # __main__ goes by value already; starpo is installed wherever Ray runs it
    path = str(getattr(module, "__file__", "") or "")
    if any(part in ("site-packages", "dist-packages") for part in Path(path).parts):
        return  # an installed package: the workers import it like the driver
    from ray import cloudpickle

    cloudpickle.register_pickle_by_value(module)


def local_init_kwargs(num_cpus: int | None, host: str, dashboard: bool) -> dict[str, Any]:
    """`ray.init` arguments of a local instance: its size, its listening address, quiet."""
    kwargs: dict[str, Any] = {
        "num_cpus": num_cpus or os.cpu_count() or 1,
        "include_dashboard": dashboard,
        "_node_ip_address": host,  # the raylet, object store and GCS listen here
        "log_to_driver": False,  # worker output stays in Ray's session logs
        "configure_logging": False,
    }
    if dashboard:
        kwargs["dashboard_host"] = host
    return kwargs


def check_reachable(address: str, timeout_s: float = 3.0) -> None:
    """Fail fast on a HOST:PORT nothing listens on (Ray itself retries for minutes)."""
    host, sep, port = address.rpartition(":")
    if not sep or address.startswith(("auto", "ray://")):
        return  # `auto` is checked by Ray at once; a ray:// client URL is Ray's to judge
    try:
        with socket.create_connection((host, int(port)), timeout=timeout_s):
            pass
    except (OSError, ValueError) as exc:
        raise UserError(
            f"ray.address={address}: no Ray cluster answers there ({exc}); start one with "
            "`ray start --head`, or unset ray.address for a local instance"
        ) from exc


#: Seconds to wait for CPUs that just-stopped actors still hold (Ray frees them late).
CPU_RELEASE_WAIT_S = 10.0

#: Seconds new actors get to start (import torch, unpickle a model) before the run stops.
ACTOR_START_TIMEOUT_S = 600.0


def require_free_cpus(need: int, what: str, fix: str) -> None:
    """Fail with one line when the cluster has fewer free CPUs than `need`: a Ray actor
    that cannot be placed would wait forever."""
    ray = import_ray()
    deadline = time.monotonic() + CPU_RELEASE_WAIT_S
    free = int(ray.available_resources().get("CPU", 0))
    while free < need and time.monotonic() < deadline:  # killed actors free theirs late
        time.sleep(0.2)
        free = int(ray.available_resources().get("CPU", 0))
    if free < need:
        total = int(ray.cluster_resources().get("CPU", 0))
        raise UserError(
            f"{what} needs {need} free CPUs in the Ray cluster; it has {free} free of "
            f"{total}: {fix}, or give Ray more (ray.num_cpus; more than the cores "
            "oversubscribes them)"
        )


def wait_started(futures: list, what: str) -> list:
    """`ray.get` of the actors' first calls, bounded: a clear line instead of a hang."""
    ray = import_ray()
    try:
        return ray.get(futures, timeout=ACTOR_START_TIMEOUT_S)
    except ray.exceptions.GetTimeoutError as exc:
        raise UserError(
            f"{what} did not start within {ACTOR_START_TIMEOUT_S:.0f} s; is the Ray cluster "
            "busy or short of memory? (`ray status` shows it)"
        ) from exc


@dataclass
class RayCluster:
    """The connection of one run; `close()` shuts down only an instance started here."""

    started_here: bool
    address: str

    def close(self) -> None:
        ray = import_ray()
        if self.started_here and ray.is_initialized():
            ray.shutdown()


def connect(
    address: str | None = None,
    *,
    num_cpus: int | None = None,
    host: str = "127.0.0.1",
    dashboard: bool = False,
) -> RayCluster:
    """Join `address`, or start a local instance when it is None.

    A process that already called `ray.init` (a notebook, a test) keeps its instance and
    starpo does not shut it down.
    """
    ray = import_ray()
    if ray.is_initialized():
        return RayCluster(started_here=False, address="existing")
    if address is None:
        ray.init(**local_init_kwargs(num_cpus, host, dashboard))
        return RayCluster(started_here=True, address="local")
    check_reachable(address)
    try:
        ray.init(address=address, log_to_driver=False, configure_logging=False)
    except (ConnectionError, RuntimeError, ValueError) as exc:
        raise UserError(
            f"ray.address={address}: cannot join a Ray cluster there ({first_line(exc)}); start "
            "one with `ray start --head`, or unset ray.address for a local instance"
        ) from exc
    return RayCluster(started_here=False, address=address)
