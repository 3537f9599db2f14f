"""Read a run or eval folder into the viewer's display model (plain JSON-ready dicts).

The viewer only reads result files: it never imports the trainer or an env. Training
trajectories (`Trajectory`) and eval episodes of scripted policies (`Episode`) are
normalised into one shape, so the page has a single renderer:

    episode = {source, index, env_id, seed, group, policy, success, reward, env_reward,
               num_actions, final_state, turns: [turn, ...]}
    turn    = {state, think, response, actions, executed, num_invalid, format_ok,
               env_reward, reward, format_penalty, format_bonus, finish_reason}

Token ids, log-probs and loss masks are dropped: they are large and unreadable on a page.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from starpo.errors import UserError
from starpo.types import Episode, Trajectory

# Enough to browse a step; a full page with thousands of long responses gets slow.
MAX_EPISODES_PER_SOURCE = 200

_STEP_FILE = re.compile(r"^step_(\d+)\.jsonl$")

# Shown (checked) by default in the metrics panel when present; any other metric can be
# ticked by hand. Success curves are matched by suffix because they carry the env id.
KEY_METRICS = (
    "rollout/in_group_std",
    "actor/entropy",
    "actor/grad_norm",
    "response_length/mean",
)


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


def normalise_line(line: str) -> dict[str, Any]:
    """Parse one JSONL line (a Trajectory or an Episode) into the display model."""
    record = json.loads(line)
    if not isinstance(record, dict):
        raise ValueError("expected a JSON object")
    if "turns" in record:
        return normalise_trajectory(Trajectory.from_json(line))
    if "steps" in record:
        return normalise_episode(Episode.from_json(line))
    raise ValueError("neither a Trajectory (no 'turns') nor an Episode (no 'steps')")


def read_episodes(path: Path, cap: int = MAX_EPISODES_PER_SOURCE) -> tuple[list[dict], int]:
    """The first `cap` episodes of a JSONL file and the total number of lines in it.

    A malformed line is a user-visible error naming the file and line, not a silent skip:
    a viewer that hides broken records would hide a broken writer.
    """
    episodes: list[dict] = []
    total = 0
    with path.open(encoding="utf-8") as handle:
        for number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            total += 1
            if len(episodes) >= cap:
                continue
            try:
                episodes.append(normalise_line(line))
            except (ValueError, TypeError, KeyError) as exc:
                raise UserError(f"{path}:{number}: not a trajectory or episode ({exc})") from exc
    return episodes, total


def _step_files(folder: Path) -> list[tuple[int, Path]]:
    """(step, path) for each `step_NNNNNN.jsonl` in `folder`, sorted by step."""
    if not folder.is_dir():
        return []
    found = []
    for path in folder.iterdir():
        match = _STEP_FILE.match(path.name)
        if match:
            found.append((int(match.group(1)), path))
    return sorted(found)


def _source(kind: str, step: int | None, path: Path, cap: int) -> dict[str, Any]:
    episodes, total = read_episodes(path, cap)
    label = "eval" if step is None else f"{'train' if kind == 'train' else 'val'} step {step}"
    return {
        "id": f"{kind}:{'' if step is None else step}",
        "kind": kind,
        "step": step,
        "label": label,
        "file": path.name,
        "total": total,
        "episodes": episodes,
    }


def read_jsonl_objects(path: Path) -> list[dict[str, Any]]:
    """Every JSON object in a JSONL file (absent file: empty list)."""
    if not path.is_file():
        return []
    rows = []
    with path.open(encoding="utf-8") as handle:
        for number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except ValueError as exc:
                raise UserError(f"{path}:{number}: not valid JSON ({exc})") from exc
            if isinstance(row, dict):
                rows.append(row)
    return rows


def read_metrics(path: Path) -> dict[str, list[list[float]]]:
    """metrics.jsonl as {metric: [[step, value], ...]}, skipping nulls and non-numbers."""
    series: dict[str, list[list[float]]] = {}
    for row in read_jsonl_objects(path):
        step = row.get("step")
        if not isinstance(step, (int, float)):
            continue
        for key, value in row.items():
            # bool is an int subclass; a flag is not a curve.
            if key == "step" or isinstance(value, bool) or not isinstance(value, (int, float)):
                continue
            if value != value or value in (float("inf"), float("-inf")):
                continue  # NaN/inf cannot be plotted; JSON could not carry them either
            series.setdefault(key, []).append([step, value])
    return series


def default_metrics(names: list[str]) -> list[str]:
    """The metrics ticked when the page opens: success curves plus the key diagnostics."""
    return [n for n in names if n.endswith("/success") or n in KEY_METRICS]


def load_run(run_dir: Path, cap: int = MAX_EPISODES_PER_SOURCE) -> dict[str, Any]:
    """The whole display model of a training run folder or a `starpo eval` folder."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise UserError(f"{run_dir}: no such folder (give a run or eval output folder)")
    sources = [_source("train", s, p, cap) for s, p in _step_files(run_dir / "trajectories")]
    sources += [_source("val", s, p, cap) for s, p in _step_files(run_dir / "val_trajectories")]
    if (run_dir / "trajectories.jsonl").is_file():
        sources.append(_source("eval", None, run_dir / "trajectories.jsonl", cap))
    if not sources:
        raise UserError(
            f"{run_dir}: no trajectory files (expected trajectories/step_*.jsonl, "
            "val_trajectories/step_*.jsonl or trajectories.jsonl)"
        )
    summary = None
    if (run_dir / "summary.json").is_file():
        try:
            summary = json.loads((run_dir / "summary.json").read_text(encoding="utf-8"))
        except ValueError as exc:
            raise UserError(f"{run_dir / 'summary.json'}: not valid JSON ({exc})") from exc
    metrics = read_metrics(run_dir / "metrics.jsonl")
    alerts = [
        {k: row.get(k) for k in ("step", "state", "rule", "message")}
        for row in read_jsonl_objects(run_dir / "alerts.jsonl")
    ]
    return finite(
        {
            "run": run_dir.resolve().name,
            "cap": cap,
            "sources": sources,
            "metrics": metrics,
            "default_metrics": default_metrics(sorted(metrics)),
            "alerts": alerts,
            "summary": summary,
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
