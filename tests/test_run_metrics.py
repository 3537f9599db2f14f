"""starpo.runs.metrics: metrics.jsonl's one reader, its curves, and alerts.jsonl."""

from __future__ import annotations

from pathlib import Path

import pytest

from starpo.errors import UserError
from starpo.runs import metrics as run_metrics


def _metrics(run: Path, text: str) -> Path:
    run.mkdir(exist_ok=True)
    (run / "metrics.jsonl").write_text(text, encoding="utf-8")
    return run


def test_read_metrics_repeated_step_after_a_resume_keeps_the_last_record(tmp_path):
    # Steps 1-3, then a resume from step 1 that did not cut the file: 2 and 3 again.
    run = _metrics(
        tmp_path / "run",
        '{"step": 1, "x": 1.0}\n{"step": 2, "x": 2.0}\n{"step": 3, "x": 3.0}\n'
        '{"step": 2, "x": 20.0}\n{"step": 3, "x": 30.0, "y": 1}\n{"step": 4, "x": 40.0}\n',
    )
    assert run_metrics.read_metrics(run) == [
        {"step": 1, "x": 1.0},
        {"step": 2, "x": 20.0},
        {"step": 3, "x": 30.0, "y": 1},
        {"step": 4, "x": 40.0},
    ]
    curves = run_metrics.metric_curves(run_metrics.read_metrics(run))
    assert curves == {"x": ([1, 2, 3, 4], [1.0, 20.0, 30.0, 40.0]), "y": ([3], [1.0])}


def test_metric_curves_null_nan_and_inf_are_gaps_and_non_numbers_no_points(tmp_path):
    run = _metrics(
        tmp_path / "run",
        '{"step": 1, "a": 0.5, "b": null, "c": true, "d": "x", "e": [1]}\n'
        '{"step": 2, "a": NaN, "b": Infinity, "f": 3}\n{"step": 3, "a": -Infinity}\n',
    )
    curves = run_metrics.metric_curves(run_metrics.read_metrics(run))
    assert sorted(curves) == ["a", "b", "f"]  # a flag, a string, a list: no curve
    steps, values = curves["a"]
    assert steps == [1, 2, 3] and values[0] == 0.5 and all(v != v for v in values[1:])
    assert curves["b"][0] == [1, 2] and all(v != v for v in curves["b"][1])
    assert curves["f"] == ([2], [3.0])
    huge = run_metrics.metric_value(10**400)  # beyond float: NaN
    assert huge != huge
    assert run_metrics.metric_value(False) is None and run_metrics.metric_value(2) == 2.0


def test_read_metrics_torn_last_line_and_records_without_an_integer_step(tmp_path):
    run = _metrics(tmp_path / "run", '{"step": 2}\n{"step": 1}\n{"step": 3, "x"')
    assert run_metrics.read_metrics(run) == [{"step": 1}, {"step": 2}]  # in step order
    assert run_metrics.read_metrics(tmp_path / "missing") == []
    bad = '{"step": 1}\n{"x": 1}\n{"step": 2.0}\n{"step": true}\n{"step": 5}\n'
    _metrics(run, bad)
    with pytest.raises(UserError, match=r"metrics.jsonl:2 is not an object with an integer"):
        run_metrics.read_metrics(run)
    warnings: list[str] = []
    assert run_metrics.read_metrics(run, skip_broken=True, warnings=warnings) == [
        {"step": 1},
        {"step": 5},
    ]
    (warning,) = warnings
    assert "skipped 3 unreadable line(s) (first: line 2, an object without an integer" in warning


def test_read_alerts_keeps_file_order_and_every_alert_of_a_step(tmp_path):
    (tmp_path / "alerts.jsonl").write_text(
        '{"step": 5, "rule": "a"}\n{"step": 5, "rule": "b"}\n{"step": 2, "rule": "c"}\n'
    )
    assert [r["rule"] for r in run_metrics.read_alerts(tmp_path)] == ["a", "b", "c"]
    assert run_metrics.read_alerts(tmp_path / "missing") == []
