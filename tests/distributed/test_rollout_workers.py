"""Ray rollout workers against the in-process engine, on a local 2-CPU Ray cluster.

One cluster serves the module (started once, always shut down); the trainer joins it
rather than starting its own (a run started elsewhere is never shut down by starpo).
"""

from __future__ import annotations

import time

import pytest
import torch

from starpo.distributed import RolloutPool, connect, split_groups
from starpo.distributed.cluster import local_init_kwargs
from starpo.errors import UserError
from starpo.registry import GENERATION_BACKENDS
from starpo.rollout.engine import EpisodeSettings, RolloutEngine

ray = pytest.importorskip("ray")

SEEDS = [3, 4, 5]


@pytest.fixture(scope="module")
def cluster(ray_cluster):
    return ray_cluster


def _sharpened(model, scale: float):
    """A copy whose logits are `scale` times larger: a random tiny model's next-token
    distribution is nearly flat, and greedy decoding would then hinge on float noise."""
    copy = type(model)(model.config).eval()
    copy.load_state_dict(model.state_dict())
    with torch.no_grad():
        copy.lm_head.weight.mul_(scale)  # tied: the embeddings scale too (RMSNorm undoes it)
    return copy


@pytest.fixture(scope="module")
def flat_policy():
    """(model, tokenizer): the tiny random model, whose samples vary widely."""
    from starpo.models import tiny_random_model

    return tiny_random_model(seed=0)


@pytest.fixture(scope="module")
def policy(flat_policy):
    """A decisive greedy policy: its top token wins by a wide margin."""
    model, tokenizer = flat_policy
    return _sharpened(model, 40.0), tokenizer


def _local(model, tokenizer, settings, seed=7, seeds=SEEDS, group_size=2, starts=None):
    backend = GENERATION_BACKENDS["auto"](model, tokenizer, compute_dtype=torch.float32)
    backend.seed(seed)
    engine = RolloutEngine(backend, tokenizer, settings)
    return engine.run("sokoban", seeds, group_size, starts=starts)


def _pool(model, tokenizer, workers):
    backend = GENERATION_BACKENDS["auto"](model, tokenizer, compute_dtype=torch.float32)
    return RolloutPool(
        workers,
        model,
        tokenizer,
        backend="auto",
        compute_dtype=torch.float32,
        numerics=backend.numerics,
    )


def _remote(model, tokenizer, workers, settings, seed, starts=None):
    """One run of the seeds' groups (2 episodes each) on a fresh pool, then the pool closes."""
    pool = _pool(model, tokenizer, workers)
    try:
        pool.seed(seed)
        return pool.engine(settings).run("sokoban", SEEDS, 2, starts=starts)
    finally:
        pool.close()


def _same(a, b) -> bool:
    """Same episodes: tokens, groups and rewards exactly; log-probs to fp32 noise (a batch
    of other rows pads differently, which moves the last bits)."""
    exact = [(t.group, t.seed, t.token_ids, t.reward) for t in a] == [
        (t.group, t.seed, t.token_ids, t.reward) for t in b
    ]
    return exact and all(
        torch.allclose(torch.tensor(x.logprobs), torch.tensor(y.logprobs), atol=1e-5)
        for x, y in zip(a, b, strict=True)
    )


def test_split_groups_covers_every_group_once_in_order():
    assert split_groups(5, 2) == [range(0, 3), range(3, 5)]
    assert split_groups(2, 4) == [range(0, 1), range(1, 2)]  # no empty chunk
    for groups in range(1, 9):
        for workers in range(1, 5):
            chunks = split_groups(groups, workers)
            assert [g for c in chunks for g in c] == list(range(groups))
            assert max(map(len, chunks)) - min(map(len, chunks)) <= 1


def test_a_local_instance_listens_on_loopback_without_a_dashboard():
    kwargs = local_init_kwargs(None, "127.0.0.1", dashboard=False)
    assert kwargs["_node_ip_address"] == "127.0.0.1" and kwargs["include_dashboard"] is False
    assert kwargs["num_cpus"] >= 1
    assert local_init_kwargs(2, "127.0.0.1", dashboard=True)["dashboard_host"] == "127.0.0.1"


@pytest.mark.slow  # a Ray cluster and worker processes
def test_greedy_trajectories_equal_in_process_ones_with_two_workers(cluster, policy):
    model, tokenizer = policy
    settings = EpisodeSettings(max_turns=3, max_new_tokens=10, temperature=0.0, think=False)
    remote = _remote(model, tokenizer, 2, settings, seed=7)
    local = _local(model, tokenizer, settings)
    assert [t.group for t in remote] == [0, 0, 1, 1, 2, 2]
    assert _same(remote, local)


def test_groups_started_part_way_play_the_same_on_two_workers(cluster, policy):
    """The curriculum's per-group starts reach the workers: each group starts where it
    was told (one group from its own start), as in the in-process engine."""
    from starpo.envs import make
    from starpo.envs.start_states import solution_states, start_before_end

    model, tokenizer = policy
    env = make("sokoban")
    starts = [start_before_end(solution_states(env, seed), 1) for seed in SEEDS]
    starts[1] = None
    settings = EpisodeSettings(max_turns=2, max_new_tokens=10, temperature=0.0, think=False)
    remote = _remote(model, tokenizer, 2, settings, seed=7, starts=starts)
    local = _local(model, tokenizer, settings, starts=starts)
    assert [t.start for t in remote] == [s for s in starts for _ in range(2)]
    assert _same(remote, local)
    plain = _local(model, tokenizer, settings)
    assert remote[0].turns[0].state != plain[0].turns[0].state
    assert remote[2].turns[0].state == plain[2].turns[0].state


@pytest.mark.slow  # a Ray cluster and worker processes
def test_one_worker_samples_exactly_as_the_in_process_engine(cluster, flat_policy):
    model, tokenizer = flat_policy
    settings = EpisodeSettings(max_turns=2, max_new_tokens=10, temperature=1.0, think=False)
    remote = _remote(model, tokenizer, 1, settings, seed=11)
    local = _local(model, tokenizer, settings, seed=11)
    assert _same(remote, local)
    assert len({tuple(t.token_ids) for t in local}) > 1  # sampling really varied


@pytest.mark.slow  # a Ray cluster and worker processes
def test_new_weights_reach_the_workers_once_per_version(cluster, policy):
    model, tokenizer = policy
    settings = EpisodeSettings(max_turns=2, max_new_tokens=8, temperature=0.0, think=False)
    pool = _pool(model, tokenizer, 2)
    changed = _sharpened(model, 1.0)
    with torch.no_grad():
        changed.model.norm.weight.mul_(-1.0)  # negated logits: another greedy policy
    try:
        engine = pool.engine(settings)
        before = engine.run("sokoban", SEEDS, 1)
        assert pool.broadcast.versions_sent == 1
        pool.update_weights(changed, 1)
        pool.update_weights(changed, 1)  # same version: nothing new to send
        after = engine.run("sokoban", SEEDS, 1)
        engine.run("sokoban", SEEDS, 1)
        assert pool.broadcast.versions_sent == 2
        assert pool.broadcast.last_bytes == sum(
            p.numel() * p.element_size() for p in changed.parameters() if p.requires_grad
        )
    finally:
        pool.close()
    assert _same(after, _local(changed, tokenizer, settings, group_size=1))
    assert not _same(before, after)


class _DiesOnceItsChunkIsSent:
    """Stands in for a worker's actor handle: forwards every call, and kills the actor right
    after the step's chunk was sent to it, so it dies with that chunk in flight."""

    def __init__(self, actor) -> None:
        self.actor = actor
        self.run = self

    def remote(self, *args):
        future = self.actor.run.remote(*args)
        ray.kill(self.actor)
        return future

    def __getattr__(self, name):
        return getattr(self.actor, name)


@pytest.mark.slow  # a Ray cluster and worker processes
def test_a_worker_killed_mid_step_has_its_groups_rerun(cluster, policy):
    model, tokenizer = policy
    settings = EpisodeSettings(max_turns=4, max_new_tokens=16, temperature=0.0, think=False)
    pool = _pool(model, tokenizer, 2)
    try:
        engine = pool.engine(settings)
        engine.run("sokoban", SEEDS, 2)  # a first step: weights sent, both workers served
        pool.workers[1] = victim = _DiesOnceItsChunkIsSent(pool.workers[1])
        started = time.monotonic()
        remote = engine.run("sokoban", SEEDS, 2)
        assert time.monotonic() - started < 120
        assert pool.restarts == 1 and pool.workers[1] is not victim
        again = engine.run("sokoban", SEEDS, 2)  # the replacement serves on
        assert pool.restarts == 1
    finally:
        pool.close()
    local = _local(model, tokenizer, settings)
    assert _same(remote, local) and _same(again, local)


@pytest.mark.slow  # a Ray cluster and worker processes
def test_more_workers_than_cluster_cpus_is_a_one_line_error(cluster, policy, monkeypatch):
    from starpo.distributed import cluster as cluster_module

    monkeypatch.setattr(cluster_module, "CPU_RELEASE_WAIT_S", 1.0)  # no CPU frees up here
    model, tokenizer = policy
    with pytest.raises(UserError, match=r"rollout.workers=3 needs 3 free CPUs .* 2 free of 2"):
        _pool(model, tokenizer, 3)


def test_an_address_nothing_listens_on_fails_fast():
    started = time.monotonic()
    with pytest.raises(UserError, match=r"ray.address=127.0.0.1:1: no Ray cluster answers"):
        connect("127.0.0.1:1") if not ray.is_initialized() else _check("127.0.0.1:1")
    assert time.monotonic() - started < 10


def _check(address: str) -> None:
    from starpo.distributed.cluster import check_reachable

    check_reachable(address)
