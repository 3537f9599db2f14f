"""The collapse detector on synthetic streams shaped like RAGEN's published curves."""

from __future__ import annotations

import json

import numpy as np
import pytest

from starpo.diagnostics import (
    RULES,
    AlertLog,
    CollapseDetector,
    DiagnosticsConfig,
    state_metrics,
)
from starpo.diagnostics.detector import DetectorVerdict, find_key
from starpo.diagnostics.rules import Alert, Signals, rule_think, step_noise, window_mean_std

COLLAPSE_STEP = 20  # the reward peak starts to drop here (GRPO on Bandit, RAGEN paper)


def ramp(t: int, t0: int, t1: int, v0: float, v1: float) -> float:
    """v0 before t0, v1 after t1, linear in between."""
    f = min(max((t - t0) / (t1 - t0), 0.0), 1.0)
    return v0 + f * (v1 - v0)


def grpo_collapse_stream(seed: int, steps: int = 40) -> list[dict[str, float]]:
    """Reward rises, plateaus, drops from step 20; std and entropy fall from ~10;
    grad-norm spikes near the collapse; think length shrinks to 0; outputs repeat."""
    rng = np.random.default_rng(seed)
    out = []
    for t in range(steps):
        reward = ramp(t, 0, 15, 0.2, 0.8) if t < COLLAPSE_STEP else ramp(t, 20, 30, 0.8, 0.1)
        entropy = 1.0 if t < 10 else max(0.1, 10 ** (-(t - 10) / 12))
        out.append(
            {
                "train/Bandit/reward": reward + rng.normal(0, 0.03),
                "train/Bandit/train_reward": 0.0,  # must not be taken for the reward key
                "rollout/in_group_std": max(ramp(t, 10, 22, 0.4, 0.02) + rng.normal(0, 0.02), 0),
                "rollout/zero_std_groups": ramp(t, 10, 22, 0.1, 0.95),
                "actor/entropy": entropy * (1 + rng.normal(0, 0.03)),
                "actor/grad_norm": (10.0 if t in (21, 24, 27) else 1.0)
                * float(np.exp(rng.normal(0, 0.1))),
                "train/Bandit/mean_think_tokens": max(ramp(t, 10, 25, 80, 0) + rng.normal(0, 3), 0),
                "diagnostics/distinct_2": ramp(t, 12, 25, 0.7, 0.15) + rng.normal(0, 0.02),
                "diagnostics/identical_in_group": ramp(t, 15, 28, 0.02, 0.95),
            }
        )
    return out


def ppo_healthy_stream(seed: int, steps: int = 200) -> list[dict[str, float]]:
    """Slowly rising noisy reward, entropy declining to ~60%, stable std, mild grad noise."""
    rng = np.random.default_rng(seed)
    out = []
    for t in range(steps):
        f = t / steps
        bump = 1.5 if rng.random() < 0.03 else 1.0  # occasional mild grad-norm bumps
        out.append(
            {
                "train/Sokoban/reward": 0.2 + 0.5 * f + rng.normal(0, 0.05),
                "rollout/in_group_std": 0.35 + rng.normal(0, 0.03),
                "rollout/zero_std_groups": float(np.clip(0.2 + rng.normal(0, 0.05), 0, 1)),
                "actor/entropy": (1 - 0.4 * f) * (1 + rng.normal(0, 0.03)),
                "actor/grad_norm": float(np.exp(rng.normal(0, 0.15))) * bump,
                "train/Sokoban/mean_think_tokens": 60 - 15 * f + rng.normal(0, 5),
                "diagnostics/distinct_2": 0.6 + rng.normal(0, 0.03),
                "diagnostics/identical_in_group": float(np.clip(0.02 + rng.normal(0, 0.01), 0, 1)),
            }
        )
    return out


def noise_stream(seed: int, steps: int = 300) -> list[dict[str, float]]:
    """Flat signals with sizeable noise (nothing trends)."""
    rng = np.random.default_rng(seed)
    return [
        {
            "train/FrozenLake/reward": 0.5 + rng.normal(0, 0.1),
            "rollout/in_group_std": abs(0.3 + rng.normal(0, 0.05)),
            "actor/entropy": 0.8 + rng.normal(0, 0.05),
            "actor/grad_norm": float(np.exp(rng.normal(0, 0.25))),
            "train/FrozenLake/mean_think_tokens": 40 + rng.normal(0, 8),
            "diagnostics/distinct_2": 0.5 + rng.normal(0, 0.05),
        }
        for _ in range(steps)
    ]


def run(stream: list[dict[str, float]], detector: CollapseDetector | None = None, start: int = 0):
    detector = detector or CollapseDetector(DiagnosticsConfig())
    return detector, [detector.update(start + t, m) for t, m in enumerate(stream)]


@pytest.mark.parametrize("seed", range(5))
def test_grpo_collapse_is_detected_early(seed):
    _, verdicts = run(grpo_collapse_stream(seed))
    first_warning = next(v.step for v in verdicts if v.state != "healthy")
    assert 5 <= first_warning < COLLAPSE_STEP  # warned before the reward peak drops
    assert verdicts[-1].state == "collapse"
    fired = {a.rule for v in verdicts for a in v.alerts}
    # Every rule sees its part of the Echo Trap; template collapse (RAGEN-2) is another
    # failure, read from probe metrics this stream has not (see test_template_rule.py);
    # a bandit has no decision labels for the answers rule (see test_answer_rule.py).
    assert fired == set(RULES) - {"template", "answers"}
    assert all(v.state != "collapse" for v in verdicts[:COLLAPSE_STEP])


@pytest.mark.parametrize("seed", range(8))
def test_healthy_ppo_run_never_alerts(seed):
    _, verdicts = run(ppo_healthy_stream(seed))
    alerts = [a.message for v in verdicts for a in v.alerts]
    assert alerts == []
    assert {v.state for v in verdicts} == {"healthy"}


@pytest.mark.parametrize("seed", range(8))
def test_noise_only_streams_stay_quiet(seed):
    _, verdicts = run(noise_stream(seed))
    assert [a.message for v in verdicts for a in v.alerts] == []


def test_warm_up_suppresses_alerts():
    # A collapse-level signal from the second update on: nothing during min_steps updates.
    cfg = DiagnosticsConfig(min_steps=5, ema_alpha=1.0)
    stream = [{"diagnostics/identical_in_group": 0.0}] + [
        {"diagnostics/identical_in_group": 1.0}
    ] * 7
    _, verdicts = run(stream, CollapseDetector(cfg))
    assert [v.state for v in verdicts] == ["healthy"] * 5 + ["collapse"] * 3


def test_alike_answers_from_the_start_are_no_collapse():
    # A two-armed bandit's answers are alike from step 1: no rise, no alert.
    _, verdicts = run([{"diagnostics/identical_in_group": 1.0}] * 30, CollapseDetector())
    assert {v.state for v in verdicts} == {"healthy"}


def test_a_solved_task_may_turn_deterministic():
    """Entropy and in-group std falling while 95% of episodes succeed is convergence."""
    stream = [
        {
            "train/bandit/success": 0.95,
            "train/bandit/reward": 0.2,
            "actor/entropy": 1.0 * 0.7**i,
            "rollout/in_group_std": 0.5 * 0.7**i,
        }
        for i in range(30)
    ]
    _, verdicts = run(stream, CollapseDetector())
    assert {v.state for v in verdicts} == {"healthy"}
    unsolved = [{k: v for k, v in row.items() if "success" not in k} for row in stream]
    _, verdicts = run(unsolved, CollapseDetector())
    assert verdicts[-1].state != "healthy"  # the same narrowing without success is flagged


def test_state_fades_after_window():
    cfg = DiagnosticsConfig(min_steps=1, window=3)
    stream = [{"diagnostics/identical_in_group": 0.0}] * 2
    stream += [{"diagnostics/identical_in_group": 1.0}]  # EMA 0.3: quiet
    stream += [{"diagnostics/identical_in_group": 0.0}] * 4
    _, verdicts = run(stream, CollapseDetector(cfg))
    assert {v.state for v in verdicts} == {"healthy"}
    cfg = DiagnosticsConfig(min_steps=1, window=3, ema_alpha=1.0)
    _, verdicts = run(stream, CollapseDetector(cfg))
    assert [v.state for v in verdicts] == ["healthy"] * 2 + ["collapse"] * 3 + ["healthy"] * 2


def test_state_dict_round_trip_resumes_identically():
    stream = grpo_collapse_stream(seed=3)
    _, straight = run(stream)
    first, _ = run(stream[:17])
    state = json.loads(json.dumps(first.state_dict()))  # must survive JSON checkpoints
    resumed = CollapseDetector(DiagnosticsConfig())
    resumed.load_state_dict(state)
    _, rest = run(stream[17:], resumed, start=17)
    assert rest == straight[17:]
    with pytest.raises(ValueError):
        resumed.load_state_dict({"version": 99})


def test_reward_key_detection_and_override():
    pattern = DiagnosticsConfig().reward_key
    assert find_key({"train/Bandit/train_reward": 1, "train/Bandit/reward": 0}, pattern) == (
        "train/Bandit/reward"
    )
    assert find_key({"val/Bandit/reward": 1}, pattern) is None
    detector = CollapseDetector(DiagnosticsConfig(reward_key="my/reward"))
    detector.update(0, {"my/reward": 0.5, "train/X/reward": 9.0})
    assert detector.signals.ema["reward"] == 0.5


def test_signal_keys_are_kept_and_old_states_load():
    detector = CollapseDetector()
    detector.update(0, {"train/b/reward": 0.5, "train/b/mean_think_tokens": 9.0})
    detector.update(1, {"train/a/reward": 0.1, "train/b/reward": 0.5})  # b stays the env
    assert detector.signals.ema["reward"] == 0.5
    assert detector.signals.keys["think"] == "train/b/mean_think_tokens"
    state = detector.state_dict()
    del state["signals"]["keys"]
    state["signals"]["reward_key"] = "train/b/reward"  # a checkpoint from before `keys`
    resumed = CollapseDetector()
    resumed.load_state_dict(state)
    assert resumed.signals.keys == {"reward": "train/b/reward"}


def test_missing_and_nan_metrics_are_skipped():
    detector = CollapseDetector()
    verdict = detector.update(0, {"actor/entropy": float("nan"), "unrelated": 1.0})
    assert verdict.state == "healthy" and detector.signals.ema == {}


def test_state_metrics():
    alert = Alert(7, "think", "warning", "m", 1.0, 2.0)
    out = state_metrics(DetectorVerdict(7, "warning", [alert]))
    assert out["diagnostics/state"] == 1.0
    assert out["diagnostics/alert/think"] == 1.0
    assert out["diagnostics/alert/grad_spike"] == 0.0
    assert len(out) == 1 + len(RULES)


def test_rules_are_pure_functions_of_signals():
    cfg = DiagnosticsConfig()
    s = Signals(ema={"think": 5.0}, peak={"think": 80.0})
    alert = rule_think(s, cfg, step=9)
    assert alert is not None and alert.threshold == pytest.approx(24.0)
    assert rule_think(Signals(ema={"think": 1.0}, peak={"think": 5.0}), cfg, 9) is None


def test_statistics_helpers():
    values = [1e9 + x for x in (1.0, 2.0, 3.0, 4.0)]
    mean, std = window_mean_std(values)
    assert mean == pytest.approx(1e9 + 2.5) and std == pytest.approx(np.std(values, ddof=1))
    assert step_noise([0.0, 1.0, 2.0, 3.0]) == 0.0  # a pure trend is not noise


def test_config_validation():
    with pytest.raises(ValueError, match="ema_alpha"):
        DiagnosticsConfig(ema_alpha=0.0)
    with pytest.raises(ValueError, match="identical_warn"):
        DiagnosticsConfig(identical_warn=0.95, identical_collapse=0.9)


def test_alert_log_appends_and_truncates(tmp_path):
    log = AlertLog(tmp_path)
    assert log.path == tmp_path / "alerts.jsonl" and log.read() == []
    _, verdicts = run(grpo_collapse_stream(seed=0))
    for verdict in verdicts:
        log.write(verdict)
    records = log.read()
    assert records and set(records[0]) == {
        "step",
        "state",
        "rule",
        "severity",
        "message",
        "value",
        "threshold",
    }
    assert len(records) == sum(len(v.alerts) for v in verdicts)
    log.truncate_after(22)
    assert log.read() == [r for r in records if r["step"] <= 22]
    assert not (tmp_path / "alerts.jsonl.tmp").exists()
    assert AlertLog(tmp_path / "x.jsonl").path == tmp_path / "x.jsonl"


def test_repetition_at_a_steady_reward_is_a_warning_not_a_collapse():
    # Answers become identical within groups while the reward holds its level (a bandit
    # policy that settled): warn, but no collapse; the same with a falling reward collapses.
    rng = np.random.default_rng(0)
    steady = [
        {
            "train/bandit/reward": 0.25 + 0.05 * rng.standard_normal(),
            "diagnostics/identical_in_group": min(1.0, 0.1 + 0.05 * i),
        }
        for i in range(40)
    ]
    _, verdicts = run(steady)
    states = {v.state for v in verdicts}
    assert "warning" in states and "collapse" not in states
    falling = [
        dict(row, **{"train/bandit/reward": 0.5 - 0.015 * i}) for i, row in enumerate(steady)
    ]
    _, verdicts = run(falling)
    assert any(
        a.rule == "diversity" and a.severity == "collapse" for v in verdicts for a in v.alerts
    )
