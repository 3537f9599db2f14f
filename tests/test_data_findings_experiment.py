"""experiments/data_findings.py: arms share their layout's SFT model, the findings' tables
come from the arms' recipe folders, and the verdict reads the intervals."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

_SPEC = importlib.util.spec_from_file_location(
    "data_findings", Path(__file__).parents[1] / "experiments" / "data_findings.py"
)
data_findings = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(data_findings)


def _row(success: float, low: float, high: float) -> dict:
    return {"success": success, "success_ci95_low": low, "success_ci95_high": high,
            "num_episodes": 256}  # fmt: skip


def _fake_arm(out: Path, arm: str, rl: dict, steps: int = 30) -> None:
    """An arm's folder as `starpo demo --env frozenlake` leaves it when finished."""
    (out / arm).mkdir(parents=True)
    results = {
        "rows": {"SFT": _row(0.30, 0.25, 0.36), "SFT + GRPO": {**rl, "label": "SFT + GRPO"}},
        "rl_runs": {"grpo": {"steps": steps, "train_minutes": 12.5}},
    }
    (out / arm / "results.json").write_text(json.dumps(results))


def test_only_the_first_arm_of_a_layout_makes_its_sft_model():
    arms = ["k1", "k3", "reuse4", "k5", "16x4"]
    assert data_findings.layout_makers(arms) == ["k1", "k3", "k5"]
    assert data_findings.layout_makers(["reuse4", "k1"]) == ["reuse4"]  # any arm may make it
    assert data_findings.layout("16x4") == () == data_findings.layout("k1")
    assert data_findings.layout("k5") == ("rollout.max_actions_per_turn=5", "rollout.max_turns=2")


def test_an_arm_links_the_sft_stages_of_the_first_arm_of_its_layout(tmp_path):
    arms = ["k1", "k3", "reuse4"]
    for arm in arms:
        data_findings.share_start(tmp_path, arm, arms)
    assert not (tmp_path / "k1").exists() and not (tmp_path / "k3").exists()
    for stage in ("sft", "sft-eval"):
        link = tmp_path / "reuse4" / stage
        assert link.is_symlink() and link.readlink() == Path("..") / "k1" / stage
    (tmp_path / "k1" / "sft").mkdir(parents=True)
    assert (tmp_path / "reuse4" / "sft").is_dir()  # relative: resolves beside the arm
    data_findings.share_start(tmp_path, "reuse4", arms)  # a rerun leaves the links


def test_the_user_overrides_come_last_so_they_win():
    cmd = data_findings.demo_command(Path("out"), "k3", ["--steps", "5"], ["optim.actor_lr=1e-5"])
    assert cmd[cmd.index("--out") + 1] == str(Path("out") / "k3")
    assert cmd[-1] == "optim.actor_lr=1e-5"
    assert cmd.index("optim.actor_lr=2e-5") < cmd.index("rollout.max_turns=4") < len(cmd) - 1
    assert "--steps" in cmd and "env.kwargs={is_slippery: false}" in cmd


def test_the_verdict_reads_the_intervals():
    apart = {"k1": {"rl": _row(0.2, 0.15, 0.25)}, "k5": {"rl": _row(0.4, 0.34, 0.46)}}
    assert data_findings.verdict(apart, "k5") == "confirmed"
    assert data_findings.verdict(apart, "k1") == "contradicted"
    close = {"k1": {"rl": _row(0.2, 0.15, 0.25)}, "k5": {"rl": _row(0.24, 0.19, 0.30)}}
    assert data_findings.verdict(close, "k5") == "not separated by the intervals"
    assert data_findings.verdict(close, None) == "no direction stated"
    assert data_findings.verdict({"k1": close["k1"]}, "k5") == "its best arm did not finish"
    assert data_findings.verdict({"k1": close["k1"]}, "k1") == "no other arm finished"


def test_the_tables_come_from_the_finished_arms(tmp_path, capsys):
    _fake_arm(tmp_path, "k1", _row(0.50, 0.44, 0.56))
    _fake_arm(tmp_path, "reuse4", _row(0.30, 0.25, 0.36), steps=12)
    assert data_findings.main(["--out", str(tmp_path), "--summary-only"]) == 0
    saved = json.loads((tmp_path / "results.json").read_text())
    freshness = saved["findings"]["freshness"]
    assert freshness["verdict"] == "confirmed"
    assert freshness["rows"]["reuse4"]["rl"]["steps"] == 12
    assert freshness["rows"]["k1"]["start"]["success"] == 0.30
    assert set(saved["findings"]["granularity"]["rows"]) == {"k1"}
    assert saved["findings"]["granularity"]["verdict"] == "its best arm did not finish"
    printed = capsys.readouterr().out
    assert "k3      not finished" in printed
    assert "reuse4  start  30.0%  RL  30.0% (25.0% - 36.0%, 256 seeds)  12 steps" in printed


def test_export_copies_the_named_arms_runs_and_every_table(tmp_path):
    out, dest = tmp_path / "runs", tmp_path / "docs"
    for arm in ("k1", "k3", "16x4"):
        _fake_arm(out, arm, _row(0.50, 0.44, 0.56))
        (out / arm / "rl-grpo").mkdir()
        (out / arm / "rl-grpo" / "metrics.jsonl").write_text(f'{{"arm": "{arm}"}}\n')
    argv = ["--out", str(out), "--summary-only", "--export", str(dest), "--arms", "16x4", "k1"]
    assert data_findings.main(argv) == 0
    assert sorted(p.name for p in dest.iterdir()) == ["16x4", "k1", "results.json"]
    assert (dest / "16x4" / "metrics.jsonl").read_text() == '{"arm": "16x4"}\n'
    tables = json.loads((dest / "results.json").read_text())["findings"]
    assert set(tables["granularity"]["rows"]) == {"k1", "k3"}  # every finding, all arms


def test_arms_are_space_or_comma_separated_and_unknown_ones_are_named(capsys):
    parse = data_findings.main
    with pytest.raises(SystemExit):
        parse(["--arms", "k1,k7", "--summary-only"])
    assert "--arms: unknown 'k7': choose from k1, k3, k5, reuse4, 16x4, 4x16" in (
        capsys.readouterr().err
    )
    with pytest.raises(SystemExit):
        parse(["--arms", "k1", "k7", "--summary-only"])
    assert "unknown 'k7'" in capsys.readouterr().err


@pytest.mark.slow
def test_two_arms_of_one_layout_train_from_one_sft_model(tmp_path, tiny_model_dir):
    """The script end to end on a tiny model: `k1` makes the SFT model, `reuse4` trains from
    it (its start row is the same evaluation) and both arms' rows reach results.json."""
    tiny = [
        f"model.name={tiny_model_dir}", "model.dtype=fp32", "trainer.num_threads=1",
        "rollout.num_groups=2", "rollout.group_size=2", "trainer.val_seeds=3",
        "optim.mini_batch_size=2", "optim.micro_batch_size=2",
    ]  # fmt: skip
    argv = ["--out", str(tmp_path), "--quick", "--steps", "1", "--eval-seeds", "3"]
    assert data_findings.main([*argv, "--arms", "k1,reuse4", *tiny]) == 0  # overrides last
    assert (tmp_path / "reuse4" / "sft").resolve() == (tmp_path / "k1" / "sft").resolve()
    log = (tmp_path / "reuse4" / "demo.log").read_text()
    assert "[sft] done before" in log
    rows = json.loads((tmp_path / "results.json").read_text())["findings"]["freshness"]["rows"]
    assert rows["k1"]["start"] == rows["reuse4"]["start"]
    assert rows["k1"]["rl"]["steps"] == rows["reuse4"]["rl"]["steps"] == 1
