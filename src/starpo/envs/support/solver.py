"""The gold trajectory: from what the agent knows so far, the calls that finish the case.

The solver plays the case as a careful agent would, using only what it has been told or has
looked up, never the hidden facts themselves: ask for the order number (or, when the
customer has none, for the email and then list their orders), look the order up, learn what
the customer wants and which item, check the policy, check stock before an exchange, act
within the policy, resolve. It asks only what the decision needs: a late or undelivered
order is refused without asking which item, an ineligible exchange without asking for the
variant. `plan` works from any state the agent has reached, so `optimal_action` takes over
mid-episode; a change the gold resolution does not make cannot be undone, and then no plan
exists.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable
from dataclasses import dataclass
from typing import Any

from starpo.envs.support.cases import Case, Change, Resolution, decide, item_block, order_block
from starpo.envs.tools import call_text

#: The tools that change the database.
ACTIONS = ("refund_item", "exchange_item", "cancel_order")


@dataclass(frozen=True)
class Step:
    """One gold call, why it is made, and what the agent knows after it (a knowledge key)."""

    name: str
    arguments: dict[str, Any]
    why: str
    learns: str = ""

    def text(self) -> str:
        return call_text(self.name, self.arguments)


# Knowledge keys: what a call taught the agent (the env records them the same way).
def asked(topic: str) -> str:
    return f"ask:{topic}"


def listed(email: str) -> str:
    return f"orders:{email}"


def looked_up(order_id: str) -> str:
    return f"order:{order_id}"


def checked(sku: str) -> str:
    return f"product:{sku}"


def evidence(case: Case) -> tuple[str, ...]:
    """What the gold resolution rests on, as knowledge keys: the order the request is about
    (its status, delivery and items decide every rule), and for an exchange the order and
    item rules allow, the new variant's stock. `plan` looks these up before it resolves;
    the score asks for them, so that a resolution made without looking (a blind
    resolve("refused") as the first call) does not win."""
    facts = case.facts
    keys = [looked_up(facts.order_id)]
    if facts.wanted == "exchange" and order_block(case) is None and item_block(case) is None:
        keys.append(checked(facts.new_sku))
    return tuple(keys)


def plan(case: Case, known: Collection[str], changes: Iterable[Change]) -> list[Step] | None:
    """The gold calls from a state where the agent knows `known` (knowledge keys) and has
    made `changes`, up to and including resolve; None when `changes` already break the gold
    resolution (no call can undo them)."""
    gold = decide(case)
    made = sorted(changes, key=repr)
    done = made == sorted(gold.changes, key=repr)
    if made and not done:
        return None
    knowledge, steps = set(known), []
    while True:
        step = _next_step(case, knowledge, gold, done)
        steps.append(step)
        if step.name == "resolve":
            return steps
        if step.learns:
            knowledge.add(step.learns)
        done = done or step.name in ACTIONS


def gold_calls(case: Case) -> list[str]:
    """The gold trajectory of a fresh case, as call texts."""
    steps = plan(case, (), ())
    assert steps is not None
    return [step.text() for step in steps]


def _ask(topic: str, why: str) -> Step:
    return Step("ask_customer", {"topic": topic}, why, asked(topic))


def _next_step(case: Case, known: set[str], gold: Resolution, done: bool) -> Step:
    facts = case.facts
    product = case.item.product

    def told(topic: str) -> bool:
        return topic in facts.said or asked(topic) in known

    knows_order = (
        "order_id" in facts.said
        or (asked("order_id") in known and facts.knows_order_id)
        or (listed(case.email) in known and told("item"))
    )
    if not knows_order:
        if asked("order_id") not in known:
            return _ask("order_id", "I need the order number, so I ask the customer for it.")
        if not told("email"):
            return _ask("email", "The customer has no order number; I need their email.")
        why = f"I look up the customer's orders to find the one with the {product}."
        return Step("list_orders", {"email": case.email}, why, listed(case.email))
    order_id = facts.order_id
    if looked_up(order_id) not in known:
        why = f"I look up order {order_id} to check its status, delivery and items."
        return Step("get_order", {"order_id": order_id}, why, looked_up(order_id))
    if not told("wanted_resolution"):
        return _ask("wanted_resolution", "I don't know yet what the customer wants, so I ask.")
    if facts.wanted != "cancel" and order_block(case) is None:
        if not told("item"):
            why = f"Order {order_id} has several items, so I ask which one it is about."
            return _ask("item", why)
        if facts.wanted == "exchange" and item_block(case) is None:
            if not told("new_variant"):
                return _ask("new_variant", "I need to know which variant the customer wants.")
            if checked(facts.new_sku) not in known:
                why = f"I check that {facts.new_sku} is in stock before exchanging."
                return Step("get_product", {"sku": facts.new_sku}, why, checked(facts.new_sku))
    if gold.changes and not done:
        return _action_step(case, gold.changes[0])
    if gold.outcome == "refused":
        why = gold.why
    else:
        noun = {"refunded": "refund", "exchanged": "exchange", "cancelled": "cancellation"}
        why = f"The {noun[gold.outcome]} is done, so I close the case as {gold.outcome}."
    return Step("resolve", {"outcome": gold.outcome}, why)


def _action_step(case: Case, change: Change) -> Step:
    kind, order_id = change[0], change[1]
    if kind == "cancel":
        why = f"Order {order_id} is still processing, so I cancel it."
        return Step("cancel_order", {"order_id": order_id}, why)
    days = case.days_since_delivery(case.target)
    if kind == "refund":
        sku, cents = change[2], change[3]
        why = (
            f"{sku} was delivered {days} days ago and is not final sale, so I refund its "
            f"price, {cents / 100:.2f}."
        )
        return Step("refund_item", {"order_id": order_id, "sku": sku, "amount": cents / 100}, why)
    sku, new_sku = change[2], change[3]
    why = f"{new_sku} is in stock and {sku} was delivered {days} days ago, so I exchange it."
    return Step("exchange_item", {"order_id": order_id, "sku": sku, "new_sku": new_sku}, why)
