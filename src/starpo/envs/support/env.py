"""A customer-support desk as a tool env (tau2-bench style), scored by the final database.

The agent reads today's date and a customer's opening message ("Hi, I'm jane.doe@example.com.
The blender arrived broken, I'd like a refund.") and acts only through tool calls: it asks
the scripted customer (`customer.py`) for what the message leaves out, looks up orders and
stock, then refunds, exchanges or cancels, and ends with `resolve(outcome)`. The written
policy (`cases.POLICY`, in the instruction) says what may be granted; everything else must
be refused.

The tools do not enforce the policy: refunding a final-sale item, refunding the wrong
amount, exchanging for an out-of-stock variant or cancelling a shipped order all go through
and change the database, as they would in a real back office. That is the trap. Only
lookups of records that do not exist (and cancelling an order twice) fail, with a ToolError:
the call uses a step and changes nothing.

Score: on `resolve`, 1.0 when the changes made (refunds with their amounts in cents,
exchanges, cancellations) equal the gold resolution's (`cases.decide`), the outcome is the
gold one and the agent looked up what that resolution rests on (`solver.evidence`: the
order, and the new variant's stock for an exchange), else 0.0; no partial credit. Without
that last condition a blind resolve("refused") as the first call won every out-of-policy
case, ~24% of train cases and ~43% of held-out ones, far above random calls (4-7%). An
episode that runs out of calls scores 0.

Knobs: `max_items` per order, `distractor_orders` (the customer's other orders), `requests`
(the request kinds drawn, `cases.ALL_KINDS`), `split` (train, or heldout: the final-sale
clause, see `cases`) and `max_steps` (the call budget; the longest gold trajectory is 9).
"""

from __future__ import annotations

import json
from typing import Any, ClassVar

from starpo.envs.base import NO_ANSWER
from starpo.envs.support.cases import (
    ALL_KINDS,
    HELDOUT_ONLY_KINDS,
    OUTCOMES,
    POLICY,
    TRAIN_KINDS,
    Case,
    Change,
    Order,
    decide,
    generate_case,
)
from starpo.envs.support.customer import TOPICS, answer, opening_message
from starpo.envs.support.solver import asked, checked, evidence, listed, looked_up, plan
from starpo.envs.tools import Tool, ToolCallError, ToolEnv, ToolError, read_call, shown
from starpo.errors import UserError

SPLITS = ("train", "heldout")
MAX_ITEMS = 4
MAX_DISTRACTORS = 4
MAX_STEPS = 100


def _params(**properties: dict[str, Any]) -> dict[str, Any]:
    """An object schema whose every property is required."""
    return {"type": "object", "properties": properties, "required": list(properties)}


_ID = {"type": "string"}

TOOLS = (
    Tool(
        "ask_customer",
        "Ask the customer one question; returns their answer.",
        _params(topic={"type": "string", "enum": list(TOPICS)}),
    ),
    Tool(
        "list_orders",
        "The customer's id, name and orders (id, status, item names), by email.",
        _params(email=_ID),
    ),
    Tool("get_order", "An order's status, delivery and items.", _params(order_id=_ID)),
    Tool("get_product", "A product variant's name, price and stock.", _params(sku=_ID)),
    Tool(
        "refund_item",
        "Refund an amount for one item of an order.",
        _params(order_id=_ID, sku=_ID, amount={"type": "number", "minimum": 0, "maximum": 10000}),
    ),
    Tool(
        "exchange_item",
        "Exchange one item of an order for another SKU.",
        _params(order_id=_ID, sku=_ID, new_sku=_ID),
    ),
    Tool("cancel_order", "Cancel a whole order.", _params(order_id=_ID)),
    Tool(
        "resolve",
        "Close the case with its outcome (ends the conversation).",
        _params(outcome={"type": "string", "enum": list(OUTCOMES)}),
        ends_episode=True,
    ),
)


class SupportEnv(ToolEnv):
    """Resolve one customer's request within the written policy, with tool calls.
    `turn_reward` > 0 rewards each call that is the gold plan's next step (`ToolEnv`)."""

    description: ClassVar[str] = "Customer support: resolve a request within the policy."
    tools: ClassVar[tuple[Tool, ...]] = TOOLS
    instruction = (
        "You are a support agent of an online shop. You see today's date and the customer's "
        "message; act only through tool calls (ask_customer asks the customer). Find the "
        "order (ask for its number, or list the customer's orders by email), check the "
        "request against the policy, act, then end with resolve. " + POLICY + " You are "
        "scored on the final database and the resolve outcome."
    )

    def __init__(
        self,
        max_items: int = 3,
        distractor_orders: int = 2,
        requests: Any = None,
        split: str = "train",
        max_steps: int = 12,
        turn_reward: float = 0.0,
    ) -> None:
        self.max_items = _check_int("max_items", max_items, 1, MAX_ITEMS)
        self.distractor_orders = _check_int(
            "distractor_orders", distractor_orders, 0, MAX_DISTRACTORS
        )
        if split not in SPLITS:
            raise UserError(f"split must be 'train' or 'heldout', got {split!r}")
        self.split = split
        self.requests = _check_requests(requests, split)
        super().__init__(_check_int("max_steps", max_steps, 1, MAX_STEPS), turn_reward)
        self.reward_range = (0.0, 1.0)
        self.case: Case | None = None
        self.message = ""
        self.status: dict[str, str] = {}  # order id -> status (a cancel changes it)
        self.changes: list[Change] = []
        self.outcome: str | None = None
        self.known: set[str] = set()  # what the agent has been told or looked up

    # ----------------------------------------------------------------- episode hooks
    def _reset(self, options: dict[str, Any]) -> dict[str, Any]:
        self.case = generate_case(
            self.np_random,
            self.requests,
            self.split == "heldout",
            self.max_items,
            self.distractor_orders,
        )
        self.message = opening_message(self.case)
        self.status = {order.order_id: order.status for order in self.case.orders}
        self.changes, self.outcome, self.known = [], None, set()
        return {"request": self.case.kind, "split": self.split}

    def render(self) -> str:
        if self.case is None:
            return ""
        return f"Today: {self.case.today.isoformat()}\nCustomer: {self.message}"

    def call_tool(self, name: str, arguments: dict[str, Any]) -> str:
        return _dumps(getattr(self, f"_tool_{name}")(**arguments))

    def final_reward(self) -> float:
        return 1.0 if self._matches_gold() else 0.0

    def is_success(self) -> bool:
        return self.outcome is not None and self._matches_gold()

    def answer(self) -> tuple[str, str] | None:
        """(the resolve outcome, or NO_ANSWER; the gold resolution's outcome)."""
        if self.case is None:
            return None
        return self.outcome or NO_ANSWER, decide(self.case).outcome

    def _matches_gold(self) -> bool:
        gold = decide(self._case)
        same = sorted(self.changes, key=repr) == sorted(gold.changes, key=repr)
        looked = all(key in self.known for key in evidence(self._case))
        return same and self.outcome == gold.outcome and looked

    def snapshot(self) -> str:
        """The database as JSON with sorted keys: the case's records, order statuses, the
        changes made and the outcome."""
        case = self.case
        if case is None:
            return "{}"
        db = {
            "today": case.today.isoformat(),
            "customer": [case.customer_id, case.email, case.name],
            "orders": [
                {**self._order_record(order), "ordered": order.ordered.isoformat()}
                for order in case.orders
            ],
            "products": [[p.sku, p.name, p.cents, p.in_stock] for p in case.products],
            "changes": [list(change) for change in self.changes],
            "outcome": self.outcome,
        }
        return json.dumps(db, sort_keys=True)

    def state_key(self) -> tuple[str, tuple[str, ...]]:
        """The database and what the agent has been told or looked up (the same changes
        with different knowledge call for different next calls)."""
        return self.snapshot(), tuple(sorted(self.known))

    @property
    def _case(self) -> Case:
        if self.case is None:
            raise RuntimeError("call reset() first")
        return self.case

    # ------------------------------------------------------------------------ tools
    def _tool_ask_customer(self, topic: str) -> dict[str, Any]:
        self.known.add(asked(topic))
        return {"customer": answer(self._case, topic)}

    def _tool_list_orders(self, email: str) -> dict[str, Any]:
        case = self._case
        if email.strip().lower() != case.email:
            raise ToolError(f"no customer with email {shown(email)}")
        self.known.add(listed(case.email))
        orders = [
            {
                "order_id": o.order_id,
                "status": self.status[o.order_id],
                "items": [item.name for item in o.items],
            }
            for o in case.orders
        ]
        return {"customer_id": case.customer_id, "name": case.name, "orders": orders}

    def _tool_get_order(self, order_id: str) -> dict[str, Any]:
        order = self._order(order_id)
        self.known.add(looked_up(order.order_id))
        return self._order_record(order)

    def _tool_get_product(self, sku: str) -> dict[str, Any]:
        product = self._case.product(_code(sku))
        if product is None:
            raise ToolError(f"no product {shown(sku)}")
        self.known.add(checked(product.sku))
        return {
            "sku": product.sku,
            "name": product.name,
            "price": product.cents / 100,
            "in_stock": product.in_stock,
        }

    def _tool_refund_item(self, order_id: str, sku: str, amount: float) -> dict[str, Any]:
        order, item_sku = self._order_item(order_id, sku)
        cents = round(amount * 100)
        self.changes.append(("refund", order.order_id, item_sku, cents))
        return {"refunded": cents / 100, "order_id": order.order_id, "sku": item_sku}

    def _tool_exchange_item(self, order_id: str, sku: str, new_sku: str) -> dict[str, Any]:
        order, item_sku = self._order_item(order_id, sku)
        new = self._case.product(_code(new_sku))
        if new is None:
            raise ToolError(f"no product {shown(new_sku)}")
        self.changes.append(("exchange", order.order_id, item_sku, new.sku))
        return {"exchanged": item_sku, "for": new.sku, "order_id": order.order_id}

    def _tool_cancel_order(self, order_id: str) -> dict[str, Any]:
        order = self._order(order_id)
        if self.status[order.order_id] == "cancelled":
            raise ToolError(f"order {order.order_id} is already cancelled")
        self.status[order.order_id] = "cancelled"
        self.changes.append(("cancel", order.order_id))
        return {"cancelled": order.order_id}

    def _tool_resolve(self, outcome: str) -> dict[str, Any]:
        self.outcome = outcome
        return {"resolved": outcome}

    def _order(self, order_id: str) -> Order:
        order = self._case.order(_code(order_id))
        if order is None:
            raise ToolError(f"no order {shown(order_id)}")
        return order

    def _order_item(self, order_id: str, sku: str) -> tuple[Order, str]:
        order = self._order(order_id)
        item = order.item(_code(sku))
        if item is None:
            raise ToolError(f"order {order.order_id} has no item {shown(sku)}")
        return order, item.sku

    def _order_record(self, order: Order) -> dict[str, Any]:
        record: dict[str, Any] = {"order_id": order.order_id, "status": self.status[order.order_id]}
        if order.delivered is not None:
            record["delivered"] = order.delivered.isoformat()
            record["days_since_delivery"] = self._case.days_since_delivery(order)
        record["items"] = [item.record() for item in order.items]
        return record

    # ----------------------------------------------------------------------- solver
    def _plan(self):
        if self.done or self.case is None:
            return None
        return plan(self.case, self.known, self.changes)

    def optimal_action(self) -> str | None:
        steps = self._plan()
        return steps[0].text() if steps else None

    def optimal_success_probability(self) -> float:
        if self.is_success():
            return 1.0
        steps = self._plan()
        return 1.0 if steps is not None and len(steps) <= self.steps_left else 0.0

    def follows_plan(self, call: Any) -> bool:
        """Whether `call` is the gold plan's next step (ids and amounts compared as the
        tools compare them): a question, a lookup or an action the policy allows."""
        return self._gold_step(call) is not None

    def _gold_step(self, call: Any) -> Any:
        """The gold plan's next step when `call` is it, else None."""
        steps = self._plan()
        if not steps:
            return None
        gold = steps[0]
        same = call.name == gold.name and _key(call.arguments) == _key(gold.arguments)
        return gold if same else None

    def explain(self, action: str) -> str | None:
        """Why the gold call is made, when `action` is that call (read as step() reads
        it, ids and amounts compared as the tools compare them); None otherwise, for any
        `action` at all (it never raises)."""
        try:
            call = read_call(action, self.tools)
        except ToolCallError:
            return None
        gold = self._gold_step(call)
        return None if gold is None else gold.why


# -------------------------------------------------------------------------- helpers
def _code(text: str) -> str:
    """An id or SKU as the database spells it (the tools ignore case and spaces)."""
    return text.strip().upper()


def _key(arguments: dict[str, Any]) -> dict[str, Any]:
    """Arguments as the tools read them: ids upper-cased, emails lower-cased, cents."""
    key: dict[str, Any] = {}
    for name, value in arguments.items():
        if name in ("order_id", "sku", "new_sku"):
            key[name] = _code(value)
        elif name == "email":
            key[name] = value.strip().lower()
        elif name == "amount":
            key[name] = round(value * 100)
        else:
            key[name] = value
    return key


def _dumps(result: dict[str, Any]) -> str:
    return json.dumps(result, ensure_ascii=False)


def _check_int(name: str, value: Any, low: int, high: int) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
        raise UserError(f"{name} must be a whole number from {low} to {high}, got {value!r}")
    return value


def _check_requests(requests: Any, split: str) -> tuple[str, ...]:
    """The request kinds to draw: all of the split's by default, else the kinds named."""
    if requests is None:
        return TRAIN_KINDS if split == "train" else ALL_KINDS
    if isinstance(requests, str):
        requests = (requests,)
    valid = ", ".join(ALL_KINDS)
    if not isinstance(requests, (list, tuple)) or not requests:
        raise UserError(f"requests must be a non-empty list of request kinds ({valid})")
    kinds = []
    for kind in requests:
        if not isinstance(kind, str) or kind not in ALL_KINDS:
            raise UserError(f"unknown request kind {kind!r}; valid: {valid}")
        if kind in HELDOUT_ONLY_KINDS and split == "train":
            raise UserError(f"request kind {kind!r} is held out; use it with split='heldout'")
        if kind not in kinds:
            kinds.append(kind)
    return tuple(kinds)
