"""Support cases: the shop's written policy, a seeded case generator, and the gold resolution.

A case is one customer's request against a small shop database: the customer (id, email,
name), their orders (status, dates, items with SKU, price and final-sale flag), the catalog
of every variant of the products they bought (with stock), today's date, and the customer's
hidden facts (which order, which item, what they want). The request has a *kind*: one that
the policy grants (refund, exchange, cancel) or one of its out-of-policy variants (a refund
past the 30-day window, an exchange for an out-of-stock variant, cancelling a shipped
order...). The kind only steers generation; the gold resolution is decided from the data by
the policy's rules (`decide`), so the rules the agent reads are the rules it is scored by.

Held-out family: the final-sale clause. In the train split no item is ever final sale (the
flag is always false, the clause is never exercised); held-out cases mark some items final
sale and add the kinds refund_final_sale and exchange_final_sale, which must be refused.

Money is kept in whole cents, so a refund amount matches an item's price exactly or not at
all; dates are `datetime.date`, and results show "days since delivery" so that the 30-day
rule needs no calendar arithmetic from a small model.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import date, timedelta

import numpy as np

#: Days after delivery during which an item can be refunded or exchanged (inclusive).
RETURN_WINDOW_DAYS = 30

#: The policy as the agent reads it (part of the instruction).
POLICY = (
    "Policy: 1) Refund: only an item of a delivered order, at most 30 days since delivery, "
    "for exactly its price; never a final-sale item. 2) Exchange: the same item for another "
    "variant of the same product (SKU PRODUCT-VARIANT, e.g. KETL-RED -> KETL-BLUE), same "
    "30 days, never a final-sale item, only if the new SKU is in stock (get_product). "
    "3) Cancel: only a processing order, the whole order; a shipped or delivered order cannot "
    "be cancelled. "
    "4) Refuse any other request and change nothing."
)

#: Request kinds: what the customer wants, and whether the policy grants it.
IN_POLICY = ("refund", "exchange", "cancel")
TRAIN_KINDS = (
    "refund",
    "refund_late",
    "exchange",
    "exchange_late",
    "exchange_no_stock",
    "cancel",
    "cancel_shipped",
)
HELDOUT_ONLY_KINDS = ("refund_final_sale", "exchange_final_sale")
ALL_KINDS = TRAIN_KINDS + HELDOUT_ONLY_KINDS
# Relative frequency within one wanted resolution: granted requests are the common case,
# so that refusing everything (once the records are looked up, as the score asks) is a poor
# strategy (right on 27% of train seeds 0-199, an early plateau RL could settle in); the
# held-out family is frequent in its own split so that it is measured on many cases.
_KIND_WEIGHT = {kind: 1.0 for kind in ALL_KINDS} | {
    "refund": 4.0,
    "exchange": 4.0,
    "cancel": 4.0,
    "refund_final_sale": 3.0,
    "exchange_final_sale": 3.0,
}

OUTCOMES = ("refunded", "exchanged", "cancelled", "refused")
_GRANTED = {"refund": "refunded", "exchange": "exchanged", "cancel": "cancelled"}

_COLORS = ("red", "blue", "black", "white", "green", "grey")
_SIZES = ("S", "M", "L", "XL")
_SHOE_SIZES = ("7", "8", "9", "10", "11", "12")
_VARIANTS = {"colour": _COLORS, "size": _SIZES, "shoe size": _SHOE_SIZES}
#: (product name, SKU prefix, what its variants differ in).
PRODUCTS = (
    ("blender", "BLEN", "colour"),
    ("kettle", "KETL", "colour"),
    ("toaster", "TOST", "colour"),
    ("desk lamp", "LAMP", "colour"),
    ("backpack", "BPAK", "colour"),
    ("water bottle", "BOTL", "colour"),
    ("phone case", "CASE", "colour"),
    ("headphones", "HPHN", "colour"),
    ("coffee mug", "MUG", "colour"),
    ("umbrella", "UMBR", "colour"),
    ("yoga mat", "YOGA", "colour"),
    ("office chair", "CHAIR", "colour"),
    ("keyboard", "KEYB", "colour"),
    ("wall clock", "CLCK", "colour"),
    ("t-shirt", "TSHT", "size"),
    ("hoodie", "HOOD", "size"),
    ("rain jacket", "JACK", "size"),
    ("sweater", "SWTR", "size"),
    ("gloves", "GLOV", "size"),
    ("bike helmet", "HELM", "size"),
    ("dress", "DRES", "size"),
    ("shorts", "SHRT", "size"),
    ("running shoes", "RUNS", "shoe size"),
    ("sneakers", "SNKR", "shoe size"),
    ("hiking boots", "BOOT", "shoe size"),
    ("sandals", "SAND", "shoe size"),
    ("slippers", "SLIP", "shoe size"),
)
_FIRST = (
    "jane", "omar", "li", "maria", "tom", "aisha", "lukas", "sofia", "ravi", "emma", "kenji",
    "nora", "diego", "hana", "paul", "zoe", "ivan", "lea", "sam", "mia", "yusuf", "ana",
)  # fmt: skip
_LAST = (
    "doe", "khan", "chen", "garcia", "smith", "okafor", "novak", "rossi", "patel", "berg",
    "tanaka", "silva", "meyer", "kim", "dubois", "jones", "haddad", "larsen", "costa", "ito",
)  # fmt: skip
_REASONS = {
    "refund": ("arrived broken", "stopped working", "is not what I expected", "arrived damaged"),
    "exchange": ("does not suit me", "is not the one I wanted"),
    "cancel": ("I ordered it by mistake", "I found it cheaper elsewhere", "I no longer need it"),
}


@dataclass(frozen=True)
class Item:
    """One line of an order."""

    sku: str
    name: str  # "blender (red)"
    product: str  # "blender": how the customer calls it
    cents: int
    final_sale: bool

    def record(self) -> dict[str, object]:
        return {
            "sku": self.sku,
            "name": self.name,
            "price": self.cents / 100,
            "final_sale": self.final_sale,
        }


@dataclass(frozen=True)
class Order:
    order_id: str
    status: str  # processing, shipped or delivered
    ordered: date
    delivered: date | None
    items: tuple[Item, ...]

    def item(self, sku: str) -> Item | None:
        return next((item for item in self.items if item.sku == sku), None)


@dataclass(frozen=True)
class Product:
    """One catalog entry: a variant of a product and its stock."""

    sku: str
    name: str
    cents: int
    in_stock: bool


@dataclass(frozen=True)
class Facts:
    """What the customer knows and wants (the simulator answers from these)."""

    wanted: str  # refund, exchange or cancel
    order_id: str
    knows_order_id: bool  # False: "I don't have the order number"
    sku: str  # the item the request is about (any item of the order for a cancel)
    new_sku: str  # the variant wanted in an exchange ("" otherwise)
    new_variant: str  # how the customer says it: "blue", "size L"
    reason: str
    said: frozenset[str]  # the ask_customer topics the opening message already answers


@dataclass(frozen=True)
class Case:
    kind: str
    today: date
    customer_id: str
    name: str
    email: str
    orders: tuple[Order, ...]  # newest first
    products: tuple[Product, ...]
    facts: Facts

    def order(self, order_id: str) -> Order | None:
        return next((o for o in self.orders if o.order_id == order_id), None)

    def product(self, sku: str) -> Product | None:
        return next((p for p in self.products if p.sku == sku), None)

    @property
    def target(self) -> Order:
        """The order the request is about."""
        order = self.order(self.facts.order_id)
        assert order is not None
        return order

    @property
    def item(self) -> Item:
        """The item the request is about."""
        item = self.target.item(self.facts.sku)
        assert item is not None
        return item

    def days_since_delivery(self, order: Order) -> int | None:
        return None if order.delivered is None else (self.today - order.delivered).days


# ------------------------------------------------------------------- gold resolution
#: A change to the database: ("refund", order_id, sku, cents), ("exchange", order_id, sku,
#: new_sku) or ("cancel", order_id).
Change = tuple


@dataclass(frozen=True)
class Resolution:
    outcome: str
    changes: tuple[Change, ...]
    why: str  # the policy's reason, in the agent's voice


def order_block(case: Case) -> str | None:
    """Why the target order alone rules the request out (status, window), or None."""
    order, wanted = case.target, case.facts.wanted
    if wanted == "cancel":
        if order.status == "processing":
            return None
        return f"Order {order.order_id} is already {order.status}, so it cannot be cancelled."
    if order.status != "delivered":
        return f"Order {order.order_id} is not delivered yet, so I cannot {wanted} an item."
    days = case.days_since_delivery(order)
    if days is not None and days > RETURN_WINDOW_DAYS:
        return (
            f"Order {order.order_id} was delivered {days} days ago, past the "
            f"{RETURN_WINDOW_DAYS}-day window, so I cannot {wanted} it."
        )
    return None


def item_block(case: Case) -> str | None:
    """Why the item rules a refund or exchange out (final sale), or None."""
    if case.facts.wanted != "cancel" and case.item.final_sale:
        return f"{case.item.sku} is final sale, so it cannot be {_PAST[case.facts.wanted]}."
    return None


_PAST = {"refund": "refunded", "exchange": "exchanged"}


def exchange_block(case: Case) -> str | None:
    """Why the wanted variant rules an exchange out (not in stock), or None."""
    new = case.product(case.facts.new_sku)
    if new is None or not new.in_stock:
        return f"{case.facts.new_sku} is out of stock, so I cannot exchange the item."
    return None


def decide(case: Case) -> Resolution:
    """The gold resolution: the policy applied to the case's data."""
    facts, order = case.facts, case.target
    block = order_block(case) or item_block(case)
    if block is None and facts.wanted == "exchange":
        block = exchange_block(case)
    if block is not None:
        return Resolution("refused", (), block)
    if facts.wanted == "cancel":
        change: Change = ("cancel", order.order_id)
    elif facts.wanted == "refund":
        change = ("refund", order.order_id, facts.sku, case.item.cents)
    else:
        change = ("exchange", order.order_id, facts.sku, facts.new_sku)
    return Resolution(_GRANTED[facts.wanted], (change,), "")


# ------------------------------------------------------------------------ generation
def draw_kind(rng: np.random.Generator, kinds: tuple[str, ...]) -> str:
    """A request kind: each wanted resolution equally often, then a kind by its weight."""
    groups = sorted({kind.split("_")[0] for kind in kinds})
    wanted = groups[int(rng.integers(len(groups)))]
    members = [kind for kind in kinds if kind.split("_")[0] == wanted]
    weights = np.array([_KIND_WEIGHT[kind] for kind in members])
    return members[int(rng.choice(len(members), p=weights / weights.sum()))]


def _variant_label(dimension: str, variant: str) -> str:
    return variant if dimension == "colour" else f"size {variant}"


def _pick(rng: np.random.Generator, options: tuple | list) -> object:
    return options[int(rng.integers(len(options)))]


def _make_item(rng: np.random.Generator, product: tuple[str, str, str], heldout: bool) -> Item:
    name, code, dimension = product
    variant = str(_pick(rng, _VARIANTS[dimension]))
    cents = int(rng.integers(5, 150)) * 100 + int(_pick(rng, (99, 49, 0, 95)))
    final_sale = heldout and rng.random() < 0.3  # the held-out clause; never in train
    return Item(
        f"{code}-{variant.upper()}",
        f"{name} ({_variant_label(dimension, variant)})",
        name,
        cents,
        bool(final_sale),
    )


def _dates(
    rng: np.random.Generator, today: date, status: str, days: int
) -> tuple[date, date | None]:
    """(ordered, delivered) for an order of `status`, delivered `days` ago when delivered."""
    if status == "processing":
        return today - timedelta(days=int(rng.integers(0, 3))), None
    if status == "shipped":
        return today - timedelta(days=int(rng.integers(1, 6))), None
    delivered = today - timedelta(days=days)
    return delivered - timedelta(days=int(rng.integers(2, 7))), delivered


def _target_status(kind: str) -> str:
    if kind == "cancel":
        return "processing"
    return "shipped" if kind == "cancel_shipped" else "delivered"


def generate_case(
    rng: np.random.Generator,
    kinds: tuple[str, ...],
    heldout: bool,
    max_items: int,
    distractor_orders: int,
) -> Case:
    """A random case of one of `kinds`; the customer has 1 + `distractor_orders` orders of
    1..`max_items` items each, no product in two of them (the item names its order)."""
    if heldout:  # one draw more: a held-out seed's case is not a train seed's with flags
        rng.random()
    kind = draw_kind(rng, kinds)
    wanted = kind.split("_")[0]
    today = date(2024, 1, 1) + timedelta(days=int(rng.integers(0, 731)))
    first, last = str(_pick(rng, _FIRST)), str(_pick(rng, _LAST))
    suffix = str(int(rng.integers(10, 100))) if rng.random() < 0.5 else ""
    email = f"{first}.{last}{suffix}@example.com"
    customer_id = f"C-{int(rng.integers(1000, 10000))}"

    n_orders = 1 + distractor_orders
    sizes = [int(rng.integers(1, max_items + 1)) for _ in range(n_orders)]
    chosen = rng.choice(len(PRODUCTS), size=sum(sizes), replace=False)
    ids = rng.choice(90000, size=n_orders, replace=False) + 10000
    orders, start = [], 0
    for i, (size, number) in enumerate(zip(sizes, ids, strict=True)):
        items = [_make_item(rng, PRODUCTS[int(p)], heldout) for p in chosen[start : start + size]]
        start += size
        if i == 0:  # the target order
            status = _target_status(kind)
            late = kind.endswith("_late")
            days = int(rng.integers(31, 121) if late else rng.integers(0, RETURN_WINDOW_DAYS + 1))
        else:
            status = str(_pick(rng, ("processing", "shipped", "delivered")))
            days = int(rng.integers(0, 121))
        ordered, delivered = _dates(rng, today, status, days)
        orders.append(Order(f"O-{int(number)}", status, ordered, delivered, tuple(items)))

    target = orders[0]
    pick = int(rng.integers(len(target.items)))
    # The requested item's final-sale flag is set by the kind (the other items keep theirs).
    item = replace(target.items[pick], final_sale=kind.endswith("_final_sale"))
    items = target.items[:pick] + (item,) + target.items[pick + 1 :]
    orders[0] = target = replace(target, items=items)

    products = _catalog(rng, orders)
    new_sku, new_variant = "", ""
    if wanted == "exchange":
        products, new_sku, new_variant = _exchange_target(rng, products, item, kind)
    facts = _facts(rng, kind, target, item, new_sku, new_variant)
    orders.sort(key=lambda o: (o.ordered, o.order_id), reverse=True)
    return Case(
        kind,
        today,
        customer_id,
        f"{first.title()} {last.title()}",
        email,
        tuple(orders),
        products,
        facts,
    )


def _catalog(rng: np.random.Generator, orders: list[Order]) -> tuple[Product, ...]:
    """Every variant of every product the customer bought, most of them in stock."""
    catalog = []
    for order in orders:
        for item in order.items:
            name, code, dimension = next(p for p in PRODUCTS if p[0] == item.product)
            for variant in _VARIANTS[dimension]:
                catalog.append(
                    Product(
                        f"{code}-{variant.upper()}",
                        f"{name} ({_variant_label(dimension, variant)})",
                        item.cents,
                        bool(rng.random() < 0.75),
                    )
                )
    return tuple(catalog)


def _exchange_target(
    rng: np.random.Generator, products: tuple[Product, ...], item: Item, kind: str
) -> tuple[tuple[Product, ...], str, str]:
    """The variant an exchange asks for (another variant of the item's product), in stock
    unless the kind is exchange_no_stock; the catalog with that stock set."""
    _, code, dimension = next(p for p in PRODUCTS if p[0] == item.product)
    others = [v for v in _VARIANTS[dimension] if f"{code}-{v.upper()}" != item.sku]
    variant = str(_pick(rng, others))
    new_sku = f"{code}-{variant.upper()}"
    in_stock = kind != "exchange_no_stock"
    products = tuple(replace(p, in_stock=in_stock) if p.sku == new_sku else p for p in products)
    return products, new_sku, _variant_label(dimension, variant)


def _facts(
    rng: np.random.Generator, kind: str, order: Order, item: Item, new_sku: str, new_variant: str
) -> Facts:
    """The customer's facts, and which of them the opening message states. The message
    always names the item when it does not give the order id (the item then finds the
    order among the customer's orders), and hides the item only in orders of several."""
    wanted = kind.split("_")[0]
    said = set()
    if rng.random() < 0.7:
        said.add("email")
    if rng.random() < 0.4:
        said.add("order_id")
    if rng.random() < 0.75:
        said.add("wanted_resolution")
    if "order_id" not in said or len(order.items) == 1 or rng.random() < 0.6:
        said.add("item")
    both = {"item", "wanted_resolution"} <= said
    if wanted == "exchange" and both and rng.random() < 0.5:
        said.add("new_variant")
    if "wanted_resolution" in said:
        said.add("reason")
    return Facts(
        wanted=wanted,
        order_id=order.order_id,
        knows_order_id=bool(rng.random() < 0.6),
        sku=item.sku,
        new_sku=new_sku,
        new_variant=new_variant,
        reason=str(_pick(rng, _REASONS[wanted])),
        said=frozenset(said),
    )
