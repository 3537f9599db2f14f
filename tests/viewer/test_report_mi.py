"""`starpo report`'s optional panels, the template-collapse probe's (RAGEN-2's,
diagnostics.mi_every) and the optimal-move rate's: drawn for runs that logged their
metrics, absent from runs that did not."""

from __future__ import annotations

import json
from pathlib import Path

from starpo.viewer.report import (
    OPTIONAL_PANELS,
    PANELS,
    build_figure,
    load_run,
    panel_series,
    run_panels,
    write_report,
)


def _run(root: Path, name: str, probe: bool) -> Path:
    """Ten steps; with `probe`, the probe's metrics every third step, accuracy falling."""
    run = root / name
    run.mkdir()
    lines = []
    for step in range(1, 11):
        record = {"step": step, "actor/entropy": 1.0, "train/bandit/success": 0.5}
        if probe and step % 3 == 0:
            for sample in ("first_turn", "uniform"):
                prefix = f"diagnostics/mi/{sample}/"
                record[prefix + "retrieval_acc"] = 1.0 - step / 12
                record[prefix + "chance"] = 0.125
                record[prefix + "mi"] = 2.0 - step / 6
        lines.append(json.dumps(record) + "\n")
    (run / "metrics.jsonl").write_text("".join(lines), encoding="utf-8")
    return run


def test_probe_panels_are_drawn_when_the_run_has_them(tmp_path):
    run = _run(tmp_path, "probed", probe=True)
    paths = write_report([run])
    names = {p.name for p in paths}
    assert {"mi_retrieval.png", "mi.png"} <= names
    data = load_run(run)
    retrieval, mi = (_panel(name) for name in ("mi_retrieval", "mi"))
    assert [label for label, _ in panel_series(data, retrieval)] == [
        "first turn",
        "uniform",
        "chance",
    ]
    assert panel_series(data, mi) == [
        ("first turn", "diagnostics/mi/first_turn/mi"),
        ("uniform", "diagnostics/mi/uniform/mi"),
    ]
    fig = build_figure([data], run_panels([data]))
    titles = [ax.get_title() for ax in fig.axes if ax.get_visible()]
    assert len(titles) == len(PANELS) + 2
    assert "Template collapse: retrieval accuracy" in titles
    steps, _ = data.series["diagnostics/mi/first_turn/retrieval_acc"]
    assert steps.tolist() == [3, 6, 9]  # only the probed steps


def test_runs_without_the_probe_get_no_probe_panels(tmp_path):
    run = _run(tmp_path, "plain", probe=False)
    names = {p.name for p in write_report([run])}
    assert not names & {"mi_retrieval.png", "mi.png"}
    assert run_panels([load_run(run)]) == PANELS
    # Compared with a probed run, the panels are there (the plain run draws nothing in them).
    both = [load_run(run), load_run(_run(tmp_path, "probed", probe=True))]
    assert run_panels(both) == (*PANELS, _panel("mi_retrieval"), _panel("mi"))


def _panel(name: str):
    return next(panel for panel in OPTIONAL_PANELS if panel.name == name)


def test_a_run_whose_env_judges_moves_gets_the_optimal_moves_panel(tmp_path):
    run = tmp_path / "judged"
    run.mkdir()
    records = [
        {"step": s, "train/frozenlake/optimal_action_rate": 0.3 + s / 100} for s in range(1, 6)
    ]
    records[-1]["val/frozenlake/optimal_action_rate"] = 0.4
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    assert "optimal_actions.png" in {p.name for p in write_report([run])}
    assert run_panels([load_run(run)]) == (*PANELS, _panel("optimal_actions"))
    assert [label for label, _ in panel_series(load_run(run), _panel("optimal_actions"))] == [
        "train",
        "val",
    ]


def test_a_curriculum_run_gets_the_signal_and_controller_panels(tmp_path):
    run = tmp_path / "curriculum"
    run.mkdir()
    records = [
        {
            "step": s,
            "signal/informative_groups": 0.5,
            "signal/all_failed_groups": 0.25,
            "signal/all_solved_groups": 0.25,
            "signal/pass_rate": 0.4 + s / 50,
            "curriculum/moves": 1.0 + s / 2,
            "curriculum/mean_start_moves": 1.0 + s / 2,
            "curriculum/target": 0.5,
        }
        for s in range(1, 6)
    ]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    names = {p.name for p in write_report([run])}
    assert {"signal.png", "curriculum.png", "curriculum_pass_rate.png"} <= names
    panels = run_panels([load_run(run)])
    assert panels == (
        *PANELS,
        *(_panel(n) for n in ("signal", "curriculum", "curriculum_pass_rate")),
    )
    assert panel_series(load_run(run), _panel("curriculum_pass_rate")) == [
        ("pass rate", "signal/pass_rate"),
        ("target", "curriculum/target"),
    ]


def test_a_decision_task_run_gets_the_answer_overuse_panel(tmp_path):
    run = tmp_path / "invoice"
    run.mkdir()
    records = [{"step": s, "train/invoice/answer_overuse": 0.1 * s} for s in range(1, 6)]
    records[-1]["val/invoice/answer_overuse"] = 0.3
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    assert "answers.png" in {p.name for p in write_report([run])}
    assert run_panels([load_run(run)]) == (*PANELS, _panel("answers"))
    assert panel_series(load_run(run), _panel("answers")) == [
        ("train", "train/invoice/answer_overuse"),
        ("val", "val/invoice/answer_overuse"),
    ]
