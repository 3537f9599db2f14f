"""Where training metrics and sampled rollouts go: JSONL, TensorBoard, W&B.

`run_dir/metrics.jsonl` is the source of truth (one `{"step": ..., **metrics}` object a
line); TensorBoard and W&B are optional mirrors. A resumed run calls `truncate_after` with
its checkpoint's step so that its files end up equal to an uninterrupted run's.
"""

from __future__ import annotations

import json
import math
import os
import secrets
import shutil
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

from starpo.errors import UserError

METRICS_FILE = "metrics.jsonl"
WANDB_ID_FILE = "wandb_id.txt"
WANDB_MODES = ("online", "offline", "disabled")


class SupportsToJson(Protocol):
    """Anything with a one-line JSON form (`Trajectory`, `Episode`)."""

    def to_json(self) -> str: ...


def _json_value(value: Any) -> float | int | None:
    """A metric as a JSON-safe number: ints stay ints, NaN/inf become None (null)."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    number = float(value)  # also accepts numpy scalars and 0-d tensors
    return number if math.isfinite(number) else None


def _step_file(folder: Path, step: int) -> Path:
    return folder / f"step_{step:06d}.jsonl"


class _TensorBoardSink:
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

    def purge_from(self, step: int) -> None:
        """Hide events with step >= `step` that an interrupted run left behind."""
        self.close()  # reopening with purge_step writes the marker TensorBoard reads
        self._purge_step = step

    def log(self, step: int, metrics: Mapping[str, float | int | None]) -> None:
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


class _WandbSink:
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
        id_file = run_dir / WANDB_ID_FILE
        if resume and id_file.exists():
            run_id = id_file.read_text().strip()
        else:
            run_id = secrets.token_hex(4)
            id_file.write_text(run_id + "\n")
        self._run = wandb.init(
            project=project, dir=str(run_dir), mode=mode, config=config, resume="allow", id=run_id
        )

    def log(self, step: int, metrics: Mapping[str, float | int | None]) -> None:
        self._run.log({k: v for k, v in metrics.items() if v is not None}, step=step)

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

    def __init__(
        self,
        run_dir: Path,
        *,
        tensorboard: bool = False,
        wandb: bool = False,
        wandb_project: str = "starpo",
        wandb_mode: str = "offline",
        config: dict | None = None,
        resume: bool = False,
    ) -> None:
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        if not resume:
            self._start_over()
        self._tensorboard = _TensorBoardSink(self.run_dir / "tensorboard") if tensorboard else None
        self._wandb = None
        if wandb:
            self._wandb = _WandbSink(
                self.run_dir,
                project=wandb_project,
                mode=wandb_mode,
                config=config or {},
                resume=resume,
            )
        # Line-buffered append: each record reaches the OS as soon as it is written.
        self._metrics = open(self.run_dir / METRICS_FILE, "a", encoding="utf-8", buffering=1)

    def _start_over(self) -> None:
        for name in (METRICS_FILE, WANDB_ID_FILE):
            (self.run_dir / name).unlink(missing_ok=True)
        for name in ("tensorboard", "trajectories", "val_trajectories"):
            shutil.rmtree(self.run_dir / name, ignore_errors=True)

    def truncate_after(self, step: int) -> None:
        """Forget everything logged for steps > `step` (an interrupted run's tail).

        Pass the step of the checkpoint being resumed; this assumes the trainer logs a
        step's metrics before it saves that step's checkpoint.
        """
        path = self.run_dir / METRICS_FILE
        self._metrics.close()
        kept = [r for r in read_metrics(self.run_dir) if r["step"] <= step]
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text("".join(json.dumps(r) + "\n" for r in kept), encoding="utf-8")
        os.replace(tmp, path)  # atomic: a crash here leaves the old or the new file
        self._metrics = open(path, "a", encoding="utf-8", buffering=1)
        for folder in ("trajectories", "val_trajectories"):
            for file in (self.run_dir / folder).glob("step_*.jsonl"):
                if int(file.stem.removeprefix("step_")) > step:
                    file.unlink()
        if self._tensorboard is not None:
            self._tensorboard.purge_from(step + 1)

    def log(self, step: int, metrics: Mapping[str, Any]) -> None:
        """Append `{"step": step, **metrics}` to metrics.jsonl and mirror it to TB/W&B."""
        if "step" in metrics:
            raise ValueError("'step' is reserved for the step number; rename that metric")
        clean = {key: _json_value(value) for key, value in metrics.items()}
        # allow_nan=False: a non-finite value that slipped through fails loudly here.
        self._metrics.write(json.dumps({"step": step, **clean}, allow_nan=False) + "\n")
        self._metrics.flush()
        for sink in (self._tensorboard, self._wandb):
            if sink is not None:
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
        return self._write_trajectories(self.run_dir / "trajectories", step, picked)

    def log_validation_trajectories(
        self, step: int, trajectories: Sequence[SupportsToJson]
    ) -> Path:
        """Write every validation trajectory of `step`."""
        return self._write_trajectories(self.run_dir / "val_trajectories", step, trajectories)

    def _write_trajectories(
        self, folder: Path, step: int, trajectories: Sequence[SupportsToJson]
    ) -> Path:
        folder.mkdir(parents=True, exist_ok=True)
        path = _step_file(folder, step)
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text("".join(t.to_json() + "\n" for t in trajectories), encoding="utf-8")
        os.replace(tmp, path)  # the viewer never sees a half-written file
        return path

    def close(self) -> None:
        """Flush and close every sink; safe to call twice."""
        self._metrics.close()
        for sink in (self._tensorboard, self._wandb):
            if sink is not None:
                sink.close()

    def __enter__(self) -> RunLogger:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def read_metrics(run_dir: Path) -> list[dict]:
    """The records of `run_dir/metrics.jsonl` in order ([] when there is none).

    A last line without its newline (a run killed mid-write) is ignored; a broken line
    elsewhere is a UserError.
    """
    path = Path(run_dir) / METRICS_FILE
    if not path.exists():
        return []
    text = path.read_text(encoding="utf-8")
    lines = text.split("\n")
    records = []
    for number, line in enumerate(lines[:-1], start=1):  # lines[-1]: "" or a partial line
        if not line.strip():
            continue
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError as exc:
            raise UserError(f"{path}:{number} is not valid JSON ({exc.msg})") from exc
    return records


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


def format_step_line(
    step: int,
    total: int,
    metrics: Mapping[str, Any],
    keys: Sequence[str] | Mapping[str, str],
    *,
    elapsed_s: float | None = None,
) -> str:
    """One compact progress line, e.g. `step 3/20 | success 0.25 | reward 0.13 | 41.2s`.

    `keys` names the metrics to show: a mapping label -> metric key, or metric keys whose
    label is their last path part (`rollout/success` -> `success`). Missing ones are
    left out.
    """
    labelled = keys if isinstance(keys, Mapping) else {k.rsplit("/", 1)[-1]: k for k in keys}
    parts = [f"step {step}/{total}"]
    parts += [
        f"{label} {_format_number(metrics[k])}" for label, k in labelled.items() if k in metrics
    ]
    if elapsed_s is not None:
        parts.append(f"{elapsed_s:.1f}s")
    return " | ".join(parts)
