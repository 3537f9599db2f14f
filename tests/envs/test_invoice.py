"""Invoice env: the gold solver always scores, every wrong final state scores 0, malformed
calls change nothing, the random baseline stays low, and the splits differ as documented."""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

import numpy as np
import pytest

from starpo.envs import check_env, make
from starpo.envs.invoice.cases import (
    HELDOUT_ONLY,
    PROBLEMS,
    decision_arguments,
    generate_case,
    gold_decision,
    review,
    to_cents,
)
from starpo.envs.invoice.env import InvoiceEnv, gold_calls
from starpo.envs.tools import MAX_CALL_CHARS, call_text
from starpo.errors import UserError

SEEDS = range(200)
TRAIN_PROBLEMS = tuple(p for p in PROBLEMS if p not in HELDOUT_ONLY)


def play(env: InvoiceEnv, seed: int, calls: list[str]) -> tuple[float, dict[str, Any]]:
    """Reset with `seed`, make `calls` until the episode ends; the last reward and info."""
    env.reset(seed=seed)
    reward, info = 0.0, {}
    for call in calls:
        _, reward, terminated, truncated, info = env.step(call)
        if terminated or truncated:
            break
    return reward, info


def solve(env: InvoiceEnv, seed: int) -> list[str]:
    """The solver's calls for `seed`, played to the end on `env`."""
    env.reset(seed=seed)
    calls = []
    while not env.done:
        calls.append(env.optimal_action())
        env.step(calls[-1])
    return calls


def with_arguments(call: str, **changes: Any) -> str:
    parsed = json.loads(call)
    return call_text(parsed["name"], {**parsed["arguments"], **changes})


# --------------------------------------------------------------------- contract
@pytest.mark.parametrize(
    "kwargs",
    [
        {},
        {"split": "heldout"},
        {"max_lines": 1, "distractors": 0},
        {"max_steps": 2},
        {"turn_reward": 0.1},
    ],
)
def test_check_env_passes(kwargs: dict[str, Any]):
    check_env(InvoiceEnv(**kwargs))


def test_make_builds_the_registered_env():
    env = make("invoice")
    assert isinstance(env, InvoiceEnv)
    obs, _ = env.reset(seed=3)
    assert obs.startswith("Invoice INV-")


def test_tools_are_few_and_closed_sets_are_enums():
    tools = {tool.name: tool for tool in InvoiceEnv.tools}
    assert len(tools) <= 7 and [t.name for t in InvoiceEnv.tools if t.ends_episode] == [
        "record_decision"
    ]
    for tool in tools.values():
        assert len(tool.description) <= 90
        assert set(tool.parameters["required"]) <= set(tool.parameters["properties"])
    params = tools["record_decision"].parameters["properties"]
    assert params["decision"]["enum"] == ["approve", "hold", "reject"]
    assert params["reason"]["enum"] == list(PROBLEMS)
    assert all(reason in InvoiceEnv.instruction for reason in PROBLEMS)


# ------------------------------------------------------------------------- gold
@pytest.mark.parametrize("split", ["train", "heldout"])
def test_gold_solver_scores_one_on_every_case(split: str):
    env = InvoiceEnv(split=split)
    for seed in SEEDS:
        env.reset(seed=seed)
        assert env.optimal_success_probability() == 1.0
        expected = gold_calls(env.case)
        calls, rewards = [], []
        while not env.done:
            call = env.optimal_action()
            text = env.explain(call)
            assert text and len(text.split()) <= 30, (seed, call, text)
            calls.append(call)
            rewards.append(env.step(call)[1])
        assert calls == expected, seed
        assert rewards[-1] == 1.0 and sum(rewards) == 1.0 and env.is_success(), seed
        assert env.optimal_success_probability() == 1.0 and env.optimal_action() is None


@pytest.mark.parametrize("split", ["train", "heldout"])
def test_rules_find_the_planted_problem(split: str):
    """The gold outcome comes from the rules, not the label: they must agree."""
    env = InvoiceEnv(split=split, distractors=6, max_lines=6)
    for seed in SEEDS:
        env.reset(seed=seed)
        assert review(env.case.invoice, env.case.db).reason == env.case.problem, seed


def test_success_probability_counts_the_budget():
    """A decision scores only after the lookups it rests on: with 2 calls, only the cases
    one lookup decides (an unknown vendor) can be won, and the solver wins those."""
    env = InvoiceEnv(max_steps=2)
    for seed in range(50):
        env.reset(seed=seed)
        fits = len(gold_calls(env.case)) <= 2
        assert env.optimal_success_probability() == float(fits)
        solve(env, seed)
        assert env.is_success() == fits, seed
        assert env.optimal_success_probability() == float(fits)


def test_solver_resumes_after_other_calls():
    """Lookups already seen (even spelt differently) are not repeated; other calls do
    not stop the solver from succeeding."""
    env = InvoiceEnv()
    for seed in range(50):
        env.reset(seed=seed)
        vendor = env.case.invoice.vendor_name
        env.step(call_text("get_tax_rate", {}))
        env.step(call_text("search_vendors", {"name": vendor.upper()}))
        while not env.done:
            call = env.optimal_action()
            assert "search_vendors" not in call
            env.step(call)
        assert env.is_success(), seed


def test_explain_rejects_other_calls_and_changes_nothing():
    env = InvoiceEnv()
    env.reset(seed=4)
    before = env.snapshot()
    assert env.explain(call_text("get_tax_rate", {})) is None  # not the first gold call
    assert env.explain("not a call") is None
    assert env.explain(env.optimal_action()) is not None
    assert env.snapshot() == before


# ---------------------------------------------------------------- wrong states
def final_perturbations(env: InvoiceEnv, call: str) -> list[str]:
    """Each single change of the gold decision's arguments that makes a wrong record."""
    gold = json.loads(call)["arguments"]
    other_vendor = next(
        (v["id"] for v in env.case.db.vendors if v["id"] != gold["vendor_id"]), None
    )
    changes = [
        {"amount": gold["amount"] + 0.01},  # one cent: the rules define cents, exactly
        *([{"amount": gold["amount"] - 0.01}] if gold["amount"] >= 0.01 else []),
        {"amount": 0.0 if gold["amount"] else env.case.invoice.total / 100},
        {"vendor_id": other_vendor if gold["vendor_id"] == "" else ""},
        {
            "invoice_number": gold["invoice_number"][:-1]
            + str((int(gold["invoice_number"][-1]) + 1) % 10)
        },
        *({"decision": d} for d in ("approve", "hold", "reject") if d != gold["decision"]),
        *({"reason": r} for r in PROBLEMS if r != gold["reason"]),
    ]
    if other_vendor and gold["vendor_id"]:
        changes.append({"vendor_id": other_vendor})
    return [with_arguments(call, **change) for change in changes if None not in change.values()]


def test_every_perturbed_decision_scores_zero():
    env = InvoiceEnv()
    for seed in SEEDS:
        *lookups, final = gold_calls(generate_case(np.random.default_rng(seed)))
        env.reset(seed=seed)
        assert gold_calls(env.case)[-1] == final
        for wrong in final_perturbations(env, final):
            reward, info = play(env, seed, [*lookups, wrong])
            assert reward == 0.0 and env.done and not env.is_success(), (seed, wrong)
            assert env.optimal_success_probability() == 0.0


def test_an_amount_one_cent_off_scores_zero():
    """A hold or reject books 0 (never 0.01), an approval the total (never a cent off)."""
    env = InvoiceEnv()
    rejects = 0
    for seed in SEEDS:
        *lookups, final = solve(env, seed)
        assert env.is_success(), seed
        gold = json.loads(final)["arguments"]["amount"]
        for amount in (gold + 0.01, gold - 0.01, gold + 0.009, gold - 0.006):
            if amount >= 0:
                reward, _ = play(env, seed, [*lookups, with_arguments(final, amount=amount)])
                assert reward == 0.0 and not env.is_success(), (seed, amount)
        for amount in (gold + 0.004, round(gold, 2), f"{gold:.2f}"):  # the same cents
            reward, _ = play(env, seed, [*lookups, with_arguments(final, amount=float(amount))])
            assert reward == 1.0, (seed, amount)
        rejects += gold == 0
    assert rejects > 50


def test_amounts_are_read_in_exact_cents():
    """The gold amount, written as the solver writes it (cents / 100), reads back as the
    same cents on every case; float arithmetic (x * 100) does not."""
    assert [to_cents(a) for a in (1234.57, 0.01, 1.005, 12, 0.004)] == [123457, 1, 101, 1200, 0]
    for seed in range(3000):
        for split in ("train", "heldout"):
            gold = gold_decision(generate_case(np.random.default_rng(seed), split=split))
            assert to_cents(decision_arguments(gold)["amount"]) == gold.amount, seed


def test_no_decision_is_a_truncated_failure():
    env = InvoiceEnv()
    for seed in range(50):
        lookups = gold_calls(generate_case(np.random.default_rng(seed)))[:-1]
        filler = [call_text("get_tax_rate", {})] * env.max_steps
        reward, _ = play(env, seed, [*lookups, *filler])
        assert env.done and reward == 0.0 and not env.is_success()
        assert env.steps_left == 0
        assert env.optimal_success_probability() == 0.0


def test_random_baseline_rarely_succeeds():
    """Measured: 0 of 200 (a random record_decision needs the exact vendor and amount)."""
    env = InvoiceEnv()
    rng = np.random.default_rng(0)
    successes = 0
    for seed in SEEDS:
        env.reset(seed=seed)
        while not env.done:
            env.step(env.sample_action(rng))
        successes += env.is_success()
    assert successes / len(SEEDS) < 0.05


# ----------------------------------------------------------------------- replay
def test_replaying_calls_reproduces_the_state():
    env = InvoiceEnv()
    rng = np.random.default_rng(1)
    for seed in range(30):
        env.reset(seed=seed)
        calls, states = [], []
        while not env.done:
            call = env.optimal_action() if rng.random() < 0.5 else env.sample_action(rng)
            calls.append(call)
            env.step(call)
            states.append((env.snapshot(), env.state_key()))
        env.reset(seed=seed)
        for call, state in zip(calls, states, strict=True):
            env.step(call)
            assert (env.snapshot(), env.state_key()) == state, seed


def test_decision_is_appended_to_the_ledger():
    env = InvoiceEnv()
    for seed in range(20):
        calls = solve(env, seed)
        ledger = json.loads(env.snapshot())["ledger"]
        gold = gold_decision(env.case)
        assert len(ledger) == len(env.case.db.ledger) + 1
        assert ledger[-1]["invoice_number"] == gold.invoice_number
        assert ledger[-1]["amount"] == gold.amount and "record_decision" in calls[-1]


def test_state_key_follows_what_lookups_showed():
    env = InvoiceEnv()
    env.reset(seed=2)
    start = env.state_key()
    first = env.optimal_action()
    env.step(first)
    after = env.state_key()
    assert after != start
    env.step(first)  # the same lookup again shows nothing new
    assert env.state_key() == after
    env.step(call_text("get_purchase_order", {"po_id": "PO-0"}))  # an error shows nothing
    assert env.state_key() == after


# ---------------------------------------------------------------- bad calls
def malformed_calls(env: InvoiceEnv) -> list[Any]:
    record = json.loads(gold_calls(env.case)[-1])["arguments"]
    decide = lambda **a: json.dumps({"name": "record_decision", "arguments": a})  # noqa: E731
    return [
        "not json",
        "{",
        "[]",
        "null",
        '{"name": "approve_invoice", "arguments": {}}',
        '{"arguments": {}}',
        '{"name": "search_vendors", "arguments": {}, "extra": 1}',
        '{"name": "search_vendors"}',
        '{"name": "search_vendors", "arguments": {"name": 5}}',
        '{"name": "search_vendors", "arguments": {"name": "a", "limit": 3}}',
        '{"name": "search_vendors", "arguments": "not an object"}',
        '{"name": "get_tax_rate", "arguments": {"rate": 1}}',
        '{"name": "get_purchase_order", "arguments": {"po_id": null}}',
        decide(**{k: v for k, v in record.items() if k != "amount"}),
        decide(**{**record, "decision": "maybe"}),
        decide(**{**record, "reason": "other"}),
        decide(**{**record, "amount": "12.50"}),
        decide(**{**record, "amount": -1}),
        decide(**{**record, "amount": True}),
        decide(**{**record, "vendor_id": None}),
        decide(**{**record, "note": "x"}),
        '{"name": "record_decision", "arguments": {"amount": NaN}}',
        json.dumps({"name": "search_vendors", "arguments": {"name": "x" * MAX_CALL_CHARS}}),
        "[" * 100_000,
        None,
        12,
        {"name": "get_tax_rate", "arguments": {"x": 1}},
    ]


def test_malformed_calls_never_raise_and_change_nothing():
    env = InvoiceEnv()
    for seed in range(5):
        env.reset(seed=seed)
        for call in malformed_calls(env):
            before = (env.render(), env.snapshot(), env.state_key(), env.steps_left)
            obs, reward, terminated, truncated, info = env.step(call)
            assert (obs, env.snapshot(), env.state_key(), env.steps_left) == before, call
            assert not info["action_is_valid"] and reward == 0.0
            assert not terminated and not truncated
            assert info["tool_result"].startswith("Error:"), call


def test_tool_errors_use_a_call_and_change_nothing():
    """Well-formed calls the records cannot serve: "Error: ...", one call of the budget."""
    env = InvoiceEnv()
    env.reset(seed=0)
    record = json.loads(gold_calls(env.case)[-1])["arguments"]
    calls = [
        call_text("get_purchase_order", {"po_id": "PO-0"}),
        call_text("get_goods_receipt", {"po_id": "PO-0"}),
        call_text("search_ledger", {"vendor_id": "V-0"}),
        call_text("search_vendors", {"name": "x" * 500}),
        call_text("record_decision", {**record, "vendor_id": "V-0"}),
        call_text("record_decision", {**record, "invoice_number": " "}),
        call_text("record_decision", {**record, "invoice_number": "INV-" + "9" * 300}),
    ]
    for call in calls:
        before = env.snapshot()
        steps = env.steps_left
        _, reward, terminated, _, info = env.step(call)
        assert info["action_is_valid"] and not info["action_is_effective"]
        assert info["tool_result"].startswith("Error:") and len(info["tool_result"]) < 120
        assert env.snapshot() == before and env.steps_left == steps - 1
        assert reward == 0.0 and not terminated


def test_search_finds_nothing_without_error():
    env = InvoiceEnv()
    env.reset(seed=0)
    *_, info = env.step(call_text("search_vendors", {"name": "Nobody"}))
    assert info["tool_result"] == "[]"


# ---------------------------------------------------------------- the cases
def test_text_stays_short():
    env = InvoiceEnv()
    rng = np.random.default_rng(0)
    renders, results = [], []
    for seed in SEEDS:
        renders.append(len(env.reset(seed=seed)[0]))
        while not env.done:
            call = env.optimal_action() if rng.random() < 0.7 else env.sample_action(rng)
            results.append(len(env.step(call)[-1]["tool_result"]))
    assert max(renders) < 600 and max(results) < 400


def test_cases_are_many_and_every_train_problem_occurs():
    env = InvoiceEnv()
    texts, problems, missing = set(), Counter(), Counter()
    for seed in range(1000):
        texts.add(env.reset(seed=seed)[0])
        problems[env.case.problem] += 1
        if env.case.problem == "unknown_vendor":
            missing[env.case.notes["missing_vendor"]] += 1
    assert len(texts) >= 995
    assert set(problems) == set(TRAIN_PROBLEMS)
    assert min(problems.values()) > 120 and set(missing) == {True, False}


def test_heldout_has_its_own_names_and_the_tax_errors():
    names, problems = {}, {}
    for split in ("train", "heldout"):
        env = InvoiceEnv(split=split)
        names[split], problems[split] = set(), set()
        for seed in SEEDS:
            env.reset(seed=seed)
            names[split] |= {v["name"] for v in env.case.db.vendors}
            names[split].add(env.case.invoice.vendor_name)
            problems[split].add(env.case.problem)
    stems = {split: {name.split()[0] for name in names[split]} for split in names}
    assert not stems["train"] & stems["heldout"]
    assert problems["heldout"] == set(PROBLEMS) and "tax_error" not in problems["train"]


def test_knobs_shape_the_cases():
    env = InvoiceEnv(max_lines=1, distractors=0, problems=["none", "duplicate"])
    for seed in range(50):
        env.reset(seed=seed)
        case = env.case
        assert len(case.invoice.lines) == 1 and len(case.db.vendors) == 1
        assert len(case.db.orders) == 1 and case.problem in ("none", "duplicate")
        assert len(case.db.ledger) == (case.problem == "duplicate")
    wide = InvoiceEnv(max_lines=6, distractors=6)
    counts = set()
    for seed in range(50):
        wide.reset(seed=seed)
        counts.add(len(wide.case.invoice.lines))
        assert len(wide.case.db.vendors) == 7 and len(wide.case.db.orders) == 7
    assert counts == set(range(1, 7))


def test_reset_options_choose_the_problem():
    env = InvoiceEnv(split="heldout")
    env.reset(seed=0, options={"problem": "tax_error"})
    assert review(env.case.invoice, env.case.db).reason == "tax_error"
    with pytest.raises(UserError):
        InvoiceEnv().reset(seed=0, options={"problem": "tax_error"})


@pytest.mark.parametrize(
    "kwargs",
    [
        {"max_lines": 0},
        {"max_lines": 2.5},
        {"distractors": -1},
        {"distractors": True},
        {"problems": []},
        {"problems": "none"},
        {"problems": ["nonsense"]},
        {"problems": ["tax_error"]},
        {"split": "test"},
        {"max_steps": 0},
        {"max_steps": 1000},
        {"turn_reward": -0.1},
        {"turn_reward": 2},
        {"turn_reward": "0.1"},
        {"turn_reward": True},
    ],
)
def test_bad_kwargs_are_one_line_user_errors(kwargs: dict[str, Any]):
    with pytest.raises(UserError) as err:
        InvoiceEnv(**kwargs)
    assert "\n" not in str(err.value)


# ------------------------------------------------------------- turn-level reward
def _rewards(env: InvoiceEnv, seed: int, calls: list[str]) -> list[float]:
    env.reset(seed=seed)
    return [env.step(text)[1] for text in calls]


def test_turn_reward_pays_each_lookup_the_rules_call_for_and_only_those():
    # Off by default: the gold episode scores 0 until its decision's 1.0. On: each gold
    # lookup earns the turn reward, the decision its final score alone.
    for seed in range(40):
        env = InvoiceEnv(turn_reward=0.1)
        env.reset(seed=seed)
        calls = gold_calls(env.case)
        lookups = len(calls) - 1
        assert _rewards(InvoiceEnv(), seed, calls) == [0.0] * lookups + [1.0]
        assert _rewards(env, seed, calls) == [0.1] * lookups + [1.0]
        assert env.is_success()


def test_turn_reward_judges_order_repeats_spelling_and_the_final_call():
    env = InvoiceEnv(turn_reward=0.1)
    seed = next(s for s in range(100) if _problem(env, s) == "quantity_mismatch")
    env.reset(seed=seed)
    vendors, ledger, order, receipt, decision = gold_calls(env.case)
    name = json.loads(vendors)["arguments"]["name"]
    respelt = call_text("search_vendors", {"name": f"  {name.lower()} "})
    # out of order (the PO before the vendor check), a repeat, then the vendor as the
    # rules ask it, spelt otherwise: only the last is news the rules call for.
    assert _rewards(env, seed, [order, vendors, vendors]) == [0.0, 0.1, 0.0]
    assert _rewards(env, seed, [respelt, ledger]) == [0.1, 0.1]
    # a lookup of a record that does not exist is a tool error: no reward
    assert _rewards(env, seed, [call_text("get_purchase_order", {"po_id": "PO-0"})]) == [0.0]
    # the right lookups, then a wrong decision: the lookups keep their reward, the
    # decision scores 0
    wrong = json.loads(decision)
    wrong["arguments"]["reason"] = "price_mismatch"
    rewards = _rewards(env, seed, [vendors, ledger, order, receipt, json.dumps(wrong)])
    assert rewards == [0.1, 0.1, 0.1, 0.1, 0.0] and not env.is_success()


def _problem(env: InvoiceEnv, seed: int) -> str:
    return env.reset(seed=seed)[1]["problem"]
