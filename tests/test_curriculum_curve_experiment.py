"""experiments/curriculum_curve.py: a curriculum run's metrics in blocks of steps."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

_SPEC = importlib.util.spec_from_file_location(
    "curriculum_curve", Path(__file__).parents[1] / "experiments" / "curriculum_curve.py"
)
curriculum_curve = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(curriculum_curve)


def _run(tmp_path: Path, curriculum: bool = True) -> Path:
    records = [{"step": 0, "val/frozenlake/success": 0.2}]
    for step in range(1, 7):
        record = {"step": step, "signal/pass_rate": step / 10, "signal/informative_groups": 1.0}
        if curriculum:
            record |= {
                "curriculum/moves": float(step),
                "curriculum/mean_start_moves": 1.0,
                "curriculum/full_task_groups": 0.5,
            }
        if step % 3 == 0:
            record["val/frozenlake/success"] = step / 20
        records.append(record)
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    return run


def test_blocks_average_their_steps_and_keep_their_validations(tmp_path):
    records = [json.loads(line) for line in (_run(tmp_path) / "metrics.jsonl").open()]
    rows = curriculum_curve.block_rows(records, block=4)
    assert [row["steps"] for row in rows] == [(0, 0), (1, 4), (5, 6)]
    assert rows[0]["val"] == {0: 0.2} and "k" not in rows[0]
    assert rows[1]["k"] == pytest.approx((1 + 2 + 3 + 4) / 4)
    assert rows[1]["pass rate"] == pytest.approx(0.25)
    assert rows[1]["val"] == {3: 0.15}
    assert rows[2]["k"] == pytest.approx(5.5) and rows[2]["val"] == {6: 0.3}
    table = curriculum_curve.format_rows(rows)
    assert "1-4 | 2.50 | 1.00 | 0.50 | 0.25 | 1.00 | 3: 0.15" in table


def test_the_command_prints_a_table_and_refuses_other_folders(tmp_path, capsys):
    assert curriculum_curve.main([str(_run(tmp_path)), "--block", "3"]) == 0
    assert "1-3 | 2.00" in capsys.readouterr().out
    (tmp_path / "plain").mkdir()
    plain = _run(tmp_path / "plain", curriculum=False)
    assert curriculum_curve.main([str(plain)]) == 2
    assert "not a curriculum run" in capsys.readouterr().err
    assert curriculum_curve.main([str(tmp_path / "missing")]) == 2
    assert "holds no metrics.jsonl records" in capsys.readouterr().err
    assert curriculum_curve.main([str(tmp_path / "run"), "--block", "0"]) == 2
    assert "--block must be at least 1" in capsys.readouterr().err
