"""Sections, goals and the two outputs: bench.json (raw numbers) and bench.md (tables).

A :class:`Section` is one table: columns, rows (plain dicts of numbers), notes, and for the JSON
``data`` with everything measured. Rows carry ``goal`` and ``status``; status says "met", or by
how much the goal was missed, or why there is no number ("skipped: ...").
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional

MET = "met"


@dataclass
class Column:
    key: str
    header: str
    kind: str = "num"   # num | int | count | x | pct | ms | time | gbps | bw | gb | bytes | tps | str | bool | row


@dataclass
class Section:
    name: str
    title: str
    columns: list[Column]
    rows: list[dict[str, Any]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    skipped: Optional[str] = None
    error: Optional[str] = None
    data: dict[str, Any] = field(default_factory=dict)
    extra_markdown: str = ""
    seconds: float = 0.0

    def as_dict(self) -> dict:
        return {"title": self.title, "skipped": self.skipped, "error": self.error,
                "seconds": self.seconds, "rows": self.rows, "notes": self.notes, "data": self.data}


# ---- goals ---------------------------------------------------------------------------------
def at_most(value: Optional[float], limit: float) -> str:
    if value is None or not math.isfinite(value):
        return "n/a"
    return MET if value <= limit else f"missed: {100 * (value / limit - 1):.0f}% above the limit"


def at_least(value: Optional[float], limit: float) -> str:
    if value is None or not math.isfinite(value):
        return "n/a"
    return MET if value >= limit else f"missed: {100 * (1 - value / limit):.0f}% below the goal"


def within(value: Optional[float], target: Optional[float], tolerance: float) -> str:
    """|value / target - 1| <= tolerance."""
    if value is None or target is None or target == 0:
        return "n/a"
    off = value / target - 1
    side = "above" if off > 0 else "below"
    if abs(off) <= tolerance:
        return f"{MET} ({100 * off:+.0f}%)"
    return f"missed: {100 * abs(off):.0f}% {side} (allowed {100 * tolerance:.0f}%)"


def is_met(status: str) -> bool:
    return status.startswith(MET)


# ---- formatting ----------------------------------------------------------------------------
def _num(v: float) -> str:
    if v == 0:
        return "0"
    a = abs(v)
    if a >= 1e5 or a < 1e-3:
        return f"{v:.3g}"
    if a >= 100:
        return f"{v:,.0f}"
    return f"{v:.3g}"


def _scaled(v: float, units: tuple[tuple[float, str], ...]) -> str:
    """The largest unit that keeps the number >= 1 (else the smallest), 3 significant digits."""
    for scale, unit in units:
        if abs(v) >= scale:
            return f"{_num(v / scale)} {unit}"
    scale, unit = units[-1]
    return f"{_num(v / scale)} {unit}"


_COUNT = ((1e9, "B"), (1e6, "M"), (1e3, "k"), (1.0, ""))
_TIME = ((1.0, "s"), (1e-3, "ms"), (1e-6, "µs"))
_BYTES = ((1e9, "GB"), (1e6, "MB"), (1e3, "kB"), (1.0, "B"))
_BW = ((1e9, "GB/s"), (1e6, "MB/s"), (1e3, "kB/s"), (1.0, "B/s"))

_FORMATS: dict[str, Callable[[Any], str]] = {
    "num": _num,
    "int": lambda v: f"{int(v):,}",
    "x": lambda v: f"{v:.2f}x",
    "pct": lambda v: f"{100 * v:.1f}%",
    "ms": lambda v: f"{1e3 * v:.3g} ms" if v < 1 else f"{v:.3g} s",
    "time": lambda v: _scaled(v, _TIME),
    "count": lambda v: _scaled(v, _COUNT).strip(),
    "bytes": lambda v: _scaled(v, _BYTES),
    "bw": lambda v: _scaled(v, _BW),
    "gbps": lambda v: f"{v / 1e9:,.1f} GB/s",
    "gb": lambda v: f"{v / 1e9:.3g} GB",
    "tps": lambda v: f"{v:,.1f}",
    "str": str,
    "bool": lambda v: "yes" if v else "no",
}


def fmt(value: Any, kind: str) -> str:
    if value is None or value == "":
        return "–"
    if isinstance(value, str) and kind != "str":
        return value
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    try:
        return _FORMATS[kind](value)
    except (TypeError, ValueError):
        return str(value)


def markdown_row(cells: list[str]) -> str:
    return "| " + " | ".join(cells) + " |"


def markdown_head(headers: list[str]) -> list[str]:
    """A Markdown table's header line and its separator."""
    return [markdown_row(headers), "|" + "|".join("---" for _ in headers) + "|"]


def markdown_table(section: Section) -> str:
    cols = section.columns
    lines = markdown_head([c.header for c in cols])
    for row in section.rows:
        cells = [fmt(row.get(c.key), row.get("kind", "num") if c.kind == "row" else c.kind)
                 .replace("|", "\\|") for c in cols]
        lines.append(markdown_row(cells))
    return "\n".join(lines)


class StreamedTable:
    """A Markdown table printed a row at a time as its cells are measured (a long A/B shows
    progress), then printed and optionally written whole by :meth:`finish`."""

    def __init__(self, headers: list[str]):
        self.lines = markdown_head(headers)

    def add(self, cells: list[str]) -> None:
        self.lines.append(markdown_row(cells))
        print(self.lines[-1], flush=True)

    def finish(self, out: Optional[str]) -> str:
        text = "\n".join(self.lines) + "\n"
        print(text)
        if out:
            Path(out).write_text(text)
        return text


def section_markdown(index: int, section: Section) -> str:
    """``index``: the section's number in the issue (1 roofline .. 6 serve), whatever ran."""
    out = [f"## {index}. {section.title}", ""]
    if section.error:
        out += [f"**failed:** `{section.error}`", ""]
    elif section.skipped:
        out += [f"skipped: {section.skipped}", ""]
    if section.rows:
        out += [markdown_table(section), ""]
    if section.extra_markdown:
        out += [section.extra_markdown.strip(), ""]
    out += [f"- {n}" for n in section.notes]
    if section.notes:
        out.append("")
    return "\n".join(out)


def header_markdown(env: dict, settings: dict) -> str:
    keys = [("date", "Date (UTC)"), ("device", "Device"), ("command", "Command"),
            ("torch", "torch"), ("cuda", "CUDA"), ("triton", "triton"), ("transformers", "transformers")]
    lines = ["# specserve bench", ""]
    for k, label in keys:
        v = env.get(k)
        lines.append(f"- **{label}:** `{v}`" if k == "command" else f"- **{label}:** {v if v else '–'}")
    lines.append("- **Settings:** " + ", ".join(f"{k}={settings[k]}" for k in _shown_settings(settings)
                                                 if k in settings))
    return "\n".join(lines) + "\n"


_COMMON = ("quick", "dtype", "kernel_backend", "ragged_graph_tokens")
_DECODE = ("execution_mode", "k", "max_model_len", "prompt_len", "output_len", "batch_sizes")
_ADAPTIVE = ("adaptive_target", "adaptive_pairs", "adaptive_batch_sizes", "adaptive_ks",
             "adaptive_prompt_len", "adaptive_output_len", "adaptive_repeats", "adaptive_variants",
             "adaptive_cell_warmup_tokens")


def _shown_settings(settings: dict) -> tuple[str, ...]:
    """The options the sections that ran used: section adaptive builds its own engines from the
    adaptive_* options, the others share the decode ones (a run of adaptive alone listed the
    decode defaults, which it never used)."""
    sections = set(settings.get("sections") or ())
    shown = _COMMON
    if not sections or sections - {"adaptive"}:
        shown += _DECODE
    if "adaptive" in sections:
        shown += _ADAPTIVE
    return shown


def summary_markdown(sections: list[Section]) -> str:
    """One line per goal row across sections: the at-a-glance view."""
    lines = ["## Goals at a glance", "", "| Section | Row | Goal | Status |", "|---|---|---|---|"]
    for s in sections:
        if s.error or (s.skipped and not s.rows):
            lines.append(f"| {s.name} | – | – | {'failed' if s.error else 'skipped: ' + str(s.skipped)} |")
        for r in s.rows:
            if r.get("goal"):
                lines.append(f"| {s.name} | {r.get('label', '')} | {r['goal']} | {r.get('status', '')} |")
    return "\n".join(lines) + "\n"


def write_outputs(out_dir: Path, env: dict, settings: dict, sections: list[Section],
                  plots: list[str], plot_note: Optional[str],
                  number: Optional[dict[str, int]] = None) -> tuple[Path, Path]:
    number = number or {}
    out_dir.mkdir(parents=True, exist_ok=True)
    doc = {"env": env, "settings": settings, "plots": plots, "plot_note": plot_note,
           "failed_sections": [s.name for s in sections if s.error],
           "sections": {s.name: s.as_dict() for s in sections}}
    json_path = out_dir / "bench.json"
    json_path.write_text(json.dumps(doc, indent=2, default=_json_default, allow_nan=True) + "\n")
    parts = [header_markdown(env, settings), summary_markdown(sections)]
    parts += [section_markdown(number.get(s.name, i + 1), s) for i, s in enumerate(sections)]
    if plots or plot_note:
        parts.append("## Plots\n")
        parts += [f"![{Path(p).stem}]({Path(p).name})\n" for p in plots]
        if plot_note:
            parts.append(f"- {plot_note}\n")
    md_path = out_dir / "bench.md"
    md_path.write_text("\n".join(parts))
    return json_path, md_path


def _json_default(obj: Any) -> Any:
    if hasattr(obj, "as_dict"):
        return obj.as_dict()
    if isinstance(obj, (set, tuple)):
        return list(obj)
    if isinstance(obj, Path):
        return str(obj)
    return str(obj)
