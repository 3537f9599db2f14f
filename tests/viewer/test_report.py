"""`starpo report`: PNG plots of runs, read from hand-written metrics/alerts files."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import matplotlib.image
import numpy as np
import pytest

from starpo.errors import UserError
from starpo.viewer.report import (
    PANELS,
    build_figure,
    legend_columns,
    load_run,
    panel_series,
    report_main,
    write_report,
)

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
PANEL_FILES = {f"{panel.name}.png" for panel in PANELS}


def _write_jsonl(path: Path, records: list[dict], tail: str = "") -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in records) + tail, encoding="utf-8")


def _make_run(root: Path, name: str, collapse: bool) -> Path:
    """A 30-step run; a collapsing one loses success, std and entropy after step 15."""
    run = root / name
    run.mkdir(parents=True)
    records = []
    for step in range(1, 31):
        late = collapse and step > 15
        success = 0.1 if late else step / 30
        record = {
            "step": step,
            "train/bandit/success": success,
            "train/bandit/reward": 2 * success - 1,
            "rollout/in_group_std": 0.0 if late else 0.5,
            "rollout/kept_in_group_std": 0.1 if late else 0.6,
            "actor/entropy": None if step == 10 else (0.1 if late else 2.0 - step / 30),
            "actor/grad_norm": 5.0 if late else 1.0 + 0.1 * (step % 3),
            "train/bandit/mean_response_tokens": 40.0 - step if collapse else 40.0 + step,
            "train/bandit/mean_think_tokens": 20.0,
            "diagnostics/state": 2 if late else 0,
        }
        if step % 5 == 0:
            record["val/bandit/success"] = success
            record["val/bandit/success_ci95_low"] = max(0.0, success - 0.1)
            record["val/bandit/success_ci95_high"] = min(1.0, success + 0.1)
        records.append(record)
    # A run killed mid-write leaves half a line at the end.
    _write_jsonl(run / "metrics.jsonl", records, tail='{"step": 31, "train/ban')
    if collapse:
        alerts = [
            {"step": 12, "state": "warning", "rule": "std_drop", "severity": "warning",
             "message": "in-group reward std is falling"},
            {"step": 18, "state": "collapse", "rule": "entropy", "severity": "collapse",
             "message": "entropy collapsed"},
        ]  # fmt: skip
        _write_jsonl(run / "alerts.jsonl", alerts)
    return run


def _assert_png(path: Path) -> None:
    """A real, non-blank PNG that matplotlib reads back."""
    data = path.read_bytes()
    assert data[:8] == PNG_SIGNATURE, path
    assert len(data) > 5_000, path
    image = matplotlib.image.imread(path)
    assert image.ndim == 3 and image.shape[0] > 100 and image.shape[1] > 100
    assert float(np.var(image)) > 0, f"{path} is blank"


def _alert_lines(fig) -> list:
    return [
        line for ax in fig.axes for line in ax.lines if (line.get_gid() or "").startswith("alert-")
    ]


def test_single_run_writes_overview_and_panels(tmp_path):
    run = _make_run(tmp_path, "collapsing", collapse=True)
    paths = write_report([run])
    assert paths[0] == run / "report" / "overview.png"
    assert {p.name for p in paths} == {"overview.png"} | PANEL_FILES
    for path in paths:
        _assert_png(path)


def test_half_written_last_line_is_ignored_and_nulls_are_gaps(tmp_path):
    run = load_run(_make_run(tmp_path, "collapsing", collapse=True))
    steps, values = run.series["train/bandit/success"]
    assert steps.tolist() == list(range(1, 31))
    entropy_steps, entropy = run.series["actor/entropy"]
    assert 10 in entropy_steps.tolist() and np.isnan(entropy[entropy_steps == 10]).all()
    assert [(a.step, a.severity) for a in run.alerts] == [(12, "warning"), (18, "collapse")]


def test_alert_markers_are_drawn_in_every_panel(tmp_path):
    collapsing = load_run(_make_run(tmp_path, "collapsing", collapse=True))
    healthy = load_run(_make_run(tmp_path, "healthy", collapse=False))
    fig = build_figure([collapsing])
    lines = _alert_lines(fig)
    assert len(lines) == 2 * len(PANELS)  # one warning + one collapse per panel
    assert {line.get_gid() for line in lines} == {"alert-warning", "alert-collapse"}
    assert {line.get_xdata()[0] for line in lines} == {12, 18}
    assert _alert_lines(build_figure([healthy])) == []


def test_alerts_of_consecutive_steps_draw_one_line_where_the_spell_starts(tmp_path):
    from starpo.viewer.report import alert_spells

    assert alert_spells([5, 3, 4, 9, 10, 12, 4]) == [(3, 5), (9, 10), (12, 12)]
    run = load_run(_make_run(tmp_path, "collapsing", collapse=True))
    run.alerts = [replace(run.alerts[0], step=step) for step in range(20, 31)]
    lines = _alert_lines(build_figure([run]))
    assert len(lines) == len(PANELS)  # one spell of 11 warnings: one line per panel
    assert {line.get_xdata()[0] for line in lines} == {20}


def test_comparison_of_two_runs_writes_compare_png(tmp_path, monkeypatch):
    a = _make_run(tmp_path, "collapsing", collapse=True)
    b = _make_run(tmp_path, "healthy", collapse=False)
    monkeypatch.chdir(tmp_path)
    paths = write_report([a, b])
    assert paths[0] == Path("report-compare") / "compare.png"
    assert {p.name for p in paths} == {"compare.png"} | PANEL_FILES
    for path in paths:
        _assert_png(path)
    fig = build_figure([load_run(a), load_run(b)])
    legend_texts = [t.get_text() for t in fig.legends[0].get_texts()]
    assert "collapsing" in legend_texts and "healthy" in legend_texts


def test_the_legend_of_five_long_named_runs_stays_inside_the_figure(tmp_path):
    names = ["starpo-s-seed1", "vanilla-grpo-seed1", "vanilla-ppo-seed1",
             "starpo-s-rollback-seed1", "starpo-s-no-std-seed1"]  # fmt: skip
    runs = [load_run(_make_run(tmp_path, name, collapse=True)) for name in names]
    fig = build_figure(runs)
    fig.canvas.draw()  # lays the legend out (Agg)
    legend = fig.legends[0].get_window_extent()
    figure = fig.bbox
    assert figure.x0 <= legend.x0 and legend.x1 <= figure.x1  # was cut at both edges
    assert legend_columns(["alert: collapse (starpo-s-rollback-seed1)"], 13.2, 8) == 3
    assert legend_columns(["alert: warning"], 13.2, 8) == 8  # one run: short labels


def test_out_dir_is_used(tmp_path):
    run = _make_run(tmp_path, "healthy", collapse=False)
    paths = write_report([run], tmp_path / "elsewhere")
    assert all(p.parent == tmp_path / "elsewhere" for p in paths)


def test_partial_metrics_skip_missing_panels(tmp_path):
    run = tmp_path / "partial"
    run.mkdir()
    _write_jsonl(run / "metrics.jsonl", [{"step": s, "actor/entropy": 1.0 / s} for s in (1, 2, 3)])
    paths = write_report([run])
    assert {p.name for p in paths} == {"overview.png", "entropy.png"}
    for path in paths:
        _assert_png(path)
    fig = build_figure([load_run(run)])
    no_data = [ax for ax in fig.axes if any(t.get_text() == "no data" for t in ax.texts)]
    assert len(no_data) == len(PANELS) - 1


def test_env_name_is_found_by_pattern(tmp_path):
    run = tmp_path / "two_envs"
    run.mkdir()
    _write_jsonl(
        run / "metrics.jsonl",
        [{"step": 1, "train/sokoban/success": 0.5, "train/frozen/success": 0.2}],
    )
    success = next(panel for panel in PANELS if panel.name == "success")
    assert panel_series(load_run(run), success) == [
        ("train frozen", "train/frozen/success"),
        ("train sokoban", "train/sokoban/success"),
    ]


def test_missing_folder_is_a_one_line_user_error(tmp_path):
    with pytest.raises(UserError) as info:
        write_report([tmp_path / "nope"])
    assert "nope" in str(info.value) and "\n" not in str(info.value)


def test_folder_without_metrics_is_a_one_line_user_error(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(UserError) as info:
        write_report([tmp_path / "empty"])
    message = str(info.value)
    assert "empty" in message and "not a training run folder" in message
    assert "\n" not in message


def test_broken_line_in_the_middle_is_skipped_with_a_count(tmp_path, capsys):
    run = tmp_path / "broken"
    run.mkdir()
    (run / "metrics.jsonl").write_text('{"step": 1}\n{oops\n{"step": 3}\n', encoding="utf-8")
    paths = write_report([run])
    assert all(p.is_file() for p in paths)
    err = capsys.readouterr().err
    assert err.count("warning: ") == 1 and "metrics.jsonl: skipped 1 unreadable line(s)" in err
    assert "first: line 2" in err


def test_repeated_step_keeps_its_last_record_and_a_stepless_line_is_skipped(tmp_path):
    run = tmp_path / "resumed"
    run.mkdir()
    _write_jsonl(
        run / "metrics.jsonl",
        [
            {"step": 1, "actor/entropy": 1.0, "timing_s/step": 60.0},
            {"step": 2, "actor/entropy": 0.9, "timing_s/step": 60.0},
            {"step": 2, "actor/entropy": 0.5, "timing_s/step": 60.0},  # after a resume
            {"actor/entropy": 7.0},  # no step: was a UserError, now skipped like a bad line
            {"step": 3, "actor/entropy": 0.4, "timing_s/step": 60.0},
        ],
    )
    loaded = load_run(run)
    steps, values = loaded.series["actor/entropy"]
    assert steps.tolist() == [1, 2, 3] and values.tolist() == [1.0, 0.5, 0.4]
    assert loaded.minutes[1].tolist() == [1.0, 2.0, 3.0]  # the repeat is not charged twice
    (warning,) = loaded.warnings
    assert "line 4, an object without an integer 'step'" in warning


def test_half_written_last_line_is_skipped_and_reported(tmp_path, capsys):
    run = _make_run(tmp_path, "crashed", collapse=True)  # metrics.jsonl ends in half a line
    with open(run / "alerts.jsonl", "a", encoding="utf-8") as f:
        f.write('{"step": 25, "sever')
    loaded = load_run(run)
    assert loaded.series["train/bandit/success"][0].tolist() == list(range(1, 31))
    assert [a.step for a in loaded.alerts] == [12, 18]
    assert len(loaded.warnings) == 2
    assert all("half-written last line" in w for w in loaded.warnings)
    paths = write_report([run], tmp_path / "out")
    assert paths[0] == tmp_path / "out" / "overview.png" and paths[0].is_file()
    err = capsys.readouterr().err
    assert err.count("warning: ") == 2 and "metrics.jsonl" in err and "alerts.jsonl" in err


def test_invalid_utf8_inside_metrics_is_replaced_and_reported_once(tmp_path, capsys):
    run = tmp_path / "bytes"
    run.mkdir()
    (run / "metrics.jsonl").write_bytes(
        b'{"step": 1}\n{"step": 2, "x": "\xff"}\n{"step": 3, "y": "\xfe"}\n'
    )
    assert [p.name for p in write_report([run])][0] == "overview.png"
    err = capsys.readouterr().err
    assert err.count("warning: ") == 1
    assert "replaced bytes that are not UTF-8 with U+FFFD in 2 line(s) (first: line 2)" in err


def test_report_main_prints_paths(tmp_path, capsys):
    run = _make_run(tmp_path, "healthy", collapse=False)
    assert report_main([str(run)], str(tmp_path / "out")) == 0
    printed = capsys.readouterr().out.split()
    assert printed[0] == str(tmp_path / "out" / "overview.png")
    assert all(Path(p).is_file() for p in printed)


def test_report_does_not_import_torch_or_pyplot():
    # A fresh interpreter: other tests in this session may have loaded torch already.
    code = (
        "import sys, starpo.viewer.report; "
        "print('torch' in sys.modules, 'matplotlib.pyplot' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "False"]


def test_report_cli_writes_pngs_and_fails_in_one_line(tmp_path):
    import subprocess
    import sys

    run = tmp_path / "run"
    run.mkdir()
    rows = [
        {"step": s, "train/bandit/success": s / 10, "actor/entropy": 1 - s / 20} for s in range(10)
    ]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    ok = subprocess.run(
        [sys.executable, "-m", "starpo", "report", str(run)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert ok.returncode == 0, ok.stderr
    assert (run / "report" / "overview.png").is_file()
    bad = subprocess.run(
        [sys.executable, "-m", "starpo", "report", str(tmp_path / "nope")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert bad.returncode == 2 and "Traceback" not in bad.stderr


# ------------------------------------------------------------------ --x minutes
def _timed_run(root: Path, name: str, step_s: float, logged: bool) -> Path:
    """Six steps of `step_s` training seconds, a 100-s validation every third step (not
    training time), a step-0 validation, and an alert at step 4. `logged`: the run logs
    perf/train_minutes (else the report derives it from the step timings)."""
    run = root / name
    run.mkdir()
    records = [{"step": 0, "val/bandit/success": 0.0, "timing_s/validation": 100.0}]
    for step in range(1, 7):
        record = {"step": step, "train/bandit/success": step / 6, "timing_s/step": step_s}
        if step % 3 == 0:
            record.update({"val/bandit/success": step / 6, "timing_s/validation": 100.0})
            record["timing_s/step"] += 100.0
        if logged:
            record["perf/train_minutes"] = step * step_s / 60
        records.append(record)
    _write_jsonl(run / "metrics.jsonl", records)
    _write_jsonl(run / "alerts.jsonl", [{"step": 4, "severity": "warning", "rule": "entropy"}])
    return run


def _line_x(fig, title: str, label: str) -> list[float]:
    ax = next(ax for ax in fig.axes if ax.get_title() == title)
    return list(next(line for line in ax.lines if line.get_label() == label).get_xdata())


@pytest.mark.parametrize("logged", [True, False])
def test_minutes_axis_places_steps_at_their_training_minutes(tmp_path, logged):
    run = load_run(_timed_run(tmp_path, "run", step_s=30.0, logged=logged))
    fig = build_figure([run], x="minutes")
    assert _line_x(fig, "Success rate", "train") == pytest.approx([0.5, 1, 1.5, 2, 2.5, 3])
    assert _line_x(fig, "Success rate", "val") == pytest.approx([0.0, 1.5, 3.0])  # val excluded
    assert [line.get_xdata()[0] for line in _alert_lines(fig)] == pytest.approx([2.0] * len(PANELS))
    assert {ax.get_xlabel() for ax in fig.axes if ax.get_visible()} == {"training minutes"}
    steps = build_figure([run])  # the default stays steps
    assert _line_x(steps, "Success rate", "train") == [1, 2, 3, 4, 5, 6]


def test_minutes_axis_compares_runs_at_the_same_budget(tmp_path):
    fast = _timed_run(tmp_path, "fast", step_s=30.0, logged=True)
    slow = _timed_run(tmp_path, "slow", step_s=90.0, logged=False)
    paths = write_report([fast, slow], tmp_path / "cmp", x="minutes")
    assert {p.name for p in paths} == {"compare.png", "success.png"}
    for path in paths:
        _assert_png(path)
    fig = build_figure([load_run(fast), load_run(slow)], x="minutes")
    ax = next(ax for ax in fig.axes if ax.get_title() == "Success rate")
    ends = sorted(line.get_xdata()[-1] for line in ax.lines if line.get_gid() is None)
    assert ends == pytest.approx([3.0, 3.0, 9.0, 9.0])  # train and val of each run


def test_minutes_axis_needs_step_timings(tmp_path):
    run = _make_run(tmp_path, "untimed", collapse=False)  # no timing_s/* at all
    with pytest.raises(UserError) as info:
        write_report([run], x="minutes")
    message = str(info.value)
    assert "untimed" in message and "--x steps" in message and "\n" not in message
    assert not (run / "report").exists()


def test_report_cli_takes_x_minutes(tmp_path, capsys):
    from starpo import cli

    run = _timed_run(tmp_path, "run", step_s=30.0, logged=True)
    assert cli.main(["report", str(run), "--x", "minutes", "--out", str(tmp_path / "o")]) == 0
    assert capsys.readouterr().out.split()[0] == str(tmp_path / "o" / "overview.png")
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["report", str(run), "--x", "hours"])
    assert exit_info.value.code == 2
    assert "invalid choice: 'hours'" in capsys.readouterr().err
