"""The training config: defaults, presets, overrides, `base:` inheritance, round trips,
validation messages (one line, naming the key) and help text."""

from __future__ import annotations

import ast
import string
import subprocess
import sys
import types
import typing
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel

import starpo.config as config_module
from starpo.config import (
    PRESETS_DIR,
    DiagnosticsConfig,
    OptimConfig,
    RolloutConfig,
    TrainConfig,
    config_from_dict,
    config_help,
    config_to_dict,
    field_rules,
    format_config_help,
    load_config,
    presets,
    save_config,
    yaml_text,
)
from starpo.errors import UserError

CONFIGS = PRESETS_DIR
PRESETS = sorted(CONFIGS.glob("*.yaml"))
PAPER_ENVS = ["bandit", "sokoban", "frozenlake"]


def leaf_fields(cls: type = TrainConfig, prefix: str = ""):
    """(dotted key, field, type) of every setting, nested sections flattened."""
    for name, f in cls.model_fields.items():
        if isinstance(f.annotation, type) and issubclass(f.annotation, BaseModel):
            yield from leaf_fields(f.annotation, f"{prefix}{name}.")
        else:
            yield prefix + name, f, f.annotation


def user_error(overrides: list[str]) -> str:
    with pytest.raises(UserError) as info:
        load_config(None, overrides)
    message = str(info.value)
    assert "\n" not in message, message
    return message


def write(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8")
    return path


# ------------------------------------------------------------------------ defaults


def test_defaults_are_valid_and_match_the_reference():
    cfg = load_config(None, [])
    assert cfg == TrainConfig()
    assert cfg.preset is None
    assert cfg.model.name == "smollm2-135m-instruct" and cfg.model.device == "cpu"
    assert (cfg.rollout.num_groups, cfg.rollout.group_size) == (8, 16)
    assert cfg.trajectories_per_step == 128
    assert (cfg.optim.actor_lr, cfg.optim.critic_lr, cfg.optim.mini_batch_size) == (1e-6, 1e-5, 32)
    assert cfg.optim.betas == (0.9, 0.999)
    assert (cfg.algorithm.clip_low, cfg.algorithm.clip_high) == (0.2, 0.28)
    assert cfg.model.lora.rank == 64 and cfg.model.lora.lr_multiplier == 10.0
    assert (cfg.trainer.val_every, cfg.trainer.val_seeds, cfg.trainer.val_seed_start) == (
        10,
        256,
        123,
    )
    assert cfg.algorithm.uses_critic and not cfg.algorithm.uses_reference


def test_every_field_has_a_default_and_help():
    for key, f, _ in leaf_fields():
        assert not f.is_required(), key
        assert field_rules(f).get("help", "").strip(), f"{key} has no help text"


def test_env_validation_defaults_follow_the_training_env():
    cfg = load_config(None, ["env.id=sokoban", "env.kwargs={num_boxes: 1}"])
    assert cfg.env.validation_id == "sokoban" and cfg.env.validation_kwargs == {"num_boxes": 1}
    cfg = load_config(None, ["env.val_id=bandit-rev", "env.val_kwargs={}"])
    assert cfg.env.validation_id == "bandit-rev" and cfg.env.validation_kwargs == {}


def test_rollout_section_builds_the_engine_settings_from_one_definition():
    from starpo.rollout.engine import EpisodeSettings

    settings = RolloutConfig(max_new_tokens=64).settings(temperature=0.5)
    assert isinstance(settings, EpisodeSettings)
    assert settings.max_new_tokens == 64 and settings.temperature == 0.5
    episode = set(EpisodeSettings.model_fields)
    per_step = {
        "num_groups",
        "group_size",
        "train_seed_start",
        "backend",
        "dtype",
        "workers",
        "share_histories",
        "kv_dtype",
    }
    assert set(RolloutConfig.model_fields) == episode | per_step
    for name, f in EpisodeSettings.model_fields.items():  # the one definition's default, help
        info = RolloutConfig.model_fields[name]
        assert info.default == f.default, name
        if name != "temperature":  # training refuses greedy rollouts: its own help
            assert info.description == f.description, name
            assert field_rules(info) == field_rules(f), name


def test_config_choices_read_the_registry():
    from starpo import registry

    cfg = load_config(None, [])
    assert (
        cfg.algorithm.uses_critic
        and not load_config(
            None, ["algorithm.adv_estimator=grpo", "rollout.group_size=4"]
        ).algorithm.uses_critic
    )
    rules = {
        "adv_estimator": registry.ADVANTAGE_ESTIMATORS,
        "loss_agg": registry.LOSS_AGGREGATIONS,
    }
    for name, reg in rules.items():
        info = type(cfg.algorithm).model_fields[name]
        assert set(info.json_schema_extra["choices"]) == set(reg)
    kl = type(cfg.algorithm).model_fields["kl_estimator"].json_schema_extra["choices"]
    assert set(kl) == {"auto", *registry.KL_ESTIMATORS}
    mode = type(cfg.filter).model_fields["mode"].json_schema_extra["choices"]
    assert set(mode) == set(registry.FILTER_MODES)
    backend = type(cfg.rollout).model_fields["backend"].json_schema_extra["choices"]
    assert set(backend) == set(registry.GENERATION_BACKENDS)
    with pytest.raises(UserError, match="did you mean rollout.backend=hf"):
        load_config(None, ["rollout.backend=hff"])


# ------------------------------------------------------------------------- presets


@pytest.mark.parametrize("path", PRESETS, ids=[p.name for p in PRESETS])
def test_every_preset_loads_and_round_trips(path, tmp_path):
    cfg = load_config(path, [])
    assert cfg.preset == path.stem
    save_config(cfg, tmp_path / "saved.yaml")
    assert load_config(tmp_path / "saved.yaml", []) == cfg


def test_the_presets_exist():
    names = {p.name for p in PRESETS}
    for env_id in PAPER_ENVS:
        assert {f"{env_id}-starpo.yaml", f"{env_id}-starpo-s.yaml"} <= names
    assert {"paper-base.yaml", "cpu-bandit-starpo-s.yaml", "cpu-tiny-smoke.yaml"} <= names


@pytest.mark.parametrize("env_id", PAPER_ENVS)
def test_paper_presets_follow_the_paper(env_id):
    vanilla = load_config(CONFIGS / f"{env_id}-starpo.yaml", [])
    star_s = load_config(CONFIGS / f"{env_id}-starpo-s.yaml", [])
    for cfg in (vanilla, star_s):
        assert cfg.env.id == env_id and cfg.model.name == "Qwen/Qwen2.5-0.5B-Instruct"
        assert (cfg.model.device, cfg.model.dtype) == ("cuda", "auto")  # auto: bf16 on CUDA
        assert (cfg.rollout.num_groups, cfg.rollout.group_size) == (8, 16)
        assert (cfg.optim.actor_lr, cfg.optim.critic_lr) == (1e-6, 1e-5)
        assert (cfg.optim.mini_batch_size, cfg.optim.ppo_epochs) == (32, 1)
        assert (cfg.rollout.temperature, cfg.rollout.max_new_tokens) == (1.0, 400)
        assert (cfg.trainer.total_steps, cfg.trainer.val_every, cfg.trainer.val_seeds) == (
            200,
            10,
            256,
        )
        assert cfg.algorithm.adv_estimator == "gae"
    assert not vanilla.filter.enabled
    assert (vanilla.algorithm.kl_coef, vanilla.algorithm.kl_estimator) == (0.001, "k3")
    assert vanilla.algorithm.dual_clip == 3.0
    assert (vanilla.algorithm.clip_low, vanilla.algorithm.clip_high) == (0.2, 0.2)
    assert star_s.filter.enabled and (star_s.filter.ratio, star_s.filter.mode) == (0.25, "top_std")
    assert star_s.algorithm.kl_coef == 0.0
    assert (star_s.algorithm.clip_low, star_s.algorithm.clip_high) == (0.2, 0.28)
    turns = (1, 1) if env_id == "bandit" else (5, 5)
    assert (vanilla.rollout.max_turns, vanilla.rollout.max_actions_per_turn) == turns


def test_cpu_presets_use_the_embedded_model_on_cpu():
    demo = load_config(CONFIGS / "cpu-bandit-starpo-s.yaml", [])
    smoke = load_config(CONFIGS / "cpu-tiny-smoke.yaml", [])
    for cfg in (demo, smoke):
        assert (cfg.model.name, cfg.model.device) == ("smollm2-135m-instruct", "cpu")
    assert demo.filter.enabled and demo.algorithm.kl_coef == 0.0
    assert (smoke.rollout.num_groups, smoke.rollout.group_size) == (2, 2)
    assert smoke.trainer.total_steps <= 2 and smoke.rollout.max_new_tokens == 8
    assert smoke.trainer.val_seeds == 4


# ----------------------------------------------------------------------- overrides


@pytest.mark.parametrize(
    ("override", "attr", "expected"),
    [
        ("optim.actor_lr=1e-5", "optim.actor_lr", 1e-5),  # YAML 1.1 would read text
        ("optim.actor_lr=2.0e-5", "optim.actor_lr", 2e-5),
        ("optim.weight_decay=0", "optim.weight_decay", 0.0),  # int into a float key
        ("trainer.total_steps=1_000", "trainer.total_steps", 1000),
        ("filter.enabled=true", "filter.enabled", True),
        ("rollout.think=false", "rollout.think", False),
        ("model.name=Qwen/Qwen2.5-0.5B-Instruct", "model.name", "Qwen/Qwen2.5-0.5B-Instruct"),
        ("trainer.wandb_project=2024", "trainer.wandb_project", "2024"),  # text, not a number
        ("env.val_id=2024", "env.val_id", "2024"),  # an optional text key too
        ("env.kwargs={size: 6, p: 0.8}", "env.kwargs", {"size": 6, "p": 0.8}),
        ("algorithm.dual_clip=3", "algorithm.dual_clip", 3.0),
        ("algorithm.dual_clip=null", "algorithm.dual_clip", None),
        ("trainer.num_threads=2", "trainer.num_threads", 2),
        ("optim.betas=[0.8, 0.99]", "optim.betas", (0.8, 0.99)),
        ("model.lora.rank=8", "model.lora.rank", 8),
        ("preset=mine", "preset", "mine"),
        ("algorithm.adv_estimator=grpo", "algorithm.adv_estimator", "grpo"),
    ],
)
def test_override_of_each_type(override, attr, expected):
    value = load_config(None, [override])
    for part in attr.split("."):
        value = getattr(value, part)
    assert value == expected and type(value) is type(expected)


def test_a_section_override_merges_and_later_overrides_win():
    cfg = load_config(None, ["filter={enabled: true, ratio: 0.5}", "filter.ratio=0.25"])
    assert cfg.filter.enabled and cfg.filter.ratio == 0.25 and cfg.filter.mode == "top_std"


def test_overrides_apply_after_the_file():
    cfg = load_config(CONFIGS / "bandit-starpo-s.yaml", ["optim.actor_lr=3e-6", "env.id=sokoban"])
    assert cfg.optim.actor_lr == 3e-6 and cfg.env.id == "sokoban"
    assert cfg.filter.enabled and cfg.model.name == "Qwen/Qwen2.5-0.5B-Instruct"


# ----------------------------------------------------------------- base: inheritance


def test_base_inheritance_merges_sections_and_replaces_values(tmp_path):
    root = (
        "optim: {actor_lr: 2.0e-6, critic_lr: 3.0e-5}\n"
        "env: {id: sokoban, kwargs: {num_boxes: 2, dim_room: [8, 8]}}\n"
    )
    write(tmp_path / "root.yaml", root)
    write(tmp_path / "mid.yaml", "base: root.yaml\noptim: {actor_lr: 4.0e-6}\n")
    (tmp_path / "sub").mkdir()
    write(tmp_path / "sub" / "leaf.yaml", "base: ../mid.yaml\nenv: {id: frozenlake, kwargs: {}}\n")
    cfg = load_config(tmp_path / "sub" / "leaf.yaml", [])
    assert cfg.optim.actor_lr == 4e-6 and cfg.optim.critic_lr == 3e-5
    assert cfg.env.id == "frozenlake" and cfg.env.kwargs == {}  # kwargs replaced, not merged
    assert cfg.preset == "leaf"


def test_a_file_that_sets_preset_keeps_it(tmp_path):
    write(tmp_path / "a.yaml", "preset: bandit-starpo-s\n")
    assert load_config(tmp_path / "a.yaml", []).preset == "bandit-starpo-s"
    write(tmp_path / "b.yaml", "base: a.yaml\n")
    assert load_config(tmp_path / "b.yaml", []).preset == "b"


def test_base_loops_and_missing_bases_are_user_errors(tmp_path):
    write(tmp_path / "a.yaml", "base: b.yaml\n")
    write(tmp_path / "b.yaml", "base: a.yaml\n")
    with pytest.raises(UserError, match="inherits from itself"):
        load_config(tmp_path / "a.yaml", [])
    write(tmp_path / "c.yaml", "base: paper-bsae.yaml\n")
    write(tmp_path / "paper-base.yaml", "{}\n")
    with pytest.raises(UserError, match="not found.*did you mean .*paper-base.yaml"):
        load_config(tmp_path / "c.yaml", [])
    write(tmp_path / "d.yaml", "base: [a.yaml]\n")
    with pytest.raises(UserError, match="base must name a YAML file"):
        load_config(tmp_path / "d.yaml", [])


# ------------------------------------------------------------------------ round trip


def test_save_and_load_round_trip_exactly(tmp_path):
    cfg = load_config(
        CONFIGS / "sokoban-starpo-s.yaml",
        [
            "env.kwargs={dim_room: [6, 6], num_boxes: 1}",
            "optim.betas=[0.8, 0.95]",
            "trainer.num_threads=3",
        ],
    )
    path = tmp_path / "run" / "config.yaml"
    save_config(cfg, path)
    assert path.read_text(encoding="utf-8").startswith("#")
    assert load_config(path, []) == cfg
    assert config_from_dict(config_to_dict(cfg)) == cfg
    assert config_to_dict(cfg)["optim"]["betas"] == [0.8, 0.95]  # plain YAML types


def test_config_from_dict_accepts_any_subset_of_keys():
    cfg = config_from_dict({"rollout": {"group_size": 8}, "trainer": {}})
    assert cfg.rollout.group_size == 8 and cfg.trainer == TrainConfig().trainer


def test_direct_construction_is_validated_and_coerced():
    assert OptimConfig(actor_lr=1).actor_lr == 1.0
    with pytest.raises(UserError, match="optim.actor_lr"):
        OptimConfig(actor_lr=0)
    cfg = TrainConfig()
    cfg.algorithm.adv_estimator = "grpo"
    cfg.rollout.group_size = 1
    with pytest.raises(UserError, match="rollout.group_size >= 2"):
        cfg.validate()


# ------------------------------------------------------------------------ validation


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        (
            ["optim.actor_learning_rate=1"],
            "unknown config key 'optim.actor_learning_rate'; did you mean 'optim.actor_lr'?",
        ),
        (["rollout.kl_coef=0.1"], "did you mean 'algorithm.kl_coef'?"),
        (["actor_lr=1"], "did you mean 'optim.actor_lr'?"),
        (["optimizer.actor_lr=1"], "unknown config key 'optimizer'; did you mean 'optim'?"),
        (["model.lora.rnak=8"], "did you mean 'model.lora.rank'?"),
        (["rollout.group_size=1.5"], "'rollout.group_size' expects an integer"),
        (["rollout.group_size=abc"], "'rollout.group_size' expects an integer"),
        (["rollout.group_size=true"], "'rollout.group_size' expects an integer"),
        (["optim.actor_lr=abc"], "'optim.actor_lr' expects a number"),
        (["optim.actor_lr=.nan"], "'optim.actor_lr' expects a number"),
        (["filter.enabled=1"], "'filter.enabled' expects true or false"),
        (["model.name=null"], "'model.name' expects a string"),
        (["env.kwargs=[1, 2]"], "'env.kwargs' expects a mapping"),
        (["optim.betas=[0.9]"], "'optim.betas' expects a list of 2 numbers"),
        (["optim.betas=[0.9, 1.0]"], "optim.betas[1] must be in [0, 1)"),
        (["optim.actor_lr=0"], "optim.actor_lr must be > 0"),
        (["optim.actor_lr=-1e-6"], "optim.actor_lr must be > 0"),
        (["optim.critic_lr=0"], "optim.critic_lr must be > 0"),
        (["model.lora.lr_multiplier=0"], "model.lora.lr_multiplier must be > 0"),
        (["filter.ratio=0"], "filter.ratio must be > 0.0 and <= 1.0"),
        (["filter.ratio=1.5"], "filter.ratio must be > 0.0 and <= 1.0"),
        (["algorithm.adv_estimator=grpo", "rollout.group_size=1"], "set rollout.group_size >= 2"),
        (
            ["algorithm.adv_estimator=gigpo", "rollout.group_size=1"],
            "adv_estimator=gigpo normalises within a group; set rollout.group_size >= 2",
        ),
        (
            ["algorithm.adv_estimator=grpo", "algorithm.reward_placement=per_turn"],
            "reward_placement=per_turn has no effect with adv_estimator=grpo",
        ),
        (["algorithm.gamma_step=1.5"], "algorithm.gamma_step must be"),
        (["algorithm.step_weight=-1"], "algorithm.step_weight must be >= 0"),
        (["rollout.group_size=6"], "optim.mini_batch_size=32 does not divide the 48 trajectories"),
        (["filter.enabled=true", "rollout.group_size=8"], "does not divide the 16 trajectories"),
        (
            [
                "filter.enabled=true",
                "filter.ratio=0.1",
                "rollout.num_groups=2",
                "rollout.group_size=8",
                "optim.mini_batch_size=16",
            ],
            "the 8 trajectories trained per step (1 of 2 groups",
        ),
        (
            ["optim.micro_batch_size=3"],
            "optim.micro_batch_size=3 does not divide optim.mini_batch_size=32",
        ),
        (
            ["algorithm.adv_estimator=ppo"],
            "algorithm.adv_estimator must be one of gae, grpo, bi_level_gae, gigpo",
        ),
        (["algorithm.adv_estimator=gpro"], "did you mean algorithm.adv_estimator=grpo?"),
        (["algorithm.loss_agg=mean"], "algorithm.loss_agg must be one of"),
        (["algorithm.kl_estimator=k4"], "algorithm.kl_estimator must be one of auto, k1, k2, k3"),
        (["filter.mode=top"], "filter.mode must be one of top_std, bottom_std"),
        (["filter.rule=top_q"], "filter.rule must be one of ratio, top_k, top_p, min_p"),
        (["filter.top_p=0"], "filter.top_p must be > 0.0 and <= 1.0"),
        (["filter.min_p=2"], "filter.min_p must be >= 0.0 and <= 1.0"),
        (["filter.top_k=0"], "filter.top_k must be >= 1"),
        (["filter.loss_scale=cube"], "filter.loss_scale must be one of none, linear, sqrt"),
        (
            ["filter.enabled=true", "filter.rule=min_p", "filter.mode=bottom_std"],
            "filter.rule=min_p keeps the groups with the largest scores; set filter.mode=top_std",
        ),
        (
            [
                "filter.enabled=true",
                "filter.rule=top_p",
                "trainer.learners=2",
                "optim.micro_batch_size=8",
            ],
            "keeps a different number of groups each step, which trainer.learners > 1",
        ),
        (
            ["filter.enabled=true", "filter.rule=top_k", "filter.top_k=3"],
            "does not divide the 48 trajectories trained per step (3 of 8 groups kept by "
            "filter.top_k",
        ),
        (["algorithm.reward_placement=turn"], "algorithm.reward_placement must be one of"),
        (["trainer.wandb_mode=onlin"], "did you mean trainer.wandb_mode=online?"),
        (["trainer.on_collapse=panic"], "trainer.on_collapse must be one of warn, stop, rollback"),
        (["model.dtype=float64"], "model.dtype must be one of"),
        (["algorithm.clip_low=-0.1"], "algorithm.clip_low must be >= 0"),
        (["algorithm.clip_high=-0.1"], "algorithm.clip_high must be >= 0"),
        (["algorithm.dual_clip=1"], "algorithm.dual_clip must be > 1"),
        (["algorithm.dual_clip=0.5"], "algorithm.dual_clip must be > 1"),
        (["rollout.temperature=-0.1"], "rollout.temperature must be > 0"),
        (["rollout.temperature=0"], "greedy rollouts cannot train"),
        (["rollout.top_p=0"], "rollout.top_p must be > 0.0 and <= 1.0"),
        (["rollout.top_p=1.1"], "rollout.top_p must be > 0.0 and <= 1.0"),
        (["rollout.max_turns=0"], "rollout.max_turns must be >= 1"),
        (["rollout.max_actions_per_turn=0"], "rollout.max_actions_per_turn must be >= 1"),
        (["rollout.max_actions_per_traj=0"], "rollout.max_actions_per_traj must be >= 1"),
        (["rollout.max_new_tokens=0"], "rollout.max_new_tokens must be >= 1"),
        (["rollout.max_response_words=0"], "rollout.max_response_words must be >= 1"),
        (["trainer.total_steps=0"], "trainer.total_steps must be >= 1"),
        (["env.id=' '"], "env.id is empty"),
        (["optim.actor_lr"], "override 'optim.actor_lr' must look like KEY=VALUE"),
        (["=1"], "must look like KEY=VALUE"),
        (["optim=3"], "config key 'optim' is a section"),
        (["optim.actor_lr.x=1"], "config key 'optim.actor_lr' has no sub-keys"),
        (["env.kwargs.size=6"], "write env.kwargs={size: 6}"),
        (["diagnostics.ema_alpha=0"], "diagnostics.ema_alpha must be > 0.0 and <= 1.0"),
        (["diagnostics.min_steps=0"], "diagnostics.min_steps must be >= 1"),
        (["diagnostics.grad_min_history=1"], "(a std needs two values)"),
        (["diagnostics.std_key=[a]"], "'diagnostics.std_key' expects a string"),
        (["diagnostics.windw=3"], "did you mean 'diagnostics.window'?"),
        (["diagnostics.identical_warn=0.95"], "must be <= diagnostics.identical_collapse=0.9"),
        (["diagnostics.answer_warn=0.7"], "must be <= diagnostics.answer_collapse=0.6"),
    ],
)
def test_validation_errors_are_one_line_and_name_the_key(overrides, expected):
    message = user_error(overrides)
    assert expected in message


def test_filter_keeps_at_least_one_group():
    cfg = load_config(
        None, ["filter.enabled=true", "rollout.num_groups=2", "optim.mini_batch_size=16"]
    )
    assert cfg.groups_kept_per_step == 1 and cfg.trajectories_per_step == 16  # round(0.5) == 0
    cfg = load_config(None, ["filter.enabled=true"])
    assert cfg.groups_kept_per_step == 2 and cfg.trajectories_per_step == 32


def test_adaptive_filters_plan_for_every_group_and_allow_a_smaller_last_mini_batch():
    fixed = load_config(None, ["filter.enabled=true", "filter.rule=top_k", "filter.top_k=2"])
    assert not fixed.filter.varies and fixed.trajectories_per_step == 32
    for rule in (["filter.rule=top_p"], ["filter.rule=min_p"], ["filter.keep_zero_std=false"]):
        cfg = load_config(None, ["filter.enabled=true", "optim.mini_batch_size=24", *rule])
        assert cfg.filter.varies  # 128 trajectories at most, in mini-batches of 24 and less
        assert cfg.groups_kept_per_step == 8 and cfg.trajectories_per_step == 128
    off = load_config(None, ["filter.rule=top_p", "optim.mini_batch_size=32"])
    assert not off.filter.varies  # the filter is off: every group, every step
    from starpo.algorithms.filtering import ADAPTIVE_RULES, RULES

    adaptive = {r for r in RULES if load_config(None, [f"filter.rule={r}"]).filter.adaptive}
    assert adaptive == set(ADAPTIVE_RULES)  # the config's torch-free copy agrees


def test_the_batch_fix_suggested_is_valid():
    message = user_error(["rollout.group_size=6"])
    fix = message.rsplit("e.g. ", 1)[1]
    assert load_config(None, ["rollout.group_size=6", fix]).optim.mini_batch_size == 24


# ------------------------------------------------------------------------ file errors


@pytest.mark.parametrize(
    ("name", "text", "expected"),
    [
        ("bad.yaml", "optim:\n  actor_lr: [1\nrollout: {}\n", "is not valid YAML at line"),
        ("bad.yaml", "- a\n- b\n", "must hold a mapping of sections"),
        ("bad.yaml", "optim: 3\n", "config section 'optim' must be a mapping of keys"),
        ("bad.yaml", "optim:\n  actor_learning_rate: 1.0\n", "did you mean 'optim.actor_lr'?"),
        ("bad.json", "{}", "is not a YAML file"),
        ("bad.yaml", "optim: {actor_lr: 0}\n", "optim.actor_lr must be > 0"),
        ("bad.yaml", "optim:\n  1: 2\n", "unknown config key 'optim.1'"),
    ],
)
def test_bad_config_files_are_one_line_user_errors(tmp_path, name, text, expected):
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    with pytest.raises(UserError) as info:
        load_config(path, [])
    assert expected in str(info.value) and "\n" not in str(info.value)
    assert str(path) in str(info.value) or "optim" in str(info.value)


def test_malformed_yaml_names_the_line(tmp_path):
    path = write(tmp_path / "bad.yaml", "rollout:\n  group_size: 4\n  temperature: : 1\n")
    with pytest.raises(UserError, match=r"bad.yaml' is not valid YAML at line 3"):
        load_config(path, [])


def test_missing_config_file(tmp_path):
    with pytest.raises(UserError, match=r"config file '.*nope.yaml' not found$"):
        load_config(tmp_path / "nope.yaml", [])
    with pytest.raises(UserError, match="did you mean .*bandit-starpo-s.yaml"):
        load_config(CONFIGS / "bandit-starpo-s.yml", [])


def test_presets_load_by_name_and_unknown_names_list_them():
    assert load_config("cpu-tiny-smoke") == load_config(CONFIGS / "cpu-tiny-smoke.yaml")
    assert load_config("cpu-tiny-smoke.yaml").preset == "cpu-tiny-smoke"
    assert {"cpu-tiny-smoke", "bandit-starpo-s"} <= set(presets())
    with pytest.raises(UserError) as info:
        load_config("cpu-tiny-smok")
    message = str(info.value)
    assert "preset 'cpu-tiny-smok' not found; did you mean 'cpu-tiny-smoke'?" in message
    assert all(name in message for name in presets()) and "\n" not in message


def test_a_path_wins_over_a_preset_name(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    write(tmp_path / "cpu-tiny-smoke", "rollout: {group_size: 4}\n")  # not .yaml: refused
    with pytest.raises(UserError, match="is not a YAML file"):
        load_config("cpu-tiny-smoke")
    write(tmp_path / "mine.yaml", "base: cpu-tiny-smoke.yaml\ntrainer: {total_steps: 1}\n")
    cfg = load_config("mine.yaml")  # a user's file may build on a shipped preset
    assert cfg.preset == "mine" and cfg.trainer.total_steps == 1
    assert cfg.rollout == load_config(CONFIGS / "cpu-tiny-smoke.yaml").rollout


def test_presets_ship_as_package_data():
    tomllib = pytest.importorskip("tomllib")
    pyproject = Path(__file__).resolve().parents[1] / "pyproject.toml"
    data = tomllib.loads(pyproject.read_text(encoding="utf-8"))
    patterns = data["tool"]["setuptools"]["package-data"]["starpo.config"]
    package = Path(config_module.__file__).parent
    shipped = {p for pattern in patterns for p in package.glob(pattern)}
    assert set(CONFIGS.glob("*.yaml")) <= shipped and len(shipped) >= 9


def test_yaml_reads_exponents_as_numbers_and_round_trips_text(tmp_path):
    path = write(tmp_path / "a.yaml", "optim: {actor_lr: 1e-6, critic_lr: 2E-5}\n")
    cfg = load_config(path, ["env.kwargs={p: 1e-3, name: '1e5'}"])
    assert (cfg.optim.actor_lr, cfg.optim.critic_lr) == (1e-6, 2e-5)
    assert cfg.env.kwargs == {"p": 1e-3, "name": "1e5"}
    save_config(cfg, tmp_path / "saved.yaml")
    assert load_config(tmp_path / "saved.yaml").env.kwargs == {"p": 1e-3, "name": "1e5"}


def test_diagnostics_is_a_section_set_from_yaml_and_overrides(tmp_path):
    path = write(tmp_path / "d.yaml", "diagnostics: {min_steps: 3, std_key: my/std}\n")
    cfg = load_config(path, ["diagnostics.ema_alpha=1", "diagnostics.reward_key=my/reward"])
    assert cfg.diagnostics == DiagnosticsConfig(
        min_steps=3, std_key="my/std", ema_alpha=1.0, reward_key="my/reward"
    )
    assert cfg.diagnostics.ema_alpha == 1.0 and type(cfg.diagnostics.ema_alpha) is float
    with pytest.raises(UserError, match="diagnostics.window must be >= 1"):
        DiagnosticsConfig(window=0)


def test_an_empty_file_means_the_defaults(tmp_path):
    cfg = load_config(write(tmp_path / "empty.yaml", ""), [])
    assert cfg == TrainConfig(preset="empty")


# ----------------------------------------------------------------------------- help


def test_help_lists_every_field_with_its_help_and_default():
    rows = {key: (default, help_text) for key, default, help_text in config_help()}
    keys = [key for key, _, _ in leaf_fields()]
    assert list(rows) == keys
    for key, f, _ in leaf_fields():
        default, help_text = rows[key]
        assert help_text.startswith(field_rules(f)["help"])
        value = f.get_default(call_default_factory=True)
        assert yaml.safe_load(default) == (list(value) if isinstance(value, tuple) else value)
        for choice in field_rules(f).get("choices", ()):
            assert choice in help_text, (key, choice)
    assert "One of: auto, fp32, bf16" in rows["model.dtype"][1]
    assert rows["filter.ratio"][1].endswith("Must be > 0.0 and <= 1.0.")
    text = format_config_help()
    for key, default, _ in config_help():
        assert f"  {key} = {default}" in text
    assert "optim: optimizer and batching" in text


@pytest.mark.parametrize(
    "module",
    [
        "__init__",
        "fields",
        "files",
        "episode",
        "algorithm",
        "rollout",
        "diagnostics",
        "curriculum",
    ],
)
def test_config_module_imports_no_torch(module):
    path = Path(config_module.__file__).with_name(f"{module}.py")
    name = "config" if module == "__init__" else f"config.{module}"
    tree = ast.parse(path.read_text(encoding="utf-8"))
    imported = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    imported |= {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
    allowed = set(sys.stdlib_module_names) | {
        "yaml",
        "pydantic",
        "starpo.errors",
        "starpo.defaults",
        "starpo.registry",  # extension names (lazy: no torch)
        "starpo.config.episode",  # EpisodeSettings, the per-episode settings' one definition
        "starpo.config.algorithm",  # the filter, algorithm and optim sections
        "starpo.config.rollout",  # the rollout section
        "starpo.config.fields",  # field helpers, the section base, one-line errors
        "starpo.config.files",  # YAML files, base:, presets, overrides, help rows
        "starpo.config.diagnostics",  # the diagnostics section, beside its detector
        "starpo.config.curriculum",  # the pass-rate curriculum's section
    }
    assert {m for m in imported if m.split(".")[0] not in allowed and m not in allowed} == set()
    code = f"import sys, starpo.{name}; assert 'torch' not in sys.modules; print('clean')"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0 and "clean" in result.stdout, result.stderr


# ------------------------------------------------------------ random valid overrides

# Keys whose valid values depend on each other (batch divisibility, GRPO group size).
COUPLED = {
    "rollout.num_groups",
    "rollout.group_size",
    "filter.enabled",
    "filter.ratio",
    "optim.mini_batch_size",
    "optim.micro_batch_size",
    "trainer.learners",  # <= micro-batches per mini-batch
    "rollout.workers",  # CPU only, needs Ray
    "algorithm.adv_estimator",
    "algorithm.tis_cap",  # needs algorithm.recompute_old_logprobs not false
    "optim.detach_context",  # needs rollout.context_window=full
    "diagnostics.identical_warn",  # <= diagnostics.identical_collapse
    "diagnostics.identical_collapse",
    "diagnostics.answer_warn",  # <= diagnostics.answer_collapse
    "diagnostics.answer_collapse",
}
TEXT = st.text(string.ascii_letters + string.digits + " -_/.:,#{}[]'\"=!@", max_size=12)
SCALAR = st.one_of(st.integers(), st.floats(allow_nan=False), st.booleans(), TEXT)


def value_strategy(tp, meta):
    """Valid values of one key, from its type and declared rules."""
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        inner = next(a for a in typing.get_args(tp) if a is not type(None))
        return st.none() | value_strategy(inner, meta)
    if "choices" in meta:
        return st.sampled_from(tuple(meta["choices"]))
    if tp is bool:
        return st.booleans()
    if tp is int:
        low = meta.get("ge", 0)
        return st.integers(min_value=low, max_value=low + 10**9)
    if tp is float:
        low = meta.get("gt", meta.get("ge"))
        high = meta.get("lt", meta.get("le"))
        return st.floats(
            min_value=low if low is not None else -1e9,
            max_value=high if high is not None else 1e9,
            exclude_min="gt" in meta,
            exclude_max="lt" in meta,
            allow_nan=False,
        )
    if tp is str:
        return TEXT.filter(str.strip)
    if typing.get_origin(tp) is dict:
        return st.dictionaries(TEXT, SCALAR, max_size=3)
    if typing.get_origin(tp) is tuple:
        return st.tuples(st.floats(0, 1, exclude_max=True), st.floats(0, 1, exclude_max=True))
    if typing.get_origin(tp) is list:  # the one list setting: trainer.sinks, registered names
        from starpo.registry import METRIC_SINKS

        return st.lists(st.sampled_from(tuple(METRIC_SINKS)), max_size=2, unique=True)
    raise AssertionError(f"no strategy for {tp}")


FREE_KEYS = {
    key: value_strategy(tp, field_rules(f)) for key, f, tp in leaf_fields() if key not in COUPLED
}


@st.composite
def overrides(draw):
    keys = draw(st.lists(st.sampled_from(sorted(FREE_KEYS)), unique=True, max_size=8))
    return {key: draw(FREE_KEYS[key]) for key in keys}


def as_override(key, value):
    return f"{key}={yaml_text(value)}"


@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(chosen=overrides())
def test_random_valid_overrides_round_trip(chosen, tmp_path):
    cfg = load_config(None, [as_override(key, value) for key, value in chosen.items()])
    flat = config_to_dict(cfg)
    for key, value in chosen.items():
        got = flat
        for part in key.split("."):
            got = got[part]
        assert got == (list(value) if isinstance(value, tuple) else value), key
    path = tmp_path / "saved.yaml"
    save_config(cfg, path)
    assert load_config(path, []) == cfg


def test_detach_context_refuses_a_context_window_before_any_work():
    with pytest.raises(UserError, match="optim.detach_context=false or rollout.context_window"):
        load_config(
            "cpu-sokoban-sft-starpo-s",
            ["optim.detach_context=true", "rollout.context_window=single_turn"],
        )
    assert load_config(
        "cpu-sokoban-sft-starpo-s", ["optim.detach_context=true"]
    ).optim.detach_context
