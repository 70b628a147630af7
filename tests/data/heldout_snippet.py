"""A small inventory ledger: the fixed held-out text for the demo pair's acceptance test.

Written for this repository and never part of any training corpus. It is plain, ordinary
Python so that a model trained on library code should find it familiar.
"""

from __future__ import annotations

import csv
import json
import logging
import os
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import date, datetime
from typing import Dict, Iterable, Iterator, List, Optional

logger = logging.getLogger(__name__)

__all__ = ["Item", "Movement", "Ledger", "LedgerError", "load_csv", "main"]


class LedgerError(Exception):
    """Raised when a movement would make the ledger inconsistent."""


@dataclass(frozen=True)
class Item:
    """A stock-keeping unit."""

    sku: str
    name: str
    unit_price: float = 0.0
    tags: tuple = ()

    def __post_init__(self):
        if not self.sku:
            raise ValueError("sku must not be empty")
        if self.unit_price < 0:
            raise ValueError(f"unit_price must be non-negative, got {self.unit_price!r}")


@dataclass
class Movement:
    """A change in the quantity of one item on one day."""

    sku: str
    quantity: int
    day: date
    note: str = ""

    @property
    def is_inbound(self) -> bool:
        return self.quantity > 0

    def to_dict(self) -> dict:
        return {
            "sku": self.sku,
            "quantity": self.quantity,
            "day": self.day.isoformat(),
            "note": self.note,
        }

    @classmethod
    def from_dict(cls, data: dict) -> "Movement":
        return cls(
            sku=data["sku"],
            quantity=int(data["quantity"]),
            day=date.fromisoformat(data["day"]),
            note=data.get("note", ""),
        )


@dataclass
class Ledger:
    """Items and the movements applied to them, in order."""

    items: Dict[str, Item] = field(default_factory=dict)
    movements: List[Movement] = field(default_factory=list)
    allow_negative: bool = False

    def add_item(self, item: Item) -> None:
        if item.sku in self.items:
            raise LedgerError(f"duplicate sku: {item.sku}")
        self.items[item.sku] = item

    def quantity(self, sku: str, until: Optional[date] = None) -> int:
        total = 0
        for movement in self.movements:
            if movement.sku != sku:
                continue
            if until is not None and movement.day > until:
                continue
            total += movement.quantity
        return total

    def record(self, sku: str, quantity: int, day: Optional[date] = None, note: str = "") -> Movement:
        if sku not in self.items:
            raise LedgerError(f"unknown sku: {sku}")
        if quantity == 0:
            raise ValueError("quantity must not be zero")
        day = day or date.today()
        if not self.allow_negative and self.quantity(sku) + quantity < 0:
            raise LedgerError(
                "not enough %s in stock: have %d, need %d" % (sku, self.quantity(sku), -quantity)
            )
        movement = Movement(sku, quantity, day, note)
        self.movements.append(movement)
        logger.debug("recorded %s", movement)
        return movement

    def history(self, sku: str) -> Iterator[Movement]:
        return (m for m in self.movements if m.sku == sku)

    def value(self) -> float:
        """Total value of the stock at unit prices."""
        return sum(item.unit_price * self.quantity(sku) for sku, item in self.items.items())

    def by_tag(self) -> Dict[str, List[str]]:
        groups = defaultdict(list)
        for sku, item in sorted(self.items.items()):
            for tag in item.tags:
                groups[tag].append(sku)
        return dict(groups)

    def low_stock(self, threshold: int = 5) -> List[str]:
        return [sku for sku in sorted(self.items) if self.quantity(sku) < threshold]

    def summary(self) -> str:
        lines = []
        for sku in sorted(self.items):
            item = self.items[sku]
            lines.append(f"{sku:<10} {item.name:<24} {self.quantity(sku):>6}")
        lines.append("-" * 42)
        lines.append(f"{'total value':<35} {self.value():>6.2f}")
        return "\n".join(lines)

    def save(self, path: str) -> None:
        data = {
            "items": [
                {"sku": i.sku, "name": i.name, "unit_price": i.unit_price, "tags": list(i.tags)}
                for i in self.items.values()
            ],
            "movements": [m.to_dict() for m in self.movements],
            "saved_at": datetime.now().isoformat(timespec="seconds"),
        }
        tmp = path + ".tmp"
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(data, f, indent=2, sort_keys=True)
        os.replace(tmp, path)

    @classmethod
    def load(cls, path: str) -> "Ledger":
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
        ledger = cls()
        for raw in data.get("items", []):
            ledger.add_item(Item(raw["sku"], raw["name"], raw.get("unit_price", 0.0), tuple(raw.get("tags", ()))))
        for raw in data.get("movements", []):
            ledger.movements.append(Movement.from_dict(raw))
        return ledger


def load_csv(lines: Iterable[str], ledger: Ledger) -> int:
    """Read movements from CSV rows ``sku,quantity,day[,note]``; return how many were recorded."""
    count = 0
    reader = csv.reader(lines)
    for row_number, row in enumerate(reader, start=1):
        if not row or row[0].startswith("#"):
            continue
        try:
            sku, quantity, day = row[0].strip(), int(row[1]), date.fromisoformat(row[2].strip())
        except (IndexError, ValueError) as exc:
            raise LedgerError(f"line {row_number}: cannot parse {row!r}") from exc
        note = row[3].strip() if len(row) > 3 else ""
        ledger.record(sku, quantity, day, note)
        count += 1
    return count


def main(argv: Optional[List[str]] = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(description="Print a stock summary.")
    parser.add_argument("ledger", help="path to the ledger JSON file")
    parser.add_argument("--import-csv", dest="csv_path", default=None)
    parser.add_argument("--threshold", type=int, default=5)
    parser.add_argument("-v", "--verbose", action="store_true")
    args = parser.parse_args(argv)

    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO)
    if os.path.exists(args.ledger):
        ledger = Ledger.load(args.ledger)
    else:
        ledger = Ledger()
    if args.csv_path:
        with open(args.csv_path, newline="", encoding="utf-8") as f:
            added = load_csv(f, ledger)
        logger.info("imported %d movements", added)
        ledger.save(args.ledger)
    print(ledger.summary())
    for sku in ledger.low_stock(args.threshold):
        print(f"warning: {sku} is low on stock")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
