"""`cell_sep`: the grid envs can put spaces between the cells of a row, so that every cell
is a token of its own; the game, the solver and the rationales stay the same."""

from __future__ import annotations

import pytest

from starpo.envs import check_env, make
from starpo.errors import UserError

GRID_ENVS = ("sokoban", "frozenlake")


@pytest.mark.parametrize("env_id", GRID_ENVS)
def test_spaced_render_is_the_plain_render_with_spaces_between_cells(env_id):
    plain, spaced = make(env_id), make(env_id, cell_sep=" ")
    for seed in range(5):
        plain.reset(seed=seed)
        spaced.reset(seed=seed)
        for _ in range(4):  # the same moves lead to the same states, drawn apart
            expected = "\n".join(" ".join(row) for row in plain.render().splitlines())
            assert spaced.render() == expected
            action = plain.optimal_action() or plain.action_names[0]
            assert spaced.optimal_action() == plain.optimal_action()
            assert spaced.explain(action) == plain.explain(action)
            _, _, done, _, _ = plain.step(action)
            spaced.step(action)
            if done:
                break


def test_spaced_tokens_align_with_cells():
    """The reason for the option: SmolLM2's tokenizer merges "__" and "####" runs, so
    without spaces a token's position is not a cell's column; with them, each cell of a
    6x6 Sokoban row is one token."""
    from starpo.models import load_tokenizer

    tokenizer = load_tokenizer()
    env = make("sokoban", cell_sep=" ")
    env.reset(seed=0)
    for row in env.render().splitlines():
        assert len(tokenizer.encode(row, add_special_tokens=False)) == 6


@pytest.mark.parametrize("env_id", GRID_ENVS)
def test_spaced_env_passes_the_checker(env_id):
    assert check_env(make(env_id, cell_sep=" "), seeds=[0, 1, 2])


@pytest.mark.parametrize("bad", ["|", "\n", "    ", 1])
def test_bad_separator_is_a_one_line_error(bad):
    with pytest.raises(UserError, match="cell_sep must be empty or up to 3 spaces"):
        make("sokoban", cell_sep=bad)
