"""Invoice cases: the company database, the incoming invoice, the seeded generator, and the
rules that decide the gold outcome.

A case is one invoice to process against a small database: vendors (id, name, status),
purchase orders (vendor, lines with sku, quantity ordered and agreed unit price), goods
receipts (quantity received per sku), the ledger of invoices already processed, and the tax
rate. All money is kept in whole cents, so no float rounding can decide an outcome.

The generator plants at most one problem per case (`PROBLEMS`), and adds distractor records
that the rules must see past: vendors whose names differ from the invoice's by one word,
other purchase orders with the same skus at other prices, ledger entries with a near-miss
invoice number of the same vendor or the same number of another vendor. The gold outcome is
never read from the planted label: `review` applies the company's rules (the instruction
states them) to the database, in this order, and stops at the first that fails:

1. vendor: a vendor with exactly the invoice's name, and active, else reject (unknown_vendor);
2. duplicate: no ledger entry with that vendor and invoice number, else reject (duplicate);
3. prices: every unit price equals the purchase order's, else hold (price_mismatch);
4. quantities: no billed quantity above the quantity received, else hold (quantity_mismatch);
5. tax: tax = subtotal x rate rounded to the cent, half a cent up, else hold (tax_error);

and approves (none) when all pass. The recorded amount is the total for an approval, else 0.

Splits: "heldout" draws vendor names from its own pool of name stems (no vendor name of
one split occurs in the other), and only the held-out split plants `tax_error`: training
states the tax rule and the gold trajectory checks it, but never sees a wrong tax.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from decimal import ROUND_HALF_UP, Decimal
from typing import Any

import numpy as np

from starpo.envs.tools import call_text

#: Planted problems, which are also the reason codes of a decision ("none" = no problem).
PROBLEMS = (
    "none",
    "price_mismatch",
    "quantity_mismatch",
    "duplicate",
    "unknown_vendor",
    "tax_error",
)
DECISIONS = ("approve", "hold", "reject")
#: The decision each reason calls for (the company's rules).
DECISION_FOR = {
    "none": "approve",
    "price_mismatch": "hold",
    "quantity_mismatch": "hold",
    "tax_error": "hold",
    "duplicate": "reject",
    "unknown_vendor": "reject",
}
SPLITS = ("train", "heldout")
#: Problems only the held-out split plants.
HELDOUT_ONLY = ("tax_error",)

# Vendor names are "<stem> <kind> <suffix>"; the splits share kinds and suffixes, not stems.
TRAIN_STEMS = (
    "Northwind", "Bluepeak", "Redstone", "Silverline", "Greenfield", "Ironbridge", "Oakridge",
    "Brightwater", "Summit", "Harbor", "Maple", "Falcon", "Cedar", "Granite", "Pioneer",
    "Riverside", "Sterling", "Evergreen", "Horizon", "Lakeside", "Keystone", "Crescent",
    "Westfield", "Beacon", "Atlas", "Orchard", "Copper", "Meadow", "Highland", "Northstar",
)  # fmt: skip
HELDOUT_STEMS = (
    "Zephyr", "Quartz", "Juniper", "Obsidian", "Marigold", "Tundra", "Saffron", "Vanguard",
    "Willow", "Cobalt", "Ember", "Sequoia", "Aurora", "Basalt", "Kestrel",
)  # fmt: skip
KINDS = (
    "Supply", "Industrial", "Traders", "Logistics", "Components", "Metals", "Office",
    "Packaging", "Electric", "Tools",
)  # fmt: skip
SUFFIXES = ("Co", "Inc", "Ltd", "LLC", "Group")
ITEMS = (
    "Steel bolts", "Hex nuts", "Copper wire", "Nitrile gloves", "Copy paper", "Toner",
    "Cable ties", "Safety goggles", "Pallet wrap", "LED bulbs", "Drill bits", "Duct tape",
    "Wood screws", "Boxes", "Work boots", "Hand soap", "Batteries", "Extension cord",
    "Paint rollers", "Air filters",
)  # fmt: skip
#: Tax rates in whole percent (whole cents times a whole percent: exact arithmetic).
TAX_PERCENTS = (5, 6, 7, 8, 9, 10)
#: Most vendors a name search returns.
SEARCH_LIMIT = 5


# --------------------------------------------------------------------------- records
@dataclass(frozen=True)
class Line:
    """One invoice line: `qty` units of `sku` at `price` cents each."""

    sku: str
    description: str
    qty: int
    price: int

    @property
    def amount(self) -> int:
        return self.qty * self.price


@dataclass(frozen=True)
class Invoice:
    number: str
    vendor_name: str
    date: str
    po_id: str
    lines: tuple[Line, ...]
    tax: int  # cents, as billed (right or not)

    @property
    def subtotal(self) -> int:
        return sum(line.amount for line in self.lines)

    @property
    def total(self) -> int:
        return self.subtotal + self.tax


@dataclass
class Database:
    """The company's records. `orders[po_id]` = {"vendor_id", "lines": [{sku, qty, price}]};
    `receipts[po_id]` = {sku: qty received}; ledger entries are {vendor_id, invoice_number,
    amount (cents), decision, reason}. Only the ledger changes in an episode."""

    vendors: list[dict[str, str]]
    orders: dict[str, dict[str, Any]]
    receipts: dict[str, dict[str, int]]
    ledger: list[dict[str, Any]]
    tax_percent: int

    def vendor(self, vendor_id: str) -> dict[str, str] | None:
        return next((v for v in self.vendors if v["id"] == vendor_id), None)


@dataclass
class Case:
    invoice: Invoice
    db: Database
    problem: str  # the planted one (the gold outcome comes from `review`, not from this)
    split: str = "train"
    notes: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Finding:
    """What the rules find: the reason code, the vendor with the invoice's exact name (if
    any), and for a mismatch the line at fault and the value the records hold (the PO's
    price, the quantity received, or the correct tax in cents)."""

    reason: str
    vendor: dict[str, str] | None
    line: Line | None = None
    expected: int = 0


@dataclass(frozen=True)
class Decision:
    """A ledger record as the gold rules make it."""

    invoice_number: str
    vendor_id: str
    decision: str
    reason: str
    amount: int  # cents


# ---------------------------------------------------------------------------- money
def money(cents: int) -> str:
    """12.50 for 1250 (minus sign kept)."""
    sign = "-" if cents < 0 else ""
    return f"{sign}{abs(cents) // 100}.{abs(cents) % 100:02d}"


def to_cents(amount: float) -> int:
    """An amount the agent wrote (12.5, 1234.57) in whole cents, rounded half a cent up
    as the rules round tax. Read from its shortest decimal text, as written: float
    arithmetic would round 1.005 (1.005 * 100 = 100.49999999999999) to 100 cents, not 101."""
    exact = Decimal(repr(amount)) if isinstance(amount, float) else Decimal(amount)
    return int((exact * 100).quantize(Decimal(1), rounding=ROUND_HALF_UP))


def tax_due(subtotal: int, percent: int) -> int:
    """Tax in cents: subtotal x percent / 100, rounded to the cent, half a cent up."""
    return (subtotal * percent + 50) // 100


# --------------------------------------------------------------------------- queries
def name_words(name: str) -> list[str]:
    return re.findall(r"[a-z0-9]+", name.casefold())


def find_vendors(db: Database, query: str) -> list[dict[str, str]]:
    """Vendors sharing a stem or kind word with `query` (a suffix such as Co alone does not
    match), most shared words first, then by id; at most SEARCH_LIMIT. An exact name is
    never found by a partial one alone: the caller compares names."""
    wanted = set(name_words(query))
    core = wanted - {s.casefold() for s in SUFFIXES}
    scored = []
    for vendor in db.vendors:
        words = set(name_words(vendor["name"]))
        if words & core:
            scored.append((-len(words & wanted), vendor["id"], vendor))
    return [vendor for *_, vendor in sorted(scored, key=lambda s: s[:2])][:SEARCH_LIMIT]


def ledger_entries(db: Database, vendor_id: str, invoice_number: str | None) -> list[dict]:
    """The vendor's ledger entries, only those of `invoice_number` when given."""
    return [
        entry
        for entry in db.ledger
        if entry["vendor_id"] == vendor_id
        and (invoice_number is None or entry["invoice_number"] == invoice_number)
    ]


# ------------------------------------------------------------------------ gold rules
def review(invoice: Invoice, db: Database) -> Finding:
    """The first rule the invoice breaks (module docstring), or reason "none"."""
    vendor = next((v for v in db.vendors if v["name"] == invoice.vendor_name), None)
    if vendor is None or vendor["status"] != "active":
        return Finding("unknown_vendor", vendor)
    if ledger_entries(db, vendor["id"], invoice.number):
        return Finding("duplicate", vendor)
    order = db.orders[invoice.po_id]
    agreed = {line["sku"]: line["price"] for line in order["lines"]}
    for line in invoice.lines:
        if agreed.get(line.sku) != line.price:  # an item not ordered has no agreed price
            return Finding("price_mismatch", vendor, line, agreed.get(line.sku, 0))
    received = db.receipts.get(invoice.po_id, {})
    for line in invoice.lines:
        if line.qty > received.get(line.sku, 0):
            return Finding("quantity_mismatch", vendor, line, received.get(line.sku, 0))
    due = tax_due(invoice.subtotal, db.tax_percent)
    if invoice.tax != due:
        return Finding("tax_error", vendor, None, due)
    return Finding("none", vendor, None, due)


def gold_decision(case: Case) -> Decision:
    finding = review(case.invoice, case.db)
    decision = DECISION_FOR[finding.reason]
    return Decision(
        invoice_number=case.invoice.number,
        vendor_id=finding.vendor["id"] if finding.vendor else "",
        decision=decision,
        reason=finding.reason,
        amount=case.invoice.total if decision == "approve" else 0,
    )


#: How many lookups (in rule order) it takes to find each reason.
LOOKUPS_FOR = {
    "unknown_vendor": 1,
    "duplicate": 2,
    "price_mismatch": 3,
    "quantity_mismatch": 4,
    "tax_error": 5,
    "none": 5,
}


def gold_plan(case: Case) -> list[tuple[str, dict[str, Any]]]:
    """The gold trajectory as (tool, arguments): the lookups the rules need, in order, up
    to the one that finds the problem, then the decision."""
    invoice, gold = case.invoice, gold_decision(case)
    lookups: list[tuple[str, dict[str, Any]]] = [
        ("search_vendors", {"name": invoice.vendor_name}),
        ("search_ledger", {"vendor_id": gold.vendor_id, "invoice_number": invoice.number}),
        ("get_purchase_order", {"po_id": invoice.po_id}),
        ("get_goods_receipt", {"po_id": invoice.po_id}),
        ("get_tax_rate", {}),
    ]
    return [*lookups[: LOOKUPS_FOR[gold.reason]], ("record_decision", decision_arguments(gold))]


def decision_arguments(gold: Decision) -> dict[str, Any]:
    return {
        "invoice_number": gold.invoice_number,
        "vendor_id": gold.vendor_id,
        "decision": gold.decision,
        "reason": gold.reason,
        "amount": gold.amount / 100,
    }


def gold_calls(case: Case) -> list[str]:
    """The gold trajectory as call texts (what the agent writes in <tool_call>)."""
    return [call_text(name, arguments) for name, arguments in gold_plan(case)]


# ------------------------------------------------------------------------- generator
def _pick(rng: np.random.Generator, options: tuple | list) -> Any:
    return options[int(rng.integers(len(options)))]


def _distinct_numbers(rng: np.random.Generator, low: int, high: int, count: int) -> list[int]:
    return [int(n) + low for n in rng.choice(high - low, size=count, replace=False)]


def _vendor_names(rng: np.random.Generator, stems: tuple[str, ...], count: int) -> list[str]:
    """`count` distinct names; the second and third share the first's stem and differ from
    it in one word (the look-alikes a careless match takes for the vendor)."""
    stem, kind, suffix = _pick(rng, stems), _pick(rng, KINDS), _pick(rng, SUFFIXES)
    names = [f"{stem} {kind} {suffix}"]
    other_suffix = _pick(rng, [s for s in SUFFIXES if s != suffix])
    other_kind = _pick(rng, [k for k in KINDS if k != kind])
    lookalikes = [f"{stem} {kind} {other_suffix}", f"{stem} {other_kind} {suffix}"]
    if rng.random() < 0.5:
        lookalikes.reverse()
    names += lookalikes[: count - 1]
    while len(names) < count:
        name = f"{_pick(rng, stems)} {_pick(rng, KINDS)} {_pick(rng, SUFFIXES)}"
        if name not in names and name.split()[0] != stem:
            names.append(name)
    return names


def _near_miss(rng: np.random.Generator, number: str) -> str:
    """Another invoice number one digit away from `number` (INV-48213 -> INV-48218)."""
    prefix, digits = number[:4], list(number[4:])
    i = int(rng.integers(len(digits)))
    digits[i] = _pick(rng, [d for d in "0123456789" if d != digits[i]])
    return prefix + "".join(digits)


def split_problems(split: str) -> tuple[str, ...]:
    """The problem types `split` plants (the held-out ones only in "heldout")."""
    return PROBLEMS if split == "heldout" else tuple(p for p in PROBLEMS if p not in HELDOUT_ONLY)


def generate_case(
    rng: np.random.Generator,
    *,
    split: str = "train",
    max_lines: int = 3,
    distractors: int = 2,
    problems: tuple[str, ...] | None = None,
    problem: str | None = None,
) -> Case:
    """A case from `rng` with one problem drawn uniformly from `problems` (default: the
    split's), or the given `problem`."""
    if problem is None:
        problem = _pick(rng, problems or split_problems(split))
    stems = HELDOUT_STEMS if split == "heldout" else TRAIN_STEMS
    # A planted unknown vendor is either blocked or missing from the records: then the
    # invoice names a vendor that is not there and the PO belongs to a look-alike.
    missing = problem == "unknown_vendor" and rng.random() < 0.5
    names = _vendor_names(rng, stems, 1 + distractors + int(missing))
    invoice_name = names.pop(0) if missing else names[0]
    ids = [f"V-{n}" for n in _distinct_numbers(rng, 100, 1000, len(names))]
    vendors = [
        {"id": i, "name": n, "status": "blocked" if rng.random() < 0.25 else "active"}
        for i, n in zip(ids, names, strict=True)
    ]
    blocked = problem == "unknown_vendor" and not missing
    vendors[0]["status"] = "blocked" if blocked else "active"
    vendor_id = vendors[0]["id"]

    n_lines = int(rng.integers(1, max_lines + 1))
    unbilled = distractors > 0 and rng.random() < 0.5  # a PO line the invoice leaves out
    po_lines, received, lines = _order(rng, n_lines + int(unbilled))
    lines = lines[:n_lines]
    fault = int(rng.integers(n_lines))  # the line a mismatch is planted on
    if problem == "price_mismatch":
        lines[fault] = _overpriced(rng, lines[fault])
    if problem == "quantity_mismatch":
        billed = lines[fault].qty
        received[lines[fault].sku] = int(rng.integers(max(0, billed - 10), billed))
    po_numbers = _distinct_numbers(rng, 1000, 10000, 1 + distractors)
    po_id = f"PO-{po_numbers[0]}"
    orders = {po_id: {"vendor_id": vendor_id, "lines": po_lines}}
    receipts = {po_id: received}
    for number in po_numbers[1:]:  # other orders of the same skus at other prices
        other = [
            {"sku": line["sku"], "qty": line["qty"] + int(rng.integers(1, 10)),
             "price": line["price"] + 25 * int(rng.integers(1, 20))}
            for line in po_lines
        ]  # fmt: skip
        orders[f"PO-{number}"] = {"vendor_id": _pick(rng, ids), "lines": other}
        receipts[f"PO-{number}"] = {line["sku"]: line["qty"] for line in other}

    tax_percent = _pick(rng, TAX_PERCENTS)
    tax = tax_due(sum(line.amount for line in lines), tax_percent)
    if problem == "tax_error":
        tax = _wrong_tax(rng, sum(line.amount for line in lines), tax_percent)
    number = f"INV-{int(rng.integers(10000, 100000))}"
    date = f"2024-{int(rng.integers(1, 13)):02d}-{int(rng.integers(1, 29)):02d}"
    invoice = Invoice(number, invoice_name, date, po_id, tuple(lines), tax)

    ledger = _ledger(rng, invoice, vendor_id, ids, distractors)
    if problem == "duplicate":
        entry = {"vendor_id": vendor_id, "invoice_number": number, "amount": invoice.total}
        ledger.insert(int(rng.integers(len(ledger) + 1)), entry | _approved())
    db = Database(vendors, orders, receipts, ledger, tax_percent)
    return Case(invoice, db, problem, split, {"missing_vendor": missing})


def _order(rng: np.random.Generator, count: int) -> tuple[list[dict], dict[str, int], list[Line]]:
    """A purchase order's lines, its receipt and the invoice lines billed against it: each
    line billed at the agreed price for a quantity that was received in full (sometimes
    less than was ordered: a partial delivery, billed as delivered)."""
    skus = _distinct_numbers(rng, 100, 1000, count)
    items = [ITEMS[int(i)] for i in rng.choice(len(ITEMS), count, replace=False)]
    po_lines, received, lines = [], {}, []
    for sku_number, description in zip(skus, items, strict=True):
        sku = f"SKU-{sku_number}"
        billed = int(rng.integers(2, 61))
        ordered = billed + int(rng.integers(0, 21)) * int(rng.random() < 0.4)
        price = 25 * int(rng.integers(2, 401))
        po_lines.append({"sku": sku, "qty": ordered, "price": price})
        received[sku] = int(rng.integers(billed, ordered + 1))
        lines.append(Line(sku, description, billed, price))
    return po_lines, received, lines


def _overpriced(rng: np.random.Generator, line: Line) -> Line:
    """`line` billed at another price: mostly above the agreed one, sometimes below (when
    the price stays positive)."""
    step = 25 * int(rng.integers(1, 41))
    if line.price > step and rng.random() < 0.3:
        step = -step
    return Line(line.sku, line.description, line.qty, line.price + step)


def _wrong_tax(rng: np.random.Generator, subtotal: int, percent: int) -> int:
    """Tax at a rate up to 3 points off the right one (a stale or another region's rate)."""
    wrong = tax_due(
        subtotal, _pick(rng, [p for p in range(percent - 3, percent + 4) if p != percent])
    )
    right = tax_due(subtotal, percent)
    return wrong if wrong != right else right + 100


def _approved() -> dict[str, str]:
    return {"decision": "approve", "reason": "none"}


def _ledger(
    rng: np.random.Generator, invoice: Invoice, vendor_id: str, ids: list[str], count: int
) -> list[dict[str, Any]]:
    """`count` earlier entries that are no duplicate of the invoice: the vendor's other
    invoices (near-miss numbers) and other vendors' invoices with the same number."""
    others = [i for i in ids if i != vendor_id]
    entries: list[dict[str, Any]] = []
    for k in range(count):
        same_vendor = k % 2 == 0 or not others
        entries.append(
            {
                "vendor_id": vendor_id if same_vendor else _pick(rng, others),
                "invoice_number": _near_miss(rng, invoice.number)
                if same_vendor
                else invoice.number,
                "amount": 25 * int(rng.integers(40, 4000)),
            }
            | _approved()
        )
    return entries


# ------------------------------------------------------------------------ as records
def case_record(case: Case, ledger: list[dict[str, Any]]) -> dict[str, Any]:
    """The case with `ledger` as plain data (the env's snapshot)."""
    invoice = case.invoice
    return {
        "invoice": {
            "number": invoice.number,
            "vendor": invoice.vendor_name,
            "date": invoice.date,
            "po_id": invoice.po_id,
            "lines": [[line.sku, line.qty, line.price] for line in invoice.lines],
            "tax": invoice.tax,
        },
        "vendors": case.db.vendors,
        "orders": case.db.orders,
        "receipts": case.db.receipts,
        "tax_percent": case.db.tax_percent,
        "ledger": ledger,
    }


def case_json(case: Case, ledger: list[dict[str, Any]]) -> str:
    return json.dumps(case_record(case, ledger), sort_keys=True)
