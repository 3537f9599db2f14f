"""experiments/echo_trap.py: a run's row from its folder, and the export a results page cites."""

from __future__ import annotations

import gzip
import importlib.util
import json
from pathlib import Path

_SPEC = importlib.util.spec_from_file_location(
    "echo_trap", Path(__file__).parents[1] / "experiments" / "echo_trap.py"
)
echo_trap = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(echo_trap)


def _fake_run(
    out: Path,
    arm: str,
    seed: int,
    val: dict[int, float],
    rollbacks: int = 0,
    think: dict[int, float] | None = None,
) -> Path:
    """A run folder as `starpo train` leaves it: metrics every step, validation every 5
    (with `think`: the validation's reasoning length at those steps)."""
    folder = echo_trap.run_dir(out, arm, seed)
    folder.mkdir(parents=True)
    records = []
    for step in range(max(val) + 1):
        record = {"step": step, "actor/entropy": 1.0 / (step + 1), "perf/train_minutes": step / 6}
        record["diagnostics/rollbacks"] = rollbacks if step >= 40 else 0
        if step in val:
            record["val/bandit/success"] = val[step]
            record["val/bandit/mean_think_tokens"] = (think or {}).get(step, 0.0)
        records.append(record)
    (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    alerts = [
        {"step": 30, "rule": "entropy", "severity": "warning", "state": "warning"},
        {"step": 45, "rule": "reward_collapse", "severity": "collapse", "state": "collapse"},
    ]
    (folder / "alerts.jsonl").write_text("".join(json.dumps(a) + "\n" for a in alerts))
    (folder / "config.yaml").write_text(f"trainer:\n  seed: {seed}\n")
    return folder


def test_a_rows_collapse_alerts_and_rollbacks_come_from_its_folder(tmp_path):
    val = {0: 0.1, 10: 0.9, 20: 1.0, 30: 0.95, 40: 0.5, 50: 0.52}
    _fake_run(tmp_path, "starpo-s-rollback", 1, val, rollbacks=1)
    _fake_run(tmp_path, "starpo-s", 1, {0: 0.1, 10: 0.6, 20: 0.7})
    rows = echo_trap.summarise(tmp_path, [1])["rows"]
    lost = rows["starpo-s-rollback seed 1"]
    assert lost["collapse_step"] == 40  # 50 points under its best and staying there
    assert (lost["best_success"], lost["final_success"]) == (1.0, 0.52)
    assert (lost["first_alert_step"], lost["detector_collapse_step"]) == (30, 45)
    assert (lost["rollbacks"], lost["steps"]) == (1, 50)
    assert lost["detector_collapse_steps"] == [45]
    held = rows["starpo-s seed 1"]
    assert held["collapse_step"] is None and held["rollbacks"] == 0


def test_export_copies_summary_figures_and_each_runs_files_gzipped(tmp_path):
    out, dest = tmp_path / "runs", tmp_path / "docs"
    folder = _fake_run(out, "starpo-s", 2, {0: 0.1, 5: 0.4})
    _fake_run(out, "vanilla-grpo", 2, {0: 0.1, 5: 0.2})  # two runs: arm against arm
    (out / "results.json").write_text("{}")
    (out / "report-seed2").mkdir()
    (out / "report-seed2" / "compare.png").write_bytes(b"png")
    (out / "report-seed2" / "entropy.png").write_bytes(b"png")  # in compare.png already
    (folder / "checkpoints").mkdir()  # left out: only what a results page cites

    written = echo_trap.export(out, dest, [2])

    names = sorted(str(p.relative_to(dest)) for p in written)
    assert names == [
        "report-seed2/compare.png",
        "results.json",
        "starpo-s-seed2-alerts.jsonl",
        "starpo-s-seed2-config.yaml",
        "starpo-s-seed2-metrics.jsonl.gz",
        "vanilla-grpo-seed2-alerts.jsonl",
        "vanilla-grpo-seed2-config.yaml",
        "vanilla-grpo-seed2-metrics.jsonl.gz",
    ]
    with gzip.open(dest / "starpo-s-seed2-metrics.jsonl.gz", "rt") as gz:
        assert gz.read() == (folder / "metrics.jsonl").read_text()
    assert not (dest / "checkpoints").exists()
    # no time in the gzip header (bytes 4-7), so a re-export of the same metrics is no change
    assert (dest / "starpo-s-seed2-metrics.jsonl.gz").read_bytes()[4:8] == bytes(4)


def test_export_takes_the_overview_figure_of_a_seed_with_one_run(tmp_path):
    out, dest = tmp_path / "runs", tmp_path / "docs"
    _fake_run(out, "starpo-s", 1, {0: 0.9, 5: 0.95})
    (out / "report-seed1").mkdir()
    (out / "report-seed1" / "overview.png").write_bytes(b"png")  # one run: no compare.png
    (out / "report-seed1" / "compare.png").write_bytes(b"png")  # stale, from an earlier pair

    written = echo_trap.export(out, dest, [1])

    figures = {str(p.relative_to(dest)) for p in written if p.suffix == ".png"}
    assert figures == {"report-seed1/overview.png"}


def test_a_think_runs_row_says_how_its_reasoning_length_changed(tmp_path):
    val = {0: 0.9, 5: 0.95, 10: 0.97}
    _fake_run(tmp_path, "starpo-s", 1, val, think={0: 20.5, 5: 12.0, 10: 3.25})
    _fake_run(tmp_path, "starpo-s", 2, val)  # no think block: nothing to report
    rows = echo_trap.summarise(tmp_path, [1, 2])["rows"]
    assert rows["starpo-s seed 1"]["val_think_tokens"] == {"first": 20.5, "last": 3.25}
    assert rows["starpo-s seed 2"]["val_think_tokens"] is None
