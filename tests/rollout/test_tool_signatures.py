"""`rollout.tool_format=signatures`: tool schemas as one signature line each (a pure
renderer, over every JSON-schema keyword the tool envs use), the shipped envs' listings, the
default json system message unchanged byte for byte, and rollouts, SFT replay, the memory
plan, `starpo eval` / `starpo sft` and the recipe's layout record that all follow the one
setting; a template or API that lays out tools itself refuses it."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest

from starpo.config import load_config
from starpo.config.episode import LAYOUT_SETTINGS, EpisodeSettings
from starpo.config.fields import field_rules
from starpo.envs import make
from starpo.envs.tools import Tool
from starpo.errors import UserError
from starpo.models import load_tokenizer
from starpo.rollout import prompts
from starpo.rollout.engine import RolloutEngine
from starpo.rollout.signatures import argument_list, tool_signature, type_text

TOOL_ENVS = ("invoice", "support")


def _object(properties: dict[str, Any], required: list[str] | None = None, **extra: Any):
    return {"type": "object", "properties": properties, "required": required or [], **extra}


# ------------------------------------------------------------------ the pure renderer
@pytest.mark.parametrize(
    ("schema", "text"),
    [
        ({"type": "string"}, "string"),
        ({}, "any"),
        ({"type": ["string", "null"]}, "string|null"),
        ({"type": "string", "enum": ["approve", "hold", "reject"]}, '"approve"|"hold"|"reject"'),
        ({"enum": [1, None, "x"]}, '1|null|"x"'),
        ({"const": "fixed"}, '"fixed"'),
        ({"type": "integer", "minimum": 1}, "integer >= 1"),
        ({"type": "integer", "maximum": 9}, "integer <= 9"),
        ({"type": "number", "minimum": 0, "maximum": 1000000}, "number in 0..1000000"),
        ({"type": "number", "minimum": 0.5, "maximum": 2.5}, "number in 0.5..2.5"),
        ({"type": "number", "exclusiveMinimum": 0, "maximum": 1}, "number > 0 <= 1"),
        ({"type": "number", "exclusiveMaximum": 1}, "number < 1"),
        ({"type": "array", "items": {"type": "string"}}, "[string]"),
        ({"type": "array"}, "[any]"),
        (
            {
                "type": "array",
                "items": _object(
                    {"sku": {"type": "string"}, "qty": {"type": "integer", "minimum": 1}},
                    ["sku", "qty"],
                ),
            },  # fmt: skip
            "[{sku: string, qty: integer >= 1}]",
        ),
        (
            _object({"city": {"type": "string"}, "zip": {"type": "string"}}, ["city"]),
            "{city: string, zip?: string}",
        ),
        (_object({}), "{}"),  # takes no keys: read_call refuses any
        (_object({"a": {"type": "string"}}, ["a"], additionalProperties=True), "{a: string, ...}"),
        ({"properties": {"a": {"type": "string"}}}, "{a?: string}"),  # an object by its keys
        ({"items": {"type": "integer"}}, "[integer]"),  # an array by its items
        (
            {"type": "string", "description": "The vendor's\n  id.", "examples": ["V-1", ""]},
            'string (The vendor\'s id.; e.g. "V-1", "")',
        ),
        ({"type": "integer", "default": 3}, "integer (default 3)"),
        ({"type": "string", "pattern": "^V-[0-9]+$"}, 'string (pattern="^V-[0-9]+$")'),
        ({"type": "string", "minLength": 1, "title": "Id"}, 'string (minLength=1; title="Id")'),
        (
            {"type": "array", "items": [{"type": "string"}]},
            '[any] (items=[{"type": "string"}])',
        ),
    ],
)
def test_an_argument_schema_renders_as_its_compact_type(schema, text):
    assert type_text(schema) == text


@pytest.mark.parametrize(
    ("tool", "line"),
    [
        (
            Tool("get_tax_rate", "The company's tax rate."),
            "get_tax_rate() -- The company's tax rate.",
        ),
        (Tool("submit", ""), "submit()"),
        (
            Tool(
                "lookup_vendor",
                "Look up a vendor record.",
                _object(
                    {"vendor_id": {"type": "string"}, "note": {"type": "string"}}, ["vendor_id"]
                ),
            ),
            "lookup_vendor(vendor_id: string, note?: string) -- Look up a vendor record.",
        ),
        (
            Tool(
                "order",
                "Order lines.\nMore text on a second line.",
                _object(
                    {
                        "lines": {
                            "type": "array",
                            "items": _object(
                                {
                                    "sku": {"type": "string"},
                                    "qty": {"type": "integer", "minimum": 1},
                                },
                                ["sku", "qty"],
                            ),
                        },
                        "ship to": _object({"city": {"type": "string"}}, ["city"]),
                    },
                    ["lines"],
                ),
            ),
            'order(lines: [{sku: string, qty: integer >= 1}], "ship to"?: {city: string}) -- '
            "Order lines. More text on a second line.",
        ),
    ],
)
def test_a_tool_renders_as_one_signature_line(tool, line):
    assert tool_signature(tool.schema()) == line
    assert tool_signature(tool.schema()["function"]) == line  # the bare function object
    assert "\n" not in line


def test_a_required_argument_without_a_schema_is_listed_as_any():
    assert argument_list({"type": "object", "properties": {}, "required": ["x"]}) == "x: any"


def test_every_declared_tool_format_has_a_listing():
    choices = field_rules(EpisodeSettings.model_fields["tool_format"])["choices"]
    assert tuple(prompts.TOOL_LISTINGS) == tuple(choices)
    assert EpisodeSettings().tool_format == "json"


# ------------------------------------------------------------------ the shipped envs
def _walk(schema: dict[str, Any]):
    """Every sub-schema of an argument schema (itself, its properties', its items')."""
    yield schema
    for sub in schema.get("properties", {}).values():
        yield from _walk(sub)
    if isinstance(schema.get("items"), dict):
        yield from _walk(schema["items"])


@pytest.mark.parametrize("env_id", TOOL_ENVS)
def test_the_tool_envs_signatures_keep_what_a_valid_call_needs(env_id):
    schemas = make(env_id).tool_schemas()
    block = prompts.tools_block(schemas, "signatures")
    lines = block.split("<tools>\n")[1].split("\n</tools>")[0].splitlines()
    assert len(lines) == len(schemas)
    for schema, line in zip(schemas, lines, strict=True):
        function = schema["function"]
        parameters = function["parameters"]
        assert line.startswith(f"{function['name']}(")
        assert line.endswith(f" -- {function['description']}")  # whole, not cut
        for name in parameters["required"]:
            assert f"{name}: " in line and f"{name}?:" not in line
        for name in set(parameters["properties"]) - set(parameters["required"]):
            assert f"{name}?: " in line
        for sub in _walk(parameters):
            assert all(json.dumps(v) in line for v in sub.get("enum", ()))
            assert all(str(sub[k]) in line for k in ("minimum", "maximum") if k in sub)
            assert all(json.dumps(v) in line for v in sub.get("examples", ()))
    # The call syntax is unchanged: the agent still writes JSON calls.
    assert prompts.TOOL_CALL_SHAPE in block


@pytest.mark.parametrize("env_id", TOOL_ENVS)
def test_signatures_shorten_the_system_message(env_id):
    tokenizer = load_tokenizer()
    schemas = make(env_id).tool_schemas()
    tokens = {
        fmt: len(
            tokenizer.encode(prompts.tool_system_prompt(schemas, native=False, tool_format=fmt))
        )
        for fmt in prompts.TOOL_LISTINGS
    }
    assert tokens["signatures"] < 0.6 * tokens["json"]  # 0.54 and 0.46 measured


# ------------------------------------------------------------------ json: unchanged
def _tools_block_before(schemas: list[dict[str, Any]]) -> str:
    """`prompts.tools_block` as it was before tool_format existed (2026-12-07), verbatim."""
    lines = "\n".join(json.dumps(schema, ensure_ascii=False) for schema in schemas)
    return (
        "You can call tools. Their signatures are JSON schemas within <tools></tools>:\n"
        f"<tools>\n{lines}\n</tools>\nCall a tool by writing {prompts.TOOL_CALL_SHAPE}; each "
        "result comes back in the next message."
    )


@pytest.mark.parametrize("env_id", TOOL_ENVS)
def test_the_default_json_system_message_is_unchanged_byte_for_byte(env_id, scripted_backend):
    schemas = make(env_id).tool_schemas()
    before = f"{prompts.SYSTEM_PROMPT}\n{_tools_block_before(schemas)}"
    assert prompts.tools_block(schemas) == _tools_block_before(schemas)
    assert prompts.tool_system_prompt(schemas, native=False) == before
    tokenizer = load_tokenizer()
    backend = scripted_backend(tokenizer, lambda s, t: "<|im_end|>")
    engine = RolloutEngine(backend, tokenizer, EpisodeSettings(max_turns=1))
    (traj,) = engine.run(env_id, [0], group_size=1)
    assert traj.messages[0] == {"role": "system", "content": before}


# ------------------------------------------------------------------ through the engine
def _first_system(traj) -> str:
    assert traj.messages[0]["role"] == "system"
    return traj.messages[0]["content"]


def test_a_tiny_model_rollout_reads_the_compact_system_message(tiny):
    from starpo.rollout.backends.hf import HFBackend

    model, tokenizer = tiny
    settings = EpisodeSettings(
        max_turns=2, max_new_tokens=8, max_actions_per_turn=1, tool_format="signatures"
    )
    backend = HFBackend(model, pad_token_id=tokenizer.pad_token_id, seed=0)
    trajectories = RolloutEngine(backend, tokenizer, settings).run("invoice", [0, 1], 1)
    compact = prompts.tool_system_prompt(
        make("invoice").tool_schemas(), native=False, tool_format="signatures"
    )
    for traj in trajectories:
        assert _first_system(traj) == compact
        prompt = tokenizer.decode(traj.token_ids[: traj.loss_mask.index(1)])
        assert compact in prompt and '"type": "function"' not in prompt
        assert "record_decision(invoice_number: string" in prompt


def test_calls_still_parse_and_play_under_signatures(scripted_backend):
    # The gold path of invoice case 0 written as JSON calls, one a turn, after the
    # signature listing: the agent's call syntax did not change.
    from starpo.sft.run import gather_records

    (record,) = gather_records([], from_solver=1, env_id="invoice", seed_start=0).records
    calls = [step.action for step in record.steps]
    tokenizer = load_tokenizer()
    replies = [f" ok </think><tool_call>{c}</tool_call><|im_end|>" for c in calls]
    backend = scripted_backend(tokenizer, lambda session, turn: replies[turn - 1])
    settings = EpisodeSettings(max_turns=8, max_actions_per_turn=1, tool_format="signatures")
    (traj,) = RolloutEngine(backend, tokenizer, settings).run("invoice", [0], group_size=1)
    assert traj.success and all(t.format_ok and t.num_valid == 1 for t in traj.turns)
    assert "<tools>\nsearch_vendors(name: string)" in _first_system(traj)
    rendered = tokenizer.apply_chat_template(traj.messages, tokenize=False)
    assert tokenizer.decode(traj.token_ids) == rendered.rstrip("\n")  # token in, token out


def test_sft_replay_and_the_memory_plan_follow_the_setting(scripted_backend):
    from starpo.memory.shapes import episode_shape
    from starpo.sft.replay import replay_records
    from starpo.sft.run import gather_records

    tokenizer = load_tokenizer()
    cfg = load_config("cpu-support-sft-starpo-s", ["rollout.tool_format=signatures"])
    settings = cfg.rollout.settings()
    records = gather_records([], from_solver=2, env_id="support").records
    examples = replay_records(records, tokenizer, settings).examples
    compact = prompts.tool_system_prompt(
        make("support").tool_schemas(), native=False, tool_format="signatures"
    )
    assert len(examples) == 2 and all(e.success for e in examples)
    assert all(compact in tokenizer.decode(e.token_ids) for e in examples)
    backend = scripted_backend(tokenizer, lambda s, t: "<|im_end|>")
    (traj,) = RolloutEngine(backend, tokenizer, settings).run("support", [0], group_size=1)
    assert episode_shape(cfg, tokenizer, "support", {}).prompt_tokens == traj.loss_mask.index(1)


# ------------------------------------------------------------------ native tools refuse
# Laid out as Qwen2.5's template does (as tests/rollout/test_tool_calls.py's QWEN_LIKE).
QWEN_LIKE = (
    "{%- if tools %}{{ '<|im_start|>system\\n' + messages[0].content + '\\n# Tools\\n<tools>' }}"
    "{%- for tool in tools %}{{ '\\n' }}{{ tool | tojson }}{%- endfor %}"
    "{{ '\\n</tools><|im_end|>\\n' }}"
    "{%- else %}{{ '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}{%- endif %}"
    "{%- for message in messages[1:] %}"
    "{%- if message.role == 'tool' %}"
    "{%- if loop.first or messages[loop.index0].role != 'tool' %}{{ '<|im_start|>user' }}"
    "{%- endif %}{{ '\\n<tool_response>\\n' + message.content + '\\n</tool_response>' }}"
    "{%- if loop.last or messages[loop.index0 + 2].role != 'tool' %}{{ '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- else %}{{ '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}"
    "{%- endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{%- endif %}"
)


def test_a_template_that_lays_out_tools_itself_refuses_signatures(scripted_backend):
    tokenizer = copy.deepcopy(load_tokenizer())
    tokenizer.chat_template = QWEN_LIKE
    backend = scripted_backend(tokenizer, lambda s, t: "<|im_end|>")
    engine = RolloutEngine(backend, tokenizer, EpisodeSettings(tool_format="signatures"))
    with pytest.raises(UserError, match="lays them out itself.*tool_format=json") as err:
        engine.use_env(make("invoice"))
    assert "\n" not in str(err.value)
    engine.use_env(make("sokoban"))  # no tools: the setting plays no part
    native = RolloutEngine(backend, tokenizer, EpisodeSettings())
    native.use_env(make("invoice"))
    assert native.chat.native_tools and native.system_prompt == prompts.SYSTEM_PROMPT


def test_the_api_policy_refuses_signatures():
    from starpo.evaluation.api import ApiPlayer

    player = ApiPlayer(None, "m", EpisodeSettings(tool_format="signatures"))
    with pytest.raises(UserError, match="the API lays them out itself"):
        player.use_env(make("support"))
    ApiPlayer(None, "m", EpisodeSettings()).use_env(make("support"))


# ------------------------------------------------------------------ settings and flags
def test_the_layout_records_tool_format_only_off_its_default():
    # A recipe folder recorded before the setting existed resumes with the default.
    assert "tool_format" in LAYOUT_SETTINGS
    assert "tool_format" not in EpisodeSettings().layout()
    assert EpisodeSettings(tool_format="signatures").layout()["tool_format"] == "signatures"


def test_a_bad_tool_format_is_one_line():
    with pytest.raises(UserError, match="tool_format") as err:
        load_config("cpu-invoice-sft-starpo-s", ["rollout.tool_format=yaml"])
    assert "\n" not in str(err.value)


def test_eval_and_sft_take_the_flag():
    from starpo.cli import parse_args
    from starpo.cli.eval import _rollout_settings_from_args
    from starpo.cli.sft import resolve

    base = ["eval", "--env", "invoice", "--policy", "model", "--out", "x"]
    assert _rollout_settings_from_args(parse_args(base)).tool_format == "json"
    args = parse_args([*base, "--tool-format", "signatures"])
    assert _rollout_settings_from_args(args).tool_format == "signatures"
    args = parse_args(["sft", "--out", "y", "--env", "invoice", "--tool-format", "signatures"])
    assert resolve(args)["settings"].tool_format == "signatures"
    args = parse_args(["sft", "--out", "y", "--config", "cpu-invoice-sft-starpo-s"])
    assert resolve(args)["settings"].tool_format == "json"
    with pytest.raises(UserError, match="--tool-format must be one of json, signatures"):
        _rollout_settings_from_args(parse_args([*base, "--tool-format", "yaml"]))
