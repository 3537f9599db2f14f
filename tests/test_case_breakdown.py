"""experiments/case_breakdown.py: success per case family, each case made again from its seed."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

from starpo.envs import make

_SPEC = importlib.util.spec_from_file_location(
    "case_breakdown", Path(__file__).parents[1] / "experiments" / "case_breakdown.py"
)
case_breakdown = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(case_breakdown)


def _eval_folder(folder: Path, wins: dict[int, bool]) -> Path:
    folder.mkdir()
    lines = [json.dumps({"env_id": "invoice", "seed": s, "success": w}) for s, w in wins.items()]
    (folder / "trajectories.jsonl").write_text("\n".join(lines) + "\n")
    return folder


def test_episodes_are_grouped_by_their_cases_family(tmp_path, capsys):
    wins = {seed: seed % 3 == 0 for seed in range(30)}
    folder = _eval_folder(tmp_path / "sft-eval", wins)
    env = make("invoice")
    expected: dict[str, list[bool]] = {}
    for seed, won in wins.items():
        expected.setdefault(env.reset(seed=seed)[1]["problem"], []).append(won)
    assert len(expected) > 2  # the seeds cover several problem types
    table = case_breakdown.breakdown([folder], "problem", {})
    assert set(table) == set(expected)
    for family, outcomes in expected.items():
        cell = table[family][str(folder)]
        assert cell["episodes"] == len(outcomes)
        assert cell["success"] == sum(outcomes) / len(outcomes)
        assert cell["ci95"][0] <= cell["success"] <= cell["ci95"][1]
    assert case_breakdown.main([str(folder), "--key", "problem"]) == 0
    assert "sft-eval" in capsys.readouterr().out


def test_a_key_the_env_does_not_report_is_one_line(tmp_path, capsys):
    folder = _eval_folder(tmp_path / "e", {0: True})
    assert case_breakdown.main([str(folder), "--key", "colour"]) == 2
    assert capsys.readouterr().err.strip() == (
        "case_breakdown: error: invoice's reset info has no 'colour'; it has: success, "
        "steps_left, problem"
    )
    assert case_breakdown.main([str(tmp_path / "missing"), "--key", "problem"]) == 2
    assert "not found" in capsys.readouterr().err
