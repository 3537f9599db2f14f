"""Where training metrics and sampled rollouts go: JSONL, TensorBoard, W&B.

`run_dir/metrics.jsonl` is the source of truth (one `{"step": ..., **metrics}` object a
line); TensorBoard and W&B are optional mirrors. Each destination is a `Sink`, and
`RunLogger` fans every step out to its list of sinks: a new destination is one class
plus its factory registered in `starpo.registry.METRIC_SINKS` (or a `starpo.metric_sinks`
entry point), selected with `trainer.sinks`. A resumed run calls `truncate_after` with its
checkpoint's step so that its files end up equal to an uninterrupted run's.

File names and the JSONL rules live in `starpo.runs`.
"""

from __future__ import annotations

import math
import secrets
import shutil
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

from starpo import runs
from starpo.errors import UserError
from starpo.runs import RunFolder
from starpo.timing import TRAIN_MINUTES, format_duration

__all__ = [
    "JsonlSink",
    "RunLogger",
    "Sink",
    "TensorBoardSink",
    "WandbSink",
    "format_step_line",
]

WANDB_MODES = ("online", "offline", "disabled")

Metrics = Mapping[str, float | int | None]  # finite numbers; None where the value was NaN/inf


class SupportsToJson(Protocol):
    """Anything with a one-line JSON form (`Trajectory`, `Episode`)."""

    def to_json(self) -> str: ...


class Sink(Protocol):
    """One destination of a run's per-step metrics."""

    def log(self, step: int, metrics: Metrics) -> None:
        """Record `metrics` of `step` (already JSON-safe: see `_json_value`)."""

    def truncate_after(self, step: int) -> None:
        """Forget, or hide, what was recorded for steps > `step` (resume of a crashed run)."""

    def close(self) -> None:
        """Flush and release; safe to call twice."""


def _json_value(value: Any) -> float | int | None:
    """A metric as a JSON-safe number: ints stay ints, NaN/inf become None (null)."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    number = float(value)  # also accepts numpy scalars and 0-d tensors
    return number if math.isfinite(number) else None


class JsonlSink:
    """`metrics.jsonl`, appended one flushed line per step."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self._file = runs.open_for_append(self.path)

    def log(self, step: int, metrics: Metrics) -> None:
        # allow_nan=False: a non-finite value that slipped through fails loudly here.
        self._file.write(runs.json_line({"step": step, **metrics}, allow_nan=False))
        self._file.flush()

    def truncate_after(self, step: int) -> None:
        """Rewrite the file with the records of steps <= `step` (atomically).

        A half-written last line (the crash being resumed from) is dropped with a warning.
        """
        self._file.close()
        runs.truncate_jsonl(self.path, step)
        self._file = runs.open_for_append(self.path)

    def close(self) -> None:
        self._file.close()


class TensorBoardSink:
    """Scalars under `run_dir/tensorboard/`; the writer opens on the first `log`."""

    def __init__(self, log_dir: Path) -> None:
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError as exc:  # torch raises this when tensorboard is missing
            raise UserError(
                "TensorBoard logging needs the tensorboard package: pip install tensorboard"
            ) from exc
        self._writer_cls = SummaryWriter
        self._log_dir = log_dir
        self._writer: Any = None
        self._purge_step: int | None = None

    def truncate_after(self, step: int) -> None:
        """Hide events with step > `step` that an interrupted run left behind."""
        self.close()  # reopening with purge_step writes the marker TensorBoard reads
        self._purge_step = step + 1

    def log(self, step: int, metrics: Metrics) -> None:
        if self._writer is None:
            self._writer = self._writer_cls(str(self._log_dir), purge_step=self._purge_step)
        for key, value in metrics.items():
            if value is not None:  # non-finite values have no place on a TB chart
                self._writer.add_scalar(key, value, global_step=step)
        self._writer.flush()

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None


class WandbSink:
    """A W&B run whose id lives in `run_dir/wandb_id.txt`, so a resumed run continues it.

    W&B ignores steps at or below the last one it recorded, so in online mode the steps
    repeated after a resume keep their first values there (metrics.jsonl is exact).
    """

    def __init__(
        self, run_dir: Path, *, project: str, mode: str, config: dict, resume: bool
    ) -> None:
        if mode not in WANDB_MODES:
            raise UserError(f"unknown W&B mode {mode!r}; use one of {', '.join(WANDB_MODES)}")
        try:
            import wandb
        except ImportError as exc:
            raise UserError("W&B logging needs the wandb package: pip install wandb") from exc
        id_file = RunFolder(run_dir).wandb_id
        if resume and id_file.exists():
            run_id = id_file.read_text().strip()
        else:
            run_id = secrets.token_hex(4)
            id_file.write_text(run_id + "\n")
        self._run = wandb.init(
            project=project, dir=str(run_dir), mode=mode, config=config, resume="allow", id=run_id
        )

    def log(self, step: int, metrics: Metrics) -> None:
        self._run.log({k: v for k, v in metrics.items() if v is not None}, step=step)

    def truncate_after(self, step: int) -> None:
        pass  # W&B cannot forget steps; see the class docstring

    def close(self) -> None:
        if self._run is not None:
            self._run.finish()
            self._run = None


class RunLogger:
    """One facade over every metrics sink of a run; use it as a context manager.

    A fresh run (`resume=False`) starts the files this class owns over: metrics.jsonl,
    tensorboard/, trajectories/, val_trajectories/ and wandb_id.txt (never checkpoints).
    A resumed run appends; call `truncate_after(checkpoint_step)` before logging.
    """

    @classmethod
    def for_run(cls, run_dir: Path, trainer: Any, config: dict, resume: bool = False) -> RunLogger:
        """The sinks a training config's `trainer` section asks for (`sink_names`), each
        built by its factory in `starpo.registry.METRIC_SINKS` from the whole config."""
        return cls(run_dir, config=config, resume=resume, sinks=trainer.sink_names())

    def __init__(
        self,
        run_dir: Path,
        *,
        config: dict | None = None,
        resume: bool = False,
        sinks: Sequence[str] = (),
    ) -> None:
        """`sinks`: names in `starpo.registry.METRIC_SINKS` (e.g. "tensorboard", "wandb"),
        each built by its factory from the whole `config` (W&B reads trainer.wandb_mode
        and trainer.wandb_project there)."""
        from starpo.registry import METRIC_SINKS

        self.run_dir = Path(run_dir)
        self.folder = RunFolder(self.run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        if not resume:
            self._start_over()
        # The optional sinks first: they can fail (missing package) before a file is open.
        mirrors: list[Sink] = [
            METRIC_SINKS[name](self.run_dir, config=config or {}, resume=resume) for name in sinks
        ]
        self.sinks: list[Sink] = [JsonlSink(self.folder.metrics), *mirrors]

    def _start_over(self) -> None:
        for path in (self.folder.metrics, self.folder.wandb_id):
            path.unlink(missing_ok=True)
        for path in (
            self.folder.tensorboard,
            self.folder.trajectories,
            self.folder.val_trajectories,
        ):
            shutil.rmtree(path, ignore_errors=True)

    def truncate_after(self, step: int) -> None:
        """Forget everything logged for steps > `step` (an interrupted run's tail).

        Pass the step of the checkpoint being resumed; this assumes the trainer logs a
        step's metrics before it saves that step's checkpoint.
        """
        for sink in self.sinks:
            sink.truncate_after(step)
        for folder in (self.folder.trajectories, self.folder.val_trajectories):
            for file_step, file in runs.step_files(folder):
                if file_step > step:
                    file.unlink()

    def log(self, step: int, metrics: Mapping[str, Any]) -> None:
        """Append `{"step": step, **metrics}` to metrics.jsonl and mirror it to TB/W&B."""
        if "step" in metrics:
            raise ValueError("'step' is reserved for the step number; rename that metric")
        clean = {key: _json_value(value) for key, value in metrics.items()}
        for sink in self.sinks:
            sink.log(step, clean)

    def log_trajectories(
        self, step: int, trajectories: Sequence[SupportsToJson], limit: int
    ) -> Path | None:
        """Write at most `limit` trajectories, spread evenly over the batch.

        The sample is deterministic (no RNG draws), so logging never changes training.
        """
        if limit <= 0 or not trajectories:
            return None
        n = len(trajectories)
        picked = [trajectories[i * n // limit] for i in range(min(limit, n))]
        return self._write_trajectories(self.folder.trajectories, step, picked)

    def log_validation_trajectories(
        self, step: int, trajectories: Sequence[SupportsToJson]
    ) -> Path:
        """Write every validation trajectory of `step`."""
        return self._write_trajectories(self.folder.val_trajectories, step, trajectories)

    def _write_trajectories(
        self, folder: Path, step: int, trajectories: Sequence[SupportsToJson]
    ) -> Path:
        folder.mkdir(parents=True, exist_ok=True)
        # Atomic: the viewer never sees a half-written file.
        return runs.write_lines_atomic(
            runs.step_file(folder, step), (t.to_json() + "\n" for t in trajectories)
        )

    def close(self) -> None:
        """Flush and close every sink; safe to call twice."""
        for sink in self.sinks:
            sink.close()

    def __enter__(self) -> RunLogger:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def _format_number(value: Any) -> str:
    if value is None:
        return "nan"
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    number = float(value)
    if not math.isfinite(number):
        return str(number)
    if number == 0 or 0.01 <= abs(number) < 10_000:
        return f"{number:.2f}"
    return f"{number:.2e}"  # tiny losses and KLs stay readable


def tensorboard_sink(run_dir: Path, *, config: dict, resume: bool) -> TensorBoardSink:
    """The "tensorboard" entry of `starpo.registry.METRIC_SINKS`."""
    return TensorBoardSink(RunFolder(run_dir).tensorboard)


def wandb_sink(run_dir: Path, *, config: dict, resume: bool) -> WandbSink:
    """The "wandb" entry of `starpo.registry.METRIC_SINKS`: project and mode from the
    config's trainer section (trainer.wandb_project, trainer.wandb_mode)."""
    trainer = config.get("trainer", {})
    project, mode = trainer.get("wandb_project", "starpo"), trainer.get("wandb_mode", "offline")
    return WandbSink(run_dir, project=project, mode=mode, config=config, resume=resume)


def format_step_line(
    step: int,
    total: int,
    metrics: Mapping[str, Any],
    keys: Sequence[str] | Mapping[str, str],
    *,
    elapsed_s: float | None = None,
    left_s: float | None = None,
) -> str:
    """One compact progress line, e.g. `step 3/20 | success 0.25 | reward 0.13 | 41.2s`.

    `keys` names the metrics to show: a mapping label -> metric key, or metric keys whose
    label is their last path part (`rollout/success` -> `success`). Missing ones are
    left out. `left_s`: the run's likely time left (`starpo.timing.time_left`), shown as
    `left ~7.7 h` while steps remain.
    """
    labelled = keys if isinstance(keys, Mapping) else {k.rsplit("/", 1)[-1]: k for k in keys}
    parts = [f"step {step}/{total}"]
    parts += [
        f"{label} {_format_number(metrics[k])}" for label, k in labelled.items() if k in metrics
    ]
    if elapsed_s is not None:
        parts.append(f"{elapsed_s:.1f}s")
    if left_s is not None and step < total:
        parts.append(f"left ~{format_duration(left_s)}")
    return " | ".join(parts)


def training_line_keys(env_id: str, validation_id: str, budgeted: bool) -> dict[str, str]:
    """The metrics a training step's console line shows, by label (`format_step_line`);
    with a minutes budget (trainer.max_minutes) also the training minutes used."""
    train, val = f"train/{env_id}", f"val/{validation_id}"
    keys = {
        "success": f"{train}/success",
        "reward": f"{train}/reward",
        "format_ok": f"{train}/format_ok",
        # envs that judge moves (TextEnv.good_actions): the share an optimal policy could take
        "optimal_actions": f"{train}/optimal_action_rate",
        # decision tasks (TextEnv.answer): how far one label took over other kinds of case
        "overuse": f"{train}/answer_overuse",
        "entropy": "actor/entropy",
        "grad_norm": "actor/grad_norm",
        # where the learning signal is: groups whose rewards vary, and the mean pass rate
        "informative": "signal/informative_groups",
        "pass_rate": "signal/pass_rate",
        "val_success": f"{val}/success",
    }
    if budgeted:
        keys["train_min"] = TRAIN_MINUTES
    return keys
