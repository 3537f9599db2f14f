"""Extensions defined outside the package, as a user's own code defines them: an env, an
advantage estimator with a parameter of its own, a generation backend and a metric sink,
each one class or function plus one registration, used by `starpo train` (the Trainer),
Ray rollout workers included. Entry points (a package's pyproject.toml) reach every
registry the same way."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, ClassVar

import pytest
import torch

from starpo import envs, registry
from starpo.envs.base import TextEnv
from starpo.rollout.backends.base import BackendNumerics, Generation
from starpo.runs.metrics import read_metrics
from starpo.trainer.loop import Trainer


class CoinEnv(TextEnv):
    """One turn: call the coin; "Heads" always wins (the scripted backend knows it)."""

    description: ClassVar[str] = "A coin that always lands heads; 1 turn."
    instruction = "Call the coin: <answer> Heads </answer> or <answer> Tails </answer>."

    def __init__(self) -> None:
        super().__init__(max_steps=1)
        self.action_names = ("Heads", "Tails")
        self.reward_range = (0.0, 1.0)
        self.legend = {}
        self._call: str | None = None

    def _reset(self, options: dict[str, Any]) -> dict[str, Any]:
        self._call = None
        return {}

    def _step(self, action_index: int) -> tuple[float, bool, bool, dict[str, Any]]:
        self._call = self.action_names[action_index]
        return float(self._call == "Heads"), True, True, {}

    def render(self) -> str:
        return "A coin spins." if self._call is None else f"You called {self._call}."

    def snapshot(self) -> Any:
        return self._call

    def is_success(self) -> bool:
        return self._call == "Heads"


class ScriptedBackend:
    """A generation backend that always answers "Heads", in one of two spellings
    (alternating). Without think the prompt already ends with "<answer>"."""

    def __init__(self, tokenizer: Any) -> None:
        self.answers = [
            tokenizer.encode(" Heads </answer>", add_special_tokens=False),
            tokenizer.encode("Heads</answer>", add_special_tokens=False),
        ]
        self.numerics = BackendNumerics("scripted", "float32", exact_logprobs=False)
        self.calls = 0

    def generate(self, requests, params):
        self.calls += 1
        out = []
        for i, _ in enumerate(requests):
            tokens = self.answers[i % 2][: params.max_new_tokens]
            out.append(Generation(list(tokens), [-0.5] * len(tokens), "length"))
        return out

    def release(self, sessions) -> None:
        pass

    def reset(self) -> None:
        pass

    def seed(self, seed: int) -> None:
        pass

    def update_weights(self, model: Any, version: int) -> None:
        pass


def build_scripted_backend(model, tokenizer, *, compute_dtype=torch.float32, seed=0):
    return ScriptedBackend(tokenizer)


def scaled_estimator(inputs, params):
    """Every agent token's advantage is the estimator's own parameter `scale` (read from
    algorithm.estimator_args); no critic."""
    return inputs.mask * float(params.extra["scale"]), None


class FileSink:
    """A metric sink writing each step's success to `plugin_sink.jsonl` in the run folder."""

    def __init__(self, run_dir: Path, config: dict) -> None:
        self.path = Path(run_dir) / "plugin_sink.jsonl"
        self.env = config["env"]["id"]

    def log(self, step: int, metrics) -> None:
        success = metrics.get(f"train/{self.env}/success")
        with self.path.open("a") as f:
            f.write(json.dumps({"step": step, "success": success}) + "\n")

    def truncate_after(self, step: int) -> None:
        pass

    def close(self) -> None:
        pass


def build_file_sink(run_dir: Path, *, config: dict, resume: bool) -> FileSink:
    return FileSink(run_dir, config)


@pytest.fixture
def plugins():
    """Register the four plugins for one test, and remove them after."""
    envs.register("plugin-coin", CoinEnv, overwrite=True)
    registry.GENERATION_BACKENDS.register("plugin-scripted", build_scripted_backend)
    registry.METRIC_SINKS.register("plugin-file", build_file_sink)
    registry.ADVANTAGE_ESTIMATORS.register("plugin-scaled", scaled_estimator, critic=False)
    try:
        yield
    finally:
        registry.GENERATION_BACKENDS.unregister("plugin-scripted")
        registry.METRIC_SINKS.unregister("plugin-file")
        registry.ADVANTAGE_ESTIMATORS.unregister("plugin-scaled")


PLUGIN_OVERRIDES = {
    "env.id": "plugin-coin",
    "env.kwargs": "{}",
    "rollout.backend": "plugin-scripted",
    "trainer.sinks": "[plugin-file]",
    "algorithm.adv_estimator": "plugin-scaled",
    "algorithm.estimator_args": "{scale: 0.5}",
    "trainer.val_every": "0",
    "trainer.val_before_train": "false",
    "trainer.save_every": "0",
}


def _train_with_plugins(tmp_path: Path, bigram_model, make_bandit_config, **extra: str):
    cfg = make_bandit_config("grpo", total_steps=2, **PLUGIN_OVERRIDES, **extra)
    model, tokenizer = bigram_model()
    trainer = Trainer(cfg, tmp_path, quiet=True, model=model, tokenizer=tokenizer)
    return trainer, trainer.train()


def test_env_estimator_backend_and_sink_plugins_train_in_process(
    plugins, tmp_path, bigram_model, make_bandit_config
):
    trainer, history = _train_with_plugins(tmp_path, bigram_model, make_bandit_config)
    assert trainer.backend.numerics.name == "scripted" and trainer.backend.calls > 0
    assert [row["train/plugin-coin/success"] for row in history] == [1.0, 1.0]
    assert [row["actor/advantage_mean"] for row in history] == [0.5, 0.5]
    sunk = [json.loads(line) for line in (tmp_path / "plugin_sink.jsonl").read_text().splitlines()]
    assert sunk == [{"step": 1, "success": 1.0}, {"step": 2, "success": 1.0}]
    assert [row["step"] for row in read_metrics(tmp_path)] == [1, 2]


@pytest.mark.slow
def test_env_and_backend_plugins_reach_ray_rollout_workers(
    plugins, ray_cluster, tmp_path, bigram_model, make_bandit_config
):
    """The workers build the backend from the factory the driver resolved (their own
    registry never saw it) and the env from the spec the driver sends."""
    trainer, history = _train_with_plugins(
        tmp_path, bigram_model, make_bandit_config, **{"rollout.workers": "1"}
    )
    assert trainer.pool is None  # the workers played and are gone
    assert trainer.backend.calls == 0  # the driver's own backend never generated
    assert [row["train/plugin-coin/success"] for row in history] == [1.0, 1.0]
    assert history[-1]["perf/weight_broadcast_mb"] > 0


def test_entry_points_reach_every_registry(tmp_path, monkeypatch):
    """A package that declares `starpo.<registry>` entry points (here a dist-info folder on
    sys.path, as pip installs one) is found by name, imported only when used."""
    package = tmp_path / "starpo_plugin_demo.py"
    package.write_text(
        "def estimator(inputs, params):\n    return inputs.mask, None\n"
        "estimator.registry_info = {'critic': False, 'groups': True}\n"
        "def sink(run_dir, *, config, resume):\n    return None\n"
    )
    dist = tmp_path / "starpo_plugin_demo-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: starpo-plugin-demo\nVersion: 0.1\n"
    )
    (dist / "entry_points.txt").write_text(
        "[starpo.advantage_estimators]\ndemo_adv = starpo_plugin_demo:estimator\n\n"
        "[starpo.metric_sinks]\ndemo_sink = starpo_plugin_demo:sink\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    registry.installed_entry_points.cache_clear()
    fresh = {
        "adv": registry.Registry("advantage estimator", "starpo.advantage_estimators"),
        "sink": registry.Registry("metric sink", "starpo.metric_sinks"),
    }
    try:
        assert "demo_adv" in fresh["adv"] and "demo_sink" in fresh["sink"]
        assert "starpo_plugin_demo" not in __import__("sys").modules  # not imported yet
        assert fresh["adv"].info("demo_adv") == {"critic": False, "groups": True}
        assert fresh["adv"]["demo_adv"].__name__ == "estimator"
        assert fresh["sink"]["demo_sink"](tmp_path, config={}, resume=False) is None
    finally:
        registry.installed_entry_points.cache_clear()
