"""The scripted customer: the opening message and the answers to `ask_customer`.

Rule-based, no model: the customer states some of their facts up front (`Facts.said`) and
answers a question on any topic from the rest, the same way every time. The opening message
is built so that what it leaves out is exactly what the agent must ask or look up: no email
("Hi, this is Jane Doe."), no order id, no item ("a problem with this order"), no wanted
resolution ("a problem with the blender"), no wanted variant ("for another size"). Facts
that are not known (an order number the customer does not have) are answered as such.
"""

from __future__ import annotations

from starpo.envs.support.cases import Case

#: The ask_customer topics.
TOPICS = ("email", "order_id", "item", "wanted_resolution", "new_variant", "reason")


def opening_message(case: Case) -> str:
    """The customer's first message: greeting, the order when given, then the request."""
    facts, said = case.facts, case.facts.said
    greeting = f"Hi, I'm {case.email}." if "email" in said else f"Hi, this is {case.name}."
    body = _request(case)
    if "order_id" in said:
        return f"{greeting} About order {facts.order_id}: {body}"
    return f"{greeting} {body[0].upper()}{body[1:]}"


def _request(case: Case) -> str:
    facts, said = case.facts, case.facts.said
    thing = f"the {case.item.product}" if "item" in said else "one of the items"
    if "wanted_resolution" not in said:
        if "item" in said:
            return f"I have a problem with the {case.item.product} I ordered."
        return "I have a problem with this order."
    if facts.wanted == "refund":
        return f"{thing} {facts.reason}, I'd like a refund."
    if facts.wanted == "exchange":
        if "new_variant" in said:
            wish = f"for {_variant_phrase(facts.new_variant)}"
        else:
            wish = "for another size" if "size" in facts.new_variant else "for another colour"
        return f"{thing} {facts.reason}, I'd like to exchange it {wish}."
    if "item" in said:
        return f"please cancel my order with the {case.item.product}, {facts.reason}."
    return f"please cancel it, {facts.reason}."


def _variant_phrase(variant: str) -> str:
    """ "blue" -> "the blue one", "size L" -> "size L"."""
    return variant if variant.startswith("size") else f"the {variant} one"


def answer(case: Case, topic: str) -> str:
    """The customer's answer to a question on `topic` (one of TOPICS)."""
    facts = case.facts
    if topic == "email":
        return f"It's {case.email}."
    if topic == "order_id":
        if facts.knows_order_id or "order_id" in facts.said:
            return f"It's {facts.order_id}."
        return f"I don't have the order number, sorry. It's the one with the {case.item.product}."
    if topic == "item":
        return f"The {case.item.product}."
    if topic == "wanted_resolution":
        return {
            "refund": "I'd like a refund.",
            "exchange": "I'd like to exchange it for another variant.",
            "cancel": "I'd like to cancel the order.",
        }[facts.wanted]
    if topic == "new_variant":
        if facts.wanted != "exchange":
            return "I don't want a different one."
        return f"I'd like {_variant_phrase(facts.new_variant)}."
    if facts.wanted == "cancel":
        return f"{facts.reason[0].upper()}{facts.reason[1:]}."
    return f"The {case.item.product} {facts.reason}."
