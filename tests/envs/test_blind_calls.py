"""A blind final call, the episode's only call, made before looking anything up, must not
win more often than random calls do.

Scored on the final state alone, it did: `resolve("refused")` won every out-of-policy
support case (24.4% of train seeds 0-999, 42.9% held out; random calls 4.3% / 6.9%), and
`record_decision` rejecting an unknown vendor "" every invoice whose vendor is missing (9.4%
/ 8.9%; random calls 0%). Both envs now score a decision only once the lookups it rests on
were made (invoice: the gold plan's lookups; support: `solver.evidence`), so that no blind
call wins at all. `python tests/envs/test_blind_calls.py [SEEDS]` prints the figures that
docs/tool-agents.md quotes.
"""

from __future__ import annotations

import sys
from collections.abc import Callable

import numpy as np
import pytest

from starpo.envs.invoice.cases import DECISIONS, PROBLEMS
from starpo.envs.invoice.env import InvoiceEnv
from starpo.envs.support.cases import OUTCOMES
from starpo.envs.support.env import SupportEnv
from starpo.envs.tools import ToolEnv, call_text

#: A blind policy: its first and only call, from what the agent reads before any lookup.
Policy = Callable[[ToolEnv], str]


def invoice_blind_calls() -> dict[str, Policy]:
    """record_decision with every decision, reason and amount (0 or the invoice's total),
    for the invoice's own number and vendor "" (no vendor id is on the invoice)."""

    def call(decision: str, reason: str, total: bool) -> Policy:
        def policy(env: ToolEnv) -> str:
            invoice = env.case.invoice
            amount = invoice.total / 100 if total else 0
            arguments = {"invoice_number": invoice.number, "vendor_id": "",
                         "decision": decision, "reason": reason, "amount": amount}  # fmt: skip
            return call_text("record_decision", arguments)

        return policy

    return {
        f"record_decision({d}, {r}, vendor '', amount {'total' if t else 0})": call(d, r, t)
        for d in DECISIONS
        for r in PROBLEMS
        for t in (False, True)
    }


def support_blind_calls() -> dict[str, Policy]:
    return {
        f"resolve({o})": lambda env, o=o: call_text("resolve", {"outcome": o}) for o in OUTCOMES
    }


BLIND = {InvoiceEnv: invoice_blind_calls, SupportEnv: support_blind_calls}


def success_rate(env: ToolEnv, seeds: range, first_calls: Callable[[ToolEnv], list[str]]) -> float:
    """Share of `seeds` won by making `first_calls(env)` after reset (and nothing else)."""
    wins = 0
    for seed in seeds:
        env.reset(seed=seed)
        for text in first_calls(env):
            env.step(text)
        wins += env.is_success()
    return wins / len(seeds)


def random_rate(env: ToolEnv, seeds: range) -> float:
    """The random baseline: `sample_action` calls until the episode ends (as `starpo eval
    --policy random` plays)."""
    chooser, wins = np.random.default_rng(0), 0
    for seed in seeds:
        env.reset(seed=seed)
        while not env.done:
            env.step(env.sample_action(chooser))
        wins += env.is_success()
    return wins / len(seeds)


def blind_rates(env: ToolEnv, seeds: range) -> dict[str, float]:
    return {
        name: success_rate(env, seeds, lambda e, p=policy: [p(e)])
        for name, policy in BLIND[type(env)]().items()
    }


@pytest.mark.parametrize("env_cls", [InvoiceEnv, SupportEnv])
@pytest.mark.parametrize("split", ["train", "heldout"])
def test_no_blind_final_call_beats_random_calls(env_cls: type[ToolEnv], split: str):
    env = env_cls(split=split)
    seeds = range(100)
    rates = blind_rates(env, seeds)
    best = max(rates, key=rates.get)
    baseline = random_rate(env, seeds)
    # Random calls win nothing on either env now (their wins were blind resolves), so
    # "below random" is "never": a call made before any lookup cannot win.
    assert rates[best] <= baseline and rates[best] == 0.0, (best, rates[best], baseline)


def first_lookup(env: ToolEnv) -> list[str]:
    """The lookup that shows the records the blind call's decision rests on."""
    if isinstance(env, InvoiceEnv):
        return [call_text("search_vendors", {"name": env.case.invoice.vendor_name})]
    return [call_text("get_order", {"order_id": env.case.target.order_id})]


@pytest.mark.parametrize(
    ("env_cls", "policy", "share"),
    [
        (InvoiceEnv, "record_decision(reject, unknown_vendor, vendor '', amount 0)", 0.05),
        (SupportEnv, "resolve(refused)", 0.15),
    ],
)
def test_the_same_call_after_its_lookup_still_wins_its_cases(env_cls, policy, share):
    """The score asks for the lookup, it does not turn the call off: one lookup first, and
    the blind call wins the cases where it is the gold decision."""
    env = env_cls()
    call = BLIND[env_cls]()[policy]
    assert success_rate(env, range(100), lambda e: [*first_lookup(e), call(e)]) > share


def main(count: int) -> None:
    """Print each env's random baseline and blind calls that ever win, per split and seeds."""
    ranges = {f"seeds 0-{count - 1}": range(count), "validation seeds 123-378": range(123, 379)}
    for env_cls in BLIND:
        for split in ("train", "heldout"):
            env = env_cls(split=split)
            for label, seeds in ranges.items():
                rates = blind_rates(env, seeds)
                winners = {n: r for n, r in rates.items() if r > 0} or {"any blind call": 0.0}
                shown = ", ".join(f"{n} {r:.1%}" for n, r in winners.items())
                print(f"{env_cls.__name__} {split} {label}: random calls "
                      f"{random_rate(env, seeds):.1%}; {shown}")  # fmt: skip


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 1000)
