"""Read a run or eval folder into the viewer's display model (plain JSON-ready dicts).

The viewer only reads result files: it never imports the trainer or an env. Training
trajectories (`Trajectory`) and eval episodes of scripted policies (`Episode`) are
normalised into one shape, so the page has a single renderer:

    episode = {source, index, env_id, seed, group, policy, success, reward, env_reward,
               num_actions, final_state, turns: [turn, ...]}
    turn    = {state, think, response, actions, executed, num_invalid, format_ok,
               env_reward, reward, format_penalty, format_bonus, finish_reason,
               window_start, tool_results}

Token ids, log-probs and loss masks are dropped: they are large and unreadable on a page.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from starpo import runs
from starpo.errors import UserError
from starpo.runs import metrics as run_metrics
from starpo.types import Episode, Trajectory, record_from_dict

# Enough to browse a step; a full page with thousands of long responses gets slow.
MAX_EPISODES_PER_SOURCE = 200

# Shown (checked) by default in the metrics panel when present; any other metric can be
# ticked by hand. Per-env curves are matched by suffix because they carry the env id.
KEY_METRICS = ("rollout/in_group_std", "actor/entropy", "actor/grad_norm")
KEY_SUFFIXES = ("/success", "/mean_response_tokens")


def turn_from_trajectory(turn: Any) -> dict[str, Any]:
    """One display turn from a `starpo.types.Turn`."""
    return {
        "state": turn.state,
        "think": turn.think,
        "response": turn.response,
        "actions": list(turn.actions),
        "executed": list(turn.executed),
        "num_invalid": turn.num_invalid,
        "format_ok": turn.format_ok,
        "env_reward": turn.env_reward,
        "reward": turn.reward,
        "format_penalty": turn.format_penalty,
        "format_bonus": turn.format_bonus,
        "finish_reason": turn.finish_reason,
        "window_start": turn.window_start,  # the first turn its prompt showed (context_window)
        "tool_results": list(turn.tool_results),  # a tool-calling env's result of each call
    }


def normalise_trajectory(traj: Trajectory) -> dict[str, Any]:
    """The display model of an LLM trajectory (training, validation or eval)."""
    return {
        "env_id": traj.env_id,
        "seed": traj.seed,
        "group": traj.group,
        "policy": "llm",
        "success": bool(traj.success),
        "reward": traj.reward,
        "env_reward": traj.env_reward,
        "num_actions": traj.num_actions,
        "final_state": traj.final_state,
        "turns": [turn_from_trajectory(t) for t in traj.turns],
        "error": traj.error,  # the env raised or hung: the episode ended there
    }


def normalise_episode(episode: Episode) -> dict[str, Any]:
    """The display model of a scripted-policy episode: one env step becomes one turn.

    An Episode has no model text, so the action stands in for the response and the
    training reward equals the env reward.
    """
    turns = []
    state = episode.initial_observation
    for step in episode.steps:
        valid = bool(step.action_is_valid)
        turns.append(
            {
                "state": state,
                "think": "",
                "response": step.action,
                "actions": [step.action],
                "executed": [step.action] if valid else [],
                "num_invalid": 0 if valid else 1,
                "format_ok": True,
                "env_reward": step.reward,
                "reward": step.reward,
                "format_penalty": 0.0,
                "format_bonus": 0.0,
                "finish_reason": "stop",
                "window_start": 1,
                "tool_results": [] if step.tool_result is None else [step.tool_result],
            }
        )
        state = step.observation
    return {
        "env_id": episode.env_id,
        "seed": episode.seed,
        "group": None,
        "policy": episode.policy,
        "success": bool(episode.success),
        "reward": episode.total_reward,
        "env_reward": episode.total_reward,
        "num_actions": episode.num_actions,
        "final_state": state,
        "turns": turns,
    }


def normalise_record(record: dict[str, Any]) -> dict[str, Any]:
    """The display model of one parsed JSONL object (a Trajectory or an Episode)."""
    parsed = record_from_dict(record)
    if isinstance(parsed, Episode):
        return normalise_episode(parsed)
    return normalise_trajectory(parsed)


def normalise_line(line: str) -> dict[str, Any]:
    """Parse one JSONL line (a Trajectory or an Episode) into the display model."""
    record = json.loads(line)
    if not isinstance(record, dict):
        raise ValueError("expected a JSON object")
    return normalise_record(record)


def read_episodes(
    path: Path, cap: int = MAX_EPISODES_PER_SOURCE, warnings: list[str] | None = None
) -> tuple[list[dict], int]:
    """The first `cap` episodes of a JSONL file and the number of episodes in it.

    Read by `starpo.runs.load_jsonl`: a half-written last line is skipped and reported in
    `warnings`; a malformed line elsewhere, or an object that is no trajectory or episode,
    is a user-visible error naming file and line, not a silent skip: a viewer that hid
    broken records would hide a broken writer.
    """
    read = _load(path, warnings, limit=cap)
    episodes = []
    for number, record in zip(read.numbers, read.records, strict=True):
        try:
            episodes.append(normalise_record(record))
        except (ValueError, TypeError, KeyError) as exc:
            raise UserError(f"{path}:{number}: not a trajectory or episode ({exc})") from exc
    return episodes, read.total


def _load(path: Path, warnings: list[str] | None, limit: int | None = None) -> runs.JsonlRead:
    """`runs.load_jsonl`, its warning (if any) appended to `warnings`."""
    read = runs.load_jsonl(path, limit=limit, skip_broken=True)
    message = read.warning()
    if message is not None and warnings is not None:
        warnings.append(message)
    return read


def _source(
    kind: str, step: int | None, path: Path, cap: int, warnings: list[str]
) -> dict[str, Any]:
    episodes, total = read_episodes(path, cap, warnings)
    label = kind if step is None else f"{'train' if kind == 'train' else 'val'} step {step}"
    return {
        "id": f"{kind}:{'' if step is None else step}",
        "kind": kind,
        "step": step,
        "label": label,
        "file": path.name,
        "total": total,
        "episodes": episodes,
    }


def chart_points(run_dir: Path, warnings: list[str] | None = None) -> dict[str, list[list[float]]]:
    """The run's metric curves (`run_metrics.read_metrics`, `metric_curves`) as the page's
    chart points, {metric: [[step, value], ...]}. The page joins every point of a chart
    into one line, so a curve's gaps (null, NaN, inf) are left out here, and a metric with
    no finite value gets no chart."""
    records = run_metrics.read_metrics(run_dir, skip_broken=True, warnings=warnings)
    points = {
        key: [[step, value] for step, value in zip(*curve, strict=True) if value == value]
        for key, curve in run_metrics.metric_curves(records).items()
    }
    return {key: pts for key, pts in points.items() if pts}


def default_metrics(names: list[str]) -> list[str]:
    """The metrics ticked when the page opens: success curves plus the key diagnostics."""
    return [n for n in names if n.endswith(KEY_SUFFIXES) or n in KEY_METRICS]


def _read_summary(path: Path, warnings: list[str]) -> Any:
    """An eval folder's summary.json, or None when there is none or it is corrupt (noted
    in `warnings`: the episodes are still worth showing). Bad bytes are replaced."""
    if not path.is_file():
        return None
    try:
        return json.loads(path.read_text(encoding="utf-8", errors="replace"))
    except ValueError as exc:
        warnings.append(f"{path}: skipped, not valid JSON ({exc})")
        return None


def display_model(run_dir: Path, cap: int = MAX_EPISODES_PER_SOURCE) -> dict[str, Any]:
    """The whole display model of a training run folder or a `starpo eval` folder.

    `warnings` lists the lines skipped on the way (a run killed mid-write), one string
    per file, for the page and the terminal.
    """
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise UserError(f"{run_dir}: no such folder (give a run or eval output folder)")
    folder, warnings = runs.RunFolder(run_dir), []
    sources = [
        _source(kind, step, path, cap, warnings)
        for kind, parent in (("train", folder.trajectories), ("val", folder.val_trajectories))
        for step, path in runs.step_files(parent)
    ]
    # An eval folder's episodes; an SFT folder's replayed examples (`starpo sft`).
    for kind, name in (("eval", runs.EVAL_TRAJECTORIES_FILE), ("sft", runs.SFT_DATA_FILE)):
        if (run_dir / name).is_file():
            sources.append(_source(kind, None, run_dir / name, cap, warnings))
    if not sources:
        raise UserError(
            f"{run_dir}: no trajectory files (expected trajectories/step_*.jsonl, "
            "val_trajectories/step_*.jsonl, trajectories.jsonl or sft_data.jsonl)"
        )
    metrics = chart_points(run_dir, warnings)
    alerts = [
        {k: row.get(k) for k in ("step", "state", "rule", "message")}
        for row in run_metrics.read_alerts(run_dir, skip_broken=True, warnings=warnings)
    ]
    return finite(
        {
            "run": run_dir.resolve().name,
            "cap": cap,
            "sources": sources,
            "metrics": metrics,
            "default_metrics": default_metrics(sorted(metrics)),
            "alerts": alerts,
            "summary": _read_summary(run_dir / runs.SUMMARY_FILE, warnings),
            "warnings": warnings,
        }
    )


def finite(value: Any) -> Any:
    """`value` with NaN/inf floats replaced by None (JSON.parse rejects bare NaN)."""
    if isinstance(value, float) and (value != value or value in (float("inf"), float("-inf"))):
        return None
    if isinstance(value, dict):
        return {str(k): finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite(v) for v in value]
    return value


def json_for_script(value: Any) -> str:
    """JSON text safe to place inside `<script type="application/json">`.

    `<`, `>` and `&` become \\u003c etc. so model text such as `</script>` or `<!--` cannot
    end the element or switch the HTML parser's state; U+2028/U+2029 are escaped because
    some JS parsers treat them as line breaks. These characters only ever occur inside
    JSON strings, where the \\u escapes decode back to the same text.
    """
    text = json.dumps(value, ensure_ascii=False, allow_nan=False)
    for char, escape in (
        ("&", "\\u0026"),
        ("<", "\\u003c"),
        (">", "\\u003e"),
        ("\u2028", "\\u2028"),
        ("\u2029", "\\u2029"),
    ):
        text = text.replace(char, escape)
    return text
