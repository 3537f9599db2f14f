"""A decision task's answers (`TextEnv.answer()`) reach each trajectory and its summary:
the label the agent recorded, the one the rules call for, and what the collapse detector
reads of them (`answer_overuse`)."""

from __future__ import annotations

import json

import pytest

from starpo.envs.base import NO_ANSWER
from starpo.envs.invoice.cases import PROBLEMS
from starpo.envs.invoice.env import InvoiceEnv, gold_calls
from starpo.envs.support.env import SupportEnv
from starpo.evaluation.summary import summarise
from starpo.models import load_tokenizer
from starpo.rollout.engine import EpisodeSettings, RolloutEngine

SEEDS = list(range(12))


def _with_reason(call: str, reason: str) -> str:
    """The decision call `call` with its reason replaced."""
    record = json.loads(call)
    record["arguments"]["reason"] = reason
    return json.dumps(record)


def test_invoice_answers_the_recorded_reason_against_the_cases_problem():
    env = InvoiceEnv()
    for seed in SEEDS:
        info = env.reset(seed=seed)[1]
        assert env.answer() == (NO_ANSWER, info["problem"])
        *lookups, decision = gold_calls(env.case)
        for call in lookups:
            env.step(call)
        wrong = next(p for p in PROBLEMS if p != info["problem"])
        env.step(_with_reason(decision, wrong))
        assert env.answer() == (wrong, info["problem"]) and not env.is_success()


def test_support_answers_the_resolve_outcome_against_the_gold_one():
    env = SupportEnv()
    for seed in SEEDS:
        env.reset(seed=seed)
        given, gold = env.answer()
        assert given == NO_ANSWER and gold
        while not env.done:
            env.step(env.optimal_action())
        assert env.is_success() and env.answer() == (gold, gold)


def test_engine_records_answers_and_the_summary_counts_them(scripted_backend):
    """Half the episodes record the gold decision, half the same wrong reason: the
    summary's shares, per-family success and overuse follow from the scripted replies."""
    tokenizer = load_tokenizer()
    env, plans, golds = InvoiceEnv(), {}, {}
    for session, seed in enumerate(SEEDS):
        info = env.reset(seed=seed)[1]
        plan = gold_calls(env.case)
        golds[session] = info["problem"]
        if session % 2:  # every other episode says "duplicate", right or wrong
            plan[-1] = _with_reason(plan[-1], "duplicate")
        plans[session] = plan

    def script(session: int, turn: int) -> str:
        call = plans[session][min(turn, len(plans[session])) - 1]
        return f" check </think><tool_call>{call}</tool_call><|im_end|>"

    engine = RolloutEngine(
        scripted_backend(tokenizer, script),
        tokenizer,
        EpisodeSettings(max_turns=8, max_actions_per_turn=1),
    )
    trajectories = engine.run("invoice", SEEDS, group_size=1)
    for session, traj in enumerate(trajectories):
        given = "duplicate" if session % 2 else golds[session]
        assert (traj.answer, traj.gold_answer) == (given, golds[session])
        assert traj.success == (given == golds[session])
    summary = summarise(trajectories)
    answers = [t.answer for t in trajectories]
    for label in set(answers):
        assert summary[f"answer_share/{label}"] == pytest.approx(answers.count(label) / 12)
    for gold in set(golds.values()):
        family = [t.success for t in trajectories if t.gold_answer == gold]
        assert summary[f"family_success/{gold}"] == pytest.approx(sum(family) / len(family))
    not_duplicate = [t for t in trajectories if t.gold_answer != "duplicate"]
    took = sum(t.answer == "duplicate" for t in not_duplicate) / len(not_duplicate)
    assert summary["answer_overuse"] == pytest.approx(took) and took >= 0.4
    # A record written and read back keeps its labels.
    again = type(trajectories[0]).from_json(trajectories[0].to_json())
    assert (again.answer, again.gold_answer) == (trajectories[0].answer, golds[0])
