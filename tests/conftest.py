"""Shared fixtures.

The test session gets its own STARPO_CACHE (a temp folder, shared by the pytest-xdist
workers of one run), so tests never read or write the user's ~/.cache/starpo. Nothing
heavy happens at start-up: the first test that needs the default model or its tokenizer
(`default_model`, `tiny_random_model()`, `load_tokenizer()`) converts the embedded GGUF
into that folder, once per run (~20 s; the other workers wait for it, see
`models.embedded.ensure_default_model`).
"""

from __future__ import annotations

import os
from collections import Counter
from pathlib import Path

import pytest

# Trainers in tests (and the `starpo` subprocesses they start) skip the CPU-sharing check:
# what the other xdist worker runs at that moment must not add a warning line to output a
# test checks (tests/test_cpu_sharing.py turns it back on).
os.environ["STARPO_CPU_CHECK"] = "0"

if os.environ.get("PYTEST_XDIST_WORKER"):
    # Under `pytest -n N` the N workers split the cores: one thread each (subprocesses
    # too), or torch's spinning OpenMP threads slow every worker down several times.
    os.environ["OMP_NUM_THREADS"] = "1"
    import torch

    torch.set_num_threads(1)


@pytest.fixture(autouse=True)
def _keep_torch_threads():
    """Give torch's thread count back after each test: a trainer set to
    trainer.num_threads=2 (the demo preset) would leave it for the rest of the worker."""
    import torch

    threads = torch.get_num_threads()
    yield
    if torch.get_num_threads() != threads:
        torch.set_num_threads(threads)


#: Test files that start Ray clusters: under pytest-xdist they share one worker, so two
#: local clusters never run at once on the machine.
RAY_MODULES = {
    "tests/distributed/test_rollout_workers.py",
    "tests/trainer/test_openenv_train.py",
    "tests/trainer/test_plugins.py",
    "tests/trainer/test_train_learners.py",
    "tests/trainer/test_train_workers.py",
}


#: The groups that take longest, longest first (CPU seconds of a `make test` run on a 2-core
#: machine, 2026-12-04; the Ray group waits most of its ~3 min on its actors): xdist hands
#: them out first, so no worker is left with one of them at the end while the other idles.
#: The other groups follow, most tests first (xdist's own order).
LONGEST_FIRST = [
    "ray",
    "tests/trainer/test_determinism.py",  # ~200 s
    "tests/test_planning.py",  # ~110 s
    "tests/trainer/test_crash_safety.py",  # ~70 s
    "tests/models/test_models.py",  # ~35 s (converts the default model)
    "tests/trainer/test_train_cli.py",  # ~35 s
    "tests/test_cli_fuzz_commands.py",  # ~20 s
    "tests/trainer/test_collapse.py",
    "tests/viewer/test_report.py",
    "tests/test_recipe.py",
    "tests/rollout/test_eval_cli.py",
]
# Not test_train_budget (~18 s): its resumed run must count the same real checkpoint-save
# seconds to 0.2 s, which it missed twice when it ran beside test_determinism's GB writes.


def pytest_configure(config):
    """xdist would order the groups by their number of tests, which sends the one-test files
    that run longest (test_determinism) last; `pytest_collection_modifyitems` orders them."""
    if hasattr(config.option, "loadscopereorder"):
        config.option.loadscopereorder = False


def _group(item) -> str:
    path = item.nodeid.split("::")[0]
    return "ray" if path in RAY_MODULES else path


@pytest.hookimpl(wrapper=True)
def pytest_collection_modifyitems(config, items):
    """Groups for `pytest -n N --dist loadgroup` (how `make test` runs): each test file
    runs whole on one worker, so module fixtures (a trained run, a Ray cluster) are built
    once, and the Ray files share one worker. Without xdist the marks change nothing.

    A wrapper: it marks before every other implementation runs (xdist's reads the marks),
    and checks after them that xdist did group: with pytest 9, xdist 3.8 writes the group
    into a field pytest no longer reads, and the groups were silently ignored (one file's
    tests on both workers, two Ray clusters at once), hence pyproject's pytest<9."""
    if os.environ.get("PYTEST_XDIST_WORKER"):  # the order xdist hands the groups out in
        groups = [_group(item) for item in items]
        sizes = Counter(groups)
        first = {group: index for index, group in reversed(list(enumerate(groups)))}
        rank = {group: index for index, group in enumerate(LONGEST_FIRST)}
        order = {g: (rank.get(g, len(rank)), -sizes[g], first[g]) for g in sizes}
        # sorted is stable: each group keeps its tests in their order
        keyed = sorted(zip(groups, items, strict=True), key=lambda pair: order[pair[0]])
        items[:] = [item for _, item in keyed]
    for item in items:
        item.add_marker(pytest.mark.xdist_group(_group(item)))
    result = yield
    if getattr(config.option, "loadgroup", False) and items and "@" not in items[0].nodeid:
        raise pytest.UsageError(
            "pytest-xdist's --dist loadgroup is not grouping tests with this pytest "
            f"({pytest.__version__}); install the versions pyproject.toml names"
        )
    return result


@pytest.fixture(scope="session", autouse=True)
def starpo_cache(tmp_path_factory):
    """Point STARPO_CACHE at a temp folder for the whole session: one for the run, shared
    by its xdist workers (their base temp folders are siblings), so the default model is
    converted once per run, not once per worker."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        root = tmp_path_factory.getbasetemp().parent / "starpo_cache"
        root.mkdir(exist_ok=True)
    else:
        root = tmp_path_factory.mktemp("starpo_cache")
    # STARPO_CPU_BF16=0: tests see a CPU without native bf16, so rollout.dtype=auto means
    # fp32 on every machine (CI's CPU may differ from a laptop's), subprocesses included;
    # tests of bf16 rollouts ask for them.
    settings = {"STARPO_CACHE": str(root), "STARPO_CPU_BF16": "0"}
    previous = {name: os.environ.get(name) for name in settings}
    os.environ.update(settings)
    yield root
    for name, value in previous.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


@pytest.fixture(scope="session")
def default_model(starpo_cache):
    """(model, tokenizer) of the embedded default model, converted and loaded once."""
    from starpo.models import load_model

    return load_model()


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> Path:
    """A tiny random policy saved as a Hugging Face folder (what `model.name=DIR`, `starpo
    sft --model DIR` and the recipe take); tests only read it."""
    from starpo.models import tiny_random_model

    folder = tmp_path_factory.mktemp("tiny-policy")
    model, tokenizer = tiny_random_model(seed=0)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def ray_cluster():
    """A local 2-CPU Ray instance for a module's tests that need one: started on first
    use, shut down after the module (even when tests fail), so no Ray processes outlive
    the tests that use them. Trainers join it (and leave it running) instead of starting
    their own."""
    ray = pytest.importorskip("ray")
    from starpo.distributed import connect

    assert not ray.is_initialized()
    connection = connect(num_cpus=2)
    assert connection.started_here
    try:
        yield connection
    finally:
        connection.close()
        assert not ray.is_initialized()
