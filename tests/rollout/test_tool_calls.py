"""Tool-calling turns through the rollout engine: calls parsed out of the reply, results fed
back as `tool` messages token for token, malformed calls penalised and explained, and the
chat pieces of templates with and without their own tool layout."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from starpo.envs import register
from starpo.envs.checker import check_env
from starpo.envs.tools import Tool, ToolEnv, ToolError, call_text
from starpo.errors import UserError
from starpo.models import load_tokenizer
from starpo.rollout.chat import ChatTokens, read_tool_pieces
from starpo.rollout.engine import EpisodeSettings, RolloutEngine
from starpo.rollout.parser import parse_tool_turn


class LedgerEnv(ToolEnv):
    """Move the case's amount from one account to another, then submit."""

    instruction = "Move the amount the note asks for, then submit."
    reward_range = (0.0, 1.0)
    tools = (
        Tool(
            "get_balance",
            "An account's balance.",
            {
                "type": "object",
                "properties": {"account": {"type": "string"}},
                "required": ["account"],
            },
        ),
        Tool(
            "transfer",
            "Move an amount between accounts.",
            {
                "type": "object",
                "properties": {
                    "source": {"type": "string"},
                    "target": {"type": "string"},
                    "amount": {"type": "number", "minimum": 0},
                },
                "required": ["source", "target", "amount"],
            },
        ),
        Tool("submit", "Finish.", ends_episode=True),
    )

    def __init__(self, max_steps: int = 6) -> None:
        super().__init__(max_steps)
        self.accounts: dict[str, float] = {}

    def _reset(self, options: dict[str, Any]) -> dict[str, Any]:
        self.amount = float(self.np_random.integers(1, 50))
        self.accounts = {"A": 100.0, "B": 0.0}
        self.submitted = False
        return {}

    def render(self) -> str:
        return f"Note: move {self.amount:g} from A to B."

    def snapshot(self) -> Any:
        return json.dumps([self.accounts, self.submitted], sort_keys=True)

    def state_key(self) -> Any:
        return self.snapshot()

    def call_tool(self, name: str, arguments: dict[str, Any]) -> str:
        if name == "submit":
            self.submitted = True
            return "submitted"
        for account in (arguments.get("account"), arguments.get("source"), arguments.get("target")):
            if account is not None and account not in self.accounts:
                raise ToolError(f"no account {account}")
        if name == "get_balance":
            return json.dumps({"balance": self.accounts[arguments["account"]]})
        self.accounts[arguments["source"]] -= arguments["amount"]
        self.accounts[arguments["target"]] += arguments["amount"]
        return json.dumps(self.accounts)

    def final_reward(self) -> float:
        return float(self.accounts == {"A": 100.0 - self.amount, "B": self.amount})

    def is_success(self) -> bool:
        return self.submitted and self.final_reward() == 1.0


@pytest.fixture(scope="module", autouse=True)
def ledger():
    register("test-ledger", LedgerEnv, overwrite=True)


def _engine(backend, tokenizer, **kwargs):
    settings = EpisodeSettings(max_turns=4, max_actions_per_turn=3, **kwargs)
    return RolloutEngine(backend, tokenizer, settings)


def _gold(amount: float) -> str:
    move = call_text("transfer", {"source": "A", "target": "B", "amount": amount})
    return f"<tool_call>{move}</tool_call>"


def test_the_toy_env_passes_the_checker():
    check_env(LedgerEnv())


def test_gold_calls_play_through_tool_messages_token_for_token(scripted_backend):
    tokenizer = load_tokenizer()
    amounts = {}

    def script(session: int, turn: int) -> str:
        if turn == 1:
            look = call_text("get_balance", {"account": "A"})
            return f" check A </think><tool_call>{look}</tool_call><|im_end|>"
        if turn == 2:
            return f" move it </think>{_gold(amounts[session])}<|im_end|>"
        return f" done </think><tool_call>{call_text('submit', {})}</tool_call><|im_end|>"

    for seed in (3, 4):
        env = LedgerEnv()
        env.reset(seed=seed)
        amounts[seed - 3] = env.amount
    backend = scripted_backend(tokenizer, script)
    trajectories = _engine(backend, tokenizer).run("test-ledger", [3, 4], group_size=1)
    for traj in trajectories:
        assert traj.success and traj.done and len(traj.turns) == 3
        assert traj.env_reward == 1.0 and traj.reward == 1.0
        assert [t.num_valid for t in traj.turns] == [1, 1, 1]
        assert traj.turns[0].tool_results == ['{"balance": 100.0}']
        roles = [m["role"] for m in traj.messages]
        assert roles == ["system", "user", "assistant", "tool", "assistant", "tool", "assistant"]
        assert '"name": "transfer"' in traj.messages[0]["content"]  # tools in the system text
        # Token in, token out: the dialogue is exactly what the template renders.
        rendered = tokenizer.apply_chat_template(traj.messages, tokenize=False)
        assert tokenizer.decode(traj.token_ids) == rendered.rstrip("\n")
        masked = [t for t, m in zip(traj.token_ids, traj.loss_mask, strict=True) if m]
        assert tokenizer.decode(masked).count("<tool_call>") == 3
        assert "<|im_start|>tool" not in tokenizer.decode(masked)


def test_bad_calls_are_invalid_explained_and_penalised(scripted_backend):
    tokenizer = load_tokenizer()
    replies = {
        1: " x </think><tool_call>{not json}</tool_call><tool_call>"
        + call_text("wire", {})
        + "</tool_call><|im_end|>",
        2: " x </think>I will transfer now.<|im_end|>",
        3: " x </think><tool_call>"
        + call_text("transfer", {"source": "A", "target": "Z", "amount": 1})
        + "</tool_call><|im_end|>",
    }
    backend = scripted_backend(tokenizer, lambda s, t: replies.get(t, replies[2]))
    (traj,) = _engine(backend, tokenizer).run("test-ledger", [1], group_size=1)
    first, second, third = traj.turns[:3]
    assert first.format_ok and first.num_invalid == 2 and first.reward == pytest.approx(-0.1)
    assert first.tool_results[0].startswith("Error: the call is not valid JSON")
    assert first.tool_results[1].startswith('Error: unknown tool "wire"')
    assert not second.format_ok and second.tool_results == []
    assert [m["role"] for m in traj.messages[3:7]] == ["tool", "tool", "assistant", "user"]
    assert "made no tool call" in traj.messages[6]["content"]
    # A well-formed call the case cannot serve: valid (uses a call), changes nothing.
    assert third.num_valid == 1 and third.num_effective == 0
    assert third.tool_results == ["Error: no account Z"]
    assert not traj.success


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(body=st.text(max_size=80))
def test_any_call_text_is_judged_never_raised(body):
    env = LedgerEnv()
    env.reset(seed=0)
    before = env.snapshot()
    parsed = parse_tool_turn(f"x</think><tool_call>{body}</tool_call>", think=True)
    for action in parsed.actions:
        _, reward, _, _, info = env.step(action)
        if not info["action_is_valid"]:
            assert info["tool_result"].startswith("Error: ") and env.snapshot() == before
            assert reward == 0.0


def test_a_tool_env_refuses_a_context_window_that_drops_turns(scripted_backend):
    tokenizer = load_tokenizer()
    backend = scripted_backend(tokenizer, lambda s, t: "<|im_end|>")
    engine = _engine(backend, tokenizer, context_window="last_k")
    with pytest.raises(UserError, match="context_window=full"):
        engine.run("test-ledger", [0], group_size=1)


def test_the_same_engine_goes_back_to_answers_after_a_tool_env(scripted_backend):
    tokenizer = load_tokenizer()
    backend = scripted_backend(tokenizer, lambda s, t: " x </think><answer>Up</answer>")
    engine = _engine(backend, tokenizer)
    engine.run("test-ledger", [0], group_size=1)
    (traj,) = engine.run("sokoban", [10000], group_size=1)
    assert traj.messages[0]["content"] == "You're a helpful assistant."
    assert engine.params.stop_sequences  # </answer> again


# Laid out as Qwen2.5's template does (tools in the system message, results as user turns
# of <tool_response> blocks); text as expressions, since HF's jinja trims block newlines.
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
SCHEMAS = LedgerEnv.tool_schemas()


def own_tokenizer():
    """A copy of the (cached, shared) tokenizer, for a test that changes its chat template."""
    return copy.deepcopy(load_tokenizer())


def test_a_template_that_lays_out_tools_itself_is_used_natively():
    tokenizer = own_tokenizer()
    tokenizer.chat_template = QWEN_LIKE
    pieces = read_tool_pieces(tokenizer, SCHEMAS)
    assert pieces.native
    assert pieces.assistant_to_tool == "<|im_start|>user\n<tool_response>\n"
    assert pieces.tool_to_assistant == "\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
    chat = ChatTokens(tokenizer, "<think>", tools=SCHEMAS)
    assert "# Tools" in tokenizer.decode(chat.first_prompt("S", "U"))


def test_a_template_without_a_tool_role_gets_results_as_a_user_message():
    tokenizer = own_tokenizer()
    tokenizer.chat_template = (
        "{% for m in messages %}{% if m.role not in ['system', 'user', 'assistant'] %}"
        "{{ raise_exception('unknown role') }}{% endif %}"
        "<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    )
    chat = ChatTokens(tokenizer, "<think>", tools=SCHEMAS)
    assert not chat.tools.native
    text = tokenizer.decode(chat.tool_results(["R1", "R2"], "<|im_end|>"))
    assert text == (
        "\n<|im_start|>user\n<tool_response>\nR1\n</tool_response>\n<tool_response>\nR2\n"
        "</tool_response><|im_end|>\n<|im_start|>assistant\n<think>"
    )


def test_the_summary_counts_well_formed_calls_per_tool(scripted_backend):
    from starpo.evaluation.summary import summarise

    tokenizer = load_tokenizer()
    look = call_text("get_balance", {"account": "A"})
    reply = f" x </think><tool_call>{look}</tool_call><tool_call>oops</tool_call><|im_end|>"
    backend = scripted_backend(tokenizer, lambda s, t: reply)
    trajectories = _engine(backend, tokenizer).run("test-ledger", [0, 1], group_size=2)
    summary = summarise(trajectories)
    assert summary["tool_call_valid"] == pytest.approx(0.5)
    assert summary["tool_calls/get_balance"] == 4 * 4  # 4 episodes x 4 turns x 1 good call


@pytest.mark.parametrize(
    "arguments",
    ['{"account": "\\ud800"}', '{"account": 5, "x": "\\udfff"}', '{"account": "\\ud800\\u00e9"}'],
)
def test_calls_with_text_no_record_can_hold_are_invalid(arguments):
    # A lone surrogate (valid JSON escape, no valid Unicode) would have crashed the writing
    # of the trajectory record, in the call's label or in the error quoting it.
    env = LedgerEnv()
    env.reset(seed=0)
    _, _, _, _, info = env.step(f'{{"name": "get_balance", "arguments": {arguments}}}')
    assert not info["action_is_valid"]
    json.dumps(info, ensure_ascii=False).encode("utf-8")  # a record can be written


def test_whole_numbers_reach_an_integer_argument_as_integers():
    from starpo.envs.tools import read_call

    tool = Tool("page", "A page.", {"type": "object", "properties": {"n": {"type": "integer"}}})
    assert read_call('{"name": "page", "arguments": {"n": 3.0}}', [tool]).arguments == {"n": 3}


@pytest.mark.parametrize("env_id, calls_per_turn", [("invoice", 1), ("support", 5)])
def test_gold_episodes_replay_as_sft_examples_of_tool_turns(env_id, calls_per_turn):
    # One call a turn stops at </tool_call> (the end of turn comes in the next chunk); with
    # several the model ends its reply itself: both lay the gold calls out the same way.
    from starpo.sft.replay import replay_records
    from starpo.sft.run import gather_records

    tokenizer = load_tokenizer()
    records = gather_records([], from_solver=4, env_id=env_id).records
    settings = EpisodeSettings(
        max_turns=10,
        max_actions_per_traj=12,
        max_new_tokens=128,
        max_actions_per_turn=calls_per_turn,
    )
    result = replay_records(records, tokenizer, settings)
    assert not result.skipped and len(result.examples) == 4
    for record, example in zip(records, result.examples, strict=True):
        assert example.success
        executed = [call for turn in example.turns for call in turn.executed]
        assert executed == [step.action for step in record.steps]  # the gold calls, in order
        for turn in example.turns:  # a rationale, then exactly one call
            assert turn.format_ok and turn.think and turn.response.count("<tool_call>") == 1
        pairs = zip(example.token_ids, example.loss_mask, strict=True)
        trained = tokenizer.decode([t for t, m in pairs if m])
        assert "<|im_start|>tool" not in trained and trained.count("</tool_call>") == len(executed)
    ends_with_call = [tokenizer.decode(e.token_ids[e.turn_ends[0] - 9 : e.turn_ends[0] + 1])
                      for e in result.examples]  # fmt: skip
    assert all(end.endswith("</tool_call>") == (calls_per_turn == 1) for end in ends_with_call)
    again = replay_records(records, tokenizer, settings).examples
    assert [e.token_ids for e in again] == [e.token_ids for e in result.examples]


def test_the_memory_plan_sees_a_tool_episodes_real_first_prompt(scripted_backend):
    from starpo.config import load_config
    from starpo.memory.shapes import episode_shape

    tokenizer = load_tokenizer()
    cfg = load_config("cpu-invoice-sft-starpo-s")
    backend = scripted_backend(tokenizer, lambda s, t: "<|im_end|>")
    engine = RolloutEngine(backend, tokenizer, cfg.rollout.settings())
    (traj,) = engine.run("invoice", [0], group_size=1)
    shape = episode_shape(cfg, tokenizer, "invoice", {})
    assert shape.prompt_tokens == traj.loss_mask.index(1)  # the system message, tools, case


# Laid out as Llama 3.1's templates do (the tools in the first user message, a call as a bare
# JSON object with "parameters", results as `ipython` turns), with this tokenizer's end of
# turn (<|im_end|>) in place of Llama's <|eot_id|>.
LLAMA_LIKE = (
    "{%- for message in messages %}"
    "{%- set role = 'ipython' if message.role == 'tool' else message.role %}"
    "{{ '<|start_header_id|>' + role + '<|end_header_id|>\\n\\n' }}"
    "{%- if tools and loop.index0 == 1 and message.role == 'user' %}"
    "{{ 'Given the following functions, respond with a JSON for a function call. Respond in "
    'the format {"name": function name, "parameters": dictionary of argument name and its '
    "value}.\\n\\n' }}"
    "{%- for tool in tools %}{{ tool | tojson }}{{ '\\n\\n' }}{%- endfor %}{%- endif %}"
    "{%- if message.tool_calls %}{%- set call = message.tool_calls[0].function %}"
    "{{ '{\"name\": \"' + call.name + '\", \"parameters\": ' + call.arguments | tojson + '}' }}"
    "{%- else %}{{ message.content }}{%- endif %}"
    "{{ '<|im_end|>' }}{%- endfor %}"
    "{%- if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}"
    "{%- endif %}"
)


def _llama_call(name: str, arguments: dict[str, Any]) -> str:
    return call_text(name, arguments, key="parameters")


def test_a_template_with_bare_json_calls_gets_them_natively(scripted_backend):
    """Llama 3.1's call syntax: the template is detected as writing calls as one bare JSON
    object with "parameters"; the agent is asked for that shape, such a reply runs (one call
    a turn, no </tool_call> stop), results come back as the template's `ipython` turns, token
    for token, and a <tool_call> block is not this template's format."""
    from starpo.rollout.chat import call_syntax
    from starpo.rollout.parser import BARE_JSON, TAGGED

    tokenizer = own_tokenizer()
    assert call_syntax(tokenizer, SCHEMAS) == TAGGED  # SmolLM2's own template
    tokenizer.chat_template = QWEN_LIKE
    assert call_syntax(tokenizer, SCHEMAS) == TAGGED  # renders calls as <tool_call> blocks
    tokenizer.chat_template = LLAMA_LIKE
    assert call_syntax(tokenizer, SCHEMAS) == BARE_JSON
    pieces = read_tool_pieces(tokenizer, SCHEMAS)
    assert pieces.native and pieces.syntax == BARE_JSON
    assert pieces.assistant_to_tool == "<|start_header_id|>ipython<|end_header_id|>\n\n"

    env = LedgerEnv()
    env.reset(seed=3)
    replies = {
        1: f" check A </think> {_llama_call('get_balance', {'account': 'A'})}<|im_end|>",
        2: f" move </think>{_llama_call('transfer', {'source': 'A', 'target': 'B', 'amount': env.amount})}<|im_end|>",  # noqa: E501
        3: f" x </think><tool_call>{call_text('submit', {})}</tool_call><|im_end|>",
        4: f" done </think>{_llama_call('submit', {})}<|im_end|>",
    }
    backend = scripted_backend(tokenizer, lambda s, t: replies[t])
    engine = RolloutEngine(backend, tokenizer, EpisodeSettings(max_turns=4))
    (traj,) = engine.run("test-ledger", [3], group_size=1)
    assert engine.params.stop_sequences == ()
    assert '"parameters": {[arguments]}' in traj.messages[1]["content"]  # the shape asked for
    assert "up to 1 tool call a turn" in traj.messages[1]["content"]
    opening = tokenizer.decode(traj.token_ids[: traj.loss_mask.index(1)])
    assert '"name": "transfer"' in opening  # the template's own list of the tools
    assert [t.num_valid for t in traj.turns] == [1, 1, 0, 1]
    assert not traj.turns[2].format_ok  # a tagged call is not this template's syntax
    assert traj.turns[0].tool_results == ['{"balance": 100.0}']
    assert traj.success and traj.env_reward == 1.0
    rendered = tokenizer.apply_chat_template(traj.messages, tokenize=False, tools=SCHEMAS)
    assert tokenizer.decode(traj.token_ids) == rendered


def test_bare_json_turns_parse_as_one_call():
    from starpo.rollout.parser import BARE_JSON

    def parse(text, **kwargs):
        return parse_tool_turn(text, syntax=BARE_JSON, **kwargs)

    call = _llama_call("submit", {})
    assert parse(f"<think>a</think> {call} ").actions == (call,)
    assert parse(call, think=False).actions == (call,)
    assert parse("<think>a</think>{not json}").actions == ("{not json}",)  # the env judges it
    assert not parse(f"<think>a</think>I call {call}").format_ok
    assert not parse(f"<think>a</think>{call} done").format_ok
    assert not parse(f"<think>a</think><tool_call>{call}</tool_call>").format_ok
    assert not parse("<think>a</think>").format_ok and not parse(call).format_ok  # no think


def test_a_call_may_name_its_arguments_parameters_but_not_both():
    from starpo.envs.tools import ToolCall, ToolCallError, read_call

    tools = LedgerEnv.tools
    parsed = read_call(_llama_call("get_balance", {"account": "A"}), tools)
    assert parsed == ToolCall("get_balance", {"account": "A"})
    both = '{"name": "get_balance", "arguments": {"account": "A"}, "parameters": {}}'
    with pytest.raises(ToolCallError, match="arguments or parameters, not both"):
        read_call(both, tools)


def test_gold_calls_replay_in_a_bare_json_template():
    from starpo.sft.replay import replay_records
    from starpo.sft.run import gather_records

    tokenizer = own_tokenizer()
    tokenizer.chat_template = LLAMA_LIKE
    records = gather_records([], from_solver=2, env_id="invoice").records
    settings = EpisodeSettings(max_turns=10, max_actions_per_traj=12, max_new_tokens=128)
    result = replay_records(records, tokenizer, settings)
    assert not result.skipped and len(result.examples) == 2
    for record, example in zip(records, result.examples, strict=True):
        assert example.success
        assert [c for t in example.turns for c in t.executed] == [s.action for s in record.steps]
        for turn in example.turns:
            assert turn.format_ok and '"parameters"' in turn.response
            assert "<tool_call>" not in turn.response
