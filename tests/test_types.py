"""starpo.types: the record kinds of a trajectories file, told apart by one rule."""

from __future__ import annotations

import json

import pytest

from starpo.types import EnvStep, Episode, Trajectory, Turn, by_group, record_from_dict

TURN = Turn("s", "<answer>Up</answer>", "", ["Up"], ["Up"], True, 1.0, 1.0)


def test_a_record_with_turns_is_a_trajectory_and_with_steps_an_episode():
    traj = Trajectory(env_id="e", seed=3, group=1, turns=[TURN], success=True)
    episode = Episode(
        "e", 4, "solver", "start", [EnvStep("Up", "end", 1.0, True, False, True, True)]
    )
    assert record_from_dict(json.loads(traj.to_json())) == traj
    assert record_from_dict(json.loads(episode.to_json())) == episode
    # Only the key decides, 'turns' first: a trajectory without turns is still one.
    assert isinstance(
        record_from_dict({"env_id": "e", "seed": 0, "group": 0, "turns": []}), Trajectory
    )
    with pytest.raises(TypeError):  # 'turns' wins over 'steps', then fails as a Trajectory
        record_from_dict({**json.loads(episode.to_json()), "turns": []})


def test_neither_kind_is_a_value_error_and_the_input_is_left_alone():
    with pytest.raises(ValueError, match="neither 'turns'"):
        record_from_dict({"step": 1})
    record = json.loads(Trajectory(env_id="e", seed=0, group=0, turns=[TURN]).to_json())
    before = json.dumps(record)
    record_from_dict(record)
    assert json.dumps(record) == before  # derived keys and turn dicts still there


def test_by_group_buckets_in_group_order_keeping_input_order():
    trajs = [Trajectory(env_id="e", seed=s, group=g) for s, g in [(0, 2), (1, 0), (2, 2), (3, 1)]]
    groups = by_group(trajs)
    assert list(groups) == [0, 1, 2]
    assert [[t.seed for t in bucket] for bucket in groups.values()] == [[1], [3], [0, 2]]
    assert by_group([]) == {}
