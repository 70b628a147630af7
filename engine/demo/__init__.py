"""The embedded demo pair: a small trained target and draft shipped as package data.

``specserve serve`` with no model argument (or ``--model demo`` / ``--draft-model demo``) serves
these. They were trained by ``scripts/train_demo_pair.py``; MODEL_CARD.md beside this file says
how, on what, and how well the draft agrees with the target. Importing this module loads nothing.
"""

from __future__ import annotations

from pathlib import Path

from specserve.engine.config import DEMO_MODEL as DEMO_NAME

DEMO_DIR = Path(__file__).resolve().parent
TARGET_DIR = DEMO_DIR / "target"
DRAFT_DIR = DEMO_DIR / "draft"
MODEL_CARD = DEMO_DIR / "MODEL_CARD.md"
METRICS = DEMO_DIR / "metrics.json"   # the numbers the model card shows, machine-readable


def resolve(name: str, role: str = "target") -> str:
    """Map the name ``demo`` to the shipped directory for ``role`` ('target' or 'draft').

    Any other name (a local checkpoint directory) is returned unchanged.
    """
    if role not in ("target", "draft"):
        raise ValueError(f"role must be 'target' or 'draft', got {role!r}")
    if name != DEMO_NAME:
        return name
    return str(TARGET_DIR if role == "target" else DRAFT_DIR)
