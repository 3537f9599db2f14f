"""PNG plots of training runs: `starpo report RUN [RUN_B ...] [--out DIR]`.

Reads only result files: `RUN/metrics.jsonl` (one `{"step": ..., "<metric>": ...}` object
a line) and the optional `RUN/alerts.jsonl` (the collapse detector's warnings). One run
gives `RUN/report/overview.png` (a grid of panels) plus one PNG per panel; several runs give
`compare.png` plus per-panel PNGs with one line per run. Alerts are vertical lines at their
step, coloured by severity. `--x minutes` plots every panel against the run's cumulative
training minutes instead of its steps (`starpo.timing.train_minutes`: validation excluded),
to compare methods at the same wall-clock budget.

Figures are built on `matplotlib.figure.Figure` directly, never through pyplot: no GUI
backend, no global figure registry, nothing to close; PNGs are rendered by Agg.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.lines import Line2D

from starpo.errors import UserError
from starpo.logs import warn
from starpo.runs import METRICS_FILE, REPORT_DIR, check_writable
from starpo.runs.metrics import metric_curves, read_alerts, read_metrics
from starpo.timing import train_minutes

DPI = 100
SEVERITY_COLORS = {"warning": "#f28e2b", "collapse": "#d62728"}
UNKNOWN_SEVERITY_COLOR = "#7f7f7f"
SERIES_STYLES = ("-", "--", ":", "-.")
# Line colours skip orange and red, which mark alerts.
LINE_COLORS = ("C0", "C2", "C4", "C9", "C5", "C6", "C8", "C7")
ALERT_STYLES = ("-", "--", ":", "-.")
#: What the x axis can show (`--x`), and its label.
X_AXES = {"steps": "step", "minutes": "training minutes"}


@dataclass(frozen=True)
class Panel:
    """One plot: a title and the metric-key patterns it draws (`*` = one key part)."""

    name: str  # file stem, e.g. "success" -> success.png
    title: str
    series: tuple[tuple[str, str], ...]  # (label, key pattern), e.g. ("val", "val/*/success")


PANELS: tuple[Panel, ...] = (
    Panel("success", "Success rate", (("train", "train/*/success"), ("val", "val/*/success"))),
    Panel("reward", "Reward", (("train", "train/*/reward"), ("val", "val/*/reward"))),
    Panel(
        "in_group_std",
        "In-group reward std",
        (("all", "rollout/in_group_std"), ("kept", "rollout/kept_in_group_std")),
    ),
    Panel("entropy", "Policy entropy", (("entropy", "actor/entropy"),)),
    Panel("grad_norm", "Gradient norm", (("grad norm", "actor/grad_norm"),)),
    Panel(
        "response_length",
        "Response length (tokens)",
        (
            ("response", "train/*/mean_response_tokens"),
            ("think", "train/*/mean_think_tokens"),
        ),
    ),
)


#: Panels of metrics a run logs only when a setting or its env turns them on: drawn only
#: for runs that have them (runs made before a metric existed lack it). Where the learning
#: signal is (`signal/*`: groups whose rewards vary, all failed, all solved, and the pass
#: rate); the pass-rate controller's k (`curriculum.*`) and its pass rate against the target.
#: The share of moves an optimal policy could make (envs whose
#: solver judges moves, `TextEnv.good_actions`); a decision task's answer overuse (the
#: largest share of cases of other kinds one label took: invoice, support); RAGEN-2's
#: template-collapse probe
#: (diagnostics.mi_every): retrieval accuracy against its chance level, and the
#: input-reply mutual information.
OPTIONAL_PANELS: tuple[Panel, ...] = (
    Panel(
        "signal",
        "Learning signal: env groups",
        (
            ("informative", "signal/informative_groups"),
            ("all failed", "signal/all_failed_groups"),
            ("all solved", "signal/all_solved_groups"),
            ("pass rate", "signal/pass_rate"),
        ),
    ),
    Panel(
        "curriculum",
        "Pass-rate control: k moves before the end",
        (
            ("k (moves)", "curriculum/moves"),
            ("mean start moves", "curriculum/mean_start_moves"),
        ),
    ),
    Panel(
        "curriculum_pass_rate",
        "Pass-rate control: pass rate and its target",
        (("pass rate", "signal/pass_rate"), ("target", "curriculum/target")),
    ),
    Panel(
        "optimal_actions",
        "Moves an optimal policy could make",
        (("train", "train/*/optimal_action_rate"), ("val", "val/*/optimal_action_rate")),
    ),
    Panel(
        "answers",
        "Decision answers: overuse of one label",
        (("train", "train/*/answer_overuse"), ("val", "val/*/answer_overuse")),
    ),
    Panel(
        "mi_retrieval",
        "Template collapse: retrieval accuracy",
        (
            ("first turn", "diagnostics/mi/first_turn/retrieval_acc"),
            ("uniform", "diagnostics/mi/uniform/retrieval_acc"),
            ("chance", "diagnostics/mi/first_turn/chance"),
        ),
    ),
    Panel(
        "mi",
        "Input-reply mutual information (nats)",
        (("first turn", "diagnostics/mi/first_turn/mi"), ("uniform", "diagnostics/mi/uniform/mi")),
    ),
)


@dataclass(frozen=True)
class Alert:
    """One line of alerts.jsonl."""

    step: int
    severity: str
    rule: str = ""
    message: str = ""


@dataclass
class RunData:
    """A run folder's metrics as per-key series, and its alerts."""

    name: str
    path: Path
    # key -> (steps, values); a null value is NaN, so the line shows a gap there.
    series: dict[str, tuple[np.ndarray, np.ndarray]] = field(default_factory=dict)
    alerts: list[Alert] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)  # lines skipped while reading
    # (steps, cumulative training minutes at each): where each step lies on `--x minutes`.
    minutes: tuple[np.ndarray, np.ndarray] = (np.zeros(0), np.zeros(0))

    def x(self, steps: Sequence[float] | np.ndarray, axis: str = "steps") -> np.ndarray:
        """Where `steps` lie on the x axis `axis` (see X_AXES); a step between two logged
        ones (an alert) lies between their minutes."""
        if axis == "steps":
            return np.asarray(steps)
        return np.interp(np.asarray(steps, dtype=float), *self.minutes)


def _collect_minutes(records: list[dict]) -> tuple[np.ndarray, np.ndarray]:
    """(steps, cumulative training minutes) of `read_metrics`' records (one per step)."""
    steps = [record["step"] for record in records]
    return np.array(steps, dtype=float), np.array(train_minutes(records), dtype=float)


def _collect_series(records: list[dict]) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Per-key (steps, values) arrays of `metric_curves` (a gap is NaN)."""
    return {
        key: (np.array(steps), np.array(values, dtype=float))
        for key, (steps, values) in metric_curves(records).items()
    }


def load_run(run_dir: Path, name: str | None = None) -> RunData:
    """Read a run folder; a UserError when it is missing or holds no metrics.jsonl."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise UserError(f"{run_dir} does not exist or is not a folder; pass a training run folder")
    if not (run_dir / METRICS_FILE).is_file():
        raise UserError(
            f"{run_dir} is not a training run folder (no {METRICS_FILE}); "
            "pass the folder given to `starpo train`"
        )
    run = RunData(name or run_dir.resolve().name, run_dir)
    records = read_metrics(run_dir, skip_broken=True, warnings=run.warnings)
    run.series, run.minutes = _collect_series(records), _collect_minutes(records)
    for record in read_alerts(run_dir, skip_broken=True, warnings=run.warnings):
        severity = str(record.get("severity") or record.get("state") or "warning")
        run.alerts.append(
            Alert(
                record["step"],
                severity,
                str(record.get("rule", "")),
                str(record.get("message", "")),
            )
        )
    return run


def _pattern_regex(pattern: str) -> re.Pattern[str]:
    """`train/*/success` -> a regex where `*` stands for one key part (no `/`)."""
    return re.compile("^" + "[^/]+".join(map(re.escape, pattern.split("*"))) + "$")


def panel_series(run: RunData, panel: Panel) -> list[tuple[str, str]]:
    """The (label, key) pairs of `run` that `panel` draws, in panel order.

    Several keys matching one pattern (two envs) get the matched part in their label.
    """
    found = []
    for label, pattern in panel.series:
        regex = _pattern_regex(pattern)
        keys = sorted(key for key in run.series if regex.match(key))
        for key in keys:
            found.append((f"{label} {key.split('/')[1]}" if len(keys) > 1 else label, key))
    return found


def run_panels(runs: Sequence[RunData]) -> tuple[Panel, ...]:
    """PANELS, then each of OPTIONAL_PANELS that some run has data for."""
    extra = [p for p in OPTIONAL_PANELS if any(panel_series(run, p) for run in runs)]
    return PANELS + tuple(extra)


def _plot_series(
    ax: Axes, run: RunData, key: str, color: str, style: str, label: str, x: str = "steps"
) -> None:
    """One metric line; sparse series (validation) get point markers; CI bands are shaded."""
    steps, values = run.series[key]
    marker = "o" if len(steps) <= 40 else None
    xs = run.x(steps, x)
    ax.plot(xs, values, linestyle=style, color=color, marker=marker, markersize=3, label=label)
    low, high = run.series.get(key + "_ci95_low"), run.series.get(key + "_ci95_high")
    if low is not None and high is not None and np.array_equal(low[0], high[0]):
        ax.fill_between(run.x(low[0], x), low[1], high[1], color=color, alpha=0.15, linewidth=0)


def alert_spells(steps: Sequence[int]) -> list[tuple[int, int]]:
    """Consecutive steps as (first, last) spells: the detector raises an alert at every step
    it stays in a state, and one line per step would hide the curves behind them."""
    spells: list[tuple[int, int]] = []
    for step in sorted(set(steps)):
        if spells and step == spells[-1][1] + 1:
            spells[-1] = (spells[-1][0], step)
        else:
            spells.append((step, step))
    return spells


def _draw_alerts(ax: Axes, run: RunData, style: str, x: str = "steps") -> int:
    """For each spell of `run`'s alerts of one severity: a vertical line where it starts
    and a light band over the steps it lasts, coloured by severity; returns the spells."""
    by_severity: dict[str, list[int]] = {}
    for alert in run.alerts:
        by_severity.setdefault(alert.severity, []).append(alert.step)
    count = 0
    for severity, steps in by_severity.items():
        color = SEVERITY_COLORS.get(severity, UNKNOWN_SEVERITY_COLOR)
        for spell in alert_spells(steps):
            first, last = run.x(spell, x)
            ax.axvline(first, color=color, linestyle=style, linewidth=1.2, alpha=0.8,
                       gid=f"alert-{severity}")  # fmt: skip
            if last > first:
                ax.axvspan(first, last, color=color, alpha=0.08, linewidth=0)
            count += 1
    return count


def draw_panel(
    ax: Axes, runs: Sequence[RunData], panel: Panel, colors: Sequence[str], x: str = "steps"
) -> bool:
    """Draw `panel` for every run on `ax` against `x` (steps or minutes); False (and a "no
    data" note) when nothing matched.

    One run: one colour per series. Several runs: one colour per run, one line style per
    series (the figure legend names the runs).
    """
    ax.set_title(panel.title, fontsize=10)
    ax.set_xlabel(X_AXES[x], fontsize=8)
    ax.tick_params(labelsize=8)
    ax.grid(True, alpha=0.3)
    drew = False
    for r, run in enumerate(runs):
        for s, (label, key) in enumerate(panel_series(run, panel)):
            color = colors[s] if len(runs) == 1 else colors[r]
            _plot_series(ax, run, key, color, SERIES_STYLES[s % len(SERIES_STYLES)], label, x)
            drew = True
        _draw_alerts(ax, run, ALERT_STYLES[r % len(ALERT_STYLES)] if len(runs) > 1 else "-", x)
    if not drew:
        ax.text(0.5, 0.5, "no data", ha="center", va="center", transform=ax.transAxes,
                fontsize=11, color="#888888")  # fmt: skip
        return False
    _series_legend(ax, several_runs=len(runs) > 1)
    return True


def _series_legend(ax: Axes, several_runs: bool) -> None:
    """Per-panel legend: series labels (one run) or series line styles in grey (several)."""
    if not several_runs:
        ax.legend(fontsize=7, loc="best")
        return
    labels: dict[str, str] = {}
    for line in ax.lines:
        if line.get_gid() is None and not line.get_label().startswith("_"):
            labels.setdefault(line.get_label(), line.get_linestyle())
    if len(labels) > 1:
        handles = [Line2D([], [], color="#555555", linestyle=ls) for ls in labels.values()]
        ax.legend(handles, list(labels), fontsize=7, loc="best")


LEGEND_FONTSIZE = 8


def legend_columns(labels: Sequence[str], width_in: float, fontsize: float) -> int:
    """How many legend columns of `labels` fit across `width_in` inches: the widest label
    at about 0.6 em a character, plus its line sample and the gap (~0.6 in). Five runs'
    alert labels ("alert: collapse (starpo-s-rollback-seed1)") in six columns were wider
    than the figure and cut off at both edges."""
    char_in = 0.6 * fontsize / 72
    column_in = max((len(label) for label in labels), default=0) * char_in + 0.6
    return max(1, int(width_in // column_in))


def _figure_header(
    fig: Figure, runs: Sequence[RunData], colors: Sequence[str], title: str, ncol: int
) -> None:
    """The title, and a legend of run names (several runs) and alert severities under it.

    The title is the legend's own title when there is a legend: a suptitle would overlap an
    "outside" legend under constrained layout.
    """
    handles, labels = [], []
    if len(runs) > 1:
        for r, run in enumerate(runs):
            handles.append(Line2D([], [], color=colors[r], linewidth=2))
            labels.append(run.name)
    for r, run in enumerate(runs):
        style = ALERT_STYLES[r % len(ALERT_STYLES)] if len(runs) > 1 else "-"
        for severity in sorted({alert.severity for alert in run.alerts}):
            color = SEVERITY_COLORS.get(severity, UNKNOWN_SEVERITY_COLOR)
            handles.append(Line2D([], [], color=color, linewidth=1.2, linestyle=style))
            labels.append(f"alert: {severity}" + (f" ({run.name})" if len(runs) > 1 else ""))
    if handles:
        ncol = min(ncol, legend_columns(labels, fig.get_figwidth(), LEGEND_FONTSIZE))
        fig.legend(
            handles,
            labels,
            loc="outside upper center",
            ncol=min(len(handles), ncol),
            fontsize=LEGEND_FONTSIZE,
            frameon=False,
            title=title,
            title_fontsize=11,
        )
    else:
        fig.suptitle(title, fontsize=11)


def run_names(runs: Sequence[RunData]) -> str:
    """The run names joined for a title."""
    return ", ".join(run.name for run in runs)


def build_figure(
    runs: Sequence[RunData],
    panels: Sequence[Panel] = PANELS,
    title: str | None = None,
    x: str = "steps",
) -> Figure:
    """A figure with one subplot per panel (3 columns at most) against `x` (see X_AXES),
    ready to save.

    Alert lines (one where each spell of alerts starts) carry the gid `alert-<severity>`,
    so callers can find them in `ax.lines`.
    """
    ncols = min(3, len(panels))
    nrows = math.ceil(len(panels) / ncols)
    # Constrained layout makes room for the title and the "outside" figure legend.
    fig = Figure(figsize=(4.4 * ncols, 3.2 * nrows + 0.6), dpi=DPI, layout="constrained")
    colors = [LINE_COLORS[i % len(LINE_COLORS)] for i in range(max(len(runs), 4))]
    axes = fig.subplots(nrows, ncols, squeeze=False).ravel()
    for ax, panel in zip(axes, panels, strict=False):
        draw_panel(ax, runs, panel, colors, x)
    for ax in axes[len(panels) :]:
        ax.set_visible(False)
    default = run_names(runs) if len(runs) == 1 else f"compare: {run_names(runs)}"
    _figure_header(fig, runs, colors, title or default, ncol=2 * ncols)
    return fig


def _run_names(run_dirs: Sequence[Path]) -> list[str]:
    """Folder names for the legend; the full path where two runs share a folder name."""
    names = [Path(d).resolve().name for d in run_dirs]
    return [str(d) if names.count(n) > 1 else n for d, n in zip(run_dirs, names, strict=True)]


def check_minutes(runs: Sequence[RunData]) -> None:
    """A UserError for a run that logged no step timings: it has no minutes to plot."""
    for run in runs:
        if not np.any(run.minutes[1] > 0):
            raise UserError(
                f"{run.path} logs no step timings (perf/train_minutes or timing_s/step) to "
                "plot against minutes; use --x steps"
            )


def main_figure_name(num_runs: int) -> str:
    """The all-panels figure's file name: `overview.png` for one run, `compare.png` for
    several (each panel one line per run)."""
    return "overview.png" if num_runs == 1 else "compare.png"


def write_report(run_dirs: list[Path], out_dir: Path | None = None, x: str = "steps") -> list[Path]:
    """Write the PNGs for one run or a comparison of several, against `x` (steps or
    minutes); returns the written paths.

    One run: `overview.png` plus one PNG per panel with data, in `out_dir` or `RUN/report/`.
    Several: `compare.png` plus one PNG per panel, in `out_dir` or `./report-compare/`.
    Lines skipped while reading (a run killed mid-write) are one `warning:` line each on
    stderr.
    """
    if not run_dirs:
        raise UserError("no run folder given; pass at least one training run folder")
    if x not in X_AXES:
        raise UserError(f"--x must be one of {', '.join(X_AXES)}, got {x!r}")
    run_dirs = [Path(d) for d in run_dirs]
    runs = [load_run(d, n) for d, n in zip(run_dirs, _run_names(run_dirs), strict=True)]
    for run in runs:
        for message in run.warnings:
            warn(message, "starpo.report")
    if x == "minutes":
        check_minutes(runs)
    if out_dir is None:
        out_dir = run_dirs[0] / REPORT_DIR if len(runs) == 1 else Path("report-compare")
    out_dir = Path(out_dir)
    check_writable(out_dir, "report folder")  # a file, or a path under one, is one line
    main_name = main_figure_name(len(runs))
    panels = run_panels(runs)
    written = [_save(build_figure(runs, panels, x=x), out_dir / main_name)]
    for panel in panels:
        if any(panel_series(run, panel) for run in runs):
            fig = build_figure(runs, [panel], title=run_names(runs), x=x)
            written.append(_save(fig, out_dir / f"{panel.name}.png"))
    return written


def _save(fig: Figure, path: Path) -> Path:
    """Render `fig` to `path` as PNG (Agg) and return the path."""
    fig.savefig(path, format="png", dpi=DPI)
    return path


def report_main(runs: list[str], out: str | None, x: str = "steps") -> int:
    """CLI entry: write the report and print one written path a line; returns exit code 0."""
    paths = write_report([Path(r) for r in runs], Path(out) if out is not None else None, x)
    for path in paths:
        print(path)
    return 0
