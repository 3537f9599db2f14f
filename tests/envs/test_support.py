"""Support desk: the contract, the gold solver, perturbations of it, malformed calls,
replays, baselines, splits and knobs."""

from __future__ import annotations

import json
from collections import Counter

import numpy as np
import pytest

from starpo.envs import check_env, make
from starpo.envs.support.cases import (
    ALL_KINDS,
    HELDOUT_ONLY_KINDS,
    IN_POLICY,
    OUTCOMES,
    TRAIN_KINDS,
    decide,
)
from starpo.envs.support.env import SupportEnv
from starpo.envs.support.solver import gold_calls
from starpo.envs.tools import MAX_CALL_CHARS, call_text
from starpo.errors import UserError

SEEDS = range(200)
SPLITS = ("train", "heldout")


def play(env: SupportEnv, seed: int, calls: list[str]) -> tuple[float, list[str]]:
    """Reset with `seed`, step `calls` until the episode ends: (last reward, tool results)."""
    env.reset(seed=seed)
    reward, results = 0.0, []
    for call in calls:
        _, reward, terminated, truncated, info = env.step(call)
        results.append(info["tool_result"])
        if terminated or truncated:
            break
    return reward, results


def call(name: str, **arguments) -> str:
    return call_text(name, arguments)


def args_of(text: str) -> tuple[str, dict]:
    data = json.loads(text)
    return data["name"], data["arguments"]


# ------------------------------------------------------------------------ contract
@pytest.mark.parametrize(
    "kwargs",
    [
        {},
        {"split": "heldout"},
        {"max_items": 1, "distractor_orders": 0},
        {"requests": "cancel"},
        {"turn_reward": 0.1},
    ],
)
def test_checker_passes(kwargs):
    assert "determinism" in check_env(SupportEnv(**kwargs))


def test_registered_id_builds():
    env = make("support")
    assert isinstance(env, SupportEnv) and env.split == "train"
    assert make("support", split="heldout", max_steps=10).max_steps == 10
    obs, info = env.reset(seed=3)
    assert obs == env.render() and info["request"] in TRAIN_KINDS


def test_tools_are_few_described_and_closed():
    tools = SupportEnv.tool_schemas()
    assert len(tools) <= 8
    for schema in tools:
        function = schema["function"]
        assert 0 < len(function["description"]) <= 80
        params = function["parameters"]
        assert set(params["required"]) == set(params["properties"])
    enums = {t["function"]["name"]: t["function"]["parameters"] for t in tools}
    assert enums["resolve"]["properties"]["outcome"]["enum"] == list(OUTCOMES)
    assert [t.name for t in SupportEnv.tools if t.ends_episode] == ["resolve"]


# -------------------------------------------------------------------------- solver
@pytest.mark.parametrize("split", SPLITS)
def test_gold_solver_scores_one_on_every_case(split):
    env = SupportEnv(split=split)
    for seed in SEEDS:
        env.reset(seed=seed)
        calls = gold_calls(env.case)
        assert len(calls) <= 9 < env.max_steps
        for i, text in enumerate(calls):
            assert env.optimal_action() == text
            assert env.optimal_success_probability() == 1.0
            why = env.explain(text)
            assert why and len(why.split()) <= 30 and "\n" not in why
            _, reward, terminated, truncated, info = env.step(text)
            assert info["action_is_valid"] and not info["tool_result"].startswith("Error")
            assert terminated == (i == len(calls) - 1) and not truncated
        assert reward == 1.0 and env.is_success() and env.optimal_action() is None


def test_solver_takes_over_mid_episode_and_gives_up_after_a_wrong_change():
    env = SupportEnv()
    env.reset(seed=0)
    # A detour (asking the reason, never needed) does not change the rest of the plan.
    env.step(call("ask_customer", topic="reason"))
    rest = gold_calls(env.case)
    while not env.done:
        env.step(env.optimal_action())
    assert env.is_success() and env.num_steps == len(rest) + 1
    env.reset(seed=0)  # a refund case: refunding the wrong amount cannot be undone
    assert env.case.kind == "refund"
    item = env.case.item
    env.step(call("refund_item", order_id=env.case.target.order_id, sku=item.sku, amount=1))
    assert env.optimal_action() is None and env.optimal_success_probability() == 0.0


def test_success_probability_counts_the_budget():
    env = SupportEnv(max_steps=2)
    for seed in SEEDS:
        env.reset(seed=seed)
        needed = len(gold_calls(env.case))
        assert env.optimal_success_probability() == float(needed <= 2)


def test_explain_only_for_the_gold_call():
    env = SupportEnv()
    env.reset(seed=5)
    gold = env.optimal_action()
    name, arguments = args_of(gold)
    spaced = json.dumps({"arguments": arguments, "name": name}, indent=2)
    assert env.explain(spaced) == env.explain(gold)  # read as step() reads it
    for other in (call("resolve", outcome="refused"), "not json", "", call("get_order")):
        assert env.explain(other) is None
    before = env.snapshot()
    env.explain(gold)
    assert env.snapshot() == before


# ------------------------------------------------------------------- perturbations
def perturbations(env: SupportEnv, calls: list[str]) -> list[list[str]]:
    """Single changes to the gold trajectory that each change the final database or the
    outcome: another outcome, a missing action, a wrong amount, order or item, an extra
    action against the policy."""
    case = env.case
    gold = decide(case)
    order, item = case.target, case.item
    others = [o for o in case.orders if o.order_id != order.order_id]
    siblings = [i for i in order.items if i.sku != item.sku]
    body, last = calls[:-1], calls[-1]
    out = [body + [call("resolve", outcome=o)] for o in OUTCOMES if o != gold.outcome]
    for i, text in enumerate(body):
        name, a = args_of(text)
        if name not in ("refund_item", "exchange_item", "cancel_order"):
            continue
        out.append(body[:i] + body[i + 1 :] + [last])  # the action left out
        if name != "cancel_order":  # a second cancel is refused by the tool (no change)
            out.append(body[: i + 1] + [text] + body[i + 1 :] + [last])  # done twice
        variants = []
        if name == "refund_item":
            for amount in (a["amount"] - 0.01, a["amount"] + 1, round(a["amount"] / 2, 2)):
                variants.append({**a, "amount": amount})
            variants += [{**a, "sku": s.sku} for s in siblings]
            variants += [{**a, "order_id": o.order_id, "sku": o.items[0].sku} for o in others]
        if name == "exchange_item":
            variants.append({**a, "new_sku": a["sku"]})
            variants += [
                {**a, "new_sku": p.sku}
                for p in case.products
                if p.sku.split("-")[0] == a["sku"].split("-")[0]
                and p.sku not in (a["sku"], a["new_sku"])
            ]
            variants += [{**a, "sku": s.sku} for s in siblings]
        if name == "cancel_order":
            variants += [{"order_id": o.order_id} for o in others if o.status == "processing"]
        out += [body[:i] + [call(name, **v)] + body[i + 1 :] + [last] for v in variants]
    tempting = [
        call("refund_item", order_id=order.order_id, sku=item.sku, amount=item.cents / 100),
        call("cancel_order", order_id=order.order_id),
    ]
    if case.facts.new_sku:
        tempting.append(
            call("exchange_item", order_id=order.order_id, sku=item.sku, new_sku=case.facts.new_sku)
        )
    for extra in tempting:
        if extra not in body:
            out.append(body + [extra, last])
    return out


@pytest.mark.parametrize("split", SPLITS)
def test_every_single_perturbation_of_the_gold_scores_below_one(split):
    env = SupportEnv(split=split)
    seen = Counter()
    for seed in SEEDS:
        env.reset(seed=seed)
        calls = gold_calls(env.case)
        for variant in perturbations(env, calls):
            reward, _ = play(env, seed, variant)
            assert reward < 1.0 and not env.is_success(), (seed, variant)
            seen[env.case.kind] += 1
    assert set(seen) == set(TRAIN_KINDS if split == "train" else ALL_KINDS)


def first_seed(kind: str, split: str = "train") -> tuple[SupportEnv, int]:
    env = SupportEnv(split=split)
    for seed in range(1000):
        env.reset(seed=seed)
        if env.case.kind == kind:
            return env, seed
    raise AssertionError(kind)


@pytest.mark.parametrize(
    ("kind", "split", "trap"),
    [
        ("refund_final_sale", "heldout", "refund_item"),
        ("refund_late", "train", "refund_item"),
        ("cancel_shipped", "train", "cancel_order"),
        ("exchange_no_stock", "train", "exchange_item"),
    ],
)
def test_actions_against_policy_go_through_and_score_zero(kind, split, trap):
    env, seed = first_seed(kind, split)
    order, item = env.case.target, env.case.item
    arguments = {
        "refund_item": {"order_id": order.order_id, "sku": item.sku, "amount": item.cents / 100},
        "cancel_order": {"order_id": order.order_id},
        "exchange_item": {
            "order_id": order.order_id,
            "sku": item.sku,
            "new_sku": env.case.facts.new_sku,
        },
    }[trap]
    wanted = {"refund_item": "refunded", "cancel_order": "cancelled"}.get(trap, "exchanged")
    # Looked up first (the order, the stock), so that only the policy makes the trap score 0.
    lookups = [call("get_order", order_id=order.order_id)]
    if trap == "exchange_item":
        lookups.append(call("get_product", sku=env.case.facts.new_sku))
    before = env.snapshot()
    trapped = [*lookups, call(trap, **arguments), call("resolve", outcome=wanted)]
    reward, results = play(env, seed, trapped)
    assert not results[-2].startswith("Error") and env.snapshot() != before
    assert reward == 0.0
    reward, _ = play(env, seed, [*lookups, call("resolve", outcome="refused")])
    assert reward == 1.0  # refusing once the records are seen is this case's gold


# ---------------------------------------------------------------- malformed calls
MALFORMED = [
    "not json",
    '{"name": "get_order", "arguments": {"order_id": "O-1"}',
    "[1, 2]",
    "42",
    "NaN",
    '{"name": "teleport", "arguments": {}}',
    '{"name": "get_order", "arguments": {}}',
    '{"name": "get_order", "arguments": {"order_id": "O-1", "extra": 1}}',
    '{"name": "get_order", "arguments": {"order_id": 12345}}',
    '{"name": "refund_item", "arguments": {"order_id": "O-1", "sku": "X", "amount": "9.99"}}',
    '{"name": "refund_item", "arguments": {"order_id": "O-1", "sku": "X", "amount": true}}',
    '{"name": "refund_item", "arguments": {"order_id": "O-1", "sku": "X", "amount": -5}}',
    '{"name": "refund_item", "arguments": {"order_id": "O-1", "sku": "X", "amount": NaN}}',
    '{"name": "ask_customer", "arguments": {"topic": "weather"}}',
    '{"name": "resolve", "arguments": {"outcome": "escalated"}}',
    '{"name": "resolve", "arguments": "{\\"outcome\\": 1}"}',
    '{"name": "resolve", "arguments": {"outcome": "refused"}, "id": 7}',
    call("get_order", order_id="O-" + "9" * MAX_CALL_CHARS),
    "[" * 5000 + "]" * 5000,
    None,
    3.5,
    {"name": "resolve"},
]


def test_malformed_calls_never_raise_and_change_nothing():
    env = SupportEnv()
    for seed in (0, 1, 2):
        env.reset(seed=seed)
        env.step(env.optimal_action())
        for action in MALFORMED:
            before = (env.render(), env.snapshot(), env.state_key(), env.steps_left)
            obs, reward, terminated, truncated, info = env.step(action)
            after = (obs, env.snapshot(), env.state_key(), env.steps_left)
            assert after == before, action
            assert reward == 0.0 and not terminated and not truncated
            assert info["action_is_valid"] is False
            assert info["tool_result"].startswith("Error: "), info["tool_result"]


def test_lookups_of_missing_records_are_tool_errors_that_use_a_step():
    env = SupportEnv()
    env.reset(seed=4)
    order = env.case.target
    long_id = "O-" + "7" * 1000  # well formed (under the call limit), but no such order
    for text in [
        call("get_order", order_id="O-00000"),
        call("get_order", order_id=long_id),
        call("list_orders", email="nobody@example.com"),
        call("get_product", sku="NOPE-RED"),
        call("refund_item", order_id=order.order_id, sku="NOPE-RED", amount=5),
        call("exchange_item", order_id=order.order_id, sku=order.items[0].sku, new_sku="ZZ-1"),
        call("cancel_order", order_id="O-1"),
    ]:
        before, left = env.snapshot(), env.steps_left
        _, reward, *_, info = env.step(text)
        assert info["action_is_valid"] and info["tool_result"].startswith("Error: ")
        assert len(info["tool_result"]) < 120 and reward == 0.0
        assert env.snapshot() == before and env.steps_left == left - 1


def test_ids_ignore_case_and_spaces():
    env = SupportEnv()
    env.reset(seed=0)
    order_id = env.case.target.order_id
    _, _, _, _, info = env.step(call("get_order", order_id=f" {order_id.lower()} "))
    assert json.loads(info["tool_result"])["order_id"] == order_id


# ------------------------------------------------------------------------ replays
def test_replaying_calls_reproduces_the_snapshot():
    env, chooser = SupportEnv(), np.random.default_rng(0)
    for seed in range(40):
        env.reset(seed=seed)
        calls = gold_calls(env.case)
        mixed = [env.sample_action(chooser) for _ in range(4)] + calls
        for trajectory in (calls, mixed):
            first = play(env, seed, trajectory), env.snapshot(), env.state_key()
            again = play(env, seed, trajectory), env.snapshot(), env.state_key()
            assert first == again


def test_state_key_tracks_what_the_agent_knows():
    env = SupportEnv()
    env.reset(seed=1)
    key, snap = env.state_key(), env.snapshot()
    env.step(call("ask_customer", topic="reason"))
    assert env.snapshot() == snap and env.state_key() != key


# ---------------------------------------------------------------------- baselines
def test_random_baseline_rarely_succeeds():
    """Measured over seeds 0..199: 0% on both splits (before a resolution needed its
    lookups, 4% on train and 8.5% held out, all of them blind resolve("refused") calls)."""
    for split, bound in (("train", 0.08), ("heldout", 0.12)):
        env, chooser, wins = SupportEnv(split=split), np.random.default_rng(0), 0
        for seed in SEEDS:
            env.reset(seed=seed)
            while not env.done:
                env.step(env.sample_action(chooser))
            wins += env.is_success()
        assert wins / len(SEEDS) <= bound, (split, wins)


def look_then_refuse(env: SupportEnv) -> list[str]:
    """Look up what any resolution rests on (the order, the wanted variant), then refuse."""
    facts = env.case.facts
    calls = [call("get_order", order_id=facts.order_id)]
    if facts.wanted == "exchange":
        calls.append(call("get_product", sku=facts.new_sku))
    return [*calls, call("resolve", outcome="refused")]


def test_refusing_everything_is_a_poor_strategy():
    """Measured over seeds 0..199: 27% of train cases, 42.5% of held-out ones (refusing
    blind, without the lookups, wins none)."""
    for split, bound in (("train", 0.35), ("heldout", 0.55)):
        env, wins = SupportEnv(split=split), 0
        for seed in SEEDS:
            env.reset(seed=seed)
            wins += play(env, seed, look_then_refuse(env))[0]
            assert play(env, seed, [call("resolve", outcome="refused")])[0] == 0.0
        assert 0.15 <= wins / len(SEEDS) <= bound, (split, wins)


# ----------------------------------------------------------------- cases and splits
def test_every_train_kind_occurs_and_matches_the_policy():
    env, kinds = SupportEnv(), Counter()
    for seed in SEEDS:
        env.reset(seed=seed)
        kinds[env.case.kind] += 1
        granted = env.case.kind in IN_POLICY
        assert (decide(env.case).outcome != "refused") == granted
    assert set(kinds) == set(TRAIN_KINDS)


def test_heldout_is_the_final_sale_clause():
    """Train never shows a final-sale item; held-out marks some and adds the final-sale
    request kinds (refused), besides every train kind."""
    final_sale = {}
    kinds = {}
    for split in SPLITS:
        env = SupportEnv(split=split)
        final_sale[split], kinds[split] = 0, set()
        for seed in SEEDS:
            env.reset(seed=seed)
            kinds[split].add(env.case.kind)
            final_sale[split] += sum(i.final_sale for o in env.case.orders for i in o.items)
    assert final_sale["train"] == 0 and final_sale["heldout"] > 100
    assert kinds["train"] == set(TRAIN_KINDS) and kinds["heldout"] == set(ALL_KINDS)
    for kind in HELDOUT_ONLY_KINDS:
        env, _ = first_seed(kind, "heldout")
        assert env.case.item.final_sale and decide(env.case).outcome == "refused"


def test_cases_are_many_and_distinct():
    env = SupportEnv()
    rendered = set()
    for seed in range(2000):
        rendered.add(env.reset(seed=seed)[0])
    assert len(rendered) >= 1990


def test_texts_are_compact_and_hide_what_the_customer_has_not_said():
    env = SupportEnv(max_items=4, distractor_orders=4)
    for seed in SEEDS:
        obs, _ = env.reset(seed=seed)
        case = env.case
        assert len(obs) < 400
        assert (case.facts.order_id in obs) == ("order_id" in case.facts.said)
        assert (case.email in obs) == ("email" in case.facts.said)
        _, results = play(env, seed, gold_calls(case))
        assert max(len(r) for r in results) < 800
        if "order_id" not in case.facts.said:
            assert case.item.product in obs  # the item then identifies the order


def test_customer_answers_from_the_hidden_facts():
    env, _ = first_seed("exchange")
    facts = env.case.facts
    for topic, fact in [
        ("email", env.case.email),
        ("item", env.case.item.product),
        ("new_variant", facts.new_variant.replace("size ", "")),
    ]:
        *_, info = env.step(call("ask_customer", topic=topic))
        assert fact in json.loads(info["tool_result"])["customer"]


def test_knobs_shape_the_cases():
    env = SupportEnv(max_items=1, distractor_orders=3, requests=["cancel", "cancel_shipped"])
    for seed in range(50):
        env.reset(seed=seed)
        assert len(env.case.orders) == 4 and env.case.kind.startswith("cancel")
        assert all(len(o.items) == 1 for o in env.case.orders)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"max_items": 0},
        {"max_items": 5},
        {"max_items": True},
        {"max_items": "3"},
        {"distractor_orders": -1},
        {"distractor_orders": 9},
        {"split": "test"},
        {"split": None},
        {"requests": []},
        {"requests": ["bogus"]},
        {"requests": ["refund_final_sale"]},
        {"requests": 5},
        {"requests": {"refund": 1}},
        {"max_steps": 0},
        {"max_steps": 2.5},
        {"max_steps": 10**6},
    ],
)
def test_bad_kwargs_are_one_line_user_errors(kwargs):
    with pytest.raises(UserError) as err:
        SupportEnv(**kwargs)
    assert "\n" not in str(err.value)


def test_turn_reward_pays_each_step_of_the_gold_plan_and_only_those():
    # Each gold call before resolve earns the turn reward (asked before it runs), resolve
    # its final score alone; a call off the plan, or the same question again, earns 0.
    for seed in range(40):
        env = SupportEnv(turn_reward=0.1)
        env.reset(seed=seed)
        calls = gold_calls(env.case)
        rewards = [env.step(text)[1] for text in calls]
        assert rewards == [0.1] * (len(calls) - 1) + [1.0] and env.is_success()
        env.reset(seed=seed)
        first = calls[0]
        assert [env.step(first)[1], env.step(first)[1]] == [0.1, 0.0]
    env = SupportEnv()
    env.reset(seed=0)
    assert {env.step(text)[1] for text in gold_calls(env.case)[:-1]} == {0.0}  # off: none
