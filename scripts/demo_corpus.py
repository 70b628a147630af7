"""Corpus for the demo pair: the Python source files installed on the machine that trains it.

The corpus is the ``.py`` files of the standard library and of every installed distribution on
``sys.path``. Collection is deterministic: files are listed in sorted order, filtered (size,
encoding, no data-like files), de-duplicated by content, then shuffled with a fixed seed. The
first files of the shuffle (up to ``heldout_bytes``) are held out for evaluation; the next ones,
up to ``train_bytes``, are the training text. Each file is attributed to the distribution whose
``RECORD`` lists it (or to the standard library), so the model card can name sources and licences.
"""

from __future__ import annotations

import hashlib
import importlib.metadata as md
import os
import random
import sys
import sysconfig
from dataclasses import dataclass, field
from pathlib import Path

MAX_FILE_BYTES = 200_000      # larger .py files are mostly generated tables
MIN_FILE_BYTES = 64
LONG_LINE = 300               # a file whose bytes sit mostly in lines longer than this is data


@dataclass
class SourceFile:
    path: Path
    text: str
    dist: str                 # distribution name, or "python-stdlib"


@dataclass
class Corpus:
    train: list[SourceFile]
    heldout: list[SourceFile]
    roots: list[str]
    num_candidates: int
    licences: dict[str, str] = field(default_factory=dict)   # dist -> licence text

    def bytes_by_dist(self, which: str = "train") -> dict[str, int]:
        out: dict[str, int] = {}
        for f in getattr(self, which):
            out[f.dist] = out.get(f.dist, 0) + len(f.text.encode("utf-8"))
        return dict(sorted(out.items(), key=lambda kv: (-kv[1], kv[0])))


def search_roots(exclude: Path | None = None) -> list[Path]:
    """The stdlib and the site directories on sys.path (real directories, sorted, no repo)."""
    roots = {Path(sysconfig.get_paths()["stdlib"]).resolve()}
    for p in sys.path:
        if p and os.path.isdir(p):
            roots.add(Path(p).resolve())
    if exclude is not None:  # the repository itself (and sys.path[0] = scripts/) is not corpus
        ex = exclude.resolve()
        roots = {r for r in roots if r != ex and r not in ex.parents
                 and (ex not in r.parents or {"site-packages", "dist-packages"} & set(r.parts))}
    # drop roots nested in another root (the stdlib contains lib-dynload, ...): walk each once
    kept = [r for r in sorted(roots) if not any(o != r and o in r.parents for o in roots)]
    return kept


def _dist_index() -> tuple[dict[Path, str], dict[str, str]]:
    """Map each installed file (resolved path) to its distribution, and each distribution to its licence."""
    owner: dict[Path, str] = {}
    licences: dict[str, str] = {}
    for dist in md.distributions():
        name = (dist.metadata["Name"] or "unknown").lower()
        licences.setdefault(name, licence_of(dist))
        for f in dist.files or ():
            if str(f).endswith(".py"):
                try:
                    owner.setdefault(Path(dist.locate_file(f)).resolve(), name)
                except OSError:
                    continue
    return owner, licences


def licence_of(dist: md.Distribution) -> str:
    """Best short licence string from the metadata: License-Expression, classifiers, License."""
    meta = dist.metadata
    expr = meta.get("License-Expression")
    if expr:
        return expr.strip()
    classifiers = [c.split("::")[-1].strip() for c in meta.get_all("Classifier") or []
                   if c.startswith("License ::")]
    if classifiers:
        return "; ".join(sorted(set(classifiers)))
    text = (meta.get("License") or "").strip()
    if text:
        first = text.splitlines()[0].strip()
        return first[:80] + ("..." if len(first) > 80 or len(text.splitlines()) > 1 else "")
    return "unknown (no licence metadata)"


def _looks_like_code(text: str) -> bool:
    total = len(text)
    if total < MIN_FILE_BYTES:
        return False
    in_long = sum(len(line) for line in text.splitlines() if len(line) > LONG_LINE)
    return in_long < 0.1 * total


def _read(path: Path) -> str | None:
    try:
        size = path.stat().st_size
        if size > MAX_FILE_BYTES or size < MIN_FILE_BYTES:
            return None
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError, ValueError):
        return None
    if "\x00" in text or not _looks_like_code(text):
        return None
    return text


def list_py_files(roots: list[Path]) -> list[Path]:
    """Every .py file under the roots, in a sorted, machine-independent order."""
    found: set[Path] = set()
    for root in roots:
        for dirpath, dirnames, filenames in os.walk(root):
            dirnames[:] = sorted(d for d in dirnames if d != "__pycache__")
            for name in filenames:
                if name.endswith(".py"):
                    found.add(Path(dirpath, name).resolve())
    return sorted(found)


def collect(train_bytes: int, heldout_bytes: int, seed: int, exclude: Path | None = None) -> Corpus:
    """Collect, filter, de-duplicate, shuffle (seeded) and split the installed Python sources."""
    roots = search_roots(exclude)
    owner, licences = _dist_index()
    stdlib = Path(sysconfig.get_paths()["stdlib"]).resolve()
    paths = list_py_files(roots)
    random.Random(seed).shuffle(paths)
    seen: set[bytes] = set()
    heldout: list[SourceFile] = []
    train: list[SourceFile] = []
    held_size = train_size = 0
    for path in paths:
        if train_size >= train_bytes:
            break
        text = _read(path)
        if text is None:
            continue
        digest = hashlib.sha1(text.encode("utf-8")).digest()
        if digest in seen:
            continue
        seen.add(digest)
        dist = owner.get(path)
        if dist is None:
            dist = "python-stdlib" if stdlib in path.parents else "unattributed"
        item = SourceFile(path, text, dist)
        n = len(text.encode("utf-8"))
        if held_size < heldout_bytes:
            heldout.append(item)
            held_size += n
        else:
            train.append(item)
            train_size += n
    licences["python-stdlib"] = "PSF-2.0"
    licences["unattributed"] = "unknown (file not listed in any RECORD)"
    used = {f.dist for f in train + heldout}
    return Corpus(train, heldout, [str(r) for r in roots], len(paths),
                  {d: licences.get(d, "unknown") for d in sorted(used)})
