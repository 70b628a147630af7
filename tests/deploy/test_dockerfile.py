"""The Dockerfile: hadolint at its strictest threshold, plus the promises the image makes.

No image can be built here (no Docker engine), so the build context is checked instead: every
file a COPY names must exist and must not be excluded by .dockerignore.
"""

from __future__ import annotations

import fnmatch
import json
import re

from tests.deploy._tools import ROOT, find_tool, run

DOCKERFILE = ROOT / "Dockerfile"


def instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs with line continuations joined and comments dropped."""
    text = re.sub(r"\\\n", " ", DOCKERFILE.read_text())
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            out.append((word.upper(), rest.strip()))
    return out


def final_stage() -> list[tuple[str, str]]:
    ins = instructions()
    last_from = max(i for i, (word, _) in enumerate(ins) if word == "FROM")
    return ins[last_from:]


def test_hadolint_clean() -> None:
    proc = run([find_tool("hadolint"), "--failure-threshold", "style", str(DOCKERFILE)])
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_runtime_stage_promises() -> None:
    ins = instructions()
    args = dict(re.match(r"(\w+)=(\S+)", rest).groups() for word, rest in ins if word == "ARG" and "=" in rest)
    assert re.fullmatch(r"nvidia/cuda:[0-9.]+-(cudnn-)?runtime-ubuntu[0-9.]+", args["CUDA_IMAGE"])
    stage = final_stage()
    assert stage[0] == ("FROM", "${CUDA_IMAGE}")
    words = [w for w, _ in stage]
    user = [rest for w, rest in stage if w == "USER"]
    assert user and not user[-1].startswith(("root", "0")), "the server must not run as root"
    assert ("EXPOSE", "8000") in stage
    health = next(rest for w, rest in stage if w == "HEALTHCHECK")
    assert "/health" in health and "--start-period" in health
    entry = json.loads(next(rest for w, rest in stage if w == "ENTRYPOINT"))
    assert entry[:2] == ["specserve", "serve"]
    assert entry[entry.index("--host") + 1] == "0.0.0.0" and entry[entry.index("--port") + 1] == "8000"
    assert words.index("USER") < words.index("ENTRYPOINT")


def _ignored(path: str, patterns: list[str]) -> bool:
    """Docker's rule: the last matching pattern wins; '!' re-includes."""
    ignored = False
    for pat in patterns:
        negate = pat.startswith("!")
        pat = pat.lstrip("!").rstrip("/")
        if fnmatch.fnmatch(path, pat) or path.startswith(pat + "/"):
            ignored = not negate
    return ignored


def test_copy_sources_exist_and_reach_the_build_context() -> None:
    patterns = [p.strip() for p in (ROOT / ".dockerignore").read_text().splitlines()
                if p.strip() and not p.startswith("#")]
    sources = []
    for word, rest in instructions():
        if word == "COPY" and "--from=" not in rest:
            sources += rest.split()[:-1]
    assert {"pyproject.toml", "specserve", "server", "engine", "kernels", "bench"} <= set(sources)
    for src in sources:
        assert (ROOT / src).exists(), f"COPY {src}: not in the repository"
        assert not _ignored(src, patterns), f"COPY {src}: excluded by .dockerignore"
    assert _ignored("tests/deploy/test_dockerfile.py", patterns) and _ignored(".venv", patterns)
