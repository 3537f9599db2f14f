"""The template-collapse rule (RAGEN-2) on synthetic metric streams: the probe's retrieval
accuracy falls to chance while entropy stays up."""

from __future__ import annotations

import numpy as np
import pytest

from starpo.diagnostics import RULES, CollapseDetector, DiagnosticsConfig
from starpo.diagnostics.rules import Signals, rule_template

N = 8  # pairs per probe sample: chance = 1/8
PROBE_EVERY = 2


def stream(
    seed: int, steps: int = 50, *, acc_from: float, acc_to: float, entropy_to: float = 1.0
) -> list[dict[str, float]]:
    """Entropy near 1 (falling linearly to `entropy_to`), a flat reward, and every
    PROBE_EVERY steps the probe's first-turn retrieval accuracy, moving linearly from
    `acc_from` to `acc_to` between steps 10 and 25 (measured on N pairs: binomial noise)."""
    rng = np.random.default_rng(seed)
    out = []
    for t in range(steps):
        f = min(max((t - 10) / 15, 0.0), 1.0)
        row = {
            "train/Sokoban/reward": 0.3 + rng.normal(0, 0.03),
            "actor/entropy": (1.0 + f * (entropy_to - 1.0)) * (1 + rng.normal(0, 0.03)),
        }
        if t % PROBE_EVERY == 0:
            acc = acc_from + f * (acc_to - acc_from)
            row["diagnostics/mi/first_turn/retrieval_acc"] = rng.binomial(N, acc) / N
            row["diagnostics/mi/first_turn/chance"] = 1 / N
        out.append(row)
    return out


def template_alerts(rows: list[dict[str, float]], cfg: DiagnosticsConfig | None = None):
    detector = CollapseDetector(cfg)
    verdicts = [detector.update(t, row) for t, row in enumerate(rows)]
    return [a for v in verdicts for a in v.alerts if a.rule == "template"]


@pytest.mark.parametrize("seed", range(5))
def test_retrieval_falling_to_chance_at_steady_entropy_warns(seed):
    alerts = template_alerts(stream(seed, acc_from=0.9, acc_to=1 / N))
    assert alerts, "template collapse was not detected"
    assert 15 <= alerts[0].step <= 45  # after the fall began (step 10), well before the end
    assert {a.severity for a in alerts} == {"warning"}
    assert alerts[0].threshold == pytest.approx(1 / N + 0.1 * (1 - 1 / N))


@pytest.mark.parametrize("seed", range(5))
def test_input_dependent_replies_never_warn(seed):
    assert template_alerts(stream(seed, acc_from=0.9, acc_to=0.7)) == []


@pytest.mark.parametrize("seed", range(3))
def test_retrieval_at_chance_with_collapsing_entropy_is_not_template_collapse(seed):
    # Entropy fell to a tenth: an entropy collapse, which the entropy rule reports.
    rows = stream(seed, acc_from=0.9, acc_to=1 / N, entropy_to=0.1)
    assert template_alerts(rows) == []


def test_runs_without_the_probe_never_warn():
    at_chance = stream(0, acc_from=1 / N, acc_to=1 / N)
    rows = [{k: v for k, v in row.items() if "/mi/" not in k} for row in at_chance]
    assert template_alerts(rows) == []
    assert "template" in RULES


def test_one_probe_is_not_enough_and_the_margin_is_a_setting():
    cfg = DiagnosticsConfig()
    s = Signals(
        ema={"retrieval": 0.2, "chance": 0.125, "entropy": 1.0},
        peak={"entropy": 1.0},
        trend={"retrieval": [0.2]},
    )
    assert rule_template(s, cfg, 9) is None  # one probe so far
    s.trend["retrieval"].append(0.2)
    alert = rule_template(s, cfg, 9)
    assert alert is not None and alert.value == 0.2
    assert rule_template(s, DiagnosticsConfig(template_acc_margin=0.05), 9) is None
    s.ema["entropy"] = 0.4  # below template_entropy_ratio (0.5) x its peak
    assert rule_template(s, cfg, 9) is None
