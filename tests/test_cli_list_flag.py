"""`ListFlag`: a list option, space- or comma-separated, that leaves a dotted override
written after it to the overrides instead of swallowing it."""

from __future__ import annotations

import argparse

import pytest

from starpo.cli.args import ListFlag, all_overrides


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="prog")
    p.add_argument("--seeds", action=ListFlag, kind=int, default=[1])
    p.add_argument("--arms", action=ListFlag, allowed=["a", "b", "c"], default=["a"])
    p.add_argument("--out")
    p.add_argument("overrides", nargs="*")
    return p


@pytest.mark.parametrize(
    ("argv", "seeds", "arms", "overrides"),
    [
        ([], [1], ["a"], []),
        (["--seeds", "2", "3", "--arms", "b,c"], [2, 3], ["b", "c"], []),
        (["--arms", "b", "c", "x.y=1", "z.w=2"], [1], ["b", "c"], ["x.y=1", "z.w=2"]),
        (["x.y=1", "--seeds", "4,5", "z.w=2"], [4, 5], ["a"], ["x.y=1", "z.w=2"]),
        (["--arms", "c", "x.y=1", "--out", "o", "p.q=3"], [1], ["c"], ["p.q=3", "x.y=1"]),
    ],
)
def test_lists_take_spaces_or_commas_and_overrides_stay_overrides(argv, seeds, arms, overrides):
    args = parser().parse_args(argv)
    assert (args.seeds, args.arms, all_overrides(args)) == (seeds, arms, overrides)


@pytest.mark.parametrize(
    ("argv", "error"),
    [
        (["--arms", "a,d"], "--arms: unknown 'd': choose from a, b, c"),
        (["--seeds", "1", "two"], "--seeds: 'two' is not a valid int"),
        (["--arms", "x.y=1"], "--arms needs at least one value"),
    ],
)
def test_a_bad_item_is_one_line_naming_the_flag(argv, error, capsys):
    with pytest.raises(SystemExit):
        parser().parse_args(argv)
    assert capsys.readouterr().err.splitlines()[-1] == f"prog: error: {error}"
