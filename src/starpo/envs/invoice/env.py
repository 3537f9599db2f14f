"""Accounts payable as a tool env: process one incoming invoice against the company's
records, acting only through tool calls, scored by the final database state (tau2-bench
style).

The agent reads the invoice (the observation) and the company's rules (the instruction),
looks records up (vendors, the purchase order, its goods receipt, the ledger, the tax rate)
and finishes with `record_decision`, which appends its decision to the ledger and ends the
episode. The score compares that ledger record with the one the rules give (`cases.review`):
1.0 when the invoice number, vendor id, decision, reason and amount (in whole cents,
exactly) all match and the lookups the rules needed to reach that decision were made, else
0.0, with no partial credit: a right decision for the wrong reason, or with the wrong
amount, would be booked wrong all the same, and one recorded without looking is a guess (a
blind first call rejecting an unknown vendor "" would otherwise win the ~9% of cases whose
vendor is missing, where random calls win none). Lookups change nothing; a lookup of a
record that does not exist is a tool error (it uses a call of the budget, like any call the
tools run).

    >>> env = InvoiceEnv()
    >>> obs, info = env.reset(seed=0)
    >>> calls = gold_calls(env.case)
    >>> for call in calls:
    ...     obs, reward, terminated, truncated, info = env.step(call)
    >>> reward, terminated
    (1.0, True)

Tool results are short JSON (money as "12.50" strings, as the invoice prints it): the
agent is a small model with a small context. The gold solver (`optimal_action`) follows the
rules' order and makes only the lookups it needs; a lookup counts as made once its result
has been seen, whatever the exact arguments were ("northwind supply co" finds the same
vendors as "Northwind Supply Co").
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any, ClassVar

from starpo.envs.base import NO_ANSWER
from starpo.envs.invoice.cases import (
    DECISIONS,
    HELDOUT_ONLY,
    PROBLEMS,
    SPLITS,
    Case,
    Decision,
    Finding,
    case_json,
    find_vendors,
    generate_case,
    gold_decision,
    gold_plan,
    ledger_entries,
    money,
    review,
    split_problems,
    to_cents,
)
from starpo.envs.invoice.cases import gold_calls as gold_calls  # re-exported for tests
from starpo.envs.tools import (
    Tool,
    ToolCallError,
    ToolEnv,
    ToolError,
    call_text,
    read_call,
    shown,
)
from starpo.errors import UserError

#: Longest string argument a tool accepts (ids and names are short).
MAX_ARG_CHARS = 64
#: Most ledger entries a search returns.
LEDGER_LIMIT = 5
MAX_LINES, MAX_DISTRACTORS, MAX_STEPS = 6, 6, 50

INSTRUCTION = (
    "You are an accounts-payable clerk. Check the invoice against the company's records "
    "with tool calls, in this order, and stop at the first problem:\n"
    "1. search_vendors with the invoice's vendor name. No vendor with exactly that name, or "
    "a blocked one: reject, reason unknown_vendor.\n"
    "2. search_ledger with the vendor id and invoice number. Already there: reject, reason "
    "duplicate.\n"
    "3. get_purchase_order for the invoice's PO. A unit price differs from the PO's: hold, "
    "reason price_mismatch.\n"
    "4. get_goods_receipt for the PO. A billed qty above the qty received: hold, reason "
    "quantity_mismatch.\n"
    "5. get_tax_rate. Tax is not subtotal x rate rounded to the cent (half a cent up): hold, "
    "reason tax_error.\n"
    "No problem: approve, reason none.\n"
    'Finish with one record_decision: the vendor\'s id ("" when no vendor has the exact '
    "name), and amount = the total when you approve, else 0."
)


def _object(properties: dict[str, Any], required: Sequence[str] = ()) -> dict[str, Any]:
    return {"type": "object", "properties": properties, "required": list(required)}


_STRING = {"type": "string"}
# Examples show the id format (and "" for no vendor); the random baseline draws from them.
_VENDOR_ID = {"type": "string", "examples": ["V-102", ""]}
TOOLS = (
    Tool(
        "search_vendors",
        "Find vendors by name: id, name and status (active or blocked) of up to 5.",
        _object({"name": _STRING}, ["name"]),
    ),
    Tool(
        "search_ledger",
        "Invoices already processed for a vendor id, optionally only one invoice number.",
        _object({"vendor_id": _VENDOR_ID, "invoice_number": _STRING}, ["vendor_id"]),
    ),
    Tool(
        "get_purchase_order",
        "A purchase order: its vendor id and lines (sku, qty ordered, agreed unit price).",
        _object({"po_id": _STRING}, ["po_id"]),
    ),
    Tool(
        "get_goods_receipt",
        "The quantity received of each sku of a purchase order.",
        _object({"po_id": _STRING}, ["po_id"]),
    ),
    Tool("get_tax_rate", "The company's tax rate.", _object({})),
    Tool(
        "record_decision",
        "Record your decision on the invoice in the ledger; this ends the task.",
        _object(
            {
                "invoice_number": _STRING,
                "vendor_id": _VENDOR_ID,
                "decision": {"type": "string", "enum": list(DECISIONS)},
                "reason": {"type": "string", "enum": list(PROBLEMS)},
                "amount": {"type": "number", "minimum": 0, "maximum": 1_000_000},
            },
            ["invoice_number", "vendor_id", "decision", "reason", "amount"],
        ),
        ends_episode=True,
    ),
)


def _json(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def _key(text: str) -> str:
    """An id as the records spell it: "po-3307 " finds PO-3307."""
    return text.strip().upper()


class InvoiceEnv(ToolEnv):
    """Approve, hold or reject an incoming invoice by the company's rules (module docstring).

    Difficulty: `max_lines` lines per invoice (1..max_lines), `distractors` extra vendors,
    purchase orders and ledger entries, `problems` the problem types drawn from (uniformly;
    default: every type of the split), `split` "train" or "heldout" (held-out vendor names,
    and the only split that plants tax_error), `max_steps` the budget of tool calls,
    `turn_reward` the reward of each lookup the rules call for next (`ToolEnv`; 0 = off).
    """

    description: ClassVar[str] = "Accounts payable: approve, hold or reject an invoice."
    instruction = INSTRUCTION
    tools = TOOLS

    def __init__(
        self,
        max_lines: int = 3,
        distractors: int = 2,
        problems: Sequence[str] | None = None,
        split: str = "train",
        max_steps: int = 10,
        turn_reward: float = 0.0,
    ) -> None:
        if split not in SPLITS:
            raise UserError(f"split must be 'train' or 'heldout', got {split!r}")
        self.split = split
        self.max_lines = _check_int("max_lines", max_lines, 1, MAX_LINES)
        self.distractors = _check_int("distractors", distractors, 0, MAX_DISTRACTORS)
        self.problems = _check_problems(problems, split)
        super().__init__(_check_int("max_steps", max_steps, 1, MAX_STEPS), turn_reward)
        self.reward_range = (0.0, 1.0)
        self.case: Case | None = None
        self.ledger: list[dict[str, Any]] = []
        self.recorded: dict[str, Any] | None = None  # the agent's decision, once made
        self.seen: set[tuple[str, str]] = set()  # (tool, result) of each lookup that ran
        self._gold: Decision | None = None

    # ----------------------------------------------------------------- episode hooks
    def _reset(self, options: dict[str, Any]) -> dict[str, Any]:
        problem = options.get("problem")  # a chosen problem type (tests, demos)
        allowed = split_problems(self.split)
        if problem is not None and problem not in allowed:
            raise UserError(f"options.problem must be one of {', '.join(allowed)}")
        self.case = generate_case(
            self.np_random,
            split=self.split,
            max_lines=self.max_lines,
            distractors=self.distractors,
            problems=self.problems,
            problem=problem,
        )
        self.ledger = [dict(entry) for entry in self.case.db.ledger]
        self.recorded = None
        self.seen = set()
        self._gold = gold_decision(self.case)
        return {"problem": self.case.problem}

    def call_tool(self, name: str, arguments: dict[str, Any]) -> str:
        for key, value in arguments.items():
            if isinstance(value, str) and len(value) > MAX_ARG_CHARS:
                raise ToolError(f"{key} is too long (at most {MAX_ARG_CHARS} characters)")
        if name == "record_decision":
            return self._record(arguments)
        result = self._lookup(name, arguments)
        self.seen.add((name, result))
        return result

    def _lookup(self, name: str, arguments: dict[str, Any]) -> str:
        """The result of a read-only tool (it changes nothing)."""
        assert self.case is not None
        db = self.case.db
        if name == "search_vendors":
            return _json(find_vendors(db, arguments["name"]))
        if name == "get_tax_rate":
            return _json({"tax_rate": db.tax_percent / 100})
        if name == "search_ledger":
            vendor_id = _key(arguments["vendor_id"])
            if db.vendor(vendor_id) is None:
                raise ToolError(f"no vendor {shown(vendor_id)}")
            number = arguments.get("invoice_number")
            entries = ledger_entries(db, vendor_id, None if number is None else _key(number))
            rows = [
                {"invoice_number": e["invoice_number"], "amount": money(e["amount"]),
                 "decision": e["decision"]}
                for e in entries[:LEDGER_LIMIT]
            ]  # fmt: skip
            return _json(rows)
        po_id = _key(arguments["po_id"])
        if name == "get_purchase_order":
            order = db.orders.get(po_id)
            if order is None:
                raise ToolError(f"no purchase order {shown(po_id)}")
            lines = [{**line, "price": money(line["price"])} for line in order["lines"]]
            return _json({"po_id": po_id, "vendor_id": order["vendor_id"], "lines": lines})
        receipt = db.receipts.get(po_id)
        if receipt is None:
            raise ToolError(f"no goods receipt for {shown(po_id)}")
        return _json({"po_id": po_id, "received": receipt})

    def _record(self, arguments: dict[str, Any]) -> str:
        """Append the decision to the ledger (the state the episode is scored on)."""
        assert self.case is not None
        vendor_id = _key(arguments["vendor_id"])
        if vendor_id and self.case.db.vendor(vendor_id) is None:
            raise ToolError(f'no vendor {shown(vendor_id)}; use an id search_vendors gives, or ""')
        number = _key(arguments["invoice_number"])
        if not number:
            raise ToolError("invoice_number is empty")
        self.recorded = {
            "vendor_id": vendor_id,
            "invoice_number": number,
            "amount": to_cents(arguments["amount"]),
            "decision": arguments["decision"],
            "reason": arguments["reason"],
        }
        self.ledger.append(self.recorded)
        return _json({"recorded": number, "decision": arguments["decision"]})

    # ------------------------------------------------------------------------ state
    def render(self) -> str:
        if self.case is None:
            return ""
        invoice = self.case.invoice
        lines = [
            f"Invoice {invoice.number}",
            f"Vendor: {invoice.vendor_name}",
            f"Date: {invoice.date}",
            f"PO: {invoice.po_id}",
            *(
                f"{line.sku} {line.description}: {line.qty} x {money(line.price)} = "
                f"{money(line.amount)}"
                for line in invoice.lines
            ),
            f"Subtotal: {money(invoice.subtotal)}",
            f"Tax: {money(invoice.tax)}",
            f"Total: {money(invoice.total)}",
        ]
        return "\n".join(lines)

    def snapshot(self) -> Any:
        """The case and the ledger as JSON with sorted keys (amounts in cents)."""
        return "" if self.case is None else case_json(self.case, self.ledger)

    def state_key(self) -> Any:
        """The database (ledger included) and what the lookups so far have shown: turns
        that know the same facts about the same case face the same decision, whatever
        calls (repeated, differently spelt) brought them there."""
        return (self.snapshot(), tuple(sorted(self.seen)))

    def final_reward(self) -> float:
        """1.0 when the recorded decision is the gold record (the amount in exactly the
        same whole cents: the rules book 0 for a hold or reject, never 0.01) and the gold
        plan's lookups have all been seen, else 0.0."""
        return float(self._matches_gold())

    def _matches_gold(self) -> bool:
        gold, record = self._gold, self.recorded
        if gold is None or record is None:
            return False
        same = all(
            record[key] == getattr(gold, key)
            for key in ("invoice_number", "vendor_id", "decision", "reason", "amount")
        )
        return same and not self._lookups_to_make()

    def is_success(self) -> bool:
        return self._matches_gold()

    def answer(self) -> tuple[str, str] | None:
        """(the recorded reason, or NO_ANSWER; the gold reason, the case's problem)."""
        if self._gold is None:
            return None
        given = NO_ANSWER if self.recorded is None else str(self.recorded["reason"])
        return given, self._gold.reason

    # ------------------------------------------------------------------------ solver
    def _plan(self) -> list[tuple[str, dict[str, Any]]]:
        assert self.case is not None
        return gold_plan(self.case)

    def _lookups_to_make(self) -> list[tuple[str, dict[str, Any]]]:
        """The gold plan's lookups whose result has not been seen yet: the evidence the
        decision rests on (a lookup counts once its result was seen, whatever the exact
        arguments were)."""
        *lookups, _ = self._plan()
        return [(n, a) for n, a in lookups if (n, self._lookup(n, a)) not in self.seen]

    def _next_gold(self) -> tuple[str, dict[str, Any]] | None:
        """The gold call to make now: the first lookup of the plan whose result has not
        been seen, or the decision once all were."""
        if self.done or self.case is None:
            return None
        todo = self._lookups_to_make()
        return todo[0] if todo else self._plan()[-1]

    def optimal_action(self) -> str | None:
        call = self._next_gold()
        return None if call is None else call_text(*call)

    def follows_plan(self, call: Any) -> bool:
        """Whether `call` is the next lookup the rules call for: the gold plan's first
        lookup whose result has not been seen, by its result (any spelling that finds the
        same records, as a lookup counts as made)."""
        gold = self._next_gold()
        if gold is None or gold[0] == "record_decision" or call.name != gold[0]:
            return False
        try:
            return self._lookup(call.name, dict(call.arguments)) == self._lookup(*gold)
        except ToolError:
            return False

    def optimal_success_probability(self) -> float:
        """1.0 while the lookups still to make and the decision fit in the calls left,
        else whether the episode succeeded."""
        if self.done or self.case is None:
            return float(self.is_success())
        return float(len(self._lookups_to_make()) + 1 <= self.steps_left)

    def explain(self, action: str) -> str | None:
        """Why the gold call is the move now, one sentence; None for any other call (any
        `action` at all: it is read as step() reads it, and never raises)."""
        gold = self._next_gold()
        try:
            call = read_call(action, self.tools)
        except ToolCallError:
            return None
        if gold is None or (call.name, call.arguments) != gold:
            return None
        assert self.case is not None and self._gold is not None
        invoice, finding = self.case.invoice, review(self.case.invoice, self.case.db)
        po_id = invoice.po_id
        if call.name == "search_vendors":
            return f"I first check that the vendor {invoice.vendor_name} is known and active."
        if call.name == "search_ledger":
            return (
                f"{invoice.vendor_name} is {self._gold.vendor_id} and active, so I check "
                f"the ledger for an earlier {invoice.number}."
            )
        if call.name == "get_purchase_order":
            return (
                f"{invoice.number} is not in the ledger yet, so I compare the prices with {po_id}."
            )
        if call.name == "get_goods_receipt":
            return f"Every unit price matches {po_id}, so I check the quantities received."
        if call.name == "get_tax_rate":
            return "Every billed quantity was received, so I check the tax."
        return self._decision_reason(finding)

    def _decision_reason(self, finding: Finding) -> str:
        assert self.case is not None and self._gold is not None
        invoice, gold = self.case.invoice, self._gold
        percent = self.case.db.tax_percent
        line = finding.line
        if finding.reason == "unknown_vendor":
            if finding.vendor is None:
                return (
                    f"No vendor is named exactly {invoice.vendor_name}, so I reject the "
                    "invoice for an unknown vendor."
                )
            return f"Vendor {gold.vendor_id} is blocked, so I reject the invoice."
        if finding.reason == "duplicate":
            return (
                f"{invoice.number} from {gold.vendor_id} is already in the ledger, so I "
                "reject it as a duplicate."
            )
        if finding.reason == "price_mismatch":
            return (
                f"The PO price for {line.sku} is {money(finding.expected)} but the invoice "
                f"bills {money(line.price)}, so I hold it for a price mismatch."
            )
        if finding.reason == "quantity_mismatch":
            return (
                f"The invoice bills {line.qty} of {line.sku} but only {finding.expected} "
                "were received, so I hold it for a quantity mismatch."
            )
        tax = f"{percent}% of {money(invoice.subtotal)} is {money(finding.expected)}"
        if finding.reason == "tax_error":
            return f"{tax}, not {money(invoice.tax)}, so I hold it for a tax error."
        return f"Everything matches and {tax}, so I approve {money(invoice.total)}."


# ------------------------------------------------------------------- validation
def _check_int(name: str, value: Any, low: int, high: int) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
        raise UserError(f"{name} must be a whole number from {low} to {high}, got {value!r}")
    return value


def _check_problems(problems: Any, split: str) -> tuple[str, ...]:
    """The problem types to draw from: default every type the split plants."""
    allowed = split_problems(split)
    if problems is None:
        return allowed
    hint = f"choose from {', '.join(allowed)}"
    if isinstance(problems, str) or not isinstance(problems, Sequence) or not problems:
        raise UserError(f"problems must be a non-empty list of problem types; {hint}")
    for problem in problems:
        if problem in HELDOUT_ONLY and split != "heldout":
            raise UserError(f"{problem} is held out: only split='heldout' plants it")
        if problem not in PROBLEMS:
            raise UserError(f"unknown problem type {problem!r}; {hint}")
    return tuple(dict.fromkeys(problems))
